//! A [`Store`] wrapper that asks an [`Interposer`] before every call: the
//! one place tests inject store faults into a real store (no mocked store).
//!
//! Every method, default ones included, is forwarded to the inner store, so
//! a wrapped store behaves exactly like the inner one until the interposer
//! answers a call with a fault. A new `Store` method is forwarded here once,
//! not in each test's wrapper.
//!
//! [`Interposer::before`] sees each call (with the params that tell callers
//! apart) and answers a [`Fault`]:
//!
//! - [`Fault::Pass`]: the inner store answers.
//! - [`Fault::Fail`]: an error without a commit; the inner store is not
//!   called.
//! - [`Fault::CommitThenFail`]: the inner store runs (a write commits), its
//!   answer is discarded and the error returned, as when a database commits
//!   and the connection drops before the answer arrives.
//! - [`Fault::Stall`]: waits, then the inner store runs and answers; a caller
//!   that gives up meanwhile drops the call before anything is written.
//! - [`Fault::CommitThenStall`]: the inner store runs first, then the answer
//!   is held back; a caller that gives up meanwhile drops a call that has
//!   committed.
//!
//! Stalls wait on tokio's timer, so a test with paused time decides when
//! they end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use belfry_core::auth::{ApiKey, AuditEntry, KeyHash, KeyId};
use belfry_core::bulk::{BulkAction, BulkActionId};
use belfry_core::event::{Attempt, EventRecord};
use belfry_core::{
    DueCursor, EventKey, PartitionCount, TenantConfig, TenantName, TenantPause, Timestamp,
};

use crate::{
    Applied, ApplyParams, AuditPageParams, ChangeLeaseParams, ChangeLeasesParams,
    CountEventsParams, DuePageParams, LeaseWriteOutcome, ListBulkActionsParams, ListEventsParams,
    PurgeBulkActionsParams, PurgeParams, RecordLeasesParams, RunningBulkActionsParams, SharedStore,
    Store, StoreError, StoreResult, StoreStats, StoredLease,
};

/// Which [`Store`] method is being called (with the params an interposer
/// may need to tell callers apart).
#[derive(Debug, Clone, Copy)]
pub enum StoreCall<'a> {
    PutTenant,
    GetTenant,
    ListTenants,
    DeleteTenant,
    PutTenantPause,
    GetTenantPause,
    ListTenantPauses,
    /// Commands carry a fence when the engine records outcomes on behalf
    /// of a partition owner; client writes carry none.
    Apply(&'a ApplyParams),
    GetEvent,
    GetEvents,
    RecordLeases,
    ChangeLease,
    /// The batch, so an interposer can count its changes.
    ChangeLeases(&'a ChangeLeasesParams),
    GetLease,
    DuePage,
    ListEvents,
    ListEventsReads,
    CountEvents,
    Attempts,
    PurgeFinished,
    DeleteFinished,
    Stats,
    PutApiKey,
    ApiKeyByHash,
    ListApiKeys,
    DeleteApiKey,
    TouchApiKey,
    AppendAudit,
    ListAudit,
    PurgeAudit,
    CreateBulkAction,
    GetBulkAction,
    ListBulkActions,
    RunningBulkActions,
    UpdateBulkAction,
    PurgeBulkActions,
}

/// What happens to one call (see the module doc).
#[derive(Debug, Clone, Default)]
pub enum Fault {
    /// The inner store answers.
    #[default]
    Pass,
    /// This error, without calling the inner store.
    Fail(StoreError),
    /// The inner store runs (a write commits), then this error replaces its
    /// answer.
    CommitThenFail(StoreError),
    /// Waits this long, then the inner store runs and answers.
    Stall(Duration),
    /// The inner store runs, then its answer waits this long.
    CommitThenStall(Duration),
}

/// `Err` fails the call without calling the inner store; `Ok` passes it.
impl From<StoreResult<()>> for Fault {
    fn from(result: StoreResult<()>) -> Fault {
        match result {
            Ok(()) => Fault::Pass,
            Err(error) => Fault::Fail(error),
        }
    }
}

/// Decides, before each call, what happens to it.
pub trait Interposer: Send + Sync + std::fmt::Debug + 'static {
    fn before(&self, call: StoreCall<'_>) -> Fault;
}

/// The inner store behind an [`Interposer`].
#[derive(Debug, Clone)]
pub struct Interposed {
    inner: SharedStore,
    interposer: Arc<dyn Interposer>,
}

impl Interposed {
    pub fn new(inner: SharedStore, interposer: Arc<dyn Interposer>) -> Self {
        Interposed { inner, interposer }
    }

    /// Runs `inner` (the forwarded call, not started yet) as `fault` says.
    #[allow(
        clippy::disallowed_methods,
        reason = "test fault injection: stalls wait on tokio's timer, which tests may pause"
    )]
    async fn run<T>(fault: Fault, inner: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        match fault {
            Fault::Pass => inner.await,
            Fault::Fail(error) => Err(error),
            Fault::CommitThenFail(error) => {
                let _discarded = inner.await;
                Err(error)
            }
            Fault::Stall(wait) => {
                tokio::time::sleep(wait).await;
                inner.await
            }
            Fault::CommitThenStall(wait) => {
                let answer = inner.await;
                tokio::time::sleep(wait).await;
                answer
            }
        }
    }
}

#[async_trait]
impl Store for Interposed {
    fn partitions(&self) -> PartitionCount {
        self.inner.partitions()
    }
    fn write_blocked(&self) -> Option<&'static str> {
        self.inner.write_blocked()
    }
    async fn put_tenant(&self, tenant: TenantConfig) -> StoreResult<()> {
        let fault = self.interposer.before(StoreCall::PutTenant);
        Self::run(fault, self.inner.put_tenant(tenant)).await
    }
    async fn get_tenant(&self, name: &TenantName) -> StoreResult<Option<TenantConfig>> {
        let fault = self.interposer.before(StoreCall::GetTenant);
        Self::run(fault, self.inner.get_tenant(name)).await
    }
    async fn list_tenants(&self) -> StoreResult<Vec<TenantConfig>> {
        let fault = self.interposer.before(StoreCall::ListTenants);
        Self::run(fault, self.inner.list_tenants()).await
    }
    async fn delete_tenant(&self, name: &TenantName) -> StoreResult<bool> {
        let fault = self.interposer.before(StoreCall::DeleteTenant);
        Self::run(fault, self.inner.delete_tenant(name)).await
    }
    async fn put_tenant_pause(&self, name: &TenantName, pause: TenantPause) -> StoreResult<bool> {
        let fault = self.interposer.before(StoreCall::PutTenantPause);
        Self::run(fault, self.inner.put_tenant_pause(name, pause)).await
    }
    async fn get_tenant_pause(&self, name: &TenantName) -> StoreResult<Option<TenantPause>> {
        let fault = self.interposer.before(StoreCall::GetTenantPause);
        Self::run(fault, self.inner.get_tenant_pause(name)).await
    }
    async fn list_tenant_pauses(&self) -> StoreResult<Vec<(TenantName, TenantPause)>> {
        let fault = self.interposer.before(StoreCall::ListTenantPauses);
        Self::run(fault, self.inner.list_tenant_pauses()).await
    }
    async fn apply(&self, params: ApplyParams) -> StoreResult<Vec<Applied>> {
        let fault = self.interposer.before(StoreCall::Apply(&params));
        Self::run(fault, self.inner.apply(params)).await
    }
    async fn get_event(&self, key: &EventKey) -> StoreResult<Option<EventRecord>> {
        let fault = self.interposer.before(StoreCall::GetEvent);
        Self::run(fault, self.inner.get_event(key)).await
    }
    async fn get_events(&self, keys: &[EventKey]) -> StoreResult<Vec<Option<EventRecord>>> {
        let fault = self.interposer.before(StoreCall::GetEvents);
        Self::run(fault, self.inner.get_events(keys)).await
    }
    async fn record_leases(
        &self,
        params: RecordLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        let fault = self.interposer.before(StoreCall::RecordLeases);
        Self::run(fault, self.inner.record_leases(params)).await
    }
    async fn change_lease(&self, params: ChangeLeaseParams) -> StoreResult<LeaseWriteOutcome> {
        let fault = self.interposer.before(StoreCall::ChangeLease);
        Self::run(fault, self.inner.change_lease(params)).await
    }
    async fn change_leases(
        &self,
        params: ChangeLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        let fault = self.interposer.before(StoreCall::ChangeLeases(&params));
        Self::run(fault, self.inner.change_leases(params)).await
    }
    async fn get_lease(&self, key: &EventKey) -> StoreResult<Option<StoredLease>> {
        let fault = self.interposer.before(StoreCall::GetLease);
        Self::run(fault, self.inner.get_lease(key)).await
    }
    async fn due_page(&self, params: DuePageParams) -> StoreResult<Vec<DueCursor>> {
        let fault = self.interposer.before(StoreCall::DuePage);
        Self::run(fault, self.inner.due_page(params)).await
    }
    async fn list_events(&self, params: ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        let fault = self.interposer.before(StoreCall::ListEvents);
        Self::run(fault, self.inner.list_events(params)).await
    }
    async fn list_events_reads(&self, params: ListEventsParams) -> StoreResult<Option<u64>> {
        let fault = self.interposer.before(StoreCall::ListEventsReads);
        Self::run(fault, self.inner.list_events_reads(params)).await
    }
    async fn count_events(&self, params: CountEventsParams) -> StoreResult<u64> {
        let fault = self.interposer.before(StoreCall::CountEvents);
        Self::run(fault, self.inner.count_events(params)).await
    }
    async fn attempts(&self, key: &EventKey, limit: usize) -> StoreResult<Vec<Attempt>> {
        let fault = self.interposer.before(StoreCall::Attempts);
        Self::run(fault, self.inner.attempts(key, limit)).await
    }
    async fn purge_finished(&self, params: PurgeParams) -> StoreResult<usize> {
        let fault = self.interposer.before(StoreCall::PurgeFinished);
        Self::run(fault, self.inner.purge_finished(params)).await
    }
    async fn delete_finished(&self, keys: &[EventKey]) -> StoreResult<Vec<bool>> {
        let fault = self.interposer.before(StoreCall::DeleteFinished);
        Self::run(fault, self.inner.delete_finished(keys)).await
    }
    async fn stats(&self) -> StoreResult<StoreStats> {
        let fault = self.interposer.before(StoreCall::Stats);
        Self::run(fault, self.inner.stats()).await
    }
    async fn put_api_key(&self, key: ApiKey) -> StoreResult<bool> {
        let fault = self.interposer.before(StoreCall::PutApiKey);
        Self::run(fault, self.inner.put_api_key(key)).await
    }
    async fn api_key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        let fault = self.interposer.before(StoreCall::ApiKeyByHash);
        Self::run(fault, self.inner.api_key_by_hash(hash)).await
    }
    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>> {
        let fault = self.interposer.before(StoreCall::ListApiKeys);
        Self::run(fault, self.inner.list_api_keys()).await
    }
    async fn delete_api_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>> {
        let fault = self.interposer.before(StoreCall::DeleteApiKey);
        Self::run(fault, self.inner.delete_api_key(id)).await
    }
    async fn touch_api_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()> {
        let fault = self.interposer.before(StoreCall::TouchApiKey);
        Self::run(fault, self.inner.touch_api_key(id, at)).await
    }
    async fn append_audit(&self, entry: AuditEntry) -> StoreResult<()> {
        let fault = self.interposer.before(StoreCall::AppendAudit);
        Self::run(fault, self.inner.append_audit(entry)).await
    }
    async fn list_audit(&self, params: AuditPageParams) -> StoreResult<Vec<AuditEntry>> {
        let fault = self.interposer.before(StoreCall::ListAudit);
        Self::run(fault, self.inner.list_audit(params)).await
    }
    async fn purge_audit(&self, before: Timestamp, limit: usize) -> StoreResult<usize> {
        let fault = self.interposer.before(StoreCall::PurgeAudit);
        Self::run(fault, self.inner.purge_audit(before, limit)).await
    }
    async fn create_bulk_action(&self, action: BulkAction) -> StoreResult<bool> {
        let fault = self.interposer.before(StoreCall::CreateBulkAction);
        Self::run(fault, self.inner.create_bulk_action(action)).await
    }
    async fn get_bulk_action(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        let fault = self.interposer.before(StoreCall::GetBulkAction);
        Self::run(fault, self.inner.get_bulk_action(id)).await
    }
    async fn list_bulk_actions(
        &self,
        params: ListBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        let fault = self.interposer.before(StoreCall::ListBulkActions);
        Self::run(fault, self.inner.list_bulk_actions(params)).await
    }
    async fn running_bulk_actions(
        &self,
        params: RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        let fault = self.interposer.before(StoreCall::RunningBulkActions);
        Self::run(fault, self.inner.running_bulk_actions(params)).await
    }
    async fn update_bulk_action(&self, action: BulkAction) -> StoreResult<Option<BulkAction>> {
        let fault = self.interposer.before(StoreCall::UpdateBulkAction);
        Self::run(fault, self.inner.update_bulk_action(action)).await
    }
    async fn purge_bulk_actions(&self, params: PurgeBulkActionsParams) -> StoreResult<usize> {
        let fault = self.interposer.before(StoreCall::PurgeBulkActions);
        Self::run(fault, self.inner.purge_bulk_actions(params)).await
    }
}
