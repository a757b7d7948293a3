//! The one classification of an HTTP attempt: delivered, retry, permanent.
//!
//! - 2xx: delivered;
//! - 4xx: permanent (the receiver refused this event), except 408 Request
//!   Timeout and 429 Too Many Requests, which ask to come back later;
//! - 1xx, 3xx (redirects are not followed), 5xx: retry;
//! - timeouts, connection errors and invalid responses: retry;
//! - a request that cannot even be built (bad URL or header): permanent,
//!   since trying again cannot help;
//! - an address the egress policy refuses: permanent, with the reason
//!   starting with the stable code `egress_blocked`.
//!
//! Besides its verdict, the receiver steers the next attempts ([`steer`]):
//! `Retry-After` on a 429 or 503 sets the next attempt, and a 410 Gone
//! says the endpoint is gone.

use std::io;
use std::time::Duration;

use belfry_core::Verdict;
use belfry_core::policy::{RetryAfter, Steer};

use super::transport::TransportError;

/// The verdict for a response with `status`.
pub fn classify_status(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Delivered,
        408 | 429 => Verdict::Retry,
        400..=499 => Verdict::Permanent,
        _ => Verdict::Retry,
    }
}

/// What a response with `status` and a parsed `Retry-After` asks of the
/// next attempts: `Retry-After` counts on 429 and 503 only (elsewhere it
/// is ignored), and 410 is [`Steer::Gone`].
pub fn steer(status: u16, retry_after: Option<RetryAfter>) -> Option<Steer> {
    match (status, retry_after) {
        (410, _) => Some(Steer::Gone),
        (429 | 503, Some(retry_after)) => Some(Steer::RetryAfter(retry_after)),
        _ => None,
    }
}

/// The verdict and a short reason for an attempt that got no response,
/// whichever transport made it.
///
/// `connect_timeout` and `request_timeout` are the limits that applied, so
/// the reason can say which one ran out (`"timeout after 2000 ms"`).
pub fn classify_transport_error(
    error: &TransportError,
    connect_timeout: Duration,
    request_timeout: Duration,
) -> (Verdict, String) {
    match error {
        TransportError::ConnectTimeout => (
            Verdict::Retry,
            format!("connect timeout after {} ms", connect_timeout.as_millis()),
        ),
        TransportError::Timeout => (
            Verdict::Retry,
            format!("timeout after {} ms", request_timeout.as_millis()),
        ),
        TransportError::Connect(error) => classify_io_error(error, true),
        TransportError::Io(error) => classify_io_error(error, false),
        TransportError::InvalidResponse(reason) => {
            (Verdict::Retry, format!("invalid response: {reason}"))
        }
        // Starts with the stable code `egress_blocked`.
        TransportError::Egress(refusal) => (Verdict::Permanent, refusal.to_string()),
        TransportError::InvalidRequest(reason) => {
            (Verdict::Permanent, format!("invalid request: {reason}"))
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
        let reason = |error: TransportError| {
            let (verdict, reason) = classify_transport_error(&error, connect, request);
            assert_eq!(verdict, Verdict::Retry, "{reason}");
            reason
        };
        assert_eq!(
            reason(TransportError::ConnectTimeout),
            "connect timeout after 2000 ms"
        );
        assert_eq!(reason(TransportError::Timeout), "timeout after 300 ms");
        let io = |kind| io::Error::from(kind);
        assert_eq!(
            reason(TransportError::Connect(io(
                io::ErrorKind::ConnectionRefused
            ))),
            "connection refused"
        );
        assert_eq!(
            reason(TransportError::Io(io(io::ErrorKind::ConnectionReset))),
            "connection reset"
        );
        assert_eq!(
            reason(TransportError::Io(io(io::ErrorKind::BrokenPipe))),
            "connection closed (broken pipe)"
        );
        assert!(
            reason(TransportError::Connect(io::Error::other("no such host")))
                .starts_with("connect failed: ")
        );
        assert!(
            reason(TransportError::Io(io(io::ErrorKind::UnexpectedEof)))
                .starts_with("request failed: ")
        );
        assert_eq!(
            reason(TransportError::InvalidResponse("bad".into())),
            "invalid response: bad"
        );
        let refusal = crate::egress::EgressPolicy::default()
            .check("169.254.169.254".parse().unwrap())
            .unwrap_err();
        let (verdict, reason) =
            classify_transport_error(&TransportError::Egress(refusal), connect, request);
        assert_eq!(verdict, Verdict::Permanent);
        assert_eq!(
            reason,
            "egress_blocked: 169.254.169.254 is a cloud metadata address"
        );
    }
}
