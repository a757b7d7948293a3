//! The partitions sub-handle ([`crate::EngineHandle::partitions`]):
//! ownership changes from the membership loop (or a single node's start)
//! applied to the owned partitions, then to the pull queue, whose leases of
//! lost partitions are void.

use std::sync::Arc;
use std::time::Duration;

use belfry_core::fire::Input;
use belfry_core::{EventKey, EventVersion, PartitionId};

use crate::Shared;
use crate::ownership::Ownership;

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
        let lost = self.shared.owned.apply(&self.shared.env, grants);
        // Outside the owned partitions' lock: the pull queue finishes
        // entries of them.
        for (partition, epoch) in lost {
            crate::pull::partition_lost(self.shared, partition, epoch);
        }
    }

    /// Whether the delivery of `version` of `key` (a version a cancel or
    /// a move just replaced, committed) has started on this node: a push
    /// delivery claimed it, or a pull worker holds it. `None` when this
    /// node does not own the event's partition (its owner knows).
    pub fn delivery_started(&self, key: &EventKey, version: &EventVersion) -> Option<bool> {
        let partition = self.shared.env.store.partitions().partition_of(key);
        let runtime = self.shared.owned.runtime(partition)?;
        let now = self.shared.env.clock.now();
        let claimed = runtime.claimed_after_change(key, version, now);
        // A pull tenant's entry is the queue's to tell: ready there, no
        // worker has it (and none will); a lease the change cancelled has
        // finished its claim already.
        let handed_out = self.shared.pull.lock().is_handed_out(key, version);
        Some(handed_out.unwrap_or(claimed))
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
            .broadcast(|| Input::Reload, self.shared.env.clock.now());
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
            crate::pull::partition_lost(self.shared, runtime.id, runtime.term.epoch);
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
                        let notified = shared.owned.finished.notified();
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
