//! The HTTP listener: accepts connections, caps how many are open, times
//! out slow clients, and (with `tls`) terminates TLS before HTTP.
//!
//! # Contract
//! - At most [`ServerOptions::max_connections`] connections are open. The
//!   next one is not accepted until one closes: it waits in the kernel's
//!   accept queue (its client sees a slow answer, not an error), so a burst
//!   of connections slows clients down instead of failing them, and a flood
//!   cannot exhaust the node's file descriptors.
//! - A connection that has not sent a request's complete headers within
//!   `header_read_timeout` is closed without an answer. This also bounds a
//!   TLS handshake and an idle keep-alive connection (hyper starts the clock
//!   again when it waits for the next request).
//! - A request whose body has not arrived completely within
//!   `body_read_timeout` (counted from its headers) is answered
//!   `408 request_timeout` and its connection closed.
//! - A request whose answer is not ready within `request_timeout` (counted
//!   from its headers) is answered `408 request_timeout` and its connection
//!   closed; its handler is dropped, so a change it asked for may or may not
//!   have been made (the message says so).
//! - A connection whose writes make no progress for `write_timeout` (a
//!   client that stopped reading its answer) is closed, freeing the answer.
//! - On shutdown the listener stops accepting, asks every open connection
//!   to close after its current request, and returns when all have.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use belfry_core::time::{Clock, MonoTime, Sleep};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Timeouts and the connection cap of the API listener (`[server]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerOptions {
    /// Time a client has to send a request's complete headers (and, with
    /// TLS, to finish its handshake); also how long an idle keep-alive
    /// connection stays open. Slower: the connection is closed without an
    /// answer. Default 10 s.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "header_read_timeout_ms"
    )]
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's complete body, counted from
    /// its headers. Slower: `408 request_timeout`, connection closed.
    /// Default 30 s.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "body_read_timeout_ms"
    )]
    pub body_read_timeout: Duration,
    /// Time from a request's headers to its answer. Slower: `408
    /// request_timeout`, connection closed (a change it asked for may or
    /// may not have been made). Default 60 s.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "request_timeout_ms"
    )]
    pub request_timeout: Duration,
    /// Most connections open at once; further ones wait in the accept
    /// queue until one closes. Default 10,000.
    pub max_connections: usize,
    /// How long a write to a client may make no progress (a client that
    /// stops reading its answer); then the connection is closed and the
    /// answer's memory freed. Default 30 s.
    #[serde(with = "belfry_core::time::serde_millis", rename = "write_timeout_ms")]
    pub write_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Turns an accepted TCP connection into the stream HTTP is spoken on
/// (plain, or TLS after its handshake).
pub trait Handshake: Clone + Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    fn handshake(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

/// Plain HTTP: the TCP stream itself.
#[derive(Debug, Clone, Copy)]
pub struct Plain;

impl Handshake for Plain {
    type Stream = tokio::net::TcpStream;

    async fn handshake(&self, tcp: tokio::net::TcpStream) -> std::io::Result<Self::Stream> {
        Ok(tcp)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the
/// open connections to finish their current request and close.
///
/// # Errors
/// None today: accept errors (a client that reset, too many open files)
/// are logged and accepting goes on after a pause.
pub async fn serve<H: Handshake>(
    listener: TcpListener,
    app: Router,
    options: &ServerOptions,
    handshake: H,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let connections = Arc::new(Semaphore::new(options.max_connections));
    let limits = Arc::new(RequestLimits {
        body_read_timeout: options.body_read_timeout,
        request_timeout: options.request_timeout,
        clock: clock.clone(),
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    let header_read_timeout = options.header_read_timeout;
    let write_timeout = options.write_timeout;
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        // A permit first: past the cap, connections wait in the kernel's
        // accept queue rather than being accepted and dropped.
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed.
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (tcp, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    accept_error(error, &*clock).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let http = http.clone();
        let app = app.clone();
        let limits = limits.clone();
        let handshake = handshake.clone();
        let clock = clock.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let stream =
                match tokio::time::timeout(header_read_timeout, handshake.handshake(tcp)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("handshake timed out");
                        return;
                    }
                };
            let service = hyper::service::service_fn(move |request| {
                handle(app.clone(), limits.clone(), request)
            });
            let stream = WriteDeadline::new(stream, write_timeout, clock);
            let connection = http.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                // Timeouts and clients that went away: routine.
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Accept errors are per connection (the client reset before we took it)
/// or resource exhaustion (EMFILE): pause briefly so the latter does not
/// spin, as axum's own loop does.
async fn accept_error(error: std::io::Error, clock: &dyn Clock) {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::error!(%error, "cannot accept a connection");
    clock.sleep(Duration::from_millis(100)).await;
}

#[derive(Debug)]
struct RequestLimits {
    body_read_timeout: Duration,
    request_timeout: Duration,
    clock: Arc<dyn Clock>,
}

/// One request through `app`, under the body and whole-request deadlines.
async fn handle(
    app: Router,
    limits: Arc<RequestLimits>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let clock = &limits.clock;
    let started = clock.monotonic();
    let v1 = request.uri().path().starts_with("/v1");
    let body_timed_out = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline: started.plus(limits.body_read_timeout),
            clock: clock.clone(),
            sleep: None,
            timed_out: body_timed_out.clone(),
        })
    });
    let deadline = clock.sleep_until(started.plus(limits.request_timeout));
    let answer = async {
        tokio::select! {
            biased;
            answer = app.oneshot(request) => Ok(answer),
            () = deadline => Err(()),
        }
    };
    Ok(match answer.await {
        Ok(Ok(response)) if body_timed_out.load(Ordering::Relaxed) => {
            drop(response);
            timeout_response(
                v1,
                format!(
                    "the request body did not arrive within {} ms",
                    limits.body_read_timeout.as_millis()
                ),
            )
        }
        Ok(Ok(response)) => response,
        Ok(Err(never)) => match never {},
        Err(()) => timeout_response(
            v1,
            format!(
                "the request was not answered within {} ms; a change it asked for may or may \
                 not have been made",
                limits.request_timeout.as_millis()
            ),
        ),
    })
}

/// Stable code of the `408` answers.
pub const REQUEST_TIMEOUT_CODE: &str = "request_timeout";

/// `408`, in the envelope of the route's API (`/v1`'s `{"error": {"code",
/// "message"}}`, BigBen's `{"message"}`), closing the connection: what is
/// left of the request on it cannot be told from a next request.
fn timeout_response(v1: bool, message: String) -> Response<Body> {
    let body = if v1 {
        serde_json::json!({"error": {"code": REQUEST_TIMEOUT_CODE, "message": message}})
    } else {
        serde_json::json!({ "message": message })
    };
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body that fails once its deadline passes before its end.
struct DeadlineBody {
    inner: Incoming,
    deadline: MonoTime,
    clock: Arc<dyn Clock>,
    /// Armed on the first wait for data (most bodies arrive with their
    /// headers and never need it).
    sleep: Option<Sleep>,
    timed_out: Arc<AtomicBool>,
}

/// What [`DeadlineBody`] yields past its deadline.
#[derive(Debug)]
struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimeout {}

impl hyper::body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let (deadline, clock) = (this.deadline, &this.clock);
        let sleep = this
            .sleep
            .get_or_insert_with(|| clock.sleep_until(deadline));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.timed_out.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(Box::new(BodyTimeout))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A stream whose writes fail with `TimedOut` once they have made no
/// progress for `timeout`: the clock starts when a write (or flush) first
/// waits and stops at the next byte written.
struct WriteDeadline<S> {
    inner: S,
    timeout: Duration,
    clock: Arc<dyn Clock>,
    /// Armed while writes wait.
    stalled: Option<Sleep>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, timeout: Duration, clock: Arc<dyn Clock>) -> Self {
        WriteDeadline {
            inner,
            timeout,
            clock,
            stalled: None,
        }
    }

    /// After a write or flush: progress disarms the clock; a wait arms it
    /// (once) and fails when it has run out.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match result {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let (timeout, clock) = (self.timeout, &self.clock);
                let stalled = self.stalled.get_or_insert_with(|| clock.sleep(timeout));
                match stalled.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client read nothing for the write timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, result)
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "real sockets on the system clock: these tests time real timeouts"
)]
mod tests {
    //! Real sockets against [`serve`] with a small router.

    use std::net::SocketAddr;
    use std::time::Instant;

    use belfry_clock::SystemClock;

    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// Generous: the machine is shared; the tests check that a timeout
    /// happens, and not long after it is due.
    const MARGIN: Duration = Duration::from_millis(1_500);

    fn app() -> Router {
        Router::new()
            .route("/ping", get(|| async { "pong" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "late"
                }),
            )
            .route("/echo", post(|body: axum::body::Bytes| async move { body }))
            .route(
                "/v1/echo",
                post(|body: axum::body::Bytes| async move { body }),
            )
    }

    struct Server {
        address: SocketAddr,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    async fn start(options: ServerOptions) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            serve(
                listener,
                app(),
                &options,
                Plain,
                Arc::new(SystemClock),
                async {
                    let _ = stopped.await;
                },
            )
            .await
        });
        Server {
            address,
            stop: Some(stop),
            task,
        }
    }

    fn options() -> ServerOptions {
        ServerOptions {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_connections: 100,
            write_timeout: Duration::from_secs(10),
        }
    }

    /// Sends `request` on a fresh connection, returns everything read
    /// until the server closes.
    async fn exchange(address: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(request).await.unwrap();
        read_to_close(&mut stream).await
    }

    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    const PING: &[u8] = b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_sent_headers_are_closed_in_time_while_others_are_served() {
        let server = start(ServerOptions {
            header_read_timeout: Duration::from_millis(500),
            ..options()
        })
        .await;
        let mut stuck = TcpStream::connect(server.address).await.unwrap();
        stuck
            .write_all(b"POST /events/schedule HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let closed = tokio::spawn(async move {
            let answer = read_to_close(&mut stuck).await;
            (started.elapsed(), answer)
        });
        let mut served = 0;
        while !closed.is_finished() {
            let answer = exchange(server.address, PING).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            served += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (elapsed, answer) = closed.await.unwrap();
        assert!(served > 0);
        assert!(
            elapsed >= Duration::from_millis(450),
            "closed after {elapsed:?}"
        );
        assert!(
            elapsed <= Duration::from_millis(500) + MARGIN,
            "closed after {elapsed:?}"
        );
        // Closed without an answer, or with hyper's bare 408.
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
        let server = start(ServerOptions {
            header_read_timeout: Duration::from_millis(400),
            ..options()
        })
        .await;
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        stream
            .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let answer = read_to_close(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(started.elapsed() <= Duration::from_millis(400) + MARGIN);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_body_is_answered_408_in_time_and_the_connection_closed() {
        let server = start(ServerOptions {
            body_read_timeout: Duration::from_millis(500),
            ..options()
        })
        .await;
        for (path, expected) in [
            (
                "/v1/echo",
                r#"{"error":{"code":"request_timeout","message":"the request body did not arrive within 500 ms"}}"#,
            ),
            (
                "/echo",
                r#"{"message":"the request body did not arrive within 500 ms"}"#,
            ),
        ] {
            let mut stream = TcpStream::connect(server.address).await.unwrap();
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{\"a\":"
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let started = Instant::now();
            let answer = read_to_close(&mut stream).await;
            let elapsed = started.elapsed();
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
            assert!(answer.contains("connection: close"), "{answer}");
            assert!(answer.ends_with(expected), "{answer}");
            assert!(elapsed >= Duration::from_millis(450), "{elapsed:?}");
            assert!(
                elapsed <= Duration::from_millis(500) + MARGIN,
                "{elapsed:?}"
            );
        }
        // A body that arrives in time is served.
        let answer = exchange(
            server.address,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_answer_is_408_after_the_request_timeout() {
        let server = start(ServerOptions {
            request_timeout: Duration::from_millis(500),
            ..options()
        })
        .await;
        let started = Instant::now();
        let answer = exchange(server.address, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let elapsed = started.elapsed();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("may or may not have been made"), "{answer}");
        assert!(elapsed >= Duration::from_millis(450), "{elapsed:?}");
        assert!(
            elapsed <= Duration::from_millis(500) + MARGIN,
            "{elapsed:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_past_the_cap_wait_until_one_closes() {
        let server = start(ServerOptions {
            max_connections: 2,
            ..options()
        })
        .await;
        // Two open connections, each proven accepted by an answer.
        let mut open = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(server.address).await.unwrap();
            stream
                .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buffer = [0_u8; 512];
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(buffer[..n].starts_with(b"HTTP/1.1 200"));
            open.push(stream);
        }
        let third = tokio::spawn(exchange(server.address, PING));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!third.is_finished(), "a third connection was served");
        drop(open.pop());
        let answer = tokio::time::timeout(Duration::from_secs(10), third)
            .await
            .expect("served once a connection closed")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_closes_idle_connections_and_returns() {
        let mut server = start(options()).await;
        let mut idle = TcpStream::connect(server.address).await.unwrap();
        idle.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buffer = [0_u8; 512];
        let n = idle.read(&mut buffer).await.unwrap();
        assert!(buffer[..n].starts_with(b"HTTP/1.1 200"));
        let _ = server.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut server.task)
            .await
            .expect("serve returns")
            .unwrap()
            .unwrap();
        assert_eq!(read_to_close(&mut idle).await, "");
        assert!(TcpStream::connect(server.address).await.is_err());
    }
}
