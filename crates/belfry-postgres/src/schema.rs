//! Versioned schema migrations, applied at connect.
//!
//! Every node runs [`migrate`] when it starts. Migrations are append-only:
//! a released one is never changed in what it produces, a change is a new
//! version.
//!
//! # Locking
//! The run holds a session-level advisory lock ([`MIGRATION_LOCK`]), so
//! nodes starting at once apply each migration exactly once: the others
//! wait, then find it recorded in `belfry_schema_migrations`. Every node
//! waits by *polling* `pg_try_advisory_lock`, never by blocking on the
//! lock: a blocked lock request holds a snapshot, and an online migration
//! (`CREATE INDEX CONCURRENTLY`) waits for every transaction holding an
//! older snapshot, so a node blocked on the lock while another builds an
//! index and the build would wait for each other (PostgreSQL then aborts
//! one of them: "deadlock detected"). Builds before this scheme blocked on
//! a transaction-scoped lock: while a database older than version 3 is
//! upgraded, start no node of such a build. A build that was aborted half
//! way is redone by the next start (see below).
//!
//! Under the lock, each ordinary migration is one transaction together
//! with its row in `belfry_schema_migrations`; an online migration runs
//! outside any transaction (`CREATE INDEX CONCURRENTLY` cannot run in
//! one), first dropping an invalid index a failed build left behind, then
//! running its `prepare` statement if it has one (migration 9 removes the
//! duplicate history entries its unique index would refuse), and is
//! recorded afterwards. A run that fails keeps the migrations before the
//! failing one. (A node of an older build that records an attempt twice
//! while migration 9 builds its index fails the build; the next start
//! removes the duplicate and builds it again.)
//!
//! # Conventions
//! - Text columns that take part in an ordering (`tenant`, `id`, node ids)
//!   use `COLLATE "C"`, so PostgreSQL orders them byte-wise exactly like
//!   Rust's `String`: the engine's exclusive cursors (including
//!   `EventKey::before_all()`, whose names are empty) depend on it, whatever
//!   the database's default collation.
//! - Event instants are `bigint` milliseconds (the engine's `Timestamp`, the
//!   engine's clock); leases and heartbeats are `timestamptz` on the
//!   database's clock, which all nodes share.

use std::time::Duration;

use belfry_core::{Clock, PartitionCount};
use tokio_postgres::Client;

use crate::error::{StoreError, db_error};

/// Key of the advisory lock that serializes migrations (two-int form, so it
/// cannot collide with single-bigint advisory locks used by anyone else):
/// `'belf'` and 1.
const MIGRATION_LOCK: (i32, i32) = (0x6265_6c66, 1);

/// How often a node waiting for another node's migrations tries the lock.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// One schema change.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
    apply: Apply,
}

/// How a migration is applied.
#[derive(Clone, Copy)]
enum Apply {
    /// `sql` and its record in one transaction.
    InTransaction,
    /// `sql` is one `CREATE [UNIQUE] INDEX CONCURRENTLY` statement
    /// building `index`, run outside a transaction so that writes to the
    /// table go on meanwhile. `prepare`, if any, runs first (in its own
    /// transaction, before every try of the build): it removes the rows a
    /// unique index would refuse.
    ConcurrentIndex {
        index: &'static str,
        prepare: Option<&'static str>,
    },
}

/// Every migration, in version order.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        apply: Apply::InTransaction,
        name: "initial schema",
        sql: r#"
CREATE TABLE belfry_settings (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Fixed when the database is created: the key → partition mapping is
    -- persisted in every row.
    partitions integer NOT NULL CHECK (partitions BETWEEN 1 AND 65535)
);

CREATE TABLE tenants (
    name text COLLATE "C" PRIMARY KEY,
    sink jsonb NOT NULL
);

CREATE TABLE events (
    tenant       text COLLATE "C" NOT NULL,
    id           text COLLATE "C" NOT NULL,
    partition    integer NOT NULL,
    version      text NOT NULL,
    event_time   bigint NOT NULL,
    payload      text,
    delivery     text NOT NULL CHECK (delivery IN ('FULL_EVENT', 'PAYLOAD_ONLY')),
    status       text NOT NULL CHECK (status IN
                     ('scheduled', 'retrying', 'delivered', 'failed', 'missed', 'cancelled')),
    -- Set exactly when the event is pending; its key in the due index.
    next_fire_at bigint,
    attempts     bigint NOT NULL,
    last_error   text,
    triggered_at bigint,
    created_at   bigint NOT NULL,
    updated_at   bigint NOT NULL,
    -- Set exactly when the status is terminal; drives retention.
    finished_at  bigint,
    PRIMARY KEY (tenant, id)
);

-- "What is due next in partition p": an ordered range scan.
CREATE INDEX events_due ON events (partition, next_fire_at, tenant, id)
    WHERE next_fire_at IS NOT NULL;

-- Retention sweeps the oldest finished events first.
CREATE INDEX events_finished ON events (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE attempts (
    tenant      text COLLATE "C" NOT NULL,
    id          text COLLATE "C" NOT NULL,
    -- Insertion order: history is read oldest first.
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    version     text NOT NULL,
    number      bigint NOT NULL,
    started_at  bigint NOT NULL,
    duration_ms bigint NOT NULL,
    verdict     text NOT NULL CHECK (verdict IN ('delivered', 'retry', 'permanent')),
    http_status integer,
    error       text,
    PRIMARY KEY (tenant, id, seq)
);

CREATE TABLE partitions (
    partition        integer PRIMARY KEY,
    owner            text COLLATE "C",
    -- +1 on every change of owner; writes for the partition carry it.
    epoch            bigint NOT NULL DEFAULT 0,
    -- The owner's lease, renewed by the owner.
    lease_expires_at timestamptz,
    -- The new owner fires only after this: the previous owner's lease end.
    takeover_at      timestamptz
);

CREATE TABLE nodes (
    id           text COLLATE "C" PRIMARY KEY,
    address      text NOT NULL,
    heartbeat_at timestamptz NOT NULL
);

CREATE TABLE leader (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    holder     text COLLATE "C",
    term       bigint NOT NULL DEFAULT 0,
    expires_at timestamptz
);

INSERT INTO leader (singleton, holder, term, expires_at) VALUES (true, NULL, 0, NULL);
"#,
    },
    Migration {
        version: 2,
        apply: Apply::InTransaction,
        name: "partition hand-over: pending owner",
        sql: r#"
-- Set while the leader moves a partition away from a live owner: the owner
-- stops firing it, records its outcomes, then releases it to this node.
ALTER TABLE partitions ADD COLUMN pending_owner text COLLATE "C";
"#,
    },
    Migration {
        version: 3,
        apply: Apply::ConcurrentIndex {
            index: "events_by_status_time",
            prepare: None,
        },
        name: "listing index",
        // Every filtered listing (status and/or deliver_at window, in
        // (event_time, id) order; without a status, one range per status,
        // merged) reads only its page from this index. Engine-internal
        // events (ids that start with U+0001: schedules' control events)
        // are left out: `id >= ' '` holds for every client id (no control
        // characters) and for no internal one, and the listing statements
        // repeat it so that the planner may use this partial index.
        //
        // Released as a plain `CREATE INDEX` inside the one migration
        // transaction, which blocked every write to `events` (ingestion,
        // firing) while the index was built on a live cluster's table. It
        // is now built concurrently, outside a transaction; the resulting
        // index is the same, so databases migrated either way agree.
        sql: r#"CREATE INDEX CONCURRENTLY events_by_status_time
    ON events (tenant, status, event_time, id)
    WHERE id >= ' '"#,
    },
    Migration {
        version: 4,
        apply: Apply::InTransaction,
        name: "tenant signing secrets",
        // The tenant's Standard Webhooks secrets (`SigningSecrets` as
        // JSON); NULL for a tenant registered before signing existed.
        sql: r#"
ALTER TABLE tenants ADD COLUMN signing jsonb;
"#,
    },
    Migration {
        version: 5,
        apply: Apply::InTransaction,
        name: "api keys and audit log",
        // Keys are stored only as the SHA-256 of their secret; `tenant`
        // is NULL exactly for admin keys. The audit log is read in
        // (at, id) order and purged oldest first.
        sql: r#"
CREATE TABLE api_keys (
    id           text COLLATE "C" PRIMARY KEY,
    tenant       text COLLATE "C",
    role         text NOT NULL CHECK (role IN ('read', 'write', 'worker', 'admin')),
    hash         text NOT NULL UNIQUE,
    created_at   bigint NOT NULL,
    expires_at   bigint,
    last_used_at bigint
);

CREATE TABLE audit_log (
    at     bigint NOT NULL,
    id     text COLLATE "C" NOT NULL,
    actor  text NOT NULL,
    action text NOT NULL,
    tenant text,
    target text,
    PRIMARY KEY (at, id)
);
"#,
    },
    Migration {
        version: 6,
        apply: Apply::InTransaction,
        name: "bulk actions",
        // The record is `action` (a `BulkAction` as JSON); the other
        // columns mirror what statements filter and order by. Ids sort by
        // creation time (listings are newest first); runners look for
        // running actions; retention purges the oldest finished first.
        // `revision` is the compare-and-set token of every update.
        sql: r#"
CREATE TABLE bulk_actions (
    id          text COLLATE "C" PRIMARY KEY,
    tenant      text COLLATE "C" NOT NULL,
    state       text NOT NULL CHECK (state IN ('running', 'completed', 'cancelled', 'failed')),
    revision    bigint NOT NULL,
    finished_at bigint,
    action      jsonb NOT NULL
);

CREATE INDEX bulk_actions_by_tenant ON bulk_actions (tenant, id);
CREATE INDEX bulk_actions_running ON bulk_actions (id) WHERE state = 'running';
CREATE INDEX bulk_actions_finished ON bulk_actions (finished_at, id)
    WHERE finished_at IS NOT NULL;
"#,
    },
    Migration {
        version: 7,
        apply: Apply::InTransaction,
        name: "pull leases",
        // One row per event: its latest pull lease, as the JSON document
        // of `belfry_store::lease::LeaseDoc` (lease id, worker, times, how
        // it ended). Read and written only by key, under the event's row
        // lock; purged with the event.
        sql: r#"
CREATE TABLE leases (
    tenant text COLLATE "C" NOT NULL,
    id     text COLLATE "C" NOT NULL,
    lease  jsonb NOT NULL,
    PRIMARY KEY (tenant, id)
);
"#,
    },
    Migration {
        version: 8,
        apply: Apply::InTransaction,
        name: "pull settings of events",
        // An event's `EventSettings`: its named queue (rows written before
        // read as `default`), its attempt cap and its back-off (the
        // `Backoff` as JSON text); NULL: its tenant's. Constant defaults:
        // adding the columns rewrites no row.
        sql: r#"
ALTER TABLE events ADD COLUMN queue text NOT NULL DEFAULT 'default';
ALTER TABLE events ADD COLUMN max_attempts integer;
ALTER TABLE events ADD COLUMN backoff text;
"#,
    },
    Migration {
        version: 9,
        apply: Apply::ConcurrentIndex {
            index: "attempts_once",
            // Builds before this one recorded an attempt again when a
            // write that had committed answered an error and was retried:
            // the first entry of each (version, number) is kept.
            prepare: Some(
                r#"DELETE FROM attempts a USING attempts b
 WHERE a.tenant = b.tenant AND a.id = b.id AND a.version = b.version
   AND a.number = b.number AND a.number > 0 AND a.seq > b.seq"#,
            ),
        },
        name: "one history entry per attempt",
        // An attempt is identified by its version and number: recording it
        // again (a retried write) adds no entry (`ON CONFLICT DO NOTHING`
        // in `apply`). Builds before this one numbered stale attempts 0,
        // several per version; those entries are left as they are.
        sql: r#"CREATE UNIQUE INDEX CONCURRENTLY attempts_once
    ON attempts (tenant, id, version, number)
    WHERE number > 0"#,
    },
    Migration {
        version: 10,
        apply: Apply::InTransaction,
        name: "cluster secret",
        // The key nodes sign their calls to each other with: written once,
        // by the first node that joins (`coordinator::cluster_secret`).
        sql: r#"
CREATE TABLE cluster_secret (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    secret    bytea NOT NULL CHECK (length(secret) >= 32)
);
"#,
    },
    Migration {
        version: 11,
        apply: Apply::InTransaction,
        name: "revoked api keys",
        // The hash of every revoked key, so that its secret is never
        // stored again (a bootstrap key revoked, then seeded at the next
        // start). A revoked key's row still leaves `api_keys`, so builds
        // before this one agree on which keys are valid.
        sql: r#"
CREATE TABLE revoked_api_keys (
    hash text PRIMARY KEY,
    id   text COLLATE "C" NOT NULL
);
"#,
    },
    Migration {
        version: 12,
        apply: Apply::InTransaction,
        name: "delivery policy of events",
        // The `expired` status, and the rest of an event's `EventSettings`:
        // its attempt timeout and maximum age (ms) and its expiry instant
        // (ms since the epoch); NULL: its tenant's, else none. The new
        // check is NOT VALID: every existing row satisfies the old, narrower
        // one, and skipping the validation keeps the table lock short (new
        // writes are checked either way). Nullable columns without a
        // default rewrite no row.
        sql: r#"
ALTER TABLE events DROP CONSTRAINT events_status_check;
ALTER TABLE events ADD CONSTRAINT events_status_check CHECK (status IN
    ('scheduled', 'retrying', 'delivered', 'failed', 'missed', 'cancelled', 'expired')) NOT VALID;
ALTER TABLE events ADD COLUMN attempt_timeout_ms bigint;
ALTER TABLE events ADD COLUMN expire_at bigint;
ALTER TABLE events ADD COLUMN max_age_ms bigint;
"#,
    },
    Migration {
        version: 13,
        apply: Apply::InTransaction,
        name: "tenant pause",
        // A tenant's `TenantPause` as JSON; NULL: never paused. Beside the
        // config, never written by a config write (`put_tenant` sets only
        // `sink`, `signing` and `notify`), and removed with the row.
        sql: r#"
ALTER TABLE tenants ADD COLUMN pause jsonb;
"#,
    },
    Migration {
        version: 14,
        apply: Apply::InTransaction,
        name: "tenant notice target",
        // The tenant's `NotifyTarget` as JSON; NULL: no notices. Part of
        // the config: `put_tenant` writes it with `sink` and `signing`.
        sql: r#"
ALTER TABLE tenants ADD COLUMN notify jsonb;
"#,
    },
    Migration {
        version: 15,
        apply: Apply::InTransaction,
        name: "debounced events",
        // When an event's pending series of debounced writes began (ms
        // since the epoch); NULL: its last write was not debounced. A
        // nullable column without a default rewrites no row.
        sql: r#"
ALTER TABLE events ADD COLUMN debounce_since bigint;
"#,
    },
];

/// Applies the missing migrations and returns the database's partition
/// count: `requested` when this call created the schema, else the count
/// the database was created with.
///
/// # Errors
/// The database is unreachable, the schema is newer than this build, or a
/// migration failed (the migrations before it stay applied).
pub(crate) async fn migrate(
    client: &mut Client,
    requested: PartitionCount,
    clock: &dyn Clock,
) -> Result<PartitionCount, StoreError> {
    migrate_up_to(client, requested, i32::MAX, clock).await
}

/// [`migrate`], applying only the migrations up to version `last`: lets
/// tests build a database of an older schema. Not for production use.
///
/// # Errors
/// As [`migrate`].
#[doc(hidden)]
pub async fn migrate_up_to(
    client: &mut Client,
    requested: PartitionCount,
    last: i32,
    clock: &dyn Clock,
) -> Result<PartitionCount, StoreError> {
    lock(client, clock).await?;
    let result = migrate_locked(client, requested, last).await;
    let unlocked = client
        .execute(
            "SELECT pg_advisory_unlock($1, $2)",
            &[&MIGRATION_LOCK.0, &MIGRATION_LOCK.1],
        )
        .await
        .map_err(db_error);
    // If unlocking failed the connection is broken, and the server
    // releases the lock with the session; `connect` drops its pool on
    // error either way.
    let partitions = result?;
    unlocked?;
    Ok(partitions)
}

/// Takes [`MIGRATION_LOCK`] for the session, polling (see the module
/// doc): between tries this connection holds no snapshot.
async fn lock(client: &Client, clock: &dyn Clock) -> Result<(), StoreError> {
    let mut logged = false;
    loop {
        let locked: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock($1, $2)",
                &[&MIGRATION_LOCK.0, &MIGRATION_LOCK.1],
            )
            .await
            .map_err(db_error)?
            .get(0);
        if locked {
            return Ok(());
        }
        if !logged {
            tracing::info!("waiting for another node's schema migration");
            logged = true;
        }
        clock.sleep(LOCK_POLL).await;
    }
}

/// The body of [`migrate_up_to`], under [`MIGRATION_LOCK`].
async fn migrate_locked(
    client: &mut Client,
    requested: PartitionCount,
    last: i32,
) -> Result<PartitionCount, StoreError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS belfry_schema_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await
        .map_err(db_error)?;
    let applied: Vec<i32> = client
        .query("SELECT version FROM belfry_schema_migrations", &[])
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let newest_known = MIGRATIONS.last().map_or(0, |m| m.version);
    if let Some(newer) = applied.iter().copied().find(|v| *v > newest_known) {
        return Err(StoreError::Internal(format!(
            "the database schema is at version {newer}, newer than this build knows \
             ({newest_known}): upgrade belfry"
        )));
    }

    for migration in MIGRATIONS {
        if migration.version > last || applied.contains(&migration.version) {
            continue;
        }
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applying schema migration"
        );
        match migration.apply {
            Apply::InTransaction => {
                let tx = client.transaction().await.map_err(db_error)?;
                tx.batch_execute(migration.sql).await.map_err(db_error)?;
                record(&tx, migration).await?;
                tx.commit().await.map_err(db_error)?;
            }
            Apply::ConcurrentIndex { index, prepare } => {
                if let Some(prepare) = prepare {
                    client.batch_execute(prepare).await.map_err(db_error)?;
                }
                build_index_concurrently(&*client, migration.sql, index).await?;
                record(&*client, migration).await?;
            }
        }
    }

    // The partition count and the partition map are fixed at creation.
    let tx = client.transaction().await.map_err(db_error)?;
    let created = tx
        .execute(
            "INSERT INTO belfry_settings (singleton, partitions) VALUES (true, $1)
             ON CONFLICT (singleton) DO NOTHING",
            &[&i32::from(requested.get())],
        )
        .await
        .map_err(db_error)?;
    if created == 1 {
        tx.execute(
            "INSERT INTO partitions (partition)
             SELECT generate_series(0, $1 - 1)",
            &[&i32::from(requested.get())],
        )
        .await
        .map_err(db_error)?;
    }
    let stored: i32 = tx
        .query_one("SELECT partitions FROM belfry_settings", &[])
        .await
        .map_err(db_error)?
        .get(0);
    tx.commit().await.map_err(db_error)?;
    u16::try_from(stored)
        .ok()
        .and_then(PartitionCount::new)
        .ok_or_else(|| StoreError::Internal(format!("stored partition count {stored} is invalid")))
}

/// Runs `sql` (one `CREATE INDEX CONCURRENTLY` of `index`) outside a
/// transaction. An invalid index of that name, left by a build that failed
/// half-way, is dropped first; a valid one (a build whose record was lost)
/// is kept.
async fn build_index_concurrently(
    client: &Client,
    sql: &str,
    index: &str,
) -> Result<(), StoreError> {
    let existing = client
        .query_opt(
            "SELECT i.indisvalid
               FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relname = $1 AND n.nspname = current_schema()",
            &[&index],
        )
        .await
        .map_err(db_error)?
        .map(|row| row.get::<_, bool>(0));
    match existing {
        Some(true) => return Ok(()),
        Some(false) => {
            tracing::warn!(index, "dropping an invalid index a failed build left");
            client
                .batch_execute(&format!("DROP INDEX CONCURRENTLY {index}"))
                .await
                .map_err(db_error)?;
        }
        None => {}
    }
    // One statement in a simple query: no transaction block around it.
    client.batch_execute(sql).await.map_err(db_error)
}

/// Records `migration` as applied.
async fn record(
    client: &impl tokio_postgres::GenericClient,
    migration: &Migration,
) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO belfry_schema_migrations (version, name) VALUES ($1, $2)",
            &[&migration.version, &migration.name],
        )
        .await
        .map_err(db_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_in_version_order_and_online_ones_are_one_statement() {
        for (position, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(usize::try_from(migration.version), Ok(position + 1));
            if let Apply::ConcurrentIndex { index, .. } = migration.apply {
                // One statement: several in one simple query would form a
                // transaction block, which CONCURRENTLY refuses.
                assert!(!migration.sql.contains(';'), "{}", migration.name);
                let head: Vec<&str> = migration
                    .sql
                    .split_whitespace()
                    .filter(|word| *word != "UNIQUE")
                    .take(4)
                    .collect();
                assert_eq!(head, ["CREATE", "INDEX", "CONCURRENTLY", index]);
            }
        }
    }
}
