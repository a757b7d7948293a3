//! Belfry's storage: narrow async traits, one params struct per operation,
//! and one conformance suite that every backend runs.
//!
//! # Layout
//! - this file: the [`Store`] trait, its params and errors;
//! - [`embedded`]: the default backend, on fjall (an LSM tree) in a data
//!   directory, with group commit;
//! - [`conformance`] (feature `conformance`): the suite every backend passes.
//!
//! # Contract shared by every backend
//! - [`Store::apply`] is atomic per command and durable when it returns `Ok`
//!   (fsynced); backends share one fsync among concurrent callers (group
//!   commit). Each command is a read-modify-write through
//!   [`belfry_core::event::transition`], so the state machine lives in one
//!   place and backends only persist its result.
//! - A call is all-or-nothing on PostgreSQL (one transaction), but not on
//!   the embedded store, which commits a call's commands in independent
//!   parts (one per writer shard). When some parts commit and others fail,
//!   `apply` answers [`StoreError::Partial`] with every command's own
//!   result, so callers route the effects of what did commit and answer
//!   each item truthfully. Any other error acknowledges nothing, but a
//!   failed command may still have taken effect (a commit whose
//!   confirmation was lost): callers must not say "nothing was changed".
//! - The due index holds exactly the pending events, keyed by
//!   `(partition, next_fire_at, key)`; [`Store::due_page`] reads it in that
//!   order with an exclusive cursor.
//! - Commands made on behalf of a partition owner carry a [`Fence`]; a
//!   backend that supports several owners rejects a stale epoch with
//!   [`StoreError::Fenced`]. The embedded backend has a single owner and
//!   accepts every fence.

use std::sync::Arc;

use async_trait::async_trait;
use belfry_core::auth::{ApiKey, AuditEntry, KeyHash, KeyId};
use belfry_core::bulk::{BulkAction, BulkActionId};
use belfry_core::event::{
    Attempt, CommandOutcome, Effect, EventCommand, EventRecord, EventStatus, Replaced,
};
use belfry_core::pull::{LeaseChange, LeaseId, LeaseRecord, PersistResult, Resolution};
use belfry_core::{
    DueCursor, EventId, EventKey, PartitionCount, PartitionId, RetryPolicy, TenantConfig,
    TenantName, TenantPause, Timestamp,
};

pub mod cluster;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod embedded;
pub mod interpose;
pub mod lease;

pub use embedded::{EmbeddedOptions, EmbeddedStore};

/// A store shared by every component of a node.
pub type SharedStore = Arc<dyn Store>;

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend cannot serve right now (database down, shutting down).
    /// Callers answer 503 and must not claim success.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A write for `partition` carried an epoch that is no longer current.
    #[error("partition {partition} is owned under a newer epoch than {epoch}")]
    Fenced { partition: PartitionId, epoch: u64 },
    /// Stored bytes could not be decoded, or an I/O error.
    #[error("store failure: {0}")]
    Internal(String),
    /// Only from [`Store::apply`]: some commands were applied (durably)
    /// and the others failed; the results of both are inside, per command.
    /// Never returned by an all-or-nothing backend.
    #[error(transparent)]
    Partial(PartialApply),
}

/// The per-command answer of an [`Store::apply`] that partly failed
/// ([`StoreError::Partial`]).
#[derive(Debug, Clone)]
pub struct PartialApply {
    /// In input order: what the command did (durable, as in an `Ok` of
    /// `apply`), or why it failed. A failed command is not acknowledged but
    /// may have taken effect (e.g. its part was written and the fsync
    /// failed). These errors are never `Partial` themselves.
    pub results: Vec<StoreResult<Applied>>,
}

impl PartialApply {
    /// The commands that were applied, in input order.
    pub fn applied(&self) -> impl Iterator<Item = &Applied> {
        self.results.iter().filter_map(|r| r.as_ref().ok())
    }

    /// The first failure (every part that failed has at least one command).
    pub fn first_error(&self) -> Option<&StoreError> {
        self.results.iter().find_map(|r| r.as_ref().err())
    }
}

impl std::fmt::Display for PartialApply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let failed = self.results.iter().filter(|r| r.is_err()).count();
        write!(
            f,
            "{} of {} commands applied, {failed} failed",
            self.results.len() - failed,
            self.results.len()
        )?;
        if let Some(error) = self.first_error() {
            write!(f, ": {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PartialApply {}

/// Proof of ownership of a partition, carried by the owner's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub partition: PartitionId,
    pub epoch: u64,
}

/// One command for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedCommand {
    pub key: EventKey,
    pub command: EventCommand,
    /// Set by a partition owner (attempt outcomes, expiry); `None` for
    /// client requests, which any node may make.
    pub fence: Option<Fence>,
}

/// Parameters of [`Store::apply`].
#[derive(Debug, Clone)]
pub struct ApplyParams {
    pub commands: Vec<KeyedCommand>,
    /// The transition's "now"; injected so stores never read a clock.
    pub now: Timestamp,
    pub retry: RetryPolicy,
}

/// What applying one command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub key: EventKey,
    pub partition: PartitionId,
    pub outcome: CommandOutcome,
    /// The event's state after the command (`None` if it does not exist).
    pub record: Option<EventRecord>,
    /// What the engine must do about its timers.
    pub effects: Vec<Effect>,
    /// The version the command cancelled or moved, and how far its
    /// delivery had gone as the record showed ([`Replaced::of`]).
    pub replaced: Option<Replaced>,
}

/// Parameters of [`Store::due_page`].
#[derive(Debug, Clone)]
pub struct DuePageParams {
    pub partition: PartitionId,
    /// Exclusive; `None` starts at the beginning of time.
    pub after: Option<DueCursor>,
    /// Inclusive upper bound on `next_fire_at`.
    pub through: Timestamp,
    pub limit: usize,
    /// Only this tenant's events (a partition pages a tenant's backlog back
    /// in after evicting it). The scan may pass other tenants' entries.
    pub tenant: Option<TenantName>,
    /// Tenants whose entries may be left out: the caller does not hold
    /// them (their backlog overflows). A backend should not read through
    /// them: the embedded store seeks past each run of a skipped tenant's
    /// entries at one instant (a hung tenant's millions due at once cost
    /// one seek). Leaving them in is correct too, only slower.
    pub skip_tenants: Vec<TenantName>,
}

/// Parameters of [`Store::list_events`].
///
/// # Order and cursor
/// - Without filters: by event id, ascending; `after` is exclusive
///   (continue after this id).
/// - With any filter (`status`, `from`, `to`): by `(event_time, id)`,
///   ascending: the order of the one index that serves every filter, so
///   that a page never reads past itself and a status change moves a
///   single index entry. `after` is still the previous page's last id: the
///   listing continues after `(t, after)`, where `t` is the later of
///   `from` and that event's stored `event_time`. A caller that also
///   passes the last event's `event_time` as `from` (the API's cursor
///   does) keeps its place even if that event has been purged since.
///
/// # Bounded by the page
/// Backends answer every combination of filters from an index, reading
/// O(`limit`) entries, never the rest of the tenant; and a page holds
/// `limit` events unless none are left, so a short page is the last.
///
/// # Engine-internal events
/// Without filters the listing includes engine-internal ids
/// ([`EventId::is_internal`], sorted before every client id); with any
/// filter it holds client events only.
#[derive(Debug, Clone)]
pub struct ListEventsParams {
    pub tenant: TenantName,
    pub status: Option<EventStatus>,
    /// Inclusive lower bound on `event_time`.
    pub from: Option<Timestamp>,
    /// Exclusive upper bound on `event_time`.
    pub to: Option<Timestamp>,
    /// Exclusive cursor: the previous page's last id (see the order above).
    pub after: Option<EventId>,
    pub limit: usize,
}

/// Parameters of [`Store::count_events`].
#[derive(Debug, Clone)]
pub struct CountEventsParams {
    pub tenant: TenantName,
    pub status: EventStatus,
    /// Counting stops here: the answer is `min(count, at_most)`.
    pub at_most: u64,
}

/// Parameters of [`Store::purge_finished`].
#[derive(Debug, Clone)]
pub struct PurgeParams {
    /// Events that reached a terminal status before this instant go, with
    /// their attempt history.
    pub finished_before: Timestamp,
    pub limit: usize,
}

/// Parameters of [`Store::list_audit`]: entries in `(at, id)` order,
/// ascending, after the exclusive cursor.
#[derive(Debug, Clone)]
pub struct AuditPageParams {
    /// Exclusive: the previous page's last `(at, id)`.
    pub after: Option<(Timestamp, String)>,
    pub limit: usize,
}

/// Parameters of [`Store::list_bulk_actions`]: newest first (descending
/// id, which is creation order: see [`BulkActionId`]).
#[derive(Debug, Clone)]
pub struct ListBulkActionsParams {
    /// Only this tenant's actions; `None`: every tenant's.
    pub tenant: Option<TenantName>,
    /// Exclusive cursor: the previous page's last (oldest) id.
    pub before: Option<BulkActionId>,
    pub limit: usize,
}

/// Parameters of [`Store::running_bulk_actions`]: actions in state
/// `running`, oldest first (ascending id).
#[derive(Debug, Clone)]
pub struct RunningBulkActionsParams {
    /// Exclusive cursor: the previous page's last id.
    pub after: Option<BulkActionId>,
    pub limit: usize,
}

/// Parameters of [`Store::purge_bulk_actions`].
#[derive(Debug, Clone)]
pub struct PurgeBulkActionsParams {
    /// Actions that finished before this instant go.
    pub finished_before: Timestamp,
    pub limit: usize,
}

/// How a fenced lease write went ([`Store::record_leases`],
/// [`Store::change_lease`]). A store error is `Err` instead (the runtime
/// answers it as [`PersistResult::Unavailable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseWriteOutcome {
    /// Written (or already written exactly so: the call was a repeat).
    Done,
    /// Fenced: the partition's epoch moved, or the stored lease is not
    /// this one (superseded, never recorded, or ended differently).
    /// Nothing changed.
    Lost,
    /// The event is no longer pending at the lease's version (cancelled,
    /// moved, finished, gone). Nothing changed.
    Cancelled,
    /// Only from [`Store::record_leases`]: the event's current attempt
    /// already has this other lease recorded, not ended — an *orphan*,
    /// whose owner restarted or lost the partition while it was live (or
    /// the answer to its grant was lost). Nothing changed; the caller
    /// waits for its expiry and records it ([`LeaseChange::Expire`]).
    Orphaned(Box<LeaseRecord>),
}

impl From<LeaseWriteOutcome> for PersistResult {
    fn from(outcome: LeaseWriteOutcome) -> Self {
        match outcome {
            LeaseWriteOutcome::Done => PersistResult::Done,
            LeaseWriteOutcome::Lost => PersistResult::Lost,
            LeaseWriteOutcome::Cancelled => PersistResult::Cancelled,
            LeaseWriteOutcome::Orphaned(orphan) => PersistResult::Orphaned(orphan),
        }
    }
}

/// Parameters of [`Store::record_leases`]: the grants of one partition.
#[derive(Debug, Clone)]
pub struct RecordLeasesParams {
    /// The partition every grant's event belongs to, and the epoch they
    /// are granted under (each lease id carries it too).
    pub fence: Fence,
    pub grants: Vec<LeaseRecord>,
}

/// Parameters of [`Store::change_lease`].
#[derive(Debug, Clone)]
pub struct ChangeLeaseParams {
    /// The lease's partition and the epoch it was granted under.
    pub fence: Fence,
    pub lease: LeaseId,
    pub change: LeaseChange,
    /// The transition's "now" (the event's `updated_at`, `finished_at`);
    /// injected so stores never read a clock.
    pub at: Timestamp,
}

/// Parameters of [`Store::change_leases`]: changes of any leases, of any
/// partitions, written together.
#[derive(Debug, Clone, Default)]
pub struct ChangeLeasesParams {
    pub changes: Vec<ChangeLeaseParams>,
}

/// The lease recorded for an event (one per event: the latest grant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLease {
    /// As granted; `expires_at` as last extended.
    pub record: LeaseRecord,
    pub state: StoredLeaseState,
}

/// Where a recorded lease stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredLeaseState {
    /// Not ended: held until `record.expires_at` (the caller compares it
    /// with its clock; the store reads none).
    Live,
    /// Ended by its worker's call (a [`LeaseChange::Resolve`]), which the
    /// store applied to the event.
    Resolved(Resolution),
    /// Ended by its expiry (a [`LeaseChange::Expire`]: a failed attempt
    /// `lease_expired`, then a retry or the end), applied to the event.
    Expired(Resolution),
    /// Void without a resolve: the event is no longer pending at the
    /// lease's version (cancelled or moved), or its partition's epoch moved.
    Voided,
}

/// Size facts for operators and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub disk_bytes: Option<u64>,
}

#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The partition count fixed when the store was created.
    fn partitions(&self) -> PartitionCount;

    /// Why the store cannot take writes now, for operators (readiness, the
    /// log), while it knows it cannot: a replicated database whose
    /// connections lead to a read-only server, or whose commits hang. `None`
    /// when writes succeed or nothing is known against them.
    fn write_blocked(&self) -> Option<&'static str> {
        None
    }

    /// Registers or replaces a tenant. Durable on `Ok`.
    async fn put_tenant(&self, tenant: TenantConfig) -> StoreResult<()>;
    async fn get_tenant(&self, name: &TenantName) -> StoreResult<Option<TenantConfig>>;
    /// Every tenant, ordered by name.
    async fn list_tenants(&self) -> StoreResult<Vec<TenantConfig>>;
    /// Removes a tenant (not its events) and its pause state. Returns
    /// whether it existed.
    async fn delete_tenant(&self, name: &TenantName) -> StoreResult<bool>;
    /// Sets a tenant's pause state; `false`, and nothing written, if there
    /// is no such tenant. Kept apart from its config: [`Store::put_tenant`]
    /// leaves it as it is. Durable on `Ok`.
    async fn put_tenant_pause(&self, name: &TenantName, pause: TenantPause) -> StoreResult<bool>;
    /// A tenant's pause state; `None`: never paused since it was
    /// registered (or no such tenant).
    async fn get_tenant_pause(&self, name: &TenantName) -> StoreResult<Option<TenantPause>>;
    /// Every stored pause state (paused or resumed), ordered by tenant
    /// name.
    async fn list_tenant_pauses(&self) -> StoreResult<Vec<(TenantName, TenantPause)>>;

    /// Applies commands in order; durable on `Ok`. Results are in input order.
    ///
    /// # Errors
    /// [`StoreError::Fenced`] if any command's fence is stale (then nothing
    /// of the batch is applied). [`StoreError::Partial`] if some commands
    /// were applied and others failed (backends that commit a call in
    /// parts; see the crate docs). Otherwise backend failures: nothing is
    /// acknowledged, though a command may have taken effect.
    async fn apply(&self, params: ApplyParams) -> StoreResult<Vec<Applied>>;

    async fn get_event(&self, key: &EventKey) -> StoreResult<Option<EventRecord>>;

    /// The records of `keys`, in the same order (`None`: no such event).
    /// For reading ahead many events at once; backends may do it in one
    /// round trip.
    async fn get_events(&self, keys: &[EventKey]) -> StoreResult<Vec<Option<EventRecord>>> {
        let mut records = Vec::with_capacity(keys.len());
        for key in keys {
            records.push(self.get_event(key).await?);
        }
        Ok(records)
    }

    // Pull leases (`belfry_core::pull`, `docs/pull.md`): one recorded lease
    // per event, written atomically with the event change it implies,
    // durable on `Ok`, and fenced like `apply` (the partition's epoch is
    // checked in the same transaction or writer group as the write).

    /// Records the grants of one partition; one outcome per grant, in
    /// order.
    ///
    /// # Contract
    /// A grant is recorded only while the partition's epoch is
    /// `fence.epoch` (else `Lost`), the event is pending at the lease's
    /// version (else `Cancelled`), no other lease of that version's
    /// current attempt (`attempts + 1`) is recorded and not ended — under
    /// any epoch, expired or not (else `Orphaned` with that lease: only
    /// its expiry, [`LeaseChange::Expire`], frees the attempt) — and the
    /// grant's attempt is `attempts + 1` (else `Lost`). Idempotent by
    /// lease id: recording a lease that is already recorded and not ended
    /// answers `Done` and changes nothing (ended: `Lost`). Of concurrent
    /// grants of one version, at most one is `Done`.
    ///
    /// # Errors
    /// Backend failures: nothing is acknowledged, though the write may
    /// have taken effect (a repeat then answers `Done`).
    async fn record_leases(
        &self,
        params: RecordLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>>;

    /// Extends or resolves the recorded lease.
    ///
    /// # Contract
    /// Fenced by the partition's epoch and by the lease id (nonce
    /// included): any other epoch or lease is `Lost`; an event no longer
    /// pending at the lease's version is `Cancelled` (a cancel or move
    /// through [`Store::apply`] thereby ends the lease). A resolve moves
    /// the event like a push attempt does ([`belfry_core::event::transition`]):
    /// `Delivered` → delivered; `Retry { at }` → retrying, due at `at` (the
    /// due index follows); `Dead { reason }` → failed with `reason` as its
    /// last error; `Released { at }` → still pending, due at `at`, no
    /// attempt counted. The `report`, when given, goes into the attempt
    /// history with the next attempt number. Repeating the resolve a lease
    /// ended with answers `Done` and changes nothing; any other change of
    /// an ended lease is `Lost`. Extending a live lease sets its expiry.
    ///
    /// An expiry ([`LeaseChange::Expire`]) resolves the lease the same way
    /// (an attempt, then `Retry` or `Dead`) and is recorded only at or
    /// after the lease's recorded expiry (`at >= expires_at`, else
    /// `Lost`). Unlike every other change it may name a lease granted
    /// under an earlier epoch than `fence.epoch` (an orphan, expired by
    /// the partition's current owner: `fence.epoch` must still be
    /// current). The lease then reads [`StoredLeaseState::Expired`], so a
    /// worker's failure ([`StoredLeaseState::Resolved`]) is told from it.
    ///
    /// # Errors
    /// Backend failures, as for [`Store::record_leases`].
    async fn change_lease(&self, params: ChangeLeaseParams) -> StoreResult<LeaseWriteOutcome>;

    /// [`Store::change_lease`] for many leases at once (group commit):
    /// one outcome per change, in order, durable on `Ok`.
    ///
    /// # Contract
    /// Each change has exactly the semantics of `change_lease`, fenced the
    /// same way, applied in input order (a later change of the same lease
    /// sees the earlier one). A fenced change answers `Lost` for itself
    /// only; the others go on. Backends write the whole batch in one
    /// commit where they can (one transaction on PostgreSQL, one writer
    /// group per shard on the embedded store).
    ///
    /// # Errors
    /// Backend failures, for the whole batch: no change is acknowledged,
    /// though any of them may have taken effect (the embedded store
    /// commits each shard's part on its own, so some parts may be durable
    /// while another failed). A repeat then answers each change as a
    /// repeat does (`Done` for a resolve already applied).
    async fn change_leases(
        &self,
        params: ChangeLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        let mut outcomes = Vec::with_capacity(params.changes.len());
        for change in params.changes {
            outcomes.push(self.change_lease(change).await?);
        }
        Ok(outcomes)
    }

    /// The recorded lease of an event, if any: for answers after a
    /// restart, and for tests.
    async fn get_lease(&self, key: &EventKey) -> StoreResult<Option<StoredLease>>;

    /// Pending events of a partition in `(next_fire_at, key)` order.
    async fn due_page(&self, params: DuePageParams) -> StoreResult<Vec<DueCursor>>;

    /// A tenant's events, filtered and ordered as [`ListEventsParams`]
    /// says, at most `limit`.
    async fn list_events(&self, params: ListEventsParams) -> StoreResult<Vec<EventRecord>>;

    /// How many stored entries (index entries, records, rows) answering
    /// `params` with [`Store::list_events`] reads: lets the conformance
    /// suite check that a listing is bounded by its page. `None`: the
    /// backend cannot tell.
    async fn list_events_reads(&self, params: ListEventsParams) -> StoreResult<Option<u64>> {
        let _ = params;
        Ok(None)
    }

    /// How many of `tenant`'s client events have `status`, up to
    /// `at_most` (engine-internal events are not counted). Reads index
    /// entries only, O(min(count, `at_most`)) of them: what per-tenant
    /// quotas refresh their estimates with. (This default pages through
    /// [`Store::list_events`], reading records; both backends override it.)
    async fn count_events(&self, params: CountEventsParams) -> StoreResult<u64> {
        let mut count = 0;
        let mut after = None;
        while count < params.at_most {
            let limit = (params.at_most - count).min(1_000) as usize;
            let page = self
                .list_events(ListEventsParams {
                    tenant: params.tenant.clone(),
                    status: Some(params.status),
                    from: None,
                    to: None,
                    after,
                    limit,
                })
                .await?;
            count += page.len() as u64;
            if page.len() < limit {
                break;
            }
            after = page.last().map(|record| record.key.id.clone());
        }
        Ok(count)
    }

    /// An event's attempt history, oldest first, at most `limit` entries.
    async fn attempts(&self, key: &EventKey, limit: usize) -> StoreResult<Vec<Attempt>>;

    /// Deletes up to `limit` finished events (and their history) that
    /// finished before the cut-off. Returns how many went.
    async fn purge_finished(&self, params: PurgeParams) -> StoreResult<usize>;

    /// Deletes the events of `keys` that are finished (delivered, failed,
    /// missed or cancelled) when the call runs, as the retention sweep
    /// does: the record, its index entries, its attempt history and its
    /// lease. Answers per key, in order, whether it was deleted (`false`:
    /// unknown, already gone, or still pending). Atomic per event and
    /// durable on `Ok`; the id can be scheduled again afterwards, as a new
    /// event.
    ///
    /// Not fenced: a finished event is no owner's work. A concurrent write
    /// of the same event (a redrive) lands either before (the event is
    /// pending: not deleted) or after (it finds no event).
    ///
    /// # Errors
    /// Backend failures: nothing is acknowledged, though some events may
    /// be gone (a repeat answers `false` for them).
    async fn delete_finished(&self, keys: &[EventKey]) -> StoreResult<Vec<bool>>;

    async fn stats(&self) -> StoreResult<StoreStats>;

    // API keys and the audit log (see `docs/security.md`). Keys are few
    // and rarely written; reads by hash serve authentication (the API
    // caches them briefly).

    /// Stores a new key, durably. Returns `false` and stores nothing when
    /// a key with the same hash exists (a bootstrap key seeded twice, by
    /// two nodes at once) or was revoked (a revoked bootstrap key is not
    /// seeded again).
    async fn put_api_key(&self, key: ApiKey) -> StoreResult<bool>;
    /// The key whose secret hashes to `hash`.
    async fn api_key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>>;
    /// Every key, ordered by id.
    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>>;
    /// Removes a key (revocation), durably, and remembers its hash for
    /// good so that [`Store::put_api_key`] refuses it; returns what was
    /// removed.
    async fn delete_api_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>>;
    /// Sets a key's `last_used_at` (only ever forward). Need not be
    /// durable; a missing key is not an error.
    async fn touch_api_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()>;

    /// Appends an entry to the audit log, durably.
    async fn append_audit(&self, entry: AuditEntry) -> StoreResult<()>;
    /// A page of the audit log, `(at, id)` ascending.
    async fn list_audit(&self, params: AuditPageParams) -> StoreResult<Vec<AuditEntry>>;
    /// Deletes up to `limit` entries older than `before` (oldest first);
    /// returns how many went. Kept like event history.
    async fn purge_audit(&self, before: Timestamp, limit: usize) -> StoreResult<usize>;

    // Bulk actions (`belfry_core::bulk`): few, small records, written once
    // per page of their work. Every write is durable on `Ok`.

    /// Stores a new action as given (its revision is 0). Returns `false`
    /// and stores nothing when an action with its id exists.
    async fn create_bulk_action(&self, action: BulkAction) -> StoreResult<bool>;
    async fn get_bulk_action(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>>;
    /// A page of actions, newest first, at most `limit`.
    async fn list_bulk_actions(
        &self,
        params: ListBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>>;
    /// A page of the running actions, oldest first, at most `limit`: what
    /// runners look for work in (and resume after a restart).
    async fn running_bulk_actions(
        &self,
        params: RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>>;
    /// Compare-and-set: replaces the stored action with `action` if the
    /// stored revision is still `action.revision`, and answers what was
    /// stored (with the revision incremented). `None`: nothing changed,
    /// because another writer updated it first (or it is gone); re-read it.
    ///
    /// # Contract
    /// Of concurrent updates made from the same revision, exactly one
    /// succeeds, on every backend and across nodes.
    async fn update_bulk_action(&self, action: BulkAction) -> StoreResult<Option<BulkAction>>;
    /// Deletes up to `limit` actions that finished before the cut-off
    /// (oldest finished first); running ones are never purged. Returns how
    /// many went. Kept like event history.
    async fn purge_bulk_actions(&self, params: PurgeBulkActionsParams) -> StoreResult<usize>;
}
