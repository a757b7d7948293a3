//! Belfry's PostgreSQL backend: the [`Store`] of a cluster, its
//! [`Coordinator`] (membership, leader lease, fenced partition ownership),
//! and cross-node wake-ups over LISTEN/NOTIFY.
//!
//! # Layout
//! - this file: [`PostgresOptions`], [`PostgresStore`] (connect, its two pools) and
//!   the read side of [`Store`];
//! - [`schema`](crate::schema): versioned migrations applied at connect;
//! - `apply`: the write path, one transaction per [`Store::apply`];
//! - `auth`: API keys and the audit log;
//! - `bulk`: bulk actions, with their compare-and-set;
//! - `coordinator`: the [`Coordinator`] contract on the database clock,
//!   with the node's presence session;
//! - [`wakeups`]: NOTIFY payloads and the LISTEN connection;
//! - `rows`: row ↔ domain conversions and `unnest` column arrays;
//! - `cached`: prepared statements cached per connection, run with store
//!   errors;
//! - `primary`: timeouts, and following the primary when it moves;
//! - [`tls`]: TLS with libpq's `sslmode` and `sslrootcert`, for every
//!   connection;
//! - `error`: which failures are `Unavailable` (→ 503) and which are not.
//!
//! # Guarantees
//! - `apply` is durable on `Ok`: each connection runs with
//!   `synchronous_commit = on`, whatever the server's default.
//! - A database that is down or restarting gives
//!   [`StoreError::Unavailable`]; the pool opens new connections by itself
//!   when it is back.
//! - Every operation is bounded in time; a write that times out or meets a
//!   read-only server drops every connection so that they reconnect to the
//!   primary (`primary`: following a replicated database's primary).
//! - Every ordering on names is byte-wise (`COLLATE "C"`), as in Rust.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use belfry_core::auth::{ApiKey, AuditEntry, KeyHash, KeyId};
use belfry_core::bulk::{BulkAction, BulkActionId};
use belfry_core::event::{Attempt, EventRecord, EventStatus};
use belfry_core::{
    Clock, DueCursor, EventKey, PartitionCount, TenantConfig, TenantName, TenantPause, Timestamp,
};
use belfry_store::cluster::Coordinator;
use belfry_store::{
    Applied, ApplyParams, AuditPageParams, ChangeLeaseParams, ChangeLeasesParams,
    CountEventsParams, DuePageParams, LeaseWriteOutcome, ListBulkActionsParams, ListEventsParams,
    PurgeBulkActionsParams, PurgeParams, RecordLeasesParams, RunningBulkActionsParams, Store,
    StoreResult, StoreStats, StoredLease,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::mpsc;

mod apply;
mod auth;
mod bulk;
mod cached;
mod coordinator;
mod error;
mod leases;
mod notices;
mod primary;
mod rows;
pub mod schema;
pub mod tls;
pub mod wakeups;

pub use belfry_store::StoreError;
pub use wakeups::{Wakeup, WakeupKind};

use crate::cached::Params;
use crate::error::{corrupt, db_error, pool_error};
use crate::primary::{Access, Primary};
use crate::rows::{EVENT_COLUMNS, JsonText, attempt_from_row, cursor_from_row, record_from_row};

/// Every connection's settings. Durability must not depend on the server's
/// defaults. Bitmap scans are off because every statement here is a key
/// lookup or a page of an ordered index range: with stale statistics (a
/// table that grew since its last ANALYZE) the planner answered a
/// 128-entry due page with a bitmap scan of the partition's whole due
/// range and a sort, 4,105 rows read and 165 ms.
const SESSION_SETTINGS: &str = "-c synchronous_commit=on -c enable_bitmapscan=off";

/// A page of one partition's due index: `$1` partition, `$2` through
/// (inclusive), `$3..$5` the exclusive cursor, `$6` limit, `$7` only this
/// tenant (or NULL), `$8` tenants to leave out.
const DUE_PAGE_SQL: &str = "SELECT next_fire_at, tenant, id FROM events
     WHERE partition = $1 AND next_fire_at IS NOT NULL
       AND next_fire_at <= $2
       AND (next_fire_at, tenant, id) > ($3, $4, $5)
       AND ($7::text IS NULL OR tenant = $7)
       AND tenant <> ALL($8::text[])
     ORDER BY next_fire_at, tenant, id LIMIT $6";

/// How long to wait for a pooled connection, or for a new one, before
/// answering `Unavailable`: a caller must not hang while the database is
/// down.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Ends a tenant write (a CTE `written` returning the names written): one
/// notification per tenant on [`belfry_store::cluster::TENANT_CHANNEL`],
/// sent when the write commits, and how many rows were written.
const ANNOUNCE_TENANT: &str = "SELECT count(pg_notify('belfry_tenants', name)) FROM written";

/// The rows an [`ANNOUNCE_TENANT`] write counted.
fn announced(rows: &[tokio_postgres::Row]) -> i64 {
    rows.first().map_or(0, |row| row.get(0))
}

/// Connections kept for the cluster coordinator alone, beside the pool
/// the data path shares. A membership round must renew the node's leases
/// within the lease TTL or the node stops firing, so it must never wait
/// behind event reads and writes (a failed-over node's workers repeating
/// their calls can fill any pool). One for the round, one for a hand-over
/// releasing partitions meanwhile, one for evicting a crashed node.
const COORDINATION_CONNECTIONS: usize = 3;

/// Queued wake-ups per subscriber before the listener waits (the server
/// buffers meanwhile), so memory stays bounded.
const WAKEUP_QUEUE: usize = 4_096;

/// How to reach the database and size the node's use of it.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user:password@host:port/database?options`; TLS as
    /// libpq's `sslmode` and `sslrootcert` options say ([`tls`]).
    pub url: String,
    /// Used only when this connect creates the schema; an existing
    /// database keeps the count it was created with.
    pub partitions: PartitionCount,
    /// Connections in the data pool. The LISTEN connection, the presence
    /// session and the coordinator's own connections (three) are extra.
    pub pool_size: usize,
    /// Client changes of events due up to `now + notify_horizon +
    /// clock_skew_margin` are announced to the partition owner; set it to
    /// the engine's window.
    pub notify_horizon: Duration,
    /// How far the nodes' clocks may disagree. The writer measures the
    /// horizon on its clock, the owner its window on its own: a writer
    /// whose clock lags the owner's by up to this margin still announces
    /// an event at the far edge of the owner's window, which the owner
    /// already paged past and would otherwise not see until a repair page
    /// reaches it ([`wakeups`] has the numbers behind this choice).
    /// [`DEFAULT_CLOCK_SKEW_MARGIN`] unless configured.
    pub clock_skew_margin: Duration,
    /// Times commits and paces reconnects and lock polls.
    pub clock: Arc<dyn Clock>,
}

/// The default [`PostgresOptions::clock_skew_margin`]: far more than the
/// skew of NTP-synchronised nodes, little enough that few extra changes are
/// announced (those due within 5 s past the window).
pub const DEFAULT_CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(5);

/// The PostgreSQL store; cheap to share behind an `Arc`.
pub struct PostgresStore {
    /// Event, lease, tenant and key reads and writes.
    pool: Pool,
    /// The [`Coordinator`]'s membership, leadership and ownership calls
    /// (see [`COORDINATION_CONNECTIONS`]).
    coordination: Pool,
    partitions: PartitionCount,
    /// `notify_horizon + clock_skew_margin` of the options.
    notify_horizon: Duration,
    /// For the dedicated LISTEN and presence connections.
    config: tokio_postgres::Config,
    /// The TLS of every connection, pooled or not.
    tls: tls::MakeTls,
    /// This node's presence session, once [`Coordinator::presence`] opened
    /// it; dropping the store closes it.
    presence: tokio::sync::Mutex<Option<coordinator::PresenceSession>>,
    /// Whether the connections lead to a server that takes writes.
    primary: Arc<Primary>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config holds the password: show only where we connect.
        f.debug_struct("PostgresStore")
            .field("hosts", &self.config.get_hosts())
            .field("database", &self.config.get_dbname())
            .field("partitions", &self.partitions)
            .field("sslmode", &self.tls.mode())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects, applies the schema migrations (safe when several nodes
    /// start at once) and reads the partition count.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be reached;
    /// [`StoreError::Internal`] for a malformed URL, an unreadable
    /// `sslrootcert` or a failed migration. A TLS handshake that fails (no
    /// TLS on the server under `sslmode=require`, a certificate refused
    /// under `verify-*`) is `Unavailable`, saying why.
    pub async fn connect(options: PostgresOptions) -> StoreResult<PostgresStore> {
        let (mut config, tls) = tls::parse_url(&options.url).map_err(StoreError::Internal)?;
        // After the URL's own `options`, so ours win where both set one.
        let settings = match config.get_options() {
            Some(given) => format!("{given} {SESSION_SETTINGS}"),
            None => SESSION_SETTINGS.to_string(),
        };
        config.options(&settings);
        if config.get_application_name().is_none() {
            config.application_name("belfry");
        }
        config.connect_timeout(CONNECTION_TIMEOUT);
        // Notice a silently dead peer (cut network) on idle connections.
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(10));
        config.keepalives_interval(Duration::from_secs(5));
        config.keepalives_retries(3);

        let primary = Arc::new(Primary::new());
        let connect = || notices::NoticesByLevel { tls: tls.clone() };
        let manager = Manager::from_connect(config.clone(), connect(), manager_config());
        let pool = pool_of(manager, options.pool_size.max(1), &primary)?;
        let coordination = pool_of(
            Manager::from_connect(config.clone(), connect(), manager_config()),
            COORDINATION_CONNECTIONS,
            &primary,
        )?;
        let mut client = pool.get().await.map_err(pool_error)?;
        let partitions = schema::migrate(&mut client, options.partitions, &*options.clock).await?;
        drop(client);
        Ok(PostgresStore {
            pool,
            coordination,
            partitions,
            notify_horizon: options
                .notify_horizon
                .saturating_add(options.clock_skew_margin),
            config,
            tls,
            presence: tokio::sync::Mutex::new(None),
            primary,
            clock: options.clock,
        })
    }

    /// Wake-ups for near-term changes made anywhere in the cluster, from a
    /// dedicated LISTEN connection that reconnects after errors. The stream
    /// begins with [`Wakeup::Resync`] and repeats it after every reconnect
    /// (see [`wakeups`]). Dropping the receiver stops the listener.
    ///
    /// # Panics
    /// Outside a tokio runtime (the listener is a spawned task).
    pub fn subscribe_wakeups(&self) -> mpsc::Receiver<Wakeup> {
        let (sender, receiver) = mpsc::channel(WAKEUP_QUEUE);
        tokio::spawn(wakeups::listen(
            self.config.clone(),
            self.tls.clone(),
            sender,
            self.primary.losses(),
            self.clock.clone(),
        ));
        receiver
    }

    /// Runs one operation of the store under [`Primary::guard`]: bounded
    /// in time, and a sign that the connections lead to a server that takes
    /// no writes drops them all.
    async fn guarded<T>(
        &self,
        access: Access,
        operation: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        self.primary
            .guard(access, &[&self.pool, &self.coordination], operation)
            .await
    }

    async fn client(&self) -> StoreResult<deadpool_postgres::Object> {
        self.pool.get().await.map_err(pool_error)
    }

    /// A connection of the coordinator's own pool.
    async fn coordination_client(&self) -> StoreResult<deadpool_postgres::Object> {
        self.coordination.get().await.map_err(pool_error)
    }
}

/// One event, read on a connection the caller holds. A call that already
/// holds a connection reads through it: asking the pool for a second one
/// waits for itself, and once as many such calls run as the pool has
/// connections, all of them time out.
pub(crate) async fn read_event(
    client: &impl deadpool_postgres::GenericClient,
    key: &EventKey,
) -> StoreResult<Option<EventRecord>> {
    let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE tenant = $1 AND id = $2");
    cached::query(client, &sql, &[&key.tenant.as_str(), &key.id.as_str()])
        .await?
        .first()
        .map(record_from_row)
        .transpose()
}

/// The tenants and ids of `keys`, as two `text[]` parameters for `unnest`.
fn key_columns(keys: &[EventKey]) -> (Vec<&str>, Vec<&str>) {
    keys.iter()
        .map(|key| (key.tenant.as_str(), key.id.as_str()))
        .unzip()
}

fn manager_config() -> ManagerConfig {
    ManagerConfig {
        // A broken connection is noticed by the driver; checking each one
        // with a query would cost a round trip per call.
        recycling_method: RecyclingMethod::Fast,
    }
}

/// A pool of up to `size` connections that waits at most
/// [`CONNECTION_TIMEOUT`] for one, and never hands out a connection made
/// before the primary was last lost ([`Primary::lost`]).
fn pool_of(manager: Manager, size: usize, primary: &Arc<Primary>) -> StoreResult<Pool> {
    let primary = Arc::clone(primary);
    Pool::builder(manager)
        .max_size(size)
        .pre_recycle(deadpool_postgres::Hook::sync_fn(move |_, metrics| {
            if primary.is_stale(metrics.created) {
                Err(deadpool_postgres::HookError::message(
                    "made before the primary was lost",
                ))
            } else {
                Ok(())
            }
        }))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(CONNECTION_TIMEOUT))
        .create_timeout(Some(CONNECTION_TIMEOUT))
        .recycle_timeout(Some(CONNECTION_TIMEOUT))
        .build()
        .map_err(|e| StoreError::Internal(format!("cannot build the connection pool: {e}")))
}

/// One listing's statement and parameters.
///
/// | filters | statement | index |
/// |---|---|---|
/// | none | `tenant = $1 [AND id > $a] ORDER BY id` | primary key |
/// | `status` (and maybe `from`/`to`) | `… AND status = $s AND (event_time, id) > (position, $a) [AND event_time < $to] ORDER BY event_time, id` | `events_by_status_time` |
/// | `from`/`to` only | the same per status (each `LIMIT`ed), `UNION ALL`, merged by `ORDER BY event_time, id` | `events_by_status_time` (a Merge Append) |
///
/// The position of a time-ordered page is the later of `from` and the
/// stored instant of `after` (a `WITH` evaluated once), as
/// [`ListEventsParams`] specifies. Filtered statements repeat the index's
/// predicate `id >= ' '` (client ids only), so the partial index applies.
/// Each shape has its own text, so a prepared (generic) plan never has to
/// serve a filter it was not made for: `$x IS NULL OR …` conditions would
/// keep the planner from bounding the index range with them.
struct Listing {
    sql: String,
    args: Vec<ListingArg>,
}

enum ListingArg {
    Text(String),
    Int(i64),
}

impl Listing {
    /// `None` when the answer is empty without asking (limit 0, or a
    /// window that ends where it starts).
    fn of(params: &ListEventsParams) -> Option<Listing> {
        if params.limit == 0 {
            return None;
        }
        if let (Some(from), Some(to)) = (params.from, params.to)
            && from >= to
        {
            return None;
        }
        let mut listing = Listing {
            sql: String::new(),
            args: Vec::new(),
        };
        let tenant = listing.arg(ListingArg::Text(params.tenant.as_str().to_string()));
        let after = params
            .after
            .as_ref()
            .map(|id| listing.arg(ListingArg::Text(id.as_str().to_string())));
        if params.status.is_none() && params.from.is_none() && params.to.is_none() {
            let mut sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE tenant = {tenant}");
            if let Some(after) = &after {
                sql.push_str(&format!(" AND id > {after}"));
            }
            let limit = listing.arg(ListingArg::Int(sql_limit(params.limit)));
            sql.push_str(&format!(" ORDER BY id LIMIT {limit}"));
            listing.sql = sql;
            return Some(listing);
        }
        let from = listing.arg(ListingArg::Int(
            params
                .from
                .unwrap_or(belfry_core::Timestamp::MIN)
                .as_millis(),
        ));
        let (prelude, lower) = match &after {
            Some(after) => (
                format!(
                    "WITH position AS (SELECT GREATEST({from}::bigint, \
                     (SELECT event_time FROM events WHERE tenant = {tenant} AND id = {after})) AS at) "
                ),
                format!("(event_time, id) > ((SELECT at FROM position), {after})"),
            ),
            None => (String::new(), format!("event_time >= {from}")),
        };
        let upper = match params.to {
            Some(to) => {
                let to = listing.arg(ListingArg::Int(to.as_millis()));
                format!(" AND event_time < {to}")
            }
            None => String::new(),
        };
        let limit = listing.arg(ListingArg::Int(sql_limit(params.limit)));
        let branch = |status: &str| {
            format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE tenant = {tenant} AND status = {status} \
                 AND id >= ' ' AND {lower}{upper} ORDER BY event_time, id LIMIT {limit}"
            )
        };
        listing.sql = match params.status {
            Some(status) => {
                let status = listing.arg(ListingArg::Text(status.as_str().to_string()));
                format!("{prelude}{}", branch(&status))
            }
            None => {
                // Each branch is sorted and limited by itself, so the
                // planner merges them (Merge Append) and reads each only as
                // far as the page needs; flattened branches without their
                // own ORDER BY were appended and sorted whole instead.
                let branches: Vec<String> = EventStatus::ALL
                    .iter()
                    .map(|status| format!("({})", branch(&format!("'{}'", status.as_str()))))
                    .collect();
                format!(
                    "{prelude}SELECT * FROM ({}) AS listed ORDER BY event_time, id LIMIT {limit}",
                    branches.join(" UNION ALL ")
                )
            }
        };
        Some(listing)
    }

    /// Adds a parameter; returns its placeholder.
    fn arg(&mut self, arg: ListingArg) -> String {
        self.args.push(arg);
        format!("${}", self.args.len())
    }

    fn args(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        self.args
            .iter()
            .map(|arg| match arg {
                ListingArg::Text(text) => text as &(dyn tokio_postgres::types::ToSql + Sync),
                ListingArg::Int(int) => int,
            })
            .collect()
    }
}

/// Rows read by the scans of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan:
/// for each node that scans a relation, the rows it returned plus those
/// its filters removed, times its loops.
fn rows_read(plan: &serde_json::Value) -> u64 {
    fn node(plan: &serde_json::Value) -> f64 {
        let number = |name: &str| plan.get(name).and_then(serde_json::Value::as_f64);
        let own = if plan.get("Relation Name").is_some() {
            let rows = number("Actual Rows").unwrap_or(0.0)
                + number("Rows Removed by Filter").unwrap_or(0.0)
                + number("Rows Removed by Index Recheck").unwrap_or(0.0);
            rows * number("Actual Loops").unwrap_or(1.0)
        } else {
            0.0
        };
        let children: f64 = plan
            .get("Plans")
            .and_then(serde_json::Value::as_array)
            .map_or(0.0, |plans| plans.iter().map(node).sum());
        own + children
    }
    // The output is an array holding one object whose "Plan" is the root.
    let total: f64 = plan
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.get("Plan"))
        .map(node)
        .sum();
    total.round() as u64
}

/// A `usize` limit as SQL's `LIMIT` (bigint).
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl Store for PostgresStore {
    fn partitions(&self) -> PartitionCount {
        self.partitions
    }

    fn write_blocked(&self) -> Option<&'static str> {
        self.primary.blocked().map(primary::Blocked::message)
    }

    async fn put_tenant(&self, tenant: TenantConfig) -> StoreResult<()> {
        self.guarded(Access::Write, async move {
            let sink = serde_json::to_string(&tenant.sink).map_err(|e| {
                StoreError::Internal(format!("cannot encode the tenant's sink: {e}"))
            })?;
            let signing = tenant
                .signing
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| {
                    StoreError::Internal(format!("cannot encode the tenant's secrets: {e}"))
                })?;
            let notify = tenant
                .notify
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| {
                    StoreError::Internal(format!("cannot encode the tenant's notice target: {e}"))
                })?;
            let sql = format!(
                "WITH written AS (
                   INSERT INTO tenants (name, sink, signing, notify)
                   VALUES ($1, $2::text::jsonb, $3::text::jsonb, $4::text::jsonb)
                   ON CONFLICT (name) DO UPDATE
                   SET sink = EXCLUDED.sink, signing = EXCLUDED.signing, notify = EXCLUDED.notify
                   RETURNING name)
                 {ANNOUNCE_TENANT}"
            );
            let params: &Params = &[&tenant.name.as_str(), &sink, &signing, &notify];
            cached::query(&self.client().await?, &sql, params).await?;
            Ok(())
        })
        .await
    }

    async fn record_leases(
        &self,
        params: RecordLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        self.guarded(Access::Write, leases::record_leases(self, params))
            .await
    }

    async fn change_lease(&self, params: ChangeLeaseParams) -> StoreResult<LeaseWriteOutcome> {
        self.guarded(Access::Write, leases::change_lease(self, params))
            .await
    }

    async fn change_leases(
        &self,
        params: ChangeLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        self.guarded(Access::Write, leases::change_leases(self, params))
            .await
    }

    async fn get_lease(&self, key: &EventKey) -> StoreResult<Option<StoredLease>> {
        self.guarded(Access::Read, leases::get_lease(self, key))
            .await
    }

    async fn get_tenant(&self, name: &TenantName) -> StoreResult<Option<TenantConfig>> {
        self.guarded(Access::Read, async move {
            let sql =
                "SELECT name, sink::text, signing::text, notify::text FROM tenants WHERE name = $1";
            cached::query(&self.client().await?, sql, &[&name.as_str()])
                .await?
                .first()
                .map(tenant_from_row)
                .transpose()
        })
        .await
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantConfig>> {
        self.guarded(Access::Read, async move {
            let sql =
                "SELECT name, sink::text, signing::text, notify::text FROM tenants ORDER BY name";
            cached::query(&self.client().await?, sql, &[])
                .await?
                .iter()
                .map(tenant_from_row)
                .collect()
        })
        .await
    }

    async fn delete_tenant(&self, name: &TenantName) -> StoreResult<bool> {
        self.guarded(Access::Write, async move {
            let sql = format!(
                "WITH written AS (DELETE FROM tenants WHERE name = $1 RETURNING name)
                 {ANNOUNCE_TENANT}"
            );
            let rows = cached::query(&self.client().await?, &sql, &[&name.as_str()]).await?;
            Ok(announced(&rows) > 0)
        })
        .await
    }

    async fn put_tenant_pause(&self, name: &TenantName, pause: TenantPause) -> StoreResult<bool> {
        self.guarded(Access::Write, async move {
            let pause = serde_json::to_string(&pause)
                .map_err(|e| StoreError::Internal(format!("cannot encode the pause: {e}")))?;
            let sql = format!(
                "WITH written AS (
                   UPDATE tenants SET pause = $2::text::jsonb WHERE name = $1 RETURNING name)
                 {ANNOUNCE_TENANT}"
            );
            let params: &Params = &[&name.as_str(), &pause];
            let rows = cached::query(&self.client().await?, &sql, params).await?;
            Ok(announced(&rows) > 0)
        })
        .await
    }

    async fn get_tenant_pause(&self, name: &TenantName) -> StoreResult<Option<TenantPause>> {
        self.guarded(Access::Read, async move {
            let sql = "SELECT pause::text FROM tenants WHERE name = $1";
            let rows = cached::query(&self.client().await?, sql, &[&name.as_str()]).await?;
            let pause: Option<String> = rows.first().and_then(|row| row.get(0));
            pause
                .map(|text| serde_json::from_str(&text))
                .transpose()
                .map_err(corrupt)
        })
        .await
    }

    async fn list_tenant_pauses(&self) -> StoreResult<Vec<(TenantName, TenantPause)>> {
        self.guarded(Access::Read, async move {
            let sql = "SELECT name, pause::text FROM tenants WHERE pause IS NOT NULL ORDER BY name";
            cached::query(&self.client().await?, sql, &[])
                .await?
                .iter()
                .map(|row| {
                    let name: String = row.get(0);
                    let pause: String = row.get(1);
                    Ok((
                        TenantName::new(name).map_err(corrupt)?,
                        serde_json::from_str(&pause).map_err(corrupt)?,
                    ))
                })
                .collect()
        })
        .await
    }

    async fn apply(&self, params: ApplyParams) -> StoreResult<Vec<Applied>> {
        // A hung server (stopped, cut off) must not hold callers forever:
        // the guard's timeout answers `Unavailable` (503), the outcome
        // being unknown.
        self.guarded(Access::Write, apply::apply(self, params))
            .await
    }

    async fn get_event(&self, key: &EventKey) -> StoreResult<Option<EventRecord>> {
        self.guarded(Access::Read, async move {
            read_event(&self.client().await?, key).await
        })
        .await
    }

    /// One query for all keys (the engine reads ahead whole rounds).
    async fn get_events(&self, keys: &[EventKey]) -> StoreResult<Vec<Option<EventRecord>>> {
        self.guarded(Access::Read, async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events \
                 WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
            );
            let (tenants, ids) = key_columns(keys);
            let rows = cached::query(&self.client().await?, &sql, &[&tenants, &ids]).await?;
            let mut found = std::collections::HashMap::with_capacity(rows.len());
            for row in &rows {
                let record = record_from_row(row)?;
                found.insert(record.key.clone(), record);
            }
            Ok(keys.iter().map(|key| found.get(key).cloned()).collect())
        })
        .await
    }

    async fn due_page(&self, params: DuePageParams) -> StoreResult<Vec<DueCursor>> {
        self.guarded(Access::Read, async move {
            if params.limit == 0 {
                return Ok(Vec::new());
            }
            let client = self.client().await?;
            let partition = i32::from(params.partition.0);
            let through = params.through.as_millis();
            let limit = sql_limit(params.limit);
            let tenant = params.tenant.as_ref().map(|t| t.as_str());
            // Filtered, not seeked past: the index is still walked through a
            // skipped tenant's entries, but they are neither fetched nor sent.
            let skip: Vec<&str> = params.skip_tenants.iter().map(|t| t.as_str()).collect();
            // `after` as a row value; none sorts before every real one.
            let (after_due, after_tenant, after_id) = match &params.after {
                Some(after) => (
                    after.due.as_millis(),
                    after.key.tenant.as_str(),
                    after.key.id.as_str(),
                ),
                None => (i64::MIN, "", ""),
            };
            let rows = cached::query(
                &client,
                DUE_PAGE_SQL,
                &[
                    &partition,
                    &through,
                    &after_due,
                    &after_tenant,
                    &after_id,
                    &limit,
                    &tenant,
                    &skip,
                ],
            )
            .await?;
            rows.iter().map(cursor_from_row).collect()
        })
        .await
    }

    /// One statement per shape of filters, each answered from an index
    /// range that stops at the page (see [`Listing`]).
    async fn list_events(&self, params: ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        self.guarded(Access::Read, async move {
            let Some(listing) = Listing::of(&params) else {
                return Ok(Vec::new());
            };
            cached::query(&self.client().await?, &listing.sql, &listing.args())
                .await?
                .iter()
                .map(record_from_row)
                .collect()
        })
        .await
    }

    /// The rows the listing's plan reads, from `EXPLAIN ANALYZE`: every
    /// row a scan of a table or index returned or filtered out.
    async fn list_events_reads(&self, params: ListEventsParams) -> StoreResult<Option<u64>> {
        self.guarded(Access::Read, async move {
            let Some(listing) = Listing::of(&params) else {
                return Ok(Some(0));
            };
            let client = self.client().await?;
            let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", listing.sql);
            let plan: JsonText = client
                .query_one(&explain, &listing.args())
                .await
                .map_err(db_error)?
                .get(0);
            let plan: serde_json::Value =
                serde_json::from_str(&plan.0).map_err(|e| corrupt(format_args!("plan: {e}")))?;
            Ok(Some(rows_read(&plan)))
        })
        .await
    }

    /// An index-only count on `events_by_status_time`, stopped by the
    /// inner `LIMIT`; `id >= ' '` leaves out engine-internal ids.
    async fn count_events(&self, params: CountEventsParams) -> StoreResult<u64> {
        self.guarded(Access::Read, async move {
            if params.at_most == 0 {
                return Ok(0);
            }
            let sql = "SELECT count(*) FROM (SELECT 1 FROM events \
                 WHERE tenant = $1 AND status = $2 AND id >= ' ' LIMIT $3) AS counted";
            let at_most = i64::try_from(params.at_most).unwrap_or(i64::MAX);
            let params: &Params = &[&params.tenant.as_str(), &params.status.as_str(), &at_most];
            let count: i64 = cached::query_one(&self.client().await?, sql, params)
                .await?
                .get(0);
            Ok(u64::try_from(count).unwrap_or(0))
        })
        .await
    }

    async fn attempts(&self, key: &EventKey, limit: usize) -> StoreResult<Vec<Attempt>> {
        self.guarded(Access::Read, async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let sql = "SELECT version, number, started_at, duration_ms, verdict, http_status, error
                 FROM attempts WHERE tenant = $1 AND id = $2 ORDER BY seq LIMIT $3";
            let params: &Params = &[&key.tenant.as_str(), &key.id.as_str(), &sql_limit(limit)];
            cached::query(&self.client().await?, sql, params)
                .await?
                .iter()
                .map(attempt_from_row)
                .collect()
        })
        .await
    }

    async fn purge_finished(&self, params: PurgeParams) -> StoreResult<usize> {
        self.guarded(Access::Write, async move {
            if params.limit == 0 {
                return Ok(0);
            }
            // Rows a concurrent apply holds are skipped (it may be reviving
            // them); the sweep takes them next time if they are still old.
            let sql = "WITH doomed AS (
                         SELECT tenant, id FROM events
                         WHERE finished_at < $1
                         ORDER BY finished_at LIMIT $2
                         FOR UPDATE SKIP LOCKED
                     ), gone AS (
                         DELETE FROM events e USING doomed d
                         WHERE e.tenant = d.tenant AND e.id = d.id
                         RETURNING e.tenant, e.id
                     ), history AS (
                         DELETE FROM attempts a USING gone g
                         WHERE a.tenant = g.tenant AND a.id = g.id
                     ), leases AS (
                         DELETE FROM leases l USING gone g
                         WHERE l.tenant = g.tenant AND l.id = g.id
                     )
                     SELECT count(*) FROM gone";
            let params: &Params = &[
                &params.finished_before.as_millis(),
                &sql_limit(params.limit),
            ];
            let purged: i64 = cached::query_one(&self.client().await?, sql, params)
                .await?
                .get(0);
            usize::try_from(purged).map_err(|_| corrupt(format_args!("purge count {purged}")))
        })
        .await
    }

    async fn delete_finished(&self, keys: &[EventKey]) -> StoreResult<Vec<bool>> {
        self.guarded(Access::Write, async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            // One statement, one transaction. A row a concurrent apply holds is
            // waited for and its status checked again once that commits (a
            // redrive makes it pending: kept).
            let sql = "WITH gone AS (
                         DELETE FROM events e
                         USING unnest($1::text[], $2::text[]) AS k(tenant, id)
                         WHERE e.tenant = k.tenant AND e.id = k.id
                           AND e.finished_at IS NOT NULL
                         RETURNING e.tenant, e.id
                     ), history AS (
                         DELETE FROM attempts a USING gone g
                         WHERE a.tenant = g.tenant AND a.id = g.id
                     ), leases AS (
                         DELETE FROM leases l USING gone g
                         WHERE l.tenant = g.tenant AND l.id = g.id
                     )
                     SELECT tenant, id FROM gone";
            let (tenants, ids) = key_columns(keys);
            let gone: std::collections::HashSet<(String, String)> =
                cached::query(&self.client().await?, sql, &[&tenants, &ids])
                    .await?
                    .iter()
                    .map(|row| (row.get(0), row.get(1)))
                    .collect();
            // A key named twice is deleted once; its repeat answers `false`.
            let mut answered = std::collections::HashSet::new();
            Ok(keys
                .iter()
                .map(|key| {
                    let pair = (key.tenant.as_str().to_string(), key.id.as_str().to_string());
                    gone.contains(&pair) && answered.insert(pair)
                })
                .collect())
        })
        .await
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        self.guarded(Access::Read, async move {
            let client = self.client().await?;
            let bytes: i64 = client
                .query_one("SELECT pg_database_size(current_database())", &[])
                .await
                .map_err(db_error)?
                .get(0);
            Ok(StoreStats {
                disk_bytes: u64::try_from(bytes).ok(),
            })
        })
        .await
    }

    async fn put_api_key(&self, key: ApiKey) -> StoreResult<bool> {
        self.guarded(Access::Write, self.auth_put_key(key)).await
    }

    async fn api_key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        self.guarded(Access::Read, self.auth_key_by_hash(hash))
            .await
    }

    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>> {
        self.guarded(Access::Read, self.auth_list_keys()).await
    }

    async fn delete_api_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>> {
        self.guarded(Access::Write, self.auth_delete_key(id)).await
    }

    async fn touch_api_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()> {
        self.guarded(Access::Write, self.auth_touch_key(id, at))
            .await
    }

    async fn append_audit(&self, entry: AuditEntry) -> StoreResult<()> {
        self.guarded(Access::Write, self.auth_append_audit(entry))
            .await
    }

    async fn list_audit(&self, params: AuditPageParams) -> StoreResult<Vec<AuditEntry>> {
        self.guarded(Access::Read, self.auth_list_audit(params))
            .await
    }

    async fn purge_audit(&self, before: Timestamp, limit: usize) -> StoreResult<usize> {
        self.guarded(Access::Write, self.auth_purge_audit(before, limit))
            .await
    }

    async fn create_bulk_action(&self, action: BulkAction) -> StoreResult<bool> {
        self.guarded(Access::Write, self.bulk_create(action)).await
    }

    async fn get_bulk_action(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        self.guarded(Access::Read, self.bulk_get(id)).await
    }

    async fn list_bulk_actions(
        &self,
        params: ListBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        self.guarded(Access::Read, self.bulk_list(params)).await
    }

    async fn running_bulk_actions(
        &self,
        params: RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        self.guarded(Access::Read, self.bulk_running(params)).await
    }

    async fn update_bulk_action(&self, action: BulkAction) -> StoreResult<Option<BulkAction>> {
        self.guarded(Access::Write, self.bulk_update(action)).await
    }

    async fn purge_bulk_actions(&self, params: PurgeBulkActionsParams) -> StoreResult<usize> {
        self.guarded(Access::Write, self.bulk_purge(params)).await
    }
}

fn tenant_from_row(row: &tokio_postgres::Row) -> StoreResult<TenantConfig> {
    let name: String = row.get(0);
    let sink: String = row.get(1);
    let signing: Option<String> = row.get(2);
    let notify: Option<String> = row.get(3);
    Ok(TenantConfig {
        name: TenantName::new(name).map_err(corrupt)?,
        sink: serde_json::from_str(&sink).map_err(corrupt)?,
        signing: signing
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(corrupt)?,
        notify: notify
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(corrupt)?,
    })
}

#[async_trait]
impl Coordinator for PostgresStore {
    async fn heartbeat(
        &self,
        node: &belfry_store::cluster::NodeInfo,
        ttl: Duration,
    ) -> StoreResult<Vec<belfry_store::cluster::NodeStatus>> {
        self.guarded(Access::Heartbeat, coordinator::heartbeat(self, node, ttl))
            .await
    }

    async fn leave(&self, node: &belfry_store::cluster::NodeId) -> StoreResult<()> {
        self.guarded(Access::Write, coordinator::leave(self, node))
            .await
    }

    async fn remove_dead_nodes(
        &self,
        ttl: Duration,
    ) -> StoreResult<Vec<belfry_store::cluster::NodeStatus>> {
        self.guarded(Access::Write, coordinator::remove_dead_nodes(self, ttl))
            .await
    }

    async fn claim_leadership(
        &self,
        node: &belfry_store::cluster::NodeId,
        ttl: Duration,
    ) -> StoreResult<belfry_store::cluster::LeaderLease> {
        self.guarded(
            Access::Write,
            coordinator::claim_leadership(self, node, ttl),
        )
        .await
    }

    async fn release_leadership(&self, node: &belfry_store::cluster::NodeId) -> StoreResult<()> {
        self.guarded(Access::Write, coordinator::release_leadership(self, node))
            .await
    }

    async fn assign(
        &self,
        leader: &belfry_store::cluster::NodeId,
        term: u64,
        owners: Vec<(belfry_core::PartitionId, belfry_store::cluster::NodeId)>,
    ) -> StoreResult<()> {
        self.guarded(
            Access::Write,
            coordinator::assign(self, leader, term, owners),
        )
        .await
    }

    async fn renew_ownership(
        &self,
        node: &belfry_store::cluster::NodeId,
        ttl: Duration,
    ) -> StoreResult<Vec<belfry_store::cluster::OwnedPartition>> {
        self.guarded(Access::Write, coordinator::renew_ownership(self, node, ttl))
            .await
    }

    async fn release_partitions(
        &self,
        node: &belfry_store::cluster::NodeId,
        partitions: &[(belfry_core::PartitionId, u64)],
    ) -> StoreResult<Vec<belfry_core::PartitionId>> {
        self.guarded(
            Access::Write,
            coordinator::release_partitions(self, node, partitions),
        )
        .await
    }

    async fn assignments(&self) -> StoreResult<Vec<belfry_store::cluster::PartitionAssignment>> {
        self.guarded(Access::Read, coordinator::assignments(self))
            .await
    }

    async fn leader(&self) -> StoreResult<Option<belfry_store::cluster::LeaderLease>> {
        self.guarded(Access::Read, coordinator::leader(self)).await
    }

    async fn presence(
        &self,
        node: &belfry_store::cluster::NodeId,
    ) -> StoreResult<Vec<belfry_store::cluster::NodePresence>> {
        coordinator::presence(self, node).await
    }

    async fn evict(
        &self,
        node: &belfry_store::cluster::NodeId,
    ) -> StoreResult<Option<belfry_store::cluster::Eviction>> {
        coordinator::evict(self, node).await
    }

    async fn announce_pull_ready(
        &self,
        node: &belfry_store::cluster::NodeId,
        tenants: &[belfry_core::TenantName],
    ) -> StoreResult<()> {
        self.guarded(
            Access::Write,
            coordinator::announce_pull_ready(self, node, tenants),
        )
        .await
    }

    async fn cluster_secret(&self, candidate: &[u8]) -> StoreResult<Vec<u8>> {
        self.guarded(Access::Write, coordinator::cluster_secret(self, candidate))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table filled since its last ANALYZE (here: never analyzed) made
    /// the planner read a partition's whole due range for one page.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_due_page_is_read_in_index_order_however_stale_the_statistics() {
        let url = belfry_testkit::PgServer::shared().fresh_database().await;
        // Options of the URL's own are kept beside the store's.
        let separator = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{separator}options=-c%20work_mem%3D5MB");
        let store = PostgresStore::connect(PostgresOptions {
            url,
            partitions: PartitionCount::new(4).expect("a partition count"),
            pool_size: 1,
            notify_horizon: Duration::from_secs(60),
            clock_skew_margin: DEFAULT_CLOCK_SKEW_MARGIN,
            clock: Arc::new(belfry_clock::SystemClock),
        })
        .await
        .expect("connect to the test database");
        let client = store.client().await.expect("a connection");
        for (setting, expected) in [("work_mem", "5MB"), ("enable_bitmapscan", "off")] {
            let row = client
                .query_one(&format!("SHOW {setting}"), &[])
                .await
                .expect("show a setting");
            assert_eq!(row.get::<_, String>(0), expected, "{setting}");
        }
        client
            .batch_execute(
                "INSERT INTO events (tenant, id, partition, version, event_time, delivery,
                     status, next_fire_at, attempts, created_at, updated_at)
                 SELECT 'bench', 'e' || g, g % 4, 'v1', 1000 + g, 'FULL_EVENT',
                     'scheduled', 1000 + g, 0, 0, 0
                 FROM generate_series(1, 20000) AS g",
            )
            .await
            .expect("fill the due index");
        let skip: Vec<&str> = Vec::new();
        let plan: Vec<String> = client
            .query(
                &format!("EXPLAIN {DUE_PAGE_SQL}"),
                &[
                    &1_i32,
                    &100_000_i64,
                    &2_000_i64,
                    &"bench",
                    &"e1",
                    &128_i64,
                    &None::<&str>,
                    &skip,
                ],
            )
            .await
            .expect("explain a due page")
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("Bitmap"), "{plan}");
        assert!(plan.contains("Index Only Scan using events_due"), "{plan}");
    }
}
