//! A [`Store`] wrapper that asks an [`Interposer`] before every call: the
//! one place tests inject outages into a real store (no mocked store).
//!
//! Every method, default ones included, is forwarded to the inner store, so
//! a wrapped store behaves exactly like the inner one until the interposer
//! fails a call. A new `Store` method is forwarded here once, not in each
//! test's wrapper.

use std::sync::Arc;

use async_trait::async_trait;
use belfry_core::auth::{ApiKey, AuditEntry, KeyHash, KeyId};
use belfry_core::bulk::{BulkAction, BulkActionId};
use belfry_core::event::{Attempt, EventRecord};
use belfry_core::{DueCursor, EventKey, PartitionCount, TenantConfig, TenantName, Timestamp};

use crate::{
    Applied, ApplyParams, AuditPageParams, ChangeLeaseParams, ChangeLeasesParams,
    CountEventsParams, DuePageParams, LeaseWriteOutcome, ListBulkActionsParams, ListEventsParams,
    PurgeBulkActionsParams, PurgeParams, RecordLeasesParams, RunningBulkActionsParams, SharedStore,
    Store, StoreResult, StoreStats, StoredLease,
};

/// Which [`Store`] method is being called (with the params an interposer
/// may need to tell callers apart).
#[derive(Debug, Clone, Copy)]
pub enum StoreCall<'a> {
    PutTenant,
    GetTenant,
    ListTenants,
    DeleteTenant,
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

/// Decides, before each call, whether it reaches the inner store.
pub trait Interposer: Send + Sync + std::fmt::Debug + 'static {
    /// `Err` fails the call with that error; the inner store is not called.
    fn before(&self, call: StoreCall<'_>) -> StoreResult<()>;
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
        self.interposer.before(StoreCall::PutTenant)?;
        self.inner.put_tenant(tenant).await
    }
    async fn get_tenant(&self, name: &TenantName) -> StoreResult<Option<TenantConfig>> {
        self.interposer.before(StoreCall::GetTenant)?;
        self.inner.get_tenant(name).await
    }
    async fn list_tenants(&self) -> StoreResult<Vec<TenantConfig>> {
        self.interposer.before(StoreCall::ListTenants)?;
        self.inner.list_tenants().await
    }
    async fn delete_tenant(&self, name: &TenantName) -> StoreResult<bool> {
        self.interposer.before(StoreCall::DeleteTenant)?;
        self.inner.delete_tenant(name).await
    }
    async fn apply(&self, params: ApplyParams) -> StoreResult<Vec<Applied>> {
        self.interposer.before(StoreCall::Apply(&params))?;
        self.inner.apply(params).await
    }
    async fn get_event(&self, key: &EventKey) -> StoreResult<Option<EventRecord>> {
        self.interposer.before(StoreCall::GetEvent)?;
        self.inner.get_event(key).await
    }
    async fn get_events(&self, keys: &[EventKey]) -> StoreResult<Vec<Option<EventRecord>>> {
        self.interposer.before(StoreCall::GetEvents)?;
        self.inner.get_events(keys).await
    }
    async fn record_leases(
        &self,
        params: RecordLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        self.interposer.before(StoreCall::RecordLeases)?;
        self.inner.record_leases(params).await
    }
    async fn change_lease(&self, params: ChangeLeaseParams) -> StoreResult<LeaseWriteOutcome> {
        self.interposer.before(StoreCall::ChangeLease)?;
        self.inner.change_lease(params).await
    }
    async fn change_leases(
        &self,
        params: ChangeLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        self.interposer.before(StoreCall::ChangeLeases(&params))?;
        self.inner.change_leases(params).await
    }
    async fn get_lease(&self, key: &EventKey) -> StoreResult<Option<StoredLease>> {
        self.interposer.before(StoreCall::GetLease)?;
        self.inner.get_lease(key).await
    }
    async fn due_page(&self, params: DuePageParams) -> StoreResult<Vec<DueCursor>> {
        self.interposer.before(StoreCall::DuePage)?;
        self.inner.due_page(params).await
    }
    async fn list_events(&self, params: ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        self.interposer.before(StoreCall::ListEvents)?;
        self.inner.list_events(params).await
    }
    async fn list_events_reads(&self, params: ListEventsParams) -> StoreResult<Option<u64>> {
        self.interposer.before(StoreCall::ListEventsReads)?;
        self.inner.list_events_reads(params).await
    }
    async fn count_events(&self, params: CountEventsParams) -> StoreResult<u64> {
        self.interposer.before(StoreCall::CountEvents)?;
        self.inner.count_events(params).await
    }
    async fn attempts(&self, key: &EventKey, limit: usize) -> StoreResult<Vec<Attempt>> {
        self.interposer.before(StoreCall::Attempts)?;
        self.inner.attempts(key, limit).await
    }
    async fn purge_finished(&self, params: PurgeParams) -> StoreResult<usize> {
        self.interposer.before(StoreCall::PurgeFinished)?;
        self.inner.purge_finished(params).await
    }
    async fn delete_finished(&self, keys: &[EventKey]) -> StoreResult<Vec<bool>> {
        self.interposer.before(StoreCall::DeleteFinished)?;
        self.inner.delete_finished(keys).await
    }
    async fn stats(&self) -> StoreResult<StoreStats> {
        self.interposer.before(StoreCall::Stats)?;
        self.inner.stats().await
    }
    async fn put_api_key(&self, key: ApiKey) -> StoreResult<bool> {
        self.interposer.before(StoreCall::PutApiKey)?;
        self.inner.put_api_key(key).await
    }
    async fn api_key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        self.interposer.before(StoreCall::ApiKeyByHash)?;
        self.inner.api_key_by_hash(hash).await
    }
    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>> {
        self.interposer.before(StoreCall::ListApiKeys)?;
        self.inner.list_api_keys().await
    }
    async fn delete_api_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>> {
        self.interposer.before(StoreCall::DeleteApiKey)?;
        self.inner.delete_api_key(id).await
    }
    async fn touch_api_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()> {
        self.interposer.before(StoreCall::TouchApiKey)?;
        self.inner.touch_api_key(id, at).await
    }
    async fn append_audit(&self, entry: AuditEntry) -> StoreResult<()> {
        self.interposer.before(StoreCall::AppendAudit)?;
        self.inner.append_audit(entry).await
    }
    async fn list_audit(&self, params: AuditPageParams) -> StoreResult<Vec<AuditEntry>> {
        self.interposer.before(StoreCall::ListAudit)?;
        self.inner.list_audit(params).await
    }
    async fn purge_audit(&self, before: Timestamp, limit: usize) -> StoreResult<usize> {
        self.interposer.before(StoreCall::PurgeAudit)?;
        self.inner.purge_audit(before, limit).await
    }
    async fn create_bulk_action(&self, action: BulkAction) -> StoreResult<bool> {
        self.interposer.before(StoreCall::CreateBulkAction)?;
        self.inner.create_bulk_action(action).await
    }
    async fn get_bulk_action(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        self.interposer.before(StoreCall::GetBulkAction)?;
        self.inner.get_bulk_action(id).await
    }
    async fn list_bulk_actions(
        &self,
        params: ListBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        self.interposer.before(StoreCall::ListBulkActions)?;
        self.inner.list_bulk_actions(params).await
    }
    async fn running_bulk_actions(
        &self,
        params: RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        self.interposer.before(StoreCall::RunningBulkActions)?;
        self.inner.running_bulk_actions(params).await
    }
    async fn update_bulk_action(&self, action: BulkAction) -> StoreResult<Option<BulkAction>> {
        self.interposer.before(StoreCall::UpdateBulkAction)?;
        self.inner.update_bulk_action(action).await
    }
    async fn purge_bulk_actions(&self, params: PurgeBulkActionsParams) -> StoreResult<usize> {
        self.interposer.before(StoreCall::PurgeBulkActions)?;
        self.inner.purge_bulk_actions(params).await
    }
}
