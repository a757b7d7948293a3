//! Cluster mode: a node of the cluster a PostgreSQL database defines.
//!
//! The node joins with a fresh id, runs the membership loop (heartbeat,
//! leader lease, partition assignment, lease renewal, hand-overs; see
//! `belfry_engine::membership`), and pumps the database's wake-ups into it:
//! timer wake-ups (events created or moved through other nodes) go to the
//! engine, cluster changes (a partition revoked or released, a node joined
//! or left) make the membership loop run a round at once, pull
//! announcements (another node's unclaimed ready entries) go to the
//! engine's pull claims. When `stop`
//! resolves, the loop hands every partition over and leaves (the returned
//! task ends then).

use std::sync::Arc;

use belfry_api::{
    ClusterMember, ClusterStatus, ClusterView, LeaderStatus, NodeView, PartitionOwner,
    PartitionView, PeerAuth, Role,
};
use belfry_core::event::Effect;
use belfry_core::{Clock, PartitionCount, PartitionId};
use belfry_engine::membership::{ClusterSnapshot, Membership};
use belfry_engine::{Engine, EngineHandle};
use belfry_sinks::Sinks;
use belfry_store::SharedStore;
use belfry_store::cluster::{Coordinator, NodeId, NodeInfo, PartitionAssignment};
use tokio::task::JoinHandle;

use crate::config::Config;

pub async fn start(
    config: &Config,
    url: &str,
    partitions: PartitionCount,
    sinks: Sinks,
    address: &str,
    clock: Arc<dyn Clock>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(Engine, Arc<dyn ClusterView>, JoinHandle<()>)> {
    use belfry_postgres::{PostgresOptions, PostgresStore, Wakeup, WakeupKind};

    let store = PostgresStore::connect(PostgresOptions {
        url: url.to_string(),
        partitions,
        pool_size: config.database_pool_size,
        notify_horizon: config.engine.window,
        clock_skew_margin: config.clock_skew_margin,
        clock: clock.clone(),
    })
    .await
    .map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL: {e}"))?;
    let store = Arc::new(store);
    let mut wakeups = store.subscribe_wakeups();
    let shared: SharedStore = store.clone();
    let coordinator: Arc<dyn Coordinator> = store;
    let engine = Engine::start_unowned(config.engine_options(), shared, sinks, clock);

    let node = NodeInfo {
        id: NodeId(uuid::Uuid::now_v7().to_string()),
        address: address.to_string(),
    };
    // The first node to join stores the secret every node signs its
    // calls to the others with.
    let candidate = belfry_api::peer::generate_secret()
        .map_err(|_| anyhow::anyhow!("cannot generate the cluster secret: no OS randomness"))?;
    let secret = coordinator
        .cluster_secret(&candidate)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read the cluster secret from PostgreSQL: {e}"))?;
    let peers = PeerAuth::new(node.id.0.clone(), &secret);
    tracing::info!(node = %node.id, %address, "joining the cluster");
    engine
        .handle()
        .pull()
        .join_cluster(node.id.clone(), coordinator.clone());
    let membership = Membership::new(node, config.cluster.clone(), coordinator, engine.handle());

    let handle: EngineHandle = engine.handle();
    let poked = membership.clone();
    tokio::spawn(async move {
        while let Some(wakeup) = wakeups.recv().await {
            match wakeup {
                Wakeup::Timer {
                    partition,
                    key,
                    due,
                    kind,
                } => {
                    let effect = match kind {
                        WakeupKind::Arm => Effect::Arm { at: due },
                        WakeupKind::Disarm => Effect::Disarm { at: due },
                    };
                    handle.wake(partition, key, effect);
                }
                Wakeup::Resync => {
                    handle.partitions().resync();
                    // Cluster changes may have been missed too.
                    poked.poke();
                }
                Wakeup::Cluster => poked.poke(),
                Wakeup::PullReady { node, tenants } => {
                    handle.pull().ready_elsewhere(&node, &tenants);
                }
                Wakeup::TenantChanged(tenant) => {
                    let handle = handle.clone();
                    // Reads the store: off the wake-up loop.
                    tokio::spawn(async move { handle.tenants().changed_elsewhere(&tenant).await });
                }
            }
        }
    });
    let task = tokio::spawn(membership.clone().run(stop));
    let view = MembershipView {
        membership,
        scheme: if config.tls.cert_file.is_some() {
            "https"
        } else {
            "http"
        },
        peers,
    };
    Ok((engine, Arc::new(view), task))
}

/// `/events/cluster` from the membership loop's last snapshot: every live
/// node by its advertised address, the leader as `Master`; partition
/// owners for forwarding pull workers' calls.
#[derive(Debug)]
pub struct MembershipView {
    pub membership: Arc<Membership>,
    /// How nodes reach each other: the scheme of this node's own listener
    /// (every node of a cluster is expected to serve alike).
    pub scheme: &'static str,
    /// Signs this node's forwards and checks the ones it receives.
    pub peers: PeerAuth,
}

impl ClusterView for MembershipView {
    fn owner_of(&self, partition: PartitionId) -> Option<PartitionOwner> {
        let snapshot = self.membership.snapshot();
        let assignment = snapshot
            .assignments
            .iter()
            .find(|a| a.partition == partition)?;
        let owner = assignment.owner.as_ref()?;
        let node = snapshot.nodes.iter().find(|n| &n.info.id == owner)?;
        Some(PartitionOwner {
            node: owner.0.clone(),
            url: format!("{}://{}", self.scheme, node.info.address),
            epoch: assignment.epoch,
        })
    }

    fn url_of(&self, node: &str) -> Option<String> {
        let snapshot = self.membership.snapshot();
        let found = snapshot.nodes.iter().find(|n| n.info.id.0 == node)?;
        Some(format!("{}://{}", self.scheme, found.info.address))
    }

    fn members(&self) -> Vec<ClusterMember> {
        let snapshot = self.membership.snapshot();
        let leader = snapshot.leader.as_ref().map(|l| &l.holder);
        let mut members: Vec<ClusterMember> = snapshot
            .nodes
            .iter()
            .map(|n| ClusterMember {
                address: n.info.address.clone(),
                role: if Some(&n.info.id) == leader {
                    Role::Master
                } else {
                    Role::Slave
                },
            })
            .collect();
        if members.is_empty() {
            // Before the first round: at least show this node.
            members.push(ClusterMember {
                address: self.membership.node().address.clone(),
                role: Role::Slave,
            });
        }
        members
    }

    fn status(&self) -> Option<ClusterStatus> {
        Some(cluster_status(&self.membership.snapshot()))
    }

    fn peers(&self) -> Option<&PeerAuth> {
        Some(&self.peers)
    }
}

/// `GET /v1/cluster` from one membership snapshot.
fn cluster_status(snapshot: &ClusterSnapshot) -> ClusterStatus {
    let leader = snapshot.leader.as_ref();
    let partition_view = |a: &PartitionAssignment| PartitionView {
        partition: a.partition.0,
        epoch: a.epoch,
        moving_to: a.pending_owner.as_ref().map(|node| node.0.clone()),
    };
    let nodes = snapshot
        .nodes
        .iter()
        .map(|n| NodeView {
            id: n.info.id.0.clone(),
            address: n.info.address.clone(),
            role: if leader.is_some_and(|l| l.holder == n.info.id) {
                Role::Master
            } else {
                Role::Slave
            },
            heartbeat_age_ms: Some(u64::try_from(n.heartbeat_age.as_millis()).unwrap_or(u64::MAX)),
            partitions: snapshot
                .assignments
                .iter()
                .filter(|a| a.owner.as_ref() == Some(&n.info.id))
                .map(partition_view)
                .collect(),
        })
        .collect();
    let unowned = snapshot
        .assignments
        .iter()
        .filter(|a| {
            a.owner
                .as_ref()
                .is_none_or(|owner| !snapshot.nodes.iter().any(|n| &n.info.id == owner))
        })
        .map(partition_view)
        .collect();
    ClusterStatus {
        mode: "cluster",
        leader: leader.map(|l| LeaderStatus {
            node: l.holder.0.clone(),
            address: snapshot
                .nodes
                .iter()
                .find(|n| n.info.id == l.holder)
                .map(|n| n.info.address.clone()),
            term: l.term,
        }),
        nodes,
        unowned,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use belfry_store::cluster::{LeaderLease, NodeStatus};

    use super::*;

    fn node(id: &str) -> NodeStatus {
        NodeStatus {
            info: NodeInfo {
                id: NodeId(id.into()),
                address: format!("{id}:8080"),
            },
            heartbeat_age: Duration::from_millis(5),
        }
    }

    fn assignment(
        partition: u16,
        owner: Option<&str>,
        epoch: u64,
        pending: Option<&str>,
    ) -> PartitionAssignment {
        PartitionAssignment {
            partition: PartitionId(partition),
            owner: owner.map(|o| NodeId(o.into())),
            epoch,
            pending_owner: pending.map(|p| NodeId(p.into())),
        }
    }

    #[test]
    fn the_cluster_view_shows_hand_overs_in_progress_and_unowned_partitions() {
        let snapshot = ClusterSnapshot {
            nodes: vec![node("a"), node("b")],
            leader: Some(LeaderLease {
                holder: NodeId("a".into()),
                term: 3,
            }),
            assignments: vec![
                assignment(0, Some("a"), 4, Some("b")),
                assignment(1, Some("b"), 2, None),
                assignment(2, None, 7, Some("b")),
                assignment(3, Some("gone"), 1, None),
            ],
            taken_at: None,
        };
        let status = serde_json::to_value(cluster_status(&snapshot)).unwrap();
        assert_eq!(
            status["nodes"][0]["partitions"],
            serde_json::json!([{"partition": 0, "epoch": 4, "moving_to": "b"}])
        );
        assert_eq!(
            status["nodes"][1]["partitions"],
            serde_json::json!([{"partition": 1, "epoch": 2}])
        );
        assert_eq!(
            status["unowned"],
            serde_json::json!([
                {"partition": 2, "epoch": 7, "moving_to": "b"},
                {"partition": 3, "epoch": 1}
            ])
        );
        assert_eq!(status["leader"]["node"], "a");
        assert_eq!(status["nodes"][0]["role"], "Master");
    }
}
