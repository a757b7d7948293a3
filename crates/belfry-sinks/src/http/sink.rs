//! The webhook sink: builds each attempt's `POST` and classifies how it
//! went. Plain `http://` goes through Belfry's own client
//! ([`super::client`]), `https://` through reqwest; both keep connections
//! alive per host.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use belfry_core::tenant::HttpTarget;
use belfry_core::{SinkConfig, TenantName, Verdict};
use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, HeaderMap, HeaderName, HeaderValue, USER_AGENT,
};

use super::client::{Client, Endpoint};
use super::config::HttpSinkOptions;
use super::retry::{classify_client_error, classify_error, classify_status};
use super::{
    HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_IDEMPOTENCY_KEY, HEADER_SCHEDULED_AT, HEADER_TENANT,
};
use crate::body::render_delivery_body;
use crate::{Delivery, DeliveryResult, Sink};

/// How much of a refusal's body goes into the error message.
pub const ERROR_BODY_LIMIT: usize = 1024;

/// How much of a response's body is read so the connection can be reused;
/// a larger body is abandoned (and its connection closed) instead.
pub const DRAIN_LIMIT: usize = 64 * 1024;

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

/// Headers the plain-http request head always gets from Belfry: a
/// tenant's header with one of these names is dropped. Belfry's own (which
/// win on a clash, as with reqwest) and the framing and connection headers
/// the client manages.
const OWN_HEADERS: &[&str] = &[
    "content-type",
    HEADER_EVENT_ID,
    HEADER_TENANT,
    HEADER_SCHEDULED_AT,
    HEADER_ATTEMPT,
    HEADER_IDEMPOTENCY_KEY,
    "content-length",
    "transfer-encoding",
    "connection",
];

/// The environment variables through which reqwest (hyper-util) picks up a
/// proxy for plain http.
const HTTP_PROXY_VARIABLES: &[&str] = &["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"];

/// Delivers to `SinkConfig::Http` tenants.
#[derive(Debug, Clone)]
pub struct HttpSink {
    /// For `https://`, one for every tenant: its pool keeps connections
    /// alive per host.
    client: reqwest::Client,
    /// For `http://`, one for every tenant, with its own keep-alive pool.
    plain: Arc<Client>,
    /// Whether `http://` goes through `plain`: not when the environment
    /// names an HTTP proxy (Belfry's client does not speak to proxies, so
    /// reqwest keeps serving http there, as it always did).
    plain_http: bool,
    options: HttpSinkOptions,
    /// The prepared request per tenant target, so a delivery does not
    /// re-parse the URL (URL parsing with IDNA showed up in profiles) or
    /// re-validate headers.
    prepared: Arc<Mutex<HashMap<TenantName, Arc<PreparedTarget>>>>,
}

/// A tenant's webhook, parsed once.
#[derive(Debug)]
struct PreparedTarget {
    /// What it was built from; a changed config rebuilds it.
    source: HttpTarget,
    /// Err: why no request can be built (a permanent failure).
    route: Result<Route, String>,
}

/// Which client delivers to a target, with what it needs.
#[derive(Debug)]
enum Route {
    /// `http://` through Belfry's client: where to connect, and the request
    /// head up to Belfry's per-delivery headers (see [`request_head`]).
    Plain { endpoint: Endpoint, head: Vec<u8> },
    /// `https://` (or anything else reqwest may refuse) through reqwest.
    Reqwest {
        url: reqwest::Url,
        headers: HeaderMap,
    },
}

impl PreparedTarget {
    fn new(target: &HttpTarget, user_agent: &str, plain_http: bool) -> Self {
        PreparedTarget {
            source: target.clone(),
            route: route(target, user_agent, plain_http),
        }
    }
}

fn route(target: &HttpTarget, user_agent: &str, plain_http: bool) -> Result<Route, String> {
    let url = reqwest::Url::parse(&target.url)
        .map_err(|e| format!("tenant url is not a valid URL: {e}"))?;
    let headers = tenant_headers(&target.headers)?;
    if plain_http && url.scheme() == "http" {
        let endpoint = Endpoint::from_url(&url)?;
        let head = request_head(&endpoint, &url, &headers, user_agent);
        Ok(Route::Plain { endpoint, head })
    } else {
        Ok(Route::Reqwest { url, headers })
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
        let plain = Client::new(
            options.connect_timeout(),
            options.pool_max_idle_per_host,
            options.pool_idle_timeout(),
        );
        let plain_http = !HTTP_PROXY_VARIABLES
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        Ok(HttpSink {
            client,
            plain: Arc::new(plain),
            plain_http,
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
                let entry = Arc::new(PreparedTarget::new(
                    target,
                    &self.options.user_agent,
                    self.plain_http,
                ));
                cache.insert(tenant.clone(), entry.clone());
                entry
            }
        }
    }

    pub fn options(&self) -> &HttpSinkOptions {
        &self.options
    }

    /// One attempt through Belfry's client.
    async fn post_plain(
        &self,
        endpoint: &Endpoint,
        request: &[u8],
        timeout: Duration,
    ) -> DeliveryResult {
        match self.plain.send(endpoint, request, timeout).await {
            Ok(response) => status_result(response.status, &response.body),
            Err(error) => {
                let (verdict, reason) =
                    classify_client_error(&error, self.options.connect_timeout(), timeout);
                DeliveryResult::failed(verdict, None, reason)
            }
        }
    }

    /// One attempt through reqwest.
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
        status_result(status, &body)
    }
}

/// The result for a response with `status`; `body` is the start of a
/// non-2xx body, for the message.
fn status_result(status: u16, body: &[u8]) -> DeliveryResult {
    let verdict = classify_status(status);
    if verdict == Verdict::Delivered {
        return DeliveryResult::delivered(Some(status));
    }
    let message = if body.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {}", String::from_utf8_lossy(body))
    };
    DeliveryResult::failed(verdict, Some(status), message)
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
        let route = match &prepared.route {
            Ok(route) => route,
            Err(reason) => {
                return DeliveryResult::failed(Verdict::Permanent, None, reason.clone());
            }
        };
        let body = render_delivery_body(delivery.event, delivery.triggered_at);
        let timeout = self.options.request_timeout(target.timeout_ms);
        match route {
            Route::Plain { endpoint, head } => {
                let request = plain_request(head, &delivery, &body);
                self.post_plain(endpoint, &request, timeout).await
            }
            Route::Reqwest { url, headers } => {
                let headers = request_headers(&delivery, headers);
                self.post(url.clone(), headers, body, timeout).await
            }
        }
    }
}

/// The tenant's own headers as a header map.
///
/// # Errors
/// A tenant header that is not a valid HTTP header (the API validates them,
/// so only a config stored by an older version could get here).
fn tenant_headers(tenant_headers: &BTreeMap<String, String>) -> Result<HeaderMap, String> {
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

/// The static part of a plain-http request, everything before Belfry's
/// per-delivery headers: the request line, `host`, `user-agent`, `accept`,
/// `authorization` from the URL's user info (as reqwest does; a tenant's
/// header of the same name wins over these four, again as with reqwest),
/// `content-type`, and the tenant's headers except [`OWN_HEADERS`]. Names
/// are lowercase (as [`HeaderName`] keeps them); values were validated by
/// [`tenant_headers`], so none can break the head.
fn request_head(
    endpoint: &Endpoint,
    url: &reqwest::Url,
    tenant: &HeaderMap,
    user_agent: &str,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"POST ");
    head.extend_from_slice(endpoint.target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    let mut line = |name: &str, value: &[u8]| {
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    };
    if !tenant.contains_key(HOST) {
        line("host", endpoint.host.as_bytes());
    }
    if !tenant.contains_key(USER_AGENT) {
        line("user-agent", user_agent.as_bytes());
    }
    if !tenant.contains_key(ACCEPT) {
        line("accept", b"*/*");
    }
    if !tenant.contains_key(AUTHORIZATION)
        && let Some(credentials) = basic_auth(url)
    {
        line("authorization", credentials.as_bytes());
    }
    line("content-type", b"application/json");
    for (name, value) in tenant {
        if !OWN_HEADERS.contains(&name.as_str()) {
            line(name.as_str(), value.as_bytes());
        }
    }
    head
}

/// `Basic <base64(user:password)>` for a URL with user info (percent-decoded,
/// as reqwest does); `None` without, or when it is not UTF-8.
fn basic_auth(url: &reqwest::Url) -> Option<String> {
    let username = percent_decode_str(url.username()).decode_utf8().ok()?;
    let password = match url.password() {
        Some(password) => Some(percent_decode_str(password).decode_utf8().ok()?),
        None => None,
    };
    if username.is_empty() && password.is_none() {
        return None;
    }
    let credentials = format!("{username}:{}", password.unwrap_or_default());
    Some(format!("Basic {}", base64(credentials.as_bytes())))
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let [a, b, c] = [0, 1, 2].map(|i| group.get(i).copied().unwrap_or(0));
        let n = (u32::from(a) << 16) | (u32::from(b) << 8) | u32::from(c);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if group.len() > 1 { sextet(6) } else { '=' });
        out.push(if group.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

/// One plain-http request: the prepared `head`, Belfry's headers (as in
/// [`request_headers`]), `content-length` and `body`, in one buffer.
fn plain_request(head: &[u8], delivery: &Delivery<'_>, body: &[u8]) -> Vec<u8> {
    let event = delivery.event;
    let mut request = Vec::with_capacity(head.len() + 320 + body.len());
    request.extend_from_slice(head);
    push_encoded(&mut request, HEADER_EVENT_ID, event.key.id.as_str());
    push_encoded(&mut request, HEADER_TENANT, event.key.tenant.as_str());
    push_encoded(
        &mut request,
        HEADER_SCHEDULED_AT,
        &event.event_time.to_rfc3339(),
    );
    // Writing to a Vec cannot fail.
    let _ = write!(request, "{HEADER_ATTEMPT}: {}\r\n", delivery.attempt);
    push_encoded(&mut request, HEADER_IDEMPOTENCY_KEY, event.version.as_str());
    let _ = write!(request, "content-length: {}\r\n\r\n", body.len());
    request.extend_from_slice(body);
    request
}

/// `name: <text percent-encoded>\r\n`, as [`encoded`] does for reqwest.
fn push_encoded(request: &mut Vec<u8>, name: &str, text: &str) {
    request.extend_from_slice(name.as_bytes());
    request.extend_from_slice(b": ");
    for part in utf8_percent_encode(text, HEADER_ENCODE) {
        request.extend_from_slice(part.as_bytes());
    }
    request.extend_from_slice(b"\r\n");
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

    #[test]
    fn base64_matches_the_standard() {
        for (text, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:pä ss", "dXNlcjpww6Qgc3M="),
        ] {
            assert_eq!(base64(text.as_bytes()), expected, "{text}");
        }
    }

    #[test]
    fn plain_head_drops_clashing_tenant_headers_and_keeps_the_rest() {
        let url = reqwest::Url::parse("http://us%20er:pw@example.com:8080/a?b=c").unwrap();
        let endpoint = Endpoint::from_url(&url).unwrap();
        let mut tenant = BTreeMap::new();
        for (name, value) in [
            ("Content-Type", "text/plain"),
            ("Idempotency-Key", "forged"),
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
        };
        let route = route(&target, "belfry/test", true);
        assert!(route.is_err(), "{route:?}");
    }
}
