//! The fire path of one partition as a pure state machine.
//!
//! [`PartitionCore::handle`] takes an [`Input`] and the current instant and
//! returns [`Action`]s; the runtime (the engine's partition worker) performs
//! them — page the due index, read records ahead, hand fired entries to the
//! dispatcher — and feeds their results back as inputs. Nothing else holds
//! fire-path state, so a test loop with a manual clock *is* a runtime (see
//! the simulation in `tests/simulation.rs`).
//!
//! # What the core holds, all bounded by [`CoreConfig`]
//! - the [`FairWindow`]: entries due within `window`, one lane per tenant;
//! - the loader state: one page read in flight at a time (window page,
//!   per-tenant page after an eviction, or a repair page), with the wake-ups
//!   that arrived meanwhile for the range being read;
//! - the read-ahead: records of entries due within `read_ahead`;
//! - *outstanding* entries: fired and not yet finished (queued for a
//!   delivery slot, being delivered, or waiting for their outcome to be
//!   recorded), with the version each one claimed;
//! - retry timers: entries to put back after a pause (a failed read);
//! - holds: paused tenants, and tenants whose circuit is open, whose
//!   lanes do not fire until they resume (or the circuit lets one out);
//! - the repair cursor: the window is reconciled with the store page by
//!   page, so a lost wake-up strands nothing for longer than a few rounds.
//!
//! # Guarantees (checked by the simulation's oracle)
//! - Never early: an entry is fired only when `now >= due`.
//! - Bounded: whenever `handle` returns, [`PartitionCore::held`] (window +
//!   outstanding + retry timers) is at most `capacity` (a page may exceed
//!   it only while it is being applied); a tenant has at most
//!   `max_outstanding_per_tenant` outstanding entries in this partition.
//! - One delivery per version at a time: a second fired copy of an entry
//!   whose version is claimed is dropped.

pub mod decide;
mod slots;
mod window;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

pub use slots::{DeliverySlots, SlotPolicy};
pub use window::{EvictedRun, FairWindow};

use crate::event::EventRecord;
use crate::ids::{EventId, EventKey, EventVersion, TenantName};
use crate::time::Timestamp;
use crate::timer::DueCursor;

/// Entries of a blocked tenant's lane read ahead: none. It cannot fire
/// until one of its deliveries ends, and reading its next records then is
/// cheap; reading them at the instant ten hung tenants blocked was
/// thousands of reads while other tenants' events were due.
const BLOCKED_READ_AHEAD: usize = 0;

/// The core's knobs.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// How far ahead entries are paged in.
    pub window: Duration,
    /// Most entries held (window, outstanding and retry timers together).
    pub capacity: usize,
    /// How long before their instant entries' records are read ahead; a
    /// round starts once an entry is due within half of it, so a store
    /// stall shorter than that half delays no delivery. Zero turns
    /// read-ahead off (records are then read when the entry fires).
    pub read_ahead: Duration,
    pub read_ahead_max_records: usize,
    pub read_ahead_max_bytes: usize,
    /// Most entries handed over per [`Action::Deliver`].
    pub fire_batch: usize,
    /// Most entries of one tenant outstanding at once in this partition:
    /// a tenant whose deliveries hang stops taking entries here and its
    /// backlog stays in the store.
    pub max_outstanding_per_tenant: usize,
    /// How long a tenant stays blocked before its lane is trimmed to
    /// [`CoreConfig::blocked_lane_cap`]. A busy healthy tenant reaches its
    /// outstanding bound in a stall of a few tens of milliseconds; trimming
    /// it then evicted thousands of entries per partition that were paged
    /// back a moment later, and that work made the next stall. A hung
    /// tenant stays blocked for its whole timeout.
    pub blocked_trim_after: Duration,
    /// How often a repair page is read; zero disables repairs.
    pub repair_interval: Duration,
    /// Entries per repair page.
    pub repair_page: usize,
    /// Pause after a failed page read.
    pub load_retry: Duration,
    /// How long a paused tenant's lane is held before one of its entries
    /// fires again, to learn whether it was resumed through another node
    /// (a resume through this node ends the hold at once:
    /// [`Input::Resumed`]). One entry per partition and interval, not a
    /// retry of every held entry.
    pub hold_recheck: Duration,
}

impl CoreConfig {
    /// Entries a blocked tenant keeps in the window (see
    /// `PartitionCore::enforce_capacity`).
    pub fn blocked_lane_cap(&self) -> usize {
        4 * self.max_outstanding_per_tenant.max(1)
    }

    /// Defaults for a partition holding at most `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        CoreConfig {
            window: Duration::from_secs(60),
            capacity: capacity.max(64),
            read_ahead: Duration::from_secs(3),
            read_ahead_max_records: 4_096,
            read_ahead_max_bytes: 2 * 1024 * 1024,
            fire_batch: 2_048,
            max_outstanding_per_tenant: 256,
            blocked_trim_after: Duration::from_secs(1),
            repair_interval: Duration::from_secs(5),
            // Small: a page per interval in each partition is a steady read
            // load (1,024 read more rows than 10,000 deliveries/s did on
            // PostgreSQL); a sweep of the window takes more rounds instead.
            repair_page: 128,
            load_retry: Duration::from_millis(500),
            // The engine's tenant cache keeps a config this long: a
            // resume through another node is seen within two of these.
            hold_recheck: Duration::from_secs(5),
        }
    }
}

/// Which kind of page a [`LoadRequest`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadKind {
    /// The next page after the window's cursor.
    Window,
    /// A tenant's entries that were evicted or skipped (its overflow).
    Tenant(TenantName),
    /// A page of the covered range, to find entries a lost wake-up left out.
    Repair,
}

/// A due-index page to read: entries after `after` (exclusive) due at or
/// before `through`, of `tenant` only if it is set, at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadRequest {
    pub kind: LoadKind,
    pub after: Option<DueCursor>,
    pub through: Timestamp,
    pub limit: usize,
    /// The window's cursor when the request was made: a per-tenant or
    /// repair page never adds entries beyond it.
    upto: Option<DueCursor>,
    /// Tells apart two requests for the same range: the answer to one
    /// dropped by a `Reload` is not taken for a new one's.
    seq: u64,
    /// Tenants whose entries the answer may leave out (window pages only):
    /// they overflow, so the page would skip their entries anyway (their
    /// backlog comes back by per-tenant pages). The store can then seek
    /// past a hung tenant's backlog instead of reading all of it.
    pub skip: Vec<TenantName>,
}

impl LoadRequest {
    pub fn tenant(&self) -> Option<&TenantName> {
        match &self.kind {
            LoadKind::Tenant(tenant) => Some(tenant),
            _ => None,
        }
    }
}

/// An entry handed to the dispatcher, with its record if it was read ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub entry: DueCursor,
    pub record: Option<EventRecord>,
}

/// How a fired entry ended, as far as this partition is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Its outcome is recorded (or it was stale and dropped): forget it.
    Done,
    /// Not delivered (the store could not be read): fire it again at this
    /// instant.
    RetryAt(Timestamp),
    /// Not delivered: its tenant is paused ([`decide::Route::Hold`]). It
    /// goes back to the window, and the tenant's lane fires nothing until
    /// it resumes ([`Input::Resumed`], or a recheck after
    /// [`CoreConfig::hold_recheck`] finds it resumed).
    Held,
    /// Not delivered: its tenant's circuit is open
    /// ([`crate::breaker::Admission::Hold`]) until this instant. Held like
    /// [`Finish::Held`], the recheck coming at this instant if that is
    /// sooner; [`Input::CircuitClosed`] ends the hold at once.
    HeldUntil(Timestamp),
}

/// What happened, fed to [`PartitionCore::handle`].
#[derive(Debug, Clone)]
pub enum Input {
    /// Time passed, or something changed: re-evaluate. `may_fire` is the
    /// partition lease's verdict right now.
    Tick { may_fire: bool },
    /// A new, moved or retried event: kept if the window covers it.
    Offer(DueCursor),
    /// An event moved away, was cancelled or finished.
    Remove(DueCursor),
    /// Wake-ups may have been lost (a push channel reconnected): drop the
    /// window and page it in again.
    Reload,
    /// A write of this event failed, so whether it changed is not known (it
    /// may have committed before the error): its outstanding entries read
    /// their record again before delivering, as after a wake-up. The
    /// runtime follows it with [`Input::Reload`] for the window and what
    /// was read ahead.
    MayHaveChanged(EventKey),
    /// The answer to [`Action::Load`]; `None` if the read failed.
    Loaded {
        request: LoadRequest,
        page: Option<Vec<DueCursor>>,
    },
    /// The answer to [`Action::ReadAhead`]; `None` if the read failed.
    ReadAhead {
        records: Option<Vec<(EventKey, Option<EventRecord>)>>,
    },
    /// A fired entry's delivery is about to start with this record version:
    /// answered by [`Action::Claimed`].
    Claim {
        entry: DueCursor,
        version: EventVersion,
    },
    /// A fired entry's delivery attempt ended; its outcome is being
    /// recorded and [`Input::Finished`] follows. From here it no longer
    /// counts against its tenant's outstanding bound: that bound is for
    /// deliveries waiting on the tenant, not for the node's own writes (a
    /// busy tenant was blocked while its outcomes queued behind other
    /// commits). It stays outstanding, and in the budget, until finished.
    Attempted { entry: DueCursor },
    /// A fired entry is finished (see [`Finish`]).
    Finished { entry: DueCursor, finish: Finish },
    /// The tenant was paused through this node: hold its lane at once,
    /// before any more of its entries fire (any that do come back
    /// [`Finish::Held`]).
    Paused(TenantName),
    /// The tenant was resumed: its lane fires again, in due order.
    Resumed(TenantName),
    /// The tenant's circuit closed on this node: its lane fires again, in
    /// due order (a lane also held for a pause is held again by its next
    /// entry).
    CircuitClosed(TenantName),
}

/// What the runtime must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read a due-index page; answer with [`Input::Loaded`].
    Load(LoadRequest),
    /// Read these records; answer with [`Input::ReadAhead`].
    ReadAhead(Vec<EventKey>),
    /// Deliver these entries (each one is outstanding until
    /// [`Input::Finished`]).
    Deliver(Vec<Fired>),
    /// The answer to [`Input::Claim`]. `false`: do not deliver, and do not
    /// finish the entry either (the core did: another delivery of the same
    /// version is in progress, and this copy was put on a retry timer; or
    /// the entry is not outstanding at all).
    Claimed { entry: DueCursor, granted: bool },
    /// The answer to [`Input::Claim`] for an entry whose event changed
    /// after it fired: the record the claim was made with may predate the
    /// change. Read it again, check it, and claim again.
    Reread { entry: DueCursor },
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Entries a repair page found missing from the window and armed.
    pub repaired: u64,
    /// Entries evicted for capacity (paged in again later).
    pub evicted: u64,
    pub fired: u64,
    /// Fired copies dropped because their version was being delivered.
    pub duplicate_claims: u64,
    pub load_failures: u64,
}

#[derive(Debug, Default)]
struct ReadAhead {
    records: HashMap<EventKey, EventRecord>,
    payload_bytes: usize,
    /// Per tenant: entries up to here were requested (or skipped).
    requested_through: HashMap<TenantName, (Timestamp, EventId)>,
    /// Keys of the read in flight, if one is.
    in_flight: Option<HashSet<EventKey>>,
    /// Keys that got a wake-up while their read was in flight.
    stale: HashSet<EventKey>,
    /// Per tenant: records held plus keys in flight. A tenant never gets
    /// more than its outstanding bound: it could not fire more at once, and
    /// a hung tenant's backlog due at one instant would otherwise take the
    /// whole read-ahead of every partition (thousands of reads for records
    /// that cannot fire).
    per_tenant: HashMap<TenantName, usize>,
}

impl ReadAhead {
    /// Drops what was read for `entry`'s key. The tenant's mark is left
    /// alone: a removed or evicted entry needs no read (see
    /// [`ReadAhead::rewind`] for an offered one).
    fn invalidate(&mut self, entry: &DueCursor) {
        self.remove_record(&entry.key);
        if self
            .in_flight
            .as_ref()
            .is_some_and(|keys| keys.contains(&entry.key))
        {
            self.stale.insert(entry.key.clone());
        }
    }

    /// [`ReadAhead::invalidate`] for a run of one tenant's entries evicted
    /// from the window. Entries after the tenant's mark were never
    /// requested, so most of a large eviction (a hung tenant's lane
    /// trimmed) is skipped by one range lookup.
    fn invalidate_evicted(&mut self, tenant: &TenantName, run: &BTreeSet<(Timestamp, EventId)>) {
        let requested: Vec<&(Timestamp, EventId)> = match self.requested_through.get(tenant) {
            Some(mark) => run.range(..=mark).collect(),
            None => run.iter().collect(),
        };
        for (due, id) in requested {
            self.invalidate(&DueCursor {
                due: *due,
                key: EventKey::new(tenant.clone(), id.clone()),
            });
        }
    }

    /// An entry offered at or before its tenant's mark is read in the next
    /// round: the mark moves back to just before it (`before`: the lane's
    /// previous entry), not to the start, so the next round does not walk
    /// again through every entry already read.
    fn rewind(&mut self, entry: &DueCursor, before: Option<(Timestamp, EventId)>) {
        if let Some(mark) = self.requested_through.get(&entry.key.tenant)
            && (entry.due, &entry.key.id) <= (mark.0, &mark.1)
        {
            match before {
                Some(before) => {
                    self.requested_through
                        .insert(entry.key.tenant.clone(), before);
                }
                None => {
                    self.requested_through.remove(&entry.key.tenant);
                }
            }
        }
    }

    fn reset(&mut self) {
        self.records.clear();
        self.payload_bytes = 0;
        self.requested_through.clear();
        self.per_tenant.clear();
        if let Some(keys) = &self.in_flight {
            self.stale.extend(keys.iter().cloned());
            for key in keys {
                *self.per_tenant.entry(key.tenant.clone()).or_default() += 1;
            }
        }
    }

    fn take(&mut self, entry: &DueCursor) -> Option<EventRecord> {
        let record = self.remove_record(&entry.key)?;
        (record.next_fire_at == Some(entry.due)).then_some(record)
    }

    fn remove_record(&mut self, key: &EventKey) -> Option<EventRecord> {
        let record = self.records.remove(key)?;
        self.payload_bytes -= payload_len(&record);
        self.uncount(&key.tenant);
        Some(record)
    }

    /// How many more of `tenant`'s records may be requested.
    fn tenant_room(&self, tenant: &TenantName, bound: usize) -> usize {
        bound.saturating_sub(self.per_tenant.get(tenant).copied().unwrap_or(0))
    }

    /// [`ReadAhead::tenant_room`], when it is enough to start a round for
    /// `tenant`: half its bound. Each fired entry frees one record of
    /// room, and a round per fired entry was a store read, a task and one
    /// more tick of the worker per delivery; with half the bound still
    /// read, the tenant's next entries keep their records meanwhile.
    fn room_to_start_round(&self, tenant: &TenantName, bound: usize) -> usize {
        let room = self.tenant_room(tenant, bound);
        if room >= bound.div_ceil(2) { room } else { 0 }
    }

    fn uncount(&mut self, tenant: &TenantName) {
        if let Some(count) = self.per_tenant.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }

    fn has_room(&self, config: &CoreConfig) -> bool {
        self.records.len() < config.read_ahead_max_records
            && self.payload_bytes < config.read_ahead_max_bytes
    }
}

fn payload_len(record: &EventRecord) -> usize {
    record.payload.as_ref().map_or(0, String::len)
}

/// A page read in flight, and the wake-ups that arrived for its range.
#[derive(Debug)]
struct PendingLoad {
    request: LoadRequest,
    /// Offers inside the range being read: applied after the page, so an
    /// offer sent after a commit the read missed is not lost.
    offers: Vec<DueCursor>,
    /// Removals meanwhile: a repair page must not re-add them.
    removed: HashSet<DueCursor>,
    /// More offers came than could be kept: the page is discarded.
    overflowed: bool,
}

/// A paused tenant's lane, or one whose circuit is open (see
/// [`CoreConfig::hold_recheck`], [`Finish::HeldUntil`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hold {
    /// Fires nothing until this instant.
    Until(Timestamp),
    /// The recheck is due: the lane may fire one entry.
    Recheck,
    /// That entry fired: the hold ends when it finishes other than
    /// [`Finish::Held`], and starts over when it comes back held.
    Probing(DueCursor),
}

/// A tenant's outstanding entries in one partition.
#[derive(Debug, Default, Clone, Copy)]
struct TenantOutstanding {
    /// Fired and not finished: the budget's rule (over it, only a tenant
    /// with none may fire) counts these.
    total: usize,
    /// Of those, the ones whose attempt ended and whose outcome is being
    /// recorded.
    attempted: usize,
}

impl TenantOutstanding {
    /// What [`CoreConfig::max_outstanding_per_tenant`] bounds: entries
    /// whose delivery may still be waiting on the tenant.
    fn in_attempt(self) -> usize {
        self.total - self.attempted
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct PartitionCore {
    config: CoreConfig,
    window: FairWindow,
    loading: Option<PendingLoad>,
    /// When the last page read failed.
    load_failed_at: Option<Timestamp>,
    read_ahead: ReadAhead,
    /// Fired, not finished: the claimed version once the delivery started.
    outstanding: HashMap<DueCursor, Option<EventVersion>>,
    outstanding_by_tenant: HashMap<TenantName, TenantOutstanding>,
    /// Outstanding entries whose attempt ended ([`Input::Attempted`]).
    attempted: HashSet<DueCursor>,
    /// Tenants blocked because the outstanding budget is spent.
    budget_blocked: HashSet<TenantName>,
    /// Claimed versions, to drop a second copy of one.
    claimed: HashSet<(EventKey, EventVersion)>,
    retry_timers: BTreeSet<(Timestamp, DueCursor)>,
    /// The same timers by entry: an entry waiting for its timer is not
    /// held or fired from anywhere else meanwhile.
    retry_at: HashMap<DueCursor, Timestamp>,
    /// Outstanding entries by key, to find them when their event changes.
    outstanding_by_key: HashMap<EventKey, Vec<DueCursor>>,
    /// Outstanding entries whose event changed after they fired: their
    /// record, read before the change, is read again before delivering.
    reread: HashSet<DueCursor>,
    /// … and they are offered again once finished (a cancel and re-create
    /// at the same instant arrives as an offer of the outstanding entry).
    reoffer: HashSet<DueCursor>,
    /// Outstanding entries whose tenant was resumed (or its circuit
    /// closed) while they were out: one that comes back held was judged
    /// before the resume, so it goes out again instead of holding the lane
    /// until the next recheck.
    released: HashSet<DueCursor>,
    /// Numbers page requests (see [`LoadRequest`]).
    load_seq: u64,
    /// Where the next repair page starts (exclusive); `None`: the start.
    repair_after: Option<DueCursor>,
    next_repair_at: Option<Timestamp>,
    stats: CoreStats,
    /// A blocked tenant's lane may be over its cap: trimmed a step per
    /// tick once it was blocked long enough (see
    /// [`PartitionCore::trim_blocked_lanes`]).
    trim_pending: bool,
    /// When the pending trim is due; `None`: look at the next tick.
    next_trim_at: Option<Timestamp>,
    /// Since when each blocked tenant over its lane cap was seen blocked.
    blocked_since: HashMap<TenantName, Timestamp>,
    /// Paused tenants and open circuits: their lanes stay blocked (and are
    /// trimmed like any blocked lane) until they resume or close.
    holds: HashMap<TenantName, Hold>,
}

impl PartitionCore {
    pub fn new(config: CoreConfig) -> Self {
        PartitionCore {
            config,
            window: FairWindow::new(),
            loading: None,
            load_failed_at: None,
            read_ahead: ReadAhead::default(),
            outstanding: HashMap::new(),
            outstanding_by_tenant: HashMap::new(),
            attempted: HashSet::new(),
            budget_blocked: HashSet::new(),
            claimed: HashSet::new(),
            retry_timers: BTreeSet::new(),
            retry_at: HashMap::new(),
            outstanding_by_key: HashMap::new(),
            reread: HashSet::new(),
            reoffer: HashSet::new(),
            released: HashSet::new(),
            repair_after: None,
            load_seq: 0,
            next_repair_at: None,
            stats: CoreStats::default(),
            trim_pending: false,
            next_trim_at: None,
            blocked_since: HashMap::new(),
            holds: HashMap::new(),
        }
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    pub fn stats(&self) -> &CoreStats {
        &self.stats
    }

    pub fn window(&self) -> &FairWindow {
        &self.window
    }

    /// Entries fired and not finished.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Everything held in memory: window, outstanding, retry timers, and
    /// records read ahead.
    pub fn held(&self) -> usize {
        self.window.len() + self.outstanding.len() + self.retry_timers.len()
    }

    pub fn read_ahead_records(&self) -> usize {
        self.read_ahead.records.len()
    }

    /// Handles one input at `now`; returns what the runtime must do.
    pub fn handle(&mut self, input: Input, now: Timestamp) -> Vec<Action> {
        let mut actions = Vec::new();
        match input {
            Input::Tick { may_fire } => self.tick(now, may_fire, &mut actions),
            Input::Offer(entry) => self.offer(entry),
            Input::Remove(entry) => {
                self.read_ahead.invalidate(&entry);
                self.window.remove(&entry);
                self.mark_changed(&entry.key);
                if let Some(pending) = &mut self.loading {
                    pending.removed.insert(entry);
                }
            }
            Input::MayHaveChanged(key) => self.mark_changed(&key),
            Input::Reload => {
                self.window.clear();
                self.read_ahead.reset();
                self.repair_after = None;
                // A page in flight answers for the old window: ignored.
                self.loading = None;
                // Clearing the window dropped the tenants' blocked flags;
                // their outstanding counts still stand.
                let blocked: Vec<TenantName> = self
                    .outstanding_by_tenant
                    .iter()
                    .filter(|(_, n)| n.in_attempt() >= self.config.max_outstanding_per_tenant)
                    .map(|(t, _)| t.clone())
                    .chain(self.budget_blocked.iter().cloned())
                    .chain(
                        self.holds
                            .iter()
                            .filter(|(_, hold)| **hold != Hold::Recheck)
                            .map(|(t, _)| t.clone()),
                    )
                    .collect();
                for tenant in blocked {
                    self.window.set_blocked(&tenant, true);
                    self.trim_soon();
                }
            }
            Input::Loaded { request, page } => self.loaded(request, page, now),
            Input::ReadAhead { records } => self.read_ahead_done(records),
            Input::Claim { entry, version } => self.claim(entry, version, now, &mut actions),
            Input::Attempted { entry } => self.attempted(entry),
            Input::Finished { entry, finish } => self.finished(entry, finish, now),
            Input::Paused(tenant) => self.hold(&tenant, now.plus(self.config.hold_recheck)),
            Input::Resumed(tenant) | Input::CircuitClosed(tenant) => {
                let out = self.outstanding.keys().filter(|e| e.key.tenant == tenant);
                self.released.extend(out.cloned());
                if self.holds.remove(&tenant).is_some() {
                    self.unblock_if_free(&tenant);
                }
            }
        }
        actions
    }

    /// Whether a delivery of `version` of `key` has claimed it and not
    /// finished: it may have reached the receiver. Asked after a wake-up
    /// for the key (a cancel, a move), it is exact: a delivery that read
    /// the record before the change and claims after it reads it again.
    pub fn is_claimed(&self, key: &EventKey, version: &EventVersion) -> bool {
        self.claimed.contains(&(key.clone(), version.clone()))
    }

    /// Whether `tenant`'s lane is held because it is paused.
    pub fn is_held(&self, tenant: &TenantName) -> bool {
        self.holds
            .get(tenant)
            .is_some_and(|hold| *hold != Hold::Recheck)
    }

    /// When the runtime should call [`Input::Tick`] next at the latest
    /// (it also ticks after every other input).
    pub fn next_wake(&self, now: Timestamp) -> Timestamp {
        let half_window = self.config.window / 2;
        let mut wake = now.plus(Duration::from_secs(1));
        if self.trim_pending {
            match self.next_trim_at {
                None => return now,
                Some(at) => wake = wake.min(at),
            }
        }
        if let Some(due) = self.window.next_ready() {
            wake = wake.min(due);
        }
        if let Some(due) = self.window.next_internal_held() {
            wake = wake.min(due);
        }
        if self.loading.is_none() {
            match (self.load_failed_at, self.window.cursor()) {
                (Some(failed), _) => wake = wake.min(failed.plus(self.config.load_retry)),
                (None, None) => wake = now,
                // `start_load` pages when `cursor.due < now + window / 2`:
                // the first millisecond that holds.
                (None, Some(cursor)) => {
                    wake = wake.min(cursor.due.minus(half_window).plus(Duration::from_millis(1)));
                }
            }
        }
        if let Some((at, _)) = self.retry_timers.first() {
            wake = wake.min(*at);
        }
        for hold in self.holds.values() {
            if let Hold::Until(at) = hold {
                wake = wake.min(*at);
            }
        }
        if let Some(at) = self.next_repair_at
            && self.loading.is_none()
            && self.load_failed_at.is_none()
        {
            wake = wake.min(at);
        }
        if !self.config.read_ahead.is_zero()
            && self.read_ahead.in_flight.is_none()
            && self.read_ahead.has_room(&self.config)
        {
            let bound = self.config.max_outstanding_per_tenant;
            let first_unread = self.window.due_through(
                Timestamp::from_millis(i64::MAX),
                |tenant| self.read_ahead.requested_through.get(tenant).cloned(),
                1,
                BLOCKED_READ_AHEAD,
                |tenant| self.read_ahead.room_to_start_round(tenant, bound),
            );
            if let Some(next) = first_unread.first() {
                wake = wake.min(next.due.minus(self.config.read_ahead / 2));
            }
        }
        wake.max(now)
    }

    fn offer(&mut self, entry: DueCursor) {
        self.read_ahead.invalidate(&entry);
        let before = self.window.lane_before(&entry);
        self.read_ahead.rewind(&entry, before);
        self.mark_changed(&entry.key);
        if let Some(pending) = &mut self.loading {
            pending.removed.remove(&entry);
            let in_range = pending.request.after.as_ref().is_none_or(|a| &entry > a)
                && entry.due <= pending.request.through
                && pending
                    .request
                    .tenant()
                    .is_none_or(|t| *t == entry.key.tenant);
            if in_range && !self.window.covers(&entry) {
                if pending.offers.len() < self.config.capacity {
                    pending.offers.push(entry);
                } else {
                    // Bounded: the page will not move the cursor, so the
                    // next read covers this offer's range again.
                    pending.overflowed = true;
                }
                return;
            }
        }
        if self.outstanding.contains_key(&entry) {
            // Fired already: offered again once finished.
            return;
        }
        if !self.retry_at.contains_key(&entry) && self.window.insert(entry, false) {
            self.enforce_capacity();
        }
    }

    /// A wake-up for `key`: an outstanding entry of it must read its record
    /// again before delivering.
    fn mark_changed(&mut self, key: &EventKey) {
        if let Some(entries) = self.outstanding_by_key.get(key) {
            self.reread.extend(entries.iter().cloned());
            self.reoffer.extend(entries.iter().cloned());
        }
    }

    /// Whether `entry` may be put in the window: not fired and unfinished,
    /// not waiting for a retry timer.
    fn may_hold(&self, entry: &DueCursor) -> bool {
        !self.outstanding.contains_key(entry) && !self.retry_at.contains_key(entry)
    }

    fn claim(
        &mut self,
        entry: DueCursor,
        version: EventVersion,
        now: Timestamp,
        actions: &mut Vec<Action>,
    ) {
        if !self.outstanding.contains_key(&entry) {
            actions.push(Action::Claimed {
                entry,
                granted: false,
            });
            return;
        }
        if self.reread.remove(&entry) {
            actions.push(Action::Reread { entry });
            return;
        }
        if self.claimed.insert((entry.key.clone(), version.clone())) {
            self.outstanding.insert(entry.clone(), Some(version));
            actions.push(Action::Claimed {
                entry,
                granted: true,
            });
            return;
        }
        // Another entry of the same version is being delivered (this one is
        // its retry, come due before that attempt finished): try again
        // after a pause rather than drop it.
        self.stats.duplicate_claims += 1;
        self.finished(
            entry.clone(),
            Finish::RetryAt(now.plus(self.config.load_retry)),
            now,
        );
        actions.push(Action::Claimed {
            entry,
            granted: false,
        });
    }

    fn tick(&mut self, now: Timestamp, may_fire: bool, actions: &mut Vec<Action>) {
        while let Some((at, _)) = self.retry_timers.first() {
            if *at > now {
                break;
            }
            if let Some((_, entry)) = self.retry_timers.pop_first() {
                self.retry_at.remove(&entry);
                if !self.outstanding.contains_key(&entry) {
                    self.window.insert(entry, true);
                }
            }
        }
        self.recheck_holds(now);
        if self.outstanding.is_empty() {
            // Nothing outstanding means nothing may stay blocked (but a
            // paused tenant): a safety net, so a block whose release was
            // missed cannot strand a tenant's events.
            self.budget_blocked.clear();
            for tenant in self.window.blocked_tenants() {
                self.unblock(&tenant);
            }
        }
        if may_fire {
            self.fire_due(now, actions);
        }
        self.trim_blocked_lanes(now);
        self.start_load(now, actions);
        if may_fire {
            self.start_read_ahead(now, actions);
        }
    }

    /// Outstanding entries beyond which only tenants with none outstanding
    /// here may fire: half the capacity, so the window keeps room to page
    /// in what comes due next, and tenants whose deliveries hang cannot
    /// use it all up.
    fn outstanding_budget(&self) -> usize {
        (self.config.capacity / 2).max(1)
    }

    fn fire_due(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        let budget = self.outstanding_budget();
        let mut fired = Vec::new();
        while fired.len() < self.config.fire_batch {
            // An internal entry of a blocked lane (a paused tenant's
            // schedule or notice) fires past the block and the budget: it
            // takes no delivery slot.
            let (entry, internal_held) = match self.window.pop_ready(now) {
                Some(entry) => (entry, false),
                None => match self.window.pop_internal_held(now) {
                    Some(entry) => (entry, true),
                    None => break,
                },
            };
            debug_assert!(entry.due <= now, "never early");
            let tenant = entry.key.tenant.clone();
            let count = self
                .outstanding_by_tenant
                .entry(tenant.clone())
                .or_default();
            if !internal_held && self.outstanding.len() >= budget && count.total > 0 {
                // Over budget: this tenant waits until something finishes;
                // a tenant with nothing outstanding here may still fire one.
                self.window.insert(entry, true);
                self.window.set_blocked(&tenant, true);
                self.trim_soon();
                self.budget_blocked.insert(tenant);
                continue;
            }
            let record = self.read_ahead.take(&entry);
            count.total += 1;
            // An internal entry of a blocked lane leaves the lane as it
            // was: blocked, its hold (and recheck) untouched.
            if !internal_held {
                if count.in_attempt() >= self.config.max_outstanding_per_tenant {
                    self.window.set_blocked(&tenant, true);
                    self.trim_soon();
                }
                if let Some(hold) = self.holds.get_mut(&tenant) {
                    // A paused tenant's recheck fires this one entry only.
                    *hold = Hold::Probing(entry.clone());
                    self.window.set_blocked(&tenant, true);
                }
            }
            self.outstanding.insert(entry.clone(), None);
            self.outstanding_by_key
                .entry(entry.key.clone())
                .or_default()
                .push(entry.clone());
            fired.push(Fired { entry, record });
        }
        if !fired.is_empty() {
            self.stats.fired += fired.len() as u64;
            actions.push(Action::Deliver(fired));
        }
    }

    fn finished(&mut self, entry: DueCursor, finish: Finish, now: Timestamp) {
        let Some(claimed) = self.outstanding.remove(&entry) else {
            return;
        };
        if let Some(version) = claimed {
            self.claimed.remove(&(entry.key.clone(), version));
        }
        let was_attempted = self.attempted.remove(&entry);
        let tenant = entry.key.tenant.clone();
        let finish = match finish {
            Finish::Held | Finish::HeldUntil(_) if self.released.remove(&entry) => {
                Finish::RetryAt(now)
            }
            finish => {
                self.released.remove(&entry);
                finish
            }
        };
        if finish == Finish::Held {
            self.hold(&tenant, now.plus(self.config.hold_recheck));
        } else if let Finish::HeldUntil(until) = finish {
            self.hold(&tenant, until.min(now.plus(self.config.hold_recheck)));
        } else if self.holds.get(&tenant) == Some(&Hold::Probing(entry.clone())) {
            // The recheck's entry went out (or was stale): the tenant was
            // resumed elsewhere, or its next entry holds it again.
            self.holds.remove(&tenant);
        }
        if let Some(count) = self.outstanding_by_tenant.get_mut(&tenant) {
            count.total -= 1;
            if was_attempted {
                count.attempted -= 1;
            }
            let count = *count;
            if count.in_attempt() < self.config.max_outstanding_per_tenant
                && !self.budget_blocked.contains(&tenant)
            {
                self.unblock(&tenant);
            }
            if count.total == 0 {
                self.outstanding_by_tenant.remove(&tenant);
                // Over the budget, a tenant with nothing outstanding may
                // fire again: waiting for the budget would hold it behind
                // hung tenants that keep the budget spent.
                if self.budget_blocked.remove(&tenant) {
                    self.unblock(&tenant);
                }
            }
        }
        if self.outstanding.len() < self.outstanding_budget() {
            for tenant in std::mem::take(&mut self.budget_blocked) {
                let count = self.outstanding_by_tenant.get(&tenant).copied();
                if count.unwrap_or_default().in_attempt() < self.config.max_outstanding_per_tenant {
                    self.unblock(&tenant);
                }
            }
        }
        self.reread.remove(&entry);
        let changed = self.reoffer.remove(&entry);
        if let Some(entries) = self.outstanding_by_key.get_mut(&entry.key) {
            entries.retain(|e| *e != entry);
            if entries.is_empty() {
                self.outstanding_by_key.remove(&entry.key);
            }
        }
        match finish {
            Finish::RetryAt(at) => {
                if let Some(old) = self.retry_at.insert(entry.clone(), at) {
                    self.retry_timers.remove(&(old, entry.clone()));
                }
                self.window.remove(&entry);
                self.retry_timers.insert((at, entry));
            }
            // A wake-up came while it was outstanding: offered again (the
            // fire-time check drops it if nothing is due there any more).
            Finish::Done if changed => self.offer(entry),
            Finish::Done => {}
            // Back in its lane, which the hold keeps from firing; where
            // the window no longer covers it, the loader brings it back.
            Finish::Held | Finish::HeldUntil(_) => self.offer(entry),
        }
    }

    /// Holds `tenant`'s lane until `recheck`: it is paused, or its circuit
    /// open (see [`Hold`]).
    fn hold(&mut self, tenant: &TenantName, recheck: Timestamp) {
        self.holds.insert(tenant.clone(), Hold::Until(recheck));
        self.window.set_blocked(tenant, true);
        self.trim_soon();
    }

    /// Holds whose recheck is due let their lane fire one entry.
    fn recheck_holds(&mut self, now: Timestamp) {
        let due: Vec<TenantName> = self
            .holds
            .iter()
            .filter(|(_, hold)| matches!(hold, Hold::Until(at) if *at <= now))
            .map(|(tenant, _)| tenant.clone())
            .collect();
        for tenant in due {
            self.holds.insert(tenant.clone(), Hold::Recheck);
            self.unblock_if_free(&tenant);
        }
    }

    /// Unblocks `tenant` unless its outstanding entries or the budget
    /// still block it.
    fn unblock_if_free(&mut self, tenant: &TenantName) {
        let in_attempt = self
            .outstanding_by_tenant
            .get(tenant)
            .copied()
            .unwrap_or_default()
            .in_attempt();
        if in_attempt < self.config.max_outstanding_per_tenant
            && !self.budget_blocked.contains(tenant)
        {
            self.unblock(tenant);
        }
    }

    /// An outstanding entry's attempt ended: it stops counting against
    /// its tenant's bound (see [`Input::Attempted`]).
    fn attempted(&mut self, entry: DueCursor) {
        if !self.outstanding.contains_key(&entry) || !self.attempted.insert(entry.clone()) {
            return;
        }
        let tenant = &entry.key.tenant;
        let Some(count) = self.outstanding_by_tenant.get_mut(tenant) else {
            return;
        };
        count.attempted += 1;
        if count.in_attempt() < self.config.max_outstanding_per_tenant
            && !self.budget_blocked.contains(tenant)
        {
            self.unblock(tenant);
        }
    }

    /// Keeps held entries within the capacity by evicting the largest
    /// tenant's latest entries.
    ///
    /// A blocked tenant (at its outstanding bound: its deliveries hang or
    /// are slow) keeps at most [`CoreConfig::blocked_lane_cap`] entries:
    /// enough to go on as its slots free, while its backlog stays in the
    /// store instead of filling the window up to the capacity.
    fn enforce_capacity(&mut self) {
        let others = self.outstanding.len() + self.retry_timers.len();
        let max = self.config.capacity.saturating_sub(others);
        let read_ahead = &mut self.read_ahead;
        let evicted = self.window.evict_to(max, &mut |tenant, run| {
            read_ahead.invalidate_evicted(tenant, &run.0);
        });
        self.stats.evicted += evicted as u64;
        let cap = self.config.blocked_lane_cap();
        if !self.window.blocked_over(cap).is_empty() {
            self.trim_soon();
        }
    }

    /// The tenant may fire again, unless it is held (paused); a later
    /// block counts its time afresh.
    fn unblock(&mut self, tenant: &TenantName) {
        if self.is_held(tenant) {
            return;
        }
        self.window.set_blocked(tenant, false);
        self.blocked_since.remove(tenant);
    }

    /// A blocked lane may be over its cap: the next tick looks.
    fn trim_soon(&mut self) {
        self.trim_pending = true;
        self.next_trim_at = None;
    }

    /// Entries trimmed from blocked lanes per tick: a hung tenant's lane
    /// trimmed in every partition at once was a million entries freed in
    /// one go, and other tenants' events waited for the runtime's workers.
    const TRIM_STEP: usize = 2_048;

    /// Trims the lanes of tenants blocked for at least
    /// [`CoreConfig::blocked_trim_after`] towards
    /// [`CoreConfig::blocked_lane_cap`], by at most [`Self::TRIM_STEP`]
    /// entries; `trim_pending` stays set (and the core wakes when the next
    /// step is due) until no blocked lane is over its cap.
    fn trim_blocked_lanes(&mut self, now: Timestamp) {
        if !self.trim_pending {
            return;
        }
        let cap = self.config.blocked_lane_cap();
        // In name order: a replayed simulation trims the same lanes first.
        let over: BTreeSet<TenantName> = self.window.blocked_over(cap).into_iter().collect();
        // A tenant unblocked meanwhile, or within its cap, starts over.
        self.blocked_since.retain(|tenant, _| over.contains(tenant));
        let mut budget = Self::TRIM_STEP;
        let mut next: Option<Timestamp> = None;
        let read_ahead = &mut self.read_ahead;
        for tenant in over {
            let since = *self.blocked_since.entry(tenant.clone()).or_insert(now);
            let trim_at = since.plus(self.config.blocked_trim_after);
            if now < trim_at {
                next = Some(next.map_or(trim_at, |n| n.min(trim_at)));
                continue;
            }
            if budget > 0 {
                let target = self.window.held_by(&tenant).saturating_sub(budget).max(cap);
                let evicted = self
                    .window
                    .evict_tenant_to(&tenant, target, &mut |tenant, run| {
                        read_ahead.invalidate_evicted(tenant, &run.0);
                    });
                self.stats.evicted += evicted as u64;
                budget -= evicted.min(budget);
            }
            if self.window.held_by(&tenant) > cap {
                next = Some(now); // the step's budget ran out: go on at once
            }
        }
        self.trim_pending = next.is_some();
        self.next_trim_at = next;
        if next.is_none() {
            self.blocked_since.clear();
        }
    }

    fn start_load(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        if self.loading.is_some() {
            return;
        }
        if let Some(failed) = self.load_failed_at {
            if now < failed.plus(self.config.load_retry) {
                return;
            }
            self.load_failed_at = None;
        }
        let page = (self.config.capacity / 4).max(16);
        let upto = self.window.cursor().cloned();
        let needs_window = upto
            .as_ref()
            .is_none_or(|c| c.due < now.plus(self.config.window / 2));
        let request = if needs_window {
            Some(LoadRequest {
                kind: LoadKind::Window,
                after: upto.clone(),
                through: now.plus(self.config.window),
                limit: page,
                upto: None,
                seq: 0,
                skip: self.skippable_tenants(),
            })
        } else {
            self.tenant_reload(page, upto.clone())
                .or_else(|| self.repair(now, upto))
        };
        if let Some(mut request) = request {
            self.load_seq += 1;
            request.seq = self.load_seq;
            self.loading = Some(PendingLoad {
                request: request.clone(),
                offers: Vec::new(),
                removed: HashSet::new(),
                overflowed: false,
            });
            actions.push(Action::Load(request));
        }
    }

    /// Overflowing tenants a window page may leave out: all of them.
    fn skippable_tenants(&self) -> Vec<TenantName> {
        self.overflowing_tenants(|_| true)
    }

    /// Tenants in overflow whose mark passes `keep`, in name order (a
    /// bounded list: the store filters by it).
    fn overflowing_tenants(&self, keep: impl Fn(&DueCursor) -> bool) -> Vec<TenantName> {
        const MAX_SKIPPED: usize = 64;
        let mut tenants: Vec<TenantName> = self
            .window
            .overflows()
            .filter(|(_, mark)| keep(mark))
            .map(|(t, _)| t.clone())
            .collect();
        tenants.sort();
        tenants.truncate(MAX_SKIPPED);
        tenants
    }

    /// A page of a tenant's overflow, once its lane runs low and it can fire.
    fn tenant_reload(&self, page: usize, upto: Option<DueCursor>) -> Option<LoadRequest> {
        let upto = upto?;
        let low_water = (page / 4).max(8);
        let (tenant, mark) = self
            .window
            .overflows()
            .filter(|(tenant, _)| {
                !self.window.is_blocked(tenant) && self.window.held_by(tenant) < low_water
            })
            .min_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)))?;
        Some(LoadRequest {
            kind: LoadKind::Tenant(tenant.clone()),
            after: Some(mark.clone()),
            through: upto.due,
            limit: page,
            upto: Some(upto),
            seq: 0,
            skip: Vec::new(),
        })
    }

    fn repair(&mut self, now: Timestamp, upto: Option<DueCursor>) -> Option<LoadRequest> {
        if self.config.repair_interval.is_zero() {
            return None;
        }
        let upto = upto?;
        match self.next_repair_at {
            None => {
                self.next_repair_at = Some(now.plus(self.config.repair_interval));
                return None;
            }
            Some(at) if now < at => return None,
            Some(_) => {}
        }
        self.next_repair_at = Some(now.plus(self.config.repair_interval));
        Some(LoadRequest {
            kind: LoadKind::Repair,
            after: self.repair_after.clone(),
            through: upto.due,
            limit: self.config.repair_page,
            upto: Some(upto),
            seq: 0,
            // An overflowing tenant's entries past its mark are not
            // covered, so a repair could not arm them, and a hung tenant's
            // backlog of thousands would hold the sweep back for minutes
            // before it reached another tenant's lost wake-up. So once the
            // sweep is past a tenant's mark, its pages leave the tenant
            // out; before it, they read the tenant's covered entries,
            // whose lost wake-ups would otherwise wait for its overflow to
            // clear (forever for a tenant that stays in overflow).
            skip: match &self.repair_after {
                Some(after) => self.overflowing_tenants(|mark| mark <= after),
                None => Vec::new(),
            },
        })
    }

    fn loaded(&mut self, request: LoadRequest, page: Option<Vec<DueCursor>>, now: Timestamp) {
        let Some(pending) = self.loading.take_if(|p| p.request == request) else {
            return; // An answer for a window that was dropped since.
        };
        let Some(page) = page else {
            self.stats.load_failures += 1;
            self.load_failed_at = Some(now);
            // Offers buffered for the range stay armed where covered.
            for entry in pending.offers {
                self.offer(entry);
            }
            return;
        };
        if pending.overflowed {
            // Read again from the same cursor; what was kept is applied.
            for entry in pending.offers {
                self.offer(entry);
            }
            return;
        }
        if request
            .skip
            .iter()
            .any(|tenant| self.window.overflow_of(tenant).is_none())
        {
            // A tenant left out of the page is covered by the window again:
            // read the range again without it.
            for entry in pending.offers {
                self.offer(entry);
            }
            return;
        }
        let full = page.len() >= request.limit;
        let last = page.last().cloned();
        match &request.kind {
            LoadKind::Window => {
                for entry in page {
                    if self.may_hold(&entry) {
                        self.window_page_entry(entry);
                    } else {
                        self.page_listed_unheld(entry);
                    }
                }
                let through = match last {
                    Some(last) if full => last,
                    // Everything due up to `through` is now covered.
                    _ => DueCursor {
                        due: request.through.plus(Duration::from_millis(1)),
                        key: EventKey::before_all(),
                    },
                };
                self.window.advance_cursor(through);
            }
            LoadKind::Tenant(tenant) => {
                let upto = request.upto.clone();
                let beyond = |e: &DueCursor| upto.as_ref().is_some_and(|u| e > u);
                let mut mark = None;
                // Entries past `upto` (same instant, later key) mean the
                // tenant caught up with where the window stood.
                let mut reached_upto = false;
                for entry in page {
                    if beyond(&entry) {
                        reached_upto = true;
                        break;
                    }
                    mark = Some(entry.clone());
                    if self.may_hold(&entry) {
                        self.window.insert(entry, true);
                    } else {
                        self.page_listed_unheld(entry);
                    }
                }
                let overflow = if full && !reached_upto {
                    mark.or(request.after.clone())
                } else if upto.as_ref() == self.window.cursor() {
                    None // Caught up with the window.
                } else {
                    upto // The window moved on meanwhile: continue from there.
                };
                // The lane was trimmed or evicted while the page was read,
                // back before where the page starts: what that evicted is
                // the loader's again, so the earlier mark stands.
                let overflow = match (self.window.overflow_of(tenant), &request.after) {
                    (Some(current), Some(after)) if current < after => Some(current.clone()),
                    _ => overflow,
                };
                self.window.set_overflow(tenant, overflow);
            }
            LoadKind::Repair => {
                for entry in page {
                    if pending.removed.contains(&entry) {
                        continue;
                    }
                    if !self.may_hold(&entry) {
                        self.page_listed_unheld(entry);
                    } else if self.window.covers(&entry) && !self.window.contains(&entry) {
                        self.stats.repaired += 1;
                        self.window.insert(entry, true);
                    }
                }
                self.repair_after = if full { last } else { None };
            }
        }
        for entry in pending.offers {
            self.offer(entry);
        }
        self.enforce_capacity();
    }

    /// A page listed an entry that is outstanding: the store still has it
    /// pending there, so it is offered again once it finishes (its
    /// delivery may end without recording anything, e.g. on a record read
    /// before the entry was re-created).
    fn page_listed_unheld(&mut self, entry: DueCursor) {
        if self.outstanding.contains_key(&entry) {
            self.reoffer.insert(entry);
        }
    }

    /// A window page's entry: held unless its tenant overflows (then it
    /// stays the tenant reload's). The caller enforces the capacity once
    /// per page, so a page may exceed it until then.
    fn window_page_entry(&mut self, entry: DueCursor) {
        if self.window.overflow_of(&entry.key.tenant).is_some() {
            return;
        }
        self.window.insert(entry, true);
    }

    fn start_read_ahead(&mut self, now: Timestamp, actions: &mut Vec<Action>) {
        let config = &self.config;
        if config.read_ahead.is_zero()
            || self.read_ahead.in_flight.is_some()
            || !self.read_ahead.has_room(config)
        {
            return;
        }
        let read_ahead = &self.read_ahead;
        let bound = config.max_outstanding_per_tenant;
        let starts_round = !self
            .window
            .due_through(
                now.plus(config.read_ahead / 2),
                |t| read_ahead.requested_through.get(t).cloned(),
                1,
                BLOCKED_READ_AHEAD,
                |t| read_ahead.room_to_start_round(t, bound),
            )
            .is_empty();
        if !starts_round {
            return;
        }
        let room = config.read_ahead_max_records - self.read_ahead.records.len();
        let entries = self.window.due_through(
            now.plus(config.read_ahead),
            |t| read_ahead.requested_through.get(t).cloned(),
            room,
            BLOCKED_READ_AHEAD,
            |t| read_ahead.tenant_room(t, bound),
        );
        let mut keys = Vec::new();
        for entry in entries {
            self.read_ahead
                .requested_through
                .insert(entry.key.tenant.clone(), (entry.due, entry.key.id.clone()));
            if !self.read_ahead.records.contains_key(&entry.key) {
                *self
                    .read_ahead
                    .per_tenant
                    .entry(entry.key.tenant.clone())
                    .or_default() += 1;
                keys.push(entry.key);
            }
        }
        if keys.is_empty() {
            return;
        }
        self.read_ahead.in_flight = Some(keys.iter().cloned().collect());
        actions.push(Action::ReadAhead(keys));
    }

    fn read_ahead_done(&mut self, records: Option<Vec<(EventKey, Option<EventRecord>)>>) {
        let read_ahead = &mut self.read_ahead;
        for key in read_ahead.in_flight.take().unwrap_or_default() {
            read_ahead.uncount(&key.tenant);
        }
        // A failed read only means those entries are read when they fire.
        for (key, record) in records.unwrap_or_default() {
            let Some(record) = record else { continue };
            // Only for an entry still waiting in the window: one that fired
            // meanwhile has no use for it, and nothing would invalidate it.
            let held = record.next_fire_at.is_some_and(|due| {
                self.window.contains(&DueCursor {
                    due,
                    key: key.clone(),
                })
            });
            if read_ahead.stale.contains(&key) || !held {
                continue;
            }
            read_ahead.payload_bytes += payload_len(&record);
            let tenant = key.tenant.clone();
            match read_ahead.records.insert(key, record) {
                Some(old) => read_ahead.payload_bytes -= payload_len(&old),
                None => *read_ahead.per_tenant.entry(tenant).or_default() += 1,
            }
        }
        read_ahead.stale.clear();
    }
}

#[cfg(test)]
mod tests;
