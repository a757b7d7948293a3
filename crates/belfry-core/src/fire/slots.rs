//! Who gets a delivery slot next: one FIFO queue per tenant, tenants in
//! turn, a global and a per-tenant limit, and a reserve that hung tenants
//! cannot drain.
//!
//! # The reserve
//! The last `reserved` free slots go only to tenants below their share of
//! the reserve (`reserved / active tenants`, at least one). A tenant whose
//! webhook hangs therefore takes at most its per-tenant limit of the shared
//! slots plus a share of the reserve, and a healthy tenant — one with little
//! in flight — still finds a slot at once. Ten tenants that hang after
//! their slow start (below) opened them up, with the defaults (1,024 slots,
//! 256 per tenant, 256 reserved), hold at most 768 + 10 × 23 slots; the
//! eleventh tenant still gets 23 at once.
//!
//! The queues are bounded by the partitions: every queued job is an
//! outstanding entry of some [`super::PartitionCore`], which caps them.
//!
//! # Slow start
//! A tenant does not get its whole per-tenant limit at once: it starts with
//! `initial_per_tenant` deliveries in flight, and each attempt its endpoint
//! answered ([`DeliverySlots::answered`]) raises that by one, up to its
//! limit, so the window doubles every round trip, as TCP's slow start does.
//! Attempts that end unanswered (timeouts, refused connections) do not
//! raise it. A tenant whose webhook hangs therefore holds
//! `initial_per_tenant` connections, not its whole limit, and a backlog
//! coming due at one instant for ten hung tenants opens a few hundred
//! connections instead of a thousand: the CPU that would cost is what
//! every other tenant's deliveries wait behind. A tenant keeps its window
//! while it comes and goes (a busy tenant's queue empties between
//! instants), and starts over after [`IDLE_RESET_MS`] with nothing queued
//! and nothing in flight.
//!
//! # Per-tenant limits
//! [`DeliverySlots::set_tenant_limits`] gives one tenant its own
//! concurrency (instead of the policy's `per_tenant`, never above `global`)
//! and a delivery rate: a token bucket refilled at `per_second`, holding at
//! most one second's worth (so a tenant idle for a while may start that
//! many at once). Jobs past either limit wait in their queue, never
//! dropped. A tenant out of tokens keeps its turn but is skipped without
//! effort until its next token: [`DeliverySlots::next_token_at`] tells the
//! runtime when to call [`DeliverySlots::start_ready`] again (time is
//! given with [`DeliverySlots::advance`]).

use std::collections::{HashMap, VecDeque};

use crate::ids::TenantName;
use crate::time::Timestamp;

/// One tenant's own delivery limits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct TenantLimits {
    /// Deliveries in flight at once (default: the policy's `per_tenant`).
    max_in_flight: Option<usize>,
    /// Deliveries started per second, at most (default: no limit).
    per_second: Option<f64>,
}

/// Float rounding of refills: a token this close to whole counts as whole.
const TOKEN_EPSILON: f64 = 1e-6;

/// How long a tenant with nothing queued and nothing in flight keeps the
/// window its slow start reached.
pub const IDLE_RESET_MS: i64 = 60_000;

/// A tenant's slow-start window.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Deliveries in flight at once allowed so far (the limit caps it).
    size: usize,
    /// Since when the tenant has nothing queued and nothing in flight.
    idle_since: Option<Timestamp>,
}

/// A tenant's delivery rate: tokens refilled continuously.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    per_second: f64,
    tokens: f64,
    at: Timestamp,
}

impl Bucket {
    fn new(per_second: f64, now: Timestamp) -> Self {
        Bucket {
            per_second,
            tokens: Bucket::capacity(per_second),
            at: now,
        }
    }

    /// One second's worth, at least one.
    fn capacity(per_second: f64) -> f64 {
        per_second.max(1.0)
    }

    fn refill(&mut self, now: Timestamp) {
        let elapsed_ms = now.as_millis().saturating_sub(self.at.as_millis());
        if elapsed_ms > 0 {
            let added = elapsed_ms as f64 * self.per_second / 1_000.0;
            self.tokens = (self.tokens + added).min(Bucket::capacity(self.per_second));
            self.at = now;
        }
    }

    /// When the next whole token is there (`now` if it is).
    fn next_token_at(&self) -> Timestamp {
        if self.tokens + TOKEN_EPSILON >= 1.0 {
            return self.at;
        }
        // Less a hair, so float rounding cannot push it a millisecond late.
        let wait_ms = ((1.0 - self.tokens - TOKEN_EPSILON) * 1_000.0 / self.per_second)
            .ceil()
            .max(0.0);
        Timestamp::from_millis(self.at.as_millis().saturating_add(wait_ms as i64))
    }
}

/// The limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPolicy {
    /// Deliveries in flight at once, over all tenants.
    pub global: usize,
    /// Deliveries in flight at once for one tenant.
    pub per_tenant: usize,
    /// Free slots kept for tenants below their share of them.
    pub reserved: usize,
    /// Deliveries in flight at once for a tenant none of whose attempts
    /// were answered yet (see the module's "Slow start").
    pub initial_per_tenant: usize,
}

impl SlotPolicy {
    /// A tenant's first deliveries in flight at once, by default.
    pub const INITIAL_PER_TENANT: usize = 16;

    /// `global` and `per_tenant` as configured; a quarter of the slots
    /// reserved; a slow start from [`SlotPolicy::INITIAL_PER_TENANT`].
    pub fn new(global: usize, per_tenant: usize) -> Self {
        let global = global.max(1);
        SlotPolicy {
            global,
            per_tenant: per_tenant.clamp(1, global),
            reserved: global / 4,
            initial_per_tenant: Self::INITIAL_PER_TENANT,
        }
    }
}

#[derive(Debug)]
struct TenantQueue<J> {
    in_flight: usize,
    waiting: VecDeque<J>,
    /// Whether the tenant is in `ready`.
    is_ready: bool,
}

impl<J> Default for TenantQueue<J> {
    fn default() -> Self {
        TenantQueue {
            in_flight: 0,
            waiting: VecDeque::new(),
            is_ready: false,
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct DeliverySlots<J> {
    policy: SlotPolicy,
    tenants: HashMap<TenantName, TenantQueue<J>>,
    /// Tenants with waiting jobs and a free tenant slot, in turn order.
    ready: VecDeque<TenantName>,
    in_flight: usize,
    queued: usize,
    /// Tenants with their own limits (kept while their queues come and go).
    limits: HashMap<TenantName, TenantLimits>,
    /// Rate buckets of the tenants with a `per_second`.
    buckets: HashMap<TenantName, Bucket>,
    /// Slow-start windows, of active tenants and of those idle for less
    /// than [`IDLE_RESET_MS`] whose window grew.
    windows: HashMap<TenantName, Window>,
    /// When idle windows are next looked through for expiry.
    next_window_sweep: Timestamp,
    /// The time of the last [`DeliverySlots::advance`].
    now: Timestamp,
}

/// Whether a window idle since `since` is to start over at `now`.
fn expired(since: Timestamp, now: Timestamp) -> bool {
    now.as_millis().saturating_sub(since.as_millis()) >= IDLE_RESET_MS
}

impl<J> DeliverySlots<J> {
    pub fn new(policy: SlotPolicy) -> Self {
        DeliverySlots {
            policy,
            tenants: HashMap::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            queued: 0,
            limits: HashMap::new(),
            buckets: HashMap::new(),
            windows: HashMap::new(),
            next_window_sweep: Timestamp::MIN,
            now: Timestamp::MIN,
        }
    }

    /// Gives `tenant` its own limits, replacing any it had: at most
    /// `max_in_flight` deliveries at once (instead of the policy's
    /// `per_tenant`; clamped to `1..=global`) and `per_second` started per
    /// second. `None` for both: the policy's limits again.
    pub fn set_tenant_limits(
        &mut self,
        tenant: TenantName,
        max_in_flight: Option<usize>,
        per_second: Option<f64>,
    ) {
        let limits = TenantLimits {
            max_in_flight,
            per_second,
        };
        match limits.per_second.filter(|rate| *rate > 0.0) {
            Some(rate) => {
                let now = self.now;
                self.buckets
                    .entry(tenant.clone())
                    .and_modify(|bucket| bucket.per_second = rate)
                    .or_insert_with(|| Bucket::new(rate, now));
            }
            None => {
                self.buckets.remove(&tenant);
            }
        }
        if limits == TenantLimits::default() {
            self.limits.remove(&tenant);
        } else {
            self.limits.insert(tenant.clone(), limits);
        }
        // A raised limit may make a waiting tenant ready.
        if let Some(queue) = self.tenants.get_mut(&tenant)
            && !queue.is_ready
            && !queue.waiting.is_empty()
        {
            queue.is_ready = true;
            self.ready.push_back(tenant);
        }
    }

    /// The current time, for the rate limits and idle windows. Never goes
    /// back.
    pub fn advance(&mut self, now: Timestamp) {
        self.now = self.now.max(now);
        if self.now >= self.next_window_sweep {
            // Once a second at most: forget windows idle too long.
            let now = self.now;
            self.windows
                .retain(|_, window| window.idle_since.is_none_or(|since| !expired(since, now)));
            self.next_window_sweep = now.plus(std::time::Duration::from_secs(1));
        }
    }

    /// When a tenant held back only by its rate gets its next token: call
    /// [`DeliverySlots::start_ready`] then. `None`: no tenant waits for a
    /// token.
    pub fn next_token_at(&self) -> Option<Timestamp> {
        if self.buckets.is_empty() {
            return None;
        }
        self.ready
            .iter()
            .filter_map(|tenant| {
                let bucket = self.buckets.get(tenant)?;
                let mut bucket = *bucket;
                bucket.refill(self.now);
                (bucket.tokens + TOKEN_EPSILON < 1.0).then(|| bucket.next_token_at())
            })
            .min()
    }

    /// `tenant`'s concurrency limit, as configured.
    fn per_tenant_of(&self, tenant: &TenantName) -> usize {
        self.limits
            .get(tenant)
            .and_then(|limits| limits.max_in_flight)
            .map_or(self.policy.per_tenant, |limit| {
                limit.clamp(1, self.policy.global)
            })
    }

    /// `tenant`'s concurrency limit now: as configured, or less while its
    /// slow start lasts.
    fn allowed_of(&self, tenant: &TenantName) -> usize {
        let window = self
            .windows
            .get(tenant)
            .map_or(self.initial_window(), |window| window.size);
        self.per_tenant_of(tenant).min(window)
    }

    fn initial_window(&self) -> usize {
        self.policy.initial_per_tenant.max(1)
    }

    /// Takes a token of `tenant`'s rate at `now` for a delivery made
    /// outside the slots (a dry run): `false` when it has none now, `true`
    /// when it had one or has no rate. Queued deliveries wait for the next
    /// token as usual ([`DeliverySlots::next_token_at`]).
    pub fn take_token_now(&mut self, tenant: &TenantName, now: Timestamp) -> bool {
        self.advance(now);
        self.take_token(tenant)
    }

    /// Takes a token of `tenant`'s rate, if it has one (or no rate).
    fn take_token(&mut self, tenant: &TenantName) -> bool {
        let Some(bucket) = self.buckets.get_mut(tenant) else {
            return true;
        };
        bucket.refill(self.now);
        if bucket.tokens + TOKEN_EPSILON >= 1.0 {
            bucket.tokens = (bucket.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// Whether `tenant` has a token (without taking it).
    fn has_token(&self, tenant: &TenantName) -> bool {
        self.buckets.get(tenant).is_none_or(|bucket| {
            let mut bucket = *bucket;
            bucket.refill(self.now);
            bucket.tokens + TOKEN_EPSILON >= 1.0
        })
    }

    pub fn policy(&self) -> SlotPolicy {
        self.policy
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Jobs waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Deliveries in flight for `tenant`.
    pub fn in_flight_of(&self, tenant: &TenantName) -> usize {
        self.tenants.get(tenant).map_or(0, |q| q.in_flight)
    }

    /// Queues a job; call [`DeliverySlots::start_ready`] after.
    pub fn submit(&mut self, tenant: TenantName, job: J) {
        let (initial, now) = (self.initial_window(), self.now);
        // Looked up before inserting: no name cloned per job on the hot path.
        if let Some(window) = self.windows.get_mut(&tenant) {
            if let Some(since) = window.idle_since.take()
                && expired(since, now)
            {
                window.size = initial;
            }
        } else {
            let window = Window {
                size: initial,
                idle_since: None,
            };
            self.windows.insert(tenant.clone(), window);
        }
        let per_tenant = self.allowed_of(&tenant);
        let queue = self.tenants.entry(tenant.clone()).or_default();
        queue.waiting.push_back(job);
        self.queued += 1;
        if !queue.is_ready && queue.in_flight < per_tenant {
            queue.is_ready = true;
            self.ready.push_back(tenant);
        }
    }

    /// `tenant`'s endpoint answered an attempt (whatever it answered): its
    /// slow start widens by one. Call before [`DeliverySlots::finish`].
    pub fn answered(&mut self, tenant: &TenantName) {
        let limit = self.per_tenant_of(tenant);
        if let Some(window) = self.windows.get_mut(tenant)
            && window.size < limit
        {
            window.size += 1;
        }
    }

    /// A delivery of `tenant` finished; call [`DeliverySlots::start_ready`]
    /// after.
    pub fn finish(&mut self, tenant: &TenantName) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return;
        };
        queue.in_flight = queue.in_flight.saturating_sub(1);
        if !queue.is_ready && !queue.waiting.is_empty() {
            queue.is_ready = true;
            self.ready.push_back(tenant.clone());
        } else if queue.waiting.is_empty() && queue.in_flight == 0 && !queue.is_ready {
            self.tenants.remove(tenant);
            self.went_idle(tenant);
        }
    }

    /// `tenant` has nothing queued and nothing in flight: a window still at
    /// its start is forgotten, a wider one kept for a while.
    fn went_idle(&mut self, tenant: &TenantName) {
        let initial = self.initial_window();
        if let Some(window) = self.windows.get_mut(tenant) {
            if window.size <= initial {
                self.windows.remove(tenant);
            } else {
                window.idle_since = Some(self.now);
            }
        }
    }

    /// Drops every queued job (shutdown); returns them.
    pub fn clear_queued(&mut self) -> Vec<J> {
        self.ready.clear();
        self.queued = 0;
        let mut dropped = Vec::new();
        self.tenants.retain(|_, queue| {
            dropped.extend(queue.waiting.drain(..));
            queue.is_ready = false;
            queue.in_flight > 0
        });
        dropped
    }

    /// Whether a tenant with `in_flight` deliveries and `per_tenant` as
    /// its limit may start one more.
    fn may_start(&self, in_flight: usize, per_tenant: usize) -> bool {
        let free = self.policy.global.saturating_sub(self.in_flight);
        if free == 0 || in_flight >= per_tenant {
            return false;
        }
        if free > self.policy.reserved {
            return true;
        }
        let active = self.tenants.len().max(1);
        let share = (self.policy.reserved / active).max(1);
        in_flight < share
    }

    /// Takes jobs from ready tenants, in turn, while slots are free.
    pub fn start_ready(&mut self) -> Vec<(TenantName, J)> {
        let mut starting = Vec::new();
        loop {
            let mut started_any = false;
            for _ in 0..self.ready.len() {
                if self.in_flight >= self.policy.global {
                    return starting;
                }
                let Some(tenant) = self.ready.pop_front() else {
                    break;
                };
                let Some(in_flight) = self.tenants.get(&tenant).map(|q| q.in_flight) else {
                    continue;
                };
                let per_tenant = self.allowed_of(&tenant);
                if !self.may_start(in_flight, per_tenant) || !self.has_token(&tenant) {
                    // Held back by the reserve or its rate: keeps its turn
                    // for later (`next_token_at` says when a rate allows).
                    self.ready.push_back(tenant);
                    continue;
                }
                if self
                    .tenants
                    .get(&tenant)
                    .is_some_and(|queue| queue.waiting.is_empty())
                {
                    if let Some(queue) = self.tenants.get_mut(&tenant) {
                        queue.is_ready = false;
                    }
                    continue;
                }
                self.take_token(&tenant);
                let Some(queue) = self.tenants.get_mut(&tenant) else {
                    continue;
                };
                let Some(job) = queue.waiting.pop_front() else {
                    queue.is_ready = false;
                    continue;
                };
                queue.in_flight += 1;
                self.in_flight += 1;
                self.queued -= 1;
                started_any = true;
                if !queue.waiting.is_empty() && queue.in_flight < per_tenant {
                    self.ready.push_back(tenant.clone());
                } else {
                    queue.is_ready = false;
                }
                starting.push((tenant, job));
            }
            if !started_any {
                return starting;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TenantName {
        TenantName::new(name).unwrap()
    }

    #[test]
    fn tenants_take_turns_within_the_limits() {
        let mut slots = DeliverySlots::new(SlotPolicy {
            global: 4,
            per_tenant: 3,
            reserved: 0,
            initial_per_tenant: 3,
        });
        for i in 0..5 {
            slots.submit(t("a"), ("a", i));
        }
        slots.submit(t("b"), ("b", 0));
        let started: Vec<_> = slots.start_ready().into_iter().map(|(_, j)| j).collect();
        assert_eq!(started, [("a", 0), ("b", 0), ("a", 1), ("a", 2)]);
        assert_eq!(slots.in_flight_of(&t("a")), 3);
        slots.finish(&t("b"));
        // a is at its per-tenant limit: nothing starts.
        assert!(slots.start_ready().is_empty());
        slots.finish(&t("a"));
        assert_eq!(slots.start_ready().len(), 1);
        assert_eq!(slots.queued(), 1);
    }

    #[test]
    fn hung_tenants_cannot_take_the_reserve() {
        // Without the slow start: tenants that hang after theirs opened up.
        let policy = SlotPolicy {
            initial_per_tenant: 256,
            ..SlotPolicy::new(1_024, 256)
        };
        let mut slots = DeliverySlots::new(policy);
        // Ten tenants whose deliveries never finish, each with a backlog.
        for h in 0..10 {
            for i in 0..1_000 {
                slots.submit(t(&format!("hung{h}")), i);
            }
        }
        let hung = slots.start_ready().len();
        assert!(hung < 1_024, "hung tenants took every slot");
        // A healthy tenant arriving later starts at once, several in parallel.
        for i in 0..20 {
            slots.submit(t("healthy"), i);
        }
        let started = slots.start_ready();
        assert!(
            started.len() >= 20,
            "healthy tenant got {} slots",
            started.len()
        );
        assert!(started.iter().all(|(tenant, _)| *tenant == t("healthy")));
    }

    #[test]
    fn clearing_drops_queued_jobs_but_keeps_in_flight_counts() {
        let mut slots = DeliverySlots::new(SlotPolicy::new(1, 1));
        slots.submit(t("a"), 1);
        slots.submit(t("a"), 2);
        assert_eq!(slots.start_ready().len(), 1);
        assert_eq!(slots.clear_queued(), vec![2]);
        assert_eq!(slots.in_flight(), 1);
        slots.finish(&t("a"));
        assert_eq!(slots.in_flight(), 0);
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn jobs(started: Vec<(TenantName, (&'static str, i32))>) -> Vec<(&'static str, i32)> {
        started.into_iter().map(|(_, job)| job).collect()
    }

    #[test]
    fn a_tenant_limit_of_its_own_replaces_the_policys() {
        let mut slots = DeliverySlots::new(SlotPolicy {
            global: 10,
            per_tenant: 3,
            reserved: 0,
            initial_per_tenant: 3,
        });
        slots.set_tenant_limits(t("a"), Some(1), None);
        for i in 0..3 {
            slots.submit(t("a"), ("a", i));
            slots.submit(t("b"), ("b", i));
        }
        let started = jobs(slots.start_ready());
        assert_eq!(started, [("a", 0), ("b", 0), ("b", 1), ("b", 2)]);
        slots.finish(&t("a"));
        assert_eq!(jobs(slots.start_ready()), [("a", 1)]);
        // Raised above the global limit: clamped to it; waiting jobs start.
        slots.set_tenant_limits(t("a"), Some(100), None);
        assert_eq!(jobs(slots.start_ready()), [("a", 2)]);
        assert_eq!(slots.queued(), 0, "nothing dropped");
    }

    #[test]
    fn a_tenant_over_its_rate_waits_for_its_next_token_and_others_do_not() {
        let mut slots = DeliverySlots::new(SlotPolicy {
            global: 100,
            per_tenant: 100,
            reserved: 0,
            initial_per_tenant: 100,
        });
        slots.advance(at(0));
        slots.set_tenant_limits(t("a"), None, Some(2.0));
        for i in 0..5 {
            slots.submit(t("a"), ("a", i));
            slots.submit(t("b"), ("b", i));
        }
        let started = jobs(slots.start_ready());
        // A burst of one second's worth for a; b is not held up.
        assert_eq!(started.iter().filter(|(n, _)| *n == "a").count(), 2);
        assert_eq!(started.iter().filter(|(n, _)| *n == "b").count(), 5);
        assert_eq!(slots.next_token_at(), Some(at(500)));
        // Asked again before the token: nothing, and the same answer.
        slots.advance(at(499));
        assert!(slots.start_ready().is_empty());
        assert_eq!(slots.next_token_at(), Some(at(500)));
        slots.advance(at(500));
        assert_eq!(jobs(slots.start_ready()), [("a", 2)]);
        assert_eq!(slots.next_token_at(), Some(at(1_000)));
        // Finishing deliveries does not add tokens.
        slots.finish(&t("a"));
        slots.finish(&t("a"));
        assert!(slots.start_ready().is_empty());
        // Waiting jobs are never dropped: they all start, at the rate.
        slots.advance(at(1_500));
        assert_eq!(jobs(slots.start_ready()), [("a", 3), ("a", 4)]);
        assert_eq!(slots.queued(), 0);
        assert_eq!(slots.next_token_at(), None, "nobody waits for a token");
    }

    #[test]
    fn removing_a_rate_starts_what_waited_for_it() {
        let mut slots = DeliverySlots::new(SlotPolicy::new(10, 10));
        slots.advance(at(0));
        slots.set_tenant_limits(t("a"), None, Some(0.5));
        for i in 0..3 {
            slots.submit(t("a"), ("a", i));
        }
        assert_eq!(jobs(slots.start_ready()), [("a", 0)]);
        assert_eq!(slots.next_token_at(), Some(at(2_000)));
        slots.set_tenant_limits(t("a"), None, None);
        assert_eq!(slots.next_token_at(), None);
        assert_eq!(jobs(slots.start_ready()), [("a", 1), ("a", 2)]);
    }

    /// Room for every tenant, no reserve: only the slow start limits.
    fn slow_start(per_tenant: usize, initial_per_tenant: usize) -> SlotPolicy {
        SlotPolicy {
            global: 100,
            per_tenant,
            reserved: 0,
            initial_per_tenant,
        }
    }

    #[test]
    fn a_tenant_starts_slow_and_widens_by_one_per_answered_attempt() {
        let mut slots = DeliverySlots::new(slow_start(6, 2));
        for i in 0..20 {
            slots.submit(t("a"), ("a", i));
        }
        assert_eq!(jobs(slots.start_ready()), [("a", 0), ("a", 1)]);
        // Unanswered (a timeout): the window stays.
        slots.finish(&t("a"));
        assert_eq!(jobs(slots.start_ready()), [("a", 2)]);
        assert!(slots.start_ready().is_empty());
        // Answered: one more than before.
        slots.answered(&t("a"));
        slots.finish(&t("a"));
        assert_eq!(jobs(slots.start_ready()), [("a", 3), ("a", 4)]);
        // Every answer widens it, up to the per-tenant limit: two start
        // for each answer while it widens, one once it is at the limit.
        let mut started = Vec::new();
        for _ in 0..5 {
            slots.answered(&t("a"));
            slots.finish(&t("a"));
            started.push(slots.start_ready().len());
        }
        assert_eq!(started, [2, 2, 2, 1, 1]);
        assert_eq!(slots.in_flight_of(&t("a")), 6);
        assert_eq!(slots.queued(), 20 - 13, "nothing dropped");
    }

    #[test]
    fn a_tenant_keeps_its_window_between_bursts_and_starts_over_after_a_long_idle() {
        let mut slots = DeliverySlots::new(slow_start(50, 2));
        slots.advance(at(0));
        slots.submit(t("a"), ("a", 0));
        slots.start_ready();
        for _ in 0..10 {
            slots.answered(&t("a"));
        }
        slots.finish(&t("a"));
        // Idle for a moment (a busy tenant between two instants): the
        // window it reached stays.
        slots.advance(at(IDLE_RESET_MS - 1));
        for i in 1..=20 {
            slots.submit(t("a"), ("a", i));
        }
        assert_eq!(slots.start_ready().len(), 12);
        for _ in 0..12 {
            slots.finish(&t("a"));
            slots.start_ready();
        }
        for _ in 0..8 {
            slots.finish(&t("a"));
        }
        assert_eq!(slots.queued(), 0);
        // Idle for longer: it starts over.
        slots.advance(at(2 * IDLE_RESET_MS));
        for i in 21..=25 {
            slots.submit(t("a"), ("a", i));
        }
        assert_eq!(jobs(slots.start_ready()), [("a", 21), ("a", 22)]);
    }

    #[test]
    fn idle_windows_are_forgotten() {
        let mut slots = DeliverySlots::new(slow_start(50, 2));
        slots.advance(at(0));
        for n in 0..100 {
            let tenant = t(&format!("t{n}"));
            slots.submit(tenant.clone(), ("t", n));
            slots.start_ready();
            // Half of them widen their window.
            if n % 2 == 0 {
                slots.answered(&tenant);
            }
            slots.finish(&tenant);
        }
        assert_eq!(
            slots.windows.len(),
            50,
            "windows at their start are not kept"
        );
        slots.advance(at(IDLE_RESET_MS));
        assert!(slots.windows.is_empty());
    }

    #[test]
    fn hung_tenants_coming_due_together_hold_only_their_first_window() {
        let mut slots = DeliverySlots::new(SlotPolicy::new(1_024, 256));
        for h in 0..10 {
            for i in 0..1_000 {
                slots.submit(t(&format!("hung{h}")), i);
            }
        }
        // Their first window each at their instant, not 768 between them.
        assert_eq!(
            slots.start_ready().len(),
            10 * SlotPolicy::INITIAL_PER_TENANT
        );
        for i in 0..20 {
            slots.submit(t("healthy"), i);
        }
        let started = slots.start_ready();
        assert_eq!(started.len(), SlotPolicy::INITIAL_PER_TENANT);
        assert!(started.iter().all(|(tenant, _)| *tenant == t("healthy")));
        assert_eq!(slots.queued(), 10 * (1_000 - 16) + 4, "nothing dropped");
    }
}
