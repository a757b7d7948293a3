//! The [`Coordinator`](belfry_store::cluster::Coordinator) contract on
//! PostgreSQL. Every lease, expiry and age is computed with the database's
//! `clock_timestamp()`, so nodes' clocks never have to agree.
//!
//! - The leader lease is the single row of `leader`; claims lock it
//!   (`FOR UPDATE`), so two claimants are serialized and at most one wins a
//!   term. `assign` share-locks it for its whole transaction, so no new term
//!   can begin while an old leader's assignment is being written.
//! - A partition whose owner changes gets `epoch + 1` and
//!   `takeover_at = lease_expires_at` (the old owner's lease end). The lease
//!   end stays in the row until the new owner renews, so a quick second
//!   reassignment still waits for the first owner's lease.

use std::time::Duration;

use belfry_core::PartitionId;
use belfry_store::StoreResult;
use belfry_store::cluster::{
    LeaderLease, NodeId, NodeInfo, NodeStatus, OwnedPartition, PartitionAssignment,
};

use crate::PostgresStore;
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

pub(crate) async fn heartbeat(
    store: &PostgresStore,
    node: &NodeInfo,
    ttl: Duration,
) -> StoreResult<Vec<NodeStatus>> {
    let client = store.client().await?;
    let upsert = client
        .prepare_cached(
            "INSERT INTO nodes (id, address, heartbeat_at) VALUES ($1, $2, clock_timestamp())
             ON CONFLICT (id) DO UPDATE
             SET address = EXCLUDED.address, heartbeat_at = EXCLUDED.heartbeat_at",
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
    client
        .execute(&upsert, &[&node.id.0, &node.address])
        .await
        .map_err(db_error)?;
    client
        .query(&live, &[&millis(ttl)])
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| {
            Ok(NodeStatus {
                info: NodeInfo {
                    id: NodeId(row.get(0)),
                    address: row.get(1),
                },
                heartbeat_age: duration_from_millis(row.get(2)),
            })
        })
        .collect()
}

pub(crate) async fn leave(store: &PostgresStore, node: &NodeId) -> StoreResult<()> {
    let client = store.client().await?;
    client
        .execute("DELETE FROM nodes WHERE id = $1", &[&node.0])
        .await
        .map_err(db_error)?;
    Ok(())
}

pub(crate) async fn claim_leadership(
    store: &PostgresStore,
    node: &NodeId,
    ttl: Duration,
) -> StoreResult<LeaderLease> {
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    let row = tx
        .query_one(
            "SELECT holder, term, coalesce(expires_at > clock_timestamp(), false)
             FROM leader FOR UPDATE",
            &[],
        )
        .await
        .map_err(db_error)?;
    let holder: Option<String> = row.get(0);
    let term: i64 = row.get(1);
    let live: bool = row.get(2);
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
    let client = store.client().await?;
    client
        .execute(
            "UPDATE leader SET holder = NULL, expires_at = NULL WHERE holder = $1",
            &[&node.0],
        )
        .await
        .map_err(db_error)?;
    Ok(())
}

pub(crate) async fn assign(
    store: &PostgresStore,
    leader: &NodeId,
    term: u64,
    owners: Vec<(PartitionId, NodeId)>,
) -> StoreResult<()> {
    let mut client = store.client().await?;
    let tx = client.transaction().await.map_err(db_error)?;
    let row = tx
        .query_one(
            "SELECT holder, term, coalesce(expires_at > clock_timestamp(), false)
             FROM leader FOR SHARE",
            &[],
        )
        .await
        .map_err(db_error)?;
    let holder: Option<String> = row.get(0);
    let current_term: i64 = row.get(1);
    let live: bool = row.get(2);
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
    tx.execute(
        "UPDATE partitions AS p
         SET owner = u.owner,
             epoch = p.epoch + 1,
             takeover_at = CASE WHEN p.lease_expires_at > clock_timestamp()
                                THEN p.lease_expires_at END
         FROM (SELECT DISTINCT ON (partition) partition, owner
               FROM unnest($1::int4[], $2::text[]) WITH ORDINALITY AS u(partition, owner, n)
               ORDER BY partition, n DESC) AS u
         WHERE p.partition = u.partition AND p.owner IS DISTINCT FROM u.owner",
        &[&partitions, &nodes],
    )
    .await
    .map_err(db_error)?;
    tx.commit().await.map_err(db_error)
}

pub(crate) async fn renew_ownership(
    store: &PostgresStore,
    node: &NodeId,
    ttl: Duration,
) -> StoreResult<Vec<OwnedPartition>> {
    let client = store.client().await?;
    let statement = client
        .prepare_cached(
            "UPDATE partitions
             SET lease_expires_at = clock_timestamp() + $2::float8 * interval '1 millisecond'
             WHERE owner = $1
             RETURNING partition, epoch,
                 coalesce(ceil(extract(epoch FROM takeover_at - clock_timestamp()) * 1000), 0)::bigint",
        )
        .await
        .map_err(db_error)?;
    let mut owned = client
        .query(&statement, &[&node.0, &millis(ttl)])
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| {
            let epoch: i64 = row.get(1);
            Ok(OwnedPartition {
                partition: partition_from_i32(row.get(0))?,
                epoch: u64::try_from(epoch).map_err(|_| corrupt(format_args!("epoch {epoch}")))?,
                takeover_after: duration_from_millis(row.get(2)),
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    owned.sort_by_key(|p| p.partition);
    Ok(owned)
}

pub(crate) async fn assignments(store: &PostgresStore) -> StoreResult<Vec<PartitionAssignment>> {
    let client = store.client().await?;
    client
        .query(
            "SELECT partition, owner, epoch FROM partitions ORDER BY partition",
            &[],
        )
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| {
            let epoch: i64 = row.get(2);
            Ok(PartitionAssignment {
                partition: partition_from_i32(row.get(0))?,
                owner: row.get::<_, Option<String>>(1).map(NodeId),
                epoch: u64::try_from(epoch).map_err(|_| corrupt(format_args!("epoch {epoch}")))?,
            })
        })
        .collect()
}

pub(crate) async fn leader(store: &PostgresStore) -> StoreResult<Option<LeaderLease>> {
    let client = store.client().await?;
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
