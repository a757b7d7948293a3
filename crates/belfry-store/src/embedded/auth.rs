//! API keys and the audit log in the embedded store.
//!
//! | keyspace   | key                          | value |
//! |------------|------------------------------|-------|
//! | `api_keys` | the key's hash (hex)         | format byte + JSON `ApiKey` |
//! | `audit`    | `at` (8 bytes, sortable) ++ id | format byte + JSON `AuditEntry` |
//! | `revoked_api_keys` | a revoked key's hash (hex) | its id (so a revoked secret is never stored again) |
//!
//! Both are small and rarely written, so they bypass the group-commit
//! writers: each write is its own fsynced insert on a blocking thread,
//! under one mutex (a key's check-then-insert and a touch's
//! read-modify-write must not interleave). A touch (`last_used_at`) is
//! not fsynced: it is a hint, at most once a minute per key.

use std::sync::{Arc, Mutex};

use belfry_core::Timestamp;
use belfry_core::auth::{ApiKey, AuditEntry, KeyHash, KeyId};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::keys::{corrupt, instant_bytes};
use super::writer::internal;
use crate::{AuditPageParams, StoreError, StoreResult};

const FORMAT_V1: u8 = 1;

#[derive(Clone)]
pub(crate) struct AuthKeyspaces {
    db: Database,
    keys: Keyspace,
    /// Hashes of revoked keys: [`AuthKeyspaces::put_key`] refuses them.
    revoked: Keyspace,
    audit: Keyspace,
    /// Serializes the writes of this file.
    write: Arc<Mutex<()>>,
}

impl AuthKeyspaces {
    pub(crate) fn open(db: &Database) -> StoreResult<AuthKeyspaces> {
        let keyspace = |name| super::open_keyspace(db, name, KeyspaceCreateOptions::default);
        Ok(AuthKeyspaces {
            db: db.clone(),
            keys: keyspace("api_keys")?,
            revoked: keyspace("revoked_api_keys")?,
            audit: keyspace("audit")?,
            write: Arc::new(Mutex::new(())),
        })
    }

    /// Runs `work` on a blocking thread (fjall reads may wait on a flush).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&AuthKeyspaces) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        super::blocking(self.clone(), work).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.write)
    }

    fn sync(&self) -> StoreResult<()> {
        sync(&self.db)
    }

    pub(crate) fn put_key(&self, key: &ApiKey) -> StoreResult<bool> {
        let _guard = self.lock();
        let hash = key.hash.as_str().as_bytes();
        if self.keys.contains_key(hash).map_err(internal)?
            || self.revoked.contains_key(hash).map_err(internal)?
        {
            return Ok(false);
        }
        self.keys
            .insert(key.hash.as_str().as_bytes(), encode(key)?)
            .map_err(internal)?;
        self.sync()?;
        Ok(true)
    }

    pub(crate) fn key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        match self.keys.get(hash.as_str().as_bytes()).map_err(internal)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn list_keys(&self) -> StoreResult<Vec<ApiKey>> {
        let mut keys = self
            .keys
            .iter()
            .map(|item| {
                let (_, value) = item.into_inner().map_err(internal)?;
                decode::<ApiKey>(&value)
            })
            .collect::<StoreResult<Vec<_>>>()?;
        keys.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(keys)
    }

    pub(crate) fn delete_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>> {
        let _guard = self.lock();
        let Some(key) = self.list_keys()?.into_iter().find(|k| k.id == *id) else {
            return Ok(None);
        };
        // The tombstone first: a crash in between leaves a key that is
        // still valid and cannot be stored again, never a revoked key that
        // could be.
        self.revoked
            .insert(key.hash.as_str().as_bytes(), key.id.as_str().as_bytes())
            .map_err(internal)?;
        self.keys
            .remove(key.hash.as_str().as_bytes())
            .map_err(internal)?;
        self.sync()?;
        Ok(Some(key))
    }

    pub(crate) fn touch_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()> {
        let _guard = self.lock();
        let Some(mut key) = self.list_keys()?.into_iter().find(|k| k.id == *id) else {
            return Ok(());
        };
        if key.last_used_at.is_some_and(|last| last >= at) {
            return Ok(());
        }
        key.last_used_at = Some(at);
        self.keys
            .insert(key.hash.as_str().as_bytes(), encode(&key)?)
            .map_err(internal)
    }

    pub(crate) fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let _guard = self.lock();
        self.audit
            .insert(audit_key(entry.at, &entry.id), encode(entry)?)
            .map_err(internal)?;
        self.sync()
    }

    pub(crate) fn list_audit(&self, params: &AuditPageParams) -> StoreResult<Vec<AuditEntry>> {
        use std::ops::Bound;
        let start = match &params.after {
            Some((at, id)) => Bound::Excluded(audit_key(*at, id)),
            None => Bound::Unbounded,
        };
        self.audit
            .range::<Vec<u8>, _>((start, Bound::Unbounded))
            .take(params.limit)
            .map(|item| {
                let (_, value) = item.into_inner().map_err(internal)?;
                decode(&value)
            })
            .collect()
    }

    pub(crate) fn purge_audit(&self, before: Timestamp, limit: usize) -> StoreResult<usize> {
        let _guard = self.lock();
        let end = instant_bytes(before).to_vec();
        let doomed = self
            .audit
            .range::<Vec<u8>, _>(..end)
            .take(limit)
            .map(|item| item.key().map_err(internal))
            .collect::<StoreResult<Vec<_>>>()?;
        if doomed.is_empty() {
            return Ok(0);
        }
        let count = doomed.len();
        let mut batch = self.db.batch();
        for key in doomed {
            batch.remove(&self.audit, key);
        }
        batch.commit().map_err(internal)?;
        self.sync()?;
        Ok(count)
    }
}

/// Takes a write lock of this file's kind: a panic while holding one left
/// no partial write behind (each write is one insert or one batch), so a
/// poisoned lock is still usable.
pub(super) fn lock(mutex: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Makes every write so far durable.
pub(super) fn sync(db: &Database) -> StoreResult<()> {
    db.persist(PersistMode::SyncAll).map_err(internal)
}

fn audit_key(at: Timestamp, id: &str) -> Vec<u8> {
    let mut key = instant_bytes(at).to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

pub(super) fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    let mut out = vec![FORMAT_V1];
    serde_json::to_writer(&mut out, value)
        .map_err(|e| StoreError::Internal(format!("encoding failed: {e}")))?;
    Ok(out)
}

pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    match bytes.split_first() {
        Some((&FORMAT_V1, rest)) => serde_json::from_slice(rest).map_err(corrupt),
        _ => Err(corrupt("unknown key or audit format")),
    }
}
