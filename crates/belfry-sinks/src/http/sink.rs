//! The webhook sink: builds each attempt's `POST` and classifies how it
//! went. Plain `http://` goes through Belfry's own client
//! ([`super::client`]), `https://` through reqwest; both keep connections
//! alive per host.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use belfry_core::policy::RetryAfter;
use belfry_core::tenant::HttpTarget;
use belfry_core::{SinkConfig, Verdict};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::client::{Client, PlainTarget};
use super::config::HttpSinkOptions;
use super::reqwest_transport::{ReqwestTarget, ReqwestTransport};
use super::retry::{classify_status, classify_transport_error, steer};
pub use super::transport::{DRAIN_LIMIT, ERROR_BODY_LIMIT};
use super::transport::{Outgoing, Response, Transport, TransportError};
use super::{
    HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_IDEMPOTENCY_KEY, HEADER_SCHEDULED_AT, HEADER_TENANT,
};
use crate::body::render_delivery_body;
use crate::egress::{EgressOptions, EgressPolicy};
use crate::prepared::PreparedTargets;
use crate::signing::{
    HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, HEADER_WEBHOOK_TIMESTAMP, unix_seconds,
};
use crate::{Delivery, DeliveryResult, Sink};

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

/// The environment variables through which reqwest (hyper-util) picks up a
/// proxy for plain http.
const HTTP_PROXY_VARIABLES: &[&str] = &["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"];

/// Which transport carries plain `http://`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainHttp {
    /// Belfry's client, unless the environment names an HTTP proxy.
    Auto,
    /// reqwest, like `https://` (so tests run every behaviour through
    /// both transports on plain loopback http).
    Reqwest,
}

/// Delivers to `SinkConfig::Http` tenants.
#[derive(Debug, Clone)]
pub struct HttpSink {
    /// For `https://` (and proxied http), one for every tenant: its pool
    /// keeps connections alive per host.
    reqwest: ReqwestTransport,
    /// For `http://`, one for every tenant, with its own keep-alive pool.
    plain: Arc<Client>,
    /// Whether `http://` goes through `plain`: not when the environment
    /// names an HTTP proxy (Belfry's client does not speak to proxies).
    plain_http: bool,
    options: HttpSinkOptions,
    /// The prepared request per tenant target, so a delivery does not
    /// re-parse the URL (URL parsing with IDNA showed up in profiles),
    /// re-validate headers or re-decode signing keys.
    prepared: Arc<PreparedTargets<HttpTarget, Route>>,
}

/// Which transport delivers to a target, with what it prepared.
#[derive(Debug)]
enum Route {
    Plain(PlainTarget),
    Reqwest(ReqwestTarget),
}

impl HttpSink {
    /// The sink with the egress policy `internal` (tests, embedding).
    ///
    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn new(options: HttpSinkOptions) -> Result<Self, HttpSinkError> {
        Self::with_egress(options, EgressOptions::internal())
    }

    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn with_egress(
        options: HttpSinkOptions,
        egress: EgressOptions,
    ) -> Result<Self, HttpSinkError> {
        Self::build(options, egress, PlainHttp::Auto)
    }

    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn build(
        options: HttpSinkOptions,
        egress: EgressOptions,
        plain_http: PlainHttp,
    ) -> Result<Self, HttpSinkError> {
        Self::build_with_roots(options, egress, plain_http, Vec::new())
    }

    /// [`HttpSink::build`] trusting only `roots` for `https://` when there
    /// are any (tests: a test CA).
    ///
    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn build_with_roots(
        options: HttpSinkOptions,
        egress: EgressOptions,
        plain_http: PlainHttp,
        roots: Vec<reqwest::Certificate>,
    ) -> Result<Self, HttpSinkError> {
        Self::with_policy(
            options,
            Arc::new(EgressPolicy::new(egress)),
            plain_http,
            roots,
            Arc::new(belfry_clock::SystemClock),
        )
    }

    /// The sink checking `egress`, shared with the node's other sinks.
    ///
    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn with_policy(
        options: HttpSinkOptions,
        egress: Arc<EgressPolicy>,
        plain_http: PlainHttp,
        roots: Vec<reqwest::Certificate>,
        clock: Arc<dyn belfry_core::Clock>,
    ) -> Result<Self, HttpSinkError> {
        let reqwest = ReqwestTransport::with_roots(&options, Arc::clone(&egress), roots)
            .map_err(HttpSinkError::Client)?;
        let plain = Client::new(
            options.connect_timeout,
            options.pool_max_idle_per_host,
            options.pool_idle_timeout,
            egress,
            clock,
        );
        let proxied = HTTP_PROXY_VARIABLES
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        Ok(HttpSink {
            reqwest,
            plain: Arc::new(plain),
            plain_http: plain_http == PlainHttp::Auto && !proxied,
            options,
            prepared: Arc::default(),
        })
    }

    fn route(&self, target: &HttpTarget) -> Result<Route, String> {
        let url = reqwest::Url::parse(&target.url)
            .map_err(|e| format!("tenant url is not a valid URL: {e}"))?;
        let headers = tenant_headers(&target.headers)?;
        let user_agent = &self.options.user_agent;
        if self.plain_http && url.scheme() == "http" {
            Ok(Route::Plain(
                self.plain.prepare(&url, &headers, user_agent)?,
            ))
        } else {
            Ok(Route::Reqwest(
                self.reqwest.prepare(&url, &headers, user_agent)?,
            ))
        }
    }

    pub fn options(&self) -> &HttpSinkOptions {
        &self.options
    }
}

/// The result for a response with `status`. The message is the status and
/// its reason phrase, never the receiver's body: whoever reads the error
/// (the tenant, through `last_error`, the attempts or a dry run) must not
/// read what a service behind the URL answered.
fn status_result(status: u16, retry_after: Option<RetryAfter>) -> DeliveryResult {
    let verdict = classify_status(status);
    if verdict == Verdict::Delivered {
        return DeliveryResult::delivered(Some(status));
    }
    let message = match reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|code| code.canonical_reason())
    {
        Some(reason) => format!("HTTP {status} {reason}"),
        None => format!("HTTP {status}"),
    };
    DeliveryResult::failed(verdict, Some(status), message).steered(steer(status, retry_after))
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
        let prepared = self
            .prepared
            .get(delivery.tenant, target, |target| self.route(target));
        let (route, signer) = match prepared.usable() {
            Ok(usable) => usable,
            Err(result) => return result,
        };
        let body = render_delivery_body(delivery.event, delivery.triggered_at);
        // The event's own attempt timeout, else its tenant's, else the
        // node's; within the node's cap either way.
        let timeout = self.options.timeout_for(
            delivery
                .event
                .settings
                .attempt_timeout_ms
                .or(target.timeout_ms),
        );

        let event = delivery.event;
        let event_id = encoded(event.key.id.as_str());
        let tenant = encoded(event.key.tenant.as_str());
        let scheduled_at = event.event_time.to_rfc3339();
        let attempt = delivery.attempt.to_string();
        let version = encoded(event.version.as_str());
        let mut headers: Vec<(&'static str, &str)> = Vec::with_capacity(8);
        headers.extend([
            (HEADER_EVENT_ID, &*event_id),
            (HEADER_TENANT, &*tenant),
            (HEADER_SCHEDULED_AT, scheduled_at.as_str()),
            (HEADER_ATTEMPT, attempt.as_str()),
            (HEADER_IDEMPOTENCY_KEY, &*version),
        ]);
        let signed = signer.map(|signer| {
            let timestamp = unix_seconds(delivery.triggered_at).to_string();
            let signature = signer.signature(&version, &timestamp, &body, delivery.triggered_at);
            (timestamp, signature)
        });
        if let Some((timestamp, signature)) = &signed {
            headers.extend([
                (HEADER_WEBHOOK_ID, &*version),
                (HEADER_WEBHOOK_TIMESTAMP, timestamp.as_str()),
                (HEADER_WEBHOOK_SIGNATURE, signature.as_str()),
            ]);
        }
        let request = Outgoing {
            headers: &headers,
            body: &body,
        };
        let sent = match route {
            Route::Plain(target) => Transport::send(&*self.plain, target, request, timeout).await,
            Route::Reqwest(target) => self.reqwest.send(target, request, timeout).await,
        };
        outcome(sent, self.options.connect_timeout, timeout)
    }
}

/// The delivery result of one transport call.
fn outcome(
    sent: Result<Response, TransportError>,
    connect_timeout: Duration,
    timeout: Duration,
) -> DeliveryResult {
    match sent {
        Ok(response) => status_result(response.status, response.retry_after),
        Err(error) => {
            let (verdict, reason) = classify_transport_error(&error, connect_timeout, timeout);
            DeliveryResult::failed(verdict, None, reason)
        }
    }
}

/// The tenant's own headers as a header map.
///
/// # Errors
/// A tenant header that is not a valid HTTP header (the API validates them,
/// so only a config stored by an older version could get here).
fn tenant_headers(tenant_headers: &BTreeMap<String, String>) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::with_capacity(tenant_headers.len() + 9);
    for (name, value) in tenant_headers {
        if belfry_core::tenant::reserved_header(name) {
            // Refused at registration; one stored by an older version is
            // left out rather than sent.
            continue;
        }
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("tenant header name {name:?} is not a valid HTTP header name"))?;
        let value = HeaderValue::from_bytes(value.as_bytes())
            .map_err(|_| format!("tenant header {name} has an invalid value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// `text` percent-encoded for a header value (UTF-8, see
/// [`HEADER_ENCODE`]): ids and tenant names may hold any non-control
/// character, header values only printable ASCII. Plain ASCII ids without
/// `%` or spaces arrive unchanged (and borrowed); receivers should
/// percent-decode.
fn encoded(text: &str) -> Cow<'_, str> {
    utf8_percent_encode(text, HEADER_ENCODE).into()
}

#[cfg(test)]
mod unit_tests {
    use super::super::client::{Endpoint, request_head};
    use super::*;

    #[test]
    fn header_encoding_is_reversible_and_ascii_ids_stay_readable() {
        assert!(matches!(
            encoded("order-42/x_y.z"),
            Cow::Borrowed("order-42/x_y.z")
        ));
        assert_eq!(encoded("a b%c"), "a%20b%25c");
        assert_eq!(encoded("zoë"), "zo%C3%AB");
    }

    #[test]
    fn plain_head_drops_clashing_tenant_headers_and_keeps_the_rest() {
        let url = reqwest::Url::parse("http://us%20er:pw@example.com:8080/a?b=c").unwrap();
        let endpoint = Endpoint::from_url(&url).unwrap();
        let mut tenant = BTreeMap::new();
        for (name, value) in [
            ("Content-Type", "text/plain"),
            ("Idempotency-Key", "forged"),
            ("Webhook-Signature", "v1,forged"),
            ("webhook-id", "forged"),
            ("Content-Length", "1"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close"),
            ("X-Custom", "yes"),
        ] {
            tenant.insert(name.to_string(), value.to_string());
        }
        let headers = tenant_headers(&tenant).unwrap();
        let head = request_head(&endpoint, &url, &headers, "belfry/test");
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /a?b=c HTTP/1.1\r\n\
             host: example.com:8080\r\n\
             user-agent: belfry/test\r\n\
             accept: */*\r\n\
             authorization: Basic dXMgZXI6cHc=\r\n\
             content-type: application/json\r\n\
             x-custom: yes\r\n"
        );
    }

    #[test]
    fn a_bad_tenant_header_is_permanent() {
        let mut headers = BTreeMap::new();
        headers.insert("bad header".to_string(), "v".to_string());
        let target = HttpTarget {
            url: "http://example.com/".into(),
            headers,
            timeout_ms: None,
            delivery: Default::default(),
        };
        for plain in [PlainHttp::Auto, PlainHttp::Reqwest] {
            let sink = HttpSink::build(HttpSinkOptions::default(), EgressOptions::default(), plain)
                .unwrap();
            let route = sink.route(&target);
            assert!(route.is_err(), "{route:?}");
        }
    }
}
