//! One worker per owned partition: the runtime of its
//! [`belfry_core::fire::PartitionCore`].
//!
//! The core decides everything on the fire path (what to page in, what to
//! read ahead, what fires, what is a duplicate, what to evict); this module
//! only performs its actions and feeds the results back:
//! - `Load` → a due-index page read on its own task → `Loaded`;
//! - `ReadAhead` → one batched record read on its own task (fjall holds its
//!   version lock while a flush fsyncs, so reads on the delivery path used
//!   to stall every delivery by 50–100 ms) → `ReadAhead`;
//! - `Deliver` → one [`Ticket`] per fired entry, handed to the [`Deliver`]
//!   handle the worker was given (the dispatcher); whoever holds a ticket
//!   last finishes it (`Finished`), and delivery tasks claim through it.
//!
//! Wake-ups (new, moved, cancelled events; recorded outcomes) are applied to
//! the core synchronously by whoever has them ([`PartitionRuntime::input`]),
//! under the core's lock; there is no inbox to grow. The worker sleeps until
//! the core's next wake-up or until poked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use belfry_core::fire::{Action, CoreConfig, Finish, Fired, Input, LoadRequest, PartitionCore};
use belfry_core::ownership::FiringWindow;
use belfry_core::{
    Clock, DueCursor, EventKey, EventRecord, EventVersion, MonoTime, PartitionId, Timestamp,
};
use belfry_store::DuePageParams;
use tokio::sync::{Notify, watch};

use crate::Env;

/// How often a partition whose firing window closed (its lease lapsed)
/// checks whether it was renewed.
const WINDOW_RECHECK: Duration = Duration::from_millis(100);
/// Longest sleep between checks: the wall clock may jump, and re-reading it
/// often keeps lateness bounded.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// One ownership term of a partition: its epoch and live firing window;
/// shared by its worker and the delivery tasks it spawns.
#[derive(Debug)]
pub(crate) struct Term {
    pub(crate) epoch: u64,
    /// The window's ends on the clock's monotonic time line, in
    /// microseconds: renewals move them while deliveries read them.
    fire_from: AtomicU64,
    fire_until: AtomicU64,
    clock: Arc<dyn Clock>,
}

impl Term {
    /// Term `epoch`, firing inside `window` of `clock`'s monotonic time.
    pub(crate) fn new(epoch: u64, window: FiringWindow, clock: Arc<dyn Clock>) -> Self {
        let term = Term {
            epoch,
            fire_from: AtomicU64::new(0),
            fire_until: AtomicU64::new(0),
            clock,
        };
        term.update(window);
        term
    }

    /// Moves the window (a lease renewal).
    pub(crate) fn update(&self, window: FiringWindow) {
        self.fire_from.store(offset(window.from), Ordering::SeqCst);
        self.fire_until
            .store(offset(window.until), Ordering::SeqCst);
    }

    /// Closes the window for good: the partition was released or lost, so
    /// entries already handed to the dispatcher (queued for a worker, or not
    /// yet claimed) must not be delivered under this window any more.
    pub(crate) fn close(&self) {
        self.fire_until.store(0, Ordering::SeqCst);
    }

    /// The window as it stands.
    fn window(&self) -> FiringWindow {
        FiringWindow {
            from: micros(self.fire_from.load(Ordering::SeqCst)),
            until: micros(self.fire_until.load(Ordering::SeqCst)),
        }
    }

    /// Whether a delivery may start now.
    pub(crate) fn may_fire(&self) -> bool {
        self.window().may_fire(self.clock.monotonic())
    }

    /// How long until firing may start (zero if it may already).
    pub(crate) fn wait_before_firing(&self) -> Duration {
        self.window().wait_before_firing(self.clock.monotonic())
    }
}

fn offset(at: MonoTime) -> u64 {
    u64::try_from(at.since_origin().as_micros()).unwrap_or(u64::MAX)
}

fn micros(offset: u64) -> MonoTime {
    MonoTime::from_origin(Duration::from_micros(offset))
}

/// A partition's core and what the worker and delivery tasks share.
#[derive(Debug)]
pub(crate) struct PartitionRuntime {
    pub(crate) id: PartitionId,
    pub(crate) term: Arc<Term>,
    core: Mutex<PartitionCore>,
    /// Pokes the worker: something changed, re-evaluate now.
    wake: Notify,
    /// Signalled whenever one of its fired entries is finished: hand-overs
    /// and shutdown wait on it (shared by every partition).
    finished: Arc<Notify>,
    clock: Arc<dyn Clock>,
}

impl PartitionRuntime {
    pub(crate) fn new(
        id: PartitionId,
        term: Arc<Term>,
        config: CoreConfig,
        finished: Arc<Notify>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        PartitionRuntime {
            id,
            term,
            core: Mutex::new(PartitionCore::new(config)),
            wake: Notify::new(),
            finished,
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, PartitionCore> {
        // Poison means a panic inside `handle`; the core's state is then
        // suspect, but a partition that stops firing would lose events
        // silently. The repair pages and fire-time checks cover it.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies an input and pokes the worker. Returns the core's actions
    /// (only `Claim` produces one the caller needs; the worker picks up the
    /// rest at its next tick).
    pub(crate) fn input(&self, input: Input, now: Timestamp) -> Vec<Action> {
        let actions = self.lock().handle(input, now);
        self.wake.notify_one();
        actions
    }

    /// Whether a delivery holds the claim on `version` of `key`, asked
    /// once the key's change is known here: the wake-up goes in first
    /// ([`Input::MayHaveChanged`]), under the same lock, so a delivery
    /// that read the record before the change reads it again before it
    /// claims, and "not claimed" stays true.
    pub(crate) fn claimed_after_change(
        &self,
        key: &EventKey,
        version: &EventVersion,
        now: Timestamp,
    ) -> bool {
        let mut core = self.lock();
        core.handle(Input::MayHaveChanged(key.clone()), now);
        core.is_claimed(key, version)
    }

    /// A fired entry's attempt ended and its outcome goes to the recorder
    /// ([`Input::Attempted`]). Pokes the worker only when that let its
    /// tenant fire again: at 10,000 deliveries/s a poke per delivery is a
    /// tick per delivery.
    pub(crate) fn attempted(&self, entry: belfry_core::DueCursor, now: Timestamp) {
        let unblocked = {
            let mut core = self.lock();
            let was_blocked = core.window().is_blocked(&entry.key.tenant);
            let tenant = was_blocked.then(|| entry.key.tenant.clone());
            core.handle(Input::Attempted { entry }, now);
            tenant.is_some_and(|tenant| !core.window().is_blocked(&tenant))
        };
        if unblocked {
            self.wake.notify_one();
        }
    }

    /// Wakes the worker to tick its core now.
    pub(crate) fn poke(&self) {
        self.wake.notify_one();
    }

    /// Entries fired here and not finished yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().outstanding()
    }

    /// Entries the core holds, and the most it may.
    pub(crate) fn held(&self) -> usize {
        self.lock().held()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.lock().config().capacity
    }

    /// Window entries whose instant passed and that are not fired yet, and
    /// the earliest of their instants.
    pub(crate) fn overdue(
        &self,
        now: belfry_core::Timestamp,
    ) -> (usize, Option<belfry_core::Timestamp>) {
        self.lock().window().overdue(now)
    }

    /// Whether the core has read its first window page since it was
    /// started (or reloaded): until then, events already due may sit in
    /// the store unseen by this node.
    pub(crate) fn window_loaded(&self) -> bool {
        self.lock().window().cursor().is_some()
    }

    /// Counters of the core (repairs, evictions, …).
    pub(crate) fn stats(&self) -> belfry_core::fire::CoreStats {
        self.lock().stats().clone()
    }
}

/// One fired entry of one partition: what the partition hands the
/// dispatcher, and the dispatcher the recorder or the pull queue. Whoever
/// holds it last finishes it ([`Ticket::finish`]); dropped unfinished, the
/// entry stays outstanding in its core (as when the engine stops).
#[derive(Debug)]
pub(crate) struct Ticket {
    partition: Arc<PartitionRuntime>,
    entry: DueCursor,
    /// The record read ahead, if any, taken by the first read.
    read_ahead: Option<EventRecord>,
}

/// What [`Ticket::claim`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This delivery holds the version.
    Granted,
    /// The event changed since its record was read: read it again.
    Reread,
    /// Another copy of the version is being delivered; the core finished
    /// this one.
    Duplicate,
}

impl Ticket {
    fn new(partition: Arc<PartitionRuntime>, fired: Fired) -> Self {
        Ticket {
            partition,
            entry: fired.entry,
            read_ahead: fired.record,
        }
    }

    pub(crate) fn entry(&self) -> &DueCursor {
        &self.entry
    }

    pub(crate) fn partition(&self) -> PartitionId {
        self.partition.id
    }

    pub(crate) fn term(&self) -> &Arc<Term> {
        &self.partition.term
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.partition.term.epoch
    }

    /// Whether its partition's firing window is open now.
    pub(crate) fn may_fire(&self) -> bool {
        self.partition.term.may_fire()
    }

    /// The record read ahead with the entry, once.
    pub(crate) fn take_read_ahead(&mut self) -> Option<EventRecord> {
        self.read_ahead.take()
    }

    /// Claims `version` for delivery with the partition's core.
    pub(crate) fn claim(&self, version: &EventVersion) -> Claim {
        let input = Input::Claim {
            entry: self.entry.clone(),
            version: version.clone(),
        };
        match self.partition.input(input, self.partition.clock.now())[..] {
            [Action::Claimed { granted: true, .. }] => Claim::Granted,
            [Action::Reread { .. }] => Claim::Reread,
            _ => Claim::Duplicate,
        }
    }

    /// The attempt is over (its outcome goes to the recorder): the entry
    /// stops counting against its tenant's outstanding bound.
    pub(crate) fn attempted(&self) {
        self.partition
            .attempted(self.entry.clone(), self.partition.clock.now());
    }

    /// Tells the partition's core the entry is finished.
    pub(crate) fn finish(self, finish: Finish) {
        let partition = self.partition;
        partition.input(
            Input::Finished {
                entry: self.entry,
                finish,
            },
            partition.clock.now(),
        );
        partition.finished.notify_waiters();
    }
}

/// Where a partition hands what it fired (the dispatcher).
pub(crate) trait Deliver: Send + Sync + std::fmt::Debug {
    fn deliver(&self, tickets: Vec<Ticket>);
}

/// The core configuration for one partition of this engine.
pub(crate) fn core_config(env: &Env) -> CoreConfig {
    let options = &env.options;
    let partitions = usize::from(env.store.partitions().get());
    let base = CoreConfig::with_capacity(options.max_events_in_memory / partitions);
    CoreConfig {
        window: options.window,
        read_ahead: options.read_ahead,
        repair_interval: options.repair_interval,
        // Enough per partition for the tenant to use all its slots when
        // its events spread over the partitions, and a few queued behind.
        // The floor stays low: ten hung tenants at the floor of 64 had
        // 41,000 entries fired at their instant (and as many records read
        // ahead), and other tenants' events waited for that work.
        max_outstanding_per_tenant: (4 * options.max_in_flight_per_tenant / partitions).max(16),
        ..base
    }
}

pub(crate) async fn run(
    env: Arc<Env>,
    partition: Arc<PartitionRuntime>,
    deliver: Arc<dyn Deliver>,
    mut released: watch::Receiver<bool>,
) {
    let mut stop = env.tasks.stop_receiver();
    loop {
        if *stop.borrow() || *released.borrow() {
            break;
        }
        let now = env.clock.now();
        // A new owner waits out the previous owner's lease; an owner whose
        // lease lapsed (no renewal: database or network trouble) holds its
        // entries until it is renewed or released.
        let may_fire = partition.term.may_fire();
        let (actions, wake_at) = {
            let mut core = partition.lock();
            let actions = core.handle(Input::Tick { may_fire }, now);
            (actions, core.next_wake(now))
        };
        perform(&env, &partition, deliver.as_ref(), actions);
        let mut sleep_for = now.until(wake_at).min(MAX_SLEEP);
        if !may_fire {
            let takeover_wait = partition.term.wait_before_firing();
            let window_wait = if takeover_wait.is_zero() {
                WINDOW_RECHECK
            } else {
                takeover_wait
            };
            // Entries already due cannot fire before the window opens:
            // waking for them at once spun, for as long as no lease could
            // be renewed (a database whose commits hang).
            sleep_for = if sleep_for.is_zero() {
                window_wait
            } else {
                sleep_for.min(window_wait)
            };
        }
        if sleep_for.is_zero() {
            // Due now (another batch, or a load to start): yield, then go on.
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            _ = released.changed() => break,
            _ = partition.wake.notified() => {}
            _ = crate::tasks::pause(sleep_for) => {}
        }
    }
}

fn perform(
    env: &Arc<Env>,
    partition: &Arc<PartitionRuntime>,
    deliver: &dyn Deliver,
    actions: Vec<Action>,
) {
    for action in actions {
        match action {
            Action::Load(request) => spawn_load(env, partition, request),
            Action::ReadAhead(keys) => {
                let tasks = env.tasks.clone();
                let (env, partition) = (env.clone(), partition.clone());
                tasks.spawn(async move {
                    let read = env.store.get_events(&keys).await;
                    let records = read
                        .ok()
                        .map(|records| keys.into_iter().zip(records).collect());
                    partition.input(Input::ReadAhead { records }, env.clock.now());
                });
            }
            // Entries without a record read ahead (a cluster node never reads
            // ahead) read theirs when their delivery starts, batched
            // node-wide (`reads.rs`).
            Action::Deliver(fired) => deliver.deliver(
                fired
                    .into_iter()
                    .map(|fired| Ticket::new(partition.clone(), fired))
                    .collect(),
            ),
            // Only answers a `Claim`, which delivery tasks send themselves.
            Action::Claimed { .. } | Action::Reread { .. } => {}
        }
    }
}

fn spawn_load(env: &Arc<Env>, partition: &Arc<PartitionRuntime>, request: LoadRequest) {
    let tasks = env.tasks.clone();
    let (env, partition) = (env.clone(), partition.clone());
    tasks.spawn(async move {
        let page = env.store
            .due_page(DuePageParams {
                partition: partition.id,
                after: request.after.clone(),
                through: request.through,
                limit: request.limit,
                tenant: request.tenant().cloned(),
                skip_tenants: request.skip.clone(),
            })
            .await;
        let page = match page {
            Ok(page) => Some(page),
            Err(error) => {
                tracing::warn!(partition = %partition.id, %error, "loading due events failed; retrying");
                None
            }
        };
        partition.input(Input::Loaded { request, page }, env.clock.now());
    });
}
