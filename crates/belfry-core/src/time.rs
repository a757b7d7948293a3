//! Wall-clock instants at millisecond resolution, monotonic readings, and
//! the injected clock.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
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

/// What [`Clock::sleep_until`] returns: resolves at the deadline. Boxed so
/// that the trait stays object-safe and free of any async runtime.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The one source of time. Production reads the operating system through a
/// single adapter (the `belfry-clock` crate); tests inject a
/// [`ManualClock`]. Direct clock reads elsewhere are refused by the
/// workspace's `clippy.toml`.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Wall time: what instants in the store and on the wire mean.
    fn now(&self) -> Timestamp;

    /// Monotonic time: for timeouts, leases and rates, which must not jump
    /// when the wall clock is set.
    fn monotonic(&self) -> MonoTime;

    /// Resolves once [`Clock::monotonic`] reaches `deadline` (at once if it
    /// has).
    fn sleep_until(&self, deadline: MonoTime) -> Sleep;

    /// Resolves `duration` from now.
    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleep_until(self.monotonic().plus(duration))
    }
}

/// A clock that only moves when told to; moving it wakes the sleepers whose
/// deadline it reached. Clones share one time line.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug, Default)]
struct ManualInner {
    state: Mutex<ManualState>,
}

#[derive(Debug, Default)]
struct ManualState {
    wall: i64,
    mono: MonoTime,
    /// Sleepers waiting, by id: their deadline and whom to wake.
    sleepers: BTreeMap<u64, (MonoTime, Option<Waker>)>,
    next_sleeper: u64,
}

impl ManualInner {
    fn lock(&self) -> MutexGuard<'_, ManualState> {
        // Plain numbers and wakers: a panic elsewhere leaves them usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ManualClock {
    /// Wall time `start`, monotonic time at its origin.
    pub fn new(start: Timestamp) -> Self {
        let clock = ManualClock::default();
        clock.inner.lock().wall = start.0;
        clock
    }

    /// Sets the wall clock (it may go back, as a real one can); the
    /// monotonic clock moves forward by as much, never back.
    pub fn set(&self, to: Timestamp) {
        let mut state = self.inner.lock();
        let forward = to.0.saturating_sub(state.wall).max(0);
        state.wall = to.0;
        state.mono = state
            .mono
            .plus(Duration::from_millis(forward.unsigned_abs()));
        wake_due(state);
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = self.inner.lock();
        state.wall = state.wall.saturating_add(duration_millis(by));
        state.mono = state.mono.plus(by);
        wake_due(state);
    }

    /// Sleeps not yet resolved (those polled at least once or still held):
    /// lets a test wait until a task is asleep before moving the clock.
    pub fn sleepers(&self) -> usize {
        self.inner.lock().sleepers.len()
    }

    /// The earliest deadline a sleeper waits for.
    pub fn next_deadline(&self) -> Option<MonoTime> {
        self.inner.lock().sleepers.values().map(|(at, _)| *at).min()
    }
}

/// Wakes (outside the lock) every sleeper whose deadline has come.
fn wake_due(mut state: MutexGuard<'_, ManualState>) {
    let now = state.mono;
    let wakers: Vec<Waker> = state
        .sleepers
        .values_mut()
        .filter(|(at, _)| *at <= now)
        .filter_map(|(_, waker)| waker.take())
        .collect();
    drop(state);
    for waker in wakers {
        waker.wake();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.inner.lock().wall)
    }

    fn monotonic(&self) -> MonoTime {
        self.inner.lock().mono
    }

    fn sleep_until(&self, deadline: MonoTime) -> Sleep {
        let mut state = self.inner.lock();
        let id = state.next_sleeper;
        state.next_sleeper += 1;
        state.sleepers.insert(id, (deadline, None));
        drop(state);
        Box::pin(ManualSleep {
            clock: self.inner.clone(),
            id,
            deadline,
        })
    }
}

/// One [`ManualClock`] sleep; deregisters itself when dropped.
struct ManualSleep {
    clock: Arc<ManualInner>,
    id: u64,
    deadline: MonoTime,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.clock.lock();
        if state.mono >= self.deadline {
            state.sleepers.remove(&self.id);
            return Poll::Ready(());
        }
        if let Some((_, waker)) = state.sleepers.get_mut(&self.id) {
            *waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        self.clock.lock().sleepers.remove(&self.id);
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
        assert_eq!(
            clock.monotonic(),
            MonoTime::from_origin(Duration::from_millis(5))
        );
    }

    #[test]
    fn setting_the_wall_clock_back_never_moves_monotonic_time_back() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        clock.set(Timestamp::from_millis(400));
        assert_eq!(clock.now().as_millis(), 400);
        assert_eq!(clock.monotonic(), MonoTime::ZERO);
        clock.set(Timestamp::from_millis(700));
        assert_eq!(
            clock.monotonic(),
            MonoTime::from_origin(Duration::from_millis(300))
        );
    }

    /// Counts its wake-ups, so a test sees exactly when a sleep is woken.
    #[derive(Default)]
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn woken(counter: &Arc<CountingWaker>) -> usize {
        counter.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn advancing_wakes_the_sleepers_whose_deadline_came() {
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        let mut short = clock.sleep(Duration::from_millis(10));
        let mut long = clock.sleep(Duration::from_millis(20));
        assert_eq!(clock.sleepers(), 2);
        assert_eq!(
            clock.next_deadline(),
            Some(MonoTime::from_origin(Duration::from_millis(10)))
        );
        assert!(short.as_mut().poll(&mut cx).is_pending());
        assert!(long.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_millis(9));
        assert_eq!(woken(&counter), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(woken(&counter), 1);
        assert!(short.as_mut().poll(&mut cx).is_ready());
        assert!(long.as_mut().poll(&mut cx).is_pending());
        assert_eq!(clock.sleepers(), 1);
        // A dropped sleep is forgotten: nothing is left to wake.
        drop(long);
        assert_eq!(clock.sleepers(), 0);
        clock.advance(Duration::from_secs(1));
        assert_eq!(woken(&counter), 1);
    }

    #[test]
    fn a_sleep_whose_deadline_passed_is_ready_at_once() {
        let clock = ManualClock::default();
        clock.advance(Duration::from_millis(50));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut past = clock.sleep_until(MonoTime::from_origin(Duration::from_millis(10)));
        assert!(past.as_mut().poll(&mut cx).is_ready());
        // Clones share the time line and the sleepers.
        let other = clock.clone();
        let mut later = other.sleep(Duration::from_millis(5));
        assert!(later.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_millis(5));
        assert!(later.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn mono_time_saturates() {
        let t = MonoTime::from_origin(Duration::from_secs(1));
        assert_eq!(t.since(t.plus(Duration::from_secs(1))), Duration::ZERO);
        assert_eq!(
            MonoTime::ZERO
                .plus(Duration::MAX)
                .plus(Duration::MAX)
                .since_origin(),
            Duration::MAX
        );
    }
}
