//! The one classification of an HTTP attempt: delivered, retry, permanent.
//!
//! - 2xx: delivered;
//! - 4xx: permanent (the receiver refused this event), except 408 Request
//!   Timeout and 429 Too Many Requests, which ask to come back later;
//! - 1xx, 3xx (redirects are not followed), 5xx: retry;
//! - timeouts, connection errors and invalid responses: retry;
//! - a request that cannot even be built (bad URL or header): permanent,
//!   since trying again cannot help.

use std::error::Error as _;
use std::io;
use std::time::Duration;

use belfry_core::Verdict;

use super::client::ClientError;

/// The verdict for a response with `status`.
pub fn classify_status(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Delivered,
        408 | 429 => Verdict::Retry,
        400..=499 => Verdict::Permanent,
        _ => Verdict::Retry,
    }
}

/// The verdict and a short reason for a request that got no response.
///
/// `connect_timeout` and `request_timeout` are the limits that applied, so
/// the reason can say which one ran out (`"timeout after 2000 ms"`).
pub fn classify_error(
    error: &reqwest::Error,
    connect_timeout: Duration,
    request_timeout: Duration,
) -> (Verdict, String) {
    if error.is_builder() {
        return (
            Verdict::Permanent,
            format!("invalid request: {}", error_chain(error)),
        );
    }
    if error.is_timeout() {
        let reason = if error.is_connect() {
            format!("connect timeout after {} ms", connect_timeout.as_millis())
        } else {
            format!("timeout after {} ms", request_timeout.as_millis())
        };
        return (Verdict::Retry, reason);
    }
    let reason = match io_error_kind(error).and_then(connection_reason) {
        Some(reason) => reason.to_string(),
        None if error.is_connect() => format!("connect failed: {}", error_chain(error)),
        None => format!("request failed: {}", error_chain(error)),
    };
    (Verdict::Retry, reason)
}

/// [`classify_error`] for Belfry's own plain-http client: the same reasons
/// for the same failures.
pub fn classify_client_error(
    error: &ClientError,
    connect_timeout: Duration,
    request_timeout: Duration,
) -> (Verdict, String) {
    match error {
        ClientError::ConnectTimeout => (
            Verdict::Retry,
            format!("connect timeout after {} ms", connect_timeout.as_millis()),
        ),
        ClientError::Timeout => (
            Verdict::Retry,
            format!("timeout after {} ms", request_timeout.as_millis()),
        ),
        ClientError::Connect(error) => classify_io_error(error, true),
        ClientError::Io(error) => classify_io_error(error, false),
        ClientError::InvalidResponse(reason) => {
            (Verdict::Retry, format!("invalid response: {reason}"))
        }
    }
}

/// The verdict and reason for an I/O error while connecting (`connecting`)
/// or while writing the request and reading the response: always a retry.
pub fn classify_io_error(error: &io::Error, connecting: bool) -> (Verdict, String) {
    let reason = match connection_reason(error.kind()) {
        Some(reason) => reason.to_string(),
        None if connecting => format!("connect failed: {error}"),
        None => format!("request failed: {error}"),
    };
    (Verdict::Retry, reason)
}

/// The short reason for the I/O errors of a refused or dropped connection.
fn connection_reason(kind: io::ErrorKind) -> Option<&'static str> {
    match kind {
        io::ErrorKind::ConnectionRefused => Some("connection refused"),
        io::ErrorKind::ConnectionReset => Some("connection reset"),
        io::ErrorKind::ConnectionAborted => Some("connection aborted"),
        io::ErrorKind::BrokenPipe => Some("connection closed (broken pipe)"),
        _ => None,
    }
}

/// The kind of the first I/O error in the source chain.
fn io_error_kind(error: &reqwest::Error) -> Option<io::ErrorKind> {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(io_error) = cause.downcast_ref::<io::Error>() {
            return Some(io_error.kind());
        }
        source = cause.source();
    }
    None
}

/// `error: cause: cause ...`. Callers strip the URL first
/// (`reqwest::Error::without_url`): the tenant's config already names it,
/// and a URL's query may carry secrets.
fn error_chain(error: &reqwest::Error) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        for (status, verdict) in [
            (200, Verdict::Delivered),
            (204, Verdict::Delivered),
            (299, Verdict::Delivered),
            (101, Verdict::Retry),
            (301, Verdict::Retry),
            (304, Verdict::Retry),
            (400, Verdict::Permanent),
            (404, Verdict::Permanent),
            (408, Verdict::Retry),
            (410, Verdict::Permanent),
            (429, Verdict::Retry),
            (499, Verdict::Permanent),
            (500, Verdict::Retry),
            (503, Verdict::Retry),
        ] {
            assert_eq!(classify_status(status), verdict, "status {status}");
        }
    }

    #[test]
    fn client_errors() {
        let connect = Duration::from_millis(2_000);
        let request = Duration::from_millis(300);
        let reason = |error: ClientError| {
            let (verdict, reason) = classify_client_error(&error, connect, request);
            assert_eq!(verdict, Verdict::Retry, "{reason}");
            reason
        };
        assert_eq!(
            reason(ClientError::ConnectTimeout),
            "connect timeout after 2000 ms"
        );
        assert_eq!(reason(ClientError::Timeout), "timeout after 300 ms");
        let io = |kind| io::Error::from(kind);
        assert_eq!(
            reason(ClientError::Connect(io(io::ErrorKind::ConnectionRefused))),
            "connection refused"
        );
        assert_eq!(
            reason(ClientError::Io(io(io::ErrorKind::ConnectionReset))),
            "connection reset"
        );
        assert_eq!(
            reason(ClientError::Io(io(io::ErrorKind::BrokenPipe))),
            "connection closed (broken pipe)"
        );
        assert!(
            reason(ClientError::Connect(io::Error::other("no such host")))
                .starts_with("connect failed: ")
        );
        assert!(
            reason(ClientError::Io(io(io::ErrorKind::UnexpectedEof)))
                .starts_with("request failed: ")
        );
        assert_eq!(
            reason(ClientError::InvalidResponse("bad".into())),
            "invalid response: bad"
        );
    }
}
