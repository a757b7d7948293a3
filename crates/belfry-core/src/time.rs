//! Wall-clock instants at millisecond resolution, and the injected clock.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// An instant, in whole milliseconds since the UNIX epoch (UTC).
///
/// Millisecond resolution is the contract of the whole system: an event due
/// at `t` may be delivered once `Clock::now() >= t`, never before.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The smallest representable instant; sorts before every real one.
    pub const MIN: Timestamp = Timestamp(i64::MIN);

    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating at the ends of the range.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// `self - d`, saturating at the ends of the range.
    pub fn minus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_millis(d)))
    }

    /// How long from `self` until `later`; zero if `later` is not after `self`.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(later.0.saturating_sub(self.0).max(0) as u64)
    }

    /// Parses an ISO-8601 / RFC 3339 instant that carries an offset or `Z`
    /// (`2030-01-31T09:30:30+05:30`, `2030-01-31T04:00:30.250Z`). Sub-millisecond
    /// digits are truncated. A local time without an offset is rejected: it
    /// does not name an instant.
    pub fn parse_rfc3339(text: &str) -> Option<Self> {
        let ts: jiff::Timestamp = text.trim().parse().ok()?;
        Some(Timestamp(ts.as_millisecond()))
    }

    /// Renders as RFC 3339 in UTC with millisecond precision when needed
    /// (`2030-01-31T04:00:30Z`, `2030-01-31T04:00:30.250Z`).
    pub fn to_rfc3339(self) -> String {
        match jiff::Timestamp::from_millisecond(self.0) {
            Ok(ts) => ts.to_string(),
            Err(_) => format!("@{}ms", self.0),
        }
    }
}

/// A reading of a monotonic clock: how long after the clock's own origin.
/// Readings of one clock compare and subtract; unlike [`Timestamp`] they
/// never jump when the wall clock is set.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoTime(Duration);

impl MonoTime {
    /// The clock's origin.
    pub const ZERO: MonoTime = MonoTime(Duration::ZERO);

    pub const fn from_origin(since_origin: Duration) -> Self {
        MonoTime(since_origin)
    }

    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// `self + d`, saturating.
    pub fn plus(self, d: Duration) -> Self {
        MonoTime(self.0.saturating_add(d))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is not before.
    pub fn since(self, earlier: MonoTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_rfc3339())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// The one source of "now". Production reads the OS clock in exactly one
/// place ([`SystemClock`]); tests inject a [`ManualClock`].
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The single sanctioned read of the OS clock.
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(duration_millis(since_epoch))
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(AtomicI64::new(start.0))
    }

    pub fn set(&self, to: Timestamp) {
        self.0.store(to.0, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(duration_millis(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// Serde for `Duration` as whole milliseconds, so configuration files say
/// `window_ms = 60000` instead of `{secs, nanos}`.
pub mod serde_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_offsets_and_renders_utc() {
        let a = Timestamp::parse_rfc3339("2030-01-31T09:30:30+05:30").unwrap();
        let b = Timestamp::parse_rfc3339("2030-01-31T04:00:30Z").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_rfc3339(), "2030-01-31T04:00:30Z");
        let c = Timestamp::parse_rfc3339("2030-01-31T04:00:30.250Z").unwrap();
        assert_eq!(c.as_millis() - b.as_millis(), 250);
        assert_eq!(c.to_rfc3339(), "2030-01-31T04:00:30.25Z");
    }

    #[test]
    fn rejects_local_times_and_garbage() {
        assert!(Timestamp::parse_rfc3339("2030-01-31T04:00:30").is_none());
        assert!(Timestamp::parse_rfc3339("tomorrow").is_none());
        assert!(Timestamp::parse_rfc3339("").is_none());
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        assert_eq!(clock.now().as_millis(), 1_000);
        clock.advance(Duration::from_millis(5));
        assert_eq!(clock.now().as_millis(), 1_005);
    }
}
