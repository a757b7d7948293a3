//! Pull leases on PostgreSQL ([`Store::record_leases`](belfry_store::Store::record_leases),
//! [`Store::change_lease`](belfry_store::Store::change_lease),
//! [`Store::change_leases`](belfry_store::Store::change_leases)): one
//! transaction per call, fenced like [`crate::apply`].
//!
//! 1. The partition's row is read `FOR SHARE`: no hand-over can commit
//!    between the epoch check and our commit.
//! 2. The events are locked `FOR UPDATE` in key order, then their lease
//!    rows: two grants of one version serialize on the event's row, and
//!    the second reads the first's lease (each statement takes a fresh
//!    snapshot under READ COMMITTED).
//! 3. [`belfry_store::lease`] decides; the lease rows, the event and its
//!    history are written, and the transaction commits (durable:
//!    `synchronous_commit = on`). An owner's write to its own partition
//!    needs no wake-up notification.

use std::collections::{BTreeSet, HashMap};

use belfry_core::event::EventRecord;
use belfry_core::{EventKey, PartitionId};
use belfry_store::lease::{LeaseDoc, decide_change, decide_grant, reported};
use belfry_store::{
    ChangeLeaseParams, ChangeLeasesParams, Fence, LeaseWriteOutcome, RecordLeasesParams,
    StoreResult, StoredLease,
};
use deadpool_postgres::Transaction;

use crate::PostgresStore;
use crate::apply::{INSERT_HISTORY_SQL, lock_events_sql, update_events_sql};
use crate::cached;
use crate::error::{StoreError, db_error, pool_error};
use crate::rows::{AttemptColumns, EventColumns, record_from_row};

pub(crate) async fn record_leases(
    store: &PostgresStore,
    params: RecordLeasesParams,
) -> StoreResult<Vec<LeaseWriteOutcome>> {
    if params.grants.is_empty() {
        return Ok(Vec::new());
    }
    let mut client = store.pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await.map_err(db_error)?;
    let Some(epoch) = current_epoch(&tx, params.fence).await? else {
        return Ok(vec![LeaseWriteOutcome::Lost; params.grants.len()]);
    };
    let keys: Vec<&EventKey> = params.grants.iter().map(|g| g.lease.key()).collect();
    let (records, mut leases) = lock(&tx, &keys).await?;
    let mut outcomes = Vec::with_capacity(params.grants.len());
    let mut written: HashMap<EventKey, StoredLease> = HashMap::new();
    for grant in &params.grants {
        let key = grant.lease.key();
        if store.partitions.partition_of(key) != params.fence.partition {
            outcomes.push(LeaseWriteOutcome::Lost);
            continue;
        }
        let (outcome, write) = decide_grant(
            params.fence,
            epoch,
            records.get(key),
            leases.get(key),
            grant,
        );
        if let Some(lease) = write {
            leases.insert(key.clone(), lease.clone());
            written.insert(key.clone(), lease);
        }
        outcomes.push(outcome);
    }
    write_leases(&tx, written.values()).await?;
    tx.commit().await.map_err(db_error)?;
    Ok(outcomes)
}

pub(crate) async fn change_lease(
    store: &PostgresStore,
    params: ChangeLeaseParams,
) -> StoreResult<LeaseWriteOutcome> {
    let mut client = store.pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await.map_err(db_error)?;
    let Some(epoch) = current_epoch(&tx, params.fence).await? else {
        return Ok(LeaseWriteOutcome::Lost);
    };
    let key = params.lease.key();
    let (records, leases) = lock(&tx, &[key]).await?;
    let (outcome, write) = decide_change(epoch, records.get(key), leases.get(key), &params);
    let Some(write) = write else {
        return Ok(outcome);
    };
    write_leases(&tx, [&write.lease]).await?;
    let mut columns = EventColumns::default();
    if let Some(record) = &write.record {
        columns.push(record);
    }
    let mut history = AttemptColumns::default();
    if let Some(attempt) = &write.attempt {
        history.push(key, attempt);
    }
    write_events_and_history(&tx, &columns, &history).await?;
    tx.commit().await.map_err(db_error)?;
    Ok(outcome)
}

/// The events' new rows and the attempts' history, each when there is any.
async fn write_events_and_history(
    tx: &Transaction<'_>,
    columns: &EventColumns,
    history: &AttemptColumns,
) -> StoreResult<()> {
    if !columns.is_empty() {
        cached::execute(tx, &update_events_sql(), &columns.params()).await?;
    }
    if !history.is_empty() {
        cached::execute(tx, INSERT_HISTORY_SQL, &history.params()).await?;
    }
    Ok(())
}

/// Many changes in one transaction: the partitions' rows `FOR SHARE` in
/// partition order, then the events and leases in key order (the order
/// every caller locks in, so batches cannot deadlock each other), then
/// each change decided in input order on what the earlier ones wrote.
pub(crate) async fn change_leases(
    store: &PostgresStore,
    params: ChangeLeasesParams,
) -> StoreResult<Vec<LeaseWriteOutcome>> {
    let changes = params.changes;
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let mut client = store.pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await.map_err(db_error)?;
    let epochs = current_epochs(&tx, changes.iter().map(|c| c.fence.partition)).await?;
    let keys: Vec<&EventKey> = changes.iter().map(|c| c.lease.key()).collect();
    let (mut records, mut leases) = lock(&tx, &keys).await?;
    let mut outcomes = Vec::with_capacity(changes.len());
    let mut written_leases: HashMap<EventKey, StoredLease> = HashMap::new();
    let mut written_records: HashMap<EventKey, EventRecord> = HashMap::new();
    let mut history = AttemptColumns::default();
    for change in &changes {
        let key = change.lease.key();
        // A partition without a row: nothing may be written for it.
        let Some(&epoch) = epochs.get(&change.fence.partition) else {
            outcomes.push(LeaseWriteOutcome::Lost);
            continue;
        };
        let (outcome, write) = decide_change(epoch, records.get(key), leases.get(key), change);
        outcomes.push(outcome);
        let Some(write) = write else {
            continue;
        };
        leases.insert(key.clone(), write.lease.clone());
        written_leases.insert(key.clone(), write.lease);
        if let Some(record) = write.record {
            records.insert(key.clone(), record.clone());
            written_records.insert(key.clone(), record);
        }
        if let Some(attempt) = &write.attempt {
            history.push(key, attempt);
        }
    }
    write_leases(&tx, written_leases.values()).await?;
    let mut columns = EventColumns::default();
    for record in written_records.values() {
        columns.push(record);
    }
    write_events_and_history(&tx, &columns, &history).await?;
    tx.commit().await.map_err(db_error)?;
    Ok(outcomes)
}

pub(crate) async fn get_lease(
    store: &PostgresStore,
    key: &EventKey,
) -> StoreResult<Option<StoredLease>> {
    let client = store.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(
            "SELECT l.lease::text, p.epoch FROM leases l
             LEFT JOIN partitions p ON p.partition = $3
             WHERE l.tenant = $1 AND l.id = $2",
        )
        .await
        .map_err(db_error)?;
    let partition = i32::from(store.partitions.partition_of(key).0);
    let Some(row) = client
        .query_opt(
            &statement,
            &[&key.tenant.as_str(), &key.id.as_str(), &partition],
        )
        .await
        .map_err(db_error)?
    else {
        return Ok(None);
    };
    let lease = LeaseDoc::decode(row.get::<_, String>(0).as_bytes())?;
    let epoch = row
        .get::<_, Option<i64>>(1)
        .and_then(|e| u64::try_from(e).ok());
    // On the same connection (see `read_event`).
    let record = crate::read_event(&client, key).await?;
    Ok(Some(reported(lease, record.as_ref(), epoch)))
}

/// The partition's epoch, read `FOR SHARE` (held until commit); `None`
/// when the partition has no row (then nothing may be written for it).
async fn current_epoch(tx: &Transaction<'_>, fence: Fence) -> StoreResult<Option<u64>> {
    let statement = tx
        .prepare_cached("SELECT epoch FROM partitions WHERE partition = $1 FOR SHARE")
        .await
        .map_err(db_error)?;
    let row = tx
        .query_opt(&statement, &[&i32::from(fence.partition.0)])
        .await
        .map_err(db_error)?;
    Ok(row.and_then(|row| u64::try_from(row.get::<_, i64>(0)).ok()))
}

/// The epochs of `partitions`, their rows read `FOR SHARE` in partition
/// order; a partition without a row is left out.
async fn current_epochs(
    tx: &Transaction<'_>,
    partitions: impl Iterator<Item = PartitionId>,
) -> StoreResult<HashMap<PartitionId, u64>> {
    let wanted: BTreeSet<i32> = partitions.map(|p| i32::from(p.0)).collect();
    let wanted: Vec<i32> = wanted.into_iter().collect();
    let statement = tx
        .prepare_cached(
            "SELECT partition, epoch FROM partitions WHERE partition = ANY($1)
             ORDER BY partition FOR SHARE",
        )
        .await
        .map_err(db_error)?;
    let rows = tx.query(&statement, &[&wanted]).await.map_err(db_error)?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            let partition = u16::try_from(row.get::<_, i32>(0)).ok()?;
            let epoch = u64::try_from(row.get::<_, i64>(1)).ok()?;
            Some((PartitionId(partition), epoch))
        })
        .collect())
}

type Locked = (
    HashMap<EventKey, EventRecord>,
    HashMap<EventKey, StoredLease>,
);

/// Locks the events of `keys`, then their lease rows, in key order.
async fn lock(tx: &Transaction<'_>, keys: &[&EventKey]) -> StoreResult<Locked> {
    let mut sorted: Vec<&EventKey> = keys.to_vec();
    sorted.sort();
    sorted.dedup();
    let tenants: Vec<&str> = sorted.iter().map(|k| k.tenant.as_str()).collect();
    let ids: Vec<&str> = sorted.iter().map(|k| k.id.as_str()).collect();
    let mut records = HashMap::with_capacity(sorted.len());
    for row in cached::query(tx, &lock_events_sql(), &[&tenants, &ids]).await? {
        let record = record_from_row(&row)?;
        records.insert(record.key.clone(), record);
    }
    let lock_leases = "SELECT l.lease::text FROM leases l
         JOIN unnest($1::text[], $2::text[]) AS k(tenant, id)
           ON l.tenant = k.tenant AND l.id = k.id
         ORDER BY l.tenant, l.id
         FOR UPDATE OF l";
    let mut leases = HashMap::with_capacity(sorted.len());
    for row in cached::query(tx, lock_leases, &[&tenants, &ids]).await? {
        let lease = LeaseDoc::decode(row.get::<_, String>(0).as_bytes())?;
        leases.insert(lease.record.lease.key().clone(), lease);
    }
    Ok((records, leases))
}

/// Inserts or replaces the lease rows.
async fn write_leases<'a>(
    tx: &Transaction<'_>,
    leases: impl IntoIterator<Item = &'a StoredLease>,
) -> StoreResult<()> {
    let mut tenants = Vec::new();
    let mut ids = Vec::new();
    let mut docs = Vec::new();
    for lease in leases {
        let key = lease.record.lease.key();
        tenants.push(key.tenant.as_str().to_owned());
        ids.push(key.id.as_str().to_owned());
        let doc = LeaseDoc::encode(lease)?;
        docs.push(String::from_utf8(doc).map_err(|e| StoreError::Internal(e.to_string()))?);
    }
    if docs.is_empty() {
        return Ok(());
    }
    let statement = tx
        .prepare_cached(
            "INSERT INTO leases (tenant, id, lease)
             SELECT t, i, d::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS u(t, i, d)
             ON CONFLICT (tenant, id) DO UPDATE SET lease = EXCLUDED.lease",
        )
        .await
        .map_err(db_error)?;
    tx.execute(&statement, &[&tenants, &ids, &docs])
        .await
        .map_err(db_error)?;
    Ok(())
}
