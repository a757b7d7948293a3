//! The system clock: the one place Belfry reads the operating system's
//! clocks and arms timers (tokio's), behind [`belfry_core::Clock`].
//!
//! Everything else takes an `Arc<dyn Clock>`; the workspace's `clippy.toml`
//! refuses direct clock reads outside this crate.
//!
//! # Layout
//! - [`SystemClock`]: wall time from the OS, monotonic time and sleeps
//!   from tokio's timer (so a runtime with paused time pauses it too).

use std::sync::OnceLock;
use std::time::Duration;

use belfry_core::time::{Clock, MonoTime, Sleep, Timestamp};

/// Furthest a sleep is armed: tokio's timer cannot hold an unbounded
/// deadline, and nothing sleeps this long (a firing window that never
/// closes is a hundred years).
const FAR_FUTURE: Duration = Duration::from_secs(200 * 365 * 24 * 3600);

/// The operating system's clocks. Every instance shares one monotonic time
/// line, so readings of different components compare.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// The monotonic origin: the first reading in this process.
fn origin() -> tokio::time::Instant {
    static ORIGIN: OnceLock<tokio::time::Instant> = OnceLock::new();
    #[allow(
        clippy::disallowed_methods,
        reason = "the system clock adapter is the one place that reads the OS clock"
    )]
    *ORIGIN.get_or_init(tokio::time::Instant::now)
}

impl Clock for SystemClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the system clock adapter is the one place that reads the OS clock"
    )]
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::from_millis(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "the system clock adapter is the one place that reads the OS clock"
    )]
    fn monotonic(&self) -> MonoTime {
        let origin = origin();
        MonoTime::from_origin(tokio::time::Instant::now().saturating_duration_since(origin))
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "the system clock adapter is the one place that arms the OS timer"
    )]
    fn sleep_until(&self, deadline: MonoTime) -> Sleep {
        let origin = origin();
        let since_origin = deadline.since_origin().min(FAR_FUTURE);
        Box::pin(tokio::time::sleep_until(origin + since_origin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_time_is_after_2020() {
        assert!(SystemClock.now() > Timestamp::from_millis(1_577_836_800_000));
    }

    #[test]
    fn monotonic_time_never_goes_back() {
        let clock = SystemClock;
        let a = clock.monotonic();
        let b = clock.monotonic();
        assert!(b >= a);
    }

    #[tokio::test]
    async fn sleeps_end_at_their_deadline_on_the_runtime_timer() {
        let clock = SystemClock;
        let start = clock.monotonic();
        clock.sleep(Duration::from_millis(20)).await;
        assert!(clock.monotonic().since(start) >= Duration::from_millis(20));
        // A deadline past the timer's reach is armed, not a panic.
        drop(clock.sleep_until(MonoTime::from_origin(Duration::MAX)));
        // A past deadline resolves at once.
        clock.sleep_until(start).await;
    }
}
