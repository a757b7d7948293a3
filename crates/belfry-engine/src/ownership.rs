//! Which partitions this node fires, under which epoch, and until when.
//!
//! A single node owns every partition forever (epoch 0). In a cluster the
//! membership loop calls [`crate::EngineHandle::set_ownership`] after each
//! lease renewal: partitions gained get a worker, partitions lost have theirs
//! stopped, and every owned partition's firing window moves forward.
//!
//! Firing is allowed only inside `[fire_from, fire_until)` on this process's
//! monotonic clock: `fire_from` waits out the previous owner's lease,
//! `fire_until` ends a safety margin before this node's own lease can expire.
//! The dispatcher checks it right before each delivery, so a node that was
//! paused (SIGSTOP, a long GC-like stall) past its lease delivers nothing for
//! the partitions it lost.
#![allow(clippy::disallowed_methods)] // clock reads move to the injected Clock

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use belfry_core::fire::Input;
use belfry_core::ownership::FiringWindow;
use belfry_core::{MonoTime, PartitionId, Timestamp, partition_ranges};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Shared;
use crate::partition::PartitionRuntime;

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

/// The firing window of one owned partition; shared by its worker and the
/// delivery tasks it spawns.
#[derive(Debug)]
pub(crate) struct PartitionLease {
    pub(crate) epoch: u64,
    base: Instant,
    /// Offsets from `base` in microseconds.
    fire_from: AtomicU64,
    fire_until: AtomicU64,
}

impl PartitionLease {
    fn new(grant: &Ownership) -> Self {
        let base = Instant::now();
        let lease = PartitionLease {
            epoch: grant.epoch,
            base,
            fire_from: AtomicU64::new(0),
            fire_until: AtomicU64::new(0),
        };
        lease.update(grant);
        lease
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
    /// entries already handed to the dispatcher (queued for a slot, or not
    /// yet claimed) must not be delivered under this lease any more.
    fn revoke(&self) {
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
struct Slot {
    runtime: Arc<PartitionRuntime>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The partitions this node owns right now.
#[derive(Debug, Default)]
pub(crate) struct OwnedPartitions {
    slots: Mutex<HashMap<PartitionId, Slot>>,
}

impl OwnedPartitions {
    fn lock(&self) -> MutexGuard<'_, HashMap<PartitionId, Slot>> {
        // Poison means a panic while the map was held; the map itself is
        // still consistent (every update is a single insert or remove).
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies an input to a partition's core; `false` if it is not owned
    /// here (its owner's loader or repair finds what the input was about).
    pub(crate) fn input(&self, partition: PartitionId, input: Input, now: Timestamp) -> bool {
        let runtime = self.lock().get(&partition).map(|slot| slot.runtime.clone());
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
            .filter(|slot| slot.runtime.lease.epoch == epoch)
            .map(|slot| slot.runtime.clone())
    }

    /// Applies an input built per partition to every owned core.
    pub(crate) fn broadcast(&self, input: impl Fn() -> Input, now: Timestamp) {
        let runtimes: Vec<_> = self.lock().values().map(|s| s.runtime.clone()).collect();
        for runtime in runtimes {
            runtime.input(input(), now);
        }
    }

    /// The owned partitions' runtimes (metrics, tests).
    pub(crate) fn runtimes(&self) -> Vec<Arc<PartitionRuntime>> {
        self.lock().values().map(|s| s.runtime.clone()).collect()
    }

    pub(crate) fn owned(&self) -> Vec<(PartitionId, u64)> {
        let mut owned: Vec<_> = self
            .lock()
            .iter()
            .map(|(id, slot)| (*id, slot.runtime.lease.epoch))
            .collect();
        owned.sort();
        owned
    }

    /// Makes the running workers match `grants`: starts the new ones,
    /// stops the lost ones (and those whose epoch changed, which restart
    /// with a fresh window), and moves the firing windows of the others.
    pub(crate) fn apply(&self, shared: &Arc<Shared>, grants: Vec<Ownership>) {
        let mut slots = self.lock();
        let wanted: HashMap<PartitionId, Ownership> =
            grants.into_iter().map(|g| (g.partition, g)).collect();
        let lost: Vec<PartitionId> = slots
            .iter()
            .filter(|(id, slot)| {
                wanted
                    .get(id)
                    .is_none_or(|g| g.epoch != slot.runtime.lease.epoch)
            })
            .map(|(id, _)| *id)
            .collect();
        let mut lost_runtimes = Vec::new();
        for id in &lost {
            if let Some(slot) = slots.remove(id) {
                lost_runtimes.push(slot.runtime.clone());
                belfry_metrics::lease_lost();
                slot.runtime.lease.revoke();
                let _ = slot.stop.send(true);
                tracing::debug!(partition = %id, epoch = slot.runtime.lease.epoch, "partition released");
            }
        }
        let mut acquired = Vec::new();
        for (id, grant) in wanted {
            if let Some(slot) = slots.get(&id) {
                slot.runtime.lease.update(&grant);
                continue;
            }
            let lease = Arc::new(PartitionLease::new(&grant));
            let runtime = Arc::new(PartitionRuntime::new(
                id,
                lease,
                crate::partition::core_config(shared),
            ));
            let (stop, stop_receiver) = watch::channel(false);
            let task = tokio::spawn(crate::partition::run(
                shared.clone(),
                runtime.clone(),
                stop_receiver,
            ));
            tracing::debug!(partition = %id, epoch = grant.epoch, "partition acquired");
            acquired.push(id);
            slots.insert(
                id,
                Slot {
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
                slots.len(),
                partition_ranges(slots.keys().copied())
            );
        }
        // Outside the lock: the pull queue finishes entries through it.
        drop(slots);
        for runtime in &lost_runtimes {
            crate::pull::partition_lost(shared, runtime);
        }
    }

    /// Stops the workers of `partitions`; returns their tasks to await and
    /// their runtimes, whose outstanding entries finish later.
    pub(crate) fn release(
        &self,
        partitions: &[PartitionId],
    ) -> (Vec<JoinHandle<()>>, Vec<Arc<PartitionRuntime>>) {
        let mut slots = self.lock();
        let mut tasks = Vec::new();
        let mut runtimes = Vec::new();
        for id in partitions {
            if let Some(slot) = slots.remove(id) {
                slot.runtime.lease.revoke();
                let _ = slot.stop.send(true);
                tracing::debug!(partition = %id, epoch = slot.runtime.lease.epoch, "partition handed over");
                tasks.push(slot.task);
                runtimes.push(slot.runtime);
            }
        }
        (tasks, runtimes)
    }

    /// Stops every worker and returns their tasks to await.
    pub(crate) fn stop_all(&self) -> Vec<JoinHandle<()>> {
        self.lock()
            .drain()
            .map(|(_, slot)| {
                let _ = slot.stop.send(true);
                slot.task
            })
            .collect()
    }
}
