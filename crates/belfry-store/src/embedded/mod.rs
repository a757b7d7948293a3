//! The embedded backend: fjall (an LSM tree) in a data directory.
//!
//! # Layout
//! - [`keys`]: byte encodings of keys and values;
//! - [`writer`]: the group-commit writer thread;
//! - this file: opening the database and the read paths.
//!
//! # Keyspaces
//! | keyspace   | key                                          | value |
//! |------------|----------------------------------------------|-------|
//! | `meta`     | `partitions`, `schema_version`, `attempt_seq`| big-endian integers |
//! | `tenants`  | tenant name                                  | format byte + JSON `TenantConfig` |
//! | `events`   | `tenant 0x00 id`                             | format byte + postcard `EventRecord` |
//! | `due`      | partition u16 ++ next_fire_at ++ event key   | empty; exactly the pending events |
//! | `attempts` | event key ++ 0x00 ++ started_at ++ seq       | format byte + postcard `Attempt` |
//! | `finished` | finished_at ++ event key                     | empty; drives retention |
//!
//! # Ownership
//! One process owns the directory (fjall locks it). There is a single
//! partition owner, so every [`crate::Fence`] is accepted and
//! [`StoreError::Fenced`] is never returned.
//!
//! # Durability
//! Every write goes through the writer thread, which fsyncs (`SyncAll`)
//! before answering. Reads go straight to fjall and see every answered
//! write.

pub mod keys;
pub mod writer;

use std::ops::Bound;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use belfry_core::event::{Attempt, EventRecord};
use belfry_core::{DueCursor, EventKey, PartitionCount, TenantConfig, TenantName};
use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use tokio::sync::oneshot;

use self::writer::{Job, Keyspaces, Writer, internal};
use crate::{
    Applied, ApplyParams, DuePageParams, ListEventsParams, PurgeParams, Store, StoreError,
    StoreResult, StoreStats,
};

/// Options of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    pub data_dir: PathBuf,
    /// Used when the store is created; an existing store keeps its own.
    pub partitions: PartitionCount,
}

/// The embedded store. Cheap to share behind an `Arc`; dropping it stops
/// the writer (after the group in progress) and closes the database.
pub struct EmbeddedStore {
    ks: Keyspaces,
    partitions: PartitionCount,
    /// `None` only while dropping.
    jobs: Option<mpsc::Sender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `options.data_dir`.
    ///
    /// # Errors
    /// [`StoreError::Internal`] if the directory cannot be opened (in use by
    /// another process, unreadable, written by a newer schema).
    pub fn open(options: EmbeddedOptions) -> StoreResult<Self> {
        std::fs::create_dir_all(&options.data_dir).map_err(|e| {
            StoreError::Internal(format!("cannot create {}: {e}", options.data_dir.display()))
        })?;
        let db = Database::builder(&options.data_dir).open().map_err(|e| {
            StoreError::Internal(format!("cannot open {}: {e}", options.data_dir.display()))
        })?;
        let ks = Keyspaces {
            meta: db
                .keyspace("meta", KeyspaceCreateOptions::default)
                .map_err(internal)?,
            tenants: db
                .keyspace("tenants", KeyspaceCreateOptions::default)
                .map_err(internal)?,
            events: db
                .keyspace("events", tuning::write_heavy)
                .map_err(internal)?,
            due: db.keyspace("due", tuning::write_heavy).map_err(internal)?,
            attempts: db
                .keyspace("attempts", tuning::write_heavy)
                .map_err(internal)?,
            finished: db
                .keyspace("finished", tuning::write_heavy)
                .map_err(internal)?,
            db,
        };
        let partitions = Self::settle_meta(&ks, options.partitions)?;
        let attempt_seq = match ks.meta.get(keys::META_ATTEMPT_SEQ).map_err(internal)? {
            Some(bytes) => u64::from_be_bytes(
                bytes
                    .as_ref()
                    .try_into()
                    .map_err(|_| keys::corrupt("attempt_seq"))?,
            ),
            None => 0,
        };
        let (jobs, receiver) = mpsc::channel();
        let writer = Writer::new(ks.clone(), partitions, attempt_seq, receiver);
        let writer = std::thread::Builder::new()
            .name("belfry-store-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::Internal(format!("cannot start the writer thread: {e}")))?;
        Ok(EmbeddedStore {
            ks,
            partitions,
            jobs: Some(jobs),
            writer: Some(writer),
        })
    }

    /// Writes the partition count and schema of a new store, or reads and
    /// checks those of an existing one.
    fn settle_meta(ks: &Keyspaces, configured: PartitionCount) -> StoreResult<PartitionCount> {
        if let Some(schema) = ks.meta.get(keys::META_SCHEMA).map_err(internal)? {
            let schema = u32::from_be_bytes(
                schema
                    .as_ref()
                    .try_into()
                    .map_err(|_| keys::corrupt("schema_version"))?,
            );
            if schema > keys::SCHEMA_VERSION {
                return Err(StoreError::Internal(format!(
                    "the data directory has schema version {schema}; this build reads up to {}",
                    keys::SCHEMA_VERSION
                )));
            }
        }
        match ks.meta.get(keys::META_PARTITIONS).map_err(internal)? {
            Some(bytes) => {
                let count = bytes
                    .as_ref()
                    .try_into()
                    .ok()
                    .map(u16::from_be_bytes)
                    .and_then(PartitionCount::new)
                    .ok_or_else(|| keys::corrupt("partition count"))?;
                if count != configured {
                    tracing::warn!(
                        stored = count.get(),
                        configured = configured.get(),
                        "the store keeps the partition count it was created with; the configured one is ignored"
                    );
                }
                Ok(count)
            }
            None => {
                let mut batch = ks.db.batch();
                batch.insert(
                    &ks.meta,
                    keys::META_PARTITIONS,
                    configured.get().to_be_bytes(),
                );
                batch.insert(
                    &ks.meta,
                    keys::META_SCHEMA,
                    keys::SCHEMA_VERSION.to_be_bytes(),
                );
                batch.commit().map_err(internal)?;
                ks.db.persist(PersistMode::SyncAll).map_err(internal)?;
                Ok(configured)
            }
        }
    }

    async fn submit<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<StoreResult<T>>) -> Job,
    ) -> StoreResult<T> {
        let (reply, answer) = oneshot::channel();
        let jobs = self.jobs.as_ref().ok_or_else(writer_gone)?;
        jobs.send(job(reply)).map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }

    /// Runs a read that may scan many entries off the async threads.
    async fn scan<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Keyspaces) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let ks = self.ks.clone();
        tokio::task::spawn_blocking(move || read(&ks))
            .await
            .map_err(|e| StoreError::Internal(format!("read task failed: {e}")))?
    }
}

fn writer_gone() -> StoreError {
    StoreError::Unavailable("the embedded store's writer has stopped".into())
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish its group and return;
        // joining it releases its database handles before ours go, so the
        // directory can be reopened as soon as this returns.
        drop(self.jobs.take());
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!("the embedded store's writer thread panicked");
        }
    }
}

/// fjall options per keyspace, chosen with the `ingest` example.
///
/// The write path's cost is the memtable skiplist (lookups and inserts that
/// miss the CPU cache). A 16 MiB memtable measured ≈ 20 % less writer CPU per
/// event than the 64 MiB default (11.4 vs 14.4 µs per create) and less CPU
/// for the whole process too: the flushes it causes run on fjall's worker
/// threads, off the single writer thread. Smaller (4 MiB) cut the writer
/// further but raised the total. Turning block compression off changed
/// nothing measurable, so lz4 stays (smaller files).
mod tuning {
    use fjall::KeyspaceCreateOptions;

    const MEMTABLE_BYTES: u64 = 16 * 1024 * 1024;

    /// `events` (point reads on every write: keeps its bloom filters) and
    /// the indexes alike.
    pub fn write_heavy() -> KeyspaceCreateOptions {
        KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES)
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn partitions(&self) -> PartitionCount {
        self.partitions
    }

    async fn put_tenant(&self, tenant: TenantConfig) -> StoreResult<()> {
        self.submit(|reply| Job::PutTenant { tenant, reply }).await
    }

    async fn get_tenant(&self, name: &TenantName) -> StoreResult<Option<TenantConfig>> {
        match self.ks.tenants.get(name.as_str()).map_err(internal)? {
            Some(bytes) => Ok(Some(keys::decode_tenant(&bytes)?)),
            None => Ok(None),
        }
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantConfig>> {
        self.scan(|ks| {
            ks.tenants
                .iter()
                .map(|item| {
                    let (_, value) = item.into_inner().map_err(internal)?;
                    keys::decode_tenant(&value)
                })
                .collect()
        })
        .await
    }

    async fn delete_tenant(&self, name: &TenantName) -> StoreResult<bool> {
        let name = name.clone();
        self.submit(|reply| Job::DeleteTenant { name, reply }).await
    }

    async fn apply(&self, params: ApplyParams) -> StoreResult<Vec<Applied>> {
        if params.commands.is_empty() {
            return Ok(Vec::new());
        }
        self.submit(|reply| Job::Apply { params, reply }).await
    }

    async fn get_event(&self, key: &EventKey) -> StoreResult<Option<EventRecord>> {
        match self.ks.events.get(keys::event_key(key)).map_err(internal)? {
            Some(bytes) => Ok(Some(keys::decode_record(&bytes)?)),
            None => Ok(None),
        }
    }

    async fn due_page(&self, params: DuePageParams) -> StoreResult<Vec<DueCursor>> {
        if params.limit == 0
            || params
                .after
                .as_ref()
                .is_some_and(|a| a.due > params.through)
        {
            return Ok(Vec::new());
        }
        self.scan(move |ks| {
            let start = match &params.after {
                Some(after) => {
                    Bound::Excluded(keys::due_key(params.partition, after.due, &after.key))
                }
                None => Bound::Included(keys::due_partition_start(params.partition)),
            };
            let end = Bound::Included(keys::due_through_last(params.partition, params.through));
            ks.due
                .range::<Vec<u8>, _>((start, end))
                .take(params.limit)
                .map(|item| keys::decode_due_key(&item.key().map_err(internal)?))
                .collect()
        })
        .await
    }

    async fn list_events(&self, params: ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        self.scan(move |ks| {
            let prefix = keys::tenant_prefix(&params.tenant);
            let start = match &params.after {
                Some(after) => {
                    let mut key = prefix.clone();
                    key.extend_from_slice(after.as_str().as_bytes());
                    Bound::Excluded(key)
                }
                None => Bound::Included(prefix.clone()),
            };
            let mut found = Vec::new();
            for item in ks.events.range::<Vec<u8>, _>((start, Bound::Unbounded)) {
                let (key, value) = item.into_inner().map_err(internal)?;
                if !key.starts_with(&prefix) {
                    break;
                }
                let record = keys::decode_record(&value)?;
                let wanted = params.status.is_none_or(|s| s == record.status)
                    && params.from.is_none_or(|from| record.event_time >= from)
                    && params.to.is_none_or(|to| record.event_time < to);
                if wanted {
                    found.push(record);
                    if found.len() == params.limit {
                        break;
                    }
                }
            }
            Ok(found)
        })
        .await
    }

    async fn attempts(&self, key: &EventKey, limit: usize) -> StoreResult<Vec<Attempt>> {
        let prefix = keys::attempts_prefix(key);
        self.scan(move |ks| {
            ks.attempts
                .prefix(prefix)
                .take(limit)
                .map(|item| {
                    let (_, value) = item.into_inner().map_err(internal)?;
                    keys::decode_attempt(&value)
                })
                .collect()
        })
        .await
    }

    async fn purge_finished(&self, params: PurgeParams) -> StoreResult<usize> {
        if params.limit == 0 {
            return Ok(0);
        }
        self.submit(|reply| Job::Purge { params, reply }).await
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        let disk_bytes = self.ks.db.disk_space().map_err(internal)?;
        Ok(StoreStats {
            disk_bytes: Some(disk_bytes),
        })
    }
}
