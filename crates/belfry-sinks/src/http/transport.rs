//! The one seam between the webhook sink and the wire: a [`Transport`]
//! sends one rendered `POST` and reads the response, nothing more.
//!
//! Two implementations:
//! - [`super::client::PlainTransport`]: Belfry's own HTTP/1.1 client for
//!   plain `http://` (the cheap path);
//! - [`super::reqwest_transport::ReqwestTransport`]: reqwest for
//!   `https://`, and for plain http when an HTTP proxy is configured.
//!
//! # Contract
//! - One call is one attempt: the transport never resends a request whose
//!   body it has completely written. It may resend on a fresh connection
//!   only when a reused keep-alive connection failed before the whole
//!   request was written (the receiver cannot have acted on a request it
//!   did not get whole). Anything after that is an error for the retry
//!   policy ([`super::retry`]), which counts it as an attempt.
//! - Redirects are never followed.
//! - Every address connected to passes the node's egress policy
//!   ([`crate::egress`]) first; a refusal is [`TransportError::Egress`].
//! - A timeout after the response head still returns the response.

use std::fmt;
use std::future::Future;
use std::io;
use std::time::Duration;

use belfry_core::policy::RetryAfter;
use reqwest::header::HeaderMap;

use super::{
    HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_IDEMPOTENCY_KEY, HEADER_SCHEDULED_AT, HEADER_TENANT,
};
use crate::egress::EgressRefusal;
use crate::signing::{HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, HEADER_WEBHOOK_TIMESTAMP};

/// How much of a refusal's body the transports keep. It never goes into
/// an error message (see `status_result`).
pub const ERROR_BODY_LIMIT: usize = 1024;

/// How much of a response's body is read so the connection can be reused;
/// a larger body is abandoned (and its connection closed) instead.
pub const DRAIN_LIMIT: usize = 64 * 1024;

/// Headers every request gets from Belfry: a tenant's header with one of
/// these names is dropped (reqwest: replaced). Belfry's own, the signing
/// headers, and the framing and connection headers the client manages.
pub(crate) const OWN_HEADERS: &[&str] = &[
    "content-type",
    HEADER_EVENT_ID,
    HEADER_TENANT,
    HEADER_SCHEDULED_AT,
    HEADER_ATTEMPT,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_WEBHOOK_ID,
    HEADER_WEBHOOK_TIMESTAMP,
    HEADER_WEBHOOK_SIGNATURE,
    "content-length",
    "transfer-encoding",
    "connection",
];

/// A response as far as a delivery needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The first [`super::sink::ERROR_BODY_LIMIT`] bytes of a non-2xx body
    /// (empty for a 2xx).
    pub body: Vec<u8>,
    /// Its `Retry-After` header, when it has one that parses.
    pub retry_after: Option<RetryAfter>,
}

/// What varies per delivery: Belfry's headers (lowercase names, values of
/// printable ASCII only) and the body.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub headers: &'a [(&'static str, &'a str)],
    pub body: &'a [u8],
}

/// Why an attempt got no response.
#[derive(Debug)]
pub enum TransportError {
    /// Resolving and connecting took longer than the connect timeout.
    ConnectTimeout,
    /// The attempt took longer than the request timeout before a response
    /// head arrived.
    Timeout,
    /// Resolving or connecting failed.
    Connect(io::Error),
    /// Writing the request or reading the response failed.
    Io(io::Error),
    /// The response head was unparsable, too large, or a `101`.
    InvalidResponse(String),
    /// Every address of the target is refused by the egress policy.
    Egress(EgressRefusal),
    /// The request cannot be built (trying again cannot help).
    InvalidRequest(String),
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::ConnectTimeout => f.write_str("connect timeout"),
            TransportError::Timeout => f.write_str("timeout"),
            TransportError::Connect(error) => write!(f, "connect failed: {error}"),
            TransportError::Io(error) => write!(f, "request failed: {error}"),
            TransportError::InvalidResponse(reason) => write!(f, "invalid response: {reason}"),
            TransportError::Egress(refusal) => refusal.fmt(f),
            TransportError::InvalidRequest(reason) => write!(f, "invalid request: {reason}"),
        }
    }
}

/// Sends one webhook request. `Target` is what [`Transport::prepare`]
/// derives once per tenant config (a parsed URL, a rendered request head),
/// so a delivery repeats none of that work.
pub trait Transport: Send + Sync + fmt::Debug {
    type Target: Send + Sync + fmt::Debug;

    /// Prepares `url` with the tenant's `headers` (already valid header
    /// names and values).
    ///
    /// # Errors
    /// A URL this transport cannot deliver to (a permanent failure).
    fn prepare(
        &self,
        url: &reqwest::Url,
        headers: &HeaderMap,
        user_agent: &str,
    ) -> Result<Self::Target, String>;

    /// One attempt, all within `timeout`.
    fn send(
        &self,
        target: &Self::Target,
        request: Outgoing<'_>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Response, TransportError>> + Send;
}
