//! The one classification of an HTTP attempt: delivered, retry, permanent.
//!
//! - 2xx: delivered;
//! - 4xx: permanent (the receiver refused this event), except 408 Request
//!   Timeout and 429 Too Many Requests, which ask to come back later;
//! - 1xx, 3xx (redirects are not followed), 5xx: retry;
//! - timeouts and connection errors: retry;
//! - a request that cannot even be built (bad URL or header): permanent,
//!   since trying again cannot help.

use std::error::Error as _;
use std::io;
use std::time::Duration;

use belfry_core::Verdict;

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
    let reason = match io_error_kind(error) {
        Some(io::ErrorKind::ConnectionRefused) => "connection refused".to_string(),
        Some(io::ErrorKind::ConnectionReset) => "connection reset".to_string(),
        Some(io::ErrorKind::ConnectionAborted) => "connection aborted".to_string(),
        Some(io::ErrorKind::BrokenPipe) => "connection closed (broken pipe)".to_string(),
        _ if error.is_connect() => format!("connect failed: {}", error_chain(error)),
        _ => format!("request failed: {}", error_chain(error)),
    };
    (Verdict::Retry, reason)
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
}
