//! Cluster coordination: membership, the leader lease, and partition
//! ownership with fencing epochs. Only shared backends (PostgreSQL)
//! implement it; the embedded store is a cluster of one and needs none.
//!
//! # Contract
//! - **Time is the database's.** Every lease, heartbeat age and expiry is
//!   computed with the backend's clock, so nodes' clocks never have to agree.
//! - **Leader lease with a term.** [`Coordinator::claim_leadership`] acquires
//!   the lease when it is free or expired (incrementing the term) or renews
//!   it for its holder (same term). Only the holder of the current term may
//!   [`Coordinator::assign`]; a stale term is rejected.
//! - **One owner per partition, fenced by epochs.** Every change of a
//!   partition's owner increments its epoch. Writes made on behalf of a
//!   partition carry [`crate::Fence`]`{partition, epoch}` and the store
//!   rejects a stale epoch ([`crate::StoreError::Fenced`]).
//! - **Ownership leases and safe hand-over.** An owner renews its partition
//!   leases with [`Coordinator::renew_ownership`]; it must stop firing a
//!   safety margin before `lease_ttl` has passed since it *sent* its last
//!   successful renewal. When a partition is reassigned, the new owner gets
//!   `takeover_after`: how long until the previous owner's lease has expired
//!   for certain. It must not fire before then, so a paused or cut-off old
//!   owner and the new one never fire the same partition at the same time.

use std::time::Duration;

use async_trait::async_trait;
use belfry_core::PartitionId;

use crate::StoreResult;

/// A node's identity in the cluster: unique per process start.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub String);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a node says about itself in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: NodeId,
    /// The node's advertised HTTP address (`HOST:PORT`).
    pub address: String,
}

/// A node as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub info: NodeInfo,
    /// Time since its last heartbeat, by the database's clock.
    pub heartbeat_age: Duration,
}

/// The leader lease as it stands after a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderLease {
    pub holder: NodeId,
    pub term: u64,
}

/// A partition this node owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedPartition {
    pub partition: PartitionId,
    pub epoch: u64,
    /// Wait this long before firing: the previous owner's lease may still
    /// run until then. Zero once it has expired.
    pub takeover_after: Duration,
}

/// One row of the partition map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAssignment {
    pub partition: PartitionId,
    pub owner: Option<NodeId>,
    pub epoch: u64,
}

#[async_trait]
pub trait Coordinator: Send + Sync + std::fmt::Debug + 'static {
    /// Records this node's heartbeat and returns every node whose last
    /// heartbeat is younger than `ttl` (this one included), ordered by id.
    async fn heartbeat(&self, node: &NodeInfo, ttl: Duration) -> StoreResult<Vec<NodeStatus>>;

    /// Removes a node that is shutting down cleanly.
    async fn leave(&self, node: &NodeId) -> StoreResult<()>;

    /// Acquires or renews the leader lease for `node` (see the module
    /// contract); returns the lease as it stands, whoever holds it.
    async fn claim_leadership(&self, node: &NodeId, ttl: Duration) -> StoreResult<LeaderLease>;

    /// Gives up the lease if `node` holds it (clean shutdown).
    async fn release_leadership(&self, node: &NodeId) -> StoreResult<()>;

    /// Sets the owner of each listed partition. Partitions whose owner
    /// changes get a new epoch and a takeover time at the end of the old
    /// owner's lease.
    ///
    /// # Errors
    /// [`crate::StoreError::Fenced`]-like rejection (as `Unavailable`) when
    /// `term` is no longer the current leader term.
    async fn assign(
        &self,
        leader: &NodeId,
        term: u64,
        owners: Vec<(PartitionId, NodeId)>,
    ) -> StoreResult<()>;

    /// Extends the leases of every partition `node` owns by `ttl` and returns
    /// them.
    async fn renew_ownership(
        &self,
        node: &NodeId,
        ttl: Duration,
    ) -> StoreResult<Vec<OwnedPartition>>;

    /// The whole partition map, ordered by partition.
    async fn assignments(&self) -> StoreResult<Vec<PartitionAssignment>>;

    /// The current leader lease, if any holder's lease is unexpired.
    async fn leader(&self) -> StoreResult<Option<LeaderLease>>;
}
