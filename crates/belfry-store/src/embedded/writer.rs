//! A group-commit writer: one per shard, the only thread that writes the
//! events of its shard's partitions (see the sharding notes in the parent
//! module). Shard 0 also writes tenants.
//!
//! Callers send [`Job`]s over a channel and await a oneshot answer. The
//! writer blocks for the first job, then drains whatever else is already
//! waiting (up to [`MAX_GROUP_COMMANDS`] commands), applies every command
//! through [`transition`] against a read-your-writes overlay, writes ONE
//! fjall batch, fsyncs once, and only then answers every job of the group.
//! So an `Ok` answer always means "on disk", and the fsync cost (≈ 2 ms here)
//! is shared by everything that arrived while the previous group was syncing.
//!
//! # Why an overlay
//! All items of one fjall batch share a sequence number, so the same key
//! must not be written twice in a batch. Commands are therefore applied to
//! an in-memory map of event states first; index changes are computed once
//! per event at the end, from the state as stored before the group to the
//! state after it.
//!
//! # Atomicity
//! A job first loads every event it touches; only reads can fail, so a job
//! whose load fails (an undecodable stored record) is answered with the
//! error, its loads are forgotten, and its neighbours are unaffected. The
//! transitions themselves cannot fail.
//!
//! # Speed
//! The cost is dominated by fjall's memtable (a skiplist): each lookup and
//! insert walks it with cache misses. Loads and batch items are therefore
//! issued in key order, so consecutive walks share their upper levels in the
//! CPU cache.

use std::sync::mpsc::{Receiver, TryRecvError};

use belfry_core::event::{
    Attempt, EventCommand, EventRecord, EventStatus, Replaced, TransitionContext, transition,
};
use belfry_core::{
    EventKey, EventVersion, PartitionCount, PartitionId, TenantConfig, TenantName, TenantPause,
    Timestamp,
};
use fjall::{Database, Keyspace, OwnedWriteBatch};
use rustc_hash::FxHashMap as HashMap;
use tokio::sync::oneshot;

use super::keys;
use crate::lease::{LeaseDoc, decide_change, decide_grant};
use crate::{
    Applied, ApplyParams, ChangeLeaseParams, LeaseWriteOutcome, PurgeParams, RecordLeasesParams,
    StoreError, StoreResult, StoredLease,
};

/// The most commands one group takes before it commits. Bounds the
/// overlay's memory and the latency of the first job of a group.
pub const MAX_GROUP_COMMANDS: usize = 20_000;

/// Handles on every keyspace of the store.
#[derive(Clone)]
pub struct Keyspaces {
    pub db: Database,
    pub meta: Keyspace,
    pub tenants: Keyspace,
    /// Tenants' pause states, by name: removed with the tenant.
    pub tenant_pauses: Keyspace,
    pub events: Keyspace,
    pub due: Keyspace,
    pub attempts: Keyspace,
    pub finished: Keyspace,
    /// The listing index: `tenant 0x00 status event_time id`.
    pub by_status_time: Keyspace,
    /// Pull leases: `tenant 0x00 id` → JSON [`LeaseDoc`], the event's
    /// latest lease.
    pub leases: Keyspace,
    /// The writer shards' shared fsync of fjall's one journal.
    pub journal_sync: std::sync::Arc<super::journal_sync::JournalSync>,
}

/// A write request and where to send its answer.
pub enum Job {
    Apply {
        params: ApplyParams,
        reply: oneshot::Sender<StoreResult<Vec<Applied>>>,
    },
    PutTenant {
        tenant: TenantConfig,
        reply: oneshot::Sender<StoreResult<()>>,
    },
    DeleteTenant {
        name: TenantName,
        reply: oneshot::Sender<StoreResult<bool>>,
    },
    PutTenantPause {
        name: TenantName,
        pause: TenantPause,
        reply: oneshot::Sender<StoreResult<bool>>,
    },
    Purge {
        params: PurgeParams,
        reply: oneshot::Sender<StoreResult<usize>>,
    },
    /// Events of this shard's partitions, to delete if finished.
    DeleteFinished {
        keys: Vec<EventKey>,
        reply: oneshot::Sender<StoreResult<Vec<bool>>>,
    },
    RecordLeases {
        params: RecordLeasesParams,
        reply: oneshot::Sender<StoreResult<Vec<LeaseWriteOutcome>>>,
    },
    ChangeLease {
        params: ChangeLeaseParams,
        reply: oneshot::Sender<StoreResult<LeaseWriteOutcome>>,
    },
    /// Lease changes of this shard's partitions, staged in order in one
    /// group (one commit for all).
    ChangeLeases {
        changes: Vec<ChangeLeaseParams>,
        reply: oneshot::Sender<StoreResult<Vec<LeaseWriteOutcome>>>,
    },
}

impl Job {
    /// A purge or a delete reads the stored records and indexes itself,
    /// so it runs alone, never on top of a group's unwritten overlay.
    fn runs_alone(&self) -> bool {
        matches!(self, Job::Purge { .. } | Job::DeleteFinished { .. })
    }
}

/// An answer held back until the group is durable.
enum Answer {
    Apply(
        oneshot::Sender<StoreResult<Vec<Applied>>>,
        StoreResult<Vec<Applied>>,
    ),
    PutTenant(oneshot::Sender<StoreResult<()>>, StoreResult<()>),
    DeleteTenant(oneshot::Sender<StoreResult<bool>>, StoreResult<bool>),
    PutTenantPause(oneshot::Sender<StoreResult<bool>>, StoreResult<bool>),
    RecordLeases(
        oneshot::Sender<StoreResult<Vec<LeaseWriteOutcome>>>,
        StoreResult<Vec<LeaseWriteOutcome>>,
    ),
    ChangeLease(
        oneshot::Sender<StoreResult<LeaseWriteOutcome>>,
        StoreResult<LeaseWriteOutcome>,
    ),
    ChangeLeases(
        oneshot::Sender<StoreResult<Vec<LeaseWriteOutcome>>>,
        StoreResult<Vec<LeaseWriteOutcome>>,
    ),
}

impl Answer {
    /// Sends the answer, replaced by `failure` if the commit failed.
    fn send(self, failure: Option<&StoreError>) {
        fn settle<T>(result: StoreResult<T>, failure: Option<&StoreError>) -> StoreResult<T> {
            match failure {
                Some(error) if result.is_ok() => Err(error.clone()),
                _ => result,
            }
        }
        // A caller that stopped waiting is not an error: its write is durable anyway.
        match self {
            Answer::Apply(reply, result) => drop(reply.send(settle(result, failure))),
            Answer::PutTenant(reply, result) => drop(reply.send(settle(result, failure))),
            Answer::DeleteTenant(reply, result) => drop(reply.send(settle(result, failure))),
            Answer::PutTenantPause(reply, result) => drop(reply.send(settle(result, failure))),
            Answer::RecordLeases(reply, result) => drop(reply.send(settle(result, failure))),
            Answer::ChangeLease(reply, result) => drop(reply.send(settle(result, failure))),
            Answer::ChangeLeases(reply, result) => drop(reply.send(settle(result, failure))),
        }
    }
}

/// One event as the group sees it.
#[derive(Clone)]
struct Slot {
    /// Where the stored record (before this group) sits in the due index.
    stored_due: Option<(PartitionId, Timestamp)>,
    /// Where the stored record sits in the finished index.
    stored_finished: Option<(PartitionId, Timestamp)>,
    /// Where the stored record sits in the listing index.
    stored_listed: Option<Listed>,
    /// The state after the commands applied so far.
    current: Option<EventRecord>,
    /// Whether `current` differs from what is stored.
    dirty: bool,
}

/// Everything a group will write.
#[derive(Default)]
struct Group {
    /// By encoded event key.
    events: HashMap<Vec<u8>, Slot>,
    /// `None`: delete.
    tenants: HashMap<TenantName, Option<TenantConfig>>,
    /// `None`: delete (with the tenant).
    pauses: HashMap<TenantName, Option<TenantPause>>,
    /// New history entries by key; their keys are unique.
    attempts: Vec<(Vec<u8>, Attempt)>,
    /// Leases as the group sees them, by encoded event key: the state
    /// after the jobs so far, and whether it differs from what is stored.
    leases: HashMap<Vec<u8>, (Option<StoredLease>, bool)>,
    commands: usize,
    answers: Vec<Answer>,
}

/// By encoded event key: the `(version, number)` of every attempt in its
/// history (see [`Writer::load_recorded_attempts`]).
type RecordedAttempts = HashMap<Vec<u8>, Vec<(EventVersion, u32)>>;

/// What places an event in the listing index (`by_status_time`): its
/// status and instant. Engine-internal events (schedules' control events)
/// are not listed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub status: EventStatus,
    pub event_time: Timestamp,
}

impl Listed {
    pub fn of(record: &EventRecord) -> Option<Listed> {
        (!record.key.id.is_internal()).then_some(Listed {
            status: record.status,
            event_time: record.event_time,
        })
    }

    /// Its `by_status_time` key.
    pub fn key(self, encoded: &[u8]) -> Vec<u8> {
        keys::by_status_time_key_raw(encoded, self.status, self.event_time)
    }
}

pub struct Writer {
    ks: Keyspaces,
    partitions: PartitionCount,
    /// This writer owns the partitions `p` with `p % shards == shard`.
    shard: usize,
    shards: usize,
    /// The last attempt sequence number handed out; persisted in `meta`.
    attempt_seq: u64,
    jobs: Receiver<Job>,
    /// Times commits (metrics).
    clock: std::sync::Arc<dyn belfry_core::Clock>,
    /// Tests make this shard's next commits fail (see [`Failpoint`]).
    #[cfg(any(test, feature = "failpoints"))]
    pub failpoint: std::sync::Arc<Failpoint>,
}

/// Test-only fault injection (feature `failpoints`): the next `n` group
/// commits of one shard fail before anything is written, as an I/O error
/// of fjall would; every job of such a group is answered with the error.
#[cfg(any(test, feature = "failpoints"))]
#[derive(Debug, Default)]
pub struct Failpoint(std::sync::atomic::AtomicUsize);

#[cfg(any(test, feature = "failpoints"))]
impl Failpoint {
    pub fn fail_next(&self, commits: usize) {
        self.0.store(commits, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether this commit fails (and counts it).
    fn trip(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.0
            .fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1))
            .is_ok()
    }
}

impl Writer {
    /// A writer for shard `shard` of `shards`. `attempt_seq` must be at
    /// least every sequence number any shard ever handed out, so that keys
    /// moving between shards (after a change of the shard count) never
    /// reuse one.
    pub fn new(
        ks: Keyspaces,
        partitions: PartitionCount,
        (shard, shards): (usize, usize),
        attempt_seq: u64,
        jobs: Receiver<Job>,
        clock: std::sync::Arc<dyn belfry_core::Clock>,
    ) -> Self {
        Writer {
            ks,
            partitions,
            shard,
            shards,
            attempt_seq,
            jobs,
            clock,
            #[cfg(any(test, feature = "failpoints"))]
            failpoint: std::sync::Arc::default(),
        }
    }

    /// Runs until every sender is gone, then returns (dropping the database
    /// handles, which flushes fjall's journal).
    pub fn run(mut self) {
        while let Ok(first) = self.jobs.recv() {
            let mut next = Some(first);
            while let Some(job) = next.take() {
                let Some(job) = self.run_alone(job) else {
                    next = self.jobs.try_recv().ok();
                    continue;
                };
                let mut group = Group::default();
                self.stage(job, &mut group);
                while group.commands < MAX_GROUP_COMMANDS {
                    match self.jobs.try_recv() {
                        Ok(job) if job.runs_alone() => {
                            next = Some(job);
                            break;
                        }
                        Ok(job) => self.stage(job, &mut group),
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
                self.commit(group);
            }
        }
        tracing::debug!("embedded store writer stopped");
    }

    /// Runs a job that [runs alone](Job::runs_alone); hands any other back.
    fn run_alone(&self, job: Job) -> Option<Job> {
        match job {
            Job::Purge { params, reply } => drop(reply.send(self.purge(&params))),
            Job::DeleteFinished { keys, reply } => drop(reply.send(self.delete_finished(&keys))),
            job => return Some(job),
        }
        None
    }

    /// Whether `name` is registered, as the group's writes so far leave it.
    fn tenant_exists(&self, name: &TenantName, group: &Group) -> StoreResult<bool> {
        match group.tenants.get(name) {
            Some(staged) => Ok(staged.is_some()),
            None => self
                .ks
                .tenants
                .contains_key(name.as_str().as_bytes())
                .map_err(internal),
        }
    }

    fn stage(&mut self, job: Job, group: &mut Group) {
        match job {
            Job::Apply { params, reply } => {
                group.commands += params.commands.len().max(1);
                let result = self.stage_apply(params, group);
                group.answers.push(Answer::Apply(reply, result));
            }
            Job::PutTenant { tenant, reply } => {
                group.commands += 1;
                group.tenants.insert(tenant.name.clone(), Some(tenant));
                group.answers.push(Answer::PutTenant(reply, Ok(())));
            }
            Job::DeleteTenant { name, reply } => {
                group.commands += 1;
                let existed = self.tenant_exists(&name, group);
                if existed.is_ok() {
                    group.tenants.insert(name.clone(), None);
                    group.pauses.insert(name, None);
                }
                group.answers.push(Answer::DeleteTenant(reply, existed));
            }
            Job::PutTenantPause { name, pause, reply } => {
                group.commands += 1;
                let exists = self.tenant_exists(&name, group);
                if matches!(exists, Ok(true)) {
                    group.pauses.insert(name, Some(pause));
                }
                group.answers.push(Answer::PutTenantPause(reply, exists));
            }
            Job::RecordLeases { params, reply } => {
                group.commands += params.grants.len().max(1);
                let result = self.stage_grants(params, group);
                group.answers.push(Answer::RecordLeases(reply, result));
            }
            Job::ChangeLease { params, reply } => {
                group.commands += 1;
                let result = self.stage_lease_change(params, group);
                group.answers.push(Answer::ChangeLease(reply, result));
            }
            Job::ChangeLeases { changes, reply } => {
                group.commands += changes.len().max(1);
                let result = self.stage_lease_changes(changes, group);
                group.answers.push(Answer::ChangeLeases(reply, result));
            }
            // `run` never stages these; answer rather than drop them.
            Job::Purge { reply, .. } => {
                let _ = reply.send(Err(StoreError::Internal("purge staged in a group".into())));
            }
            Job::DeleteFinished { reply, .. } => {
                let _ = reply.send(Err(StoreError::Internal("delete staged in a group".into())));
            }
        }
    }

    /// Applies one job's commands on top of the group's overlay.
    fn stage_apply(&mut self, params: ApplyParams, group: &mut Group) -> StoreResult<Vec<Applied>> {
        let encoded: Vec<Vec<u8>> = params
            .commands
            .iter()
            .map(|c| keys::event_key(&c.key))
            .collect();
        self.load_missing(&encoded, group)?;
        let mut recorded = self.load_recorded_attempts(&params.commands, &encoded, group)?;
        let mut results = Vec::with_capacity(params.commands.len());
        for (command, encoded) in params.commands.into_iter().zip(encoded) {
            let Some(slot) = group.events.get_mut(&encoded) else {
                // `load_missing` put every key of the job in the overlay.
                return Err(StoreError::Internal(
                    "event missing from the overlay".into(),
                ));
            };
            let partition = slot.current.as_ref().map_or_else(
                || self.partitions.partition_of(&command.key),
                |r| r.partition,
            );
            let step = transition(
                &command.key,
                slot.current.as_ref(),
                command.command,
                TransitionContext {
                    now: params.now,
                    partition,
                    retry: &params.retry,
                },
            );
            let replaced = Replaced::of(slot.current.as_ref(), &step.outcome);
            if let Some(next) = step.next {
                slot.current = Some(next);
                slot.dirty = true;
            }
            results.push(Applied {
                key: command.key,
                partition,
                outcome: step.outcome,
                record: slot.current.clone(),
                effects: step.effects,
                replaced,
            });
            if let Some(attempt) = step.attempt {
                // A stale attempt recorded before (a retried write) is not
                // written again; a current one the transition already
                // refused (`AttemptAlreadyRecorded`).
                let id = (attempt.version.clone(), attempt.number);
                let repeat = recorded.get_mut(&encoded).is_some_and(|ids| {
                    let known = ids.contains(&id);
                    ids.push(id);
                    known
                });
                if !repeat {
                    self.attempt_seq += 1;
                    let key = keys::attempt_key_raw(&encoded, attempt.started_at, self.attempt_seq);
                    group.attempts.push((key, attempt));
                }
            }
        }
        Ok(results)
    }

    /// The attempts `(version, number)` already in the history (stored or
    /// staged by this group) of each event that `commands` may record a
    /// stale attempt of: one whose state before this job does not take the
    /// attempt as the next of its pending version, or that the job changes
    /// more than once. The common case, the next attempt of a pending
    /// event, reads nothing. Read before any command is staged, so a read
    /// failure stages nothing.
    fn load_recorded_attempts(
        &self,
        commands: &[crate::KeyedCommand],
        encoded: &[Vec<u8>],
        group: &Group,
    ) -> StoreResult<RecordedAttempts> {
        let mut recorded = RecordedAttempts::default();
        for (command, key) in commands.iter().zip(encoded) {
            let EventCommand::RecordAttempt {
                version, number, ..
            } = &command.command
            else {
                continue;
            };
            if recorded.contains_key(key) {
                continue;
            }
            let current = group.events.get(key).and_then(|slot| slot.current.as_ref());
            let next_of_pending = current.is_some_and(|r| {
                r.version == *version && r.status.is_pending() && *number > r.attempts
            });
            let changed_again = encoded.iter().filter(|k| *k == key).count() > 1;
            if current.is_none() || (next_of_pending && !changed_again) {
                continue;
            }
            let prefix = keys::attempts_prefix_raw(key);
            let mut ids = Vec::new();
            for item in self.ks.attempts.prefix(&prefix) {
                let (_, value) = item.into_inner().map_err(internal)?;
                let attempt = keys::decode_attempt(&value)?;
                ids.push((attempt.version, attempt.number));
            }
            ids.extend(
                group
                    .attempts
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(_, a)| (a.version.clone(), a.number)),
            );
            recorded.insert(key.clone(), ids);
        }
        Ok(recorded)
    }

    /// Records grants on top of the group's overlay ([`decide_grant`]; a
    /// single owner: every fence's epoch is current).
    fn stage_grants(
        &mut self,
        params: RecordLeasesParams,
        group: &mut Group,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        let encoded: Vec<Vec<u8>> = params
            .grants
            .iter()
            .map(|grant| keys::event_key(grant.lease.key()))
            .collect();
        self.load_missing(&encoded, group)?;
        self.load_leases(&encoded, group)?;
        let mut outcomes = Vec::with_capacity(params.grants.len());
        for (grant, encoded) in params.grants.iter().zip(&encoded) {
            // Another partition's key belongs to another writer.
            if self.partitions.partition_of(grant.lease.key()) != params.fence.partition {
                outcomes.push(LeaseWriteOutcome::Lost);
                continue;
            }
            let record = group.events.get(encoded).and_then(|s| s.current.as_ref());
            let stored = group.leases.get(encoded).and_then(|(l, _)| l.as_ref());
            let (outcome, write) =
                decide_grant(params.fence, params.fence.epoch, record, stored, grant);
            if let Some(lease) = write {
                group.leases.insert(encoded.clone(), (Some(lease), true));
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Extends or resolves a lease on top of the group's overlay
    /// ([`decide_change`]), moving its event in the same group.
    fn stage_lease_change(
        &mut self,
        params: ChangeLeaseParams,
        group: &mut Group,
    ) -> StoreResult<LeaseWriteOutcome> {
        let encoded = keys::event_key(params.lease.key());
        self.load_for_changes(std::slice::from_ref(&encoded), group)?;
        Ok(self.decide_and_stage(&params, &encoded, group))
    }

    /// [`Self::stage_lease_change`] for each change, in order. Everything
    /// is read before anything is staged, so a read failure stages none
    /// of them (and answers the error for all).
    fn stage_lease_changes(
        &mut self,
        changes: Vec<ChangeLeaseParams>,
        group: &mut Group,
    ) -> StoreResult<Vec<LeaseWriteOutcome>> {
        let encoded: Vec<Vec<u8>> = changes
            .iter()
            .map(|change| keys::event_key(change.lease.key()))
            .collect();
        self.load_for_changes(&encoded, group)?;
        Ok(changes
            .iter()
            .zip(&encoded)
            .map(|(params, encoded)| self.decide_and_stage(params, encoded, group))
            .collect())
    }

    /// Puts the events and leases of `encoded` in the overlay.
    fn load_for_changes(&self, encoded: &[Vec<u8>], group: &mut Group) -> StoreResult<()> {
        self.load_missing(encoded, group)?;
        self.load_leases(encoded, group)
    }

    /// Decides one change on the overlay (which holds its event and lease)
    /// and stages what it writes.
    fn decide_and_stage(
        &mut self,
        params: &ChangeLeaseParams,
        encoded: &[u8],
        group: &mut Group,
    ) -> LeaseWriteOutcome {
        let record = group.events.get(encoded).and_then(|s| s.current.as_ref());
        let stored = group.leases.get(encoded).and_then(|(l, _)| l.as_ref());
        let (outcome, write) = decide_change(params.fence.epoch, record, stored, params);
        if let Some(write) = write {
            group
                .leases
                .insert(encoded.to_vec(), (Some(write.lease), true));
            if let (Some(next), Some(slot)) = (write.record, group.events.get_mut(encoded)) {
                slot.current = Some(next);
                slot.dirty = true;
            }
            if let Some(attempt) = write.attempt {
                self.attempt_seq += 1;
                let key = keys::attempt_key_raw(encoded, attempt.started_at, self.attempt_seq);
                group.attempts.push((key, attempt));
            }
        }
        outcome
    }

    /// Reads the stored lease of every key whose lease is not yet in the
    /// overlay.
    fn load_leases(&self, encoded: &[Vec<u8>], group: &mut Group) -> StoreResult<()> {
        let mut loaded = Vec::new();
        for key in encoded {
            if group.leases.contains_key(key) || loaded.iter().any(|(k, _)| k == key) {
                continue;
            }
            let stored = match self.ks.leases.get(key).map_err(internal)? {
                Some(bytes) => Some(LeaseDoc::decode(&bytes)?),
                None => None,
            };
            loaded.push((key.clone(), stored));
        }
        for (key, stored) in loaded {
            group.leases.insert(key, (stored, false));
        }
        Ok(())
    }

    /// Reads the stored state of every key not yet in the overlay, in key
    /// order. On failure the overlay is left as it was.
    fn load_missing(&self, encoded: &[Vec<u8>], group: &mut Group) -> StoreResult<()> {
        let mut missing: Vec<&Vec<u8>> = encoded
            .iter()
            .filter(|k| !group.events.contains_key(*k))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        group.events.reserve(missing.len());
        for (done, key) in missing.iter().enumerate() {
            match self.load(key) {
                Ok(slot) => {
                    group.events.insert((*key).clone(), slot);
                }
                Err(error) => {
                    for loaded in &missing[..done] {
                        group.events.remove(*loaded);
                    }
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    fn load(&self, encoded: &[u8]) -> StoreResult<Slot> {
        let stored = super::read_event(&self.ks, encoded)?;
        Ok(Slot {
            stored_due: stored
                .as_ref()
                .and_then(|r| r.next_fire_at.map(|at| (r.partition, at))),
            stored_finished: stored
                .as_ref()
                .and_then(|r| r.finished_at.map(|at| (r.partition, at))),
            stored_listed: stored.as_ref().and_then(Listed::of),
            current: stored,
            dirty: false,
        })
    }

    /// Writes the group in one batch, fsyncs, then answers.
    fn commit(&mut self, mut group: Group) {
        let started = self.clock.monotonic();
        let failure = self.write_group(&group).err();
        belfry_metrics::store_commit(
            belfry_metrics::Store::Embedded,
            group.commands,
            self.clock.monotonic().since(started),
        );
        if let Some(error) = &failure {
            tracing::error!(%error, "embedded store commit failed");
        }
        for answer in group.answers.drain(..) {
            answer.send(failure.as_ref());
        }
    }

    fn write_group(&self, group: &Group) -> StoreResult<()> {
        #[cfg(any(test, feature = "failpoints"))]
        if self.failpoint.trip() {
            return Err(StoreError::Internal("injected commit failure".into()));
        }
        let ks = &self.ks;
        let mut events: Vec<(&Vec<u8>, &EventRecord)> = group
            .events
            .iter()
            .filter(|(_, slot)| slot.dirty)
            .filter_map(|(key, slot)| slot.current.as_ref().map(|record| (key, record)))
            .collect();
        events.sort_unstable_by(|a, b| a.0.cmp(b.0));
        // Index changes: (key, insert?) — removals and insertions never
        // share a key (they differ in the instant, or in the status).
        let mut due: Vec<(Vec<u8>, bool)> = Vec::with_capacity(events.len());
        let mut finished: Vec<(Vec<u8>, bool)> = Vec::new();
        let mut by_status_time: Vec<(Vec<u8>, bool)> = Vec::with_capacity(events.len());
        let mut batch = OwnedWriteBatch::with_capacity(
            ks.db.clone(),
            events.len() * 3 + group.attempts.len() + group.tenants.len() + group.pauses.len() + 1,
        );
        for (encoded, record) in &events {
            let slot = &group.events[*encoded];
            batch.insert(&ks.events, encoded.as_slice(), keys::encode_record(record)?);
            let now_due = record.next_fire_at.map(|at| (record.partition, at));
            if now_due != slot.stored_due {
                if let Some((partition, at)) = slot.stored_due {
                    due.push((keys::due_key_raw(partition, at, encoded), false));
                }
                if let Some((partition, at)) = now_due {
                    due.push((keys::due_key_raw(partition, at, encoded), true));
                }
            }
            let now_finished = record.finished_at.map(|at| (record.partition, at));
            if now_finished != slot.stored_finished {
                if let Some((partition, at)) = slot.stored_finished {
                    finished.push((keys::finished_key_raw(partition, at, encoded), false));
                }
                if let Some((partition, at)) = now_finished {
                    finished.push((keys::finished_key_raw(partition, at, encoded), true));
                }
            }
            // The listing entry moves when the status or the instant
            // changes: one removal and one insertion.
            let now_listed = Listed::of(record);
            if now_listed != slot.stored_listed {
                if let Some(listed) = slot.stored_listed {
                    by_status_time.push((listed.key(encoded), false));
                }
                if let Some(listed) = now_listed {
                    by_status_time.push((listed.key(encoded), true));
                }
            }
        }
        for (index, changes) in [
            (&ks.due, &mut due),
            (&ks.finished, &mut finished),
            (&ks.by_status_time, &mut by_status_time),
        ] {
            changes.sort_unstable();
            for (key, insert) in changes.drain(..) {
                if insert {
                    batch.insert(index, key, []);
                } else {
                    batch.remove(index, key);
                }
            }
        }
        let mut leases: Vec<(&Vec<u8>, &StoredLease)> = group
            .leases
            .iter()
            .filter(|(_, (_, dirty))| *dirty)
            .filter_map(|(key, (lease, _))| lease.as_ref().map(|lease| (key, lease)))
            .collect();
        leases.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (key, lease) in leases {
            batch.insert(&ks.leases, key.as_slice(), LeaseDoc::encode(lease)?);
        }
        let mut attempts: Vec<&(Vec<u8>, Attempt)> = group.attempts.iter().collect();
        attempts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, attempt) in attempts {
            batch.insert(&ks.attempts, key.as_slice(), keys::encode_attempt(attempt)?);
        }
        if !group.attempts.is_empty() {
            batch.insert(
                &ks.meta,
                keys::meta_attempt_seq(self.shard),
                self.attempt_seq.to_be_bytes(),
            );
        }
        for (name, tenant) in &group.tenants {
            match tenant {
                Some(tenant) => {
                    batch.insert(&ks.tenants, name.as_str(), keys::encode_tenant_doc(tenant)?);
                }
                None => batch.remove(&ks.tenants, name.as_str()),
            }
        }
        for (name, pause) in &group.pauses {
            match pause {
                Some(pause) => {
                    let value = keys::encode_tenant_doc(pause)?;
                    batch.insert(&ks.tenant_pauses, name.as_str(), value);
                }
                None => batch.remove(&ks.tenant_pauses, name.as_str()),
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        batch.commit().map_err(internal)?;
        ks.journal_sync.persist_committed(&ks.db).map_err(internal)
    }

    /// Deletes up to `limit` events that finished before the cut-off, with
    /// their history and index entries. Durable when it returns.
    ///
    /// Only this shard's partitions: their events are written by no other
    /// thread, so the read-then-delete cannot race with a concurrent update.
    /// `limit` bounds the index entries visited, stale ones included.
    fn purge(&self, params: &PurgeParams) -> StoreResult<usize> {
        let ks = &self.ks;
        let mut batch = ks.db.batch();
        let mut purged = 0;
        let owned = self.partitions.all().skip(self.shard).step_by(self.shards);
        let entries = owned.flat_map(|partition| {
            let start = keys::finished_before(partition, Timestamp::from_millis(i64::MIN));
            let end = keys::finished_before(partition, params.finished_before);
            ks.finished.range(start..end)
        });
        for item in entries.take(params.limit) {
            let index_key = item.key().map_err(internal)?;
            let (finished_at, key) = keys::decode_finished_key(&index_key)?;
            batch.remove(&ks.finished, index_key);
            let encoded = keys::event_key(&key);
            let Some(bytes) = ks.events.get(&encoded).map_err(internal)? else {
                continue;
            };
            let record = keys::decode_record(&bytes)?;
            // The index entry may be stale; only the entry that matches the
            // record's own finish takes the event with it.
            if record.status.is_pending() || record.finished_at != Some(finished_at) {
                continue;
            }
            self.remove_finished(&mut batch, &encoded, &record)?;
            purged += 1;
        }
        self.commit_alone(batch)?;
        Ok(purged)
    }

    /// Deletes the events of `keys` (all of this shard's partitions) that
    /// are finished, with their history, lease and index entries; per key,
    /// whether it went. One batch: every event goes, or none. Durable when
    /// it returns.
    fn delete_finished(&self, keys: &[EventKey]) -> StoreResult<Vec<bool>> {
        let ks = &self.ks;
        let mut batch = ks.db.batch();
        let mut deleted = Vec::with_capacity(keys.len());
        // A key named twice goes once: the repeat finds it gone.
        let mut gone = rustc_hash::FxHashSet::default();
        for key in keys {
            let encoded = keys::event_key(key);
            let record = match ks.events.get(&encoded).map_err(internal)? {
                Some(bytes) if !gone.contains(&encoded) => keys::decode_record(&bytes)?,
                _ => {
                    deleted.push(false);
                    continue;
                }
            };
            if record.status.is_pending() {
                deleted.push(false);
                continue;
            }
            if let Some(at) = record.finished_at {
                batch.remove(
                    &ks.finished,
                    keys::finished_key_raw(record.partition, at, &encoded),
                );
            }
            self.remove_finished(&mut batch, &encoded, &record)?;
            gone.insert(encoded);
            deleted.push(true);
        }
        self.commit_alone(batch)?;
        Ok(deleted)
    }

    /// Adds to `batch` the removal of a finished event's record, listing
    /// entry, lease and history (not its finished index entry, which the
    /// caller knows).
    fn remove_finished(
        &self,
        batch: &mut OwnedWriteBatch,
        encoded: &[u8],
        record: &EventRecord,
    ) -> StoreResult<()> {
        let ks = &self.ks;
        if let Some(listed) = Listed::of(record) {
            batch.remove(&ks.by_status_time, listed.key(encoded));
        }
        batch.remove(&ks.leases, encoded);
        batch.remove(&ks.events, encoded);
        for attempt in ks.attempts.prefix(keys::attempts_prefix(&record.key)) {
            batch.remove(&ks.attempts, attempt.key().map_err(internal)?);
        }
        Ok(())
    }

    /// Commits and fsyncs a batch of a job that runs alone.
    fn commit_alone(&self, batch: OwnedWriteBatch) -> StoreResult<()> {
        if !batch.is_empty() {
            batch.commit().map_err(internal)?;
            self.ks
                .journal_sync
                .persist_committed(&self.ks.db)
                .map_err(internal)?;
        }
        Ok(())
    }
}

pub fn internal(error: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(error.to_string())
}
