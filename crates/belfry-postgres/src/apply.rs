//! [`Store::apply`](belfry_store::Store::apply) on PostgreSQL: one
//! transaction per call, so a call is all-or-nothing: it never answers
//! [`StoreError::Partial`](belfry_store::StoreError::Partial). An error
//! after COMMIT was sent (a timeout, a connection lost) leaves the outcome
//! unknown: the whole call committed or none of it did.
//!
//! 1. Fences: the `partitions` rows of every fenced command are read
//!    `FOR SHARE`, so no reassignment can commit between the check and our
//!    commit; a stale epoch fails the whole call with `Fenced`.
//! 2. The rows of the commands' keys are locked `FOR UPDATE`, in key order
//!    (the same order for every caller, so two calls cannot deadlock on
//!    existing rows).
//! 3. [`transition`] runs per command, in order, on the state left by the
//!    previous commands of the call (read-your-writes).
//! 4. Writes are batched: one `UPDATE ... FROM unnest(...)` for rows that
//!    existed, one `INSERT ... SELECT FROM unnest(...)` for new ones, one for
//!    the history, one `pg_notify` per packed payload; pipelined on the
//!    connection.
//! 5. COMMIT, durable (`synchronous_commit = on` is set per connection);
//!    concurrent callers share WAL flushes through PostgreSQL's group commit.
//!
//! A key that does not exist yet cannot be row-locked: two calls creating
//! the same key both see "absent" and the second insert fails with a
//! unique violation. The whole call is then run again (it will see the row
//! and lock it); deadlocks and serialization failures are retried the same
//! way, a bounded number of times.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use belfry_core::EventKey;
use belfry_core::event::{Effect, EventRecord, Replaced, TransitionContext, transition};
use belfry_store::{Applied, ApplyParams, StoreResult};

use crate::PostgresStore;
use crate::error::{StoreError, db_error, is_retryable, pool_error};
use crate::rows::{
    AttemptColumns, EVENT_COLUMNS, EVENT_COLUMNS_E, EventColumns, UNNEST_EVENTS, record_from_row,
};
use crate::wakeups::{CHANNEL, PayloadBuilder, WakeupKind};

/// Attempts of one call before a retryable conflict is reported.
const MAX_TRIES: usize = 8;

/// Why one try failed.
enum TryError {
    /// Worth running the whole call again.
    Conflict(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for TryError {
    fn from(error: tokio_postgres::Error) -> Self {
        if is_retryable(&error) {
            TryError::Conflict(error)
        } else {
            TryError::Store(db_error(error))
        }
    }
}

impl From<StoreError> for TryError {
    fn from(error: StoreError) -> Self {
        TryError::Store(error)
    }
}

pub(crate) async fn apply(store: &PostgresStore, params: ApplyParams) -> StoreResult<Vec<Applied>> {
    if params.commands.is_empty() {
        return Ok(Vec::new());
    }
    let mut last_conflict = None;
    for attempt in 0..MAX_TRIES {
        let started = store.clock.monotonic();
        match apply_once(store, &params).await {
            Ok(applied) => {
                belfry_metrics::store_commit(
                    belfry_metrics::Store::Postgres,
                    params.commands.len(),
                    store.clock.monotonic().since(started),
                );
                return Ok(applied);
            }
            Err(TryError::Store(error)) => return Err(error),
            Err(TryError::Conflict(error)) => {
                tracing::debug!(%error, attempt, "apply conflicted with a concurrent call; retrying");
                last_conflict = Some(error);
            }
        }
    }
    Err(last_conflict.map_or_else(
        || StoreError::Internal("apply: retries exhausted".into()),
        db_error,
    ))
}

/// The state of one key during a call.
struct Slot {
    current: Option<EventRecord>,
    /// Whether a row exists in the table (UPDATE, not INSERT).
    stored: bool,
    /// Whether `current` differs from the row.
    dirty: bool,
}

async fn apply_once(store: &PostgresStore, params: &ApplyParams) -> Result<Vec<Applied>, TryError> {
    let partitions = store.partitions;
    let mut client = store.pool.get().await.map_err(pool_error)?;
    let tx = client.transaction().await?;

    // 1. Fences.
    let mut fences: BTreeMap<u16, BTreeSet<u64>> = BTreeMap::new();
    for command in &params.commands {
        if let Some(fence) = command.fence {
            fences
                .entry(fence.partition.0)
                .or_default()
                .insert(fence.epoch);
        }
    }
    if !fences.is_empty() {
        let wanted: Vec<i32> = fences.keys().map(|p| i32::from(*p)).collect();
        let statement = tx
            .prepare_cached(
                "SELECT partition, epoch FROM partitions WHERE partition = ANY($1)
                 ORDER BY partition FOR SHARE",
            )
            .await?;
        let current: HashMap<i32, i64> = tx
            .query(&statement, &[&wanted])
            .await?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        for (partition, epochs) in &fences {
            for epoch in epochs {
                let matches = current
                    .get(&i32::from(*partition))
                    .is_some_and(|stored| i64::try_from(*epoch).is_ok_and(|e| e == *stored));
                if !matches {
                    return Err(StoreError::Fenced {
                        partition: belfry_core::PartitionId(*partition),
                        epoch: *epoch,
                    }
                    .into());
                }
            }
        }
    }

    // 2. Lock and load the rows, in key order.
    let keys: BTreeSet<&EventKey> = params.commands.iter().map(|c| &c.key).collect();
    let tenants: Vec<&str> = keys.iter().map(|k| k.tenant.as_str()).collect();
    let ids: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
    let statement = tx.prepare_cached(&lock_events_sql()).await?;
    let mut slots: HashMap<EventKey, Slot> = HashMap::with_capacity(keys.len());
    for row in tx.query(&statement, &[&tenants, &ids]).await? {
        let record = record_from_row(&row)?;
        slots.insert(
            record.key.clone(),
            Slot {
                current: Some(record),
                stored: true,
                dirty: false,
            },
        );
    }

    // 3. Transitions, in order, with read-your-writes. The horizon covers
    // the owner's window plus the clock-skew margin (see `wakeups`).
    let horizon = params.now.plus(store.notify_horizon);
    let mut wakeups = PayloadBuilder::default();
    let mut history = AttemptColumns::default();
    let mut applied = Vec::with_capacity(params.commands.len());
    for command in &params.commands {
        let partition = partitions.partition_of(&command.key);
        let slot = slots.entry(command.key.clone()).or_insert(Slot {
            current: None,
            stored: false,
            dirty: false,
        });
        let result = transition(
            &command.key,
            slot.current.as_ref(),
            command.command.clone(),
            TransitionContext {
                now: params.now,
                partition,
                retry: &params.retry,
            },
        );
        let replaced = Replaced::of(slot.current.as_ref(), &result.outcome);
        if let Some(next) = result.next {
            slot.current = Some(next);
            slot.dirty = true;
        }
        if let Some(attempt) = &result.attempt {
            history.push(&command.key, attempt);
        }
        // An owner's writes to its own partition need no announcement (its
        // window has them); anything else does — client writes, and writes a
        // partition owner makes into other partitions (a schedule's control
        // event creating an occurrence that another node owns).
        if command
            .fence
            .is_none_or(|fence| fence.partition != partition)
        {
            for effect in &result.effects {
                let (due, kind) = match *effect {
                    Effect::Arm { at } => (at, WakeupKind::Arm),
                    Effect::Disarm { at } => (at, WakeupKind::Disarm),
                };
                // Inclusive: a window loaded at `now` covers `now + window`.
                if due <= horizon {
                    wakeups.push(partition, &command.key, due, kind);
                }
            }
        }
        applied.push(Applied {
            key: command.key.clone(),
            partition,
            outcome: result.outcome,
            record: slot.current.clone(),
            effects: result.effects,
            replaced,
        });
    }

    // 4. Batched writes, pipelined.
    let mut updates = EventColumns::default();
    let mut inserts = EventColumns::default();
    // Key order, so concurrent calls touch rows and index entries alike.
    let mut dirty: Vec<&Slot> = slots.values().filter(|slot| slot.dirty).collect();
    dirty.sort_by(|a, b| record_key(a).cmp(&record_key(b)));
    for slot in dirty {
        if let Some(record) = &slot.current {
            if slot.stored {
                updates.push(record);
            } else {
                inserts.push(record);
            }
        }
    }
    let payloads = wakeups.finish();

    let update_sql = update_events_sql();
    let insert_sql =
        format!("INSERT INTO events ({EVENT_COLUMNS}) SELECT {EVENT_COLUMNS} FROM {UNNEST_EVENTS}");
    let history_sql = INSERT_HISTORY_SQL;
    let notify_sql =
        format!("SELECT count(pg_notify('{CHANNEL}', p)) FROM unnest($1::text[]) AS p");

    let update_params = updates.params();
    let insert_params = inserts.params();
    let history_params = history.params();
    let update = async {
        if updates.is_empty() {
            return Ok(());
        }
        let statement = tx.prepare_cached(&update_sql).await?;
        tx.execute(&statement, &update_params).await.map(drop)
    };
    let insert = async {
        if inserts.is_empty() {
            return Ok(());
        }
        let statement = tx.prepare_cached(&insert_sql).await?;
        tx.execute(&statement, &insert_params).await.map(drop)
    };
    let record_history = async {
        if history.is_empty() {
            return Ok(());
        }
        let statement = tx.prepare_cached(history_sql).await?;
        tx.execute(&statement, &history_params).await.map(drop)
    };
    let notify = async {
        if payloads.is_empty() {
            return Ok(());
        }
        let statement = tx.prepare_cached(&notify_sql).await?;
        tx.execute(&statement, &[&payloads]).await.map(drop)
    };
    futures::try_join!(update, insert, record_history, notify)?;

    // 5. Durable on return.
    tx.commit().await?;
    Ok(applied)
}

/// Updates existing rows to the records of [`EventColumns::params`].
pub(crate) fn update_events_sql() -> String {
    format!(
        "UPDATE events AS e SET partition = u.partition, version = u.version,
             event_time = u.event_time, payload = u.payload, delivery = u.delivery,
             status = u.status, next_fire_at = u.next_fire_at, attempts = u.attempts,
             last_error = u.last_error, triggered_at = u.triggered_at,
             created_at = u.created_at, updated_at = u.updated_at,
             finished_at = u.finished_at, queue = u.queue,
             max_attempts = u.max_attempts, backoff = u.backoff,
             attempt_timeout_ms = u.attempt_timeout_ms, expire_at = u.expire_at,
             max_age_ms = u.max_age_ms, debounce_since = u.debounce_since
         FROM {UNNEST_EVENTS}
         WHERE e.tenant = u.tenant AND e.id = u.id"
    )
}

/// Appends the history entries of [`AttemptColumns::params`], each
/// (version, number) once: an attempt recorded again (a stale attempt
/// whose write is retried) adds nothing.
pub(crate) const INSERT_HISTORY_SQL: &str = "INSERT INTO attempts (tenant, id, version, number, \
     started_at, duration_ms, verdict, http_status, error)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], \
     $6::int8[], $7::text[], $8::int4[], $9::text[])
     ON CONFLICT (tenant, id, version, number) WHERE number > 0 DO NOTHING";

/// Locks and reads the events of `($1 tenants, $2 ids)` in key order (the
/// same order for every caller, so calls cannot deadlock on existing rows).
pub(crate) fn lock_events_sql() -> String {
    format!(
        "SELECT {EVENT_COLUMNS_E} FROM events e
         JOIN unnest($1::text[], $2::text[]) AS k(tenant, id)
           ON e.tenant = k.tenant AND e.id = k.id
         ORDER BY e.tenant, e.id
         FOR UPDATE OF e"
    )
}

fn record_key(slot: &Slot) -> Option<&EventKey> {
    slot.current.as_ref().map(|record| &record.key)
}
