//! What `GET /events/cluster` reports: the nodes and which one leads.

use serde::{Deserialize, Serialize};

/// A node's role, in BigBen's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// The API's view of the cluster. Exactly one member should be the Master.
pub trait ClusterView: Send + Sync + std::fmt::Debug + 'static {
    fn members(&self) -> Vec<ClusterMember>;
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
