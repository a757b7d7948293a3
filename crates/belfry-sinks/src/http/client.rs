//! Belfry's own HTTP/1.1 client for plain `http://` webhooks.
//!
//! A delivery is one `POST` whose request the sink has already rendered
//! into one buffer, so the client only has to: take an idle keep-alive
//! connection to the target's authority (or connect), write the buffer with
//! one `write_all`, read and parse the response head ([`httparse`]), drain a
//! bounded amount of the body and put the connection back. Everything runs
//! in the delivering task: no connection task, no channel, no per-request
//! header map. (reqwest, still used for `https://`, showed up as the
//! largest CPU consumer per delivery after the kernel.)
//!
//! Limits: a response head above [`MAX_HEAD`] is invalid; at most
//! [`DRAIN_LIMIT`] bytes of a body are read (the connection is closed
//! instead of draining more); at most [`ERROR_BODY_LIMIT`] bytes of a
//! non-2xx body are kept for the message. A connection goes back to the
//! pool only after a complete response that allows keep-alive.

use std::io::{self, Write as _};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::Clock;
use belfry_core::policy::RetryAfter;
use percent_encoding::percent_decode_str;
use reqwest::header::{ACCEPT, AUTHORIZATION, HOST, HeaderMap, USER_AGENT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::pool::{Pool, Reusable};
use super::transport::{
    DRAIN_LIMIT, ERROR_BODY_LIMIT, OWN_HEADERS, Outgoing, Response, Transport, TransportError,
};
use crate::egress::{EgressPolicy, EgressRefusal};

/// The largest response head accepted (status line and headers, all
/// informational heads before it included).
pub const MAX_HEAD: usize = 64 * 1024;
/// Headers per response head.
const MAX_HEADERS: usize = 100;
/// A chunk-size line or a trailer line.
const MAX_LINE: usize = 4 * 1024;
/// A connection's read buffer starts at this size and grows (up to
/// [`MAX_HEAD`]) only for a large head; it shrinks back before the
/// connection is pooled.
const INITIAL_BUFFER: usize = 4 * 1024;

/// Where a plain-http target is, parsed once per tenant target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port` to resolve and connect to; also the pool key.
    pub authority: Arc<str>,
    /// The `Host` header: `host`, or `host:port` for a non-default port.
    pub host: String,
    /// The request-target: path and query (`/` when empty), no fragment.
    pub target: String,
}

impl Endpoint {
    /// The endpoint of an `http://` URL.
    ///
    /// # Errors
    /// Not `http`, no host, or a host or path that would not fit in a
    /// request head as is.
    pub fn from_url(url: &reqwest::Url) -> Result<Self, String> {
        if url.scheme() != "http" {
            return Err(format!("tenant url scheme {:?} is not http", url.scheme()));
        }
        // IPv6 hosts come bracketed, as both a Host header and a
        // `lookup_host` authority need them.
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| "tenant url has no host".to_string())?;
        // `port()` is `None` for the scheme's default.
        let port = url.port().unwrap_or(80);
        let mut target = url.path().to_string();
        if target.is_empty() {
            target.push('/');
        }
        if let Some(query) = url.query() {
            target.push('?');
            target.push_str(query);
        }
        // The URL parser percent-encodes everything else; checked anyway,
        // since these bytes go into the request head verbatim.
        let visible = |text: &str| text.bytes().all(|b| b.is_ascii_graphic());
        if !visible(host) || !visible(&target) {
            return Err("tenant url has characters not allowed in a request".to_string());
        }
        Ok(Endpoint {
            authority: Arc::from(format!("{host}:{port}")),
            host: match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_string(),
            },
            target,
        })
    }
}

/// The plain-http client: a keep-alive pool, the connect timeout and the
/// egress policy every resolved address must pass.
#[derive(Debug)]
pub struct Client {
    pool: Pool<Conn>,
    connect_timeout: Duration,
    egress: Arc<EgressPolicy>,
}

/// What an attempt learnt before its timeout could cut it off.
#[derive(Debug, Default)]
struct Partial {
    status: Option<u16>,
    retry_after: Option<RetryAfter>,
    body: Vec<u8>,
}

/// How one request on one connection failed.
enum Failure {
    /// Writing the request failed before all of it was written, in a way a
    /// server's close of an idle connection looks like: the receiver cannot
    /// have acted on it, so it may go once more on a fresh connection.
    Stale(io::Error),
    Other(TransportError),
}

impl From<TransportError> for Failure {
    fn from(error: TransportError) -> Self {
        Failure::Other(error)
    }
}

impl Client {
    pub fn new(
        connect_timeout: Duration,
        max_idle_per_host: usize,
        idle_timeout: Duration,
        egress: Arc<EgressPolicy>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Client {
            pool: Pool::new(max_idle_per_host, idle_timeout, clock),
            connect_timeout,
            egress,
        }
    }

    /// Sends `request` (a complete HTTP/1.1 request: head and body) to
    /// `endpoint` and reads the response, all within `timeout`.
    ///
    /// A timeout after the response head arrived still returns the
    /// response (with what arrived of the body): the receiver has answered.
    ///
    /// # Errors
    /// No response: see [`TransportError`].
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let mut partial = Partial::default();
        match tokio::time::timeout(timeout, self.attempt(endpoint, request, &mut partial)).await {
            Ok(result) => result,
            Err(_elapsed) => match partial.status {
                Some(status) => Ok(Response {
                    status,
                    body: partial.body,
                    retry_after: partial.retry_after,
                }),
                None => Err(TransportError::Timeout),
            },
        }
    }

    async fn attempt(
        &self,
        endpoint: &Endpoint,
        request: &[u8],
        partial: &mut Partial,
    ) -> Result<Response, TransportError> {
        // A kept-alive connection is checked again: the policy can change
        // (the node's open switch) while it sits in the pool.
        let pooled = self.pool.checkout(&endpoint.authority).filter(|conn| {
            conn.stream
                .peer_addr()
                .is_ok_and(|peer| self.egress.check(peer.ip()).is_ok())
        });
        if let Some(conn) = pooled {
            match self.exchange(endpoint, conn, request, partial).await {
                Ok(response) => return Ok(response),
                Err(Failure::Other(error)) => return Err(error),
                // The server closed the idle connection before the request
                // was written whole (a race with the checkout's check): it
                // cannot have processed it, so send it once more on a fresh
                // connection, as hyper does. Once the whole request is
                // written, a failure is the retry policy's to judge.
                Err(Failure::Stale(_)) => {}
            }
        }
        let conn = self.connect(endpoint).await?;
        // Never resent from a fresh connection.
        match self.exchange(endpoint, conn, request, partial).await {
            Ok(response) => Ok(response),
            Err(Failure::Stale(error)) => Err(TransportError::Io(error)),
            Err(Failure::Other(error)) => Err(error),
        }
    }

    async fn connect(&self, endpoint: &Endpoint) -> Result<Conn, TransportError> {
        let connecting = connect_allowed(&endpoint.authority, &self.egress);
        match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(stream)) => {
                // Latency over packet count; a failure only costs latency.
                let _ = stream.set_nodelay(true);
                Ok(Conn::new(stream))
            }
            Ok(Err(error)) => Err(error),
            Err(_elapsed) => Err(TransportError::ConnectTimeout),
        }
    }

    /// One request on `conn`; the connection goes back to the pool when the
    /// response allows it.
    async fn exchange(
        &self,
        endpoint: &Endpoint,
        mut conn: Conn,
        request: &[u8],
        partial: &mut Partial,
    ) -> Result<Response, Failure> {
        if let Err(error) = conn.stream.write_all(request).await {
            return Err(stale_or_io(error));
        }
        let reusable = conn.read_response(partial).await?;
        let response = Response {
            status: partial.status.unwrap_or_default(),
            body: std::mem::take(&mut partial.body),
            retry_after: partial.retry_after,
        };
        if reusable {
            conn.shrink_buffer();
            self.pool.put(&endpoint.authority, conn);
        }
        Ok(response)
    }
}

/// A plain-http target, prepared once per tenant config: where to connect,
/// and the request head up to Belfry's per-delivery headers.
#[derive(Debug)]
pub struct PlainTarget {
    pub endpoint: Endpoint,
    /// The request head up to the per-delivery headers (`request_head`).
    pub head: Vec<u8>,
}

/// Belfry's client as the plain-http [`Transport`].
pub type PlainTransport = Client;

impl Transport for Client {
    type Target = PlainTarget;

    fn prepare(
        &self,
        url: &reqwest::Url,
        headers: &HeaderMap,
        user_agent: &str,
    ) -> Result<PlainTarget, String> {
        let endpoint = Endpoint::from_url(url)?;
        let head = request_head(&endpoint, url, headers, user_agent);
        Ok(PlainTarget { endpoint, head })
    }

    async fn send(
        &self,
        target: &PlainTarget,
        request: Outgoing<'_>,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let bytes = plain_request(&target.head, request);
        Client::send(self, &target.endpoint, &bytes, timeout).await
    }
}

/// One plain-http request: the prepared `head`, the delivery's headers,
/// `content-length` and the body, in one buffer (one `write_all`).
pub(crate) fn plain_request(head: &[u8], request: Outgoing<'_>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(head.len() + 400 + request.body.len());
    bytes.extend_from_slice(head);
    for (name, value) in request.headers {
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    // Writing to a Vec cannot fail.
    let _ = write!(bytes, "content-length: {}\r\n\r\n", request.body.len());
    bytes.extend_from_slice(request.body);
    bytes
}

/// The static part of a plain-http request, everything before Belfry's
/// per-delivery headers: the request line, `host`, `user-agent`, `accept`,
/// `authorization` from the URL's user info (as reqwest does; a tenant's
/// header of the same name wins over these four, again as with reqwest),
/// `content-type`, and the tenant's headers except [`OWN_HEADERS`]. Names
/// are lowercase (as [`reqwest::header::HeaderName`] keeps them); values
/// were validated, so none can break the head.
pub(crate) fn request_head(
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
    use base64::Engine as _;
    let username = percent_decode_str(url.username()).decode_utf8().ok()?;
    let password = match url.password() {
        Some(password) => Some(percent_decode_str(password).decode_utf8().ok()?),
        None => None,
    };
    if username.is_empty() && password.is_none() {
        return None;
    }
    let credentials = format!("{username}:{}", password.unwrap_or_default());
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(credentials.as_bytes())
    ))
}

/// Resolves `authority` and connects to the first address the egress
/// policy allows that accepts. The policy sees the very addresses connected
/// to, so a name that resolves to a forbidden address is refused like the
/// address itself.
async fn connect_allowed(
    authority: &str,
    egress: &EgressPolicy,
) -> Result<TcpStream, TransportError> {
    let addresses = tokio::net::lookup_host(authority)
        .await
        .map_err(TransportError::Connect)?;
    let (allowed, refusal) = allowed_addresses(addresses, egress);
    let mut last_error = None;
    for address in allowed {
        match TcpStream::connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last_error = Some(error),
        }
    }
    Err(match (last_error, refusal) {
        (Some(error), _) => TransportError::Connect(error),
        (None, Some(refusal)) => TransportError::Egress(refusal),
        (None, None) => TransportError::Connect(io::Error::new(
            io::ErrorKind::NotFound,
            "host resolved to no address",
        )),
    })
}

/// The addresses `egress` allows, in resolver order, and the first refusal
/// (for the error when none is allowed).
pub(crate) fn allowed_addresses(
    addresses: impl IntoIterator<Item = SocketAddr>,
    egress: &EgressPolicy,
) -> (Vec<SocketAddr>, Option<EgressRefusal>) {
    let mut refusal = None;
    let allowed = addresses
        .into_iter()
        .filter(|address| match egress.check(address.ip()) {
            Ok(()) => true,
            Err(refused) => {
                refusal.get_or_insert(refused);
                false
            }
        })
        .collect();
    (allowed, refusal)
}

/// A failed write of the request as a [`Failure`]: [`Failure::Stale`] for
/// the kinds a closed connection gives (only ever for a write that did not
/// complete: see [`Client::attempt`]).
fn stale_or_io(error: io::Error) -> Failure {
    match error.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Failure::Stale(error),
        _ => Failure::Other(TransportError::Io(error)),
    }
}

fn invalid(reason: impl Into<String>) -> Failure {
    Failure::Other(TransportError::InvalidResponse(reason.into()))
}

/// One open connection and its read buffer: `buffer[start..end]` has been
/// received and not consumed yet.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    buffer: Vec<u8>,
    start: usize,
    end: usize,
}

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// What the client needs of a response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    status: u16,
    /// Its `Retry-After`, when it has one that parses.
    retry_after: Option<RetryAfter>,
    framing: Framing,
    /// The server allows another request on this connection (after this
    /// response's body has been read completely).
    keep_alive: bool,
}

/// The body ended early or its framing was broken: the response stands,
/// the connection is not reused.
struct Incomplete;

/// Where body bytes go: counted against [`DRAIN_LIMIT`], the first `keep`
/// kept.
struct Budget<'a> {
    kept: &'a mut Vec<u8>,
    keep: usize,
    drained: usize,
}

impl Budget<'_> {
    /// Takes `bytes`; `false` once more than [`DRAIN_LIMIT`] bytes went by.
    fn take(&mut self, bytes: &[u8]) -> bool {
        let room = self.keep.saturating_sub(self.kept.len());
        if room > 0 {
            self.kept
                .extend_from_slice(bytes.get(..room).unwrap_or(bytes));
        }
        self.drained = self.drained.saturating_add(bytes.len());
        self.drained <= DRAIN_LIMIT
    }
}

impl Reusable for Conn {
    fn is_reusable(&self) -> bool {
        Conn::is_reusable(self)
    }
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Conn {
            stream,
            buffer: vec![0; INITIAL_BUFFER],
            start: 0,
            end: 0,
        }
    }

    /// Whether an idle connection can carry a request: the server has
    /// neither closed it nor sent anything unasked. Costs no syscall when
    /// the socket has not become readable since the last read.
    pub(crate) fn is_reusable(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(
            self.stream.try_read(&mut probe),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock
        )
    }

    fn pending(&self) -> &[u8] {
        self.buffer.get(self.start..self.end).unwrap_or_default()
    }

    fn consume(&mut self, count: usize) {
        self.start = self.start.saturating_add(count).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads more into the buffer (`Ok(0)` at EOF). Makes room by moving
    /// the pending bytes to the front, then by growing up to [`MAX_HEAD`];
    /// callers keep what they leave pending below that.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.end == self.buffer.len() && self.start > 0 {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buffer.len() {
            let grown = (self.buffer.len() * 2).clamp(INITIAL_BUFFER, MAX_HEAD);
            if grown <= self.buffer.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "response read buffer full",
                ));
            }
            self.buffer.resize(grown, 0);
        }
        let read = self.stream.read(&mut self.buffer[self.end..]).await?;
        self.end += read;
        Ok(read)
    }

    /// [`Self::fill`] for a body: EOF or an error ends the body.
    async fn more(&mut self) -> Result<(), Incomplete> {
        match self.fill().await {
            Ok(0) | Err(_) => Err(Incomplete),
            Ok(_) => Ok(()),
        }
    }

    /// Back to the initial buffer size after a large head, so an idle
    /// connection holds little memory.
    fn shrink_buffer(&mut self) {
        if self.buffer.len() > INITIAL_BUFFER && self.start == self.end {
            self.buffer = vec![0; INITIAL_BUFFER];
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads one response into `partial` (status as soon as the head is
    /// parsed, kept body bytes as they arrive). `Ok(true)`: the connection
    /// can carry another request.
    async fn read_response(&mut self, partial: &mut Partial) -> Result<bool, Failure> {
        let head = self.read_head().await?;
        partial.status = Some(head.status);
        partial.retry_after = head.retry_after;
        let keep = if (200..300).contains(&head.status) {
            0
        } else {
            ERROR_BODY_LIMIT
        };
        let mut budget = Budget {
            kept: &mut partial.body,
            keep,
            drained: 0,
        };
        let complete = self.read_body(head.framing, &mut budget).await.is_ok();
        // Bytes after the response were not asked for: do not reuse.
        Ok(complete && head.keep_alive && self.start == self.end)
    }

    /// The final response head, after any informational (`1xx`) ones.
    ///
    /// The request was written whole by now: a connection closed before
    /// any response byte is an error, never a reason to resend.
    async fn read_head(&mut self) -> Result<Head, Failure> {
        let mut head_bytes = 0usize;
        loop {
            match parse_head(self.pending()) {
                Err(reason) => return Err(invalid(reason)),
                Ok(Some((length, head))) => {
                    self.consume(length);
                    head_bytes = head_bytes.saturating_add(length);
                    match head.status {
                        101 => return Err(invalid("unexpected 101 Switching Protocols")),
                        100..=199 if head_bytes < MAX_HEAD => {}
                        100..=199 => return Err(invalid("response head larger than 64 KiB")),
                        _ => return Ok(head),
                    }
                }
                Ok(None) => {
                    if self.pending().len().saturating_add(head_bytes) >= MAX_HEAD {
                        return Err(invalid("response head larger than 64 KiB"));
                    }
                    let error = match self.fill().await {
                        Ok(0) => io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed before the response head was complete",
                        ),
                        Ok(_) => continue,
                        Err(error) => error,
                    };
                    return Err(Failure::Other(TransportError::Io(error)));
                }
            }
        }
    }

    async fn read_body(
        &mut self,
        framing: Framing,
        budget: &mut Budget<'_>,
    ) -> Result<(), Incomplete> {
        match framing {
            Framing::Empty => Ok(()),
            Framing::Length(length) => match usize::try_from(length) {
                Ok(length) if length <= DRAIN_LIMIT => self.read_exact(length, budget).await,
                // Too long to drain: read only what the message keeps,
                // then the connection is closed.
                _ => {
                    let keep = budget.keep;
                    self.read_exact(keep, budget).await?;
                    Err(Incomplete)
                }
            },
            Framing::Chunked => self.read_chunked(budget).await,
            Framing::UntilClose => {
                loop {
                    let pending = self.end - self.start;
                    let within = budget.take(self.pending());
                    self.consume(pending);
                    if !within {
                        break;
                    }
                    self.more().await?;
                }
                Err(Incomplete)
            }
        }
    }

    /// Reads `length` body bytes into `budget`.
    async fn read_exact(
        &mut self,
        length: usize,
        budget: &mut Budget<'_>,
    ) -> Result<(), Incomplete> {
        let mut remaining = length;
        while remaining > 0 {
            if self.start == self.end {
                self.more().await?;
            }
            let count = (self.end - self.start).min(remaining);
            let within = budget.take(&self.buffer[self.start..self.start + count]);
            self.consume(count);
            remaining -= count;
            if !within {
                return Err(Incomplete);
            }
        }
        Ok(())
    }

    /// A chunked body: sizes (extensions skipped), data, then trailers
    /// (skipped).
    async fn read_chunked(&mut self, budget: &mut Budget<'_>) -> Result<(), Incomplete> {
        loop {
            let size = loop {
                match httparse::parse_chunk_size(self.pending()) {
                    Ok(httparse::Status::Complete((length, size))) => {
                        self.consume(length);
                        break size;
                    }
                    Ok(httparse::Status::Partial) if self.end - self.start <= MAX_LINE => {
                        self.more().await?;
                    }
                    Ok(httparse::Status::Partial) | Err(_) => return Err(Incomplete),
                }
            };
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).map_err(|_| Incomplete)?;
            self.read_exact(size, budget).await?;
            while self.end - self.start < 2 {
                self.more().await?;
            }
            if self.pending().get(..2) != Some(b"\r\n".as_slice()) {
                return Err(Incomplete);
            }
            self.consume(2);
        }
        // Trailer fields, then the empty line.
        let mut trailers = 0usize;
        loop {
            match self.pending().windows(2).position(|pair| pair == b"\r\n") {
                Some(0) => {
                    self.consume(2);
                    return Ok(());
                }
                Some(line) => {
                    trailers = trailers.saturating_add(line + 2);
                    if trailers > MAX_HEAD {
                        return Err(Incomplete);
                    }
                    self.consume(line + 2);
                }
                None if self.end - self.start <= MAX_LINE => self.more().await?,
                None => return Err(Incomplete),
            }
        }
    }
}

/// Parses a complete response head at the start of `bytes`: its length and
/// what matters of it; `Ok(None)` when more bytes are needed.
fn parse_head(bytes: &[u8]) -> Result<Option<(usize, Head)>, String> {
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let length = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        bytes,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(error.to_string()),
    };
    let status = response.code.ok_or_else(|| "no status code".to_string())?;
    let http11 = response.version == Some(1);

    let mut content_length: Option<u64> = None;
    let mut transfer_encoding = false;
    let mut chunked = false;
    let mut close = false;
    let mut keep_alive = false;
    let mut retry_after = None;
    for header in response.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("retry-after") {
            retry_after = std::str::from_utf8(header.value)
                .ok()
                .and_then(RetryAfter::parse);
        }
        if name.eq_ignore_ascii_case("content-length") {
            for part in header.value.split(|&b| b == b',') {
                let length = parse_decimal(part.trim_ascii())
                    .ok_or_else(|| "invalid content-length".to_string())?;
                if content_length.is_some_and(|seen| seen != length) {
                    return Err("conflicting content-length headers".to_string());
                }
                content_length = Some(length);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            // Chunked only when it is the last coding applied.
            chunked = header
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in header.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }

    let framing = if matches!(status, 100..=199 | 204 | 304) {
        Framing::Empty
    } else if transfer_encoding {
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(length) = content_length {
        Framing::Length(length)
    } else {
        Framing::UntilClose
    };
    let keep_alive = !close
        && (http11 || keep_alive)
        && framing != Framing::UntilClose
        // Both framings at once: a confused (or smuggling) server.
        && !(transfer_encoding && content_length.is_some());
    Ok(Some((
        length,
        Head {
            status,
            retry_after,
            framing,
            keep_alive,
        },
    )))
}

/// A non-empty run of ASCII digits.
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &digit| {
        if !digit.is_ascii_digit() {
            return None;
        }
        value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
    })
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    fn head(bytes: &[u8]) -> Head {
        parse_head(bytes).unwrap().unwrap().1
    }

    #[test]
    fn framing_and_keep_alive() {
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.keep_alive);
        let h = head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.keep_alive);
        let h = head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
        let h = head(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        let h = head(b"HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(h.framing, Framing::Empty);
        assert!(h.keep_alive);
        let h = head(b"HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n");
        assert!(!h.keep_alive);
        let h = head(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert!(!h.keep_alive);
        let h = head(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n");
        assert!(h.keep_alive);
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.keep_alive);
        let h = head(b"HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(3));
    }

    #[test]
    fn partial_and_invalid_heads() {
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le").unwrap(), None);
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n")
                .is_err()
        );
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n").is_err());
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\n")
                .is_err()
        );
    }

    #[test]
    fn only_addresses_the_policy_allows_are_connected_to() {
        // What a host name resolving to the metadata service (or to a mix)
        // gives the connect loop.
        let addresses = |list: &[&str]| -> Vec<SocketAddr> {
            list.iter().map(|a| a.parse().unwrap()).collect()
        };
        let policy = EgressPolicy::new(crate::egress::EgressOptions::internal());
        let (allowed, refusal) = allowed_addresses(
            addresses(&[
                "169.254.169.254:80",
                "[::ffff:169.254.169.254]:80",
                "[fe80::1]:80",
            ]),
            &policy,
        );
        assert!(allowed.is_empty());
        assert_eq!(
            refusal.unwrap().to_string(),
            "egress_blocked: 169.254.169.254 is a cloud metadata address"
        );
        let (allowed, refusal) = allowed_addresses(
            addresses(&["[fe80::1]:80", "127.0.0.1:80", "8.8.8.8:80"]),
            &policy,
        );
        assert_eq!(allowed, addresses(&["127.0.0.1:80", "8.8.8.8:80"]));
        assert!(refusal.is_some());
    }

    #[test]
    fn endpoints() {
        let endpoint = |url: &str| Endpoint::from_url(&reqwest::Url::parse(url).unwrap());
        let e = endpoint("http://Example.COM/hook?a=1#frag").unwrap();
        assert_eq!(&*e.authority, "example.com:80");
        assert_eq!(e.host, "example.com");
        assert_eq!(e.target, "/hook?a=1");
        let e = endpoint("http://127.0.0.1:9000").unwrap();
        assert_eq!(&*e.authority, "127.0.0.1:9000");
        assert_eq!(e.host, "127.0.0.1:9000");
        assert_eq!(e.target, "/");
        let e = endpoint("http://[::1]:80/a b").unwrap();
        assert_eq!(&*e.authority, "[::1]:80");
        assert_eq!(e.host, "[::1]");
        assert_eq!(e.target, "/a%20b");
        assert!(endpoint("https://example.com/").is_err());
    }
}
