//! The [`Coordinator`](belfry_store::cluster::Coordinator) contract on
//! PostgreSQL. Every lease, expiry and age is computed with the database's
//! `clock_timestamp()`, so nodes' clocks never have to agree.
//!
//! - The leader lease is the single row of `leader`; claims lock it
//!   (`FOR UPDATE`), so two claimants are serialized and at most one wins a
//!   term. `assign` share-locks it for its whole transaction, so no new term
//!   can begin while an old leader's assignment is being written.
//! - Moves are revoke-then-grant. `assign` grants at once (`epoch + 1`, or
//!   past every epoch of the last timeline on a newly promoted primary:
//!   `NEXT_EPOCH`; no
//!   takeover wait) only a partition that is unowned or whose owner's lease
//!   has expired; otherwise it sets `pending_owner`. `renew_ownership` does
//!   not extend a lease with a pending owner and reports it revoked; the
//!   owner's `release_partitions` (matching owner and epoch) then hands it to
//!   the pending owner (`epoch + 1`) or leaves it unowned, lease cleared. A
//!   revoked owner that never releases loses the partition once its lease
//!   expired: the leader repeats its move every round, and then it is a
//!   direct grant. Row locks serialize a release against a concurrent
//!   `assign` or renewal of the same partition.
//! - Changes are announced with `pg_notify` on
//!   [`CHANGE_CHANNEL`](belfry_store::cluster::CHANGE_CHANNEL) inside the
//!   changing transaction (so they arrive only once committed): every node
//!   runs a membership round at once instead of at its next tick.
//! - Presence: each node's presence session ([`presence`]) holds a
//!   session-level advisory lock, shared, keyed `(PRESENCE_LOCK_CLASS,
//!   hashtext(node id))`, for as long as the session lives; whether it is
//!   held is read from `pg_locks`. Shared, so two ids that hash alike both
//!   take it (each then looks present while the other lives: a crash is
//!   found by the heartbeat TTL instead, never the reverse). [`evict`]
//!   re-checks the lock in its own transaction, after locking the leader
//!   row (the order `assign` locks in).
//! - Pull tenants' unclaimed ready entries are announced with `pg_notify`
//!   on [`PULL_READY_CHANNEL`](belfry_store::cluster::PULL_READY_CHANNEL),
//!   outside any transaction (a hint, `docs/pull.md`).

use std::time::Duration;

use belfry_core::PartitionId;
use belfry_store::StoreResult;
use belfry_store::cluster::{
    CHANGE_CHANNEL, Eviction, LeaderLease, NodeId, NodeInfo, NodePresence, NodeStatus,
    OwnedPartition, PULL_READY_CHANNEL, PartitionAssignment,
};

use deadpool_postgres::Transaction;
use tokio_postgres::Row;

use crate::PostgresStore;
use crate::cached;
use crate::error::{StoreError, corrupt, db_error};
use crate::rows::partition_from_i32;

/// A duration as a float of milliseconds, for `$n * interval '1 ms'`.
fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

/// A non-negative count of milliseconds read back from SQL.
fn duration_from_millis(value: i64) -> Duration {
    Duration::from_millis(u64::try_from(value).unwrap_or(0))
}

fn term_from_i64(value: i64) -> StoreResult<u64> {
    u64::try_from(value).map_err(|_| corrupt(format_args!("term {value}")))
}

fn epoch_from_i64(value: i64) -> StoreResult<u64> {
    u64::try_from(value).map_err(|_| corrupt(format_args!("epoch {value}")))
}

/// The epoch of a grant of partition row `p`: one more than its last, and
/// at least `(timeline - 1) << 32`, the server's WAL timeline read from the
/// name of its current WAL file. Every promotion of a standby starts a new,
/// higher timeline, so the first grant on a new primary jumps past every
/// epoch the old one gave. A standby promoted without the old primary's
/// last writes (asynchronous replication) therefore never gives again an
/// epoch that a node may still hold from that lost tail: the fence stays a
/// fence. On the first timeline the floor is 0 and epochs count 1, 2, 3.
const NEXT_EPOCH: &str = "GREATEST(p.epoch + 1,
     (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 - 1) << 32)";

/// Announces a cluster change (`$1`: what changed); inside a transaction
/// it is sent at commit.
const ANNOUNCE: &str = "SELECT pg_notify($1, $2)";

/// Commits `tx`, announcing `change` in it first if anything `changed`.
async fn commit_announcing(tx: Transaction<'_>, changed: bool, change: &str) -> StoreResult<()> {
    if changed {
        tx.execute(ANNOUNCE, &[&CHANGE_CHANNEL, &change])
            .await
            .map_err(db_error)?;
    }
    tx.commit().await.map_err(db_error)
}

/// A `nodes` row read as `id, address, heartbeat age in ms`.
fn node_status(row: &Row) -> NodeStatus {
    NodeStatus {
        info: NodeInfo {
            id: NodeId(row.get(0)),
            address: row.get(1),
        },
        heartbeat_age: duration_from_millis(row.get(2)),
    }
}

/// The leader row's holder, term and whether its lease is live, read with
/// the row lock `lock` (`FOR UPDATE` or `FOR SHARE`).
async fn locked_leader(
    tx: &Transaction<'_>,
    lock: &str,
) -> StoreResult<(Option<String>, i64, bool)> {
    let row = tx
        .query_one(
            &format!(
                "SELECT holder, term, coalesce(expires_at > clock_timestamp(), false)
                 FROM leader {lock}"
            ),
            &[],
        )
        .await
        .map_err(db_error)?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

pub(crate) async fn heartbeat(
    store: &PostgresStore,
    node: &NodeInfo,
    ttl: Duration,
) -> StoreResult<Vec<NodeStatus>> {
    let client = store.coordination_client().await?;
    let upsert = client
        .prepare_cached(
            "INSERT INTO nodes (id, address, heartbeat_at) VALUES ($1, $2, clock_timestamp())
             ON CONFLICT (id) DO UPDATE
             SET address = EXCLUDED.address, heartbeat_at = EXCLUDED.heartbeat_at
             RETURNING xmax = 0",
        )
        .await
        .map_err(db_error)?;
    let live = client
        .prepare_cached(
            "SELECT id, address,
                    floor(extract(epoch FROM clock_timestamp() - heartbeat_at) * 1000)::bigint
             FROM nodes
             WHERE heartbeat_at > clock_timestamp() - $1::float8 * interval '1 millisecond'
             ORDER BY id",
        )
        .await
        .map_err(db_error)?;
    // Autocommit, in this order on one connection: the node sees itself.
    let joined: bool = client
        .query_one(&upsert, &[&node.id.0, &node.address])
        .await
        .map_err(db_error)?
        .get(0);
    if joined {
        // A new node: the leader gives it its share without waiting a tick.
        client
            .execute(ANNOUNCE, &[&CHANGE_CHANNEL, &"join"])
            .await
            .map_err(db_error)?;
    }
    let rows = client
        .query(&live, &[&millis(ttl)])
        .await
        .map_err(db_error)?;
    Ok(rows.iter().map(node_status).collect())
}

pub(crate) async fn leave(store: &PostgresStore, node: &NodeId) -> StoreResult<()> {
    let mut client = store.coordination_client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    let left = tx
        .execute("DELETE FROM nodes WHERE id = $1", &[&node.0])
        .await
        .map_err(db_error)?;
    commit_announcing(tx, left > 0, "leave").await
}

pub(crate) async fn remove_dead_nodes(
    store: &PostgresStore,
    ttl: Duration,
) -> StoreResult<Vec<NodeStatus>> {
    let client = store.coordination_client().await?;
    // One statement: concurrent callers each get a disjoint share.
    let rows = client
        .query(
            "DELETE FROM nodes
             WHERE heartbeat_at <= clock_timestamp() - $1::float8 * interval '1 millisecond'
             RETURNING id, address,
                       floor(extract(epoch FROM clock_timestamp() - heartbeat_at) * 1000)::bigint",
            &[&millis(ttl)],
        )
        .await
        .map_err(db_error)?;
    let mut dead: Vec<NodeStatus> = rows.iter().map(node_status).collect();
    dead.sort_by(|a, b| a.info.id.cmp(&b.info.id));
    Ok(dead)
}

pub(crate) async fn claim_leadership(
    store: &PostgresStore,
    node: &NodeId,
    ttl: Duration,
) -> StoreResult<LeaderLease> {
    let mut client = store.coordination_client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    let (holder, term, live) = locked_leader(&tx, "FOR UPDATE").await?;
    let lease = match holder {
        // Someone else holds an unexpired lease: report it.
        Some(other) if live && other != node.0 => LeaderLease {
            holder: NodeId(other),
            term: term_from_i64(term)?,
        },
        // Our own live lease: renew it, same term.
        Some(_) if live => {
            tx.execute(
                "UPDATE leader
                 SET expires_at = clock_timestamp() + $1::float8 * interval '1 millisecond'",
                &[&millis(ttl)],
            )
            .await
            .map_err(db_error)?;
            LeaderLease {
                holder: node.clone(),
                term: term_from_i64(term)?,
            }
        }
        // Free or expired (ours included: whoever held it must have
        // stopped acting): a new term.
        _ => {
            let term: i64 = tx
                .query_one(
                    "UPDATE leader
                     SET holder = $1, term = term + 1,
                         expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
                     RETURNING term",
                    &[&node.0, &millis(ttl)],
                )
                .await
                .map_err(db_error)?
                .get(0);
            LeaderLease {
                holder: node.clone(),
                term: term_from_i64(term)?,
            }
        }
    };
    tx.commit().await.map_err(db_error)?;
    Ok(lease)
}

pub(crate) async fn release_leadership(store: &PostgresStore, node: &NodeId) -> StoreResult<()> {
    let mut client = store.coordination_client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    let released = tx
        .execute(
            "UPDATE leader SET holder = NULL, expires_at = NULL WHERE holder = $1",
            &[&node.0],
        )
        .await
        .map_err(db_error)?;
    // Someone else claims it now rather than at its next tick.
    commit_announcing(tx, released > 0, "leader").await
}

pub(crate) async fn assign(
    store: &PostgresStore,
    leader: &NodeId,
    term: u64,
    owners: Vec<(PartitionId, NodeId)>,
) -> StoreResult<()> {
    let mut client = store.coordination_client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    let (holder, current_term, live) = locked_leader(&tx, "FOR SHARE").await?;
    let current = holder.as_deref() == Some(leader.0.as_str())
        && live
        && i64::try_from(term).is_ok_and(|t| t == current_term);
    if !current {
        return Err(StoreError::Unavailable(format!(
            "leader term {term} of {leader} is no longer current (term {current_term}, held by {})",
            holder.as_deref().unwrap_or("nobody")
        )));
    }
    if owners.is_empty() {
        return tx.commit().await.map_err(db_error);
    }
    let partitions: Vec<i32> = owners.iter().map(|(p, _)| i32::from(p.0)).collect();
    let nodes: Vec<&str> = owners.iter().map(|(_, n)| n.0.as_str()).collect();
    // The last entry per partition wins.
    const MOVES: &str = "SELECT DISTINCT ON (partition) partition, owner
         FROM unnest($1::int4[], $2::text[]) WITH ORDINALITY AS u(partition, owner, n)
         ORDER BY partition, n DESC";
    // Unowned, or the owner's lease has expired (it stopped firing, by the
    // renewal contract): granted now, nothing to wait for.
    let granted = tx
        .execute(
            &format!(
                "UPDATE partitions AS p
                 SET owner = u.owner, epoch = {NEXT_EPOCH}, takeover_at = NULL,
                     pending_owner = NULL
                 FROM ({MOVES}) AS u
                 WHERE p.partition = u.partition AND p.owner IS DISTINCT FROM u.owner
                   AND (p.owner IS NULL OR p.lease_expires_at IS NULL
                        OR p.lease_expires_at <= clock_timestamp())"
            ),
            &[&partitions, &nodes],
        )
        .await
        .map_err(db_error)?;
    // The owner holds a live lease: revoke (it releases, then the pending
    // owner gets it). Naming the owner itself cancels a pending move.
    let revoked = tx
        .execute(
            &format!(
                "UPDATE partitions AS p
                 SET pending_owner = NULLIF(u.owner, p.owner)
                 FROM ({MOVES}) AS u
                 WHERE p.partition = u.partition
                   AND p.pending_owner IS DISTINCT FROM NULLIF(u.owner, p.owner)"
            ),
            &[&partitions, &nodes],
        )
        .await
        .map_err(db_error)?;
    commit_announcing(tx, granted + revoked > 0, "assign").await
}

pub(crate) async fn renew_ownership(
    store: &PostgresStore,
    node: &NodeId,
    ttl: Duration,
) -> StoreResult<Vec<OwnedPartition>> {
    let client = store.coordination_client().await?;
    let sql = "UPDATE partitions
         SET lease_expires_at = CASE WHEN pending_owner IS NULL
             THEN clock_timestamp() + $2::float8 * interval '1 millisecond'
             ELSE lease_expires_at END
         WHERE owner = $1
         RETURNING partition, epoch,
             coalesce(ceil(extract(epoch FROM takeover_at - clock_timestamp()) * 1000), 0)::bigint,
             pending_owner IS NOT NULL";
    let mut owned = cached::query(&client, sql, &[&node.0, &millis(ttl)])
        .await?
        .iter()
        .map(|row| {
            Ok(OwnedPartition {
                partition: partition_from_i32(row.get(0))?,
                epoch: epoch_from_i64(row.get(1))?,
                takeover_after: duration_from_millis(row.get(2)),
                revoked: row.get(3),
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    owned.sort_by_key(|p| p.partition);
    Ok(owned)
}

pub(crate) async fn release_partitions(
    store: &PostgresStore,
    node: &NodeId,
    partitions: &[(PartitionId, u64)],
) -> StoreResult<Vec<PartitionId>> {
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i32> = partitions.iter().map(|(p, _)| i32::from(p.0)).collect();
    let epochs: Vec<i64> = partitions
        .iter()
        .map(|(_, e)| i64::try_from(*e).unwrap_or(-1))
        .collect();
    let mut client = store.coordination_client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    // Handed to the pending owner (a new epoch: whatever the releasing node
    // might still write is fenced from now on) or left unowned (same epoch:
    // nobody fires it until the leader grants it, which bumps the epoch).
    let mut released = tx
        .query(
            &format!(
                "UPDATE partitions AS p
                 SET owner = p.pending_owner,
                     epoch = CASE WHEN p.pending_owner IS NULL THEN p.epoch ELSE {NEXT_EPOCH} END,
                     pending_owner = NULL, lease_expires_at = NULL, takeover_at = NULL
                 FROM unnest($2::int4[], $3::int8[]) AS r(partition, epoch)
                 WHERE p.partition = r.partition AND p.epoch = r.epoch AND p.owner = $1
                 RETURNING p.partition"
            ),
            &[&node.0, &ids, &epochs],
        )
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| partition_from_i32(row.get(0)))
        .collect::<StoreResult<Vec<_>>>()?;
    commit_announcing(tx, !released.is_empty(), "release").await?;
    released.sort();
    Ok(released)
}

pub(crate) async fn assignments(store: &PostgresStore) -> StoreResult<Vec<PartitionAssignment>> {
    let client = store.coordination_client().await?;
    client
        .query(
            "SELECT partition, owner, epoch, pending_owner FROM partitions ORDER BY partition",
            &[],
        )
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| {
            Ok(PartitionAssignment {
                partition: partition_from_i32(row.get(0))?,
                owner: row.get::<_, Option<String>>(1).map(NodeId),
                epoch: epoch_from_i64(row.get(2))?,
                pending_owner: row.get::<_, Option<String>>(3).map(NodeId),
            })
        })
        .collect()
}

/// One `pg_notify` per payload (autocommit): `NODE \n TENANT \n …`, see
/// [`crate::wakeups::pull_ready_payloads`].
pub(crate) async fn announce_pull_ready(
    store: &PostgresStore,
    node: &NodeId,
    tenants: &[belfry_core::TenantName],
) -> StoreResult<()> {
    let payloads = crate::wakeups::pull_ready_payloads(&node.0, tenants);
    if payloads.is_empty() {
        return Ok(());
    }
    let sql = "SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p";
    let client = store.client().await?;
    cached::query(&client, sql, &[&PULL_READY_CHANNEL, &payloads]).await?;
    Ok(())
}

/// Stores `candidate` unless a secret is stored, then reads the stored
/// one: two statements, so the read sees a row another node committed
/// while the insert waited for it.
pub(crate) async fn cluster_secret(
    store: &PostgresStore,
    candidate: &[u8],
) -> StoreResult<Vec<u8>> {
    let client = store.client().await?;
    client
        .execute(
            "INSERT INTO cluster_secret (secret) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
            &[&candidate],
        )
        .await
        .map_err(db_error)?;
    let row = client
        .query_one("SELECT secret FROM cluster_secret", &[])
        .await
        .map_err(db_error)?;
    Ok(row.get(0))
}

pub(crate) async fn leader(store: &PostgresStore) -> StoreResult<Option<LeaderLease>> {
    let client = store.coordination_client().await?;
    client
        .query_opt(
            "SELECT holder, term FROM leader
             WHERE holder IS NOT NULL AND expires_at > clock_timestamp()",
            &[],
        )
        .await
        .map_err(db_error)?
        .map(|row| {
            Ok(LeaderLease {
                holder: NodeId(row.get(0)),
                term: term_from_i64(row.get(1))?,
            })
        })
        .transpose()
}

/// The first key of every presence lock (`'Belf'`): keeps them apart from
/// other advisory locks an application may take in the same database.
const PRESENCE_LOCK_CLASS: i32 = 0x4265_6c66;

/// SQL: whether the presence lock of the node whose id is the SQL
/// expression `id` is held by some session.
fn presence_held(id: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.granted
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND l.classid = {PRESENCE_LOCK_CLASS}::oid
                   AND l.objid = hashtext({id})::oid AND l.objsubid = 2)"
    )
}

/// This node's presence session: a connection of its own (not pooled, so
/// never recycled), holding the node's presence lock until it closes.
pub(crate) struct PresenceSession {
    node: NodeId,
    client: tokio_postgres::Client,
    /// When it was opened: a session older than the last loss of the
    /// primary may still hold its lock on the old server, where the other
    /// nodes no longer look, so it is opened again like every pooled one.
    opened: std::time::Instant,
}

/// Opens a presence session for `node` and takes its lock.
async fn open_presence(store: &PostgresStore, node: &NodeId) -> StoreResult<PresenceSession> {
    let (client, connection) = store
        .config
        .connect(store.tls.clone())
        .await
        .map_err(db_error)?;
    // Ends when the client is dropped or the connection breaks.
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "presence session closed");
        }
    });
    client
        .execute(
            "SELECT pg_advisory_lock_shared($1, hashtext($2))",
            &[&PRESENCE_LOCK_CLASS, &node.0],
        )
        .await
        .map_err(db_error)?;
    Ok(PresenceSession {
        node: node.clone(),
        client,
        opened: crate::primary::pool_now(),
    })
}

pub(crate) async fn presence(
    store: &PostgresStore,
    node: &NodeId,
) -> StoreResult<Vec<NodePresence>> {
    let mut session = store.presence.lock().await;
    if session
        .as_ref()
        .is_none_or(|s| s.node != *node || s.client.is_closed() || store.primary.is_stale(s.opened))
    {
        // Closes the old one first: its lock must not outlive it.
        *session = None;
        *session = Some(open_presence(store, node).await?);
    }
    let Some(open) = session.as_ref() else {
        unreachable!("opened above");
    };
    let look = format!(
        "SELECT n.id, n.address,
                floor(extract(epoch FROM clock_timestamp() - n.heartbeat_at) * 1000)::bigint,
                {}
         FROM nodes n ORDER BY n.id",
        presence_held("n.id")
    );
    match open.client.query(&look, &[]).await {
        Ok(rows) => Ok(rows
            .iter()
            .map(|row| NodePresence {
                info: NodeInfo {
                    id: NodeId(row.get(0)),
                    address: row.get(1),
                },
                heartbeat_age: duration_from_millis(row.get(2)),
                present: row.get(3),
            })
            .collect()),
        Err(error) => {
            // Take the lock again at once (a live node's lock must be gone
            // as briefly as possible); this look failed all the same.
            *session = None;
            *session = open_presence(store, node).await.ok();
            Err(db_error(error))
        }
    }
}

pub(crate) async fn evict(store: &PostgresStore, node: &NodeId) -> StoreResult<Option<Eviction>> {
    let mut client = store.coordination_client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    tx.execute("SELECT 1 FROM leader FOR UPDATE", &[])
        .await
        .map_err(db_error)?;
    let held: bool = tx
        .query_one(&format!("SELECT {}", presence_held("$1")), &[&node.0])
        .await
        .map_err(db_error)?
        .get(0);
    if held {
        return Ok(None);
    }
    let registered = tx
        .execute("DELETE FROM nodes WHERE id = $1", &[&node.0])
        .await
        .map_err(db_error)?
        > 0;
    // A new epoch at once: whatever the node might still write is fenced
    // before the leader grants the partitions again (another new epoch).
    let mut partitions = tx
        .query(
            "UPDATE partitions
             SET owner = NULL, epoch = epoch + 1, pending_owner = NULL,
                 lease_expires_at = NULL, takeover_at = NULL
             WHERE owner = $1
             RETURNING partition",
            &[&node.0],
        )
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| partition_from_i32(row.get(0)))
        .collect::<StoreResult<Vec<_>>>()?;
    partitions.sort();
    tx.execute(
        "UPDATE partitions SET pending_owner = NULL WHERE pending_owner = $1",
        &[&node.0],
    )
    .await
    .map_err(db_error)?;
    let was_leader = tx
        .execute(
            "UPDATE leader SET holder = NULL, expires_at = NULL WHERE holder = $1",
            &[&node.0],
        )
        .await
        .map_err(db_error)?
        > 0;
    let changed = registered || was_leader || !partitions.is_empty();
    commit_announcing(tx, changed, "evict").await?;
    Ok(Some(Eviction {
        registered,
        partitions,
        was_leader,
    }))
}
