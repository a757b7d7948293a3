//! Cluster membership: one loop per node that heartbeats, competes for the
//! leader lease, lets the leader spread partitions over live nodes, and
//! renews this node's partition leases — then tells the engine what it may
//! fire, and until when.
//!
//! Timing (defaults, `lease_ttl` 5 s): every `tick` (1 s) a node renews. It
//! may fire a partition until `lease_ttl - safety_margin` (4 s) after it
//! *sent* its last successful renewal, so it stops before the database can
//! consider its lease expired.
//!
//! # Crashes: the presence session (seconds → under one)
//! A node holds a *presence session* for its whole life: a database
//! connection of its own holding a lock named after the node
//! ([`Coordinator::presence`]). When the process dies (kill -9, OOM, an
//! abort) the operating system closes its sockets and the database ends the
//! session, and with it the lock, within milliseconds. Every node looks at
//! all presence locks every `presence_interval` (100 ms) and feeds the looks
//! to a [`CrashWatch`]: a node counts as crashed once its lock was seen
//! held, then stayed gone in every look for `presence_grace` (300 ms), and
//! its heartbeat is at least that old too (see [`belfry_core::liveness`]).
//! The leader then ends it ([`Coordinator::evict`], which re-checks the lock
//! in its own transaction): its partitions become unowned with their epochs
//! bumped, so any write it might still make is fenced. A round follows at
//! once and the leader grants them to the live nodes, which fire at once.
//! When the crashed node is the leader, the others end it the same way,
//! which also frees its lease; they claim it at once and the new leader
//! grants the partitions. Measured: the moved partitions fire again about
//! 0.4–1.3 s after a kill -9 on a busy 2-core machine, instead of 5–6 s
//! (`docs/BENCHMARKS.md`).
//!
//! What does *not* end the presence session: a slow or frozen process
//! (SIGSTOP, a long pause), or a network cut between node and database
//! (the database keeps the session until TCP keepalives give up). Those
//! nodes keep their lock and are handled by the heartbeat as before: when
//! their heartbeat is older than `lease_ttl`, the leader (or a new one, once
//! the dead leader's lease expired) declares them dead (a warning naming
//! them: removed from the nodes, so each is reported once) and reassigns
//! their partitions once their leases have expired, at most about
//! `lease_ttl + 2 × tick` after they went silent. A live node whose presence
//! session alone broke (a proxy reset, a restarted database) opens it again
//! at its next look, well within `presence_grace`; and a look that fails
//! (the watcher's own session broke) restarts every absence, so after a
//! database restart every node has a full grace to take its lock again.
//!
//! # Fencing, and the duplicate window of a crash
//! The fence is the partition epoch: ending a node bumps the epoch of each
//! of its partitions, and the store rejects every write made under an older
//! one (outcomes, leases, read-ahead claims). A delivery is an outside call,
//! though, and no epoch stops it, so these events may be delivered twice:
//! - deliveries in flight at the crash (sent, outcome not yet recorded):
//!   the new owner delivers them again;
//! - if a node is ended while it is in fact alive (its presence session
//!   broke and it could not take it again nor heartbeat within
//!   `presence_grace`, i.e. it cannot reach the database), whatever it
//!   delivers from then until it stops firing: at its next successful
//!   renewal (which no longer lists the partitions) or, if it cannot renew,
//!   at the end of its firing window (`lease_ttl - safety_margin` after its
//!   last renewal was sent), whichever comes first. Its outcome writes are
//!   rejected, so the new owner delivers those events again too.
//!
//! Nothing is lost: an event whose outcome was not recorded under the
//! current epoch stays due and its new owner fires it.
//!
//! # Hand-overs between live nodes
//! Moves are revoke-then-grant (see [`belfry_store::cluster`]): when the
//! leader moves a partition away from this node, the next renewal reports
//! it revoked. The node stops firing it at once
//! ([`crate::partitions::Partitions::release`]), waits (at most
//! `lease_ttl - tick - safety_margin`) until every delivery of it that was in
//! flight has its outcome recorded, then releases it in the database, which
//! grants it to the new owner with a new epoch and no takeover wait. A clean
//! shutdown ([`Membership::run`] once `stop` resolves) does the same for
//! every partition, then leaves. Nothing is delivered twice unless an
//! outcome could not be recorded within the wait.
//!
//! Rounds run every tick and also whenever the coordinator announces a
//! change ([`Membership::poke`]), so a hand-over takes a few database round
//! trips rather than ticks.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use belfry_core::config::{ConfigKeys, Problems};
use belfry_core::liveness::{CrashWatch, Sighting};
use belfry_core::ownership::FiringWindow;
use belfry_core::{MonoTime, PartitionId, partition_ranges};
use belfry_store::StoreResult;
use belfry_store::cluster::{
    Coordinator, LeaderLease, NodeId, NodeInfo, NodePresence, NodeStatus, PartitionAssignment,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::{EngineHandle, Ownership};

/// Membership knobs (the `cluster` section of the configuration). Each
/// field's doc comment is the user reference.
#[derive(Debug, Clone, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipOptions {
    /// How long a heartbeat, the leader lease and a partition lease last;
    /// more than `safety_margin_ms` plus `tick_ms`.
    #[serde(with = "belfry_core::time::serde_millis", rename = "lease_ttl_ms")]
    pub lease_ttl: Duration,
    /// How often a node heartbeats and renews.
    #[serde(with = "belfry_core::time::serde_millis", rename = "tick_ms")]
    pub tick: Duration,
    /// A node stops firing this long before its lease could expire.
    #[serde(with = "belfry_core::time::serde_millis", rename = "safety_margin_ms")]
    pub safety_margin: Duration,
    /// How often a node looks at every node's presence lock (the database
    /// session a node holds for its lifetime; see `docs/operations.md`,
    /// "Crashed nodes").
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "presence_interval_ms"
    )]
    pub presence_interval: Duration,
    /// A node whose presence lock stays gone and whose heartbeat stays
    /// silent this long counts as crashed: its partitions move at once
    /// instead of after `lease_ttl_ms`. `0`: at the next look.
    #[serde(with = "belfry_core::time::serde_millis", rename = "presence_grace_ms")]
    pub presence_grace: Duration,
}

impl MembershipOptions {
    /// Refuses zero periods and a lease too short for its renewals, naming
    /// their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("lease_ttl_ms", self.lease_ttl);
        problems.at_least_one("tick_ms", self.tick);
        problems.at_least_one("presence_interval_ms", self.presence_interval);
        if !self.tick.is_zero()
            && !self.lease_ttl.is_zero()
            && self.lease_ttl <= self.safety_margin + self.tick
        {
            problems.push(format!(
                "{} ({}) must exceed {} ({}) + {} ({})",
                problems.key("lease_ttl_ms"),
                self.lease_ttl.as_millis(),
                problems.key("safety_margin_ms"),
                self.safety_margin.as_millis(),
                problems.key("tick_ms"),
                self.tick.as_millis()
            ));
        }
    }
}

impl Default for MembershipOptions {
    fn default() -> Self {
        MembershipOptions {
            lease_ttl: Duration::from_secs(5),
            tick: Duration::from_secs(1),
            safety_margin: Duration::from_secs(1),
            presence_interval: Duration::from_millis(100),
            presence_grace: Duration::from_millis(300),
        }
    }
}

/// What this node last saw of the cluster (for `/events/cluster` and
/// `/v1/cluster`).
#[derive(Debug, Clone, Default)]
pub struct ClusterSnapshot {
    pub nodes: Vec<NodeStatus>,
    pub leader: Option<LeaderLease>,
    pub assignments: Vec<PartitionAssignment>,
    /// When this snapshot was taken; `None` before the first success.
    pub taken_at: Option<MonoTime>,
}

/// The membership loop of one node.
#[derive(Debug)]
pub struct Membership {
    node: NodeInfo,
    options: MembershipOptions,
    coordinator: Arc<dyn Coordinator>,
    engine: EngineHandle,
    snapshot: Mutex<ClusterSnapshot>,
    /// Run a round now (the coordinator announced a change).
    poke: Notify,
    /// Revoked partitions being handed over: never granted to the engine
    /// again until their release is done.
    hand_overs: Mutex<HandOvers>,
}

#[derive(Debug, Default)]
struct HandOvers {
    partitions: HashSet<PartitionId>,
    /// Dropped with the membership, which aborts them.
    tasks: JoinSet<()>,
}

impl Membership {
    pub fn new(
        node: NodeInfo,
        options: MembershipOptions,
        coordinator: Arc<dyn Coordinator>,
        engine: EngineHandle,
    ) -> Arc<Self> {
        Arc::new(Membership {
            node,
            options,
            coordinator,
            engine,
            snapshot: Mutex::new(ClusterSnapshot::default()),
            poke: Notify::new(),
            hand_overs: Mutex::default(),
        })
    }

    /// Asks for a round now instead of at the next tick (a cluster change
    /// was announced). Pokes during a round coalesce into one more round.
    pub fn poke(&self) {
        self.poke.notify_one();
    }

    fn hand_overs(&self) -> MutexGuard<'_, HandOvers> {
        // Poison means a panic while held; the set stays usable.
        self.hand_overs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a revoked partition may wait for its in-flight outcomes:
    /// its lease, no longer extended, has at least `lease_ttl - tick` left
    /// when the revocation is seen.
    fn revocation_grace(&self) -> Duration {
        self.options
            .lease_ttl
            .saturating_sub(self.options.tick + self.options.safety_margin)
    }

    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    pub fn snapshot(&self) -> ClusterSnapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs [`Self::run_once`] every tick (and when poked) until `stop`
    /// resolves; then hands every partition over and leaves the cluster
    /// (see [`Self::hand_over_and_leave`]).
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        // The lock first, so others see it from this node's first heartbeat.
        if let Err(error) = self.coordinator.presence(&self.node.id).await {
            tracing::warn!(%error, "taking this node's presence lock failed; retrying");
        }
        // Owned here: dropping `run` stops the watcher too.
        let mut watcher = JoinSet::new();
        watcher.spawn(self.clone().watch_presence());
        let mut tick = crate::tasks::ticks(self.options.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = tick.tick() => {}
                _ = self.poke.notified() => tick.reset(),
            }
            if let Err(error) = self.run_once().await {
                // Not renewing means this node's firing windows run
                // out on their own: it stops firing in time.
                tracing::warn!(%error, "cluster membership round failed");
            }
        }
        watcher.abort_all();
        self.hand_over_and_leave().await;
    }

    /// Looks at every node's presence lock each `presence_interval`, keeping
    /// this node's own, and ends the nodes that crashed
    /// ([`belfry_core::liveness`] decides which): the leader ends any, the
    /// others only the leader (whose lease they could otherwise take only
    /// once it expired). A round follows at once, in which the (new) leader
    /// grants the crashed node's partitions to the live nodes.
    async fn watch_presence(self: Arc<Self>) {
        let mut watch = CrashWatch::new(self.options.presence_grace);
        let mut every = crate::tasks::ticks(self.options.presence_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            every.tick().await;
            let nodes = match self.coordinator.presence(&self.node.id).await {
                Ok(nodes) => nodes,
                Err(error) => {
                    if !failing {
                        tracing::warn!(
                            %error,
                            "looking at the nodes' presence failed; crashes are found by the heartbeat TTL meanwhile"
                        );
                    }
                    failing = true;
                    watch.lost_sight();
                    continue;
                }
            };
            failing = false;
            let sightings: Vec<Sighting<'_>> = nodes
                .iter()
                .filter(|n| n.info.id != self.node.id)
                .map(|n| Sighting {
                    node: &n.info.id.0,
                    present: n.present,
                    heartbeat_age: n.heartbeat_age,
                })
                .collect();
            let crashed = watch.observe(self.engine.clock().monotonic(), &sightings);
            if crashed.is_empty() {
                continue;
            }
            let leader = self.snapshot().leader.map(|l| l.holder);
            let mut ended = false;
            for node in nodes.iter().filter(|n| crashed.contains(&n.info.id.0)) {
                let id = &node.info.id;
                let ours = leader
                    .as_ref()
                    .is_none_or(|l| *l == self.node.id || l == id);
                if ours {
                    ended |= self.end_crashed(node).await;
                }
            }
            if ended {
                self.poke();
            }
        }
    }

    /// Ends a crashed node in the store; whether anything changed.
    async fn end_crashed(&self, node: &NodePresence) -> bool {
        let eviction = match self.coordinator.evict(&node.info.id).await {
            Ok(Some(eviction)) => eviction,
            // Its lock is held again: alive after all.
            Ok(None) => return false,
            Err(error) => {
                tracing::warn!(%error, node = %node.info.id, "ending a crashed node failed");
                return false;
            }
        };
        if !eviction.registered && !eviction.was_leader && eviction.partitions.is_empty() {
            // Another node ended it first.
            return false;
        }
        tracing::warn!(
            node = %node.info.id,
            address = %node.info.address,
            silent_ms = node.heartbeat_age.as_millis() as u64,
            partitions = %partition_ranges(eviction.partitions.iter().copied()),
            leader = eviction.was_leader,
            "node declared dead: its database session ended; its partitions move to the live nodes"
        );
        true
    }

    /// One round: heartbeat, leadership, (leader) assignment, renewal, and
    /// the hand-over of partitions the leader revoked.
    ///
    /// # Errors
    /// Any coordinator failure; the round is abandoned and retried next tick.
    pub async fn run_once(self: &Arc<Self>) -> StoreResult<()> {
        let ttl = self.options.lease_ttl;
        let nodes = self.coordinator.heartbeat(&self.node, ttl).await?;
        let lease = self
            .coordinator
            .claim_leadership(&self.node.id, ttl)
            .await?;
        let mut assignments = self.coordinator.assignments().await?;
        if lease.holder == self.node.id {
            self.declare_dead_nodes(lease.term, &assignments).await;
            let (changed, new) = self.rebalance(&nodes, &assignments);
            if !changed.is_empty() {
                if new > 0 {
                    tracing::info!(
                        moved = new,
                        term = lease.term,
                        "leader reassigns partitions"
                    );
                }
                self.coordinator
                    .assign(&self.node.id, lease.term, changed)
                    .await?;
                assignments = self.coordinator.assignments().await?;
            }
        }
        let clock = self.engine.clock().clone();
        let renewal_sent = clock.monotonic();
        let owned = self.coordinator.renew_ownership(&self.node.id, ttl).await?;
        let answered = clock.monotonic();
        let revoked: Vec<(PartitionId, u64)> = owned
            .iter()
            .filter(|o| o.revoked)
            .map(|o| (o.partition, o.epoch))
            .collect();
        self.start_hand_over(revoked).await;
        let grants = {
            let hand_overs = self.hand_overs();
            owned
                .into_iter()
                .filter(|o| !o.revoked && !hand_overs.partitions.contains(&o.partition))
                .map(|o| Ownership {
                    partition: o.partition,
                    epoch: o.epoch,
                    window: FiringWindow::after_renewal(
                        renewal_sent,
                        answered,
                        ttl,
                        self.options.safety_margin,
                        o.takeover_after,
                    ),
                })
                .collect()
        };
        self.engine.partitions().set(grants);
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = ClusterSnapshot {
            nodes,
            leader: Some(lease),
            assignments,
            taken_at: Some(answered),
        };
        Ok(())
    }

    /// The leader removes the nodes whose heartbeat stopped and says so:
    /// their partitions move to the live nodes from this round on. A
    /// failure is only logged; the next round asks again.
    async fn declare_dead_nodes(&self, term: u64, assignments: &[PartitionAssignment]) {
        let dead = match self
            .coordinator
            .remove_dead_nodes(self.options.lease_ttl)
            .await
        {
            Ok(dead) => dead,
            Err(error) => {
                tracing::warn!(%error, "looking for dead nodes failed");
                return;
            }
        };
        for node in dead {
            let owned = assignments
                .iter()
                .filter(|a| a.owner.as_ref() == Some(&node.info.id))
                .map(|a| a.partition);
            tracing::warn!(
                node = %node.info.id,
                address = %node.info.address,
                silent_ms = node.heartbeat_age.as_millis() as u64,
                partitions = %partition_ranges(owned),
                term,
                "node declared dead: no heartbeat within the lease TTL; its partitions move to the live nodes"
            );
        }
    }

    /// Stops firing the newly revoked partitions now (the engine lets go of
    /// them before this returns), then waits for their in-flight outcomes
    /// and releases them on a task of its own, so renewals of the other
    /// partitions go on meanwhile.
    async fn start_hand_over(self: &Arc<Self>, revoked: Vec<(PartitionId, u64)>) {
        let fresh: Vec<(PartitionId, u64)> = {
            let mut hand_overs = self.hand_overs();
            revoked
                .into_iter()
                .filter(|(p, _)| hand_overs.partitions.insert(*p))
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let ids: Vec<PartitionId> = fresh.iter().map(|(p, _)| *p).collect();
        tracing::info!(
            partitions = %partition_ranges(ids.iter().copied()),
            "partitions revoked by the leader; handing them over"
        );
        let grace = self.revocation_grace();
        // Takes the partitions' workers out of the engine now, before the
        // round's `set_ownership` could stop them without waiting for their
        // deliveries; the returned future waits for their outcomes.
        let release = self.engine.partitions().release(&ids, grace);
        let this = self.clone();
        let mut hand_overs = self.hand_overs();
        while hand_overs.tasks.try_join_next().is_some() {}
        hand_overs.tasks.spawn(async move {
            let recorded = release.await;
            if !recorded {
                tracing::warn!(
                    partitions = %partition_ranges(ids.iter().copied()),
                    grace_ms = grace.as_millis() as u64,
                    "outcomes of revoked partitions not recorded in time; the new owner may deliver those events again"
                );
            }
            match this
                .coordinator
                .release_partitions(&this.node.id, &fresh)
                .await
            {
                Ok(released) => {
                    tracing::info!(
                        partitions = %partition_ranges(released),
                        "partitions handed over"
                    );
                }
                // Retried next round while still revoked; otherwise the
                // lease runs out and the leader grants them anyway.
                Err(error) => tracing::warn!(%error, "releasing revoked partitions failed"),
            }
            let mut hand_overs = this.hand_overs();
            for id in &ids {
                hand_overs.partitions.remove(id);
            }
        });
    }

    /// A clean exit: give up the leader lease, stop firing every partition,
    /// wait (up to the engine's `shutdown_grace`, renewing meanwhile) until
    /// the outcomes of their deliveries in flight are recorded, leave, and
    /// release the partitions in the database, so their next owners fire at
    /// once instead of after the leases expired.
    pub async fn hand_over_and_leave(&self) {
        let id = &self.node.id;
        if let Err(error) = self.coordinator.release_leadership(id).await {
            tracing::warn!(%error, "releasing the leader lease failed");
        }
        let mut tasks = std::mem::take(&mut self.hand_overs().tasks);
        while tasks.join_next().await.is_some() {}
        let mut partitions: BTreeSet<PartitionId> = self
            .engine
            .partitions()
            .owned()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        partitions.extend(self.owned_in_snapshot());
        let partitions: Vec<PartitionId> = partitions.into_iter().collect();
        let grace = self.engine.options().shutdown_grace;
        tracing::info!(
            partitions = partitions.len(),
            "handing over every partition"
        );
        let release = self.engine.partitions().release(&partitions, grace);
        tokio::pin!(release);
        let mut tick = crate::tasks::ticks(self.options.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset();
        // Keep the heartbeat and the leases alive while deliveries finish:
        // nobody takes over (and re-delivers) before their outcomes are in.
        let recorded = loop {
            tokio::select! {
                recorded = &mut release => break recorded,
                _ = tick.tick() => {
                    let ttl = self.options.lease_ttl;
                    let _ = self.coordinator.heartbeat(&self.node, ttl).await;
                    let _ = self.coordinator.renew_ownership(id, ttl).await;
                }
            }
        };
        if !recorded {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "deliveries still in flight at the end of the shutdown grace; the next owners may deliver them again"
            );
        }
        self.engine.partitions().set(Vec::new());
        // What the database says this node owns now, at which epochs.
        let owned: Vec<(PartitionId, u64)> = match self.coordinator.assignments().await {
            Ok(map) => map
                .into_iter()
                .filter(|a| a.owner.as_ref() == Some(id))
                .map(|a| (a.partition, a.epoch))
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "reading the partition map failed; the leases will expire instead");
                Vec::new()
            }
        };
        // Leave first: a leader acting in between revokes (it cannot grant
        // back to this node), and the release below hands those over.
        if let Err(error) = self.coordinator.leave(id).await {
            tracing::warn!(%error, "leaving the cluster failed");
        }
        match self.coordinator.release_partitions(id, &owned).await {
            Ok(released) => tracing::info!(released = released.len(), "partitions released"),
            Err(error) => {
                tracing::warn!(%error, "releasing the partitions failed; the leases will expire instead");
            }
        }
    }

    fn owned_in_snapshot(&self) -> Vec<PartitionId> {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .assignments
            .iter()
            .filter(|a| a.owner.as_ref() == Some(&self.node.id))
            .map(|a| a.partition)
            .collect()
    }

    /// The moves to (re-)issue for an even spread, and how many of them are
    /// new. Moves already pending are repeated: the owner's lease may have
    /// run out meanwhile, and then `assign` grants them. A pending move the
    /// spread no longer wants is cancelled by naming the current owner.
    fn rebalance(
        &self,
        nodes: &[NodeStatus],
        assignments: &[PartitionAssignment],
    ) -> (Vec<(PartitionId, NodeId)>, usize) {
        let live: Vec<&str> = nodes.iter().map(|n| n.info.id.0.as_str()).collect();
        let current: BTreeMap<PartitionId, &str> = assignments
            .iter()
            .filter_map(|a| Some((a.partition, a.owner.as_ref()?.0.as_str())))
            .collect();
        let pending: BTreeMap<PartitionId, &str> = assignments
            .iter()
            .filter_map(|a| Some((a.partition, a.pending_owner.as_ref()?.0.as_str())))
            .collect();
        let partitions = self.engine.store().partitions().get();
        let mut new = 0;
        let moves = belfry_core::assignment::balance(partitions, &live, &current)
            .into_iter()
            .filter(|(p, owner)| {
                let moving = current.get(p) != Some(owner);
                if moving && pending.get(p) != Some(owner) {
                    new += 1;
                }
                moving || pending.contains_key(p)
            })
            .map(|(p, owner)| (p, NodeId(owner.to_string())))
            .collect();
        (moves, new)
    }
}
