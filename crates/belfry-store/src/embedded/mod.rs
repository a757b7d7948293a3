//! The embedded backend: fjall (an LSM tree) in a data directory.
//!
//! # Layout
//! - [`keys`]: byte encodings of keys and values;
//! - [`writer`]: the group-commit writer threads (one per shard);
//! - this file: opening the database and the read paths.
//!
//! # Keyspaces
//! | keyspace   | key                                          | value |
//! |------------|----------------------------------------------|-------|
//! | `meta`     | `partitions`, `schema_version`, `attempt_seq/` ++ shard | big-endian integers |
//! | `tenants`  | tenant name                                  | format byte + JSON `TenantConfig` |
//! | `tenant_pauses` | tenant name                             | format byte + JSON `TenantPause` (removed with the tenant) |
//! | `events`   | `tenant 0x00 id`                             | format byte + postcard `EventRecord` |
//! | `due`      | partition u16 ++ next_fire_at ++ event key   | empty; exactly the pending events |
//! | `attempts` | event key ++ 0x00 ++ started_at ++ seq       | format byte + postcard `Attempt` |
//! | `finished` | partition u16 ++ finished_at ++ event key    | empty; drives retention |
//! | `by_status_time` | tenant 0x00 status ++ event_time ++ id | empty; filtered listings |
//! | `leases`   | `tenant 0x00 id`                             | JSON lease (`crate::lease`): the event's latest pull lease |
//! | `api_keys`, `audit` | see [`auth`] | API keys (by hash) and the audit log |
//! | `bulk_actions`, `bulk_by_tenant`, `bulk_running`, `bulk_finished` | see [`bulk`] | bulk actions and their indexes |
//!
//! The listing index holds every event except engine-internal ones
//! (schedules' control events); [`listing`] says how listings read it. A
//! status change or a move in time moves the event's entry (a removal and
//! an insertion, in the same batch as the record). A data directory of
//! schema version 2 (before this index) gets it built from the events when
//! it is opened, before any write.
//!
//! # Ownership
//! One process owns the directory (fjall locks it; the owner records its
//! pid beside the lock, [`owner`]). There is a single
//! partition owner, so every [`crate::Fence`] is accepted and
//! [`StoreError::Fenced`] is never returned.
//!
//! # Sharded writers
//! Writes go through N writer threads (default: the available parallelism,
//! at least 2; [`EmbeddedOptions::writers`]). Shard `i` owns the partitions
//! `p % N == i`. Why: one writer was the ceiling. Its cost is CPU in fjall's
//! memtable (skiplist walks that miss the cache), not the fsync, so a single
//! thread capped ingest at one core while the other idled.
//!
//! Why this is safe without locks: a key always maps to one partition
//! ([`PartitionCount::partition_of`]), hence to one shard, so each event's
//! read-modify-write, its due and finished index entries (partition first)
//! and its attempt history are touched by exactly one thread. fjall accepts
//! concurrent batches from several threads on one `Database`.
//! - [`Store::apply`] splits its commands by shard, keeping each shard's
//!   commands in input order (so all commands of one key stay in order),
//!   sends every part before awaiting any, and answers — results back in
//!   input order — only when every part is durable. Each command is atomic,
//!   each part is all-or-nothing (one group commit), but the parts are
//!   independent: when some parts fail and others commit, the answer is
//!   [`StoreError::Partial`], carrying every command's own result, so the
//!   caller can route what committed and answer each item truthfully.
//! - Tenants are written by shard 0 only.
//! - A purge visits the shards one after the other, each deleting only
//!   its own partitions' events, with what is left of the limit.
//! - Attempt sequence numbers are per shard (`attempt_seq/<shard>`); every
//!   shard starts above the highest stored counter, so a changed shard
//!   count after a restart never reuses a number for the same event.
//!
//! # Durability
//! Every write goes through a writer thread, which answers only after an
//! fsync (`SyncAll`) of fjall's journal that started after its batch
//! committed. The shards share that fsync ([`journal_sync`]): one runs at
//! a time, covering every shard's commits made before it started, so
//! under load two shards cost one fsync, not two of the same file. Reads
//! go straight to fjall and see every answered write.

mod auth;
mod background;
mod bulk;
mod journal_sync;
pub mod keys;
mod listing;
mod owner;
pub mod writer;

use std::num::NonZeroUsize;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use async_trait::async_trait;
use belfry_core::auth::{ApiKey, AuditEntry, KeyHash, KeyId};
use belfry_core::bulk::{BulkAction, BulkActionId};
use belfry_core::event::{Attempt, EventRecord};
use belfry_core::{
    Clock, DueCursor, EventKey, PartitionCount, PartitionId, TenantConfig, TenantName, TenantPause,
    Timestamp,
};
use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use tokio::sync::oneshot;

use self::writer::{Job, Keyspaces, Writer, internal};
use crate::lease::LeaseDoc;
use crate::{
    Applied, ApplyParams, AuditPageParams, ChangeLeaseParams, ChangeLeasesParams,
    CountEventsParams, DuePageParams, LeaseWriteOutcome, ListBulkActionsParams, ListEventsParams,
    PartialApply, PurgeBulkActionsParams, PurgeParams, RecordLeasesParams,
    RunningBulkActionsParams, Store, StoreError, StoreResult, StoreStats, StoredLease,
};

/// Options of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    pub data_dir: PathBuf,
    /// Used when the store is created; an existing store keeps its own.
    pub partitions: PartitionCount,
    /// How many writer threads share the partitions (each owns
    /// `p % writers == its index`). `None`: the available parallelism, at
    /// least 2. Never more than the partition count. May change between
    /// runs.
    pub writers: Option<NonZeroUsize>,
    /// Times commits and upgrades; the system clock by default.
    pub clock: Arc<dyn Clock>,
}

impl EmbeddedOptions {
    /// Options with every tuning knob at its default.
    pub fn new(data_dir: impl Into<PathBuf>, partitions: PartitionCount) -> Self {
        EmbeddedOptions {
            data_dir: data_dir.into(),
            partitions,
            writers: None,
            clock: Arc::new(belfry_clock::SystemClock),
        }
    }

    fn writer_count(&self, partitions: PartitionCount) -> usize {
        let wanted = self.writers.map_or_else(
            || {
                std::thread::available_parallelism()
                    .map_or(2, NonZeroUsize::get)
                    .max(2)
            },
            NonZeroUsize::get,
        );
        wanted.min(usize::from(partitions.get()))
    }
}

/// The embedded store. Cheap to share behind an `Arc`; dropping it stops
/// the writer (after the group in progress) and closes the database.
pub struct EmbeddedStore {
    /// Where the holder's pid is recorded ([`owner`]).
    data_dir: PathBuf,
    ks: Keyspaces,
    /// API keys and the audit log, written outside the group-commit
    /// writers ([`auth`]).
    auth: auth::AuthKeyspaces,
    /// Bulk actions, written outside the group-commit writers too ([`bulk`]).
    bulk: bulk::BulkKeyspaces,
    partitions: PartitionCount,
    /// One job queue per writer shard; shard `i` owns the partitions
    /// `p % shards.len() == i`, and shard 0 also writes tenants. Emptied
    /// only while dropping.
    shards: Vec<mpsc::Sender<Job>>,
    writers: Vec<JoinHandle<()>>,
    /// Per shard, the test switch that fails its commits.
    #[cfg(any(test, feature = "failpoints"))]
    failpoints: Vec<std::sync::Arc<writer::Failpoint>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

/// Creates `dir` (mode 0700) or, if it exists, makes it 0700: event
/// payloads, tenant secrets and key hashes live there, and files inside it
/// are unreachable to other local users whatever their own modes. A
/// directory that was group or world accessible is tightened with a
/// warning (data directories made by earlier versions were 0755).
///
/// # Errors
/// It cannot be created, or its mode cannot be read or changed (not ours).
fn private_dir(dir: &std::path::Path) -> StoreResult<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    const PRIVATE: u32 = 0o700;
    let failed = |what: &str, e: std::io::Error| {
        StoreError::Internal(format!("cannot {what} {}: {e}", dir.display()))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE)
        .create(dir)
        .map_err(|e| failed("create", e))?;
    let mode = std::fs::metadata(dir)
        .map_err(|e| failed("read the mode of", e))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE)).map_err(|e| {
            failed(
                &format!("restrict (to mode 0700; it is {mode:04o}, open to other users)"),
                e,
            )
        })?;
        tracing::warn!(
            data_dir = %dir.display(),
            was = format!("{mode:04o}"),
            "the data directory was accessible to other local users; its mode is now 0700"
        );
    }
    Ok(())
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `options.data_dir`.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if another process holds the directory
    /// (the message names its pid when recorded); [`StoreError::Internal`]
    /// if it cannot be opened otherwise (unreadable, written by a newer
    /// schema).
    pub fn open(options: EmbeddedOptions) -> StoreResult<Self> {
        private_dir(&options.data_dir)?;
        // fjall's flush and compaction workers start here; they run nicer
        // than the rest of the node (`background.rs`).
        let opened =
            background::open_at_lower_priority(background::BACKGROUND_NICE_INCREMENT, || {
                Database::builder(&options.data_dir)
                    .cache_size(tuning::BLOCK_CACHE_BYTES)
                    .worker_threads(tuning::WORKER_THREADS)
                    .open()
            });
        let db = match opened {
            Ok(db) => db,
            Err(fjall::Error::Locked) => {
                return Err(StoreError::Unavailable(owner::in_use_message(
                    &options.data_dir,
                )));
            }
            Err(e) => {
                return Err(StoreError::Internal(format!(
                    "cannot open {}: {e}",
                    options.data_dir.display()
                )));
            }
        };
        owner::record(&options.data_dir);
        let default = KeyspaceCreateOptions::default;
        let ks = Keyspaces {
            meta: open_keyspace(&db, "meta", default)?,
            tenants: open_keyspace(&db, "tenants", default)?,
            tenant_pauses: open_keyspace(&db, "tenant_pauses", default)?,
            events: open_keyspace(&db, "events", tuning::write_heavy)?,
            due: open_keyspace(&db, "due", tuning::write_heavy)?,
            attempts: open_keyspace(&db, "attempts", tuning::write_heavy)?,
            finished: open_keyspace(&db, "finished", tuning::write_heavy)?,
            by_status_time: open_keyspace(&db, "by_status_time", tuning::write_heavy)?,
            leases: open_keyspace(&db, "leases", default)?,
            journal_sync: Default::default(),
            db,
        };
        let auth = auth::AuthKeyspaces::open(&ks.db)?;
        let bulk = bulk::BulkKeyspaces::open(&ks.db)?;
        let partitions = Self::settle_meta(&ks, options.partitions, &*options.clock)?;
        // Every shard starts above the highest number any shard of any
        // earlier run handed out (the shard count may have changed).
        let mut attempt_seq = 0;
        for item in ks.meta.prefix(keys::META_ATTEMPT_SEQ_PREFIX) {
            let (_, bytes) = item.into_inner().map_err(internal)?;
            let seq = bytes
                .as_ref()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| keys::corrupt("attempt_seq"))?;
            attempt_seq = attempt_seq.max(seq);
        }
        let count = options.writer_count(partitions);
        let mut store = EmbeddedStore {
            data_dir: options.data_dir.clone(),
            ks,
            auth,
            bulk,
            partitions,
            shards: Vec::with_capacity(count),
            writers: Vec::with_capacity(count),
            #[cfg(any(test, feature = "failpoints"))]
            failpoints: Vec::with_capacity(count),
        };
        for shard in 0..count {
            let (jobs, receiver) = mpsc::channel();
            let writer = Writer::new(
                store.ks.clone(),
                partitions,
                (shard, count),
                attempt_seq,
                receiver,
                options.clock.clone(),
            );
            #[cfg(any(test, feature = "failpoints"))]
            store.failpoints.push(writer.failpoint.clone());
            // On failure `store` drops, stopping the writers started so far.
            let handle = std::thread::Builder::new()
                .name(format!("belfry-store-writer-{shard}"))
                .spawn(move || writer.run())
                .map_err(|e| StoreError::Internal(format!("cannot start a writer thread: {e}")))?;
            store.shards.push(jobs);
            store.writers.push(handle);
        }
        Ok(store)
    }

    /// Writes the partition count and schema of a new store, or reads and
    /// checks those of an existing one.
    fn settle_meta(
        ks: &Keyspaces,
        configured: PartitionCount,
        clock: &dyn Clock,
    ) -> StoreResult<PartitionCount> {
        if let Some(schema) = ks.meta.get(keys::META_SCHEMA).map_err(internal)? {
            let schema = u32::from_be_bytes(
                schema
                    .as_ref()
                    .try_into()
                    .map_err(|_| keys::corrupt("schema_version"))?,
            );
            // Version 2 lacks only the listing index: build it. No
            // release has shipped with an older layout, so those are not
            // migrated.
            if schema == keys::SCHEMA_VERSION_WITHOUT_LISTING_INDEX {
                Self::add_listing_index(ks, clock)?;
            } else if schema != keys::SCHEMA_VERSION {
                return Err(StoreError::Internal(format!(
                    "the data directory has schema version {schema}; this build reads only {}",
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

    /// Upgrades a version-2 directory: builds the listing index, then
    /// records the new version (only once the index is durable, so a crash
    /// in between repeats the build at the next open).
    fn add_listing_index(ks: &Keyspaces, clock: &dyn Clock) -> StoreResult<()> {
        let started = clock.monotonic();
        let indexed = listing::rebuild(ks)?;
        ks.db.persist(PersistMode::SyncAll).map_err(internal)?;
        ks.meta
            .insert(keys::META_SCHEMA, keys::SCHEMA_VERSION.to_be_bytes())
            .map_err(internal)?;
        ks.db.persist(PersistMode::SyncAll).map_err(internal)?;
        tracing::info!(
            events = indexed,
            elapsed_ms = clock.monotonic().since(started).as_millis() as u64,
            "built the listing index of a schema-2 data directory"
        );
        Ok(())
    }

    /// Sends a job to writer shard `shard` and waits for its answer.
    async fn submit<T>(
        &self,
        shard: usize,
        job: impl FnOnce(oneshot::Sender<StoreResult<T>>) -> Job,
    ) -> StoreResult<T> {
        self.send(shard, job)?.await.map_err(|_| writer_gone())?
    }

    /// Sends a job without waiting, so several shards can work at once.
    fn send<T>(
        &self,
        shard: usize,
        job: impl FnOnce(oneshot::Sender<StoreResult<T>>) -> Job,
    ) -> StoreResult<oneshot::Receiver<StoreResult<T>>> {
        let (reply, answer) = oneshot::channel();
        let jobs = self.shards.get(shard).ok_or_else(writer_gone)?;
        jobs.send(job(reply)).map_err(|_| writer_gone())?;
        Ok(answer)
    }

    fn shard_of(&self, partition: PartitionId) -> usize {
        usize::from(partition.0) % self.shards.len().max(1)
    }

    /// `items` split by writer shard, in input order within each part,
    /// each part with its items' input indexes.
    fn split_by_shard<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        key: impl Fn(&T) -> &EventKey,
    ) -> Vec<(Vec<usize>, Vec<T>)> {
        let mut parts: Vec<(Vec<usize>, Vec<T>)> = (0..self.shards.len())
            .map(|_| (Vec::new(), Vec::new()))
            .collect();
        for (index, item) in items.into_iter().enumerate() {
            let shard = self.shard_of(self.partitions.partition_of(key(&item)));
            parts[shard].0.push(index);
            parts[shard].1.push(item);
        }
        parts
    }

    /// Splits an apply by shard, keeping each shard's commands in input
    /// order (all commands of one key go to one shard, so per-key order is
    /// kept), runs the parts concurrently, and puts the results back in
    /// input order. `Ok` only once every part is durable; when some parts
    /// failed and others committed, [`StoreError::Partial`].
    async fn apply_sharded(&self, params: ApplyParams) -> StoreResult<Vec<Applied>> {
        let total = params.commands.len();
        let parts = self.split_by_shard(params.commands, |command| &command.key);
        let mut pending = Vec::new();
        for (shard, (indexes, commands)) in parts.into_iter().enumerate() {
            if commands.is_empty() {
                continue;
            }
            let part = ApplyParams {
                commands,
                now: params.now,
                retry: params.retry.clone(),
            };
            // A part that cannot be sent fails alone: the others are
            // already on their way.
            let answer = self.send(shard, |reply| Job::Apply {
                params: part,
                reply,
            });
            pending.push((indexes, answer));
        }
        // Every part sent is awaited, even after a failure, so that the
        // answer comes only once no part is still in flight.
        let mut results: Vec<Option<StoreResult<Applied>>> = (0..total).map(|_| None).collect();
        for (indexes, sent) in pending {
            match answer_of(sent).await {
                Ok(applied) if applied.len() == indexes.len() => {
                    for (index, applied) in indexes.into_iter().zip(applied) {
                        results[index] = Some(Ok(applied));
                    }
                }
                Ok(_) => {
                    let error = StoreError::Internal("a writer shard lost a result".into());
                    for index in indexes {
                        results[index] = Some(Err(error.clone()));
                    }
                }
                Err(error) => {
                    for index in indexes {
                        results[index] = Some(Err(error.clone()));
                    }
                }
            }
        }
        let results: Vec<StoreResult<Applied>> = results
            .into_iter()
            .map(|result| {
                // Every index went to exactly one part.
                result.unwrap_or_else(|| Err(StoreError::Internal("a command was lost".into())))
            })
            .collect();
        let applied = results.iter().filter(|result| result.is_ok()).count();
        if applied == 0 || applied == total {
            // All or nothing: a plain answer (the first error, if any).
            return results.into_iter().collect();
        }
        Err(StoreError::Partial(PartialApply { results }))
    }

    /// Runs a read that may scan many entries off the async threads.
    async fn scan<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Keyspaces) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        blocking(self.ks.clone(), read).await
    }
}

/// Opens the keyspace `name`, created with `options` if missing.
pub(crate) fn open_keyspace(
    db: &Database,
    name: &str,
    options: impl FnOnce() -> KeyspaceCreateOptions,
) -> StoreResult<fjall::Keyspace> {
    db.keyspace(name, options).map_err(internal)
}

/// Runs `work` on `state` on a blocking thread: fjall reads may wait on
/// its version lock, which a flush holds while it fsyncs.
pub(crate) async fn blocking<S: Send + 'static, T: Send + 'static>(
    state: S,
    work: impl FnOnce(&S) -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
}

#[cfg(any(test, feature = "failpoints"))]
impl EmbeddedStore {
    /// Test-only (feature `failpoints`): the next `commits` group commits
    /// of the writer shard that writes `key` fail before writing anything.
    pub fn fail_commits_of(&self, key: &EventKey, commits: usize) {
        if let Some(failpoint) = self.failpoints.get(self.writer_shard(key)) {
            failpoint.fail_next(commits);
        }
    }

    /// The writer shard that writes `key` (tests pick keys of different
    /// shards with it).
    pub fn writer_shard(&self, key: &EventKey) -> usize {
        self.shard_of(self.partitions.partition_of(key))
    }
}

/// The stored record under an encoded event key.
fn read_event(ks: &Keyspaces, encoded: &[u8]) -> StoreResult<Option<EventRecord>> {
    match ks.events.get(encoded).map_err(internal)? {
        Some(bytes) => Ok(Some(keys::decode_record(&bytes)?)),
        None => Ok(None),
    }
}

/// The shard that writes tenants: they are few, and one writer keeps their
/// updates in order.
const TENANT_SHARD: usize = 0;

/// The answer to a job [`EmbeddedStore::send`] sent, or why it failed.
async fn answer_of<T>(sent: StoreResult<oneshot::Receiver<StoreResult<T>>>) -> StoreResult<T> {
    sent?.await.unwrap_or_else(|_| Err(writer_gone()))
}

fn writer_gone() -> StoreError {
    StoreError::Unavailable("the embedded store's writer has stopped".into())
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish its group and return;
        // joining it releases its database handles before ours go, so the
        // directory can be reopened as soon as this returns.
        self.shards.clear();
        for writer in self.writers.drain(..) {
            if writer.join().is_err() {
                tracing::error!("an embedded store writer thread panicked");
            }
        }
        // Still holding the lock (the database closes after this), so no
        // other process's record can be removed.
        owner::forget(&self.data_dir);
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
///
/// The block cache serves the point read every update makes of its event
/// (deliveries read events written long before, which sit in table files):
/// 128 MiB instead of fjall's 32 MiB cut ≈ 10 % of the CPU per delivery
/// (48 → 44 µs at 300k events). It is a fixed bound on the store's memory.
/// A hash index in data blocks and uncompressed blocks for `events` gained
/// nothing measurable, so both stay at fjall's defaults.
mod tuning {
    use fjall::KeyspaceCreateOptions;

    pub const BLOCK_CACHE_BYTES: u64 = 128 * 1024 * 1024;

    /// fjall's flush and compaction threads: three, whatever the core
    /// count. fjall 3.1's worker 0 hands every compaction request back to
    /// the queue for the others (`worker_pool.rs`) and picks it up again
    /// while they are busy: with fjall's default of two threads on a 2-core
    /// machine that busy loop took a core whenever a compaction ran (≈ 25 %
    /// more node CPU in a 3M-event ingest, 100+ ms delivery stalls). One
    /// thread avoids the loop but queues flushes behind long compactions
    /// (10M-event ingest: 2.7 GB RSS, 28 s restart replaying the journal).
    /// With three, a request worker 0 hands back finds an idle worker.
    pub const WORKER_THREADS: usize = 3;

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
        self.submit(TENANT_SHARD, |reply| Job::PutTenant { tenant, reply })
            .await
    }

    async fn get_tenant(&self, name: &TenantName) -> StoreResult<Option<TenantConfig>> {
        match self.ks.tenants.get(name.as_str()).map_err(internal)? {
            Some(bytes) => Ok(Some(keys::decode_tenant_doc(&bytes)?)),
            None => Ok(None),
        }
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantConfig>> {
        self.scan(|ks| {
            ks.tenants
                .iter()
                .map(|item| {
                    let (_, value) = item.into_inner().map_err(internal)?;
                    keys::decode_tenant_doc(&value)
                })
                .collect()
        })
        .await
    }

    async fn delete_tenant(&self, name: &TenantName) -> StoreResult<bool> {
        let name = name.clone();
        self.submit(TENANT_SHARD, |reply| Job::DeleteTenant { name, reply })
            .await
    }

    async fn put_tenant_pause(&self, name: &TenantName, pause: TenantPause) -> StoreResult<bool> {
        let name = name.clone();
        self.submit(TENANT_SHARD, |reply| Job::PutTenantPause {
            name,
            pause,
            reply,
        })
        .await
    }

    async fn get_tenant_pause(&self, name: &TenantName) -> StoreResult<Option<TenantPause>> {
        match self.ks.tenant_pauses.get(name.as_str()).map_err(internal)? {
            Some(bytes) => Ok(Some(keys::decode_tenant_doc(&bytes)?)),
            None => Ok(None),
        }
    }

    async fn list_tenant_pauses(&self) -> StoreResult<Vec<(TenantName, TenantPause)>> {
        self.scan(|ks| {
            ks.tenant_pauses
                .iter()
                .map(|item| {
                    let (name, value) = item.into_inner().map_err(internal)?;
                    let name = std::str::from_utf8(&name).map_err(keys::corrupt)?;
                    Ok((
                        TenantName::new(name).map_err(keys::corrupt)?,
                        keys::decode_tenant_doc::<TenantPause>(&value)?,
                    ))
                })
                .collect()
        })
        .await
    }

    async fn apply(&self, params: ApplyParams) -> StoreResult<Vec<Applied>> {
        if params.commands.is_empty() {
            return Ok(Vec::new());
        }
        self.apply_sharded(params).await
    }

    /// Through the writer shard of the fence's partition, in its group.
    async fn record_leases(
        &self,
        params: RecordLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        if params.grants.is_empty() {
            return Ok(Vec::new());
        }
        let shard = self.shard_of(params.fence.partition);
        self.submit(shard, |reply| Job::RecordLeases { params, reply })
            .await
    }

    /// Through the writer shard of the lease's event, in its group.
    async fn change_lease(&self, params: ChangeLeaseParams) -> StoreResult<LeaseWriteOutcome> {
        let shard = self.shard_of(self.partitions.partition_of(params.lease.key()));
        self.submit(shard, |reply| Job::ChangeLease { params, reply })
            .await
    }

    /// One job per writer shard holding any of the changes, staged in one
    /// group there (one commit and fsync per shard for the whole batch).
    async fn change_leases(
        &self,
        params: ChangeLeasesParams,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        let total = params.changes.len();
        let parts = self.split_by_shard(params.changes, |change| change.lease.key());
        let pending: Vec<_> = parts
            .into_iter()
            .enumerate()
            .filter(|(_, (_, changes))| !changes.is_empty())
            .map(|(shard, (indexes, changes))| {
                (
                    indexes,
                    self.send(shard, |reply| Job::ChangeLeases { changes, reply }),
                )
            })
            .collect();
        // Every part sent is awaited, even after a failure, so that the
        // answer comes only once no part is still in flight. A failed part
        // fails the whole batch: its changes must not read as `Done`, and
        // a repeat of the parts that did commit answers the same.
        let mut outcomes: Vec<Option<LeaseWriteOutcome>> = vec![None; total];
        let mut failure = None;
        for (indexes, sent) in pending {
            match answer_of(sent).await {
                Ok(part) if part.len() == indexes.len() => {
                    for (index, outcome) in indexes.into_iter().zip(part) {
                        outcomes[index] = Some(outcome);
                    }
                }
                Ok(_) => {
                    failure = Some(StoreError::Internal(
                        "a writer shard lost an outcome".into(),
                    ))
                }
                Err(error) => failure = Some(error),
            }
        }
        if let Some(error) = failure {
            return Err(error);
        }
        outcomes
            .into_iter()
            .map(|outcome| {
                // Every index went to exactly one part.
                outcome.ok_or_else(|| StoreError::Internal("a lease change was lost".into()))
            })
            .collect()
    }

    async fn get_lease(&self, key: &EventKey) -> StoreResult<Option<StoredLease>> {
        let encoded = keys::event_key(key);
        let Some(bytes) = self.ks.leases.get(&encoded).map_err(internal)? else {
            return Ok(None);
        };
        let stored = LeaseDoc::decode(&bytes)?;
        let record = read_event(&self.ks, &encoded)?;
        Ok(Some(crate::lease::reported(stored, record.as_ref(), None)))
    }

    async fn get_event(&self, key: &EventKey) -> StoreResult<Option<EventRecord>> {
        read_event(&self.ks, &keys::event_key(key))
    }

    /// On a blocking thread: a read can wait on fjall's version lock, which
    /// a flush holds while it fsyncs.
    async fn get_events(&self, keys: &[EventKey]) -> StoreResult<Vec<Option<EventRecord>>> {
        let encoded: Vec<Vec<u8>> = keys.iter().map(keys::event_key).collect();
        self.scan(move |ks| encoded.iter().map(|key| read_event(ks, key)).collect())
            .await
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
            let tenant = params.tenant.as_ref();
            let mut page = Vec::new();
            let mut from = start;
            // Each skipped run restarts the scan past it; bounded so that a
            // skipped tenant with one entry per instant costs no more than
            // reading its entries would.
            let mut seeks_left = params.limit.max(16);
            'scan: loop {
                for item in ks.due.range::<Vec<u8>, _>((from.clone(), end.clone())) {
                    let entry = keys::decode_due_key(&item.key().map_err(internal)?)?;
                    if tenant.is_some_and(|t| entry.key.tenant != *t) {
                        continue;
                    }
                    if params.skip_tenants.contains(&entry.key.tenant) {
                        if seeks_left > 0 {
                            seeks_left -= 1;
                            // Past every entry of this tenant at this instant.
                            let mut past = keys::due_key_raw(params.partition, entry.due, &[]);
                            past.extend_from_slice(&keys::tenant_prefix_end(&entry.key.tenant));
                            from = Bound::Included(past);
                            continue 'scan;
                        }
                        continue;
                    }
                    page.push(entry);
                    if page.len() >= params.limit {
                        break;
                    }
                }
                break;
            }
            Ok(page)
        })
        .await
    }

    /// From the index that matches the filters; see [`listing`].
    async fn list_events(&self, params: ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        self.scan(move |ks| listing::list(ks, &params, &mut 0))
            .await
    }

    /// Index entries and records read, counted by [`listing::list`].
    async fn list_events_reads(&self, params: ListEventsParams) -> StoreResult<Option<u64>> {
        self.scan(move |ks| {
            let mut reads = 0;
            listing::list(ks, &params, &mut reads)?;
            Ok(Some(reads))
        })
        .await
    }

    async fn count_events(&self, params: CountEventsParams) -> StoreResult<u64> {
        self.scan(move |ks| listing::count(ks, &params)).await
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
        // Shard by shard, each taking what the limit leaves, so the total
        // stays within it and falls short only when every shard ran out.
        let mut purged = 0;
        for shard in 0..self.shards.len() {
            let limit = params.limit - purged;
            if limit == 0 {
                break;
            }
            let part = PurgeParams {
                finished_before: params.finished_before,
                limit,
            };
            purged += self
                .submit(shard, |reply| Job::Purge {
                    params: part,
                    reply,
                })
                .await?;
        }
        Ok(purged)
    }

    async fn delete_finished(&self, keys: &[EventKey]) -> StoreResult<Vec<bool>> {
        // Each shard deletes its own partitions' events (no other thread
        // writes them); the parts run at once.
        let parts = self.split_by_shard(keys.iter().cloned(), |key| key);
        let mut pending = Vec::new();
        for (shard, (indexes, keys)) in parts.into_iter().enumerate() {
            if !keys.is_empty() {
                pending.push((
                    indexes,
                    self.send(shard, |reply| Job::DeleteFinished { keys, reply }),
                ));
            }
        }
        // Every part sent is awaited before answering, even after a failure.
        let mut deleted = vec![false; keys.len()];
        let mut failure = None;
        for (indexes, sent) in pending {
            match answer_of(sent).await {
                Ok(part) => {
                    for (index, gone) in indexes.into_iter().zip(part) {
                        deleted[index] = gone;
                    }
                }
                Err(error) => failure = Some(error),
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(deleted),
        }
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        let disk_bytes = self.ks.db.disk_space().map_err(internal)?;
        Ok(StoreStats {
            disk_bytes: Some(disk_bytes),
        })
    }

    async fn put_api_key(&self, key: ApiKey) -> StoreResult<bool> {
        self.auth.run(move |auth| auth.put_key(&key)).await
    }

    async fn api_key_by_hash(&self, hash: &KeyHash) -> StoreResult<Option<ApiKey>> {
        let hash = hash.clone();
        self.auth.run(move |auth| auth.key_by_hash(&hash)).await
    }

    async fn list_api_keys(&self) -> StoreResult<Vec<ApiKey>> {
        self.auth.run(|auth| auth.list_keys()).await
    }

    async fn delete_api_key(&self, id: &KeyId) -> StoreResult<Option<ApiKey>> {
        let id = id.clone();
        self.auth.run(move |auth| auth.delete_key(&id)).await
    }

    async fn touch_api_key(&self, id: &KeyId, at: Timestamp) -> StoreResult<()> {
        let id = id.clone();
        self.auth.run(move |auth| auth.touch_key(&id, at)).await
    }

    async fn append_audit(&self, entry: AuditEntry) -> StoreResult<()> {
        self.auth.run(move |auth| auth.append_audit(&entry)).await
    }

    async fn list_audit(&self, params: AuditPageParams) -> StoreResult<Vec<AuditEntry>> {
        self.auth.run(move |auth| auth.list_audit(&params)).await
    }

    async fn purge_audit(&self, before: Timestamp, limit: usize) -> StoreResult<usize> {
        self.auth
            .run(move |auth| auth.purge_audit(before, limit))
            .await
    }

    async fn create_bulk_action(&self, action: BulkAction) -> StoreResult<bool> {
        self.bulk.run(move |bulk| bulk.create(&action)).await
    }

    async fn get_bulk_action(&self, id: &BulkActionId) -> StoreResult<Option<BulkAction>> {
        let id = id.clone();
        self.bulk.run(move |bulk| bulk.get(&id)).await
    }

    async fn list_bulk_actions(
        &self,
        params: ListBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        self.bulk.run(move |bulk| bulk.list(&params)).await
    }

    async fn running_bulk_actions(
        &self,
        params: RunningBulkActionsParams,
    ) -> StoreResult<Vec<BulkAction>> {
        self.bulk.run(move |bulk| bulk.running(&params)).await
    }

    async fn update_bulk_action(&self, action: BulkAction) -> StoreResult<Option<BulkAction>> {
        self.bulk.run(move |bulk| bulk.update(&action)).await
    }

    async fn purge_bulk_actions(&self, params: PurgeBulkActionsParams) -> StoreResult<usize> {
        self.bulk.run(move |bulk| bulk.purge(&params)).await
    }
}
