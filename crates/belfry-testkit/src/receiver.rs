//! A recording webhook receiver: a real HTTP/1.1 server on loopback.
//!
//! Every request is recorded (arrival wall-clock time, method, path,
//! headers, body) and answered according to programmable behaviour:
//!
//! 1. a responder closure, when one is set ([`Receiver::set_responder`]);
//! 2. otherwise the first matching [`Rule`] with budget left
//!    ([`Receiver::push_rule`]), in the order they were pushed;
//! 3. otherwise the default response ([`Receiver::set_default`], `200`).
//!
//! Two modes, both recording into one `Mutex<Vec<_>>`:
//!
//! - full ([`Receiver::start`]): hyper 1 used directly (no framework),
//!   recording everything, for tests;
//! - lean ([`Receiver::start_lean`], the benchmark's sink): a hand-rolled
//!   HTTP/1.1 loop (`lean.rs`) that keeps only the arrival time, the method
//!   and [`LEAN_HEADERS`], no path and no body, so a million requests stay
//!   small, and spends as little CPU per request as it can, since it shares
//!   the machine with the node under test. It parses every request one
//!   read brings (pipelining), records them under one lock and answers
//!   them in one write (unless an answer is delayed). Paths are not kept,
//!   so rules with a path never match in lean mode.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

mod lean;

/// The headers the lean mode keeps (lowercase). Spelled out here rather than
/// imported because this crate must not depend on any belfry crate.
pub const LEAN_HEADERS: &[&str] = &[
    "x-belfry-event-id",
    "x-belfry-scheduled-at",
    "idempotency-key",
];

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// When the request head arrived, in wall-clock milliseconds since the
    /// UNIX epoch (read once per request; in lean mode once per socket read,
    /// shared by the requests whose heads that read completed).
    pub arrived_at_ms: i64,
    /// The same instant on the monotonic clock, for measuring within a test.
    pub arrived_at: Instant,
    pub method: Method,
    /// Path and query, e.g. `/hook?x=1`. Empty in lean mode.
    pub path: String,
    /// Header names in lowercase, values lossily decoded as UTF-8, in the
    /// order received. Lean mode keeps only [`LEAN_HEADERS`].
    pub headers: Vec<(String, String)>,
    /// Empty in lean mode.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text, lossily decoded.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    /// When the body is not JSON.
    pub fn body_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// What the receiver answers to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Waited before answering (the request is recorded before the wait).
    pub delay: Duration,
    pub body: Bytes,
    /// Extra response headers (`Retry-After`, …). Sent by the default
    /// mode only; the lean mode answers without them.
    pub headers: Vec<(String, String)>,
}

impl Response {
    /// `status` at once, with an empty body.
    pub fn status(status: u16) -> Self {
        Response {
            status,
            delay: Duration::ZERO,
            body: Bytes::new(),
            headers: Vec::new(),
        }
    }

    /// Adds the response header `name: value` (default mode only).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }
}

impl Default for Response {
    fn default() -> Self {
        Response::status(200)
    }
}

/// A canned answer for matching requests, optionally limited to a number of
/// uses ("respond 500 to the first 3 requests for `/flaky`").
#[derive(Debug, Clone)]
pub struct Rule {
    path: Option<String>,
    /// Uses left; `None` is unlimited.
    remaining: Option<u64>,
    response: Response,
}

impl Rule {
    /// Answers `response` to every matching request.
    pub fn always(response: Response) -> Self {
        Rule {
            path: None,
            remaining: None,
            response,
        }
    }

    /// Answers `response` to the first `uses` matching requests, then stops
    /// matching.
    pub fn first(uses: u64, response: Response) -> Self {
        Rule {
            path: None,
            remaining: Some(uses),
            response,
        }
    }

    /// Matches only requests whose path (without the query) is `path`.
    pub fn for_path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    fn matches(&self, path: &str) -> bool {
        self.remaining != Some(0)
            && self.path.as_deref().is_none_or(|p| {
                let without_query = path.split('?').next().unwrap_or(path);
                p == without_query
            })
    }
}

/// A closure deciding the answer to each request.
pub type Responder = Arc<dyn Fn(&RecordedRequest) -> Response + Send + Sync>;

#[derive(Default)]
struct Behaviour {
    responder: Option<Responder>,
    rules: Vec<Rule>,
    default: Response,
}

impl Behaviour {
    fn decide(&mut self, request: &RecordedRequest) -> Response {
        if let Some(responder) = &self.responder {
            return responder(request);
        }
        // Lean records carry no path; rules with a path never match them.
        for rule in &mut self.rules {
            if rule.matches(&request.path) {
                if let Some(left) = rule.remaining.as_mut() {
                    *left -= 1;
                }
                return rule.response.clone();
            }
        }
        self.default.clone()
    }
}

/// State shared by the server tasks and the [`Receiver`] handle.
struct Shared {
    lean: bool,
    records: Mutex<Vec<RecordedRequest>>,
    /// Requests seen, including any taken out with [`Receiver::take_requests`].
    count: AtomicU64,
    accepted_connections: AtomicU64,
    behaviour: Mutex<Behaviour>,
}

/// Locks `mutex`, recovering from poisoning: a panicking responder closure
/// must not take the whole receiver down with it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running receiver. Dropping it stops the server and closes every
/// connection.
pub struct Receiver {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("addr", &self.addr)
            .field("lean", &self.shared.lean)
            .field("count", &self.count())
            .finish()
    }
}

impl Receiver {
    /// Starts a receiver on `127.0.0.1:0` that records everything.
    ///
    /// # Panics
    /// When no loopback port can be bound (the test cannot run anyway).
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// Starts a receiver that records only the arrival time and
    /// [`LEAN_HEADERS`], for benchmarks.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start_lean() -> Self {
        Self::start_with(true).await
    }

    /// Starts a receiver on a given loopback port (`0` picks a free one),
    /// for a benchmark peer that must be told the URL in advance.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn start_on_port(port: u16, lean: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        Ok(Self::serve_on(listener, lean))
    }

    async fn start_with(lean: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the receiver");
        Self::serve_on(listener, lean)
    }

    fn serve_on(listener: TcpListener, lean: bool) -> Self {
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let shared = Arc::new(Shared {
            lean,
            records: Mutex::new(Vec::new()),
            count: AtomicU64::new(0),
            accepted_connections: AtomicU64::new(0),
            behaviour: Mutex::new(Behaviour::default()),
        });
        let server = tokio::spawn(serve(listener, Arc::clone(&shared)));
        Receiver {
            shared,
            addr,
            server,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of `path` on this receiver (a leading `/` is added if missing).
    pub fn url(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("{}{path}", self.base_url())
        } else {
            format!("{}/{path}", self.base_url())
        }
    }

    /// Makes room for `additional` more records up front, so a benchmark's
    /// receiver never reallocates its record list mid-run (a copy of
    /// hundreds of thousands of records under the lock stalls every
    /// connection and shows up as lateness that is not the node's).
    pub fn reserve(&self, additional: usize) {
        lock(&self.shared.records).reserve(additional);
    }

    /// A copy of every recorded request, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.records).clone()
    }

    /// Takes the recorded requests out (cheaper than [`Self::requests`] for
    /// large runs). [`Self::count`] keeps counting them.
    pub fn take_requests(&self) -> Vec<RecordedRequest> {
        std::mem::take(&mut *lock(&self.shared.records))
    }

    /// Requests received so far.
    pub fn count(&self) -> usize {
        usize::try_from(self.shared.count.load(Ordering::Acquire)).unwrap_or(usize::MAX)
    }

    /// TCP connections accepted so far (to check keep-alive reuse).
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted_connections.load(Ordering::Acquire)
    }

    /// Polls until at least `n` requests arrived, then returns the recorded
    /// ones.
    ///
    /// # Errors
    /// On timeout: a description of what did arrive.
    pub async fn wait_for_count(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.count() >= n {
                return Ok(self.requests());
            }
            if tokio::time::Instant::now() >= deadline {
                let seen = self.requests();
                let summary: Vec<String> = seen
                    .iter()
                    .take(20)
                    .map(|r| format!("{} {} {}", r.method, r.path, r.body_text()))
                    .collect();
                return Err(format!(
                    "expected {n} requests within {timeout:?}, saw {}: {summary:#?}",
                    self.count()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Answers every request with the result of `responder` (overrides rules
    /// and the default until [`Self::clear_responder`]).
    pub fn set_responder(
        &self,
        responder: impl Fn(&RecordedRequest) -> Response + Send + Sync + 'static,
    ) {
        lock(&self.shared.behaviour).responder = Some(Arc::new(responder));
    }

    pub fn clear_responder(&self) {
        lock(&self.shared.behaviour).responder = None;
    }

    /// Adds a rule after the existing ones.
    pub fn push_rule(&self, rule: Rule) {
        lock(&self.shared.behaviour).rules.push(rule);
    }

    pub fn clear_rules(&self) {
        lock(&self.shared.behaviour).rules.clear();
    }

    /// The answer when no responder is set and no rule matches.
    pub fn set_default(&self, response: Response) {
        lock(&self.shared.behaviour).default = response;
    }

    /// Shorthand for a default of `status` with no delay.
    pub fn set_default_status(&self, status: u16) {
        self.set_default(Response::status(status));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The accept task owns the connection tasks (a JoinSet), so aborting
        // it closes every connection too.
        self.server.abort();
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else {
                    // Out of file descriptors and the like: back off briefly
                    // instead of spinning.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                shared.accepted_connections.fetch_add(1, Ordering::AcqRel);
                // Latency matters more than packet count for a receiver.
                let _ = stream.set_nodelay(true);
                if shared.lean {
                    connections.spawn(lean::serve_connection(stream, Arc::clone(&shared)));
                    continue;
                }
                let shared = Arc::clone(&shared);
                let connection = http.serve_connection(
                    TokioIo::new(stream),
                    service_fn(move |request| handle(request, Arc::clone(&shared))),
                );
                connections.spawn(async move {
                    // A client hanging up mid-request is not our concern.
                    let _ = connection.await;
                });
            }
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Full mode's hyper service: records everything.
async fn handle(
    request: hyper::Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    #[allow(clippy::disallowed_methods)] // Arrival must be wall-clock time.
    let arrived_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default();
    let arrived_at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let header_text =
        |value: &hyper::header::HeaderValue| String::from_utf8_lossy(value.as_bytes()).into_owned();
    let record = RecordedRequest {
        arrived_at_ms,
        arrived_at,
        method: parts.method,
        path: parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| "/".to_string()),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), header_text(value)))
            .collect(),
        body,
    };
    let response = lock(&shared.behaviour).decide(&record);
    lock(&shared.records).push(record);
    shared.count.fetch_add(1, Ordering::AcqRel);
    if !response.delay.is_zero() {
        tokio::time::sleep(response.delay).await;
    }
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut reply = hyper::Response::new(Full::new(response.body));
    *reply.status_mut() = status;
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            reply.headers_mut().append(name, value);
        }
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn post(client: &reqwest::Client, url: &str, body: &'static str) -> u16 {
        client
            .post(url)
            .header("x-belfry-event-id", "e1")
            .header("x-other", "o")
            .body(body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[tokio::test]
    async fn records_requests_and_follows_rules() {
        let receiver = Receiver::start().await;
        receiver.push_rule(Rule::first(2, Response::status(500)).for_path("/flaky"));
        receiver.set_default_status(204);
        let client = crate::http_client();

        assert_eq!(post(&client, &receiver.url("/flaky?x=1"), "a").await, 500);
        assert_eq!(post(&client, &receiver.url("/other"), "b").await, 204);
        assert_eq!(post(&client, &receiver.url("flaky"), "c").await, 500);
        assert_eq!(post(&client, &receiver.url("/flaky"), "d").await, 204);

        let seen = receiver
            .wait_for_count(4, Duration::from_secs(10))
            .await
            .unwrap();
        let bodies: Vec<String> = seen.iter().map(RecordedRequest::body_text).collect();
        assert_eq!(bodies, ["a", "b", "c", "d"]);
        assert_eq!(seen[0].path, "/flaky?x=1");
        assert_eq!(seen[0].method, Method::POST);
        assert_eq!(seen[0].header("X-Belfry-Event-Id"), Some("e1"));
        assert_eq!(seen[0].header("x-other"), Some("o"));
        #[allow(clippy::disallowed_methods)]
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(seen[0].arrived_at_ms <= now_ms && seen[0].arrived_at_ms > now_ms - 60_000);
        assert!(seen[0].arrived_at_ms <= seen[3].arrived_at_ms);
        // One keep-alive client, sequential requests: one connection.
        assert_eq!(receiver.accepted_connections(), 1);
    }

    #[tokio::test]
    async fn responder_closure_delays_and_lean_mode_keeps_only_key_headers() {
        let receiver = Receiver::start_lean().await;
        receiver.set_responder(|request| {
            if request.header("x-belfry-event-id") == Some("e1") {
                Response::status(429)
                    .with_delay(Duration::from_millis(50))
                    .with_body("slow down")
            } else {
                Response::status(200)
            }
        });
        let client = crate::http_client();
        let started = Instant::now();
        let reply = client
            .post(receiver.url("/x"))
            .header("x-belfry-event-id", "e1")
            .body("payload")
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 429);
        assert_eq!(reply.text().await.unwrap(), "slow down");
        assert!(started.elapsed() >= Duration::from_millis(50));

        let seen = receiver.requests();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0].headers,
            [("x-belfry-event-id".to_string(), "e1".to_string())]
        );
        assert!(seen[0].body.is_empty());
        assert_eq!(receiver.take_requests().len(), 1);
        assert!(receiver.requests().is_empty());
        assert_eq!(receiver.count(), 1);

        let err = receiver
            .wait_for_count(2, Duration::from_millis(30))
            .await
            .unwrap_err();
        assert!(err.contains("saw 1"), "{err}");
    }
}
