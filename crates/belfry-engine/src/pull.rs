//! The runtime of this node's [`PullQueue`]: pull tenants' fired entries,
//! workers' claims and calls on leases.
//!
//! The queue decides everything (`belfry_core::pull`); this module performs
//! its actions and feeds the results back, as [`crate::partition`] does for
//! the partition cores:
//! - `PersistGrants` → a fenced store write on its own task → `Persisted`;
//! - `PersistLease` → the lease writer ([`run_lease_writer`]), which
//!   writes whatever is queued with one `change_leases` call (group
//!   commit: one commit for many completes) → `Persisted` each;
//! - `Reply` → the request waiting for it (a oneshot per [`CallId`]);
//! - `Finish` → the partition core of that epoch (ignored when this node
//!   no longer holds it: the new owner fires the event again).
//!
//! One timer task sends `Tick` at the queue's `next_wake`. A request whose
//! caller went away (a dropped long-poll) sends `Abandon`.
//!
//! A cancel or move of a version the queue holds is pushed to it as
//! `VersionEnded`: a change made through this node from the command's
//! answer ([`versions_ended`], before the API answers), a change made
//! through another node when its wake-up arrives ([`changed_elsewhere`]
//! reads the record). A wake-up that never comes leaves the store's fence:
//! the grant or the lease's next write answers `Cancelled`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use belfry_core::event::{Effect, EventRecord};
use belfry_core::notice::Notice;
use belfry_core::pull::{
    Action, CallId, ClaimRequest, Input, LeaseCall, LeaseChange, LeaseId, LeaseRecord, NonceSource,
    OpId, PersistResult, PullConfig, PullError, PullQueue, PullStats, ReadyEntry, Reply,
    Resolution,
};
use belfry_core::{DueCursor, PartitionId, Timestamp};
use belfry_core::{EventKey, EventVersion, TenantName};
use belfry_store::{
    ChangeLeaseParams, ChangeLeasesParams, Fence, RecordLeasesParams, StoreResult, StoredLeaseState,
};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::Shared;
use crate::partition::Ticket;

/// Longest sleep of the timer task between ticks: the wall clock may jump.
pub(crate) const MAX_SLEEP: Duration = Duration::from_secs(1);

/// The node's pull queue and the requests waiting for its answers.
#[derive(Debug)]
pub(crate) struct PullRuntime {
    queue: Mutex<PullQueue>,
    /// One per claim or call in progress; bounded by the queue's waiter
    /// and per-lease call bounds (a refused request is answered at once).
    replies: Mutex<HashMap<CallId, oneshot::Sender<Reply>>>,
    next_call: AtomicU64,
    /// Pokes the timer task: the queue's next wake-up may be earlier.
    wake: Notify,
    /// Lease changes on their way to the store, a batch at a time.
    pub(crate) lease_writes: LeaseWrites,
    /// The tickets of the entries the queue holds, finished when the
    /// queue says so.
    tickets: Mutex<HashMap<(PartitionId, u64, DueCursor), Ticket>>,
}

impl PullRuntime {
    /// `now` seeds lease nonces if the OS has no randomness.
    pub(crate) fn new(config: &PullConfig, now: Timestamp) -> Self {
        let nonces = NonceSource::random().unwrap_or_else(|error| {
            // Nonces only tell leases of one attempt apart; the fencing
            // (epoch, attempt, store check) does not depend on them.
            tracing::warn!(%error, "no OS randomness for lease nonces; seeding from the time");
            NonceSource::from_seed(now.as_millis().unsigned_abs())
        });
        PullRuntime {
            queue: Mutex::new(PullQueue::new(config.clone(), nonces)),
            replies: Mutex::new(HashMap::new()),
            next_call: AtomicU64::new(0),
            wake: Notify::new(),
            lease_writes: LeaseWrites::new(config.max_leases),
            tickets: Mutex::default(),
        }
    }

    fn tickets(&self) -> MutexGuard<'_, HashMap<(PartitionId, u64, DueCursor), Ticket>> {
        self.tickets.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PullQueue> {
        // Poison means a panic inside `handle`; the queue is then suspect,
        // but every lease is fenced in the store, so going on is safe.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn replies(&self) -> MutexGuard<'_, HashMap<CallId, oneshot::Sender<Reply>>> {
        self.replies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops every waiting request's sender (shutdown): they answer
    /// `unavailable`.
    pub(crate) fn drop_waiting(&self) {
        self.replies().clear();
    }

    pub(crate) fn stats(&self) -> PullStats {
        self.lock().stats().clone()
    }

    /// The queue's sizes and counters for `/metrics`, under one lock.
    pub(crate) fn metrics_state(&self) -> belfry_metrics::PullState {
        let queue = self.lock();
        let stats = queue.stats();
        belfry_metrics::PullState {
            ready: queue.ready_len() + queue.granting_len(),
            leases: queue.leases_len(),
            parked_claims: queue.waiters_len(),
            granted: stats.granted,
            completed: stats.completed,
            failed: stats.failed,
            released: stats.released,
            expired: stats.expired,
            refused: stats.refused,
        }
    }
}

/// Feeds `input` to the queue and performs what it asks for.
pub(crate) fn handle(shared: &Arc<Shared>, input: Input) {
    let actions = shared.pull.lock().handle(input, shared.env.clock.now());
    perform(shared, actions);
    shared.pull.wake.notify_one();
    shared.pull_peers.queue_changed();
}

/// Tells the queue that the versions of `key` it holds other than
/// `current`'s pending one ended (`current`: the record after a change,
/// `None` if it does not exist). Cheap when nothing of `key` is held.
pub(crate) fn versions_ended(shared: &Arc<Shared>, key: &EventKey, current: Option<&EventRecord>) {
    let ended = ended_versions(shared, key, current);
    if !ended.is_empty() {
        let now = shared.env.clock.now();
        let actions = {
            let mut queue = shared.pull.lock();
            ended
                .into_iter()
                .flat_map(|version| {
                    queue.handle(
                        Input::VersionEnded {
                            key: key.clone(),
                            version,
                        },
                        now,
                    )
                })
                .collect()
        };
        perform(shared, actions);
        shared.pull.wake.notify_one();
    }
}

/// The held versions of `key` that `current` no longer has pending.
fn ended_versions(
    shared: &Shared,
    key: &EventKey,
    current: Option<&EventRecord>,
) -> Vec<EventVersion> {
    let queue = shared.pull.lock();
    if queue.holds_nothing() {
        return Vec::new();
    }
    let live = current
        .filter(|record| record.status.is_pending())
        .map(|record| &record.version);
    queue
        .held_versions(key)
        .into_iter()
        .filter(|version| Some(version) != live)
        .collect()
}

/// `key` was changed through another node (its wake-up arrived): if the
/// queue holds a version of it, the record is read to tell whether that
/// version ended.
pub(crate) fn changed_elsewhere(shared: &Arc<Shared>, key: EventKey) {
    if shared.pull.lock().held_versions(&key).is_empty() {
        return;
    }
    let tasks = shared.env.tasks.clone();
    let shared = shared.clone();
    tasks.spawn(async move {
        match shared.env.store.get_event(&key).await {
            Ok(record) => versions_ended(&shared, &key, record.as_ref()),
            // The store's fence still stops the version: its grant or its
            // lease's next write answers `Cancelled`.
            Err(error) => {
                tracing::warn!(%error, "reading a changed event of the pull queue failed")
            }
        }
    });
}

/// Hands a fired entry of a pull tenant to the queue. It stays
/// outstanding in its partition core until the queue finishes it.
pub(crate) fn ready(shared: &Arc<Shared>, ticket: Ticket, entry: ReadyEntry) {
    // Kept before the queue sees the entry: it may hand it back at once.
    shared
        .pull
        .tickets()
        .insert((entry.partition, entry.epoch, entry.entry.clone()), ticket);
    handle(shared, Input::Ready(vec![entry]));
}

/// This node no longer holds `partition` under `epoch` (already removed
/// from the owned partitions): its leases are void, and its entries held
/// here are finished, so a hand-over waiting for its outstanding entries
/// ends.
pub(crate) fn partition_lost(shared: &Arc<Shared>, partition: PartitionId, epoch: u64) {
    let actions = shared
        .pull
        .lock()
        .handle(Input::PartitionLost { partition }, shared.env.clock.now());
    perform(shared, actions);
    // Any left of that term are finished too: nothing can claim them now.
    let left: Vec<Ticket> = {
        let mut tickets = shared.pull.tickets();
        let keys: Vec<_> = tickets
            .keys()
            .filter(|(p, e, _)| *p == partition && *e == epoch)
            .cloned()
            .collect();
        keys.iter().filter_map(|key| tickets.remove(key)).collect()
    };
    for ticket in left {
        ticket.finish(belfry_core::fire::Finish::Done);
    }
    shared.pull.wake.notify_one();
    shared.pull_peers.queue_changed();
}

/// The changes that give back this node's live leases of `partitions`
/// when it lets them go cleanly ([`PullQueue::give_back`]): taken before
/// the queue is told they are lost, written by [`write_given_back`]
/// before the partitions are given up.
pub(crate) fn give_back(
    shared: &Shared,
    partitions: impl IntoIterator<Item = PartitionId>,
) -> Vec<ChangeLeaseParams> {
    let at = shared.env.clock.now();
    let queue = shared.pull.lock();
    partitions
        .into_iter()
        .flat_map(|partition| {
            queue
                .give_back(partition, at)
                .into_iter()
                .map(move |(lease, change)| ChangeLeaseParams {
                    fence: Fence {
                        partition,
                        epoch: lease.epoch(),
                    },
                    lease,
                    change,
                    at,
                })
        })
        .collect()
}

/// Writes what [`give_back`] made, within `grace`. Their events are
/// pending again at their leases' expiries, with no attempt counted; a
/// write that fails or comes too late leaves the leases orphaned, and the
/// next owner records their expiries as attempts.
pub(crate) async fn write_given_back(
    shared: &Shared,
    changes: Vec<ChangeLeaseParams>,
    grace: Duration,
) {
    if changes.is_empty() {
        return;
    }
    let count = changes.len();
    let written = tokio::time::timeout(
        grace,
        shared
            .env
            .store
            .change_leases(ChangeLeasesParams { changes }),
    )
    .await;
    match written {
        Ok(Ok(outcomes)) => {
            let given = outcomes
                .iter()
                .filter(|o| **o == belfry_store::LeaseWriteOutcome::Done)
                .count();
            tracing::debug!(given, leases = count, "pull leases given back");
        }
        Ok(Err(error)) => tracing::warn!(
            %error,
            leases = count,
            "giving pull leases back failed; their expiries will count as attempts"
        ),
        Err(_) => tracing::warn!(
            leases = count,
            "giving pull leases back took too long; their expiries will count as attempts"
        ),
    }
}

/// Sends `Abandon` if dropped before its answer came (the caller went
/// away: a dropped long-poll connection).
struct Pending {
    shared: Arc<Shared>,
    call: CallId,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.pull.replies().remove(&self.call);
            handle(&self.shared, Input::Abandon { call: self.call });
        }
    }
}

/// Sends `make(call)` to the queue and waits for its reply.
async fn ask(shared: &Arc<Shared>, make: impl FnOnce(CallId) -> Input) -> Reply {
    ask_until(shared, make, std::future::pending()).await
}

/// [`ask`], withdrawing a parked claim once `withdraw` resolves
/// ([`Input::Withdraw`]): it is answered at once, empty unless its grant
/// was being recorded.
pub(crate) async fn ask_until(
    shared: &Arc<Shared>,
    make: impl FnOnce(CallId) -> Input,
    withdraw: impl std::future::Future<Output = ()>,
) -> Reply {
    let call = CallId(shared.pull.next_call.fetch_add(1, Ordering::Relaxed));
    let (sender, mut receiver) = oneshot::channel();
    shared.pull.replies().insert(call, sender);
    let mut pending = Pending {
        shared: shared.clone(),
        call,
        answered: false,
    };
    handle(shared, make(call));
    let reply = tokio::select! {
        biased;
        reply = &mut receiver => reply,
        () = withdraw => {
            handle(shared, Input::Withdraw { call });
            receiver.await
        }
    };
    pending.answered = true;
    // The sender is only dropped unanswered when the engine stops.
    reply.unwrap_or(Reply::Error(PullError::Unavailable))
}

/// A worker's claim of `tenant`'s due events.
pub(crate) async fn claim(
    shared: &Arc<Shared>,
    tenant: TenantName,
    request: ClaimRequest,
) -> Reply {
    let arrived = shared.env.clock.monotonic();
    let reply = ask(shared, |call| Input::Claim {
        call,
        tenant,
        request,
    })
    .await;
    record_claim_metrics(&reply, shared.env.clock.monotonic().since(arrived));
    reply
}

/// The claim's wait, and each lease's lateness from due to leased.
fn record_claim_metrics(reply: &Reply, waited: Duration) {
    match reply {
        Reply::Leases(leases) => {
            belfry_metrics::claim_answered(!leases.is_empty(), waited);
            for lease in leases {
                let late_ms = lease.leased_at.as_millis() - lease.due_at.as_millis();
                belfry_metrics::lease_granted(
                    lease.attempt <= 1,
                    Duration::from_millis(u64::try_from(late_ms).unwrap_or(0)),
                );
            }
        }
        Reply::Error(error) => belfry_metrics::pull_error(error.code()),
        _ => {}
    }
}

/// A call on a lease; the caller checked it may reach the lease's tenant.
pub(crate) async fn call(shared: &Arc<Shared>, lease: LeaseId, request: LeaseCall) -> Reply {
    let ending = Ending::of(&request);
    let reply = ask(shared, |call| Input::Call {
        call,
        lease: lease.clone(),
        request,
    })
    .await;
    let reply = match ending {
        Some(ending) if matches!(reply, Reply::Error(PullError::LeaseLost)) => {
            match recorded_outcome(shared, &lease, ending).await {
                Ok(recorded) => recorded.unwrap_or(reply),
                // The call may have been recorded: not known, so not
                // `lease_lost` (its worker would give up on an event it
                // ended).
                Err(error) => {
                    tracing::warn!(%error, "reading the outcome recorded for a lease failed");
                    Reply::Error(PullError::Unavailable)
                }
            }
        }
        _ => reply,
    };
    if let Reply::Error(error) = &reply {
        belfry_metrics::pull_error(error.code());
    }
    reply
}

/// A call that ends a lease, whose repeat the store's record answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Complete,
    Fail,
    Release,
}

impl Ending {
    fn of(request: &LeaseCall) -> Option<Ending> {
        match request {
            LeaseCall::Complete { .. } => Some(Ending::Complete),
            LeaseCall::Fail(_) => Some(Ending::Fail),
            LeaseCall::Release { .. } => Some(Ending::Release),
            LeaseCall::Heartbeat { .. } => None,
        }
    }
}

/// The answer to `request` on `lease` from the store's record alone
/// ([`recorded_outcome`]); `None` for a heartbeat, which no record
/// answers. See [`Pull::recorded_outcome`].
pub(crate) async fn recorded(
    shared: &Shared,
    lease: &LeaseId,
    request: &LeaseCall,
) -> StoreResult<Option<Reply>> {
    match Ending::of(request) {
        Some(ending) => recorded_outcome(shared, lease, ending).await,
        None => Ok(None),
    }
}

/// The answer to a repeated complete, fail or release that this node no
/// longer remembers (it restarted after recording it, perhaps before the
/// worker read the answer; or the partition moved), or that reached a node
/// whose owner of the lease could not be asked: the store's resolution of
/// exactly this lease by its worker, if it is of the kind the call asks
/// for. A lease that expired ended by no call of its worker's: every call
/// on it stays `lease_lost`.
///
/// # Errors
/// The store could not be read: whether the call was recorded is not
/// known.
async fn recorded_outcome(
    shared: &Shared,
    lease: &LeaseId,
    ending: Ending,
) -> StoreResult<Option<Reply>> {
    let Some(stored) = shared.env.store.get_lease(lease.key()).await? else {
        return Ok(None);
    };
    if stored.record.lease != *lease {
        return Ok(None);
    }
    let StoredLeaseState::Resolved(resolution) = stored.state else {
        return Ok(None);
    };
    Ok(match (ending, resolution) {
        (Ending::Complete, Resolution::Delivered { .. }) => Some(Reply::Completed),
        (Ending::Fail, Resolution::Retry { at }) => Some(Reply::Failed {
            next_attempt_at: Some(at),
        }),
        (Ending::Fail, Resolution::Dead { .. }) => Some(Reply::Failed {
            next_attempt_at: None,
        }),
        (Ending::Release, Resolution::Released { at }) => Some(Reply::Released {
            next_attempt_at: at,
        }),
        _ => None,
    })
}

/// Performs `actions`; a `Finish` finishes the entry's ticket.
fn perform(shared: &Arc<Shared>, actions: Vec<Action>) {
    for action in actions {
        match action {
            Action::PersistGrants { op, grants, .. } => {
                let tasks = shared.env.tasks.clone();
                let shared = shared.clone();
                tasks.spawn(async move {
                    let results = record_grants(&shared, grants).await;
                    handle(&shared, Input::Persisted { op, results });
                });
            }
            Action::PersistLease {
                op,
                lease,
                partition,
                epoch,
                change,
            } => queue_lease_write(shared, op, lease, Fence { partition, epoch }, change),
            Action::Reply { call, reply } => {
                if let Some(sender) = shared.pull.replies().remove(&call) {
                    // The caller may have gone meanwhile; nothing to do.
                    let _ = sender.send(reply);
                }
            }
            Action::Finish {
                partition,
                epoch,
                entry,
                finish,
            } => {
                let ticket = shared.pull.tickets().remove(&(partition, epoch, entry));
                if let Some(ticket) = ticket {
                    ticket.finish(finish);
                }
            }
        }
    }
}

/// Most lease changes written by one [`Store::change_leases`] call.
///
/// [`Store::change_leases`]: belfry_store::Store::change_leases
const MAX_LEASE_BATCH: usize = 256;

/// Lease batches being written at once: one slow batch (a PostgreSQL
/// transaction waiting on a lock) does not hold up every heartbeat, while
/// what queues meanwhile still goes out together. Safe because the queue
/// has at most one write in flight per lease.
const LEASE_BATCHES_IN_FLIGHT: usize = 4;

/// A `PersistLease` waiting for the lease writer.
#[derive(Debug)]
pub(crate) struct LeaseWrite {
    op: OpId,
    partition: PartitionId,
    /// The event's next attempt, to arm once the change is recorded.
    next_at: Option<Timestamp>,
    params: ChangeLeaseParams,
}

/// The lease writer's queue: at most one write is in flight per lease
/// (the queue's `busy` op), so `max_leases` bounds it.
#[derive(Debug)]
pub(crate) struct LeaseWrites {
    sender: mpsc::Sender<LeaseWrite>,
    /// Taken by [`run_lease_writer`] when the engine starts.
    receiver: Mutex<Option<mpsc::Receiver<LeaseWrite>>>,
}

impl LeaseWrites {
    fn new(max_leases: usize) -> Self {
        let (sender, receiver) = mpsc::channel(max_leases.max(1));
        LeaseWrites {
            sender,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    pub(crate) fn take_receiver(&self) -> Option<mpsc::Receiver<LeaseWrite>> {
        self.receiver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// Hands a lease change to the lease writer, fenced by `fence` (the
/// lease's own partition and epoch, or for an orphan's expiry the epoch
/// it was found in). Should its queue be full or closed (shutdown), the
/// change is written alone on its own task.
fn queue_lease_write(
    shared: &Arc<Shared>,
    op: OpId,
    lease: LeaseId,
    fence: Fence,
    change: LeaseChange,
) {
    let next_at = match &change {
        LeaseChange::Resolve {
            resolution: Resolution::Retry { at } | Resolution::Released { at },
            ..
        }
        | LeaseChange::Expire {
            resolution: Resolution::Retry { at },
            ..
        } => Some(*at),
        _ => None,
    };
    let write = LeaseWrite {
        op,
        partition: fence.partition,
        next_at,
        params: ChangeLeaseParams {
            fence,
            lease,
            change,
            at: shared.env.clock.now(),
        },
    };
    if let Err(error) = shared.pull.lease_writes.sender.try_send(write) {
        let write = error.into_inner();
        let tasks = shared.env.tasks.clone();
        let shared = shared.clone();
        tasks.spawn(async move { write_leases(&shared, vec![write]).await });
    }
}

/// Group commit for lease writes: takes whatever is queued (up to
/// [`MAX_LEASE_BATCH`]) and writes it with one `change_leases` call (up to
/// [`LEASE_BATCHES_IN_FLIGHT`] calls at once), then feeds each result
/// back. At shutdown the queue is closed and drained.
pub(crate) async fn run_lease_writer(shared: Arc<Shared>, mut writes: mpsc::Receiver<LeaseWrite>) {
    let mut stop = shared.env.tasks.stop_receiver();
    let mut closed = false;
    let mut batch = Vec::with_capacity(MAX_LEASE_BATCH);
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        if in_flight.len() >= LEASE_BATCHES_IN_FLIGHT {
            in_flight.join_next().await;
        }
        tokio::select! {
            biased;
            // 0 only once closed and empty: everything queued is written.
            received = writes.recv_many(&mut batch, MAX_LEASE_BATCH) => {
                if received == 0 {
                    break;
                }
            }
            _ = stop.wait_for(|stop| *stop), if !closed => {
                writes.close();
                closed = true;
                continue;
            }
        }
        let shared = shared.clone();
        let batch = std::mem::replace(&mut batch, Vec::with_capacity(MAX_LEASE_BATCH));
        in_flight.spawn(async move { write_leases(&shared, batch).await });
        // Finished batches are reaped as we go; the bound above waits.
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
    tracing::debug!("pull lease writer stopped");
}

/// Writes `batch` in one store call and feeds every result to the queue
/// (a store error answers each `Unavailable`: none reads as done).
async fn write_leases(shared: &Arc<Shared>, batch: Vec<LeaseWrite>) {
    // What is needed after the write: the op, and the event to arm.
    let mut writes = Vec::with_capacity(batch.len());
    let mut changes = Vec::with_capacity(batch.len());
    // The notices of the events failed for good, raised once written.
    let mut notices = Vec::new();
    for write in batch {
        let arm = write
            .next_at
            .map(|at| (write.partition, write.params.lease.key().clone(), at));
        writes.push((write.op, arm));
        let lease = &write.params.lease;
        let notice = write.params.change.dead_reason().and_then(|reason| {
            Notice::of_failure(lease.key(), lease.version(), reason, write.params.at)
        });
        notices.push(notice.map(|notice| (lease.key().tenant.clone(), notice)));
        changes.push(write.params);
    }
    let count = changes.len();
    let results: Vec<PersistResult> = match shared
        .env
        .store
        .change_leases(ChangeLeasesParams { changes })
        .await
    {
        Ok(outcomes) if outcomes.len() == count => outcomes.into_iter().map(Into::into).collect(),
        Ok(_) => {
            tracing::warn!("recording lease changes answered a wrong number of outcomes");
            vec![PersistResult::Unavailable; count]
        }
        Err(error) => {
            tracing::warn!(%error, changes = count, "recording lease changes failed");
            vec![PersistResult::Unavailable; count]
        }
    };
    let now = shared.env.clock.now();
    let actions = {
        let mut queue = shared.pull.lock();
        let mut actions = Vec::new();
        for ((op, _), result) in writes.iter().zip(&results) {
            actions.extend(queue.handle(
                Input::Persisted {
                    op: *op,
                    results: vec![result.clone()],
                },
                now,
            ));
        }
        actions
    };
    perform(shared, actions);
    shared.pull.wake.notify_one();
    shared.pull_peers.queue_changed();
    // After the queue finished the entries in their cores (as the
    // recorder does for a push retry): armed now, the next attempt fires
    // at its instant, not at the next repair page.
    for (((_, arm), result), notice) in writes.into_iter().zip(results).zip(notices) {
        if result != PersistResult::Done {
            continue;
        }
        if let Some((partition, key, at)) = arm {
            shared.send_effect(partition, key, &Effect::Arm { at });
        }
        if let Some((tenant, notice)) = notice {
            crate::notices::raise(shared, &tenant, notice);
        }
    }
}

/// How many partitions' grant writes one claim keeps in flight at once.
/// Sent together, they share the store's group commits (a claim of 100
/// events touches dozens of partitions); awaited one after the other, each
/// waited for its own fsync. Not more: on PostgreSQL each is a
/// transaction, and the default pool holds 16 connections (64 measured no
/// better than 16 on the embedded store, within the runs' spread).
const GRANT_WRITES_IN_FLIGHT: usize = 16;

/// Records grants, one store call per partition (each fenced by its
/// epoch), up to [`GRANT_WRITES_IN_FLIGHT`] calls at once; one result per
/// grant, in order.
async fn record_grants(shared: &Shared, grants: Vec<LeaseRecord>) -> Vec<PersistResult> {
    use futures::StreamExt as _;
    let mut results = vec![PersistResult::Unavailable; grants.len()];
    let mut groups: Vec<(Fence, Vec<usize>)> = Vec::new();
    for (index, grant) in grants.iter().enumerate() {
        let fence = Fence {
            partition: grant.partition,
            epoch: grant.lease.epoch(),
        };
        match groups.iter_mut().find(|(f, _)| *f == fence) {
            Some((_, indexes)) => indexes.push(index),
            None => groups.push((fence, vec![index])),
        }
    }
    let writes = groups.into_iter().map(|(fence, indexes)| {
        let params = RecordLeasesParams {
            fence,
            grants: indexes.iter().map(|&i| grants[i].clone()).collect(),
        };
        async move { (indexes, shared.env.store.record_leases(params).await) }
    });
    let mut answers = futures::stream::iter(writes).buffer_unordered(GRANT_WRITES_IN_FLIGHT);
    while let Some((indexes, answer)) = answers.next().await {
        match answer {
            Ok(outcomes) => {
                for (&index, outcome) in indexes.iter().zip(outcomes) {
                    results[index] = outcome.into();
                }
            }
            Err(error) => tracing::warn!(%error, "recording lease grants failed"),
        }
    }
    results
}

/// Sends `Tick` at the queue's next wake-up until the engine stops.
pub(crate) async fn run_timer(shared: Arc<Shared>) {
    let mut stop = shared.env.tasks.stop_receiver();
    loop {
        if *stop.borrow() {
            break;
        }
        let notified = shared.pull.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = shared.env.clock.now();
        let wake_at = shared.pull.lock().next_wake();
        let sleep_for = wake_at.map_or(MAX_SLEEP, |at| now.until(at).min(MAX_SLEEP));
        if sleep_for.is_zero() {
            handle(&shared, Input::Tick);
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            _ = notified => {}
            _ = crate::tasks::pause(sleep_for) => handle(&shared, Input::Tick),
        }
    }
}

/// The pull queue of this node, and its part in a cluster's pull claims
/// ([`crate::EngineHandle::pull`]).
#[derive(Debug, Clone, Copy)]
pub struct Pull<'a> {
    pub(crate) shared: &'a Arc<Shared>,
}

impl Pull<'_> {
    /// A worker's claim of `tenant`'s due events (a pull tenant's; the
    /// caller checked the key reaches it). Waits up to the claim's wait;
    /// dropping the future abandons the claim.
    pub async fn claim(&self, tenant: TenantName, request: ClaimRequest) -> Reply {
        claim(self.shared, tenant, request).await
    }

    /// A call on a lease; the caller checked the key reaches its tenant.
    pub async fn call(&self, lease: LeaseId, request: LeaseCall) -> Reply {
        call(self.shared, lease, request).await
    }

    /// The answer the store's record of exactly `lease` gives a complete,
    /// fail or release (`request`), without the pull queue: for a node that
    /// could not ask the lease's owner (it went away, perhaps after
    /// recording the call). `Some` when the lease was resolved the way the
    /// call asks, answered as its owner would have; `None` when nothing of
    /// the kind is recorded (the lease may still be live on its owner), and
    /// for a heartbeat.
    ///
    /// # Errors
    /// Store failures: whether the call was recorded is not known.
    pub async fn recorded_outcome(
        &self,
        lease: &LeaseId,
        request: &LeaseCall,
    ) -> StoreResult<Option<Reply>> {
        recorded(self.shared, lease, request).await
    }

    /// The pull queue's counters.
    pub fn stats(&self) -> PullStats {
        self.shared.pull.stats()
    }
}
