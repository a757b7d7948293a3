//! The arithmetic of per-tenant quotas: a node's estimate of a tenant's
//! pending events (or schedules), when it must be counted again, whether a
//! request fits, and the token buckets of rate limits.
//!
//! The runtime keeps one estimate per tenant, counts from the store when
//! these functions say so, and refuses when they say it does not fit.

use std::time::Duration;

use crate::event::CommandOutcome;
use crate::time::Timestamp;

/// An estimate older than this is counted again before it refuses a
/// request: a refusal rests on a count at most this old.
pub const RECOUNT_BEFORE_REFUSING: Duration = Duration::from_secs(1);

/// A store count plus what this node's acknowledged writes changed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// The store's count, at `counted_at`.
    pub counted: u64,
    pub counted_at: Timestamp,
    /// This node's acknowledged creates minus cancels since.
    pub delta: i64,
}

impl Estimate {
    /// A fresh count.
    pub fn counted(counted: u64, counted_at: Timestamp) -> Self {
        Estimate {
            counted,
            counted_at,
            delta: 0,
        }
    }

    pub fn value(&self) -> u64 {
        self.counted.saturating_add_signed(self.delta)
    }

    /// How long ago it was counted (zero if `now` is before that).
    pub fn age(&self, now: Timestamp) -> Duration {
        self.counted_at.until(now)
    }

    /// Counted less than `refresh` ago.
    pub fn is_fresh(&self, now: Timestamp, refresh: Duration) -> bool {
        self.age(now) < refresh
    }

    /// Whether it may answer a check adding `adding` toward `limit` without
    /// a new count: fresh, or old but so far below the quota (at most half
    /// of it after adding) that what it missed cannot matter yet.
    pub fn usable(&self, now: Timestamp, refresh: Duration, adding: u64, limit: u64) -> bool {
        self.is_fresh(now, refresh) || self.value().saturating_add(adding) <= limit / 2
    }

    /// Whether `adding` more stay within `limit`.
    pub fn fits(&self, adding: u64, limit: u64) -> bool {
        self.value().saturating_add(adding) <= limit
    }

    /// Whether to count again before refusing with it
    /// ([`RECOUNT_BEFORE_REFUSING`]).
    pub fn recount_before_refusing(&self, now: Timestamp) -> bool {
        self.age(now) >= RECOUNT_BEFORE_REFUSING
    }

    /// Adds this node's change (creates minus cancels) since the count.
    pub fn add(&mut self, change: i64) {
        self.delta = self.delta.saturating_add(change);
    }
}

/// How an acknowledged client command changes its tenant's pending count:
/// a create (or a redrive, pending again) adds one, a cancel removes one.
pub fn pending_change(outcome: &CommandOutcome) -> Option<i64> {
    match outcome {
        CommandOutcome::Created | CommandOutcome::Redriven => Some(1),
        CommandOutcome::Cancelled => Some(-1),
        _ => None,
    }
}

/// The change of a tenant's occurrences per minute when one schedule's
/// rate goes from `old` to `new`.
pub fn rate_change(old: u64, new: u64) -> i64 {
    i64::try_from(new).unwrap_or(i64::MAX) - i64::try_from(old).unwrap_or(i64::MAX)
}

/// A token bucket of `rate` tokens per second holding at most `rate`
/// (bursts of up to one second's worth).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
    /// When `tokens` was last topped up.
    at: Timestamp,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn full(rate: f64, now: Timestamp) -> Self {
        TokenBucket {
            tokens: rate,
            at: now,
        }
    }

    fn level(&self, rate: f64, now: Timestamp) -> f64 {
        (self.tokens + rate * self.at.until(now).as_secs_f64()).min(rate)
    }

    /// Takes one token at `now`; `false` when there is none.
    pub fn take(&mut self, rate: f64, now: Timestamp) -> bool {
        self.tokens = self.level(rate, now);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    /// Whether it is full again at `now`: then it is the same as none, and
    /// may be dropped.
    pub fn is_full(&self, rate: f64, now: Timestamp) -> bool {
        self.tokens + rate * self.at.until(now).as_secs_f64() >= rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn an_old_estimate_is_used_only_far_below_the_quota() {
        let refresh = Duration::from_secs(10);
        let estimate = Estimate::counted(40, at(0));
        assert!(estimate.usable(at(9_999), refresh, 1_000, 100));
        // Old: usable only while at most half the quota after adding.
        assert!(estimate.usable(at(10_000), refresh, 10, 100));
        assert!(!estimate.usable(at(10_000), refresh, 11, 100));
        assert!(!estimate.is_fresh(at(10_000), refresh));
    }

    #[test]
    fn fits_counts_this_nodes_changes() {
        let mut estimate = Estimate::counted(98, at(0));
        assert!(estimate.fits(2, 100));
        estimate.add(1);
        assert_eq!(estimate.value(), 99);
        assert!(!estimate.fits(2, 100));
        estimate.add(-200);
        assert_eq!(estimate.value(), 0);
        estimate.add(i64::MAX);
        estimate.add(i64::MAX);
        assert_eq!(estimate.delta, i64::MAX);
    }

    #[test]
    fn a_refusal_rests_on_a_recent_count() {
        let estimate = Estimate::counted(1, at(1_000));
        assert!(!estimate.recount_before_refusing(at(1_999)));
        assert!(estimate.recount_before_refusing(at(2_000)));
        // A clock that went back gives age zero, not a panic.
        assert_eq!(estimate.age(at(0)), Duration::ZERO);
    }

    #[test]
    fn creates_and_cancels_move_the_pending_count() {
        assert_eq!(pending_change(&CommandOutcome::Created), Some(1));
        assert_eq!(pending_change(&CommandOutcome::Redriven), Some(1));
        assert_eq!(pending_change(&CommandOutcome::Cancelled), Some(-1));
        assert_eq!(rate_change(10, 4), -6);
        assert_eq!(rate_change(0, u64::MAX), i64::MAX);
    }

    #[test]
    fn token_bucket_bursts_then_refills_at_its_rate() {
        let rate = 2.0;
        let mut bucket = TokenBucket::full(rate, at(0));
        assert!(bucket.take(rate, at(0)));
        assert!(bucket.take(rate, at(0)));
        assert!(!bucket.take(rate, at(0)));
        assert!(!bucket.take(rate, at(499)));
        assert!(bucket.take(rate, at(1_000)));
        assert!(!bucket.is_full(rate, at(1_000)));
        assert!(bucket.is_full(rate, at(2_000)));
    }
}
