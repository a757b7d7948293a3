//! The retry policy and the single delivery classification.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigKeys, Problems};
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
/// Two phases, as in BigBen. The *quick phase* is the first `fast_retries`
/// retries: each comes `initial_delay` after the failed attempt, to ride
/// over a blip (a receiver restarting, a dropped connection). Then the
/// *back-off*: each further retry waits `multiplier` times as long as the
/// one before, capped at `max_delay`, until `backlog_limit` after the
/// event's instant, when the event fails for good. With the defaults
/// (3, 1 s, ×2, 1 h) the retries come after 1 s, 1 s, 1 s, 2 s, 4 s, 8 s …
/// at most 1 h apart. The first retry always waits `initial_delay`, so
/// `fast_retries` 0 and 1 are the same: pure exponential back-off (1 s,
/// 2 s, 4 s …).
///
/// BigBen's `max.retries` (3) counted its in-memory retries, which already
/// grew (1 s, 2 s, 4 s); after them it marked the event `ERROR` and tried
/// again only at its next bucket scans, until the backlog limit. Belfry
/// persists every retry, so its back-off phase replaces those scans; the
/// quick phase keeps the early retries close together instead of growing.
/// Every retry is persisted, so none is lost to a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// The quick phase (BigBen's `max.retries`): this many retries each
    /// wait `initial_delay_ms`, then each further one waits `multiplier`
    /// times longer (defaults: 1 s, 1 s, 1 s, 2 s, 4 s …); `0` or `1`:
    /// back-off from the first retry (1 s, 2 s, 4 s …, BigBen's own quick
    /// phase).
    pub fast_retries: u32,
    /// Delay of the first retry and of every retry in the quick phase.
    #[serde(with = "crate::time::serde_millis", rename = "initial_delay_ms")]
    pub initial_delay: Duration,
    /// Growth of the delay per failed attempt after the quick phase (at
    /// least 1.0).
    pub multiplier: f64,
    /// Longest delay between two attempts.
    #[serde(with = "crate::time::serde_millis", rename = "max_delay_ms")]
    pub max_delay: Duration,
    /// Stop retrying this long after the event's instant; the event then
    /// ends `failed`. `0`: never retry.
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
    /// Refuses zero delays, a `max_delay` below `initial_delay` and a
    /// multiplier below 1, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("initial_delay_ms", self.initial_delay);
        problems.at_least_one("max_delay_ms", self.max_delay);
        if !self.initial_delay.is_zero() && self.max_delay < self.initial_delay {
            problems.push(format!(
                "{} ({}) must not be less than {} ({})",
                problems.key("max_delay_ms"),
                self.max_delay.as_millis(),
                problems.key("initial_delay_ms"),
                self.initial_delay.as_millis()
            ));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            problems.push(format!(
                "{} must be a finite number of at least 1.0, not {}",
                problems.key("multiplier"),
                self.multiplier
            ));
        }
    }

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
        let delay = self.delay_after(failed_attempts);
        Some(delay.min(now.until(deadline)))
    }

    /// The delay after `failed_attempts` failures (at least 1), before the
    /// backlog deadline is applied: `initial_delay` through the quick
    /// phase, then growing by `multiplier` per failure, at most `max_delay`.
    fn delay_after(&self, failed_attempts: u32) -> Duration {
        // The first retry waits `initial_delay` whatever `fast_retries` is.
        let growth_steps = failed_attempts.saturating_sub(self.fast_retries.max(1));
        let base = self.initial_delay.min(self.max_delay);
        if growth_steps == 0 {
            return base;
        }
        let exponent = i32::try_from(growth_steps).unwrap_or(i32::MAX);
        let grown = base.as_secs_f64() * self.multiplier.powi(exponent);
        // `min` also maps a NaN (0 × ∞) to the cap.
        Duration::from_secs_f64(grown.min(self.max_delay.as_secs_f64()).max(0.0))
    }
}

/// A pull event's own back-off (`docs/pull.md`): the first retry after
/// `initial_delay_ms`, each further one `multiplier` times the one before,
/// at most `max_delay_ms` apart. It replaces the delays of the node's
/// [`RetryPolicy`]; the backlog limit (the execution deadline) stays the
/// node's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub initial_delay_ms: u64,
    pub multiplier: Multiplier,
    pub max_delay_ms: u64,
}

/// The growth of a [`Backoff`]: finite, from 1 to [`Backoff::MAX_MULTIPLIER`]
/// (checked when built, so equality is total).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Multiplier(f64);

// Never NaN: `Multiplier::new` is the only way in (serde's too).
impl Eq for Multiplier {}

impl TryFrom<f64> for Multiplier {
    type Error = BackoffError;
    fn try_from(value: f64) -> Result<Self, BackoffError> {
        Multiplier::new(value)
    }
}

impl From<Multiplier> for f64 {
    fn from(value: Multiplier) -> f64 {
        value.0
    }
}

impl Multiplier {
    /// # Errors
    /// Not finite, below 1 or above [`Backoff::MAX_MULTIPLIER`].
    pub fn new(value: f64) -> Result<Self, BackoffError> {
        if value.is_finite() && (1.0..=Backoff::MAX_MULTIPLIER).contains(&value) {
            Ok(Multiplier(value))
        } else {
            Err(BackoffError::Multiplier)
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// Why a back-off was refused; the message names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BackoffError {
    #[error("backoff.initial_delay_ms must be between 1 and 86400000 (24 h)")]
    InitialDelay,
    #[error("backoff.max_delay_ms must be between backoff.initial_delay_ms and 86400000 (24 h)")]
    MaxDelay,
    #[error("backoff.multiplier must be a number between 1 and 100")]
    Multiplier,
}

impl Backoff {
    /// The longest delay either field may give: 24 h.
    pub const MAX_DELAY_MS: u64 = 86_400_000;
    pub const MAX_MULTIPLIER: f64 = 100.0;

    /// A validated back-off.
    ///
    /// # Errors
    /// A field out of its range (see [`BackoffError`]).
    pub fn new(
        initial_delay_ms: u64,
        multiplier: f64,
        max_delay_ms: u64,
    ) -> Result<Self, BackoffError> {
        if !(1..=Self::MAX_DELAY_MS).contains(&initial_delay_ms) {
            return Err(BackoffError::InitialDelay);
        }
        if !(initial_delay_ms..=Self::MAX_DELAY_MS).contains(&max_delay_ms) {
            return Err(BackoffError::MaxDelay);
        }
        Ok(Backoff {
            initial_delay_ms,
            multiplier: Multiplier::new(multiplier)?,
            max_delay_ms,
        })
    }

    /// `base` with this back-off's delays (no quick phase) and `base`'s
    /// backlog limit.
    pub fn apply_to(&self, base: &RetryPolicy) -> RetryPolicy {
        RetryPolicy {
            fast_retries: 1,
            initial_delay: Duration::from_millis(self.initial_delay_ms),
            multiplier: self.multiplier.get(),
            max_delay: Duration::from_millis(self.max_delay_ms),
            backlog_limit: base.backlog_limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delays (in ms) of retries 1..=n, far from any deadline.
    fn delays_ms(policy: &RetryPolicy, n: u32) -> Vec<u128> {
        let t0 = Timestamp::from_millis(0);
        (1..=n)
            .map(|attempt| policy.next_delay(attempt, t0, t0).unwrap().as_millis())
            .collect()
    }

    fn policy(fast_retries: u32, initial_ms: u64, multiplier: f64, max_ms: u64) -> RetryPolicy {
        RetryPolicy {
            fast_retries,
            initial_delay: Duration::from_millis(initial_ms),
            multiplier,
            max_delay: Duration::from_millis(max_ms),
            backlog_limit: Duration::from_secs(365 * 24 * 3600),
        }
    }

    #[test]
    fn defaults_quick_phase_then_growth_then_deadline() {
        let policy = RetryPolicy::default();
        let t0 = Timestamp::from_millis(0);
        let delays: Vec<u64> = (1..=7)
            .map(|n| policy.next_delay(n, t0, t0).unwrap().as_secs())
            .collect();
        assert_eq!(delays, [1, 1, 1, 2, 4, 8, 16]);
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
        assert_eq!(policy.next_delay(0, t0, t0), None);
    }

    #[test]
    fn fast_retries_is_the_length_of_the_quick_phase() {
        assert_eq!(
            delays_ms(&policy(5, 500, 3.0, 60_000), 8),
            [500, 500, 500, 500, 500, 1_500, 4_500, 13_500]
        );
        assert_eq!(
            delays_ms(&policy(2, 1_000, 2.0, 3_600_000), 5),
            [1_000, 1_000, 2_000, 4_000, 8_000]
        );
    }

    #[test]
    fn changing_fast_retries_changes_the_delays() {
        let three = delays_ms(&policy(3, 1_000, 2.0, 3_600_000), 6);
        let six = delays_ms(&policy(6, 1_000, 2.0, 3_600_000), 6);
        assert_ne!(three, six);
        assert_eq!(six, [1_000; 6]);
    }

    #[test]
    fn zero_or_one_fast_retries_is_pure_exponential_back_off() {
        let expected = [1_000, 2_000, 4_000, 8_000, 16_000];
        assert_eq!(delays_ms(&policy(0, 1_000, 2.0, 3_600_000), 5), expected);
        assert_eq!(delays_ms(&policy(1, 1_000, 2.0, 3_600_000), 5), expected);
    }

    #[test]
    fn back_off_is_capped_and_extreme_counts_do_not_overflow() {
        let capped = policy(3, 1_000, 10.0, 50_000);
        assert_eq!(
            delays_ms(&capped, 7),
            [1_000, 1_000, 1_000, 10_000, 50_000, 50_000, 50_000]
        );
        let t0 = Timestamp::from_millis(0);
        assert_eq!(
            capped.next_delay(u32::MAX, t0, t0),
            Some(Duration::from_millis(50_000))
        );
        let endless_quick = policy(u32::MAX, 1_000, 2.0, 50_000);
        assert_eq!(
            endless_quick.next_delay(u32::MAX, t0, t0),
            Some(Duration::from_millis(1_000))
        );
        // An initial delay above the cap is capped too.
        assert_eq!(delays_ms(&policy(2, 9_000, 2.0, 5_000), 3), [5_000; 3]);
        // Multiplier 1: a constant delay throughout.
        assert_eq!(delays_ms(&policy(1, 700, 1.0, 5_000), 4), [700; 4]);
    }

    #[test]
    fn quick_phase_retries_are_pulled_in_to_the_deadline_too() {
        let mut policy = policy(3, 1_000, 2.0, 3_600_000);
        policy.backlog_limit = Duration::from_millis(10_500);
        let t0 = Timestamp::from_millis(0);
        let at_10s = t0.plus(Duration::from_secs(10));
        assert_eq!(
            policy.next_delay(1, t0, at_10s),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn a_backoff_replaces_the_delays_and_keeps_the_deadline() {
        let base = RetryPolicy::default();
        let backoff = Backoff::new(100, 3.0, 1_000).unwrap();
        let policy = backoff.apply_to(&base);
        assert_eq!(delays_ms(&policy, 5), [100, 300, 900, 1_000, 1_000]);
        assert_eq!(policy.backlog_limit, base.backlog_limit);
        assert_eq!(Backoff::new(0, 2.0, 10), Err(BackoffError::InitialDelay));
        assert_eq!(Backoff::new(10, 2.0, 9), Err(BackoffError::MaxDelay));
        assert_eq!(
            Backoff::new(10, 2.0, Backoff::MAX_DELAY_MS + 1),
            Err(BackoffError::MaxDelay)
        );
        for bad in [0.5, f64::NAN, f64::INFINITY, 101.0] {
            assert_eq!(Backoff::new(10, bad, 10), Err(BackoffError::Multiplier));
        }
    }
}
