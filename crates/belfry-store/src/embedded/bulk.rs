//! Bulk actions in the embedded store.
//!
//! | keyspace         | key                               | value |
//! |------------------|-----------------------------------|-------|
//! | `bulk_actions`   | the action's id                   | format byte + JSON `BulkAction` |
//! | `bulk_by_tenant` | tenant 0x00 id                    | empty; a tenant's actions |
//! | `bulk_running`   | id                                | empty; exactly the running actions |
//! | `bulk_finished`  | `finished_at` (8 bytes, sortable) ++ id | empty; drives retention |
//!
//! Ids sort by creation time, so newest first is a reverse scan. Like the
//! API keys ([`super::auth`]), these records are few and written at most
//! once per page of an action's work, so they bypass the group-commit
//! writers: each write is one fsynced batch (the record and its index
//! entries) on a blocking thread, under one mutex, which also makes the
//! compare-and-set of [`BulkKeyspaces::update`] a plain read-then-write.

use std::ops::Bound;
use std::sync::{Arc, Mutex};

use belfry_core::bulk::{BulkAction, BulkActionId, BulkState};
use belfry_core::{TenantName, Timestamp};
use fjall::{Database, Keyspace, KeyspaceCreateOptions};

use super::auth::{decode, encode, lock, sync};
use super::keys::{instant_bytes, tenant_prefix, tenant_prefix_end};
use super::writer::internal;
use crate::{ListBulkActionsParams, PurgeBulkActionsParams, RunningBulkActionsParams, StoreResult};

#[derive(Clone)]
pub(crate) struct BulkKeyspaces {
    db: Database,
    actions: Keyspace,
    by_tenant: Keyspace,
    running: Keyspace,
    finished: Keyspace,
    /// Serializes the writes of this file.
    write: Arc<Mutex<()>>,
}

impl BulkKeyspaces {
    pub(crate) fn open(db: &Database) -> StoreResult<BulkKeyspaces> {
        let keyspace = |name| super::open_keyspace(db, name, KeyspaceCreateOptions::default);
        Ok(BulkKeyspaces {
            db: db.clone(),
            actions: keyspace("bulk_actions")?,
            by_tenant: keyspace("bulk_by_tenant")?,
            running: keyspace("bulk_running")?,
            finished: keyspace("bulk_finished")?,
            write: Arc::new(Mutex::new(())),
        })
    }

    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&BulkKeyspaces) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        super::blocking(self.clone(), work).await
    }

    pub(crate) fn create(&self, action: &BulkAction) -> StoreResult<bool> {
        let _guard = lock(&self.write);
        if self.read(&action.id)?.is_some() {
            return Ok(false);
        }
        self.write(None, action)?;
        Ok(true)
    }

    pub(crate) fn get(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        self.read(id)
    }

    pub(crate) fn list(&self, params: &ListBulkActionsParams) -> StoreResult<Vec<BulkAction>> {
        match &params.tenant {
            None => {
                let end = match &params.before {
                    Some(before) => Bound::Excluded(before.as_str().as_bytes().to_vec()),
                    None => Bound::Unbounded,
                };
                self.actions
                    .range::<Vec<u8>, _>((Bound::Unbounded, end))
                    .rev()
                    .take(params.limit)
                    .map(|item| {
                        let (_, value) = item.into_inner().map_err(internal)?;
                        decode(&value)
                    })
                    .collect()
            }
            Some(tenant) => {
                let start = Bound::Included(tenant_prefix(tenant));
                let end = match &params.before {
                    Some(before) => Bound::Excluded(tenant_key(tenant, before)),
                    None => Bound::Excluded(tenant_prefix_end(tenant)),
                };
                let prefix_len = tenant_prefix(tenant).len();
                self.by_tenant
                    .range::<Vec<u8>, _>((start, end))
                    .rev()
                    .take(params.limit)
                    .map(|item| {
                        let key = item.key().map_err(internal)?;
                        self.indexed(&key[prefix_len..])
                    })
                    .collect()
            }
        }
    }

    pub(crate) fn running(
        &self,
        params: &RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        let start = match &params.after {
            Some(after) => Bound::Excluded(after.as_str().as_bytes().to_vec()),
            None => Bound::Unbounded,
        };
        self.running
            .range::<Vec<u8>, _>((start, Bound::Unbounded))
            .take(params.limit)
            .map(|item| self.indexed(&item.key().map_err(internal)?))
            .collect()
    }

    pub(crate) fn update(&self, action: &BulkAction) -> StoreResult<Option<BulkAction>> {
        let _guard = lock(&self.write);
        let Some(current) = self.read(&action.id)? else {
            return Ok(None);
        };
        if current.revision != action.revision {
            return Ok(None);
        }
        let mut next = action.clone();
        next.revision = current.revision + 1;
        // The filter (hence the tenant) and the creation never change.
        next.filter = current.filter.clone();
        next.created_at = current.created_at;
        self.write(Some(&current), &next)?;
        Ok(Some(next))
    }

    pub(crate) fn purge(&self, params: &PurgeBulkActionsParams) -> StoreResult<usize> {
        let _guard = lock(&self.write);
        let end = instant_bytes(params.finished_before).to_vec();
        let doomed = self
            .finished
            .range::<Vec<u8>, _>(..end)
            .take(params.limit)
            .map(|item| {
                let key = item.key().map_err(internal)?;
                self.indexed(&key[8..])
            })
            .collect::<StoreResult<Vec<_>>>()?;
        if doomed.is_empty() {
            return Ok(0);
        }
        let mut batch = self.db.batch();
        for action in &doomed {
            batch.remove(&self.actions, action.id.as_str().as_bytes());
            batch.remove(&self.by_tenant, tenant_key(action.tenant(), &action.id));
            batch.remove(&self.running, action.id.as_str().as_bytes());
            if let Some(at) = action.finished_at {
                batch.remove(&self.finished, finished_key(at, &action.id));
            }
        }
        batch.commit().map_err(internal)?;
        sync(&self.db)?;
        Ok(doomed.len())
    }

    fn read(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        match self.actions.get(id.as_str().as_bytes()).map_err(internal)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The action an index entry names by its id bytes.
    fn indexed(&self, id: &[u8]) -> StoreResult<BulkAction> {
        let id = std::str::from_utf8(id)
            .ok()
            .and_then(BulkActionId::parse)
            .ok_or_else(|| super::keys::corrupt("bulk action index entry"))?;
        self.read(&id)?
            .ok_or_else(|| super::keys::corrupt("bulk action index entry without its action"))
    }

    /// Writes `next` and moves its index entries from where `previous`
    /// had them, in one fsynced batch.
    fn write(&self, previous: Option<&BulkAction>, next: &BulkAction) -> StoreResult<()> {
        let id = next.id.as_str().as_bytes();
        let mut batch = self.db.batch();
        batch.insert(&self.actions, id, encode(next)?);
        if previous.is_none() {
            batch.insert(&self.by_tenant, tenant_key(next.tenant(), &next.id), []);
        }
        if next.state == BulkState::Running {
            batch.insert(&self.running, id, []);
        } else {
            batch.remove(&self.running, id);
        }
        if let Some(at) = previous.and_then(|p| p.finished_at)
            && Some(at) != next.finished_at
        {
            batch.remove(&self.finished, finished_key(at, &next.id));
        }
        if let Some(at) = next.finished_at {
            batch.insert(&self.finished, finished_key(at, &next.id), []);
        }
        batch.commit().map_err(internal)?;
        sync(&self.db)
    }
}

fn tenant_key(tenant: &TenantName, id: &BulkActionId) -> Vec<u8> {
    let mut key = tenant_prefix(tenant);
    key.extend_from_slice(id.as_str().as_bytes());
    key
}

fn finished_key(at: Timestamp, id: &BulkActionId) -> Vec<u8> {
    let mut key = instant_bytes(at).to_vec();
    key.extend_from_slice(id.as_str().as_bytes());
    key
}
