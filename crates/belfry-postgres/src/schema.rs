//! Versioned schema migrations, applied at connect.
//!
//! Every node runs [`migrate`] when it starts. The whole run is one
//! transaction that first takes a transaction-scoped advisory lock, so nodes
//! starting at once apply each migration exactly once: the others wait, then
//! find it recorded in `belfry_schema_migrations`. Migrations are append-only:
//! a released one is never edited, a change is a new version.
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

use belfry_core::PartitionCount;
use deadpool_postgres::Client;

use crate::error::{StoreError, db_error};

/// Key of the advisory lock that serializes migrations (two-int form, so it
/// cannot collide with single-bigint advisory locks used by anyone else):
/// `'belf'` and 1.
const MIGRATION_LOCK: (i32, i32) = (0x6265_6c66, 1);

/// One schema change.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in version order.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
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
        name: "partition hand-over: pending owner",
        sql: r#"
-- Set while the leader moves a partition away from a live owner: the owner
-- stops firing it, records its outcomes, then releases it to this node.
ALTER TABLE partitions ADD COLUMN pending_owner text COLLATE "C";
"#,
    },
    Migration {
        version: 3,
        name: "listing index",
        // Every filtered listing (status and/or deliver_at window, in
        // (event_time, id) order; without a status, one range per status,
        // merged) reads only its page from this index. Engine-internal
        // events (ids that start with U+0001: schedules' control events)
        // are left out: `id >= ' '` holds for every client id (no control
        // characters) and for no internal one, and the listing statements
        // repeat it so that the planner may use this partial index. Built
        // inside the migration transaction, which blocks writes to `events`
        // meanwhile.
        sql: r#"
CREATE INDEX events_by_status_time ON events (tenant, status, event_time, id)
    WHERE id >= ' ';
"#,
    },
    Migration {
        version: 4,
        name: "tenant signing secrets",
        // The tenant's Standard Webhooks secrets (`SigningSecrets` as
        // JSON); NULL for a tenant registered before signing existed.
        sql: r#"
ALTER TABLE tenants ADD COLUMN signing jsonb;
"#,
    },
    Migration {
        version: 5,
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
];

/// Applies the missing migrations and returns the database's partition
/// count: `requested` when this call created the schema, else the count
/// the database was created with.
///
/// # Errors
/// The database is unreachable, or a migration failed (nothing of this run
/// is applied then).
pub(crate) async fn migrate(
    client: &mut Client,
    requested: PartitionCount,
) -> Result<PartitionCount, StoreError> {
    let tx = client.transaction().await.map_err(db_error)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, $2)",
        &[&MIGRATION_LOCK.0, &MIGRATION_LOCK.1],
    )
    .await
    .map_err(db_error)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS belfry_schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(db_error)?;
    let applied: Vec<i32> = tx
        .query("SELECT version FROM belfry_schema_migrations", &[])
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for migration in MIGRATIONS {
        if applied.contains(&migration.version) {
            continue;
        }
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applying schema migration"
        );
        tx.batch_execute(migration.sql).await.map_err(db_error)?;
        tx.execute(
            "INSERT INTO belfry_schema_migrations (version, name) VALUES ($1, $2)",
            &[&migration.version, &migration.name],
        )
        .await
        .map_err(db_error)?;
    }
    let newest_known = MIGRATIONS.last().map_or(0, |m| m.version);
    if let Some(newer) = applied.iter().copied().find(|v| *v > newest_known) {
        return Err(StoreError::Internal(format!(
            "the database schema is at version {newer}, newer than this build knows \
             ({newest_known}): upgrade belfry"
        )));
    }

    // The partition count and the partition map are fixed at creation.
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
