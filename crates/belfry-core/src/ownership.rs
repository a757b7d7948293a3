//! Whether this node may fire a partition now, and until when.
//!
//! A node fires an owned partition only inside its [`FiringWindow`],
//! `[from, until)` on the node's monotonic clock: `from` waits out the
//! previous owner's lease, `until` ends a safety margin before this node's
//! own lease can expire. The runtime checks it right before each delivery,
//! so a node paused past its lease delivers nothing for the partitions it
//! lost.

use std::time::Duration;

use crate::time::MonoTime;

/// Far enough to never matter, near enough not to overflow anything.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// When a node may fire one partition: from `from` (inclusive) until
/// `until` (exclusive), on its monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiringWindow {
    pub from: MonoTime,
    pub until: MonoTime,
}

impl FiringWindow {
    /// Fires nothing, ever: a released or lost partition.
    pub const CLOSED: FiringWindow = FiringWindow {
        from: MonoTime::ZERO,
        until: MonoTime::ZERO,
    };

    /// Owned from `now` for as long as the process runs (a single node).
    pub fn forever(now: MonoTime) -> Self {
        FiringWindow {
            from: now,
            until: now.plus(FOREVER),
        }
    }

    /// The window a lease renewal grants: it was sent at `sent` and
    /// answered at `answered`. The lease runs `ttl` from when it was sent
    /// (the store may have renewed it at once); firing stops `safety_margin`
    /// before that, and starts `takeover_after` the answer (the time the
    /// previous owner's lease may still run).
    pub fn after_renewal(
        sent: MonoTime,
        answered: MonoTime,
        ttl: Duration,
        safety_margin: Duration,
        takeover_after: Duration,
    ) -> Self {
        FiringWindow {
            from: answered.plus(takeover_after),
            until: sent.plus(ttl.saturating_sub(safety_margin)),
        }
    }

    /// Whether a delivery may start at `now`.
    pub fn may_fire(&self, now: MonoTime) -> bool {
        now >= self.from && now < self.until
    }

    /// How long from `now` until firing may start (zero if it may already).
    pub fn wait_before_firing(&self, now: MonoTime) -> Duration {
        self.from.since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> MonoTime {
        MonoTime::from_origin(Duration::from_millis(ms))
    }

    #[test]
    fn fires_from_its_start_until_just_before_its_end() {
        let window = FiringWindow {
            from: at(100),
            until: at(200),
        };
        assert!(!window.may_fire(at(99)));
        assert!(window.may_fire(at(100)));
        assert!(window.may_fire(at(199)));
        assert!(!window.may_fire(at(200)));
        assert_eq!(window.wait_before_firing(at(40)), Duration::from_millis(60));
        assert_eq!(window.wait_before_firing(at(150)), Duration::ZERO);
    }

    #[test]
    fn a_closed_window_never_fires() {
        for now in [0, 1, 1_000_000] {
            assert!(!FiringWindow::CLOSED.may_fire(at(now)));
        }
    }

    #[test]
    fn a_single_node_fires_from_now_on() {
        let window = FiringWindow::forever(at(5));
        assert!(!window.may_fire(at(4)));
        assert!(window.may_fire(at(5)));
        assert!(window.may_fire(at(5).plus(Duration::from_secs(50 * 365 * 24 * 3600))));
    }

    #[test]
    fn a_renewal_waits_out_the_previous_owner_and_ends_before_the_lease() {
        let window = FiringWindow::after_renewal(
            at(1_000),
            at(1_300),
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        assert_eq!(window.from, at(3_300));
        assert_eq!(window.until, at(10_000));
        // A margin larger than the lease: nothing may fire.
        let none = FiringWindow::after_renewal(
            at(1_000),
            at(1_000),
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::ZERO,
        );
        assert!(!none.may_fire(at(1_000)));
    }
}
