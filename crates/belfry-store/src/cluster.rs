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
//! - **Ownership leases.** An owner renews its partition leases with
//!   [`Coordinator::renew_ownership`]; it must stop firing a safety margin
//!   before `lease_ttl` has passed since it *sent* its last successful
//!   renewal.
//! - **Hand-over: revoke, then grant.** The leader moves a partition whose
//!   owner holds a live lease by *revoking* it ([`Coordinator::assign`] marks
//!   the new owner as pending; the epoch does not change). The owner sees
//!   [`OwnedPartition::revoked`] at its next renewal, which no longer extends
//!   that lease; it stops firing the partition, records the outcomes of its
//!   deliveries in flight, then confirms with
//!   [`Coordinator::release_partitions`], which grants the partition to the
//!   pending owner (a higher epoch, takeover now). A partition that is unowned, or
//!   whose owner's lease has expired (a crashed or stuck owner), is granted
//!   directly by `assign`. So a new owner never waits for a live lease, and
//!   a revoked owner that never confirms holds the partition at most until
//!   its lease runs out.
//! - **Epochs never repeat.** A grant's epoch is higher than any the
//!   partition had: `epoch + 1`, or more where the backend must skip
//!   numbers that a node may still hold (PostgreSQL, on a standby promoted
//!   without the old primary's last writes, jumps past every epoch of the
//!   old timeline), so a stale owner's fenced writes never match a new
//!   grant.
//! - **Clean shutdown.** A node that stops releases its partitions the same
//!   way: unowned (or granted to a pending owner) with no lease, so the
//!   leader reassigns them at once and the next owner fires at once.
//! - **Presence sessions (crash detection).** A backend that can
//!   ([`Coordinator::presence`]) keeps, for each node, a session of its own
//!   that holds a lock named after the node for as long as the process
//!   lives, and tells every node which of these locks are held. A process
//!   that dies loses the session at once, long before its heartbeat and
//!   leases run out. [`Coordinator::evict`] then ends a node whose lock is
//!   (still) gone: its partitions become unowned with their epochs bumped
//!   (so anything it might still write is fenced), moves to it are
//!   cancelled, and its leader lease, if it held one, is freed. When a node
//!   counts as crashed is `belfry_core::liveness`'s decision; a backend
//!   without presence sessions reports none, and crashed nodes are then
//!   found by the heartbeat TTL alone.
//! - **Change notifications.** Backends may tell nodes that the map or the
//!   membership changed (PostgreSQL: `NOTIFY` on
//!   [`CHANGE_CHANNEL`]), so nodes react without waiting for their next tick.
//!   They are only hints: every node still runs its round each tick.
//! - **Pull announcements.** [`Coordinator::announce_pull_ready`] carries
//!   the same kind of hint for pull workers' claims (see `docs/pull.md`).

use std::time::Duration;

use async_trait::async_trait;
use belfry_core::{PartitionId, TenantName};

use crate::StoreResult;

/// The notification channel on which backends announce cluster changes
/// (a partition revoked, released or granted; a node joined or left; the
/// leader lease released).
pub const CHANGE_CHANNEL: &str = "belfry_cluster";

/// The notification channel on which nodes announce pull tenants' ready
/// entries that no claim on them took (`docs/pull.md`, "In a cluster").
pub const PULL_READY_CHANNEL: &str = "belfry_pull_ready";

/// The notification channel on which backends announce a tenant's
/// config, pause or deletion changed (payload: the tenant's name), so
/// other nodes drop what they cached of it and apply a pause or resume at
/// once rather than when their cache expires.
pub const TENANT_CHANNEL: &str = "belfry_tenants";

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

/// A registered node as one look at the presence locks showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePresence {
    pub info: NodeInfo,
    /// Its presence session holds its lock.
    pub present: bool,
    /// Time since its last heartbeat, by the database's clock.
    pub heartbeat_age: Duration,
}

/// What [`Coordinator::evict`] ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Eviction {
    /// It was still registered (a heartbeat within the TTL or not).
    pub registered: bool,
    /// The partitions it owned: unowned now, each epoch bumped.
    pub partitions: Vec<PartitionId>,
    /// It held the leader lease, which is free now.
    pub was_leader: bool,
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
    /// The leader moves it to another node: stop firing it, record the
    /// outcomes in flight, then [`Coordinator::release_partitions`] it. Its
    /// lease was not extended by this renewal.
    pub revoked: bool,
}

/// One row of the partition map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAssignment {
    pub partition: PartitionId,
    pub owner: Option<NodeId>,
    pub epoch: u64,
    /// Where the leader is moving it: the owner has been asked to release it.
    pub pending_owner: Option<NodeId>,
}

#[async_trait]
pub trait Coordinator: Send + Sync + std::fmt::Debug + 'static {
    /// Records this node's heartbeat and returns every node whose last
    /// heartbeat is younger than `ttl` (this one included), ordered by id.
    async fn heartbeat(&self, node: &NodeInfo, ttl: Duration) -> StoreResult<Vec<NodeStatus>>;

    /// Removes a node that is shutting down cleanly.
    async fn leave(&self, node: &NodeId) -> StoreResult<()>;

    /// Removes every node whose last heartbeat is at least `ttl` old and
    /// returns them (with the age of that heartbeat): the leader declares
    /// them dead. Each is returned once, whoever asks; a node that
    /// heartbeats again later joins anew. Nodes that left cleanly are gone
    /// already, so they are never reported.
    async fn remove_dead_nodes(&self, ttl: Duration) -> StoreResult<Vec<NodeStatus>>;

    /// Acquires or renews the leader lease for `node` (see the module
    /// contract); returns the lease as it stands, whoever holds it.
    async fn claim_leadership(&self, node: &NodeId, ttl: Duration) -> StoreResult<LeaderLease>;

    /// Gives up the lease if `node` holds it (clean shutdown).
    async fn release_leadership(&self, node: &NodeId) -> StoreResult<()>;

    /// Moves each listed partition to the given node. A partition that is
    /// unowned, or whose owner's lease has expired, changes owner at once
    /// (a higher epoch, takeover now). One whose owner holds a live lease is
    /// revoked instead: the node becomes its pending owner, and it changes
    /// hands when the owner releases it (or, once its lease expired, at the
    /// next `assign`). Naming the current owner cancels a pending move.
    /// Idempotent: the leader repeats its moves every round.
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

    /// Extends by `ttl` the leases of every partition `node` owns, except
    /// revoked ones, and returns them all (revoked ones flagged).
    async fn renew_ownership(
        &self,
        node: &NodeId,
        ttl: Duration,
    ) -> StoreResult<Vec<OwnedPartition>>;

    /// Gives up partitions `node` owns at the given epochs, after it stopped
    /// firing them and recorded their deliveries' outcomes: each goes to its
    /// pending owner (a higher epoch) or becomes unowned, with no lease left, so
    /// the next owner fires at once. Entries whose owner or epoch changed
    /// meanwhile are left alone (fencing). Returns the partitions released.
    async fn release_partitions(
        &self,
        node: &NodeId,
        partitions: &[(PartitionId, u64)],
    ) -> StoreResult<Vec<PartitionId>>;

    /// The whole partition map, ordered by partition.
    async fn assignments(&self) -> StoreResult<Vec<PartitionAssignment>>;

    /// The current leader lease, if any holder's lease is unexpired.
    async fn leader(&self) -> StoreResult<Option<LeaderLease>>;

    /// Keeps `node`'s presence session (opening it and taking its lock if
    /// it is not open, e.g. after the connection broke) and returns every
    /// registered node, ordered by id, with whether its presence lock is
    /// held. A backend without presence sessions returns an empty list.
    ///
    /// # Errors
    /// The look failed; the session is opened again by the next call.
    async fn presence(&self, node: &NodeId) -> StoreResult<Vec<NodePresence>> {
        let _ = node;
        Ok(Vec::new())
    }

    /// Ends `node` if its presence lock is not held at this moment (checked
    /// in the same transaction): removes it from the nodes, makes its
    /// partitions unowned with a new epoch and no lease, cancels moves to
    /// it, and frees the leader lease if it holds it. Announces the change.
    /// A node whose lock is held is left alone (returns `None`); ending a
    /// node twice is harmless. A backend without presence sessions ends
    /// nothing.
    async fn evict(&self, node: &NodeId) -> StoreResult<Option<Eviction>> {
        let _ = node;
        Ok(None)
    }

    /// Tells the other nodes that `node` holds ready entries of these pull
    /// tenants that no claim on it took (PostgreSQL: `NOTIFY` on
    /// [`PULL_READY_CHANNEL`]). A hint, repeated while it holds; a backend
    /// without notifications does nothing.
    async fn announce_pull_ready(&self, node: &NodeId, tenants: &[TenantName]) -> StoreResult<()> {
        let _ = (node, tenants);
        Ok(())
    }

    /// The secret the nodes of the cluster sign their calls to each other
    /// with: the stored one, or `candidate` when none is stored yet (the
    /// first node to ask stores it; nodes asking at once all get the one
    /// stored). A backend without a cluster returns `candidate`.
    ///
    /// # Errors
    /// The store could not be read or written; the node cannot join.
    async fn cluster_secret(&self, candidate: &[u8]) -> StoreResult<Vec<u8>> {
        Ok(candidate.to_vec())
    }
}
