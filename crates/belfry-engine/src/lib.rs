//! The per-partition engine: it keeps a bounded near-future window of each
//! partition in memory, fires every event at its instant (never before),
//! delivers with bounded concurrency, and records outcomes in batches.
//!
//! # Layout
//! - [`options`]: [`EngineOptions`], the knobs and their defaults;
//! - `tasks`: the engine's task tracker (every task is spawned through it,
//!   so dropping the [`Engine`] aborts them all) and its stop signal;
//! - [`partition`]: one worker per owned partition, the runtime of its
//!   [`belfry_core::fire::PartitionCore`] (which makes every fire-path
//!   decision), its ownership `Term` (epoch and firing window), and the
//!   `Ticket` of each fired entry: the one thing the partition hands the
//!   dispatcher (through the `Deliver` handle it was given) and the
//!   dispatcher the recorder or the pull queue, finished by its last holder;
//! - [`membership`]: the cluster loop (heartbeat, leader lease, partition
//!   assignment, lease renewal, hand-overs) that grants ownership;
//! - [`ownership`]: which partitions this node fires, under which epoch and
//!   until when (all of them, forever, on a single node); it returns what
//!   a change lost instead of telling anyone;
//! - [`partitions`]: [`partitions::Partitions`], the sub-handle that applies
//!   ownership changes to the owned partitions, then to the pull queue;
//! - [`pull`]: the runtime of this node's pull queue (pull tenants'
//!   leases: claims, calls, fenced lease writes), and [`pull::Pull`], its
//!   sub-handle;
//! - `pull_peers`: pull claims across a cluster (announcements of
//!   unclaimed ready entries, sent and heard; claims parked here woken by
//!   another node's);
//! - [`dispatch`]: the partitions' `Deliver` handle: delivery slots
//!   ([`belfry_core::fire::DeliverySlots`]), then per ticket the record
//!   read, the claim, and the delivery (I/O around the decisions of
//!   [`belfry_core::fire::decide`]);
//! - `reads`: fire-time record reads, batched node-wide;
//! - [`recorder`]: batches attempt outcomes into the store and finishes
//!   their tickets;
//! - [`schedules`]: recurring schedules: the control-event firing (plan,
//!   store occurrences, move the control event) and their management
//!   ([`schedules::Schedules`]);
//! - [`bulk`]: the bulk action runner (cancel, redrive, pause, resume
//!   over a filter, page by page, resumable, one node at a time) and
//!   [`bulk::BulkActions`];
//! - [`purge`]: the background retention sweep;
//! - `schedule_scan`: a tenant's live schedule definitions, for the
//!   schedules component and the quotas (below both);
//! - [`quotas`]: per-tenant quotas on pending events, schedules and
//!   payload size, checked before client writes ([`quotas::Quotas`]); the
//!   node's `[limits]` section ([`quotas::LimitsOptions`]);
//! - [`tenants`]: tenant configs, their writes and a short-lived cache;
//! - [`circuits`]: tenant endpoints' circuit breakers on this node (the
//!   runtime of [`belfry_core::breaker::Breakers`]) and the one place
//!   their transitions are acted on;
//! - `writes`: writes made for callers that may go away (API requests,
//!   ingest, bulk actions): store call and routing in a task of their own.
//!
//! [`EngineHandle`] is a facade: `impl EngineHandle` lives in this file
//! only, and hands out the sub-handles above. `Shared` (this file) holds
//! the components: `Env` (store, sinks, clock, options, task spawner),
//! the owned partitions, `FirePath` (reads, slots, the recorder's inbox),
//! tenants, quotas, bulk, pull, writes and notices. The partition workers, the
//! owned partitions and the retention sweep hold only the `Env`; the
//! recorder only what it reads (deliveries in flight and where effects go
//! are traits); the others still reach `Shared`.
//!
//! Modules import one way (no circle), bottom-up: tasks, writes, notices,
//! circuits, tenants, reads, partition, ownership; pull, pull_peers;
//! schedule_scan, quotas; options; schedules, recorder; dispatch;
//! partitions, bulk, membership.
//!
//! # The fire path
//! See `docs/ARCHITECTURE.md`. In short: each partition core pages due
//! entries into a bounded window, fires them at their instant (never
//! before), the dispatcher gives them delivery slots, a delivery checks the
//! record, claims its version and delivers, and the recorder stores the
//! outcome in batches, finishes the entry's ticket and routes the
//! resulting timer effects back to the cores.
//!
//! Components are built `Options → Engine → cheap-clone EngineHandle`.

use std::sync::Arc;

use belfry_core::event::Effect;
use belfry_core::fire::Input;
use belfry_core::{Clock, DueCursor, EventKey, EventRecord, Timestamp};
use belfry_sinks::{Delivery, DeliveryResult, Sinks};
use belfry_store::{Applied, ApplyParams, KeyedCommand, SharedStore, StoreResult};
use tokio::sync::mpsc;

pub mod bulk;
pub mod circuits;
pub mod dispatch;
pub mod membership;
pub mod notices;
pub mod options;
pub mod ownership;
pub mod partition;
pub mod partitions;
pub mod pull;
mod pull_peers;
pub mod purge;
pub mod quotas;
mod reads;
pub mod recorder;
mod schedule_scan;
pub mod schedules;
mod tasks;
pub mod tenants;
mod writes;

pub use options::EngineOptions;
pub use ownership::Ownership;

use crate::ownership::OwnedPartitions;

/// See [`partitions::Partitions::loaded`].
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

/// A running engine. Call [`Engine::shutdown`] to stop it cleanly;
/// dropping it aborts every task of it at once (a crash, for tests).
#[derive(Debug)]
pub struct Engine {
    handle: EngineHandle,
    /// Owns every task of the engine.
    tasks: tasks::TaskTracker,
    recorder_task: tasks::Joined<()>,
    bulk_task: tasks::Joined<()>,
    pull_task: tasks::Joined<()>,
    lease_writer_task: Option<tasks::Joined<()>>,
}

/// What the API edge uses: apply commands (store, then wake the owning
/// partition), dry-run deliveries, read the clock.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    inner: Arc<Shared>,
}

/// The engine's components, as every engine task reaches them.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) env: Arc<Env>,
    /// The partitions this node owns, with their workers.
    pub(crate) owned: OwnedPartitions,
    pub(crate) fire_path: FirePath,
    pub(crate) tenants: tenants::TenantCache,
    /// Tenant endpoints' circuit breakers (this node's judgement).
    pub(crate) circuits: circuits::CircuitRuntime,
    /// Per-tenant quota estimates (client writes are checked against them).
    pub(crate) quotas: quotas::QuotaState,
    /// The bulk action runner's state (claims, wake-up).
    pub(crate) bulk: bulk::BulkRunner,
    /// The pull queue of pull tenants' events and its waiting requests.
    pub(crate) pull: pull::PullRuntime,
    /// In a cluster: the other nodes' ready pull entries (announcements).
    pub(crate) pull_peers: pull_peers::PullPeers,
    /// Writes made for callers that may go away, in flight.
    pub(crate) writes: writes::Writes,
    /// Notices waiting to be written.
    pub(crate) notices: notices::NoticeQueues,
}

/// What every component reads.
#[derive(Debug)]
pub(crate) struct Env {
    pub(crate) store: SharedStore,
    pub(crate) sinks: Sinks,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: EngineOptions,
    /// Spawns onto the engine's tasks; says when shutdown started (no new
    /// delivery begins after it).
    pub(crate) tasks: tasks::Spawner,
}

impl Env {
    /// Applies `commands` to the store at the clock's now, with the
    /// configured retry policy.
    pub(crate) async fn apply_now(&self, commands: Vec<KeyedCommand>) -> StoreResult<Vec<Applied>> {
        self.store
            .apply(ApplyParams {
                commands,
                now: self.clock.now(),
                retry: self.options.retry.clone(),
            })
            .await
    }
}

/// The fire path past the partitions: record reads, delivery slots, the
/// recorder's inbox, and the bound on schedule firings.
#[derive(Debug)]
pub(crate) struct FirePath {
    /// Fire-time record reads, batched node-wide.
    pub(crate) reads: reads::RecordReads,
    pub(crate) slots: Arc<dispatch::Slots>,
    pub(crate) outcomes: mpsc::Sender<recorder::Outcome>,
    /// Bounds schedule firings in progress (each holds a plan and store
    /// writes); the others wait as small tasks.
    pub(crate) schedule_firings: Arc<tokio::sync::Semaphore>,
}

/// Routes recorded effects to the owning partitions and the pull queue
/// ([`Shared::route_effects`]), for the recorder.
struct EffectsRouter(Arc<Shared>);

impl recorder::RouteEffects for EffectsRouter {
    fn route(&self, applied: &[Applied]) {
        self.0.route_effects(applied);
    }
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
        engine.handle.partitions().set(all);
        engine
    }

    /// Starts an engine that owns nothing yet: a cluster node, whose
    /// membership loop grants partitions with [`partitions::Partitions::set`].
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
        let tracker = tasks::TaskTracker::new();
        let spawner = tracker.spawner();
        let shared = Arc::new_cyclic(|shared| Shared {
            fire_path: FirePath {
                reads: reads::RecordReads::start(store.clone(), &spawner),
                slots: Arc::new(dispatch::Slots::new(&options)),
                outcomes: outcome_tx,
                schedule_firings: Arc::new(tokio::sync::Semaphore::new(
                    schedules::MAX_CONCURRENT_FIRINGS,
                )),
            },
            quotas: quotas::QuotaState::new(options.limits.clone()),
            tenants: tenants::TenantCache::new(store.clone(), clock.clone()),
            circuits: circuits::CircuitRuntime::new(options.circuit_breaker.clone()),
            owned: OwnedPartitions::new(Arc::new(dispatch::Dispatcher::new(shared.clone()))),
            bulk: bulk::BulkRunner::new(bulk_runner),
            pull: pull::PullRuntime::new(&options.pull, clock.now()),
            pull_peers: pull_peers::PullPeers::default(),
            writes: writes::Writes::default(),
            notices: notices::NoticeQueues::default(),
            env: Arc::new(Env {
                store,
                sinks,
                clock,
                options,
                tasks: spawner.clone(),
            }),
        });
        let recorder = recorder::Recorder {
            store: shared.env.store.clone(),
            clock: shared.env.clock.clone(),
            linger: shared.env.options.record_linger,
            retry: shared.env.options.retry.clone(),
            in_flight: shared.fire_path.slots.clone(),
            effects: Arc::new(EffectsRouter(shared.clone())),
        };
        let recorder_task =
            spawner.spawn_joined(recorder::run(recorder, outcome_rx, spawner.stop_receiver()));
        spawner.spawn(purge::run(shared.env.clone()));
        let bulk_task = spawner.spawn_joined(bulk::run(shared.clone()));
        let pull_task = spawner.spawn_joined(pull::run_timer(shared.clone()));
        let lease_writer_task = shared
            .pull
            .lease_writes
            .take_receiver()
            .map(|writes| spawner.spawn_joined(pull::run_lease_writer(shared.clone(), writes)));
        tracing::info!(
            partitions = shared.env.store.partitions().get(),
            window_ms = shared.env.options.window.as_millis() as u64,
            "engine started"
        );
        Engine {
            handle: EngineHandle { inner: shared },
            tasks: tracker,
            recorder_task,
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
        let grace = shared.env.options.shutdown_grace;
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
        self.tasks.signal_stop();
        let owned: Vec<_> = shared.owned.owned().into_iter().map(|(p, _)| p).collect();
        for task in shared.owned.stop_all() {
            task.join().await;
        }
        // Entries queued for a slot stay pending in the store.
        shared.fire_path.slots.drop_queued();
        // Claims and calls waiting on the pull queue answer `unavailable`;
        // workers' leases are given back in the store (pending again at
        // their expiries, no attempt counted; their calls after the
        // restart answer `lease_lost`).
        self.pull_task.join().await;
        shared.pull.drop_waiting();
        let given_back = pull::give_back(&shared, owned);
        pull::write_given_back(&shared, given_back, grace).await;
        // Lease changes already queued are written (and answered); later
        // ones are written alone.
        if let Some(task) = self.lease_writer_task
            && tokio::time::timeout(grace, task.join()).await.is_err()
        {
            tracing::warn!(
                "lease changes were still being written at the end of the shutdown grace"
            );
        }
        // Bulk actions stop at their next page boundary and give their
        // claims up; they continue after the next start (or elsewhere).
        if tokio::time::timeout(grace, self.bulk_task.join())
            .await
            .is_err()
        {
            tracing::warn!("a bulk action page was still running at the end of the shutdown grace");
        }
        if tokio::time::timeout(grace, shared.fire_path.slots.wait_idle())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "deliveries still in flight at the end of the shutdown grace; they will be retried after restart"
            );
        }
        // Schedule firings take no delivery slot: wait for those in flight
        // too (the stop signal makes the waiting ones give up), so a clean
        // stop never cuts a firing between its occurrences and the move of
        // its control event.
        let all_firings = u32::try_from(schedules::MAX_CONCURRENT_FIRINGS).unwrap_or(u32::MAX);
        if tokio::time::timeout(
            grace,
            shared.fire_path.schedule_firings.acquire_many(all_firings),
        )
        .await
        .is_err()
        {
            tracing::warn!("schedule firings still in flight at the end of the shutdown grace");
        }
        // The recorder drains every outcome sent so far, then exits once the
        // last sender (ours and the handles') is gone or the signal says stop.
        let _ = tokio::time::timeout(grace, self.recorder_task.join()).await;
        // Dropping the tracker aborts what is left (the retention sweep).
        drop(self.tasks);
        tracing::info!("engine stopped");
    }
}

impl EngineHandle {
    pub fn store(&self) -> &SharedStore {
        &self.inner.env.store
    }

    /// Raises `notice` for `tenant` (see [`notices`]): never waits, and
    /// does nothing for a tenant without a notice target.
    pub fn raise_notice(
        &self,
        tenant: &belfry_core::TenantName,
        notice: belfry_core::notice::Notice,
    ) {
        notices::raise(&self.inner, tenant, notice);
    }

    pub fn now(&self) -> Timestamp {
        self.inner.env.clock.now()
    }

    /// The node's sinks (the API checks a tenant's target against them).
    pub fn sinks(&self) -> &Sinks {
        &self.inner.env.sinks
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.env.clock
    }

    pub fn options(&self) -> &EngineOptions {
        &self.inner.env.options
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
        let Some(record) = self.inner.env.store.get_event(key).await? else {
            return Ok(None);
        };
        let Some(tenant) = self.inner.tenants.get(&key.tenant).await? else {
            return Ok(None);
        };
        let result = self
            .inner
            .env
            .sinks
            .deliver(Delivery {
                tenant: &tenant.config,
                event: &record,
                attempt: 0,
                triggered_at: self.inner.env.clock.now(),
                epoch: None,
            })
            .await;
        Ok(Some((record, result)))
    }

    /// Tenants: config reads (cached) and writes, pause and resume.
    pub fn tenants(&self) -> tenants::Tenants<'_> {
        tenants::Tenants {
            shared: &self.inner,
        }
    }

    /// Tenant endpoints' circuits on this node: their state, and the
    /// listener of their transitions.
    pub fn circuits(&self) -> circuits::Circuits<'_> {
        circuits::Circuits {
            shared: &self.inner,
        }
    }

    /// The partitions this node fires: ownership, hand-overs, counters.
    pub fn partitions(&self) -> partitions::Partitions<'_> {
        partitions::Partitions {
            shared: &self.inner,
        }
    }

    /// The pull queue: workers' claims and lease calls, and its part in a
    /// cluster.
    pub fn pull(&self) -> pull::Pull<'_> {
        pull::Pull {
            shared: &self.inner,
        }
    }

    /// Recurring schedules' management.
    pub fn schedules(&self) -> schedules::Schedules<'_> {
        schedules::Schedules { engine: self }
    }

    /// Bulk actions: create, cancel.
    pub fn bulk(&self) -> bulk::BulkActions<'_> {
        bulk::BulkActions { engine: self }
    }

    /// Per-tenant quota checks of client writes and dry runs.
    pub fn quotas(&self) -> quotas::Quotas<'_> {
        quotas::Quotas { engine: self }
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

    /// Runs one retention sweep now (the background sweep runs every
    /// `purge_interval_ms`). Returns how many finished events went.
    ///
    /// # Errors
    /// Store failures.
    pub async fn purge_now(&self) -> StoreResult<usize> {
        purge::run_once(&self.inner.env).await
    }

    /// Deliveries running right now (for metrics and tests).
    pub fn in_flight(&self) -> usize {
        self.inner.fire_path.slots.in_flight()
    }

    /// Writes of [`EngineHandle::apply`] not finished yet, their callers
    /// gone or not (for tests).
    pub fn writes_in_flight(&self) -> usize {
        self.inner.writes.in_flight()
    }

    /// The node's fire-path state for `/metrics`: owned partitions and
    /// their epochs, deliveries in flight, outstanding and held entries,
    /// repairs, overdue entries and the age of the oldest.
    pub fn metrics_state(&self) -> belfry_metrics::NodeState {
        let now = self.now();
        let runtimes = self.inner.owned.runtimes();
        let mut state = belfry_metrics::NodeState {
            partitions: self
                .inner
                .owned
                .owned()
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
}

impl Shared {
    /// Sends the timer effects of applied commands to their partitions.
    /// Partitions owned elsewhere learn of them through the store's push
    /// channel (cluster mode) or their loader.
    /// A pull tenant's version held by the pull queue that the command
    /// ended (cancelled, moved) is dropped from the queue at once (see
    /// [`pull::versions_ended`]).
    pub(crate) fn route_effects(self: &Arc<Self>, applied: &[Applied]) {
        self.route_effects_without_notices(applied);
        notices::ended(self, applied);
    }

    /// [`Shared::route_effects`] for writes that raise their notices
    /// themselves (a schedule firing's missed occurrences).
    pub(crate) fn route_effects_without_notices(self: &Arc<Self>, applied: &[Applied]) {
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
        self.owned.input(partition, input, self.env.clock.now());
    }
}
