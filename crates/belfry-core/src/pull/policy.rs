//! How many attempts a pull event gets, when the next one comes, and its
//! execution deadline.

use std::time::Duration;

use crate::event::PullSettings;
use crate::retry::RetryPolicy;
use crate::tenant::PullTarget;
use crate::time::Timestamp;

use super::limits::DEFAULT_MAX_ATTEMPTS;

/// The attempts of one pull event: a cap on their number and the retry
/// policy of push deliveries (its back-off, and its backlog limit as the
/// execution deadline). The event's own values, else its tenant's.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptPolicy {
    /// Attempts (failed or expired leases) after which the event fails;
    /// at least 1. Releases do not count.
    pub max_attempts: u32,
    pub retry: RetryPolicy,
}

impl Default for AttemptPolicy {
    fn default() -> Self {
        AttemptPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry: RetryPolicy::default(),
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
    /// The execution deadline passed.
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
                format!("gave up after {attempt} attempts (deadline reached): {error}")
            }
        }
    }
}

impl AttemptPolicy {
    /// The policy of an event with `event`'s settings, of a tenant with
    /// `tenant`'s defaults, on a node with the retry policy `node`: the
    /// event's own cap, else its tenant's, else
    /// [`DEFAULT_MAX_ATTEMPTS`]; the event's own back-off, else its
    /// tenant's, else the node's delays. The deadline (the backlog limit)
    /// is always the node's.
    pub fn resolve(node: &RetryPolicy, tenant: &PullTarget, event: &PullSettings) -> AttemptPolicy {
        AttemptPolicy {
            max_attempts: event.max_attempts.unwrap_or_else(|| tenant.max_attempts()),
            retry: event
                .backoff
                .or(tenant.backoff)
                .map_or_else(|| node.clone(), |backoff| backoff.apply_to(node)),
        }
    }

    /// The instant after which no lease of the event is extended and no
    /// retry is scheduled: `event_time` plus the backlog limit.
    pub fn deadline(&self, event_time: Timestamp) -> Timestamp {
        event_time.plus(self.retry.backlog_limit)
    }

    /// When attempt number `attempt`, failed at `now`, is followed by the
    /// next one, or why it is not. `retry_after` (the worker's wish)
    /// replaces the back-off; either is pulled in to the deadline, as the
    /// push path's last retry is.
    ///
    /// # Errors
    /// The attempt is the last: attempts exhausted or deadline passed.
    pub fn next_attempt(
        &self,
        attempt: u32,
        event_time: Timestamp,
        now: Timestamp,
        retry_after: Option<Duration>,
    ) -> Result<Timestamp, GiveUp> {
        if attempt >= self.max_attempts.max(1) {
            return Err(GiveUp::AttemptsExhausted);
        }
        let deadline = self.deadline(event_time);
        if now >= deadline {
            return Err(GiveUp::DeadlineReached);
        }
        let delay = match retry_after {
            Some(delay) => delay,
            None => self
                .retry
                .next_delay(attempt.max(1), event_time, now)
                .ok_or(GiveUp::DeadlineReached)?,
        };
        Ok(now.plus(delay).min(deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn policy(max_attempts: u32) -> AttemptPolicy {
        AttemptPolicy {
            max_attempts,
            retry: RetryPolicy {
                backlog_limit: Duration::from_secs(60),
                ..RetryPolicy::default()
            },
        }
    }

    #[test]
    fn back_off_comes_from_the_retry_policy() {
        let p = policy(10);
        assert_eq!(p.next_attempt(1, ts(0), ts(100), None), Ok(ts(1_100)));
        assert_eq!(p.next_attempt(5, ts(0), ts(100), None), Ok(ts(4_100)));
    }

    #[test]
    fn retry_after_replaces_it_and_both_stop_at_the_deadline() {
        let p = policy(10);
        assert_eq!(
            p.next_attempt(1, ts(0), ts(100), Some(Duration::from_millis(5))),
            Ok(ts(105))
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(59_000), Some(Duration::from_secs(30))),
            Ok(ts(60_000))
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(60_000), Some(Duration::ZERO)),
            Err(GiveUp::DeadlineReached)
        );
        assert_eq!(
            p.next_attempt(1, ts(0), ts(60_000), None),
            Err(GiveUp::DeadlineReached)
        );
        assert_eq!(p.deadline(ts(5)), ts(60_005));
    }

    #[test]
    fn the_events_settings_come_first_then_its_tenants_then_the_nodes() {
        let node = RetryPolicy {
            backlog_limit: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        let backoff = |initial| crate::retry::Backoff::new(initial, 2.0, 10_000).unwrap();
        let tenant = PullTarget {
            max_attempts: Some(7),
            backoff: Some(backoff(300)),
            queues: None,
        };
        let event = PullSettings {
            queue: None,
            max_attempts: Some(2),
            backoff: Some(backoff(50)),
        };
        let first_retry = |policy: &AttemptPolicy| policy.next_attempt(1, ts(0), ts(0), None);

        let own = AttemptPolicy::resolve(&node, &tenant, &event);
        assert_eq!(own.max_attempts, 2);
        assert_eq!(first_retry(&own), Ok(ts(50)));
        assert_eq!(
            own.retry.backlog_limit, node.backlog_limit,
            "the node's deadline"
        );

        let tenants = AttemptPolicy::resolve(&node, &tenant, &PullSettings::default());
        assert_eq!(tenants.max_attempts, 7);
        assert_eq!(first_retry(&tenants), Ok(ts(300)));
        assert_eq!(tenants.retry.backlog_limit, node.backlog_limit);

        let nodes = AttemptPolicy::resolve(&node, &PullTarget::default(), &PullSettings::default());
        assert_eq!(nodes.max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(nodes.retry, node);
    }

    #[test]
    fn attempts_are_capped_and_at_least_one_is_made() {
        assert_eq!(
            policy(3).next_attempt(3, ts(0), ts(1), None),
            Err(GiveUp::AttemptsExhausted)
        );
        assert!(policy(3).next_attempt(2, ts(0), ts(1), None).is_ok());
        assert_eq!(
            policy(0).next_attempt(1, ts(0), ts(1), None),
            Err(GiveUp::AttemptsExhausted)
        );
        assert_eq!(
            GiveUp::AttemptsExhausted.describe(3, "boom"),
            "gave up after 3 attempts (max_attempts reached): boom"
        );
        assert_eq!(GiveUp::Permanent.describe(1, "bad input"), "bad input");
    }
}
