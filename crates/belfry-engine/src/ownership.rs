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
use std::sync::{Arc, Mutex, MutexGuard};

use belfry_core::fire::Input;
use belfry_core::ownership::FiringWindow;
use belfry_core::{MonoTime, PartitionId, Timestamp, partition_ranges};
use tokio::sync::{Notify, watch};

use crate::Env;
use crate::partition::{Deliver, PartitionRuntime, Term};
use crate::tasks::Joined;

/// One owned partition, as the membership loop grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    pub partition: PartitionId,
    pub epoch: u64,
    /// When this node may fire it, on the engine clock's monotonic time:
    /// not before the previous owner's lease may run out, not after this
    /// node's may have.
    pub window: FiringWindow,
}

impl Ownership {
    /// Owned for as long as the process runs (a single node).
    pub fn forever(partition: PartitionId) -> Self {
        Ownership {
            partition,
            epoch: 0,
            window: FiringWindow::forever(MonoTime::ZERO),
        }
    }
}

/// A running partition worker.
#[derive(Debug)]
struct Worker {
    runtime: Arc<PartitionRuntime>,
    stop: watch::Sender<bool>,
    task: Joined<()>,
}

/// The partitions this node owns right now.
#[derive(Debug)]
pub(crate) struct OwnedPartitions {
    workers: Mutex<HashMap<PartitionId, Worker>>,
    /// Where every partition hands what it fires.
    deliver: Arc<dyn Deliver>,
    /// Signalled whenever a fired entry is finished (its outcome stored,
    /// or dropped): hand-overs and shutdown wait on it.
    pub(crate) finished: Arc<Notify>,
}

impl OwnedPartitions {
    pub(crate) fn new(deliver: Arc<dyn Deliver>) -> Self {
        OwnedPartitions {
            workers: Mutex::default(),
            deliver,
            finished: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PartitionId, Worker>> {
        // Poison means a panic while the map was held; the map itself is
        // still consistent (every update is a single insert or remove).
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The runtime of `partition`, if it is owned here.
    pub(crate) fn runtime(&self, partition: PartitionId) -> Option<Arc<PartitionRuntime>> {
        self.lock()
            .get(&partition)
            .map(|worker| worker.runtime.clone())
    }

    /// Applies an input to a partition's core; `false` if it is not owned
    /// here (its owner's loader or repair finds what the input was about).
    pub(crate) fn input(&self, partition: PartitionId, input: Input, now: Timestamp) -> bool {
        match self.runtime(partition) {
            Some(runtime) => {
                runtime.input(input, now);
                true
            }
            None => false,
        }
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
    /// Returns the partitions lost, with the epochs they were held under:
    /// the composition root tells the pull queue.
    pub(crate) fn apply(&self, env: &Arc<Env>, grants: Vec<Ownership>) -> Vec<(PartitionId, u64)> {
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
        let mut lost_terms = Vec::new();
        for id in &lost {
            if let Some(worker) = workers.remove(id) {
                lost_terms.push((*id, worker.runtime.term.epoch));
                belfry_metrics::lease_lost();
                worker.runtime.term.close();
                let _ = worker.stop.send(true);
                tracing::debug!(partition = %id, epoch = worker.runtime.term.epoch, "partition released");
            }
        }
        let mut acquired = Vec::new();
        for (id, grant) in wanted {
            if let Some(worker) = workers.get(&id) {
                worker.runtime.term.update(grant.window);
                continue;
            }
            let term = Arc::new(Term::new(grant.epoch, grant.window, env.clock.clone()));
            let runtime = Arc::new(PartitionRuntime::new(
                id,
                term,
                crate::partition::core_config(env),
                self.finished.clone(),
                env.clock.clone(),
            ));
            let (stop, stop_receiver) = watch::channel(false);
            let task = env.tasks.spawn_joined(crate::partition::run(
                env.clone(),
                runtime.clone(),
                self.deliver.clone(),
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
        lost_terms
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
