//! Which partitions this node fires, under which epoch, and until when.
//!
//! A single node owns every partition forever (epoch 0). In a cluster the
//! membership loop calls [`Partitions::set`] after each
//! lease renewal: partitions gained get a worker, partitions lost have theirs
//! stopped, and every owned partition's firing window moves forward.
//!
//! Firing is allowed only inside `[fire_from, fire_until)` on this process's
//! monotonic clock: `fire_from` waits out the previous owner's lease,
//! `fire_until` ends a safety margin before this node's own lease can expire.
//! The dispatcher checks it right before each delivery, so a node that was
//! paused (SIGSTOP, a long GC-like stall) past its lease delivers nothing for
//! the partitions it lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use belfry_core::fire::Input;
use belfry_core::ownership::FiringWindow;
use belfry_core::{MonoTime, PartitionId, Timestamp, partition_ranges};
use tokio::sync::watch;

use crate::Shared;
use crate::partition::PartitionRuntime;
use crate::tasks::Joined;

/// One owned partition, as the membership loop grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    pub partition: PartitionId,
    pub epoch: u64,
    /// Not before this instant (the previous owner's lease may run until then).
    pub fire_from: Instant,
    /// Not from this instant on (this node's lease may have expired by then).
    pub fire_until: Instant,
}

impl Ownership {
    /// Owned for as long as the process runs (a single node).
    pub fn forever(partition: PartitionId) -> Self {
        let now = Instant::now();
        Ownership {
            partition,
            epoch: 0,
            fire_from: now,
            // Far enough to never matter, near enough not to overflow.
            fire_until: now + Duration::from_secs(100 * 365 * 24 * 3600),
        }
    }
}

/// One ownership term of a partition: its epoch and live firing window;
/// shared by its worker and the delivery tasks it spawns.
#[derive(Debug)]
pub(crate) struct Term {
    pub(crate) epoch: u64,
    base: Instant,
    /// Offsets from `base` in microseconds.
    fire_from: AtomicU64,
    fire_until: AtomicU64,
}

impl Term {
    fn new(grant: &Ownership) -> Self {
        let base = Instant::now();
        let term = Term {
            epoch: grant.epoch,
            base,
            fire_from: AtomicU64::new(0),
            fire_until: AtomicU64::new(0),
        };
        term.update(grant);
        term
    }

    fn offset(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    fn update(&self, grant: &Ownership) {
        self.fire_from
            .store(self.offset(grant.fire_from), Ordering::SeqCst);
        self.fire_until
            .store(self.offset(grant.fire_until), Ordering::SeqCst);
    }

    /// Closes the window for good: the partition was released or lost, so
    /// entries already handed to the dispatcher (queued for a worker, or not
    /// yet claimed) must not be delivered under this window any more.
    fn close(&self) {
        self.fire_until.store(0, Ordering::SeqCst);
    }

    /// The window as it stands, on a time line starting at `base`.
    fn window(&self) -> FiringWindow {
        FiringWindow {
            from: micros(self.fire_from.load(Ordering::SeqCst)),
            until: micros(self.fire_until.load(Ordering::SeqCst)),
        }
    }

    /// Whether a delivery may start now.
    pub(crate) fn may_fire(&self) -> bool {
        self.window().may_fire(micros(self.offset(Instant::now())))
    }

    /// How long until firing may start (zero if it may already).
    pub(crate) fn wait_before_firing(&self) -> Duration {
        self.window()
            .wait_before_firing(micros(self.offset(Instant::now())))
    }
}

fn micros(offset: u64) -> MonoTime {
    MonoTime::from_origin(Duration::from_micros(offset))
}

/// A running partition worker.
#[derive(Debug)]
struct Worker {
    runtime: Arc<PartitionRuntime>,
    stop: watch::Sender<bool>,
    task: Joined<()>,
}

/// The partitions this node owns right now.
#[derive(Debug, Default)]
pub(crate) struct OwnedPartitions {
    workers: Mutex<HashMap<PartitionId, Worker>>,
}

impl OwnedPartitions {
    fn lock(&self) -> MutexGuard<'_, HashMap<PartitionId, Worker>> {
        // Poison means a panic while the map was held; the map itself is
        // still consistent (every update is a single insert or remove).
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies an input to a partition's core; `false` if it is not owned
    /// here (its owner's loader or repair finds what the input was about).
    pub(crate) fn input(&self, partition: PartitionId, input: Input, now: Timestamp) -> bool {
        let runtime = self
            .lock()
            .get(&partition)
            .map(|worker| worker.runtime.clone());
        match runtime {
            Some(runtime) => {
                runtime.input(input, now);
                true
            }
            None => false,
        }
    }

    /// The runtime of `partition` if this node holds it under `epoch`.
    pub(crate) fn runtime_at(
        &self,
        partition: PartitionId,
        epoch: u64,
    ) -> Option<Arc<PartitionRuntime>> {
        self.lock()
            .get(&partition)
            .filter(|worker| worker.runtime.term.epoch == epoch)
            .map(|worker| worker.runtime.clone())
    }

    /// Applies an input built per partition to every owned core.
    pub(crate) fn broadcast(&self, input: impl Fn() -> Input, now: Timestamp) {
        let runtimes: Vec<_> = self.lock().values().map(|w| w.runtime.clone()).collect();
        for runtime in runtimes {
            runtime.input(input(), now);
        }
    }

    /// The owned partitions' runtimes (metrics, tests).
    pub(crate) fn runtimes(&self) -> Vec<Arc<PartitionRuntime>> {
        self.lock().values().map(|w| w.runtime.clone()).collect()
    }

    pub(crate) fn owned(&self) -> Vec<(PartitionId, u64)> {
        let mut owned: Vec<_> = self
            .lock()
            .iter()
            .map(|(id, worker)| (*id, worker.runtime.term.epoch))
            .collect();
        owned.sort();
        owned
    }

    /// Makes the running workers match `grants`: starts the new ones,
    /// stops the lost ones (and those whose epoch changed, which restart
    /// with a fresh window), and moves the firing windows of the others.
    pub(crate) fn apply(&self, shared: &Arc<Shared>, grants: Vec<Ownership>) {
        let mut workers = self.lock();
        let wanted: HashMap<PartitionId, Ownership> =
            grants.into_iter().map(|g| (g.partition, g)).collect();
        let lost: Vec<PartitionId> = workers
            .iter()
            .filter(|(id, worker)| {
                wanted
                    .get(id)
                    .is_none_or(|g| g.epoch != worker.runtime.term.epoch)
            })
            .map(|(id, _)| *id)
            .collect();
        let mut lost_runtimes = Vec::new();
        for id in &lost {
            if let Some(worker) = workers.remove(id) {
                lost_runtimes.push(worker.runtime.clone());
                belfry_metrics::lease_lost();
                worker.runtime.term.close();
                let _ = worker.stop.send(true);
                tracing::debug!(partition = %id, epoch = worker.runtime.term.epoch, "partition released");
            }
        }
        let mut acquired = Vec::new();
        for (id, grant) in wanted {
            if let Some(worker) = workers.get(&id) {
                worker.runtime.term.update(&grant);
                continue;
            }
            let term = Arc::new(Term::new(&grant));
            let runtime = Arc::new(PartitionRuntime::new(
                id,
                term,
                crate::partition::core_config(shared),
            ));
            let (stop, stop_receiver) = watch::channel(false);
            let task = shared.tasks.spawn_joined(crate::partition::run(
                shared.clone(),
                runtime.clone(),
                stop_receiver,
            ));
            tracing::debug!(partition = %id, epoch = grant.epoch, "partition acquired");
            acquired.push(id);
            workers.insert(
                id,
                Worker {
                    runtime,
                    stop,
                    task,
                },
            );
        }
        // One line per change of the share, not one per partition: a
        // node's start would otherwise log its whole share line by line.
        if !acquired.is_empty() || !lost.is_empty() {
            tracing::info!(
                acquired = %partition_ranges(acquired),
                lost = %partition_ranges(lost),
                "owns {} partitions: {}",
                workers.len(),
                partition_ranges(workers.keys().copied())
            );
        }
        // Outside the lock: the pull queue finishes entries through it.
        drop(workers);
        for runtime in &lost_runtimes {
            crate::pull::partition_lost(shared, runtime);
        }
    }

    /// Stops the workers of `partitions`; returns their tasks to await and
    /// their runtimes, whose outstanding entries finish later.
    pub(crate) fn release(
        &self,
        partitions: &[PartitionId],
    ) -> (Vec<Joined<()>>, Vec<Arc<PartitionRuntime>>) {
        let mut workers = self.lock();
        let mut tasks = Vec::new();
        let mut runtimes = Vec::new();
        for id in partitions {
            if let Some(worker) = workers.remove(id) {
                worker.runtime.term.close();
                let _ = worker.stop.send(true);
                tracing::debug!(partition = %id, epoch = worker.runtime.term.epoch, "partition handed over");
                tasks.push(worker.task);
                runtimes.push(worker.runtime);
            }
        }
        (tasks, runtimes)
    }

    /// Stops every worker and returns their tasks to await.
    pub(crate) fn stop_all(&self) -> Vec<Joined<()>> {
        self.lock()
            .drain()
            .map(|(_, worker)| {
                let _ = worker.stop.send(true);
                worker.task
            })
            .collect()
    }
}

/// The partitions this node fires ([`crate::EngineHandle::partitions`]).
#[derive(Debug, Clone, Copy)]
pub struct Partitions<'a> {
    pub(crate) shared: &'a Arc<Shared>,
}

impl Partitions<'_> {
    /// Makes this node fire exactly the `grants` partitions (see the
    /// module documentation). Partitions gained load their window from
    /// the store; partitions lost stop at once.
    pub fn set(&self, grants: Vec<Ownership>) {
        self.shared.owned.apply(self.shared, grants);
    }

    /// The partitions owned right now, with their epochs.
    pub fn owned(&self) -> Vec<(PartitionId, u64)> {
        self.shared.owned.owned()
    }

    /// The epoch under which this node owns `partition`, if it does.
    pub fn owned_epoch(&self, partition: PartitionId) -> Option<u64> {
        self.owned()
            .into_iter()
            .find_map(|(p, epoch)| (p == partition).then_some(epoch))
    }

    /// How many owned partitions have read their first window page, out of
    /// how many are owned: the readiness check. Cheap (one lock per
    /// partition, no store access).
    pub fn loaded(&self) -> crate::PartitionsLoaded {
        let runtimes = self.shared.owned.runtimes();
        crate::PartitionsLoaded {
            owned: runtimes.len(),
            loaded: runtimes.iter().filter(|r| r.window_loaded()).count(),
        }
    }

    /// Wake-ups may have been missed (the push channel reconnected): every
    /// owned partition drops its window and reloads it from the store.
    pub fn resync(&self) {
        self.shared
            .owned
            .broadcast(|| Input::Reload, self.shared.clock.now());
    }

    /// Wakes every partition worker to re-evaluate now: for a test that
    /// moved a manual clock (workers otherwise re-read the clock at least
    /// once a second).
    pub fn poke(&self) {
        // Only a nudge: the worker ticks its core itself and performs what
        // the tick asks for (a tick here would lose its actions).
        for runtime in self.shared.owned.runtimes() {
            runtime.poke();
        }
    }

    /// Fired entries not finished yet (queued, in delivery, or waiting for
    /// their outcome to be stored), over the owned partitions.
    pub fn outstanding(&self) -> usize {
        self.shared
            .owned
            .runtimes()
            .iter()
            .map(|r| r.outstanding())
            .sum()
    }

    /// Entries held in memory by the owned partitions (windows,
    /// outstanding entries, retry timers), and the most they may hold.
    pub fn held_in_memory(&self) -> (usize, usize) {
        let runtimes = self.shared.owned.runtimes();
        let held = runtimes.iter().map(|r| r.held()).sum();
        let capacity = runtimes.iter().map(|r| r.capacity()).sum();
        (held, capacity)
    }

    /// The fire-path counters of the owned partitions, summed: repairs
    /// (entries a lost wake-up left out, armed by a repair page),
    /// evictions, duplicate claims (for metrics and tests).
    pub fn fire_stats(&self) -> belfry_core::fire::CoreStats {
        let mut total = belfry_core::fire::CoreStats::default();
        for runtime in self.shared.owned.runtimes() {
            let stats = runtime.stats();
            total.repaired += stats.repaired;
            total.evicted += stats.evicted;
            total.fired += stats.fired;
            total.duplicate_claims += stats.duplicate_claims;
            total.load_failures += stats.load_failures;
        }
        total
    }

    /// Hands `partitions` over cleanly: they stop firing at once, when this
    /// is *called* (their workers are taken out of the engine and their
    /// firing windows closed, so nothing queued for them is delivered any
    /// more), and the returned future resolves once every delivery of
    /// theirs that was in flight has its outcome recorded, or after
    /// `grace`. It yields whether everything was recorded in time. The
    /// caller then releases their leases, so the next owner can fire at
    /// once without re-delivering anything. Pull workers' leases of them
    /// are void at once and given back in the store meanwhile (their events
    /// pending again at the leases' expiries, no attempt counted).
    pub fn release(
        &self,
        partitions: &[PartitionId],
        grace: Duration,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let (tasks, runtimes) = self.shared.owned.release(partitions);
        let given_back = crate::pull::give_back(self.shared, runtimes.iter().map(|r| r.id));
        for runtime in &runtimes {
            crate::pull::partition_lost(self.shared, runtime);
        }
        let shared = self.shared.clone();
        async move {
            let give_back = crate::pull::write_given_back(&shared, given_back, grace);
            let recorded = async {
                for task in tasks {
                    task.join().await;
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
