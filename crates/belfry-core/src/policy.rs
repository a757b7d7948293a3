//! How the attempts of one event go, whatever its channel: how many, how
//! far apart, and until when any may start. (How long one attempt may
//! take is the sink's to apply: the event's `attempt_timeout_ms`, else its
//! HTTP tenant's `timeout_ms`, else the node's, within the node's cap.)
//!
//! One resolution order for every field: the event's own setting, else
//! its tenant's default, else the node's. One rule for the next attempt
//! ([`DeliveryPolicy::next_attempt`]), used by the push path's recorded
//! attempts and by pull leases alike.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::QueueName;
use crate::retry::{Backoff, RetryPolicy};
use crate::tenant::{DEFAULT_MAX_ATTEMPTS, DeliveryDefaults};
use crate::time::Timestamp;

/// An event's own delivery settings (`docs/api.md`, delivery policy): its
/// attempt cap, back-off, attempt timeout and expiry, each else its
/// tenant's, else the node's ([`DeliveryPolicy::resolve`]);
/// and, for pull tenants' workers (`docs/pull.md`), its named queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSettings {
    /// `None`: the `default` queue. Push tenants' deliveries ignore it.
    pub queue: Option<QueueName>,
    pub max_attempts: Option<u32>,
    pub backoff: Option<Backoff>,
    /// How long one pushed attempt may take, within the node's cap.
    #[serde(default)]
    pub attempt_timeout_ms: Option<u64>,
    /// No attempt starts at or after this instant.
    #[serde(default)]
    pub expire_at: Option<Timestamp>,
    /// No attempt starts this long or longer after the event's instant.
    #[serde(default)]
    pub max_age_ms: Option<u64>,
}

impl EventSettings {
    /// The queue the event is claimed from.
    pub fn queue(&self) -> QueueName {
        self.queue.clone().unwrap_or_else(QueueName::default_queue)
    }

    /// Nothing set: the event takes its queue and policy from its tenant
    /// and node.
    pub fn is_default(&self) -> bool {
        *self == EventSettings::default()
    }
}

/// The attempts of one event: a cap on their number, the back-off and
/// backlog limit, and the expiry.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryPolicy {
    /// Attempts after which the event fails; at least 1. A pull event's
    /// releases do not count.
    pub max_attempts: u32,
    pub retry: RetryPolicy,
    /// No attempt starts at or after this instant: the event ends
    /// `expired` instead.
    pub expires_at: Option<Timestamp>,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        DeliveryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry: RetryPolicy::default(),
            expires_at: None,
        }
    }
}

/// The node's part of a policy: its retry policy and the attempt cap of
/// events whose event and tenant set none.
#[derive(Debug, Clone, Copy)]
pub struct NodeDefaults<'a> {
    pub retry: &'a RetryPolicy,
    pub max_attempts: u32,
}

impl<'a> NodeDefaults<'a> {
    /// Push deliveries: attempts until the backlog limit, uncounted.
    pub fn push(retry: &'a RetryPolicy) -> Self {
        NodeDefaults {
            retry,
            max_attempts: u32::MAX,
        }
    }

    /// Pull leases: [`DEFAULT_MAX_ATTEMPTS`] attempts.
    pub fn pull(retry: &'a RetryPolicy) -> Self {
        NodeDefaults {
            retry,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// Why a failed attempt is the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The worker said so (`permanent: true`).
    Permanent,
    /// `max_attempts` attempts were made.
    AttemptsExhausted,
    /// The backlog limit (the execution deadline) passed, or the receiver
    /// asked for a next attempt past it.
    DeadlineReached,
}

impl GiveUp {
    /// The reason recorded as the event's last error.
    pub fn describe(self, attempt: u32, error: &str) -> String {
        match self {
            GiveUp::Permanent => error.to_string(),
            GiveUp::AttemptsExhausted => {
                format!("gave up after {attempt} attempts (max_attempts reached): {error}")
            }
            GiveUp::DeadlineReached => {
                format!("gave up after {attempt} attempts (backlog limit reached): {error}")
            }
        }
    }
}

/// Who asked for the delay before the next attempt, if anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// Nobody: the back-off decides.
    Nothing,
    /// A pull worker's `retry_after`: replaces the back-off, and is pulled
    /// in to the backlog limit like the back-off's last retry.
    Worker(Duration),
    /// A receiver's `Retry-After`: the next attempt comes no sooner. One it
    /// puts past the backlog limit is not made (the event fails now).
    Receiver(Duration),
}

impl DeliveryPolicy {
    /// The policy of an event with `event`'s settings and instant
    /// `event_time`, of a tenant with `tenant`'s defaults, on a node with
    /// `node`'s: each field the event's, else the tenant's, else the
    /// node's. The backlog limit is always the node's. The expiry is the
    /// earlier of the event's `expire_at` and its instant plus its (else
    /// its tenant's) `max_age_ms`.
    pub fn resolve(
        node: NodeDefaults<'_>,
        tenant: &DeliveryDefaults,
        event: &EventSettings,
        event_time: Timestamp,
    ) -> DeliveryPolicy {
        let max_age = event
            .max_age_ms
            .or(tenant.max_age_ms)
            .map(|ms| event_time.plus(Duration::from_millis(ms)));
        let expires_at = match (event.expire_at, max_age) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        DeliveryPolicy {
            max_attempts: event
                .max_attempts
                .or(tenant.max_attempts)
                .unwrap_or(node.max_attempts),
            retry: event.backoff.or(tenant.backoff).map_or_else(
                || node.retry.clone(),
                |backoff| backoff.apply_to(node.retry),
            ),
            expires_at,
        }
    }

    /// The instant after which no lease of the event is extended and no
    /// retry is scheduled: `event_time` plus the backlog limit.
    pub fn deadline(&self, event_time: Timestamp) -> Timestamp {
        event_time.plus(self.retry.backlog_limit)
    }

    /// Whether an attempt starting at `now` would start at or past the
    /// expiry: the event ends `expired` instead.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|expiry| now >= expiry)
    }

    /// When attempt number `attempt`, failed at `now`, is followed by the
    /// next one, or why it is not.
    ///
    /// The next attempt comes after the back-off (pulled in to the backlog
    /// limit), or after what was [`Asked`]. It never comes past the
    /// expiry: one that would is due at the expiry instead, where the
    /// fire-time check ends the event `expired` without an attempt.
    ///
    /// # Errors
    /// The attempt is the last: attempts exhausted, or the backlog limit
    /// passed (or would pass before the receiver's `Retry-After`).
    pub fn next_attempt(
        &self,
        attempt: u32,
        event_time: Timestamp,
        now: Timestamp,
        asked: Asked,
    ) -> Result<Timestamp, GiveUp> {
        if attempt >= self.max_attempts.max(1) {
            return Err(GiveUp::AttemptsExhausted);
        }
        let deadline = self.deadline(event_time);
        let next = match self.expires_at {
            Some(expiry) if now >= expiry => expiry,
            _ if now >= deadline => return Err(GiveUp::DeadlineReached),
            _ => match asked {
                Asked::Nothing => now.plus(
                    self.retry
                        .next_delay(attempt.max(1), event_time, now)
                        .ok_or(GiveUp::DeadlineReached)?,
                ),
                Asked::Worker(delay) => now.plus(delay).min(deadline),
                Asked::Receiver(delay) => {
                    let at = now.plus(delay);
                    let past_expiry = self.expires_at.is_some_and(|expiry| at >= expiry);
                    if at > deadline && !past_expiry {
                        return Err(GiveUp::DeadlineReached);
                    }
                    at
                }
            },
        };
        Ok(self.expires_at.map_or(next, |expiry| next.min(expiry)))
    }
}

/// What a receiver said about the attempts to come, besides its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Steer {
    /// `429` or `503` with `Retry-After`: no attempt before then.
    RetryAfter(RetryAfter),
    /// `410 Gone`: the endpoint is gone; the event failed.
    Gone,
}

/// A `Retry-After` value: delta-seconds, or an HTTP-date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryAfter {
    Seconds(u64),
    At(Timestamp),
}

impl RetryAfter {
    /// The most a receiver may ask for: a day, the longest back-off.
    pub const MAX: Duration = Duration::from_secs(24 * 3600);

    /// Parses a header value: delta-seconds (digits only) or an HTTP-date
    /// (`Sun, 06 Nov 1994 08:49:37 GMT`); `None` for anything else.
    pub fn parse(value: &str) -> Option<RetryAfter> {
        let value = value.trim();
        if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
            // Too many digits for a u64 is still "very long".
            return Some(RetryAfter::Seconds(value.parse().unwrap_or(u64::MAX)));
        }
        let date = jiff::fmt::rfc2822::parse(value).ok()?;
        Some(RetryAfter::At(Timestamp::from_millis(
            date.timestamp().as_millisecond(),
        )))
    }

    /// The delay it asks for from `now` (an instant already past: none),
    /// at most [`RetryAfter::MAX`].
    pub fn delay_from(self, now: Timestamp) -> Duration {
        let delay = match self {
            RetryAfter::Seconds(seconds) => Duration::from_secs(seconds),
            RetryAfter::At(at) => now.until(at),
        };
        delay.min(Self::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn policy(max_attempts: u32) -> DeliveryPolicy {
        DeliveryPolicy {
            max_attempts,
            retry: RetryPolicy {
                backlog_limit: Duration::from_secs(60),
                ..RetryPolicy::default()
            },
            ..DeliveryPolicy::default()
        }
    }

    #[test]
    fn back_off_comes_from_the_retry_policy() {
        let p = policy(10);
        assert_eq!(
            p.next_attempt(1, ts(0), ts(100), Asked::Nothing),
            Ok(ts(1_100))
        );
        assert_eq!(
            p.next_attempt(5, ts(0), ts(100), Asked::Nothing),
            Ok(ts(4_100))
        );
    }

    #[test]
    fn retry_after_replaces_it_and_both_stop_at_the_deadline() {
        let p = policy(10);
        let worker = |ms| Asked::Worker(Duration::from_millis(ms));
        assert_eq!(p.next_attempt(1, ts(0), ts(100), worker(5)), Ok(ts(105)));
        assert_eq!(
            p.next_attempt(1, ts(0), ts(59_000), worker(30_000)),
            Ok(ts(60_000))
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(60_000), worker(0)),
            Err(GiveUp::DeadlineReached)
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(60_000), Asked::Nothing),
            Err(GiveUp::DeadlineReached)
        );
        assert_eq!(p.deadline(ts(5)), ts(60_005));
    }

    #[test]
    fn a_receivers_retry_after_is_a_floor_that_never_passes_the_backlog_limit() {
        let p = policy(10);
        let receiver = |ms| Asked::Receiver(Duration::from_millis(ms));
        // Longer than the back-off (1 s): exactly as asked.
        assert_eq!(
            p.next_attempt(1, ts(0), ts(100), receiver(2_000)),
            Ok(ts(2_100))
        );
        // Shorter: still as asked (it replaces the back-off).
        assert_eq!(p.next_attempt(1, ts(0), ts(100), receiver(10)), Ok(ts(110)));
        // Right at the deadline is allowed; past it, the event fails now.
        assert_eq!(
            p.next_attempt(1, ts(0), ts(50_000), receiver(10_000)),
            Ok(ts(60_000))
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(50_000), receiver(10_001)),
            Err(GiveUp::DeadlineReached)
        );
        assert_eq!(
            GiveUp::DeadlineReached.describe(2, "HTTP 503"),
            "gave up after 2 attempts (backlog limit reached): HTTP 503"
        );
    }

    #[test]
    fn no_attempt_is_due_past_the_expiry() {
        let p = DeliveryPolicy {
            expires_at: Some(ts(5_000)),
            ..policy(10)
        };
        // The back-off's retry would come after the expiry: due at it.
        assert_eq!(
            p.next_attempt(1, ts(0), ts(4_500), Asked::Nothing),
            Ok(ts(5_000))
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(3_000), Asked::Nothing),
            Ok(ts(4_000))
        );
        // A receiver's wish past the expiry, even past the deadline: the
        // event ends expired at its expiry.
        assert_eq!(
            p.next_attempt(1, ts(0), ts(100), Asked::Receiver(Duration::from_secs(600))),
            Ok(ts(5_000))
        );
        // An attempt that ended after the expiry: due at once.
        assert_eq!(
            p.next_attempt(1, ts(0), ts(7_000), Asked::Nothing),
            Ok(ts(5_000))
        );
        assert!(!p.expired(ts(4_999)));
        assert!(p.expired(ts(5_000)));
        // The attempt cap still comes first.
        assert_eq!(
            p.next_attempt(10, ts(0), ts(7_000), Asked::Nothing),
            Err(GiveUp::AttemptsExhausted)
        );
    }

    #[test]
    fn the_events_settings_come_first_then_its_tenants_then_the_nodes() {
        let node = RetryPolicy {
            backlog_limit: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        let backoff = |initial| Backoff::new(initial, 2.0, 10_000).unwrap();
        let tenant = DeliveryDefaults {
            max_attempts: Some(7),
            backoff: Some(backoff(300)),
            max_age_ms: Some(30_000),
        };
        let event = EventSettings {
            max_attempts: Some(2),
            backoff: Some(backoff(50)),
            attempt_timeout_ms: Some(500),
            max_age_ms: Some(10_000),
            ..EventSettings::default()
        };
        let first_retry =
            |policy: &DeliveryPolicy| policy.next_attempt(1, ts(0), ts(0), Asked::Nothing);

        let own = DeliveryPolicy::resolve(NodeDefaults::pull(&node), &tenant, &event, ts(1_000));
        assert_eq!(own.max_attempts, 2);
        assert_eq!(first_retry(&own), Ok(ts(50)));
        assert_eq!(own.expires_at, Some(ts(11_000)));
        assert_eq!(
            own.retry.backlog_limit, node.backlog_limit,
            "the node's deadline"
        );

        let none = EventSettings::default();
        let tenants = DeliveryPolicy::resolve(NodeDefaults::push(&node), &tenant, &none, ts(1_000));
        assert_eq!(tenants.max_attempts, 7);
        assert_eq!(first_retry(&tenants), Ok(ts(300)));
        assert_eq!(tenants.expires_at, Some(ts(31_000)));
        assert_eq!(tenants.retry.backlog_limit, node.backlog_limit);

        let defaults = DeliveryDefaults::default();
        let pull = DeliveryPolicy::resolve(NodeDefaults::pull(&node), &defaults, &none, ts(0));
        assert_eq!(pull.max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(pull.retry, node);
        assert_eq!(pull.expires_at, None);
        let push = DeliveryPolicy::resolve(NodeDefaults::push(&node), &defaults, &none, ts(0));
        assert_eq!(push.max_attempts, u32::MAX, "push attempts are not counted");
    }

    #[test]
    fn the_expiry_is_the_earlier_of_the_instant_and_the_maximum_age() {
        let node = RetryPolicy::default();
        let tenant = DeliveryDefaults {
            max_age_ms: Some(5_000),
            ..DeliveryDefaults::default()
        };
        let resolve = |expire_at: Option<i64>| {
            let event = EventSettings {
                expire_at: expire_at.map(ts),
                ..EventSettings::default()
            };
            DeliveryPolicy::resolve(NodeDefaults::push(&node), &tenant, &event, ts(1_000))
                .expires_at
        };
        assert_eq!(resolve(None), Some(ts(6_000)));
        assert_eq!(resolve(Some(3_000)), Some(ts(3_000)));
        assert_eq!(resolve(Some(9_000)), Some(ts(6_000)));
    }

    #[test]
    fn attempts_are_capped_and_at_least_one_is_made() {
        assert_eq!(
            policy(3).next_attempt(3, ts(0), ts(1), Asked::Nothing),
            Err(GiveUp::AttemptsExhausted)
        );
        assert!(
            policy(3)
                .next_attempt(2, ts(0), ts(1), Asked::Nothing)
                .is_ok()
        );
        assert_eq!(
            policy(0).next_attempt(1, ts(0), ts(1), Asked::Nothing),
            Err(GiveUp::AttemptsExhausted)
        );
        assert_eq!(
            GiveUp::AttemptsExhausted.describe(3, "boom"),
            "gave up after 3 attempts (max_attempts reached): boom"
        );
        assert_eq!(GiveUp::Permanent.describe(1, "bad input"), "bad input");
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates_against_the_clock() {
        let now = Timestamp::parse_rfc3339("2030-01-01T00:00:00Z").unwrap();
        let parse = |text| RetryAfter::parse(text).map(|asked| asked.delay_from(now));
        assert_eq!(parse("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse("99999999999999999999999"), Some(RetryAfter::MAX));
        assert_eq!(
            parse("Tue, 01 Jan 2030 00:00:07 GMT"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse("Mon, 31 Dec 2029 23:59:00 GMT"), Some(Duration::ZERO));
        for bad in ["", "-1", "1.5", "soon", "2030-01-01T00:00:07Z"] {
            assert_eq!(RetryAfter::parse(bad), None, "{bad:?}");
        }
    }
}
