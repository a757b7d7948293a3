//! What `GET /events/cluster` and `GET /v1/cluster` report: the nodes and
//! which one leads; the handler of the second.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ApiState;

/// A node's role, in BigBen's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Role {
    Master,
    Slave,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Master => "Master",
            Role::Slave => "Slave",
        }
    }
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    /// How other nodes and clients reach it, e.g. `10.0.0.5:8080`.
    pub address: String,
    pub role: Role,
}

/// The owner of a partition as this node last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOwner {
    pub node: String,
    /// Where to reach it: `http://` or `https://` and its advertised
    /// address.
    pub url: String,
    pub epoch: u64,
}

/// The API's view of the cluster. Exactly one member should be the Master.
pub trait ClusterView: Send + Sync + std::fmt::Debug + 'static {
    fn members(&self) -> Vec<ClusterMember>;

    /// The live node owning `partition` (`None` on a single node, or when
    /// no live node owns it right now).
    fn owner_of(&self, partition: belfry_core::PartitionId) -> Option<PartitionOwner> {
        let _ = partition;
        None
    }

    /// Where to reach live node `node` (`http://…` or `https://…`).
    fn url_of(&self, node: &str) -> Option<String> {
        let _ = node;
        None
    }

    /// This node's credentials for the calls between the nodes of its
    /// cluster; `None` on a single node, which forwards nothing and
    /// refuses every forwarded request.
    fn peers(&self) -> Option<&crate::PeerAuth> {
        None
    }

    /// The detailed view of `GET /v1/cluster`; `None` for a single node,
    /// whose view the API builds from its own engine.
    fn status(&self) -> Option<ClusterStatus> {
        None
    }
}

/// `GET /v1/cluster`: nodes, leader and term, partitions per node with
/// epochs, heartbeat ages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ClusterStatus {
    /// `"single"` (embedded store) or `"cluster"` (PostgreSQL).
    pub mode: &'static str,
    pub leader: Option<LeaderStatus>,
    pub nodes: Vec<NodeView>,
    /// Partitions no live node owns right now (between a release and the
    /// next grant, or after an owner died), ordered; left out when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    pub unowned: Vec<PartitionView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct LeaderStatus {
    pub node: String,
    pub address: Option<String>,
    pub term: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    pub address: String,
    pub role: Role,
    /// Time since its last heartbeat (by the database's clock).
    pub heartbeat_age_ms: Option<u64>,
    /// Partitions it owns, ordered.
    pub partitions: Vec<PartitionView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PartitionView {
    pub partition: u16,
    pub epoch: u64,
    /// The node the leader is handing it to: the owner has been asked to
    /// release it (a planned hand-over in progress).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub moving_to: Option<String>,
}

/// A node running alone: it is its own Master.
#[derive(Debug, Clone)]
pub struct SingleNode {
    pub address: String,
}

impl ClusterView for SingleNode {
    fn members(&self) -> Vec<ClusterMember> {
        vec![ClusterMember {
            address: self.address.clone(),
            role: Role::Master,
        }]
    }
}

/// `GET /v1/cluster`.
#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "cluster",
    operation_id = "cluster_status",
    summary = "What this node last saw of the cluster (admin)",
    responses(
        (status = 200, description = "Leader, nodes and their partitions", body = ClusterStatus),
        crate::openapi::schema::V1GateErrors
    )
)]
pub(crate) async fn status(
    axum::extract::State(state): axum::extract::State<ApiState>,
) -> axum::Json<ClusterStatus> {
    let status = state.cluster.status().unwrap_or_else(|| {
        let me = state.cluster.members().into_iter().next();
        let address = me.map(|m| m.address).unwrap_or_default();
        ClusterStatus {
            mode: "single",
            leader: Some(LeaderStatus {
                node: address.clone(),
                address: Some(address.clone()),
                term: 0,
            }),
            nodes: vec![NodeView {
                id: address.clone(),
                address,
                role: Role::Master,
                heartbeat_age_ms: None,
                partitions: state
                    .engine
                    .partitions()
                    .owned()
                    .into_iter()
                    .map(|(p, epoch)| PartitionView {
                        partition: p.0,
                        epoch,
                        moving_to: None,
                    })
                    .collect(),
            }],
            unowned: Vec::new(),
        }
    });
    axum::Json(status)
}
