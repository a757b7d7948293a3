//! Lean mode's server: a hand-rolled HTTP/1.1 loop, one task per
//! connection, costing as little CPU per request as it can (the receiver
//! shares the machine with the node a benchmark measures).
//!
//! Each `read` lands in one reusable buffer; every request completed by
//! that read is parsed ([`httparse`] for heads), recorded under one lock,
//! answered in order and, when no answer has a delay, written back in one
//! `write`. Bodies are framed (`Content-Length` or chunked) and skipped,
//! never kept. A request sharing a read with others shares their arrival
//! time: that is when its bytes arrived.
//!
//! Closes the connection after a request with `Connection: close`, an
//! HTTP/1.0 request without `Connection: keep-alive`, a malformed request
//! (`400`) or a head over [`MAX_HEAD`] bytes (`431`).

use std::io;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{LEAN_HEADERS, RecordedRequest, Response, Shared, lock};

/// The largest request head (or chunk-size line, or trailer section)
/// accepted; more is answered `431` and the connection closed.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in one head (more: `431`).
const MAX_HEADERS: usize = 128;
/// How long a connection we close keeps draining the client's bytes.
const LINGER: Duration = Duration::from_secs(2);
/// Free space ensured in the buffer before each read.
const READ_SPACE: usize = 8 * 1024;

/// Serves one accepted connection until the peer closes it, an I/O error,
/// or a request that ends it.
pub(super) async fn serve_connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut connection = Connection {
        shared,
        framing: Framing::Head,
        pending: None,
        trailer_bytes: 0,
        batch: Vec::new(),
        keep_alive_10: Vec::new(),
        responses: Vec::new(),
    };
    // A client hanging up mid-request is not our concern.
    if let Ok(true) = connection.run(&mut stream).await {
        let _ = stream.shutdown().await;
        // Lingering close: drain what the client still sends until it
        // closes too, so that closing with unread bytes does not reset the
        // connection and lose the answer just written.
        let mut sink = [0_u8; 1024];
        let _ = tokio::time::timeout(LINGER, async {
            while let Ok(1..) = stream.read(&mut sink).await {}
        })
        .await;
    }
}

/// Where the connection is within the current request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Waiting for a request head.
    Head,
    /// Skipping this many more bytes of a `Content-Length` body.
    Length(u64),
    /// Chunked body: expecting a chunk-size line.
    ChunkSize,
    /// Chunked body: skipping this many more bytes of chunk data.
    ChunkData(u64),
    /// Chunked body: expecting the CRLF after a chunk's data.
    ChunkEnd,
    /// Chunked body: reading trailer lines until the empty one.
    Trailers,
}

/// Why parsing a read's bytes stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every complete request was taken; the rest needs more bytes.
    NeedMore,
    /// The last request taken asked to close the connection.
    Close,
    /// The next request is unacceptable: answer this status and close.
    Reject(u16),
}

/// A request whose head was parsed, waiting for the end of its body.
struct Pending {
    record: RecordedRequest,
    /// Close the connection after answering it.
    close: bool,
    /// HTTP/1.0 with `Connection: keep-alive`: the answer must say so.
    keep_alive_10: bool,
    /// The client waits for `100 Continue` before sending the body.
    expects_continue: bool,
}

/// The arrival time of one read's bytes.
#[derive(Clone, Copy)]
struct Stamp {
    ms: i64,
    at: Instant,
}

impl Stamp {
    fn now() -> Self {
        #[allow(clippy::disallowed_methods)] // Arrival must be wall-clock time.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or_default();
        Stamp {
            ms,
            at: Instant::now(),
        }
    }
}

struct Connection {
    shared: Arc<Shared>,
    framing: Framing,
    /// Set while `framing` is inside a body.
    pending: Option<Pending>,
    /// Trailer bytes of the current chunked body so far.
    trailer_bytes: usize,
    /// Requests completed by the current read, in order; reused.
    batch: Vec<RecordedRequest>,
    /// Per entry of `batch`: HTTP/1.0 kept alive.
    keep_alive_10: Vec<bool>,
    /// Answers to `batch`; reused.
    responses: Vec<Response>,
}

impl Connection {
    /// Reads, parses, records and answers until the connection ends.
    /// `Ok(true)`: we end it (shut the write side down); `Ok(false)`: the
    /// peer closed it.
    async fn run(&mut self, stream: &mut TcpStream) -> io::Result<bool> {
        let mut buf = BytesMut::with_capacity(READ_SPACE);
        let mut out = Vec::with_capacity(1024);
        loop {
            // Reclaims the consumed front when the bytes left are few
            // (usually none), else grows.
            if buf.capacity() - buf.len() < READ_SPACE / 2 {
                buf.reserve(READ_SPACE);
            }
            if stream.read_buf(&mut buf).await? == 0 {
                return Ok(false);
            }
            let stop = self.parse(&mut buf);
            self.answer(stream, &mut out, stop).await?;
            if stop != Stop::NeedMore {
                return Ok(true);
            }
        }
    }

    /// Takes every request `buf` completes into `batch`, consuming their
    /// bytes; stops at the first one that ends the connection.
    fn parse(&mut self, buf: &mut BytesMut) -> Stop {
        // Read once per read, and only when a head arrived in it.
        let mut stamp = None;
        loop {
            match self.framing {
                Framing::Head => {
                    if buf.is_empty() {
                        return Stop::NeedMore;
                    }
                    let (head_len, pending, framing) = match parse_head(buf, &mut stamp) {
                        Ok(Some(parsed)) => parsed,
                        Ok(None) => return Stop::NeedMore,
                        Err(status) => return Stop::Reject(status),
                    };
                    buf.advance(head_len);
                    self.framing = framing;
                    self.pending = Some(pending);
                    if self.framing == Framing::Length(0) && self.complete() {
                        return Stop::Close;
                    }
                }
                Framing::Length(left) => {
                    let left = skip(buf, left);
                    self.framing = Framing::Length(left);
                    if left > 0 {
                        return Stop::NeedMore;
                    }
                    if self.complete() {
                        return Stop::Close;
                    }
                }
                Framing::ChunkSize => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        buf.advance(used);
                        self.framing = if size == 0 {
                            self.trailer_bytes = 0;
                            Framing::Trailers
                        } else {
                            Framing::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => {
                        return Stop::NeedMore;
                    }
                    Ok(httparse::Status::Partial) => return Stop::Reject(431),
                    Err(httparse::InvalidChunkSize) => return Stop::Reject(400),
                },
                Framing::ChunkData(left) => {
                    let left = skip(buf, left);
                    if left > 0 {
                        self.framing = Framing::ChunkData(left);
                        return Stop::NeedMore;
                    }
                    self.framing = Framing::ChunkEnd;
                }
                Framing::ChunkEnd => {
                    if buf.len() < 2 {
                        return Stop::NeedMore;
                    }
                    if &buf[..2] != b"\r\n" {
                        return Stop::Reject(400);
                    }
                    buf.advance(2);
                    self.framing = Framing::ChunkSize;
                }
                Framing::Trailers => {
                    let Some(line) = buf.windows(2).position(|w| w == b"\r\n") else {
                        return if self.trailer_bytes + buf.len() > MAX_HEAD {
                            Stop::Reject(431)
                        } else {
                            Stop::NeedMore
                        };
                    };
                    buf.advance(line + 2);
                    self.trailer_bytes += line + 2;
                    if line == 0 {
                        if self.complete() {
                            return Stop::Close;
                        }
                    } else if self.trailer_bytes > MAX_HEAD {
                        return Stop::Reject(431);
                    }
                }
            }
        }
    }

    /// The pending request's body is over: moves it to `batch`. True when
    /// it closes the connection (parsing stops there).
    fn complete(&mut self) -> bool {
        self.framing = Framing::Head;
        let Some(pending) = self.pending.take() else {
            return false;
        };
        self.batch.push(pending.record);
        self.keep_alive_10.push(pending.keep_alive_10);
        pending.close
    }

    /// Records `batch`, then writes the answers: in order, each delayed as
    /// decided, coalesced into one write between delays. Then the
    /// rejection, if any, and `100 Continue` for a body still expected.
    async fn answer(
        &mut self,
        stream: &mut TcpStream,
        out: &mut Vec<u8>,
        stop: Stop,
    ) -> io::Result<()> {
        out.clear();
        let n = self.batch.len();
        if n > 0 {
            {
                let mut behaviour = lock(&self.shared.behaviour);
                self.responses
                    .extend(self.batch.iter().map(|record| behaviour.decide(record)));
            }
            lock(&self.shared.records).append(&mut self.batch);
            self.shared
                .count
                .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::AcqRel);
        }
        for (i, response) in self.responses.drain(..).enumerate() {
            if !response.delay.is_zero() {
                if !out.is_empty() {
                    stream.write_all(out).await?;
                    out.clear();
                }
                tokio::time::sleep(response.delay).await;
            }
            let connection = if i + 1 == n && stop == Stop::Close {
                Some(&b"close"[..])
            } else if self.keep_alive_10[i] {
                Some(&b"keep-alive"[..])
            } else {
                None
            };
            write_response(out, response.status, &response.body, connection);
        }
        self.keep_alive_10.clear();
        if let Stop::Reject(status) = stop {
            write_response(out, status, &[], Some(b"close"));
        } else if let Some(pending) = self.pending.as_mut()
            && std::mem::take(&mut pending.expects_continue)
        {
            out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        if !out.is_empty() {
            stream.write_all(out).await?;
        }
        Ok(())
    }
}

/// Consumes up to `left` bytes of `buf`; returns how many are still to
/// come.
fn skip(buf: &mut BytesMut, left: u64) -> u64 {
    let available = u64::try_from(buf.len()).unwrap_or(u64::MAX);
    let take = left.min(available);
    // `take` is at most `buf.len()`, so it fits.
    buf.advance(usize::try_from(take).unwrap_or(buf.len()));
    left - take
}

/// Parses the request head at the start of `buf`: `Ok(None)` when it is
/// not all there yet, else its length, the request and how its body is
/// framed (`Length(0)`: no body). `Err` is the status to reject it with.
fn parse_head(
    buf: &[u8],
    stamp: &mut Option<Stamp>,
) -> Result<Option<(usize, Pending, Framing)>, u16> {
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let head_len = match request.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
        Ok(httparse::Status::Complete(_)) | Err(httparse::Error::TooManyHeaders) => {
            return Err(431);
        }
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(431),
        Err(_) => return Err(400),
    };
    let (Some(method), Some(version)) = (request.method, request.version) else {
        return Err(400);
    };
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| 400_u16)?;

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut has_transfer_encoding = false;
    let mut close = false;
    let mut keep_alive = false;
    let mut expects_continue = false;
    let mut lean: [Option<&[u8]>; LEAN_HEADERS.len()] = [None; LEAN_HEADERS.len()];
    for header in request.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("content-length") {
            let length = parse_content_length(header.value).ok_or(400_u16)?;
            if content_length.is_some_and(|seen| seen != length) {
                return Err(400);
            }
            content_length = Some(length);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only the last coding matters; it must be chunked.
            has_transfer_encoding = true;
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
        } else if name.eq_ignore_ascii_case("expect") {
            expects_continue = header
                .value
                .trim_ascii()
                .eq_ignore_ascii_case(b"100-continue");
        } else if let Some(slot) = LEAN_HEADERS
            .iter()
            .position(|lean_name| name.eq_ignore_ascii_case(lean_name))
        {
            // The first value, as hyper's `HeaderMap::get` gives.
            lean[slot].get_or_insert(header.value);
        }
    }
    let framing = match (has_transfer_encoding, content_length) {
        (false, length) => Framing::Length(length.unwrap_or(0)),
        // Chunked must be the final coding of a request; both framings at
        // once is a smuggling attempt.
        (true, None) if chunked => Framing::ChunkSize,
        (true, _) => return Err(400),
    };
    let http_10 = version == 0;
    let close = close || (http_10 && !keep_alive);

    let stamp = *stamp.get_or_insert_with(Stamp::now);
    let mut headers = Vec::with_capacity(lean.iter().flatten().count());
    for (name, value) in LEAN_HEADERS.iter().zip(lean) {
        if let Some(value) = value {
            headers.push((
                (*name).to_string(),
                String::from_utf8_lossy(value).into_owned(),
            ));
        }
    }
    let pending = Pending {
        record: RecordedRequest {
            arrived_at_ms: stamp.ms,
            arrived_at: stamp.at,
            method,
            path: String::new(),
            headers,
            body: Bytes::new(),
        },
        close,
        keep_alive_10: http_10 && !close,
        expects_continue: expects_continue && framing != Framing::Length(0),
    };
    Ok(Some((head_len, pending, framing)))
}

/// A `Content-Length` value: ASCII digits only, no overflow.
fn parse_content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0_u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Appends `HTTP/1.1 {status} {reason}`, `content-length`, the optional
/// `connection` header and the body. Statuses that cannot have a body
/// (1xx, 204, 304) get neither length nor body; an invalid status is sent
/// as 500, as hyper does in full mode.
fn write_response(out: &mut Vec<u8>, status: u16, body: &[u8], connection: Option<&[u8]>) {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let bodyless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if !bodyless {
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, body.len());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(connection) = connection {
        out.extend_from_slice(b"connection: ");
        out.extend_from_slice(connection);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !bodyless {
        out.extend_from_slice(body);
    }
}

fn push_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0_u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::super::{Receiver, Response};
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// One parsed response: status, headers (lowercase names), body.
    #[derive(Debug)]
    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// Parses complete responses off the front of `buf` (Content-Length
    /// framing, as the receiver writes).
    fn parse_replies(buf: &mut Vec<u8>) -> Vec<Reply> {
        let mut replies = Vec::new();
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut response = httparse::Response::new(&mut headers);
            let Ok(httparse::Status::Complete(head_len)) = response.parse(buf) else {
                return replies;
            };
            let headers: Vec<(String, String)> = response
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let length: usize = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .map_or(0, |(_, v)| v.parse().unwrap());
            if buf.len() < head_len + length {
                return replies;
            }
            replies.push(Reply {
                status: response.code.unwrap(),
                headers,
                body: String::from_utf8_lossy(&buf[head_len..head_len + length]).into_owned(),
            });
            buf.drain(..head_len + length);
        }
    }

    /// Reads until `n` responses arrived.
    async fn read_replies(stream: &mut TcpStream, n: usize) -> Vec<Reply> {
        let mut buf = Vec::new();
        let mut replies = Vec::new();
        while replies.len() < n {
            let mut chunk = [0_u8; 4096];
            let read = tokio::time::timeout(WAIT, stream.read(&mut chunk))
                .await
                .expect("a reply in time")
                .unwrap();
            assert!(read > 0, "closed after {} replies", replies.len());
            buf.extend_from_slice(&chunk[..read]);
            replies.extend(parse_replies(&mut buf));
        }
        assert!(buf.is_empty(), "unexpected bytes: {buf:?}");
        replies
    }

    /// Reads to EOF and parses what came.
    async fn read_until_closed(stream: &mut TcpStream) -> Vec<Reply> {
        let mut buf = Vec::new();
        tokio::time::timeout(WAIT, stream.read_to_end(&mut buf))
            .await
            .expect("the receiver closes the connection")
            .unwrap();
        let replies = parse_replies(&mut buf);
        assert!(buf.is_empty(), "unexpected bytes: {buf:?}");
        replies
    }

    async fn connect(receiver: &Receiver) -> TcpStream {
        let stream = TcpStream::connect(receiver.addr()).await.unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    fn post(event_id: &str, body: &str) -> String {
        format!(
            "POST /hook HTTP/1.1\r\nhost: x\r\nX-Belfry-Event-Id: {event_id}\r\n\
             idempotency-key: k-{event_id}\r\nx-other: o\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn pipelined_requests_in_one_write_are_answered_in_order() {
        let receiver = Receiver::start_lean().await;
        receiver.set_responder(|request| match request.header("x-belfry-event-id") {
            // The first answer is delayed: the second must still come after.
            Some("e1") => Response::status(201)
                .with_body("one")
                .with_delay(Duration::from_millis(30)),
            Some("e2") => Response::status(202).with_body("two"),
            _ => Response::status(204),
        });
        let mut stream = connect(&receiver).await;
        let both = format!("{}{}", post("e1", "first"), post("e2", ""));
        stream.write_all(both.as_bytes()).await.unwrap();
        let replies = read_replies(&mut stream, 2).await;
        assert_eq!(replies[0].status, 201);
        assert_eq!(replies[0].body, "one");
        assert_eq!(replies[1].status, 202);
        assert_eq!(replies[1].body, "two");
        assert_eq!(replies[1].header("connection"), None);

        // A request split across writes (and reads), then a GET without a
        // body; still the same connection.
        let third = post("e3", "third body");
        let (a, b) = third.split_at(20);
        stream.write_all(a.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        stream.write_all(b.as_bytes()).await.unwrap();
        let replies = read_replies(&mut stream, 1).await;
        assert_eq!(replies[0].status, 204);
        assert_eq!(replies[0].header("content-length"), None);
        stream
            .write_all(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let replies = read_replies(&mut stream, 1).await;
        assert_eq!(replies[0].status, 204);

        let seen = receiver.requests();
        assert_eq!(seen.len(), 4);
        assert_eq!(receiver.count(), 4);
        assert_eq!(
            seen[0].headers,
            [
                ("x-belfry-event-id".to_string(), "e1".to_string()),
                ("idempotency-key".to_string(), "k-e1".to_string()),
            ]
        );
        assert_eq!(seen[1].header("x-belfry-event-id"), Some("e2"));
        assert_eq!(seen[2].header("x-belfry-event-id"), Some("e3"));
        assert_eq!(seen[3].method, Method::GET);
        assert!(seen[3].headers.is_empty());
        // Same read, same arrival.
        assert_eq!(seen[0].arrived_at, seen[1].arrived_at);
        assert!(seen[1].arrived_at < seen[2].arrived_at);
        assert!(seen.iter().all(|r| r.path.is_empty() && r.body.is_empty()));
        assert_eq!(receiver.accepted_connections(), 1);
    }

    #[tokio::test]
    async fn chunked_bodies_are_skipped_and_the_connection_stays_usable() {
        let receiver = Receiver::start_lean().await;
        receiver.set_default(Response::status(200).with_body("ok"));
        let mut stream = connect(&receiver).await;
        let chunked = "POST /hook HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\
                       x-belfry-event-id: c1\r\n\r\n\
                       5\r\nhello\r\n6;ext=1\r\n world\r\nA\r\n0123456789\r\n\
                       0\r\nx-trailer: t\r\n\r\n";
        stream
            .write_all(format!("{chunked}{}", post("c2", "after")).as_bytes())
            .await
            .unwrap();
        let replies = read_replies(&mut stream, 2).await;
        assert!(replies.iter().all(|r| r.status == 200 && r.body == "ok"));

        // The same body byte by byte: every state split across reads.
        for byte in chunked.replace("c1", "c3").as_bytes() {
            stream.write_all(&[*byte]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let replies = read_replies(&mut stream, 1).await;
        assert_eq!(replies[0].status, 200);

        let ids: Vec<_> = receiver
            .requests()
            .iter()
            .map(|r| r.header("x-belfry-event-id").unwrap_or("").to_string())
            .collect();
        assert_eq!(ids, ["c1", "c2", "c3"]);
        assert_eq!(receiver.accepted_connections(), 1);
    }

    #[tokio::test]
    async fn expect_continue_gets_100_before_the_body() {
        let receiver = Receiver::start_lean().await;
        let mut stream = connect(&receiver).await;
        stream
            .write_all(
                b"POST /h HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n",
            )
            .await
            .unwrap();
        let mut interim = [0_u8; 25];
        tokio::time::timeout(WAIT, stream.read_exact(&mut interim))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        stream.write_all(b"body").await.unwrap();
        let replies = read_replies(&mut stream, 1).await;
        assert_eq!(replies[0].status, 200);
        assert_eq!(receiver.count(), 1);
    }

    #[tokio::test]
    async fn malformed_requests_get_400_and_are_closed() {
        let receiver = Receiver::start_lean().await;
        for bad in [
            "GARBAGE\r\n\r\n",
            "POST /h HTTP/1.1\r\ncontent-length: nope\r\n\r\n",
            "POST /h HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nx",
            "POST /h HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
            "POST /h HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            "POST /h HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "POST /h HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY",
        ] {
            let mut stream = connect(&receiver).await;
            // A good request first: it is still answered, in order.
            let request = format!("{}{bad}", post("ok", "x"));
            stream.write_all(request.as_bytes()).await.unwrap();
            let replies = read_until_closed(&mut stream).await;
            let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
            assert_eq!(statuses, [200, 400], "{bad:?}");
            assert_eq!(replies[1].header("connection"), Some("close"));
        }
        // Only the good ones were recorded.
        assert_eq!(receiver.count(), 7);
    }

    #[tokio::test]
    async fn oversized_heads_get_431_and_are_closed() {
        let receiver = Receiver::start_lean().await;
        let mut stream = connect(&receiver).await;
        let head = format!(
            "POST /h HTTP/1.1\r\nx-big: {}\r\n",
            "a".repeat(MAX_HEAD + 1)
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let replies = read_until_closed(&mut stream).await;
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].status, 431);
        assert_eq!(receiver.count(), 0);
    }

    #[tokio::test]
    async fn connection_close_and_http_10_close_after_the_answer() {
        let receiver = Receiver::start_lean().await;
        for (request, pipelined_after) in [
            (
                "POST /h HTTP/1.1\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi",
                true,
            ),
            ("GET /h HTTP/1.0\r\n\r\n", true),
            (
                "GET /h HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n",
                false,
            ),
        ] {
            let mut stream = connect(&receiver).await;
            stream.write_all(request.as_bytes()).await.unwrap();
            if pipelined_after {
                // Ignored: the connection ends with the request before.
                let _ = stream.write_all(post("never", "").as_bytes()).await;
            }
            let replies = read_until_closed(&mut stream).await;
            assert_eq!(replies.len(), 1, "{request:?}");
            assert_eq!(replies[0].status, 200);
            assert_eq!(replies[0].header("connection"), Some("close"));
        }
        assert_eq!(receiver.count(), 3);
        assert!(
            receiver
                .requests()
                .iter()
                .all(|r| r.header("x-belfry-event-id").is_none())
        );

        // HTTP/1.0 asking for keep-alive gets it, and says so.
        let mut stream = connect(&receiver).await;
        let request = "GET /h HTTP/1.0\r\nconnection: keep-alive\r\n\r\n";
        stream
            .write_all(format!("{request}{request}").as_bytes())
            .await
            .unwrap();
        let replies = read_replies(&mut stream, 2).await;
        assert!(
            replies
                .iter()
                .all(|r| r.header("connection") == Some("keep-alive"))
        );
    }

    #[test]
    fn responses_are_framed_by_content_length() {
        let mut out = Vec::new();
        write_response(&mut out, 503, b"busy", None);
        write_response(&mut out, 204, b"dropped", Some(b"close"));
        write_response(&mut out, 42, b"", None);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy\
             HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n\
             HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"
        );
        let mut out = Vec::new();
        push_decimal(&mut out, 0);
        push_decimal(&mut out, 1_234_567);
        assert_eq!(out, b"01234567");
        assert_eq!(parse_content_length(b" 17 "), Some(17));
        assert_eq!(parse_content_length(b"+1"), None);
        assert_eq!(parse_content_length(b"99999999999999999999999"), None);
    }
}
