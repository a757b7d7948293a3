//! The retry policy and the single delivery classification.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// How one delivery attempt ended. Every sink classifies into exactly these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The receiver accepted the event (HTTP 2xx, Kafka ack).
    Delivered,
    /// A transient failure (5xx, 3xx, timeout, refused): try again later.
    Retry,
    /// The receiver refused the event for good (HTTP 4xx): do not retry.
    Permanent,
}

/// When to retry a failed delivery.
///
/// Delays start at `initial_delay` and grow by `multiplier` per failed
/// attempt, capped at `max_delay`. With BigBen's defaults the first
/// `fast_retries` (3) come after 1 s, 2 s and 4 s; after those the schedule
/// keeps growing (8 s, 16 s, ... up to `max_delay`) until `backlog_limit`
/// after the event's instant, when the event fails for good. Every retry is
/// persisted, so none is lost to a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryPolicy {
    /// Retries in the quick phase (BigBen's `max.retries`); documentation
    /// and metrics distinguish the phases, the arithmetic does not.
    pub fast_retries: u32,
    #[serde(with = "crate::time::serde_millis", rename = "initial_delay_ms")]
    pub initial_delay: Duration,
    pub multiplier: f64,
    #[serde(with = "crate::time::serde_millis", rename = "max_delay_ms")]
    pub max_delay: Duration,
    /// After this long past the event's instant, stop retrying.
    #[serde(with = "crate::time::serde_millis", rename = "backlog_limit_ms")]
    pub backlog_limit: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            fast_retries: 3,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(3600),
            backlog_limit: Duration::from_secs(24 * 3600),
        }
    }
}

impl RetryPolicy {
    /// The delay before the next attempt after `failed_attempts` failures
    /// (1 for the first), or `None` when the event should fail for good.
    ///
    /// The last retry is pulled in to the backlog deadline rather than
    /// skipped, so an event always gets a try at its limit.
    pub fn next_delay(
        &self,
        failed_attempts: u32,
        event_time: Timestamp,
        now: Timestamp,
    ) -> Option<Duration> {
        let deadline = event_time.plus(self.backlog_limit);
        if now >= deadline || failed_attempts == 0 {
            return None;
        }
        let exponent = i32::try_from(failed_attempts - 1).unwrap_or(i32::MAX);
        let grown = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
        let delay = Duration::from_secs_f64(grown.min(self.max_delay.as_secs_f64()).max(0.0));
        Some(delay.min(now.until(deadline)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigben_defaults_then_growth_then_deadline() {
        let policy = RetryPolicy::default();
        let t0 = Timestamp::from_millis(0);
        let delays: Vec<u64> = (1..=6)
            .map(|n| policy.next_delay(n, t0, t0).unwrap().as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32]);
        assert_eq!(
            policy.next_delay(40, t0, t0),
            Some(Duration::from_secs(3600))
        );
        let near_end = t0.plus(Duration::from_secs(24 * 3600 - 10));
        assert_eq!(
            policy.next_delay(20, t0, near_end),
            Some(Duration::from_secs(10))
        );
        let past = t0.plus(Duration::from_secs(24 * 3600));
        assert_eq!(policy.next_delay(20, t0, past), None);
    }
}
