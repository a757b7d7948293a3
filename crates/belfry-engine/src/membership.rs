//! Cluster membership: one loop per node that heartbeats, competes for the
//! leader lease, lets the leader spread partitions over live nodes, and
//! renews this node's partition leases — then tells the engine what it may
//! fire, and until when.
//!
//! Timing (defaults, `lease_ttl` 5 s): every `tick` (1 s) a node renews. It
//! may fire a partition until `lease_ttl - safety_margin` (4 s) after it
//! *sent* its last successful renewal, so it stops before the database can
//! consider its lease expired. When a node dies, the others stop seeing its
//! heartbeat after `lease_ttl`; the leader (or a new one, once the dead
//! leader's lease expired) reassigns its partitions, and the new owners start
//! firing once the dead node's partition leases have expired: failover takes
//! at most about `lease_ttl + 2 × tick`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_core::PartitionId;
use belfry_store::StoreResult;
use belfry_store::cluster::{Coordinator, LeaderLease, NodeInfo, NodeStatus, PartitionAssignment};
use serde::{Deserialize, Serialize};

use crate::{EngineHandle, Ownership};

/// Membership knobs (the `cluster` section of the configuration).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct MembershipOptions {
    /// How long a heartbeat, the leader lease and a partition lease last.
    #[serde(with = "belfry_core::time::serde_millis", rename = "lease_ttl_ms")]
    pub lease_ttl: Duration,
    /// How often a node heartbeats and renews.
    #[serde(with = "belfry_core::time::serde_millis", rename = "tick_ms")]
    pub tick: Duration,
    /// A node stops firing this long before its lease could expire.
    #[serde(with = "belfry_core::time::serde_millis", rename = "safety_margin_ms")]
    pub safety_margin: Duration,
}

impl Default for MembershipOptions {
    fn default() -> Self {
        MembershipOptions {
            lease_ttl: Duration::from_secs(5),
            tick: Duration::from_secs(1),
            safety_margin: Duration::from_secs(1),
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
    pub taken_at: Option<Instant>,
}

/// The membership loop of one node.
#[derive(Debug)]
pub struct Membership {
    node: NodeInfo,
    options: MembershipOptions,
    coordinator: Arc<dyn Coordinator>,
    engine: EngineHandle,
    snapshot: Mutex<ClusterSnapshot>,
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
        })
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

    /// Runs [`Self::run_once`] every tick until `stop` resolves; then leaves
    /// the cluster cleanly.
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(self.options.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => {
                    if let Err(error) = self.run_once().await {
                        // Not renewing means this node's firing windows run
                        // out on their own: it stops firing in time.
                        tracing::warn!(%error, "cluster membership round failed");
                    }
                }
            }
        }
        self.engine.set_ownership(Vec::new());
        let _ = self.coordinator.release_leadership(&self.node.id).await;
        let _ = self.coordinator.leave(&self.node.id).await;
    }

    /// One round: heartbeat, leadership, (leader) assignment, renewal.
    ///
    /// # Errors
    /// Any coordinator failure; the round is abandoned and retried next tick.
    pub async fn run_once(&self) -> StoreResult<()> {
        let ttl = self.options.lease_ttl;
        let nodes = self.coordinator.heartbeat(&self.node, ttl).await?;
        let lease = self
            .coordinator
            .claim_leadership(&self.node.id, ttl)
            .await?;
        let mut assignments = self.coordinator.assignments().await?;
        if lease.holder == self.node.id {
            let changed = self.rebalance(&nodes, &assignments);
            if !changed.is_empty() {
                tracing::info!(
                    moved = changed.len(),
                    term = lease.term,
                    "leader reassigns partitions"
                );
                self.coordinator
                    .assign(&self.node.id, lease.term, changed)
                    .await?;
                assignments = self.coordinator.assignments().await?;
            }
        }
        let renewal_sent = Instant::now();
        let owned = self.coordinator.renew_ownership(&self.node.id, ttl).await?;
        let answered = Instant::now();
        let fire_until = renewal_sent + ttl.saturating_sub(self.options.safety_margin);
        let grants = owned
            .into_iter()
            .map(|o| Ownership {
                partition: o.partition,
                epoch: o.epoch,
                fire_from: answered + o.takeover_after,
                fire_until,
            })
            .collect();
        self.engine.set_ownership(grants);
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = ClusterSnapshot {
            nodes,
            leader: Some(lease),
            assignments,
            taken_at: Some(answered),
        };
        Ok(())
    }

    /// The partitions whose owner must change for an even spread.
    fn rebalance(
        &self,
        nodes: &[NodeStatus],
        assignments: &[PartitionAssignment],
    ) -> Vec<(PartitionId, belfry_store::cluster::NodeId)> {
        let live: Vec<&str> = nodes.iter().map(|n| n.info.id.0.as_str()).collect();
        let current: BTreeMap<PartitionId, &str> = assignments
            .iter()
            .filter_map(|a| Some((a.partition, a.owner.as_ref()?.0.as_str())))
            .collect();
        let partitions = self.engine.store().partitions().get();
        belfry_core::assignment::balance(partitions, &live, &current)
            .into_iter()
            .filter(|(p, owner)| current.get(p) != Some(owner))
            .map(|(p, owner)| (p, belfry_store::cluster::NodeId(owner.to_string())))
            .collect()
    }
}
