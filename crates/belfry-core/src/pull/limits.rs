//! The limits of the lease API and the validation of its request bodies.
//!
//! The API deserializes a body into one of the `*Body` types (unknown
//! fields refused, numbers as unsigned integers) and calls `validate`,
//! which gives typed values or a [`PullRequestError`] whose message is safe
//! to show to a client. Defaults apply to absent fields.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

use crate::ids::{IdError, QueueName, WorkerId};

/// Most events one claim may lease.
pub const MAX_EVENTS_PER_CLAIM: u32 = 100;
/// Most queues one claim may name: every queue a tenant may declare.
pub const MAX_QUEUES_PER_CLAIM: usize = crate::tenant::MAX_DECLARED_QUEUES;
/// `max_events` when a claim does not say.
pub const DEFAULT_EVENTS_PER_CLAIM: u32 = 1;
/// Longest long-poll of a claim.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// `wait_ms` when a claim does not say: answer at once.
pub const DEFAULT_WAIT: Duration = Duration::ZERO;
/// Shortest lease (and heartbeat extension).
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// Longest lease (and heartbeat extension).
pub const MAX_LEASE: Duration = Duration::from_secs(15 * 60);
/// `lease_ms` when a claim does not say.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The heartbeat interval advised with a lease is a third of the lease, at
/// most this.
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// Longest `delay_ms` of a release and `retry_after_ms` of a failure.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 3600);
/// Longest error code of a failure, in bytes.
pub const MAX_ERROR_CODE_LEN: usize = 64;
/// Longest error message of a failure, in bytes.
pub const MAX_ERROR_MESSAGE_LEN: usize = 4096;
/// Largest `result` of a completion (its JSON text), in bytes.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;
/// Calls on one lease that may wait while another is being recorded;
/// more are refused ([`super::PullError::TooManyCalls`]).
pub const MAX_QUEUED_CALLS_PER_LEASE: usize = 4;
pub use crate::tenant::DEFAULT_MAX_ATTEMPTS;
/// The error code of an attempt whose lease expired.
pub const LEASE_EXPIRED_CODE: &str = "lease_expired";

/// The heartbeat interval advised for a lease of `lease`: a third of it,
/// at most [`MAX_HEARTBEAT_INTERVAL`], so two heartbeats may be lost
/// before the lease expires.
pub fn heartbeat_interval(lease: Duration) -> Duration {
    // Whole milliseconds: the API speaks in them.
    let third = u64::try_from(lease.as_millis() / 3).unwrap_or(u64::MAX);
    Duration::from_millis(third).min(MAX_HEARTBEAT_INTERVAL)
}

/// Why a request body was refused. Safe to show to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullRequestError {
    #[error("worker_id is required")]
    MissingWorkerId,
    #[error("invalid worker_id: {0}")]
    WorkerId(IdError),
    #[error("max_events must be between 1 and {MAX_EVENTS_PER_CLAIM}")]
    MaxEvents,
    #[error("queues must name 1 to {MAX_QUEUES_PER_CLAIM} queues (omit it for all)")]
    QueueCount,
    #[error("invalid queues item: {0}")]
    Queue(IdError),
    #[error("{field} must be between {min_ms} and {max_ms}")]
    OutOfRange {
        field: &'static str,
        min_ms: u64,
        max_ms: u64,
    },
    #[error("error.code must be 1 to {MAX_ERROR_CODE_LEN} letters, digits, '_', '-' or '.'")]
    ErrorCode,
    #[error("error.message is longer than {MAX_ERROR_MESSAGE_LEN} bytes")]
    ErrorMessage,
    #[error("retry_after_ms cannot be given with permanent: true")]
    RetryAfterPermanent,
    #[error("result is larger than {MAX_RESULT_BYTES} bytes")]
    ResultTooLarge,
}

/// `POST /v1/tenants/{tenant}/leases`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    pub worker_id: Option<String>,
    pub max_events: Option<u64>,
    pub lease_ms: Option<u64>,
    pub wait_ms: Option<u64>,
    pub queues: Option<Vec<String>>,
}

/// A validated [`ClaimBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    pub worker: WorkerId,
    /// 1 to [`MAX_EVENTS_PER_CLAIM`].
    pub max_events: u32,
    /// [`MIN_LEASE`] to [`MAX_LEASE`].
    pub lease: Duration,
    /// Up to [`MAX_WAIT`].
    pub wait: Duration,
    /// Only events of these queues (1 to [`MAX_QUEUES_PER_CLAIM`]); all
    /// of the tenant's: `None`.
    pub queues: Option<BTreeSet<QueueName>>,
    /// Most payload bytes the granted events carry together: a claim stops
    /// before the event that would pass it (one event is always granted).
    /// Not in the body: the API sets its answer budget. Validation: no
    /// bound.
    pub max_bytes: usize,
}

impl ClaimBody {
    /// # Errors
    /// A missing or invalid worker id, or a number out of its range.
    pub fn validate(self) -> Result<ClaimRequest, PullRequestError> {
        let worker = self.worker_id.ok_or(PullRequestError::MissingWorkerId)?;
        let worker = WorkerId::new(worker).map_err(PullRequestError::WorkerId)?;
        let max_events = match self.max_events {
            None => DEFAULT_EVENTS_PER_CLAIM,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_EVENTS_PER_CLAIM).contains(n))
                .ok_or(PullRequestError::MaxEvents)?,
        };
        let queues = self
            .queues
            .map(|names| {
                if !(1..=MAX_QUEUES_PER_CLAIM).contains(&names.len()) {
                    return Err(PullRequestError::QueueCount);
                }
                names
                    .into_iter()
                    .map(|name| QueueName::new(name).map_err(PullRequestError::Queue))
                    .collect()
            })
            .transpose()?;
        Ok(ClaimRequest {
            worker,
            max_events,
            queues,
            max_bytes: usize::MAX,
            lease: millis(
                "lease_ms",
                self.lease_ms,
                DEFAULT_LEASE,
                MIN_LEASE,
                MAX_LEASE,
            )?,
            wait: millis(
                "wait_ms",
                self.wait_ms,
                DEFAULT_WAIT,
                Duration::ZERO,
                MAX_WAIT,
            )?,
        })
    }
}

/// `POST /v1/leases/{lease_id}/heartbeat`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBody {
    pub extend_ms: Option<u64>,
}

impl HeartbeatBody {
    /// The extension asked for; `None`: the lease's own length.
    ///
    /// # Errors
    /// `extend_ms` outside [`MIN_LEASE`]..=[`MAX_LEASE`].
    pub fn validate(self) -> Result<Option<Duration>, PullRequestError> {
        self.extend_ms
            .map(|ms| millis("extend_ms", Some(ms), MIN_LEASE, MIN_LEASE, MAX_LEASE))
            .transpose()
    }
}

/// `POST /v1/leases/{lease_id}/complete`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    pub result: Option<serde_json::Value>,
}

impl CompleteBody {
    /// The result as JSON text, if one was given.
    ///
    /// # Errors
    /// The result's JSON text is larger than [`MAX_RESULT_BYTES`].
    pub fn validate(self) -> Result<Option<String>, PullRequestError> {
        let Some(result) = self.result else {
            return Ok(None);
        };
        let text = result.to_string();
        if text.len() > MAX_RESULT_BYTES {
            return Err(PullRequestError::ResultTooLarge);
        }
        Ok(Some(text))
    }
}

/// The worker's account of a failure.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// `POST /v1/leases/{lease_id}/fail`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailBody {
    pub error: ErrorBody,
    pub retry_after_ms: Option<u64>,
    #[serde(default)]
    pub permanent: bool,
}

/// A validated [`FailBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailRequest {
    /// Letters, digits, `_`, `-`, `.`; 1 to [`MAX_ERROR_CODE_LEN`] bytes.
    pub code: String,
    pub message: String,
    /// `None`: the event's back-off decides.
    pub retry_after: Option<Duration>,
    /// No further attempt: the event fails now.
    pub permanent: bool,
}

impl FailRequest {
    /// How the attempt history shows it.
    pub fn describe(&self) -> String {
        if self.message.is_empty() {
            self.code.clone()
        } else {
            format!("{}: {}", self.code, self.message)
        }
    }
}

impl FailBody {
    /// # Errors
    /// A bad code, a long message, `retry_after_ms` out of range or given
    /// with `permanent`.
    pub fn validate(self) -> Result<FailRequest, PullRequestError> {
        let code = self.error.code;
        let code_ok = !code.is_empty()
            && code.len() <= MAX_ERROR_CODE_LEN
            && code
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !code_ok {
            return Err(PullRequestError::ErrorCode);
        }
        if self.error.message.len() > MAX_ERROR_MESSAGE_LEN {
            return Err(PullRequestError::ErrorMessage);
        }
        if self.permanent && self.retry_after_ms.is_some() {
            return Err(PullRequestError::RetryAfterPermanent);
        }
        let retry_after = self
            .retry_after_ms
            .map(|ms| {
                millis(
                    "retry_after_ms",
                    Some(ms),
                    Duration::ZERO,
                    Duration::ZERO,
                    MAX_DELAY,
                )
            })
            .transpose()?;
        Ok(FailRequest {
            code,
            // Control characters would garble logs and tables; shown as
            // spaces instead of refusing a worker's stack trace.
            message: self
                .error
                .message
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
            retry_after,
            permanent: self.permanent,
        })
    }
}

/// `POST /v1/leases/{lease_id}/release`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    pub delay_ms: Option<u64>,
}

impl ReleaseBody {
    /// How long until the event may be leased again.
    ///
    /// # Errors
    /// `delay_ms` above [`MAX_DELAY`].
    pub fn validate(self) -> Result<Duration, PullRequestError> {
        millis(
            "delay_ms",
            self.delay_ms,
            Duration::ZERO,
            Duration::ZERO,
            MAX_DELAY,
        )
    }
}

/// `value` milliseconds (`default` when absent) within `min..=max`.
fn millis(
    field: &'static str,
    value: Option<u64>,
    default: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, PullRequestError> {
    let Some(ms) = value else {
        return Ok(default);
    };
    let value = Duration::from_millis(ms);
    if value < min || value > max {
        return Err(PullRequestError::OutOfRange {
            field,
            min_ms: min.as_millis() as u64,
            max_ms: max.as_millis() as u64,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(json: &str) -> Result<ClaimRequest, PullRequestError> {
        serde_json::from_str::<ClaimBody>(json).unwrap().validate()
    }

    #[test]
    fn a_claim_gets_defaults_and_its_bounds() {
        let request = claim(r#"{"worker_id": "w-7"}"#).unwrap();
        assert_eq!(request.worker.as_str(), "w-7");
        assert_eq!(
            (request.max_events, request.lease, request.wait),
            (1, DEFAULT_LEASE, Duration::ZERO)
        );
        let request =
            claim(r#"{"worker_id": "w", "max_events": 100, "lease_ms": 900000, "wait_ms": 30000}"#)
                .unwrap();
        assert_eq!(
            (request.max_events, request.lease, request.wait),
            (100, MAX_LEASE, MAX_WAIT)
        );
        let request = claim(r#"{"worker_id": "w", "lease_ms": 1000}"#).unwrap();
        assert_eq!(request.lease, MIN_LEASE);
    }

    #[test]
    fn a_claim_out_of_bounds_is_refused_clearly() {
        assert_eq!(claim("{}"), Err(PullRequestError::MissingWorkerId));
        assert!(matches!(
            claim(r#"{"worker_id": ""}"#),
            Err(PullRequestError::WorkerId(IdError::Empty { .. }))
        ));
        assert!(matches!(
            claim(&format!(r#"{{"worker_id": "{}"}}"#, "w".repeat(129))),
            Err(PullRequestError::WorkerId(IdError::TooLong { .. }))
        ));
        for n in [0, 101, u64::MAX] {
            assert_eq!(
                claim(&format!(r#"{{"worker_id": "w", "max_events": {n}}}"#)),
                Err(PullRequestError::MaxEvents)
            );
        }
        for body in [
            r#"{"worker_id": "w", "lease_ms": 999}"#,
            r#"{"worker_id": "w", "lease_ms": 900001}"#,
            r#"{"worker_id": "w", "wait_ms": 30001}"#,
            r#"{"worker_id": "w", "wait_ms": 18446744073709551615}"#,
        ] {
            let error = claim(body).unwrap_err();
            assert!(
                matches!(error, PullRequestError::OutOfRange { .. }),
                "{body}"
            );
            assert!(error.to_string().contains("_ms must be between"));
        }
        assert!(serde_json::from_str::<ClaimBody>(r#"{"worker_id": "w", "max": 1}"#).is_err());
        assert!(serde_json::from_str::<ClaimBody>(r#"{"max_events": -1}"#).is_err());
    }

    #[test]
    fn a_claim_may_name_its_queues() {
        assert_eq!(claim(r#"{"worker_id": "w"}"#).unwrap().queues, None);
        let request = claim(r#"{"worker_id": "w", "queues": ["b", "a", "b"]}"#).unwrap();
        let names: Vec<&str> = request
            .queues
            .iter()
            .flatten()
            .map(|q| q.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            claim(r#"{"worker_id": "w", "queues": []}"#),
            Err(PullRequestError::QueueCount)
        );
        let many: Vec<String> = (0..=MAX_QUEUES_PER_CLAIM)
            .map(|i| format!("q{i}"))
            .collect();
        let body = serde_json::json!({ "worker_id": "w", "queues": many }).to_string();
        assert_eq!(claim(&body), Err(PullRequestError::QueueCount));
        let bad = claim(r#"{"worker_id": "w", "queues": ["a b"]}"#).unwrap_err();
        assert!(
            bad.to_string().starts_with("invalid queues item: queue"),
            "{bad}"
        );
    }

    #[test]
    fn heartbeat_release_and_complete_bodies() {
        let heartbeat = |json: &str| {
            serde_json::from_str::<HeartbeatBody>(json)
                .unwrap()
                .validate()
        };
        assert_eq!(heartbeat("{}"), Ok(None));
        assert_eq!(
            heartbeat(r#"{"extend_ms": 30000}"#),
            Ok(Some(Duration::from_secs(30)))
        );
        assert!(heartbeat(r#"{"extend_ms": 10}"#).is_err());
        assert!(heartbeat(r#"{"extend_ms": 900001}"#).is_err());
        let release = |json: &str| {
            serde_json::from_str::<ReleaseBody>(json)
                .unwrap()
                .validate()
        };
        assert_eq!(release("{}"), Ok(Duration::ZERO));
        assert_eq!(
            release(r#"{"delay_ms": 500}"#),
            Ok(Duration::from_millis(500))
        );
        assert!(release(r#"{"delay_ms": 86400001}"#).is_err());
        let complete = |json: &str| {
            serde_json::from_str::<CompleteBody>(json)
                .unwrap()
                .validate()
        };
        assert_eq!(complete("{}"), Ok(None));
        assert_eq!(
            complete(r#"{"result": {"ok": true}}"#),
            Ok(Some(r#"{"ok":true}"#.to_string()))
        );
        let big = format!(r#"{{"result": "{}"}}"#, "x".repeat(MAX_RESULT_BYTES));
        assert_eq!(complete(&big), Err(PullRequestError::ResultTooLarge));
    }

    #[test]
    fn fail_bodies() {
        let fail = |json: &str| serde_json::from_str::<FailBody>(json).unwrap().validate();
        let retriable = fail(r#"{"error": {"code": "db_down", "message": "a\nb"}}"#).unwrap();
        assert_eq!(retriable.retry_after, None);
        assert!(!retriable.permanent);
        assert_eq!(retriable.describe(), "db_down: a b");
        let later = fail(r#"{"error": {"code": "x"}, "retry_after_ms": 1500}"#).unwrap();
        assert_eq!(later.retry_after, Some(Duration::from_millis(1500)));
        assert_eq!(later.describe(), "x");
        assert!(
            fail(r#"{"error": {"code": "bad"}, "permanent": true}"#)
                .unwrap()
                .permanent
        );
        assert_eq!(
            fail(r#"{"error": {"code": "x"}, "permanent": true, "retry_after_ms": 1}"#),
            Err(PullRequestError::RetryAfterPermanent)
        );
        for code in ["", "has space", "ü", &"c".repeat(65)] {
            assert_eq!(
                fail(&format!(r#"{{"error": {{"code": "{code}"}}}}"#)),
                Err(PullRequestError::ErrorCode)
            );
        }
        let long = format!(
            r#"{{"error": {{"code": "x", "message": "{}"}}}}"#,
            "m".repeat(4097)
        );
        assert_eq!(fail(&long), Err(PullRequestError::ErrorMessage));
        assert!(fail(r#"{"error": {"code": "x"}, "retry_after_ms": 86400001}"#).is_err());
        assert!(serde_json::from_str::<FailBody>(r#"{"permanent": true}"#).is_err());
    }

    #[test]
    fn heartbeat_interval_is_a_third_capped_at_ten_seconds() {
        assert_eq!(heartbeat_interval(MIN_LEASE), Duration::from_millis(333));
        assert_eq!(
            heartbeat_interval(Duration::from_secs(15)),
            Duration::from_secs(5)
        );
        assert_eq!(heartbeat_interval(MAX_LEASE), MAX_HEARTBEAT_INTERVAL);
    }
}
