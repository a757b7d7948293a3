//! The per-partition engine: it keeps a bounded near-future window of each
//! partition in memory, fires every event at its instant (never before),
//! delivers with bounded concurrency, and records outcomes in batches.
//!
//! # Layout
//! - [`options`]: [`EngineOptions`], the knobs and their defaults;
//! - [`partition`]: one worker per owned partition, the runtime of its
//!   [`belfry_core::fire::PartitionCore`] (which makes every fire-path
//!   decision);
//! - [`membership`]: the cluster loop (heartbeat, leader lease, partition
//!   assignment, lease renewal, hand-overs) that grants ownership;
//! - [`ownership`]: which partitions this node fires, under which epoch and
//!   until when (all of them, forever, on a single node);
//! - [`pull`]: the runtime of this node's pull queue (pull tenants'
//!   leases: claims, calls, fenced lease writes);
//! - `pull_peers`: pull claims across a cluster (announcements of
//!   unclaimed ready entries, sent and heard; claims parked here woken by
//!   another node's);
//! - [`dispatch`]: delivery slots ([`belfry_core::fire::DeliverySlots`]),
//!   the fire-time check against the store, the claim, the delivery;
//! - [`recorder`]: batches attempt outcomes into the store and finishes
//!   their entries;
//! - [`schedules`]: recurring schedules: the control-event firing (plan,
//!   store occurrences, move the control event) and their management;
//! - [`bulk`]: the bulk action runner (cancel, redrive, pause, resume
//!   over a filter, page by page, resumable, one node at a time);
//! - [`purge`]: the background retention sweep;
//! - [`quotas`]: per-tenant quotas on pending events, schedules and
//!   payload size, checked before client writes; the node's `[limits]`
//!   section ([`quotas::LimitsOptions`]);
//! - [`tenants`]: a short-lived cache of tenant configs;
//! - `writes`: writes made for callers that may go away (API requests,
//!   ingest, bulk actions): store call and routing in a task of their own.
//!
//! # The fire path
//! See `docs/ARCHITECTURE.md`. In short: each partition core pages due
//! entries into a bounded window, fires them at their instant (never
//! before), the dispatcher gives them delivery slots, a delivery checks the
//! record, claims its version and delivers, and the recorder stores the
//! outcome in batches, finishes the entry and routes the resulting timer
//! effects back to the cores.
//!
//! Components are built `Options → Engine → cheap-clone EngineHandle`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use belfry_core::event::Effect;
use belfry_core::fire::Input;
use belfry_core::{Clock, DueCursor, EventKey, EventRecord, TenantName, Timestamp};
use belfry_sinks::{Delivery, DeliveryResult, Sinks};
use belfry_store::{Applied, KeyedCommand, SharedStore, StoreResult};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub mod bulk;
pub mod dispatch;
pub mod membership;
pub mod options;
pub mod ownership;
pub mod partition;
pub mod pull;
mod pull_peers;
pub mod purge;
pub mod quotas;
mod reads;
pub mod recorder;
pub mod schedules;
pub mod tenants;
mod writes;

pub use options::EngineOptions;
pub use ownership::Ownership;

use crate::ownership::OwnedPartitions;

/// See [`EngineHandle::partitions_loaded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionsLoaded {
    pub owned: usize,
    pub loaded: usize,
}

impl PartitionsLoaded {
    pub fn all(&self) -> bool {
        self.loaded == self.owned
    }
}

/// A running engine. Call [`Engine::shutdown`] to stop it cleanly.
#[derive(Debug)]
pub struct Engine {
    handle: EngineHandle,
    recorder_task: JoinHandle<()>,
    purge_task: JoinHandle<()>,
    bulk_task: JoinHandle<()>,
    pull_task: JoinHandle<()>,
    lease_writer_task: Option<JoinHandle<()>>,
}

/// What the API edge uses: apply commands (store, then wake the owning
/// partition), dry-run deliveries, read the clock.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    inner: Arc<Shared>,
}

/// State shared by every engine task.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: SharedStore,
    pub(crate) sinks: Sinks,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: EngineOptions,
    /// The partitions this node owns, with their workers.
    pub(crate) owned: OwnedPartitions,
    pub(crate) tenants: tenants::TenantCache,
    pub(crate) limits: dispatch::Limits,
    /// Per-tenant quota estimates (client writes are checked against them).
    pub(crate) quotas: quotas::Quotas,
    /// Signalled whenever a fired entry is finished (its outcome stored,
    /// or dropped): hand-overs and shutdown wait on it.
    pub(crate) finished: tokio::sync::Notify,
    /// Bounds schedule firings in progress (each holds a plan and store
    /// writes); the others wait as small tasks.
    pub(crate) schedule_firings: Arc<tokio::sync::Semaphore>,
    pub(crate) outcomes: mpsc::Sender<recorder::Outcome>,
    /// Fire-time record reads, batched node-wide.
    pub(crate) reads: reads::RecordReads,
    /// Set once shutdown starts: no new delivery begins after it.
    pub(crate) stopping: AtomicBool,
    pub(crate) stop_signal: watch::Sender<bool>,
    /// The bulk action runner's state (claims, wake-up).
    pub(crate) bulk: bulk::BulkRunner,
    /// The pull queue of pull tenants' events and its waiting requests.
    pub(crate) pull: pull::PullRuntime,
    /// In a cluster: the other nodes' ready pull entries (announcements).
    pub(crate) pull_peers: pull_peers::PullPeers,
    /// Writes made for callers that may go away, in flight.
    pub(crate) writes: writes::Writes,
}

impl Engine {
    /// Starts a single node's engine: it owns every partition, forever.
    /// Must be called inside a tokio runtime.
    pub fn start(
        options: EngineOptions,
        store: SharedStore,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Engine {
        let all: Vec<Ownership> = store.partitions().all().map(Ownership::forever).collect();
        let engine = Engine::launch(options, store, sinks, clock, "local".to_string());
        engine.handle.set_ownership(all);
        engine
    }

    /// Starts an engine that owns nothing yet: a cluster node, whose
    /// membership loop grants partitions with [`EngineHandle::set_ownership`].
    ///
    /// Records are not read ahead here (`engine.read_ahead_ms` is ignored):
    /// other nodes write too, and a record read ahead could miss a cancel
    /// another node acknowledged whose wake-up has not arrived yet. Each
    /// delivery reads its record when it fires instead.
    pub fn start_unowned(
        mut options: EngineOptions,
        store: SharedStore,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Engine {
        options.read_ahead = std::time::Duration::ZERO;
        Engine::launch(options, store, sinks, clock, belfry_core::bulk::runner_id())
    }

    /// `bulk_runner` names this node in bulk action claims.
    fn launch(
        options: EngineOptions,
        store: SharedStore,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
        bulk_runner: String,
    ) -> Engine {
        // Bounded: a delivery waits (holding its slot) while the recorder
        // is behind, so outcomes never pile up in memory.
        let (outcome_tx, outcome_rx) = mpsc::channel(options.max_in_flight.max(64));
        let (stop_signal, _) = watch::channel(false);
        let options_pull = options.pull.clone();
        let shared = Arc::new(Shared {
            limits: dispatch::Limits::new(&options),
            quotas: quotas::Quotas::new(options.limits.clone()),
            finished: tokio::sync::Notify::new(),
            schedule_firings: Arc::new(tokio::sync::Semaphore::new(
                schedules::MAX_CONCURRENT_FIRINGS,
            )),
            reads: reads::RecordReads::start(store.clone()),
            store,
            sinks,
            clock,
            options,
            owned: OwnedPartitions::default(),
            tenants: tenants::TenantCache::default(),
            outcomes: outcome_tx,
            stopping: AtomicBool::new(false),
            stop_signal,
            bulk: bulk::BulkRunner::new(bulk_runner),
            pull: pull::PullRuntime::new(&options_pull),
            pull_peers: pull_peers::PullPeers::default(),
            writes: writes::Writes::default(),
        });
        let recorder_task = tokio::spawn(recorder::run(shared.clone(), outcome_rx));
        let purge_task = tokio::spawn(purge::run(shared.clone()));
        let bulk_task = tokio::spawn(bulk::run(shared.clone()));
        let pull_task = tokio::spawn(pull::run_timer(shared.clone()));
        let lease_writer_task = shared
            .pull
            .lease_writes
            .take_receiver()
            .map(|writes| tokio::spawn(pull::run_lease_writer(shared.clone(), writes)));
        tracing::info!(
            partitions = shared.store.partitions().get(),
            window_ms = shared.options.window.as_millis() as u64,
            "engine started"
        );
        Engine {
            handle: EngineHandle { inner: shared },
            recorder_task,
            purge_task,
            bulk_task,
            pull_task,
            lease_writer_task,
        }
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Stops firing, lets in-flight deliveries finish (up to
    /// `shutdown_grace`), records their outcomes, and returns. Events not
    /// yet delivered stay pending in the store and fire after the next start.
    pub async fn shutdown(self) {
        let shared = self.handle.inner.clone();
        let grace = shared.options.shutdown_grace;
        // Writes whose callers went away finish first, their effects
        // reaching partitions that still run.
        if tokio::time::timeout(grace, shared.writes.wait_idle())
            .await
            .is_err()
        {
            tracing::warn!(
                writes = shared.writes.in_flight(),
                "client writes were still in flight at the end of the shutdown grace"
            );
        }
        shared.stopping.store(true, Ordering::SeqCst);
        // `send_replace` stores the value even while no task has subscribed
        // yet (`send` would drop it), so a task that starts later still sees it.
        shared.stop_signal.send_replace(true);
        let owned: Vec<_> = shared.owned.owned().into_iter().map(|(p, _)| p).collect();
        for task in shared.owned.stop_all() {
            let _ = task.await;
        }
        // Entries queued for a slot stay pending in the store.
        shared.limits.drop_queued(&shared);
        self.purge_task.abort();
        // Claims and calls waiting on the pull queue answer `unavailable`;
        // workers' leases are given back in the store (pending again at
        // their expiries, no attempt counted; their calls after the
        // restart answer `lease_lost`).
        let _ = self.pull_task.await;
        shared.pull.drop_waiting();
        let given_back = pull::give_back(&shared, owned);
        pull::write_given_back(&shared, given_back, grace).await;
        // Lease changes already queued are written (and answered); later
        // ones are written alone.
        if let Some(task) = self.lease_writer_task
            && tokio::time::timeout(grace, task).await.is_err()
        {
            tracing::warn!(
                "lease changes were still being written at the end of the shutdown grace"
            );
        }
        // Bulk actions stop at their next page boundary and give their
        // claims up; they continue after the next start (or elsewhere).
        if tokio::time::timeout(grace, self.bulk_task).await.is_err() {
            tracing::warn!("a bulk action page was still running at the end of the shutdown grace");
        }
        if tokio::time::timeout(grace, shared.limits.wait_idle())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "deliveries still in flight at the end of the shutdown grace; they will be retried after restart"
            );
        }
        // The recorder drains every outcome sent so far, then exits once the
        // last sender (ours and the handles') is gone or the signal says stop.
        let _ = tokio::time::timeout(grace, self.recorder_task).await;
        tracing::info!("engine stopped");
    }
}

impl EngineHandle {
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// The node's sinks (the API checks a tenant's target against them).
    pub fn sinks(&self) -> &Sinks {
        &self.inner.sinks
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    pub fn options(&self) -> &EngineOptions {
        &self.inner.options
    }

    /// Applies client commands durably (the store fsyncs before this
    /// returns) and wakes the owning partitions for every timer effect, so a
    /// new, moved or cancelled event inside a loaded window takes effect at
    /// once.
    ///
    /// # Cancellation
    /// Dropping the future drops only the wait: once called, the store call
    /// and the routing of what it committed run to the end in a task of
    /// their own (see `writes`), and [`Engine::shutdown`] waits for them.
    ///
    /// # Errors
    /// Store failures; nothing is acknowledged then (though a command may
    /// have taken effect: its partitions reload their windows from the
    /// store). [`belfry_store::StoreError::Partial`] when some commands
    /// were applied and others failed: the effects of those applied are
    /// routed like those of an `Ok`, and the error carries every command's
    /// result for the caller to answer per item.
    pub async fn apply(&self, commands: Vec<KeyedCommand>) -> StoreResult<Vec<Applied>> {
        writes::apply(&self.inner, commands, |_| {}).await
    }

    /// [`EngineHandle::apply`], then `then` once every command was applied,
    /// in the same task (it runs even if the caller went away).
    pub(crate) async fn apply_then(
        &self,
        commands: Vec<KeyedCommand>,
        then: impl FnOnce(&Shared) + Send + 'static,
    ) -> StoreResult<Vec<Applied>> {
        writes::apply(&self.inner, commands, then).await
    }

    /// Delivers `key` to its tenant now, without changing its stored state
    /// (BigBen's dry run). The attempt number sent is 0. `Ok(None)` when the
    /// event or its tenant is unknown.
    ///
    /// # Errors
    /// Store failures.
    pub async fn dry_run(
        &self,
        key: &EventKey,
    ) -> StoreResult<Option<(EventRecord, DeliveryResult)>> {
        let Some(record) = self.inner.store.get_event(key).await? else {
            return Ok(None);
        };
        let Some(tenant) = self
            .inner
            .tenants
            .get(&self.inner.store, &key.tenant)
            .await?
        else {
            return Ok(None);
        };
        let result = self
            .inner
            .sinks
            .deliver(Delivery {
                tenant: &tenant,
                event: &record,
                attempt: 0,
                triggered_at: self.inner.clock.now(),
                epoch: None,
            })
            .await;
        Ok(Some((record, result)))
    }

    /// Forget any cached config of `tenant` (it was registered, replaced or
    /// deleted).
    pub fn tenant_changed(&self, tenant: &TenantName) {
        self.inner.tenants.invalidate(tenant);
    }

    /// Makes this node fire exactly the `grants` partitions (see
    /// [`ownership`]). Partitions gained load their window from the store;
    /// partitions lost stop at once.
    pub fn set_ownership(&self, grants: Vec<Ownership>) {
        self.inner.owned.apply(&self.inner, grants);
    }

    /// The partitions owned right now, with their epochs.
    pub fn owned_partitions(&self) -> Vec<(belfry_core::PartitionId, u64)> {
        self.inner.owned.owned()
    }

    /// How many owned partitions have read their first window page, out of
    /// how many are owned: the readiness check. Cheap (one lock per
    /// partition, no store access).
    pub fn partitions_loaded(&self) -> PartitionsLoaded {
        let runtimes = self.inner.owned.runtimes();
        PartitionsLoaded {
            owned: runtimes.len(),
            loaded: runtimes.iter().filter(|r| r.window_loaded()).count(),
        }
    }

    /// A timer effect made by another node (e.g. an event created through
    /// it), pushed here by the database: applied if this node owns the
    /// partition.
    /// A version the pull queue holds is checked against the store: the
    /// change may have ended it (cancelled, moved).
    pub fn wake(&self, partition: belfry_core::PartitionId, key: EventKey, effect: Effect) {
        self.inner.send_effect(partition, key.clone(), &effect);
        pull::changed_elsewhere(&self.inner, key);
    }

    /// Wake-ups may have been missed (the push channel reconnected): every
    /// owned partition drops its window and reloads it from the store.
    pub fn resync(&self) {
        self.inner
            .owned
            .broadcast(|| belfry_core::fire::Input::Reload, self.inner.clock.now());
    }

    /// A worker's claim of `tenant`'s due events (a pull tenant's; the
    /// caller checked the key reaches it). Waits up to the claim's wait;
    /// dropping the future abandons the claim.
    pub async fn pull_claim(
        &self,
        tenant: TenantName,
        request: belfry_core::pull::ClaimRequest,
    ) -> belfry_core::pull::Reply {
        pull::claim(&self.inner, tenant, request).await
    }

    /// A call on a lease; the caller checked the key reaches its tenant.
    pub async fn pull_call(
        &self,
        lease: belfry_core::pull::LeaseId,
        request: belfry_core::pull::LeaseCall,
    ) -> belfry_core::pull::Reply {
        pull::call(&self.inner, lease, request).await
    }

    /// The answer the store's record of exactly `lease` gives a complete,
    /// fail or release (`request`), without the pull queue: for a node that
    /// could not ask the lease's owner (it went away, perhaps after
    /// recording the call). `Some` when the lease was resolved the way the
    /// call asks, answered as its owner would have; `None` when nothing of
    /// the kind is recorded (the lease may still be live on its owner), and
    /// for a heartbeat.
    ///
    /// # Errors
    /// Store failures: whether the call was recorded is not known.
    pub async fn pull_recorded_outcome(
        &self,
        lease: &belfry_core::pull::LeaseId,
        request: &belfry_core::pull::LeaseCall,
    ) -> StoreResult<Option<belfry_core::pull::Reply>> {
        pull::recorded(&self.inner, lease, request).await
    }

    /// The pull queue's counters.
    pub fn pull_stats(&self) -> belfry_core::pull::PullStats {
        self.inner.pull.stats()
    }

    /// Runs one retention sweep now (the background sweep runs every
    /// `purge_interval_ms`). Returns how many finished events went.
    ///
    /// # Errors
    /// Store failures.
    pub async fn purge_now(&self) -> StoreResult<usize> {
        purge::run_once(&self.inner).await
    }

    /// Deliveries running right now (for metrics and tests).
    pub fn in_flight(&self) -> usize {
        self.inner.limits.in_flight()
    }

    /// Writes of [`EngineHandle::apply`] not finished yet, their callers
    /// gone or not (for tests).
    pub fn writes_in_flight(&self) -> usize {
        self.inner.writes.in_flight()
    }

    /// The fire-path counters of the owned partitions, summed: repairs
    /// (entries a lost wake-up left out, armed by a repair page),
    /// evictions, duplicate claims (for metrics and tests).
    pub fn fire_stats(&self) -> belfry_core::fire::CoreStats {
        let mut total = belfry_core::fire::CoreStats::default();
        for runtime in self.inner.owned.runtimes() {
            let stats = runtime.stats();
            total.repaired += stats.repaired;
            total.evicted += stats.evicted;
            total.fired += stats.fired;
            total.duplicate_claims += stats.duplicate_claims;
            total.load_failures += stats.load_failures;
        }
        total
    }

    /// The node's fire-path state for `/metrics`: owned partitions and
    /// their epochs, deliveries in flight, outstanding and held entries,
    /// repairs, overdue entries and the age of the oldest.
    pub fn metrics_state(&self) -> belfry_metrics::NodeState {
        let now = self.now();
        let runtimes = self.inner.owned.runtimes();
        let mut state = belfry_metrics::NodeState {
            partitions: self
                .owned_partitions()
                .into_iter()
                .map(|(p, epoch)| (p.0, epoch))
                .collect(),
            in_flight: self.in_flight(),
            pull: self.inner.pull.metrics_state(),
            ..belfry_metrics::NodeState::default()
        };
        let mut oldest: Option<Timestamp> = None;
        for runtime in &runtimes {
            state.outstanding += runtime.outstanding();
            state.window_entries += runtime.held();
            state.window_capacity += runtime.capacity();
            state.window_repairs += runtime.stats().repaired;
            let (overdue, earliest) = runtime.overdue(now);
            state.overdue += overdue;
            oldest = match (oldest, earliest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        state.oldest_overdue_age = oldest.map_or(std::time::Duration::ZERO, |due| {
            std::time::Duration::from_millis(
                u64::try_from(now.as_millis() - due.as_millis()).unwrap_or(0),
            )
        });
        state
    }

    /// Wakes every partition worker to re-evaluate now: for a test that
    /// moved a manual clock (workers otherwise re-read the clock at least
    /// once a second).
    pub fn poke(&self) {
        // Only a nudge: the worker ticks its core itself and performs what
        // the tick asks for (a tick here would lose its actions).
        for runtime in self.inner.owned.runtimes() {
            runtime.poke();
        }
    }

    /// Fired entries not finished yet (queued, in delivery, or waiting for
    /// their outcome to be stored), over the owned partitions.
    pub fn outstanding(&self) -> usize {
        self.inner
            .owned
            .runtimes()
            .iter()
            .map(|r| r.outstanding())
            .sum()
    }

    /// Entries held in memory by the owned partitions (windows,
    /// outstanding entries, retry timers), and the most they may hold.
    pub fn held_in_memory(&self) -> (usize, usize) {
        let runtimes = self.inner.owned.runtimes();
        let held = runtimes.iter().map(|r| r.held()).sum();
        let capacity = runtimes.iter().map(|r| r.capacity()).sum();
        (held, capacity)
    }

    /// Hands `partitions` over cleanly: they stop firing at once, when this
    /// is *called* (their workers are taken out of the engine and their
    /// leases revoked, so nothing queued for them is delivered any more),
    /// and the returned future resolves once every delivery of theirs that
    /// was in flight has its outcome recorded, or after `grace`. It yields
    /// whether everything was recorded in time. The caller then releases
    /// their leases, so the next owner can fire at once without
    /// re-delivering anything. Pull workers' leases of them are void at
    /// once and given back in the store meanwhile (their events pending
    /// again at the leases' expiries, no attempt counted).
    pub fn release_partitions(
        &self,
        partitions: &[belfry_core::PartitionId],
        grace: std::time::Duration,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let (tasks, runtimes) = self.inner.owned.release(partitions);
        let given_back = pull::give_back(&self.inner, runtimes.iter().map(|r| r.id));
        for runtime in &runtimes {
            pull::partition_lost(&self.inner, runtime);
        }
        let shared = self.inner.clone();
        async move {
            let give_back = pull::write_given_back(&shared, given_back, grace);
            let recorded = async {
                for task in tasks {
                    let _ = task.await;
                }
                let drained = async {
                    loop {
                        let notified = shared.finished.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        if runtimes.iter().all(|r| r.outstanding() == 0) {
                            return;
                        }
                        notified.await;
                    }
                };
                tokio::time::timeout(grace, drained).await.is_ok()
            };
            let ((), recorded) = tokio::join!(give_back, recorded);
            recorded
        }
    }
}

impl Shared {
    /// Sends the timer effects of applied commands to their partitions.
    /// Partitions owned elsewhere learn of them through the store's push
    /// channel (cluster mode) or their loader.
    /// A pull tenant's version held by the pull queue that the command
    /// ended (cancelled, moved) is dropped from the queue at once (see
    /// [`pull::versions_ended`]).
    pub(crate) fn route_effects(self: &Arc<Self>, applied: &[Applied]) {
        for item in applied {
            for effect in &item.effects {
                self.send_effect(item.partition, item.key.clone(), effect);
            }
            if !item.effects.is_empty() {
                pull::versions_ended(self, &item.key, item.record.as_ref());
            }
        }
    }

    pub(crate) fn send_effect(
        &self,
        partition: belfry_core::PartitionId,
        key: EventKey,
        effect: &Effect,
    ) {
        let input = match *effect {
            Effect::Arm { at } => Input::Offer(DueCursor { due: at, key }),
            Effect::Disarm { at } => Input::Remove(DueCursor { due: at, key }),
        };
        // Not owned here, or stopping: the store still holds the event and
        // its owner's loader finds it.
        self.owned.input(partition, input, self.clock.now());
    }
}
