//! Real HTTP on loopback: every behaviour against the testkit receiver,
//! and byte-exact responses from hand-written servers for the plain-http
//! client's framing, keep-alive and failure paths.
//!
//! Every test runs through both transports ([`TRANSPORTS`]): Belfry's
//! client and reqwest, which the seam can route plain `http://` through
//! ([`PlainHttp::Reqwest`]), so headers, bodies, signing, timeouts,
//! retries, the resend rule and the egress policy are checked for both on
//! plain loopback http. Where the two differ by design (Belfry's own error
//! wording, head limit and connection reuse after a too-long body) the
//! test says so. One test runs reqwest over real TLS with a test CA.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use belfry_core::tenant::HttpTarget;
use belfry_core::{
    DeliveryOption, EventId, EventKey, EventRecord, EventVersion, PartitionId, SigningSecrets,
    SinkConfig, TenantConfig, TenantName, Timestamp, Verdict,
};
use belfry_testkit::{Receiver, Response, Rule, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::sink::ERROR_BODY_LIMIT;
use super::{HttpSink, HttpSinkOptions, PlainHttp};
use crate::body::{BigBenStatus, EventResponse};
use crate::egress::{EgressMode, EgressOptions, EgressPolicy};
use crate::signing::{Signer, generate_secret, unix_seconds};
use crate::{Delivery, DeliveryResult, Sink};

const WAIT: Duration = Duration::from_secs(10);

/// Every test runs against both transports: Belfry's client and reqwest
/// (on plain loopback http: the seam routes http through reqwest on
/// request, so no TLS is needed to exercise it).
const TRANSPORTS: [PlainHttp; 2] = [PlainHttp::Auto, PlainHttp::Reqwest];

fn sink() -> HttpSink {
    sink_with(PlainHttp::Auto)
}

fn sink_with(transport: PlainHttp) -> HttpSink {
    HttpSink::build(
        HttpSinkOptions::default(),
        EgressOptions::internal(),
        transport,
    )
    .unwrap()
}

fn tenant(url: String, timeout_ms: Option<u64>) -> TenantConfig {
    let mut headers = BTreeMap::new();
    headers.insert("Authorization".to_string(), "Bearer s3cret".to_string());
    TenantConfig {
        name: TenantName::new("TenantB/ProgramB/EnvC").unwrap(),
        sink: SinkConfig::Http(HttpTarget {
            url,
            headers,
            timeout_ms,
            delivery: Default::default(),
        }),
        signing: None,
        notify: None,
    }
}

fn event(tenant: &TenantConfig, id: &str, delivery: DeliveryOption) -> EventRecord {
    let at = Timestamp::parse_rfc3339("2030-01-31T04:00:30.250Z").unwrap();
    let key = EventKey::new(tenant.name.clone(), EventId::new(id).unwrap());
    EventRecord {
        debounce_since: None,
        partition: PartitionId(1),
        version: EventVersion::from_string("0190-version-1".into()),
        ..crate::scheduled_event(key, at, Some("{\"orderId\":42}".into()), delivery)
    }
}

fn triggered_at() -> Timestamp {
    Timestamp::parse_rfc3339("2030-01-31T04:00:31Z").unwrap()
}

async fn deliver_to(
    sink: &HttpSink,
    tenant: &TenantConfig,
    event: &EventRecord,
    attempt: u32,
) -> DeliveryResult {
    sink.deliver(Delivery {
        tenant,
        event,
        attempt,
        triggered_at: triggered_at(),
        epoch: Some(1),
    })
    .await
}

/// Delivers one FULL_EVENT event to `path` on `receiver`.
async fn deliver_once(transport: PlainHttp, receiver: &Receiver, path: &str) -> DeliveryResult {
    let tenant = tenant(receiver.url(path), None);
    let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
    deliver_to(&sink_with(transport), &tenant, &event, 1).await
}

#[tokio::test]
async fn success_statuses_are_delivered() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        receiver.push_rule(Rule::always(Response::status(204)).for_path("/no-content"));
        receiver.push_rule(
            Rule::always(Response::status(202).with_body("queued")).for_path("/accepted"),
        );

        for (path, status) in [("/ok", 200), ("/no-content", 204), ("/accepted", 202)] {
            let result = deliver_once(transport, &receiver, path).await;
            assert_eq!(result, DeliveryResult::delivered(Some(status)), "{path}");
        }
        assert_eq!(receiver.count(), 3);
    }
}

#[tokio::test]
async fn server_errors_redirects_408_and_429_are_retried() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        receiver.set_responder(|request| {
            let status = request.path.trim_start_matches('/').parse().unwrap_or(200);
            Response::status(status).with_body(format!("answer {status}"))
        });
        for status in [500, 503, 301, 408, 429] {
            let result = deliver_once(transport, &receiver, &format!("/{status}")).await;
            assert_eq!(result.verdict, Verdict::Retry, "{status}");
            assert_eq!(result.http_status, Some(status), "{status}");
            // The status and its reason, never the body.
            let reason = reqwest::StatusCode::from_u16(status)
                .unwrap()
                .canonical_reason()
                .unwrap();
            assert_eq!(
                result.error.as_deref(),
                Some(format!("HTTP {status} {reason}").as_str())
            );
        }
        // The redirect was not followed: exactly one request per delivery.
        assert_eq!(receiver.count(), 5);
    }
}

#[tokio::test]
async fn client_errors_are_permanent_with_the_status_never_the_body() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        receiver.push_rule(
            Rule::always(Response::status(404).with_body("no such order")).for_path("/gone"),
        );
        receiver.push_rule(Rule::always(Response::status(400)).for_path("/empty"));
        receiver.push_rule(
            Rule::always(Response::status(422).with_body(vec![b'x'; 10 * ERROR_BODY_LIMIT]))
                .for_path("/huge"),
        );

        let result = deliver_once(transport, &receiver, "/gone").await;
        assert_eq!(
            result,
            DeliveryResult::failed(Verdict::Permanent, Some(404), "HTTP 404 Not Found")
        );

        let result = deliver_once(transport, &receiver, "/empty").await;
        assert_eq!(
            result,
            DeliveryResult::failed(Verdict::Permanent, Some(400), "HTTP 400 Bad Request")
        );

        let result = deliver_once(transport, &receiver, "/huge").await;
        assert_eq!(result.verdict, Verdict::Permanent);
        assert_eq!(
            result.error.as_deref(),
            Some("HTTP 422 Unprocessable Entity")
        );
    }
}

#[tokio::test]
async fn a_receiver_slower_than_the_tenant_timeout_is_retried() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let slow = Duration::from_secs(20);
        receiver.set_default(Response::status(200).with_delay(slow));
        let tenant = tenant(receiver.url("/slow"), Some(300));
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);

        let started = Instant::now();
        let result = deliver_to(&sink_with(transport), &tenant, &event, 1).await;
        assert_eq!(
            result,
            DeliveryResult::failed(Verdict::Retry, None, "timeout after 300 ms")
        );
        // Generous: only shows the tenant's limit applied, not the receiver's delay.
        assert!(started.elapsed() < slow, "{:?}", started.elapsed());
        assert_eq!(receiver.count(), 1);
    }
}

#[tokio::test]
async fn connection_refused_is_retried() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let port = free_port();
        let tenant = tenant(format!("http://127.0.0.1:{port}/hook"), None);
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
        let result = deliver_to(&sink_with(transport), &tenant, &event, 1).await;
        assert_eq!(
            result,
            DeliveryResult::failed(Verdict::Retry, None, "connection refused")
        );
    }
}

#[tokio::test]
async fn https_goes_through_rustls() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        // The receiver speaks plain HTTP, so the TLS handshake fails: a retry
        // with a connect error, which shows the https path is wired (without a
        // TLS backend reqwest refuses the URL scheme while building the request).
        let receiver = Receiver::start().await;
        let url = receiver.base_url().replace("http://", "https://") + "/hook";
        let tenant = tenant(url, Some(5_000));
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
        let result = deliver_to(&sink_with(transport), &tenant, &event, 1).await;
        assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
        let message = result.error.unwrap();
        assert!(message.starts_with("connect failed"), "{message}");
        assert_eq!(receiver.count(), 0);
    }
}

#[tokio::test]
async fn request_carries_every_header() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let tenant = tenant(receiver.url("/hooks/orders"), None);
        let event = event(&tenant, "zoë 100%", DeliveryOption::FullEvent);
        let sink = sink_with(transport);
        assert_eq!(
            deliver_to(&sink, &tenant, &event, 1).await.verdict,
            Verdict::Delivered
        );
        assert_eq!(
            deliver_to(&sink, &tenant, &event, 2).await.verdict,
            Verdict::Delivered
        );

        let seen = receiver.wait_for_count(2, WAIT).await.unwrap();
        let first = &seen[0];
        assert_eq!(first.method, "POST");
        assert_eq!(first.path, "/hooks/orders");
        assert_eq!(first.header("content-type"), Some("application/json"));
        assert_eq!(first.header("authorization"), Some("Bearer s3cret"));
        assert_eq!(first.header("x-belfry-event-id"), Some("zo%C3%AB%20100%25"));
        assert_eq!(
            first.header("x-belfry-tenant"),
            Some("TenantB/ProgramB/EnvC")
        );
        assert_eq!(
            first.header("x-belfry-scheduled-at"),
            Some("2030-01-31T04:00:30.25Z")
        );
        assert_eq!(first.header("x-belfry-attempt"), Some("1"));
        assert_eq!(first.header("idempotency-key"), Some("0190-version-1"));
        assert_eq!(
            first.header("user-agent"),
            Some(concat!("belfry/", env!("CARGO_PKG_VERSION")))
        );
        // A retry of the same version: same key, next attempt number.
        assert_eq!(seen[1].header("idempotency-key"), Some("0190-version-1"));
        assert_eq!(seen[1].header("x-belfry-attempt"), Some("2"));
    }
}

#[tokio::test]
async fn belfry_headers_win_over_tenant_headers() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let mut tenant = tenant(receiver.url("/h"), None);
        if let SinkConfig::Http(target) = &mut tenant.sink {
            target
                .headers
                .insert("Content-Type".into(), "text/plain".into());
            target
                .headers
                .insert("Idempotency-Key".into(), "forged".into());
        }
        let event = event(&tenant, "e", DeliveryOption::FullEvent);
        deliver_to(&sink_with(transport), &tenant, &event, 1).await;
        let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
        let values = |name: &str| -> Vec<&str> {
            seen[0]
                .headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(values("content-type"), ["application/json"]);
        assert_eq!(values("idempotency-key"), ["0190-version-1"]);
    }
}

#[tokio::test]
async fn full_event_body_parses_back() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let tenant = tenant(receiver.url("/full"), None);
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
        deliver_to(&sink_with(transport), &tenant, &event, 1).await;

        let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
        let body: EventResponse = serde_json::from_slice(&seen[0].body).unwrap();
        assert_eq!(body.id.as_deref(), Some("order-42"));
        assert_eq!(body.tenant.as_deref(), Some("TenantB/ProgramB/EnvC"));
        assert_eq!(body.event_time.as_deref(), Some("2030-01-31T04:00:30.25Z"));
        assert_eq!(body.payload.as_deref(), Some("{\"orderId\":42}"));
        assert_eq!(body.event_id.as_deref(), Some("0190-version-1"));
        assert_eq!(body.triggered_at.as_deref(), Some("2030-01-31T04:00:31Z"));
        assert_eq!(body.event_status, Some(BigBenStatus::Triggered));
        assert_eq!(body.delivery_option, Some(DeliveryOption::FullEvent));
        assert_eq!(body.error, None);
        // Null fields are present, not omitted.
        let raw = seen[0].body_json().unwrap();
        assert!(raw.as_object().unwrap()["error"].is_null());
    }
}

#[tokio::test]
async fn payload_only_body_is_the_raw_payload() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let tenant = tenant(receiver.url("/raw"), None);
        let event = event(&tenant, "order-42", DeliveryOption::PayloadOnly);
        deliver_to(&sink_with(transport), &tenant, &event, 1).await;

        let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
        assert_eq!(seen[0].body_text(), "{\"orderId\":42}");
        assert_eq!(seen[0].header("content-type"), Some("application/json"));
    }
}

#[tokio::test]
async fn sequential_deliveries_reuse_one_connection() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let tenant = tenant(receiver.url("/reuse"), None);
        let sink = sink_with(transport);
        let deliveries = 50;
        for i in 0..deliveries {
            let event = event(&tenant, &format!("e{i}"), DeliveryOption::FullEvent);
            let result = deliver_to(&sink, &tenant, &event, 1).await;
            assert_eq!(result.verdict, Verdict::Delivered);
        }
        receiver.wait_for_count(deliveries, WAIT).await.unwrap();
        // Keep-alive: one connection, allowing one spare for a race with the
        // server's close of an idle connection.
        assert!(
            receiver.accepted_connections() <= 2,
            "{} connections for {deliveries} deliveries",
            receiver.accepted_connections()
        );
    }
}

// ---- Byte-exact responses from a hand-written server (Belfry's client) ----

/// A loopback server whose connections are served by a test's own code, to
/// send exactly the bytes under test. Stops when dropped.
struct RawServer {
    port: u16,
    accepted: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawServer {
    /// Serves connection number `n` (from 0) with `serve(n, conn)`.
    async fn start<F, Fut>(serve: F) -> RawServer
    where
        F: Fn(usize, RawConn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let accepted = Arc::clone(&accepted);
            let requests = Arc::clone(&requests);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let n = accepted.fetch_add(1, Ordering::SeqCst);
                    let conn = RawConn {
                        stream,
                        buffer: Vec::new(),
                        requests: Arc::clone(&requests),
                    };
                    tokio::spawn(serve(n, conn));
                }
            }
        });
        RawServer {
            port,
            accepted,
            requests,
            task,
        }
    }

    /// Answers every request on every connection with `response`.
    async fn always(response: &'static [u8]) -> RawServer {
        RawServer::start(move |_, mut conn| async move {
            while conn.read_request().await {
                conn.send(response).await;
            }
        })
        .await
    }

    fn tenant(&self, timeout_ms: Option<u64>) -> TenantConfig {
        tenant(format!("http://127.0.0.1:{}/hook", self.port), timeout_ms)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

struct RawConn {
    stream: TcpStream,
    buffer: Vec<u8>,
    requests: Arc<AtomicUsize>,
}

impl RawConn {
    /// Reads one whole request (head and `content-length` body); `false`
    /// when the client closed the connection.
    async fn read_request(&mut self) -> bool {
        loop {
            let complete = {
                let mut headers = [httparse::EMPTY_HEADER; 32];
                let mut request = httparse::Request::new(&mut headers);
                match request.parse(&self.buffer).unwrap() {
                    httparse::Status::Complete(head) => {
                        let length: usize = request
                            .headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                            .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                            .unwrap_or(0);
                        Some(head + length).filter(|total| self.buffer.len() >= *total)
                    }
                    httparse::Status::Partial => None,
                }
            };
            if let Some(total) = complete {
                self.buffer.drain(..total);
                self.requests.fetch_add(1, Ordering::SeqCst);
                return true;
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Writes `bytes`; errors (the client may have gone) are ignored.
    async fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }
}

async fn deliver_raw(sink: &HttpSink, tenant: &TenantConfig) -> DeliveryResult {
    let event = event(tenant, "order-42", DeliveryOption::FullEvent);
    deliver_to(sink, tenant, &event, 1).await
}

#[tokio::test]
async fn chunked_responses_are_decoded_and_keep_the_connection() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let server = RawServer::start(|_, mut conn| async move {
            // A success with extensions and trailers, then a refusal whose
            // message comes from three chunks.
            if conn.read_request().await {
                conn.send(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                      5;name=value\r\nhello\r\n6\r\n world\r\n0;last\r\nx-trailer: 1\r\n\r\n",
                )
                .await;
            }
            if conn.read_request().await {
                conn.send(
                    b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n\
                      3\r\nno \r\n5\r\nsuch \r\nA\r\norder here\r\n0\r\n\r\n",
                )
                .await;
            }
            while conn.read_request().await {
                conn.send(b"HTTP/1.1 204 No Content\r\n\r\n").await;
            }
        })
        .await;
        let tenant = server.tenant(None);
        let sink = sink_with(transport);
        assert_eq!(
            deliver_raw(&sink, &tenant).await,
            DeliveryResult::delivered(Some(200))
        );
        assert_eq!(
            deliver_raw(&sink, &tenant).await,
            DeliveryResult::failed(Verdict::Permanent, Some(404), "HTTP 404 Not Found")
        );
        assert_eq!(
            deliver_raw(&sink, &tenant).await,
            DeliveryResult::delivered(Some(204))
        );
        assert_eq!(server.accepted(), 1);
        assert_eq!(server.requests(), 3);
    }
}

#[tokio::test]
async fn connection_close_and_http_1_0_are_not_reused() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        for response in [
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nConnection: close\r\n\r\nok".as_slice(),
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok".as_slice(),
        ] {
            // The server leaves the connection open: only the client's reading
            // of the head keeps it from sending the next request on it.
            let server = RawServer::always(response).await;
            let tenant = server.tenant(None);
            let sink = sink_with(transport);
            for _ in 0..2 {
                assert_eq!(
                    deliver_raw(&sink, &tenant).await,
                    DeliveryResult::delivered(Some(200))
                );
            }
            assert_eq!(
                server.accepted(),
                2,
                "{}",
                String::from_utf8_lossy(response)
            );
            assert_eq!(server.requests(), 2);
        }
        // HTTP/1.0 with keep-alive is reused.
        let server = RawServer::always(
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok",
        )
        .await;
        let tenant = server.tenant(None);
        let sink = sink_with(transport);
        for _ in 0..2 {
            assert_eq!(
                deliver_raw(&sink, &tenant).await,
                DeliveryResult::delivered(Some(200))
            );
        }
        assert_eq!(server.accepted(), 1);
    }
}

#[tokio::test]
async fn a_server_closing_an_idle_connection_does_not_fail_the_next_delivery() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        // One response per connection, then the server closes it, although the
        // response said nothing about it.
        let server = RawServer::start(|_, mut conn| async move {
            if conn.read_request().await {
                conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        })
        .await;
        let tenant = server.tenant(None);
        let sink = sink_with(transport);
        for _ in 0..3 {
            assert_eq!(
                deliver_raw(&sink, &tenant).await,
                DeliveryResult::delivered(Some(200))
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(server.accepted(), 3);
        assert_eq!(server.requests(), 3);
    }
}

#[tokio::test]
async fn a_request_written_whole_on_a_reused_connection_is_not_sent_again() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        // The first connection answers one request, then reads the next
        // whole and closes without answering: what a server closing an idle
        // connection just as a request arrives looks like, but also a
        // receiver that crashed after acting on it. The transport wrote the
        // whole request, so resending is the retry policy's decision (an
        // attempt), never the transport's.
        let server = RawServer::start(|n, mut conn| async move {
            if n == 0 {
                if conn.read_request().await {
                    conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                }
                conn.read_request().await;
                return;
            }
            while conn.read_request().await {
                conn.send(b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        })
        .await;
        let tenant = server.tenant(None);
        let sink = sink_with(transport);
        assert_eq!(
            deliver_raw(&sink, &tenant).await,
            DeliveryResult::delivered(Some(200))
        );
        let result = deliver_raw(&sink, &tenant).await;
        assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
        assert_eq!(result.http_status, None);
        assert_eq!(server.requests(), 2, "sent exactly once");
        assert_eq!(server.accepted(), 1, "no second connection for it");
        // The retry policy's next attempt goes out on a fresh connection.
        assert_eq!(
            deliver_raw(&sink, &tenant).await,
            DeliveryResult::delivered(Some(201))
        );
        assert_eq!(server.accepted(), 2);
        assert_eq!(server.requests(), 3);
    }
}

#[tokio::test]
async fn a_request_whose_write_failed_on_a_reused_connection_goes_once_more() {
    // The server resets an idle connection (SO_LINGER 0) without the
    // client noticing at checkout: the write of the next request fails, so
    // no byte of it can have been processed, and Belfry's client sends it
    // once more on a fresh connection. (Whether the reset arrives before
    // the write ends is up to the kernel; either way the request reaches
    // the receiver at most once, and the delivery is not lost to it.)
    let server = RawServer::start(|n, mut conn| async move {
        if n == 0 {
            if conn.read_request().await {
                conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
            // A zero linger resets at once (nothing to block on).
            #[allow(deprecated)]
            let _ = conn.stream.set_linger(Some(Duration::ZERO));
            return;
        }
        while conn.read_request().await {
            conn.send(b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    })
    .await;
    let tenant = server.tenant(None);
    let sink = sink();
    assert_eq!(
        deliver_raw(&sink, &tenant).await,
        DeliveryResult::delivered(Some(200))
    );
    let result = deliver_raw(&sink, &tenant).await;
    assert!(server.requests() <= 2, "never received twice");
    if result.verdict == Verdict::Delivered {
        assert_eq!(result.http_status, Some(201));
        assert_eq!(server.requests(), 2);
    }
}

#[tokio::test]
async fn a_request_the_server_drops_on_a_fresh_connection_is_not_sent_again() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let server = RawServer::start(|_, mut conn| async move {
            conn.read_request().await;
        })
        .await;
        let tenant = server.tenant(None);
        let result = deliver_raw(&sink_with(transport), &tenant).await;
        assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
        assert_eq!(result.http_status, None);
        let message = result.error.unwrap();
        assert!(
            message.starts_with("request failed: ") || message == "connection reset",
            "{message}"
        );
        assert_eq!(server.accepted(), 1);
        assert_eq!(server.requests(), 1);
    }
}

#[tokio::test]
async fn a_success_body_beyond_the_drain_limit_is_delivered_on_a_closed_connection() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        // 60 KiB is drained and the connection reused; 100 KB, sent with a
        // length or in chunks, is abandoned and the connection closed.
        let small = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{}",
            60 * 1024,
            "s".repeat(60 * 1024)
        );
        let large = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n{}",
            "l".repeat(100_000)
        );
        let chunk = "c".repeat(40_000);
        let chunked = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
             9c40\r\n{chunk}\r\n9c40\r\n{chunk}\r\n9c40\r\n{chunk}\r\n0\r\n\r\n"
        );
        for (response, connections) in [(small, 1), (large, 2), (chunked, 2)] {
            let response: &'static [u8] = Box::leak(response.into_bytes().into_boxed_slice());
            let server = RawServer::always(response).await;
            let tenant = server.tenant(None);
            let sink = sink_with(transport);
            for _ in 0..2 {
                assert_eq!(
                    deliver_raw(&sink, &tenant).await,
                    DeliveryResult::delivered(Some(200))
                );
            }
            // How a too-long body ends its connection is Belfry's client's
            // own rule; hyper may have buffered the rest already.
            if transport == PlainHttp::Auto {
                assert_eq!(server.accepted(), connections, "{}", response.len());
            }
        }
    }
}

#[tokio::test]
async fn malformed_responses_are_retried() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let huge_head = format!(
            "HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n",
            "a".repeat(70 * 1024)
        );
        let huge_head: &'static [u8] = Box::leak(huge_head.into_bytes().into_boxed_slice());
        for (response, reason) in [
            (b"garbage\r\n\r\n".as_slice(), "invalid response: "),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx",
                "invalid response: conflicting content-length headers",
            ),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
                "invalid response: unexpected 101 Switching Protocols",
            ),
            (
                huge_head,
                "invalid response: response head larger than 64 KiB",
            ),
        ] {
            if transport == PlainHttp::Reqwest && response.len() > 64 * 1024 {
                // hyper's head limit is larger (and its own).
                continue;
            }
            let server = RawServer::always(response).await;
            let tenant = server.tenant(None);
            let sink = sink_with(transport);
            let result = deliver_raw(&sink, &tenant).await;
            assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
            let message = result.error.unwrap();
            if transport == PlainHttp::Auto {
                // Belfry's client's own reasons; hyper words them its way
                // (and hands a 101 over as a status).
                assert_eq!(result.http_status, None);
                assert!(message.starts_with(reason), "{message}");
            }
            // The connection was closed, not reused.
            deliver_raw(&sink, &tenant).await;
            assert_eq!(server.accepted(), 2, "{message}");
        }
    }
}

#[tokio::test]
async fn informational_responses_before_the_final_one_are_skipped() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let server = RawServer::always(
            b"HTTP/1.1 100 Continue\r\n\r\n\
              HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n\
              HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        )
        .await;
        let tenant = server.tenant(None);
        let sink = sink_with(transport);
        for _ in 0..2 {
            assert_eq!(
                deliver_raw(&sink, &tenant).await,
                DeliveryResult::delivered(Some(200))
            );
        }
        assert_eq!(server.accepted(), 1);
    }
}

#[tokio::test]
async fn a_body_until_close_ends_the_connection() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let server = RawServer::start(|_, mut conn| async move {
            if conn.read_request().await {
                conn.send(b"HTTP/1.1 503 Service Unavailable\r\n\r\nbusy, come back")
                    .await;
            }
        })
        .await;
        let tenant = server.tenant(None);
        assert_eq!(
            deliver_raw(&sink_with(transport), &tenant).await,
            DeliveryResult::failed(Verdict::Retry, Some(503), "HTTP 503 Service Unavailable")
        );
    }
}

#[tokio::test]
async fn a_timeout_after_the_response_head_keeps_the_status() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        // The head and a part of the body arrive, then the server stalls.
        for (response, expected) in [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab".as_slice(),
                DeliveryResult::delivered(Some(200)),
            ),
            (
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 10\r\n\r\nab".as_slice(),
                DeliveryResult::failed(Verdict::Retry, Some(500), "HTTP 500 Internal Server Error"),
            ),
        ] {
            let server = RawServer::start(move |_, mut conn| async move {
                if conn.read_request().await {
                    conn.send(response).await;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            })
            .await;
            let tenant = server.tenant(Some(300));
            assert_eq!(deliver_raw(&sink_with(transport), &tenant).await, expected);
        }
    }
}

#[tokio::test]
async fn the_request_is_one_well_formed_http_1_1_request() {
    // What reaches the wire, byte for byte up to the varying values.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let server = RawServer::start({
        let seen = Arc::clone(&seen);
        move |_, mut conn| {
            let seen = Arc::clone(&seen);
            async move {
                let mut chunk = [0u8; 8192];
                if let Ok(n) = conn.stream.read(&mut chunk).await {
                    seen.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
                conn.send(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        }
    })
    .await;
    let tenant = tenant(
        format!(
            "http://localhost:{}/hooks/a%20b?x=1&y=%2F#frag",
            server.port
        ),
        None,
    );
    let event = event(&tenant, "order-42", DeliveryOption::PayloadOnly);
    let result = deliver_to(&sink(), &tenant, &event, 3).await;
    assert_eq!(result, DeliveryResult::delivered(Some(200)));
    let request = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    let expected = format!(
        "POST /hooks/a%20b?x=1&y=%2F HTTP/1.1\r\n\
         host: localhost:{}\r\n\
         user-agent: belfry/{}\r\n\
         accept: */*\r\n\
         content-type: application/json\r\n\
         authorization: Bearer s3cret\r\n\
         x-belfry-event-id: order-42\r\n\
         x-belfry-tenant: TenantB/ProgramB/EnvC\r\n\
         x-belfry-scheduled-at: 2030-01-31T04:00:30.25Z\r\n\
         x-belfry-attempt: 3\r\n\
         idempotency-key: 0190-version-1\r\n\
         content-length: 14\r\n\
         \r\n\
         {{\"orderId\":42}}",
        server.port,
        env!("CARGO_PKG_VERSION"),
    );
    assert_eq!(request, expected);
}

// ---- Signing (Standard Webhooks) ----

fn signed(mut tenant: TenantConfig, secrets: SigningSecrets) -> TenantConfig {
    tenant.signing = Some(secrets);
    tenant
}

/// The `v1,` signature of a received request under `secret`.
fn expected_signature(secret: &str, request: &belfry_testkit::RecordedRequest) -> String {
    let signer = Signer::new(&SigningSecrets::new(secret.to_string())).unwrap();
    signer.signature(
        request.header("webhook-id").unwrap(),
        request.header("webhook-timestamp").unwrap(),
        &request.body,
        Timestamp::from_millis(0),
    )
}

#[tokio::test]
async fn deliveries_are_signed_with_the_tenant_secret() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let secret = generate_secret();
        let tenant = signed(
            tenant(receiver.url("/signed"), None),
            SigningSecrets::new(secret.clone()),
        );
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
        let sink = sink_with(transport);
        for attempt in [1, 2] {
            assert_eq!(
                deliver_to(&sink, &tenant, &event, attempt).await.verdict,
                Verdict::Delivered
            );
        }
        let seen = receiver.wait_for_count(2, WAIT).await.unwrap();
        for request in &seen {
            // The id is the stable idempotency key, the same for a retry.
            assert_eq!(request.header("webhook-id"), Some("0190-version-1"));
            assert_eq!(
                request.header("webhook-timestamp"),
                Some(unix_seconds(triggered_at()).to_string().as_str())
            );
            let signature = request.header("webhook-signature").unwrap();
            assert_eq!(signature, expected_signature(&secret, request));
            assert!(!signature.contains(' '), "one secret, one signature");
        }
        // A tenant's own header cannot forge them.
        let mut forged = tenant.clone();
        if let SinkConfig::Http(target) = &mut forged.sink {
            target
                .headers
                .insert("Webhook-Signature".into(), "v1,forged".into());
        }
        deliver_to(&sink, &forged, &event, 3).await;
        let seen = receiver.wait_for_count(3, WAIT).await.unwrap();
        let values: Vec<&str> = seen[2]
            .headers
            .iter()
            .filter(|(name, _)| name == "webhook-signature")
            .map(|(_, value)| value.as_str())
            .collect();
        assert_eq!(values, [expected_signature(&secret, &seen[2])]);
    }
}

#[tokio::test]
async fn a_rotation_sends_both_signatures_until_the_old_secret_expires() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let (old, new) = (generate_secret(), generate_secret());
        let expires = triggered_at().plus(Duration::from_secs(60));
        let tenant = signed(
            tenant(receiver.url("/rotating"), None),
            SigningSecrets::new(old.clone()).rotated(new.clone(), expires),
        );
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
        let sink = sink_with(transport);
        deliver_to(&sink, &tenant, &event, 1).await;
        // The same config after the old secret expired.
        sink.deliver(Delivery {
            tenant: &tenant,
            event: &event,
            attempt: 2,
            triggered_at: expires,
            epoch: Some(1),
        })
        .await;
        let seen = receiver.wait_for_count(2, WAIT).await.unwrap();
        let during = seen[0].header("webhook-signature").unwrap();
        assert_eq!(
            during,
            format!(
                "{} {}",
                expected_signature(&new, &seen[0]),
                expected_signature(&old, &seen[0])
            )
        );
        let after = seen[1].header("webhook-signature").unwrap();
        assert_eq!(after, expected_signature(&new, &seen[1]));
    }
}

#[tokio::test]
async fn tenants_without_secrets_get_no_signing_headers() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        deliver_once(transport, &receiver, "/unsigned").await;
        let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            assert_eq!(seen[0].header(name), None, "{name}");
        }
    }
}

#[tokio::test]
async fn an_undecodable_stored_secret_is_a_permanent_failure() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let tenant = signed(
            tenant(receiver.url("/x"), None),
            SigningSecrets::new("not-a-secret".into()),
        );
        let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
        let result = deliver_to(&sink_with(transport), &tenant, &event, 1).await;
        assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
        assert_eq!(receiver.count(), 0);
    }
}

// ---- Egress policy ----

fn sink_with_egress(transport: PlainHttp, egress: EgressOptions) -> HttpSink {
    HttpSink::build(HttpSinkOptions::default(), egress, transport).unwrap()
}

fn public_only() -> EgressOptions {
    EgressOptions {
        policy: EgressMode::PublicOnly,
        ..EgressOptions::default()
    }
}

#[tokio::test]
async fn metadata_link_local_and_mapped_addresses_are_refused_before_connecting() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        for egress in [
            EgressOptions::internal(),
            EgressOptions::default(),
            public_only(),
        ] {
            let sink = sink_with_egress(transport, egress);
            for (url, address) in [
                (
                    "http://169.254.169.254/latest/meta-data/",
                    "169.254.169.254",
                ),
                ("http://[fe80::1]:8080/hook", "fe80::1"),
                ("http://[::ffff:169.254.169.254]/", "169.254.169.254"),
                ("http://[fd00:ec2::254]/", "fd00:ec2::254"),
                ("http://0.0.0.0:9/", "0.0.0.0"),
                ("http://224.0.0.1/", "224.0.0.1"),
                ("https://169.254.169.254/", "169.254.169.254"),
            ] {
                let tenant = tenant(url.to_string(), Some(2_000));
                let event = event(&tenant, "e", DeliveryOption::FullEvent);
                let result = deliver_to(&sink, &tenant, &event, 1).await;
                assert_eq!(result.verdict, Verdict::Permanent, "{url}: {result:?}");
                let message = result.error.unwrap();
                assert!(
                    message.starts_with(&format!("egress_blocked: {address} is ")),
                    "{url}: {message}"
                );
            }
        }
    }
}

#[tokio::test]
async fn loopback_follows_the_policy_by_address_and_by_name() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let port = receiver.base_url().rsplit(':').next().unwrap().to_string();
        // `localhost` goes through the resolver (a name, not a literal).
        let urls = [
            receiver.url("/by-address"),
            format!("http://localhost:{port}/by-name"),
        ];
        let internal = sink_with_egress(transport, EgressOptions::internal());
        let public = sink_with_egress(transport, public_only());
        let allowed = sink_with_egress(
            transport,
            EgressOptions {
                allow: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
                ..public_only()
            },
        );
        let denied = sink_with_egress(
            transport,
            EgressOptions {
                deny: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
                ..EgressOptions::internal()
            },
        );
        for url in &urls {
            let tenant = tenant(url.clone(), None);
            let event = event(&tenant, "e", DeliveryOption::FullEvent);
            let result = deliver_to(&internal, &tenant, &event, 1).await;
            assert_eq!(result.verdict, Verdict::Delivered, "{url}: {result:?}");
            let result = deliver_to(&allowed, &tenant, &event, 1).await;
            assert_eq!(result.verdict, Verdict::Delivered, "{url}: {result:?}");
            for refusing in [&public, &denied] {
                let result = deliver_to(refusing, &tenant, &event, 1).await;
                assert_eq!(result.verdict, Verdict::Permanent, "{url}: {result:?}");
                let message = result.error.unwrap();
                assert!(message.starts_with("egress_blocked: "), "{url}: {message}");
            }
        }
        // Only the allowed deliveries arrived.
        assert_eq!(receiver.count(), 4);
    }
}

#[tokio::test]
async fn auto_allows_loopback_only_while_the_node_runs_open() {
    for transport in TRANSPORTS {
        eprintln!("transport: {transport:?}");
        let receiver = Receiver::start().await;
        let policy = Arc::new(EgressPolicy::new(EgressOptions::default()));
        let sink = HttpSink::with_policy(
            HttpSinkOptions::default(),
            Arc::clone(&policy),
            transport,
            Vec::new(),
            Arc::new(belfry_clock::SystemClock),
        )
        .unwrap();
        let tenant = tenant(receiver.url("/hook"), None);
        let event = event(&tenant, "e", DeliveryOption::FullEvent);
        let refused = |result: DeliveryResult| {
            assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
            let message = result.error.unwrap();
            assert_eq!(
                message,
                "egress_blocked: 127.0.0.1 is loopback (egress.policy is auto)"
            );
        };
        refused(deliver_to(&sink, &tenant, &event, 1).await);
        policy.set_open(true);
        let result = deliver_to(&sink, &tenant, &event, 1).await;
        assert_eq!(result.verdict, Verdict::Delivered, "{result:?}");
        // Closed again: the connection kept alive from the delivery above
        // is not reused past the policy.
        policy.set_open(false);
        refused(deliver_to(&sink, &tenant, &event, 1).await);
        assert_eq!(receiver.count(), 1);
    }
}

// ---- HTTPS through a test CA (the reqwest transport over real TLS) ----

/// A request as the TLS receiver saw it: lowercase headers, body.
type SeenRequest = (Vec<(String, String)>, Vec<u8>);

/// An HTTPS receiver with a certificate for `localhost` and 127.0.0.1 from
/// a fresh test CA; records each request's headers and body, answers 204.
struct TlsReceiver {
    port: u16,
    ca: reqwest::Certificate,
    seen: Arc<std::sync::Mutex<Vec<SeenRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsReceiver {
    async fn start() -> TlsReceiver {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        // Installs the process's rustls provider.
        let _ = sink();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(leaf.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let acceptor = acceptor.clone();
                    let seen = Arc::clone(&seen);
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(stream).await else {
                            return;
                        };
                        let mut buffer = Vec::new();
                        loop {
                            let parsed = {
                                let mut headers = [httparse::EMPTY_HEADER; 64];
                                let mut request = httparse::Request::new(&mut headers);
                                match request.parse(&buffer) {
                                    Ok(httparse::Status::Complete(head)) => {
                                        let fields: Vec<(String, String)> = request
                                            .headers
                                            .iter()
                                            .map(|h| {
                                                (
                                                    h.name.to_ascii_lowercase(),
                                                    String::from_utf8_lossy(h.value).into_owned(),
                                                )
                                            })
                                            .collect();
                                        let length: usize = fields
                                            .iter()
                                            .find(|(n, _)| n == "content-length")
                                            .map_or(0, |(_, v)| v.parse().unwrap());
                                        (buffer.len() >= head + length).then(|| {
                                            let body = buffer[head..head + length].to_vec();
                                            (fields, body, head + length)
                                        })
                                    }
                                    _ => None,
                                }
                            };
                            if let Some((fields, body, used)) = parsed {
                                buffer.drain(..used);
                                seen.lock().unwrap().push((fields, body));
                                let answer = b"HTTP/1.1 204 No Content\r\n\r\n";
                                if tls.write_all(answer).await.is_err() {
                                    return;
                                }
                                continue;
                            }
                            let mut chunk = [0u8; 8192];
                            match tls.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                            }
                        }
                    });
                }
            }
        });
        TlsReceiver {
            port,
            ca: reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap(),
            seen,
            task,
        }
    }

    fn sink(&self, egress: EgressOptions) -> HttpSink {
        HttpSink::build_with_roots(
            HttpSinkOptions::default(),
            egress,
            PlainHttp::Auto,
            vec![self.ca.clone()],
        )
        .unwrap()
    }
}

#[tokio::test]
async fn https_through_a_test_ca_is_signed_and_egress_checked() {
    let receiver = TlsReceiver::start().await;
    let secret = generate_secret();
    let by_name = signed(
        tenant(
            format!("https://localhost:{}/hook", receiver.port),
            Some(5_000),
        ),
        SigningSecrets::new(secret.clone()),
    );
    let by_address = tenant(
        format!("https://127.0.0.1:{}/hook", receiver.port),
        Some(5_000),
    );
    let event = event(&by_name, "order-42", DeliveryOption::FullEvent);

    let internal = receiver.sink(EgressOptions::internal());
    for tenant in [&by_name, &by_address] {
        let result = deliver_to(&internal, tenant, &event, 1).await;
        assert_eq!(result, DeliveryResult::delivered(Some(204)), "{tenant:?}");
    }
    let seen = receiver.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let (headers, body) = &seen[0];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(header("webhook-id"), "0190-version-1");
    let expected = Signer::new(&SigningSecrets::new(secret))
        .unwrap()
        .signature(
            &header("webhook-id"),
            &header("webhook-timestamp"),
            body,
            Timestamp::from_millis(0),
        );
    assert_eq!(header("webhook-signature"), expected);
    assert_eq!(header("authorization"), "Bearer s3cret");

    // The policy holds over TLS too: by name (the resolver) and by address.
    let public = receiver.sink(public_only());
    for tenant in [&by_name, &by_address] {
        let result = deliver_to(&public, tenant, &event, 1).await;
        assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
        assert!(
            result
                .error
                .as_deref()
                .unwrap()
                .starts_with("egress_blocked: "),
            "{result:?}"
        );
    }
    assert_eq!(receiver.seen.lock().unwrap().len(), 2);
}
