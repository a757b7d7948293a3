//! The webhook sink: one `POST` per attempt on a shared keep-alive client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use belfry_core::tenant::HttpTarget;
use belfry_core::{SinkConfig, TenantName, Verdict};
use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use super::config::HttpSinkOptions;
use super::retry::{classify_error, classify_status};
use super::{
    HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_IDEMPOTENCY_KEY, HEADER_SCHEDULED_AT, HEADER_TENANT,
};
use crate::body::render_delivery_body;
use crate::{Delivery, DeliveryResult, Sink};

/// How much of a refusal's body goes into the error message.
pub const ERROR_BODY_LIMIT: usize = 1024;

/// How much of a success's body is read so the connection can be reused;
/// a larger body is abandoned (and its connection closed) instead.
const DRAIN_LIMIT: usize = 64 * 1024;

/// Bytes written as `%XX` in Belfry's own headers: everything outside
/// printable ASCII (controls, space, non-ASCII) and `%` itself, so the
/// encoding is unambiguous.
const HEADER_ENCODE: &AsciiSet = &CONTROLS.add(b' ').add(b'%');

/// Why the sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpSinkError {
    #[error("cannot build the webhook HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Delivers to `SinkConfig::Http` tenants.
#[derive(Debug, Clone)]
pub struct HttpSink {
    /// One client for every tenant: its pool keeps connections alive per host.
    client: reqwest::Client,
    options: HttpSinkOptions,
    /// Parsed URL and header map per tenant target, so a delivery does not
    /// re-parse them (URL parsing with IDNA showed up in profiles).
    prepared: Arc<Mutex<HashMap<TenantName, Arc<PreparedTarget>>>>,
}

/// A tenant's webhook, parsed once.
#[derive(Debug)]
struct PreparedTarget {
    /// What it was built from; a changed config rebuilds it.
    source: HttpTarget,
    url: Result<reqwest::Url, String>,
    headers: Result<HeaderMap, String>,
}

impl PreparedTarget {
    fn new(target: &HttpTarget) -> Self {
        PreparedTarget {
            source: target.clone(),
            url: reqwest::Url::parse(&target.url)
                .map_err(|e| format!("tenant url is not a valid URL: {e}")),
            headers: tenant_headers(&target.headers),
        }
    }
}

impl HttpSink {
    /// Builds the shared client. Installs rustls' `ring` provider as the
    /// process default first (reqwest is built without one).
    ///
    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn new(options: HttpSinkOptions) -> Result<Self, HttpSinkError> {
        // Err means another provider is already installed: fine, use it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .tls_backend_rustls()
            .connect_timeout(options.connect_timeout())
            .pool_max_idle_per_host(options.pool_max_idle_per_host)
            .pool_idle_timeout(options.pool_idle_timeout())
            .user_agent(options.user_agent.clone())
            .tcp_nodelay(true)
            // A 3xx is a retry, never followed: following would turn the POST
            // into a GET and deliver somewhere the tenant did not register.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(HttpSinkError::Client)?;
        Ok(HttpSink {
            client,
            options,
            prepared: Arc::default(),
        })
    }

    /// The parsed form of `target`, cached per tenant.
    fn prepared(&self, tenant: &TenantName, target: &HttpTarget) -> Arc<PreparedTarget> {
        // Poison means a panic mid-insert elsewhere; the map is still valid.
        let mut cache = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        match cache.get(tenant) {
            Some(entry) if entry.source == *target => entry.clone(),
            _ => {
                let entry = Arc::new(PreparedTarget::new(target));
                cache.insert(tenant.clone(), entry.clone());
                entry
            }
        }
    }

    pub fn options(&self) -> &HttpSinkOptions {
        &self.options
    }

    async fn post(
        &self,
        url: reqwest::Url,
        headers: HeaderMap,
        body: Vec<u8>,
        timeout: Duration,
    ) -> DeliveryResult {
        let sent = self
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .timeout(timeout)
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(error) => {
                let (verdict, reason) = classify_error(
                    &error.without_url(),
                    self.options.connect_timeout(),
                    timeout,
                );
                return DeliveryResult::failed(verdict, None, reason);
            }
        };
        let status = response.status().as_u16();
        let verdict = classify_status(status);
        if verdict == Verdict::Delivered {
            // The receiver has accepted; reading the rest only lets the
            // connection go back to the pool, so its errors do not matter.
            let _ = read_prefix(&mut response, DRAIN_LIMIT).await;
            return DeliveryResult::delivered(Some(status));
        }
        let body = read_prefix(&mut response, ERROR_BODY_LIMIT).await;
        let message = if body.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {}", String::from_utf8_lossy(&body))
        };
        DeliveryResult::failed(verdict, Some(status), message)
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn deliver(&self, delivery: Delivery<'_>) -> DeliveryResult {
        let SinkConfig::Http(target) = &delivery.tenant.sink else {
            return DeliveryResult::failed(
                Verdict::Permanent,
                None,
                "tenant is not configured for HTTP delivery",
            );
        };
        let prepared = self.prepared(&delivery.tenant.name, target);
        let (url, tenant_headers) = match (&prepared.url, &prepared.headers) {
            (Ok(url), Ok(headers)) => (url.clone(), headers),
            (Err(reason), _) | (_, Err(reason)) => {
                return DeliveryResult::failed(Verdict::Permanent, None, reason.clone());
            }
        };
        let headers = request_headers(&delivery, tenant_headers);
        let body = render_delivery_body(delivery.event, delivery.triggered_at);
        let timeout = self.options.request_timeout(target.timeout_ms);
        self.post(url, headers, body, timeout).await
    }
}

/// The tenant's own headers as a header map.
///
/// # Errors
/// A tenant header that is not a valid HTTP header (the API validates them,
/// so only a config stored by an older version could get here).
fn tenant_headers(
    tenant_headers: &std::collections::BTreeMap<String, String>,
) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::with_capacity(tenant_headers.len() + 6);
    for (name, value) in tenant_headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("tenant header name {name:?} is not a valid HTTP header name"))?;
        let value = HeaderValue::from_bytes(value.as_bytes())
            .map_err(|_| format!("tenant header {name} has an invalid value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// The tenant's headers, then Belfry's (which win on a clash).
///
/// Belfry's header values are percent-encoded (UTF-8, see
/// [`HEADER_ENCODE`]): ids and tenant names may hold any non-control
/// character, header values only printable ASCII. Plain ASCII ids without
/// `%` or spaces arrive unchanged; receivers should percent-decode.
fn request_headers(delivery: &Delivery<'_>, tenant_headers: &HeaderMap) -> HeaderMap {
    let mut headers = tenant_headers.clone();
    let event = delivery.event;
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(HEADER_EVENT_ID, encoded(event.key.id.as_str()));
    headers.insert(HEADER_TENANT, encoded(event.key.tenant.as_str()));
    headers.insert(HEADER_SCHEDULED_AT, encoded(&event.event_time.to_rfc3339()));
    headers.insert(HEADER_ATTEMPT, HeaderValue::from(delivery.attempt));
    headers.insert(HEADER_IDEMPOTENCY_KEY, encoded(event.version.as_str()));
    headers
}

/// `text` percent-encoded into a header value.
fn encoded(text: &str) -> HeaderValue {
    let ascii = utf8_percent_encode(text, HEADER_ENCODE).to_string();
    // Cannot fail: after encoding only printable ASCII remains.
    HeaderValue::try_from(ascii).expect("percent-encoded text is a valid header value")
}

/// Reads at most `limit` bytes of the body (stops early at the limit; a
/// read error ends it with what arrived).
async fn read_prefix(response: &mut reqwest::Response, limit: usize) -> Bytes {
    let mut collected = Vec::new();
    while collected.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - collected.len();
                collected.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    Bytes::from(collected)
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn header_encoding_is_reversible_and_ascii_ids_stay_readable() {
        assert_eq!(
            encoded("order-42/x_y.z").to_str().unwrap(),
            "order-42/x_y.z"
        );
        assert_eq!(encoded("a b%c").to_str().unwrap(), "a%20b%25c");
        assert_eq!(encoded("zoë").to_str().unwrap(), "zo%C3%AB");
    }
}
