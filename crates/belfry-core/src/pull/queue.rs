//! The pull queue of one node as a pure state machine: see the module
//! documentation of [`crate::pull`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigKeys, Problems};
use crate::event::{AttemptReport, EventRecord};
use crate::fire::Finish;
use crate::ids::{EventKey, EventVersion, QueueName, TenantName, WorkerId};
use crate::partition::PartitionId;
use crate::retry::Verdict;
use crate::time::Timestamp;
use crate::timer::DueCursor;

use super::lease_id::{LeaseId, NonceSource};
use super::limits::{
    ClaimRequest, FailRequest, LEASE_EXPIRED_CODE, MAX_QUEUED_CALLS_PER_LEASE, heartbeat_interval,
};
use super::ready::{ReadyEntry, ReadyQueues};
use crate::policy::{Asked, DeliveryPolicy, GiveUp};

/// The queue's bounds (the node's `[pull]` section) and pauses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct PullConfig {
    /// Pull tenants' events due and held for a claim on this node; more go
    /// back to their partition and come again a second later
    /// (`docs/pull.md`).
    pub max_ready: usize,
    /// … of one tenant.
    pub max_ready_per_tenant: usize,
    /// Leases held on this node (active, being recorded, cancelled until
    /// their expiry) plus grants being recorded; claims wait while it is
    /// reached.
    pub max_leases: usize,
    /// Leases one tenant holds on this node; a claim past it is `429
    /// too_many_leases` while other tenants' are still served.
    #[config(default = "a tenth of `pull.max_leases`, at least 1")]
    pub max_leases_per_tenant: Option<usize>,
    /// Claims long-polling on this node; more are `429 too_many_waiters`.
    pub max_waiters: usize,
    /// … of one tenant.
    pub max_waiters_per_tenant: usize,
    /// Ended leases whose outcome answers a repeated call the same way
    /// (for 10 minutes).
    pub max_remembered: usize,
    /// How long an ended lease's outcome is remembered.
    #[serde(skip)]
    pub remember_for: Duration,
    /// A refused entry is handed back to its partition core to fire again
    /// after this pause ([`Finish::RetryAt`]).
    #[serde(skip)]
    pub refused_pause: Duration,
    /// Pause before an expiry that could not be recorded is tried again.
    #[serde(skip)]
    pub store_retry: Duration,
}

impl PullConfig {
    /// A tenant's share of the node's leases.
    pub fn leases_per_tenant(&self) -> usize {
        self.max_leases_per_tenant
            .unwrap_or((self.max_leases / 10).max(1))
    }

    /// Refuses zero bounds, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        for (key, value) in [
            ("max_ready", self.max_ready),
            ("max_ready_per_tenant", self.max_ready_per_tenant),
            ("max_leases", self.max_leases),
            ("max_leases_per_tenant", self.leases_per_tenant()),
            ("max_waiters", self.max_waiters),
            ("max_waiters_per_tenant", self.max_waiters_per_tenant),
            ("max_remembered", self.max_remembered),
        ] {
            problems.at_least_one(key, value);
        }
    }
}

impl Default for PullConfig {
    fn default() -> Self {
        PullConfig {
            max_ready: 100_000,
            max_ready_per_tenant: 10_000,
            max_leases: 100_000,
            max_leases_per_tenant: None,
            max_waiters: 10_000,
            max_waiters_per_tenant: 1_000,
            max_remembered: 100_000,
            remember_for: Duration::from_secs(600),
            refused_pause: Duration::from_secs(1),
            store_retry: Duration::from_millis(500),
        }
    }
}

/// Names a request being answered (a claim or a call on a lease); chosen
/// by the runtime, unique among those in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId(pub u64);

/// Names a write the queue asked for; answered by [`Input::Persisted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// A call on a lease, validated (see [`super::limits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCall {
    /// `None`: extend by the lease's own length.
    Heartbeat {
        extend: Option<Duration>,
    },
    Complete {
        result: Option<String>,
    },
    Fail(FailRequest),
    Release {
        delay: Duration,
    },
}

impl LeaseCall {
    fn kind(&self) -> CallKind {
        match self {
            LeaseCall::Heartbeat { .. } => CallKind::Heartbeat,
            LeaseCall::Complete { .. } => CallKind::Complete,
            LeaseCall::Fail(_) => CallKind::Fail,
            LeaseCall::Release { .. } => CallKind::Release,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    Heartbeat,
    Complete,
    Fail,
    Release,
}

/// How a store write the queue asked for went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PersistResult {
    Done,
    /// Fenced: the partition's epoch moved, or the stored lease is not
    /// this one (superseded, or never recorded).
    Lost,
    /// The event's version is no longer pending (cancelled or moved).
    Cancelled,
    /// The store could not be written; nothing changed.
    Unavailable,
    /// Only for a grant: the version's current attempt already has a
    /// lease recorded that never ended, one this queue does not hold (its
    /// node restarted, or the partition moved, while it was live). Nothing
    /// was written; the queue holds that *orphan* until its expiry and
    /// then records the expiry as a failed attempt.
    Orphaned(Box<LeaseRecord>),
}

/// What happened, fed to [`PullQueue::handle`].
#[derive(Debug, Clone)]
pub enum Input {
    /// Time passed: expire leases, time out claims, forget old outcomes.
    Tick,
    /// Fired entries of pull tenants (see [`ReadyEntry`]).
    Ready(Vec<ReadyEntry>),
    /// A worker asks for leases of `tenant`'s due events; answered by an
    /// [`Action::Reply`] with [`Reply::Leases`] (perhaps empty after the
    /// wait) or an error.
    Claim {
        call: CallId,
        tenant: TenantName,
        request: ClaimRequest,
    },
    /// A call on a lease; the API checked the caller reaches its tenant.
    Call {
        call: CallId,
        lease: LeaseId,
        request: LeaseCall,
    },
    /// The worker behind a claim went away: no answer is wanted, and what
    /// was being granted to it is released.
    Abandon { call: CallId },
    /// The runtime wants a parked claim answered now (it will look for
    /// entries on other nodes): a waiting claim is answered with an empty
    /// list; one whose grant is being recorded is answered by its grant.
    Withdraw { call: CallId },
    /// The answer to [`Action::PersistGrants`] (one result per grant, in
    /// order) or [`Action::PersistLease`] (one result).
    Persisted {
        op: OpId,
        results: Vec<PersistResult>,
    },
    /// `version` of `key` is no longer pending: cancelled or moved.
    VersionEnded {
        key: EventKey,
        version: EventVersion,
    },
    /// This node no longer owns `partition` (released or lost): its
    /// epoch's leases are void.
    PartitionLost { partition: PartitionId },
}

/// A lease to record before its worker gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub lease: LeaseId,
    pub partition: PartitionId,
    pub worker: WorkerId,
    pub leased_at: Timestamp,
    pub expires_at: Timestamp,
    pub deadline_at: Timestamp,
}

/// How a lease ended, for the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Completed: the event is delivered.
    Delivered { result: Option<String> },
    /// A failed attempt (a failure the worker reported, or an expired
    /// lease); the next one is due at `at`.
    Retry { at: Timestamp },
    /// Failed for good: the event is `failed` with this reason.
    Dead { reason: String },
    /// Given back without counting an attempt; pending again at `at`.
    Released { at: Timestamp },
}

/// A change to a recorded lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseChange {
    /// A heartbeat: the lease now expires at `expires_at`.
    Extend { expires_at: Timestamp },
    /// The lease ends by its worker's call (complete, fail, release);
    /// `report` is the attempt for the history (`None` for a release,
    /// which is no attempt).
    Resolve {
        resolution: Resolution,
        report: Option<AttemptReport>,
    },
    /// The lease ran out: a failed attempt (`report`, code
    /// `lease_expired`), then `resolution` ([`Resolution::Retry`] or
    /// [`Resolution::Dead`]). Recorded only at or after the lease's
    /// recorded expiry, and — unlike a worker's call — also for an
    /// orphaned lease of an earlier epoch, by the partition's current
    /// owner under its own epoch.
    Expire {
        resolution: Resolution,
        report: AttemptReport,
    },
}

impl LeaseChange {
    /// Why it fails its event for good ([`Resolution::Dead`]); `None`
    /// for any other change.
    pub fn dead_reason(&self) -> Option<&str> {
        match self {
            LeaseChange::Resolve {
                resolution: Resolution::Dead { reason },
                ..
            }
            | LeaseChange::Expire {
                resolution: Resolution::Dead { reason },
                ..
            } => Some(reason),
            _ => None,
        }
    }
}

/// A lease as its worker gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct GrantedLease {
    pub lease: LeaseId,
    pub record: EventRecord,
    pub queue: QueueName,
    pub attempt: u32,
    pub max_attempts: u32,
    pub due_at: Timestamp,
    pub leased_at: Timestamp,
    pub expires_at: Timestamp,
    /// No heartbeat extends the lease past this.
    pub deadline_at: Timestamp,
    pub heartbeat_interval: Duration,
}

/// Why a claim or call was not done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// The lease expired, ended, was superseded, or its partition moved.
    #[error("the lease is not held any more (expired, ended, superseded or moved)")]
    LeaseLost,
    #[error("the store is unavailable; retry later")]
    Unavailable,
    #[error("too many claims are waiting on this node")]
    TooManyWaiters,
    #[error("too many calls on this lease are in progress")]
    TooManyCalls,
    /// The tenant holds its share of the node's leases
    /// (`max_leases_per_tenant`).
    #[error(
        "this tenant holds its share of this node's leases (pull.max_leases_per_tenant); \
         complete, fail or release some before claiming more"
    )]
    TooManyLeases,
}

impl PullError {
    /// The stable code of the API's error envelope.
    pub fn code(self) -> &'static str {
        match self {
            PullError::LeaseLost => "lease_lost",
            PullError::Unavailable => "store_unavailable",
            PullError::TooManyWaiters => "too_many_waiters",
            PullError::TooManyCalls => "too_many_calls",
            PullError::TooManyLeases => "too_many_leases",
        }
    }
}

/// The answer to a claim or a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Leases(Vec<GrantedLease>),
    Heartbeat {
        expires_at: Timestamp,
        cancel_requested: bool,
    },
    Completed,
    /// `Some`: scheduled again at that instant; `None`: failed for good.
    Failed {
        next_attempt_at: Option<Timestamp>,
    },
    Released {
        next_attempt_at: Timestamp,
    },
    Error(PullError),
}

/// What the runtime must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record these leases, each fenced by its partition's epoch and only
    /// while the event is pending at the lease's version with
    /// `attempt - 1` attempts and no live lease; answer with
    /// [`Input::Persisted`]. `call` is the claim they are for.
    PersistGrants {
        op: OpId,
        call: CallId,
        grants: Vec<LeaseRecord>,
    },
    /// Apply `change` to the recorded lease (fenced by `partition` at
    /// `epoch`, only if it is still this lease); answer with
    /// [`Input::Persisted`]. `epoch` is the lease's own, except for the
    /// expiry of an orphan, written under the epoch it was found in.
    PersistLease {
        op: OpId,
        lease: LeaseId,
        partition: PartitionId,
        epoch: u64,
        change: LeaseChange,
    },
    Reply {
        call: CallId,
        reply: Reply,
    },
    /// Tell the partition core of `partition` (of `epoch`) that `entry` is
    /// finished.
    Finish {
        partition: PartitionId,
        epoch: u64,
        entry: DueCursor,
        finish: Finish,
    },
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullStats {
    pub granted: u64,
    pub completed: u64,
    /// Failures reported by workers (retried or final).
    pub failed: u64,
    pub released: u64,
    pub expired: u64,
    /// Orphaned leases a grant found and the queue held until their
    /// expiry (their expiries count in `expired` too).
    pub orphans: u64,
    /// Grants or calls the store answered `Lost`, and leases voided by a
    /// partition move.
    pub lost: u64,
    /// Ready entries and leases whose version ended.
    pub cancelled: u64,
    /// Entries refused because the ready bounds were reached.
    pub refused: u64,
    /// Entries handed over while already held (another copy of them).
    pub duplicates: u64,
    /// Entries handed over before their instant.
    pub early: u64,
    /// Ready entries whose expiry passed before a claim took them (handed
    /// back to their partitions to end `expired`).
    pub lapsed: u64,
    /// Claims answered empty after their wait.
    pub timed_out: u64,
    /// Writes the store could not make.
    pub store_failures: u64,
    /// Outcomes forgotten for room before their time.
    pub remembered_evicted: u64,
}

/// Where a held `(key, version)` is.
#[derive(Debug, Clone)]
enum Place {
    Ready { queue: QueueName, cursor: DueCursor },
    Granting { op: OpId },
    Leased { lease: LeaseId },
}

/// A parked claim.
#[derive(Debug)]
struct Waiter {
    call: CallId,
    tenant: TenantName,
    request: ClaimRequest,
    deadline: Timestamp,
    /// Its grant being recorded.
    granting: Option<OpId>,
    /// Its worker went away while its grant was being recorded.
    abandoned: bool,
}

/// What happens to a grant item when its write is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Live,
    /// Its version ended meanwhile: finished, never handed out.
    Ended,
    /// Its partition moved meanwhile: forgotten.
    PartitionLost,
}

#[derive(Debug)]
struct GrantItem {
    entry: ReadyEntry,
    record: LeaseRecord,
    fate: Fate,
}

#[derive(Debug)]
struct GrantBatch {
    waiter: u64,
    items: Vec<GrantItem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    Active,
    /// Its version ended: heartbeats answer `cancel_requested` until its
    /// expiry, every other call `lease_lost`.
    Cancelled,
    /// Expired: its expiry is being recorded (or waits to be retried).
    Expiring,
}

/// The write in flight for a lease and what its success means.
#[derive(Debug)]
struct Busy {
    op: OpId,
    /// The call to answer; `None` for the queue's own writes.
    call: Option<CallId>,
    pending: Pending,
}

#[derive(Debug)]
enum Pending {
    Extend(Timestamp),
    Resolve { kind: CallKind, reply: Reply },
    Expire,
}

#[derive(Debug)]
struct Lease {
    id: LeaseId,
    partition: PartitionId,
    /// The partition's epoch this queue holds the lease under: its
    /// writes' fence and its entry's core. The lease id's own epoch,
    /// except for an orphan of an earlier epoch.
    epoch: u64,
    /// Found by a grant, not granted here: its worker's calls answer
    /// `lease_lost`; only its expiry is recorded.
    orphan: bool,
    entry: DueCursor,
    event_time: Timestamp,
    policy: DeliveryPolicy,
    worker: WorkerId,
    leased_at: Timestamp,
    expires_at: Timestamp,
    deadline_at: Timestamp,
    length: Duration,
    state: LeaseState,
    busy: Option<Busy>,
    /// Calls that arrived while `busy` (and when), answered in order
    /// after it.
    queued: VecDeque<(CallId, LeaseCall, Timestamp)>,
    /// Its version ended while `busy`.
    cancel_seen: bool,
}

/// See the module documentation of [`crate::pull`].
#[derive(Debug)]
pub struct PullQueue {
    config: PullConfig,
    nonces: NonceSource,
    ready: ReadyQueues,
    /// Ready plus being granted, per tenant (the ready bounds).
    pending_by_tenant: HashMap<TenantName, usize>,
    /// Ordered so that the versions of one key are found together
    /// ([`Self::held_versions`]).
    held: BTreeMap<(EventKey, EventVersion), Place>,
    grants: BTreeMap<OpId, GrantBatch>,
    granting_items: usize,
    /// Leases plus grants being recorded, per tenant (the per-tenant lease
    /// bound).
    leases_by_tenant: HashMap<TenantName, usize>,
    leases: HashMap<LeaseId, Lease>,
    /// The cancelled leases kept until their expiry, by version: a worker
    /// had the version ([`Self::is_handed_out`]).
    cancelled_leases: HashMap<(EventKey, EventVersion), LeaseId>,
    /// Active leases' expiries, cancelled leases' ends, and retries of
    /// expiries that could not be recorded.
    timers: BTreeSet<(Timestamp, LeaseId)>,
    /// The expiries of ready entries that have one: one that passes while
    /// the entry still waits for a claim hands it back to be ended.
    lapses: BTreeSet<(Timestamp, EventKey, EventVersion)>,
    lease_ops: HashMap<OpId, LeaseId>,
    /// Parked claims by arrival.
    waiters: BTreeMap<u64, Waiter>,
    waiting: HashMap<TenantName, BTreeSet<u64>>,
    waiters_by_tenant: HashMap<TenantName, usize>,
    deadlines: BTreeSet<(Timestamp, u64)>,
    waiter_of_call: HashMap<CallId, u64>,
    remembered: HashMap<LeaseId, (CallKind, Reply)>,
    remembered_order: VecDeque<(Timestamp, LeaseId)>,
    /// Tenants whose ready entries or waiters changed.
    dirty: BTreeSet<TenantName>,
    /// Serving stopped for want of lease room.
    starved: bool,
    next_op: u64,
    next_waiter: u64,
    stats: PullStats,
}

impl PullQueue {
    pub fn new(config: PullConfig, nonces: NonceSource) -> Self {
        PullQueue {
            config,
            nonces,
            ready: ReadyQueues::default(),
            pending_by_tenant: HashMap::new(),
            held: BTreeMap::new(),
            grants: BTreeMap::new(),
            granting_items: 0,
            leases_by_tenant: HashMap::new(),
            leases: HashMap::new(),
            cancelled_leases: HashMap::new(),
            timers: BTreeSet::new(),
            lapses: BTreeSet::new(),
            lease_ops: HashMap::new(),
            waiters: BTreeMap::new(),
            waiting: HashMap::new(),
            waiters_by_tenant: HashMap::new(),
            deadlines: BTreeSet::new(),
            waiter_of_call: HashMap::new(),
            remembered: HashMap::new(),
            remembered_order: VecDeque::new(),
            dirty: BTreeSet::new(),
            starved: false,
            next_op: 0,
            next_waiter: 0,
            stats: PullStats::default(),
        }
    }

    pub fn config(&self) -> &PullConfig {
        &self.config
    }

    pub fn stats(&self) -> &PullStats {
        &self.stats
    }

    /// Entries ready (not being granted).
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    pub fn ready_of(&self, tenant: &TenantName) -> usize {
        self.ready.len_of(tenant)
    }

    /// Ready entries of `tenant` in `queue`.
    pub fn ready_in(&self, tenant: &TenantName, queue: &QueueName) -> usize {
        self.ready.len_in(tenant, queue)
    }

    /// Ready plus being granted, of one tenant (bounded by
    /// `max_ready_per_tenant`).
    pub fn pending_of(&self, tenant: &TenantName) -> usize {
        self.pending_by_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Grants being recorded.
    pub fn granting_len(&self) -> usize {
        self.granting_items
    }

    /// Leases held in any state.
    pub fn leases_len(&self) -> usize {
        self.leases.len()
    }

    /// Claims parked, long-polling or being granted.
    pub fn waiters_len(&self) -> usize {
        self.waiters.len()
    }

    /// Claims of `tenant` long-polling (not being granted).
    pub fn waiting_of(&self, tenant: &TenantName) -> usize {
        self.waiting.get(tenant).map_or(0, BTreeSet::len)
    }

    pub fn waiters_of(&self, tenant: &TenantName) -> usize {
        self.waiters_by_tenant.get(tenant).copied().unwrap_or(0)
    }

    pub fn remembered_len(&self) -> usize {
        self.remembered.len()
    }

    /// Whether `version` of `key` is held (ready, being granted or leased):
    /// the runtime checks this before reading a changed event's record to
    /// tell whether to send [`Input::VersionEnded`].
    pub fn holds(&self, key: &EventKey, version: &EventVersion) -> bool {
        self.held.contains_key(&(key.clone(), version.clone()))
    }

    /// Tenants with ready entries and no claim waiting for them, while
    /// leases may still be granted: what a cluster node announces to the
    /// others (see [`super::announce`]).
    pub fn unclaimed_tenants(&self) -> Vec<TenantName> {
        if self.lease_room() == 0 {
            return Vec::new();
        }
        self.ready
            .tenants()
            .filter(|tenant| self.waiting_of(tenant) == 0)
            .cloned()
            .collect()
    }

    /// Whether nothing is held: the runtime skips its look-ups then.
    pub fn holds_nothing(&self) -> bool {
        self.held.is_empty()
    }

    /// The versions of `key` held (ready, being granted or leased): those
    /// no longer pending in the store are for [`Input::VersionEnded`].
    pub fn held_versions(&self, key: &EventKey) -> Vec<EventVersion> {
        let lowest = (key.clone(), EventVersion::from_string(String::new()));
        self.held
            .range(lowest..)
            .take_while(|((held, _), _)| held == key)
            .map(|((_, version), _)| version.clone())
            .collect()
    }

    /// Whether a worker has `version` of `key` (leased, its grant being
    /// recorded, or its lease cancelled by a change and not expired yet);
    /// `None` if this queue knows nothing of it. A ready entry has not
    /// started: a cancel or move drops it ([`Input::VersionEnded`]), and a
    /// grant recorded after the change is fenced by the store.
    pub fn is_handed_out(&self, key: &EventKey, version: &EventVersion) -> Option<bool> {
        let held_key = (key.clone(), version.clone());
        match self.held.get(&held_key) {
            Some(place) => Some(!matches!(place, Place::Ready { .. })),
            None => self
                .cancelled_leases
                .contains_key(&held_key)
                .then_some(true),
        }
    }

    /// The changes that give back the live leases this node granted on
    /// `partition`, for a node that lets the partition go cleanly (a
    /// hand-over, a shutdown) rather than leave them orphaned: each event
    /// pending again at its lease's expiry (not before: its worker may be
    /// running it until its next call answers `lease_lost`), with no
    /// attempt counted — the node ended them, not their workers. The
    /// runtime writes them under the lease's epoch before giving the
    /// partition up, then sends [`Input::PartitionLost`]; a write that
    /// fails leaves an orphan, which the next owner expires as an attempt.
    /// Orphans, and cancelled or expiring leases, are left out.
    pub fn give_back(&self, partition: PartitionId, now: Timestamp) -> Vec<(LeaseId, LeaseChange)> {
        let mut changes: Vec<(LeaseId, LeaseChange)> = self
            .leases
            .values()
            .filter(|lease| {
                lease.partition == partition && !lease.orphan && lease.state == LeaseState::Active
            })
            .map(|lease| {
                let at = lease.expires_at.max(now);
                let change = LeaseChange::Resolve {
                    resolution: Resolution::Released { at },
                    report: None,
                };
                (lease.id.clone(), change)
            })
            .collect();
        changes.sort_by(|a, b| a.0.cmp(&b.0));
        changes
    }

    /// New leases (grants included) that fit.
    pub fn lease_room(&self) -> usize {
        self.config
            .max_leases
            .saturating_sub(self.leases.len() + self.granting_items)
    }

    /// Leases plus grants being recorded of `tenant`.
    pub fn leases_of(&self, tenant: &TenantName) -> usize {
        self.leases_by_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// New leases of `tenant` that fit: the node's room, at most what is
    /// left of the tenant's share.
    pub fn lease_room_of(&self, tenant: &TenantName) -> usize {
        self.lease_room().min(
            self.config
                .leases_per_tenant()
                .saturating_sub(self.leases_of(tenant)),
        )
    }

    fn count_leases(&mut self, tenant: &TenantName, added: usize) {
        *self.leases_by_tenant.entry(tenant.clone()).or_default() += added;
    }

    /// One lease (or grant) of `tenant` ended: its claims may fit again.
    fn uncount_lease(&mut self, tenant: &TenantName) {
        if let Some(count) = self.leases_by_tenant.get_mut(tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.leases_by_tenant.remove(tenant);
            }
        }
        if self.waiting.contains_key(tenant) {
            self.dirty.insert(tenant.clone());
        }
    }

    /// When the runtime must send [`Input::Tick`] next, if anything is
    /// timed.
    pub fn next_wake(&self) -> Option<Timestamp> {
        [
            self.timers.first().map(|(at, _)| *at),
            self.lapses.first().map(|(at, _, _)| *at),
            self.deadlines.first().map(|(at, _)| *at),
            self.remembered_order
                .front()
                .map(|(at, _)| at.plus(self.config.remember_for)),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Handles one input at `now`; returns what the runtime must do.
    pub fn handle(&mut self, input: Input, now: Timestamp) -> Vec<Action> {
        let mut out = Vec::new();
        // Timers first: a call at or after its lease's expiry finds it
        // expired whether or not a tick came in between.
        self.run_timers(now, &mut out);
        match input {
            Input::Tick => {}
            Input::Ready(entries) => {
                for entry in entries {
                    self.ready_entry(entry, now, &mut out);
                }
            }
            Input::Claim {
                call,
                tenant,
                request,
            } => self.claim(call, tenant, request, now, &mut out),
            Input::Call {
                call,
                lease,
                request,
            } => self.call(call, &lease, request, now, &mut out),
            Input::Abandon { call } => self.abandon(call),
            Input::Withdraw { call } => self.withdraw(call, &mut out),
            Input::Persisted { op, results } => {
                if self.grants.contains_key(&op) {
                    self.grants_persisted(op, results, now, &mut out);
                } else if let Some(lease) = self.lease_ops.remove(&op) {
                    let result = results
                        .into_iter()
                        .next()
                        .unwrap_or(PersistResult::Unavailable);
                    self.lease_persisted(&lease, result, now, &mut out);
                }
            }
            Input::VersionEnded { key, version } => {
                self.version_ended(key, version, now, &mut out);
            }
            Input::PartitionLost { partition } => self.partition_lost(partition, &mut out),
        }
        self.serve(now, &mut out);
        // A claim that waits no longer than now, and was not served.
        self.run_timers(now, &mut out);
        out
    }

    fn run_timers(&mut self, now: Timestamp, out: &mut Vec<Action>) {
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            let Some((_, id)) = self.timers.pop_first() else {
                break;
            };
            let Some(lease) = self.leases.get(&id) else {
                continue;
            };
            match lease.state {
                // A lease with a write in flight is looked at again when
                // the write is answered.
                LeaseState::Active if lease.busy.is_some() => {}
                LeaseState::Active | LeaseState::Expiring => self.expire(&id, now, out),
                LeaseState::Cancelled => {
                    self.remove_lease(&id);
                }
            }
        }
        while let Some((at, _, _)) = self.lapses.first() {
            if *at > now {
                break;
            }
            let Some((_, key, version)) = self.lapses.pop_first() else {
                break;
            };
            let held_key = (key, version);
            if let Some(Place::Ready { queue, cursor }) = self.held.get(&held_key).cloned()
                && let Some(entry) = self.ready.remove(&held_key.0.tenant, &queue, &cursor)
            {
                self.held.remove(&held_key);
                self.lapse(entry, now, out);
            }
        }
        while let Some((at, seq)) = self.deadlines.first().copied() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(waiter) = self.remove_waiter(seq) {
                self.stats.timed_out += 1;
                out.push(Action::Reply {
                    call: waiter.call,
                    reply: Reply::Leases(Vec::new()),
                });
            }
        }
        while let Some((at, _)) = self.remembered_order.front() {
            if at.plus(self.config.remember_for) > now {
                break;
            }
            if let Some((_, id)) = self.remembered_order.pop_front() {
                self.remembered.remove(&id);
            }
        }
    }

    fn ready_entry(&mut self, entry: ReadyEntry, now: Timestamp, out: &mut Vec<Action>) {
        let finish = |entry: &ReadyEntry, finish: Finish| Action::Finish {
            partition: entry.partition,
            epoch: entry.epoch,
            entry: entry.entry.clone(),
            finish,
        };
        if entry.entry.due > now {
            // Never offered early: back to its core until its instant.
            self.stats.early += 1;
            out.push(finish(&entry, Finish::RetryAt(entry.entry.due)));
            return;
        }
        let held_key = (entry.entry.key.clone(), entry.record.version.clone());
        if self.held.contains_key(&held_key) || self.ready.contains(&entry) {
            self.stats.duplicates += 1;
            let at = now.plus(self.config.refused_pause);
            out.push(finish(&entry, Finish::RetryAt(at)));
            return;
        }
        if entry.record.version.as_str().len() > LeaseId::MAX_VERSION_LEN {
            // Cannot happen: versions are UUIDs. Finished rather than
            // refused, so it does not come back every pause.
            out.push(finish(&entry, Finish::Done));
            return;
        }
        let tenant = &entry.entry.key.tenant;
        let pending = self.pending_of(tenant);
        if self.ready.len() + self.granting_items >= self.config.max_ready
            || pending >= self.config.max_ready_per_tenant
        {
            self.stats.refused += 1;
            let at = now.plus(self.config.refused_pause);
            out.push(finish(&entry, Finish::RetryAt(at)));
            return;
        }
        self.make_ready(held_key, entry);
    }

    /// `entry` waits for a claim (counted, held, timed by its expiry).
    fn make_ready(&mut self, held_key: (EventKey, EventVersion), entry: ReadyEntry) {
        let tenant = &entry.entry.key.tenant;
        *self.pending_by_tenant.entry(tenant.clone()).or_default() += 1;
        self.dirty.insert(tenant.clone());
        if let Some(at) = entry.policy.expires_at {
            self.lapses
                .insert((at, held_key.0.clone(), held_key.1.clone()));
        }
        self.held.insert(
            held_key,
            Place::Ready {
                queue: entry.queue.clone(),
                cursor: entry.entry.clone(),
            },
        );
        self.ready.insert(entry);
    }

    fn unpend(&mut self, tenant: &TenantName) {
        if let Some(count) = self.pending_by_tenant.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                self.pending_by_tenant.remove(tenant);
            }
        }
    }

    fn claim(
        &mut self,
        call: CallId,
        tenant: TenantName,
        request: ClaimRequest,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        if self.waiters.len() >= self.config.max_waiters
            || self.waiters_of(&tenant) >= self.config.max_waiters_per_tenant
        {
            out.push(Action::Reply {
                call,
                reply: Reply::Error(PullError::TooManyWaiters),
            });
            return;
        }
        // Said at once rather than parked: at its share, only its own
        // leases ending let a tenant claim more.
        if self.leases_of(&tenant) >= self.config.leases_per_tenant() {
            out.push(Action::Reply {
                call,
                reply: Reply::Error(PullError::TooManyLeases),
            });
            return;
        }
        self.next_waiter += 1;
        let seq = self.next_waiter;
        let deadline = now.plus(request.wait);
        *self.waiters_by_tenant.entry(tenant.clone()).or_default() += 1;
        self.waiting.entry(tenant.clone()).or_default().insert(seq);
        self.deadlines.insert((deadline, seq));
        self.waiter_of_call.insert(call, seq);
        self.dirty.insert(tenant.clone());
        self.waiters.insert(
            seq,
            Waiter {
                call,
                tenant,
                request,
                deadline,
                granting: None,
                abandoned: false,
            },
        );
    }

    fn abandon(&mut self, call: CallId) {
        let Some(&seq) = self.waiter_of_call.get(&call) else {
            return;
        };
        match self.waiters.get_mut(&seq) {
            Some(waiter) if waiter.granting.is_some() => waiter.abandoned = true,
            Some(waiter) => {
                let deadline = waiter.deadline;
                self.deadlines.remove(&(deadline, seq));
                self.remove_waiter(seq);
            }
            None => {}
        }
    }

    fn withdraw(&mut self, call: CallId, out: &mut Vec<Action>) {
        let Some(&seq) = self.waiter_of_call.get(&call) else {
            return;
        };
        let Some(waiter) = self.waiters.get(&seq) else {
            return;
        };
        if waiter.granting.is_some() {
            return;
        }
        let deadline = waiter.deadline;
        self.deadlines.remove(&(deadline, seq));
        if let Some(waiter) = self.remove_waiter(seq) {
            out.push(Action::Reply {
                call: waiter.call,
                reply: Reply::Leases(Vec::new()),
            });
        }
    }

    /// Forgets a waiter (answered, timed out or abandoned).
    fn remove_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&seq)?;
        self.waiter_of_call.remove(&waiter.call);
        if let Some(seqs) = self.waiting.get_mut(&waiter.tenant) {
            seqs.remove(&seq);
            if seqs.is_empty() {
                self.waiting.remove(&waiter.tenant);
            }
        }
        if let Some(count) = self.waiters_by_tenant.get_mut(&waiter.tenant) {
            *count -= 1;
            if *count == 0 {
                self.waiters_by_tenant.remove(&waiter.tenant);
            }
        }
        Some(waiter)
    }

    /// Grants ready entries to waiting claims: per tenant, the oldest
    /// claim first; tenants in the order of their oldest claim.
    fn serve(&mut self, now: Timestamp, out: &mut Vec<Action>) {
        if self.starved && self.lease_room() > 0 {
            self.starved = false;
            self.dirty.extend(self.waiting.keys().cloned());
        }
        let mut order: Vec<(u64, TenantName)> = std::mem::take(&mut self.dirty)
            .into_iter()
            .filter(|tenant| self.ready.len_of(tenant) > 0)
            .filter_map(|tenant| {
                let oldest = self.waiting.get(&tenant)?.first().copied()?;
                Some((oldest, tenant))
            })
            .collect();
        order.sort();
        for (_, tenant) in order {
            self.serve_tenant(&tenant, now, out);
        }
    }

    /// Up to `want` of `tenant`'s ready entries for one claim. An entry
    /// whose expiry passed while it waited is not granted: it goes back
    /// to its partition core due now, whose delivery path ends it
    /// `expired` (no worker ever gets it late).
    fn take_unexpired(
        &mut self,
        tenant: &TenantName,
        want: usize,
        only: Option<&BTreeSet<QueueName>>,
        max_bytes: usize,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) -> Vec<ReadyEntry> {
        loop {
            let (live, lapsed): (Vec<_>, Vec<_>) = self
                .ready
                .take(tenant, want, only, max_bytes)
                .into_iter()
                .partition(|entry| !entry.policy.expired(now));
            for entry in lapsed {
                self.held
                    .remove(&(entry.entry.key.clone(), entry.record.version.clone()));
                self.forget_lapse(&entry);
                self.lapse(entry, now, out);
            }
            for entry in &live {
                self.forget_lapse(entry);
            }
            if !live.is_empty() || !self.ready.has_for(tenant, only) {
                return live;
            }
        }
    }

    /// A ready entry (taken out of `ready` and `held`) whose expiry
    /// passed: back to its partition core, due now; the delivery path
    /// there ends it `expired`.
    fn lapse(&mut self, entry: ReadyEntry, now: Timestamp, out: &mut Vec<Action>) {
        self.stats.lapsed += 1;
        self.unpend(&entry.entry.key.tenant);
        out.push(Action::Finish {
            partition: entry.partition,
            epoch: entry.epoch,
            entry: entry.entry,
            finish: Finish::RetryAt(now),
        });
    }

    /// The entry left `ready`: its expiry needs no timer any more.
    fn forget_lapse(&mut self, entry: &ReadyEntry) {
        if let Some(at) = entry.policy.expires_at {
            self.lapses
                .remove(&(at, entry.entry.key.clone(), entry.record.version.clone()));
        }
    }

    /// Serves `tenant`'s waiting claims oldest first; a claim that names
    /// queues with nothing ready is passed over (it keeps its place).
    fn serve_tenant(&mut self, tenant: &TenantName, now: Timestamp, out: &mut Vec<Action>) {
        let waiting: Vec<u64> = self
            .waiting
            .get(tenant)
            .map(|seqs| seqs.iter().copied().collect())
            .unwrap_or_default();
        for seq in waiting {
            if self.ready.len_of(tenant) == 0 {
                return;
            }
            if self.lease_room() == 0 {
                self.starved = true;
                return;
            }
            // At its share the tenant's claims wait for its own leases to
            // end (which marks it dirty again); others are still served.
            let room = self.lease_room_of(tenant);
            if room == 0 {
                return;
            }
            let Some(waiter) = self.waiters.get(&seq) else {
                continue;
            };
            let only = waiter.request.queues.as_ref();
            if !self.ready.has_for(tenant, only) {
                continue;
            }
            let (call, worker, lease_len) = (
                waiter.call,
                waiter.request.worker.clone(),
                waiter.request.lease,
            );
            // At least one: a claim for none would be granted nothing, over
            // and over.
            let want = (waiter.request.max_events.max(1) as usize).min(room);
            let deadline = waiter.deadline;
            let max_bytes = waiter.request.max_bytes;
            let only = only.cloned();
            let entries = self.take_unexpired(tenant, want, only.as_ref(), max_bytes, now, out);
            if entries.is_empty() {
                continue;
            }
            self.next_op += 1;
            let op = OpId(self.next_op);
            let mut items = Vec::with_capacity(entries.len());
            for entry in entries {
                let attempt = entry.record.attempts.saturating_add(1);
                let Ok(lease) = LeaseId::new(
                    entry.entry.key.clone(),
                    entry.record.version.clone(),
                    attempt,
                    entry.epoch,
                    self.nonces.next_nonce(),
                ) else {
                    unreachable!("`ready_entry` refuses versions a lease id cannot carry");
                };
                let expires_at = now.plus(lease_len);
                let deadline_at = entry
                    .policy
                    .deadline(entry.record.event_time)
                    .max(expires_at);
                if let Some(place) = self
                    .held
                    .get_mut(&(entry.entry.key.clone(), entry.record.version.clone()))
                {
                    *place = Place::Granting { op };
                }
                items.push(GrantItem {
                    record: LeaseRecord {
                        lease,
                        partition: entry.partition,
                        worker: worker.clone(),
                        leased_at: now,
                        expires_at,
                        deadline_at,
                    },
                    entry,
                    fate: Fate::Live,
                });
            }
            self.granting_items += items.len();
            self.count_leases(tenant, items.len());
            if let Some(waiter) = self.waiters.get_mut(&seq) {
                waiter.granting = Some(op);
            }
            if let Some(seqs) = self.waiting.get_mut(tenant) {
                seqs.remove(&seq);
                if seqs.is_empty() {
                    self.waiting.remove(tenant);
                }
            }
            self.deadlines.remove(&(deadline, seq));
            out.push(Action::PersistGrants {
                op,
                call,
                grants: items.iter().map(|item| item.record.clone()).collect(),
            });
            self.grants.insert(op, GrantBatch { waiter: seq, items });
        }
    }

    fn grants_persisted(
        &mut self,
        op: OpId,
        results: Vec<PersistResult>,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        let Some(batch) = self.grants.remove(&op) else {
            return;
        };
        self.granting_items -= batch.items.len();
        let abandoned = self.waiters.get(&batch.waiter).is_none_or(|w| w.abandoned);
        let mut granted = Vec::new();
        let mut unavailable = false;
        let mut results = results.into_iter();
        for item in batch.items {
            let result = results.next().unwrap_or(PersistResult::Unavailable);
            let GrantItem {
                entry,
                record,
                fate,
            } = item;
            let tenant = entry.entry.key.tenant.clone();
            let held_key = (entry.entry.key.clone(), entry.record.version.clone());
            // The grant is counted no longer; a lease it became, below.
            self.uncount_lease(&tenant);
            if fate == Fate::PartitionLost {
                // Its ready count went with the partition.
                continue;
            }
            self.unpend(&tenant);
            match (fate, result) {
                (Fate::Live, PersistResult::Done) => {
                    self.stats.granted += 1;
                    let id = record.lease.clone();
                    let length = record.leased_at.until(record.expires_at);
                    self.hold_lease(&entry, &record, false);
                    if abandoned {
                        // Nobody will work on it: give it back at once.
                        self.start_call(
                            None,
                            &id,
                            LeaseCall::Release {
                                delay: Duration::ZERO,
                            },
                            now,
                            out,
                        );
                    } else {
                        granted.push(GrantedLease {
                            lease: id,
                            attempt: record.lease.attempt(),
                            max_attempts: entry.policy.max_attempts.max(1),
                            due_at: entry.entry.due,
                            leased_at: record.leased_at,
                            expires_at: record.expires_at,
                            deadline_at: record.deadline_at,
                            heartbeat_interval: heartbeat_interval(length),
                            queue: entry.queue,
                            record: entry.record,
                        });
                    }
                }
                (Fate::Live, PersistResult::Orphaned(orphan)) => {
                    // Not this grant: the lease its version already has,
                    // held here until it runs out (the claim waits on).
                    self.stats.orphans += 1;
                    self.hold_lease(&entry, &orphan, true);
                }
                (Fate::Live, PersistResult::Unavailable) => {
                    // Nothing was recorded: ready again, at its place.
                    unavailable = true;
                    self.stats.store_failures += 1;
                    self.make_ready(held_key, entry);
                }
                (_, result) => {
                    // Lost or cancelled in the store, or ended meanwhile:
                    // the core forgets the entry (and fires whatever is
                    // pending in its place).
                    match result {
                        PersistResult::Lost => self.stats.lost += 1,
                        _ => self.stats.cancelled += 1,
                    }
                    self.held.remove(&held_key);
                    out.push(Action::Finish {
                        partition: entry.partition,
                        epoch: entry.epoch,
                        entry: entry.entry,
                        finish: Finish::Done,
                    });
                }
            }
        }
        let seq = batch.waiter;
        if abandoned {
            self.remove_waiter(seq);
            return;
        }
        let Some(waiter) = self.waiters.get_mut(&seq) else {
            return;
        };
        let reply = if !granted.is_empty() {
            Reply::Leases(granted)
        } else if unavailable {
            Reply::Error(PullError::Unavailable)
        } else if now < waiter.deadline {
            // Everything it was offered went away: it waits again, first
            // in line (its place is its arrival).
            waiter.granting = None;
            let (tenant, deadline) = (waiter.tenant.clone(), waiter.deadline);
            self.waiting.entry(tenant.clone()).or_default().insert(seq);
            self.deadlines.insert((deadline, seq));
            self.dirty.insert(tenant);
            return;
        } else {
            Reply::Leases(Vec::new())
        };
        if let Some(waiter) = self.remove_waiter(seq) {
            out.push(Action::Reply {
                call: waiter.call,
                reply,
            });
        }
    }

    /// Holds `record`, a lease of `entry`'s version recorded in the store,
    /// until it ends: granted here, or an `orphan` a grant found.
    fn hold_lease(&mut self, entry: &ReadyEntry, record: &LeaseRecord, orphan: bool) {
        let id = record.lease.clone();
        self.held.insert(
            (entry.entry.key.clone(), entry.record.version.clone()),
            Place::Leased { lease: id.clone() },
        );
        self.timers.insert((record.expires_at, id.clone()));
        self.count_leases(&entry.entry.key.tenant, 1);
        self.leases.insert(
            id.clone(),
            Lease {
                id,
                partition: entry.partition,
                epoch: entry.epoch,
                orphan,
                entry: entry.entry.clone(),
                event_time: entry.record.event_time,
                policy: entry.policy.clone(),
                worker: record.worker.clone(),
                leased_at: record.leased_at,
                expires_at: record.expires_at,
                deadline_at: record.deadline_at,
                length: record.leased_at.until(record.expires_at),
                state: LeaseState::Active,
                busy: None,
                queued: VecDeque::new(),
                cancel_seen: false,
            },
        );
    }

    fn call(
        &mut self,
        call: CallId,
        id: &LeaseId,
        request: LeaseCall,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        let reply = match self.leases.get_mut(id) {
            // Its node restarted or the partition moved since its grant:
            // void for calls, like every lease of a moved partition.
            Some(lease) if lease.orphan => Reply::Error(PullError::LeaseLost),
            Some(lease) => match lease.state {
                LeaseState::Expiring => Reply::Error(PullError::LeaseLost),
                LeaseState::Cancelled => match request {
                    LeaseCall::Heartbeat { .. } => Reply::Heartbeat {
                        expires_at: lease.expires_at,
                        cancel_requested: true,
                    },
                    _ => Reply::Error(PullError::LeaseLost),
                },
                LeaseState::Active if lease.busy.is_some() => {
                    if lease.queued.len() >= MAX_QUEUED_CALLS_PER_LEASE {
                        Reply::Error(PullError::TooManyCalls)
                    } else {
                        lease.queued.push_back((call, request, now));
                        return;
                    }
                }
                LeaseState::Active => {
                    self.start_call(Some(call), id, request, now, out);
                    return;
                }
            },
            None => match self.remembered.get(id) {
                Some((kind, reply)) if *kind == request.kind() => reply.clone(),
                _ => Reply::Error(PullError::LeaseLost),
            },
        };
        out.push(Action::Reply { call, reply });
    }

    /// Starts `request` on an active lease with no write in flight.
    fn start_call(
        &mut self,
        call: Option<CallId>,
        id: &LeaseId,
        request: LeaseCall,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        let Some(lease) = self.leases.get_mut(id) else {
            return;
        };
        let kind = request.kind();
        let (pending, change) = match request {
            LeaseCall::Heartbeat { extend } => {
                let expires_at = now
                    .plus(extend.unwrap_or(lease.length))
                    .min(lease.deadline_at);
                (
                    Pending::Extend(expires_at),
                    LeaseChange::Extend { expires_at },
                )
            }
            LeaseCall::Complete { result } => (
                Pending::Resolve {
                    kind,
                    reply: Reply::Completed,
                },
                LeaseChange::Resolve {
                    resolution: Resolution::Delivered { result },
                    report: Some(report(lease, now, Verdict::Delivered, None)),
                },
            ),
            LeaseCall::Fail(failure) => {
                let error = failure.describe();
                let next = if failure.permanent {
                    Err(GiveUp::Permanent)
                } else {
                    lease.policy.next_attempt(
                        id.attempt(),
                        lease.event_time,
                        now,
                        failure.retry_after.map_or(Asked::Nothing, Asked::Worker),
                    )
                };
                let verdict = if failure.permanent {
                    Verdict::Permanent
                } else {
                    Verdict::Retry
                };
                let attempt_report = report(lease, now, verdict, Some(error.clone()));
                let resolution = match next {
                    Ok(at) => Resolution::Retry { at },
                    Err(give_up) => Resolution::Dead {
                        reason: give_up.describe(id.attempt(), &error),
                    },
                };
                (
                    Pending::Resolve {
                        kind,
                        reply: Reply::Failed {
                            next_attempt_at: next.ok(),
                        },
                    },
                    LeaseChange::Resolve {
                        resolution,
                        report: Some(attempt_report),
                    },
                )
            }
            LeaseCall::Release { delay } => {
                let at = now.plus(delay);
                (
                    Pending::Resolve {
                        kind,
                        reply: Reply::Released {
                            next_attempt_at: at,
                        },
                    },
                    LeaseChange::Resolve {
                        resolution: Resolution::Released { at },
                        report: None,
                    },
                )
            }
        };
        self.next_op += 1;
        let op = OpId(self.next_op);
        lease.busy = Some(Busy { op, call, pending });
        self.lease_ops.insert(op, id.clone());
        out.push(Action::PersistLease {
            op,
            lease: id.clone(),
            partition: lease.partition,
            epoch: lease.epoch,
            change,
        });
    }

    /// The lease's time is up: record the failed attempt.
    fn expire(&mut self, id: &LeaseId, now: Timestamp, out: &mut Vec<Action>) {
        let Some(lease) = self.leases.get_mut(id) else {
            return;
        };
        if lease.state == LeaseState::Active {
            self.stats.expired += 1;
        }
        lease.state = LeaseState::Expiring;
        let queued = std::mem::take(&mut lease.queued);
        let error = if lease.orphan {
            format!(
                "{LEASE_EXPIRED_CODE}: the lease of worker {} ran out after its node restarted or lost the partition",
                lease.worker
            )
        } else {
            format!(
                "{LEASE_EXPIRED_CODE}: worker {} sent no heartbeat within its lease",
                lease.worker
            )
        };
        let resolution =
            match lease
                .policy
                .next_attempt(id.attempt(), lease.event_time, now, Asked::Nothing)
            {
                Ok(at) => Resolution::Retry { at },
                Err(give_up) => Resolution::Dead {
                    reason: give_up.describe(id.attempt(), &error),
                },
            };
        let change = LeaseChange::Expire {
            resolution,
            report: report(lease, now, Verdict::Retry, Some(error)),
        };
        self.next_op += 1;
        let op = OpId(self.next_op);
        lease.busy = Some(Busy {
            op,
            call: None,
            pending: Pending::Expire,
        });
        self.lease_ops.insert(op, id.clone());
        out.push(Action::PersistLease {
            op,
            lease: id.clone(),
            partition: lease.partition,
            epoch: lease.epoch,
            change,
        });
        for (call, _, _) in queued {
            out.push(Action::Reply {
                call,
                reply: Reply::Error(PullError::LeaseLost),
            });
        }
    }

    fn lease_persisted(
        &mut self,
        id: &LeaseId,
        result: PersistResult,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        let Some(lease) = self.leases.get_mut(id) else {
            return;
        };
        let Some(busy) = lease.busy.take() else {
            return;
        };
        if result == PersistResult::Unavailable {
            self.stats.store_failures += 1;
        }
        // What becomes of the lease: kept (perhaps extended), cancelled,
        // or ended (and its partition core's entry finished).
        let mut reply = None;
        let mut extended = None;
        let mut cancel = false;
        let mut end = false;
        match (busy.pending, result) {
            (Pending::Extend(expires_at), PersistResult::Done) => {
                extended = Some(expires_at);
                reply = Some(Reply::Heartbeat {
                    expires_at,
                    cancel_requested: lease.cancel_seen,
                });
                cancel = lease.cancel_seen;
            }
            (Pending::Extend(_), PersistResult::Cancelled) => {
                reply = Some(Reply::Heartbeat {
                    expires_at: lease.expires_at,
                    cancel_requested: true,
                });
                cancel = true;
            }
            (Pending::Resolve { kind, reply: done }, PersistResult::Done) => {
                match kind {
                    CallKind::Complete => self.stats.completed += 1,
                    CallKind::Fail => self.stats.failed += 1,
                    CallKind::Release => self.stats.released += 1,
                    CallKind::Heartbeat => {}
                }
                reply = Some(done.clone());
                self.remember(id.clone(), kind, done, now);
                end = true;
            }
            (Pending::Resolve { .. }, PersistResult::Cancelled) => {
                reply = Some(Reply::Error(PullError::LeaseLost));
                cancel = true;
            }
            // (`Orphaned` answers grants only; taken as `Lost`.)
            (
                Pending::Extend(_) | Pending::Resolve { .. },
                PersistResult::Lost | PersistResult::Orphaned(_),
            ) => {
                self.stats.lost += 1;
                reply = Some(Reply::Error(PullError::LeaseLost));
                end = true;
            }
            (Pending::Extend(_) | Pending::Resolve { .. }, PersistResult::Unavailable) => {
                reply = Some(Reply::Error(PullError::Unavailable));
                cancel = lease.cancel_seen;
            }
            (Pending::Expire, PersistResult::Unavailable) => {
                let at = now.plus(self.config.store_retry);
                self.timers.insert((at, id.clone()));
            }
            (Pending::Expire, _) => end = true,
        }
        if let (Some(call), Some(reply)) = (busy.call, reply) {
            out.push(Action::Reply { call, reply });
        }
        if let Some(expires_at) = extended
            && let Some(lease) = self.leases.get_mut(id)
        {
            self.timers.remove(&(lease.expires_at, id.clone()));
            lease.expires_at = expires_at;
            self.timers.insert((expires_at, id.clone()));
        }
        if end {
            self.end_lease(id, now, out);
            return;
        }
        if cancel {
            self.cancel_lease(id, now, out);
        }
        self.after_write(id, now, out);
    }

    /// A lease whose write was answered: the calls that waited and came
    /// before its expiry are started in order (they were in time); once
    /// none is left, or the next came at or after the expiry, a lease past
    /// its expiry expires.
    fn after_write(&mut self, id: &LeaseId, now: Timestamp, out: &mut Vec<Action>) {
        loop {
            let Some(lease) = self.leases.get_mut(id) else {
                return;
            };
            if lease.busy.is_some() {
                return;
            }
            let in_time = lease
                .queued
                .front()
                .is_some_and(|(_, _, arrived)| *arrived < lease.expires_at);
            if lease.state == LeaseState::Active && !in_time && lease.expires_at <= now {
                self.expire(id, now, out);
                return;
            }
            let Some((call, request, _)) = lease.queued.pop_front() else {
                return;
            };
            self.call(call, id, request, now, out);
        }
    }

    /// The lease ended (resolved, lost, or its expiry recorded): forgotten,
    /// its partition core's entry finished; calls that waited are answered
    /// from the remembered outcome (or `lease_lost`).
    fn end_lease(&mut self, id: &LeaseId, now: Timestamp, out: &mut Vec<Action>) {
        let Some(lease) = self.remove_lease(id) else {
            return;
        };
        if lease.state != LeaseState::Cancelled {
            out.push(Action::Finish {
                partition: lease.partition,
                epoch: lease.epoch,
                entry: lease.entry,
                finish: Finish::Done,
            });
        }
        for (call, request, _) in lease.queued {
            self.call(call, id, request, now, out);
        }
    }

    /// The lease's version ended: it answers heartbeats with
    /// `cancel_requested` until its expiry; its entry is finished now.
    fn cancel_lease(&mut self, id: &LeaseId, now: Timestamp, out: &mut Vec<Action>) {
        let Some(lease) = self.leases.get_mut(id) else {
            return;
        };
        if lease.state != LeaseState::Active {
            return;
        }
        self.stats.cancelled += 1;
        lease.state = LeaseState::Cancelled;
        lease.cancel_seen = true;
        out.push(Action::Finish {
            partition: lease.partition,
            epoch: lease.epoch,
            entry: lease.entry.clone(),
            finish: Finish::Done,
        });
        let held_key = (id.key().clone(), id.version().clone());
        self.held.remove(&held_key);
        if lease.expires_at <= now {
            // Nothing left to answer `cancel_requested` for.
            self.remove_lease(id);
        } else {
            // Its expiry timer may have been taken while a write was in
            // flight: the tombstone must still end.
            self.timers.insert((lease.expires_at, id.clone()));
            self.cancelled_leases.insert(held_key, id.clone());
        }
    }

    fn remove_lease(&mut self, id: &LeaseId) -> Option<Lease> {
        let lease = self.leases.remove(id)?;
        self.uncount_lease(&id.key().tenant);
        self.timers.remove(&(lease.expires_at, id.clone()));
        if let Some(busy) = &lease.busy {
            self.lease_ops.remove(&busy.op);
        }
        let held_key = (id.key().clone(), id.version().clone());
        if matches!(
            self.held.get(&held_key),
            Some(Place::Leased { lease }) if lease == id
        ) {
            self.held.remove(&held_key);
        }
        if self.cancelled_leases.get(&held_key) == Some(id) {
            self.cancelled_leases.remove(&held_key);
        }
        Some(lease)
    }

    fn remember(&mut self, id: LeaseId, kind: CallKind, reply: Reply, now: Timestamp) {
        if self.config.max_remembered == 0 {
            return;
        }
        while self.remembered.len() >= self.config.max_remembered {
            let Some((_, oldest)) = self.remembered_order.pop_front() else {
                break;
            };
            if self.remembered.remove(&oldest).is_some() {
                self.stats.remembered_evicted += 1;
            }
        }
        self.remembered_order.push_back((now, id.clone()));
        self.remembered.insert(id, (kind, reply));
    }

    fn version_ended(
        &mut self,
        key: EventKey,
        version: EventVersion,
        now: Timestamp,
        out: &mut Vec<Action>,
    ) {
        let held_key = (key, version);
        let Some(place) = self.held.get(&held_key).cloned() else {
            return;
        };
        match place {
            Place::Ready { queue, cursor } => {
                self.held.remove(&held_key);
                if let Some(entry) = self.ready.remove(&held_key.0.tenant, &queue, &cursor) {
                    self.forget_lapse(&entry);
                    self.stats.cancelled += 1;
                    self.unpend(&held_key.0.tenant);
                    out.push(Action::Finish {
                        partition: entry.partition,
                        epoch: entry.epoch,
                        entry: entry.entry,
                        finish: Finish::Done,
                    });
                }
            }
            Place::Granting { op } => {
                if let Some(batch) = self.grants.get_mut(&op) {
                    for item in &mut batch.items {
                        if item.entry.entry.key == held_key.0
                            && item.entry.record.version == held_key.1
                            && item.fate == Fate::Live
                        {
                            item.fate = Fate::Ended;
                        }
                    }
                }
            }
            Place::Leased { lease: id } => {
                let Some(lease) = self.leases.get_mut(&id) else {
                    return;
                };
                if lease.busy.is_some() {
                    // The store orders the write and the change; its
                    // answer decides.
                    lease.cancel_seen = true;
                } else {
                    self.cancel_lease(&id, now, out);
                }
            }
        }
    }

    fn partition_lost(&mut self, partition: PartitionId, out: &mut Vec<Action>) {
        for entry in self.ready.remove_partition(partition) {
            self.forget_lapse(&entry);
            self.unpend(&entry.entry.key.tenant);
            self.held
                .remove(&(entry.entry.key.clone(), entry.record.version.clone()));
        }
        for batch in self.grants.values_mut() {
            for item in &mut batch.items {
                if item.entry.partition == partition && item.fate != Fate::PartitionLost {
                    item.fate = Fate::PartitionLost;
                    let tenant = &item.entry.entry.key.tenant;
                    if let Some(count) = self.pending_by_tenant.get_mut(tenant) {
                        *count -= 1;
                        if *count == 0 {
                            self.pending_by_tenant.remove(tenant);
                        }
                    }
                    self.held.remove(&(
                        item.entry.entry.key.clone(),
                        item.entry.record.version.clone(),
                    ));
                }
            }
        }
        let mut doomed: Vec<LeaseId> = self
            .leases
            .values()
            .filter(|lease| lease.partition == partition)
            .map(|lease| lease.id.clone())
            .collect();
        doomed.sort();
        for id in doomed {
            let Some(lease) = self.remove_lease(&id) else {
                continue;
            };
            self.stats.lost += 1;
            let in_flight = lease.busy.and_then(|busy| busy.call);
            for call in in_flight
                .into_iter()
                .chain(lease.queued.into_iter().map(|(call, _, _)| call))
            {
                out.push(Action::Reply {
                    call,
                    reply: Reply::Error(PullError::LeaseLost),
                });
            }
        }
    }

    /// Everything held in memory: ready entries, grants being recorded,
    /// leases, parked claims and remembered outcomes.
    pub fn held(&self) -> usize {
        self.ready.len()
            + self.granting_items
            + self.leases.len()
            + self.waiters.len()
            + self.remembered.len()
    }
}

/// The attempt a lease ending at `now` adds to the history.
fn report(lease: &Lease, now: Timestamp, verdict: Verdict, error: Option<String>) -> AttemptReport {
    AttemptReport {
        started_at: lease.leased_at,
        duration_ms: lease.leased_at.until(now).as_millis() as u64,
        verdict,
        http_status: None,
        error,
        steer: None,
    }
}
