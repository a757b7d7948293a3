//! From a fired timer entry to a recorded attempt.
//!
//! Fired entries go into a FIFO queue per tenant. A delivery starts when its
//! tenant has a free slot (`max_in_flight_per_tenant`) and a global slot is
//! free (`max_in_flight`); tenants waiting for a global slot take turns
//! (round robin), so a slow or busy tenant cannot stall the others. Only
//! deliveries in flight are tasks; a queued entry costs a few dozen bytes,
//! and the queues are bounded by the timer windows' capacity
//! (`max_events_in_memory`), never by what is pending in the store.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use belfry_core::event::{AttemptReport, EventCommand};
use belfry_core::{DueCursor, EventRecord, EventStatus, PartitionId, TenantName, Verdict};
use belfry_sinks::Delivery;
use belfry_store::{Fence, KeyedCommand};
use tokio::sync::Notify;

use crate::ownership::PartitionLease;
use crate::recorder::Outcome;
use crate::{EngineOptions, Shared};

/// One fired entry waiting for, or holding, a delivery slot.
#[derive(Debug)]
pub(crate) struct Job {
    partition: PartitionId,
    lease: Arc<PartitionLease>,
    entry: DueCursor,
    /// The record read ahead by the partition worker, if any; otherwise it
    /// is read when the delivery starts.
    record: Option<EventRecord>,
}

#[derive(Debug, Default)]
struct TenantQueue {
    in_flight: usize,
    waiting: VecDeque<Job>,
    /// Whether the tenant is in `ready` (has waiting jobs and a free slot).
    is_ready: bool,
}

#[derive(Debug, Default)]
struct DispatchState {
    tenants: HashMap<TenantName, TenantQueue>,
    /// Tenants that could start a delivery if a global slot were free, in
    /// turn order.
    ready: VecDeque<TenantName>,
    in_flight: usize,
}

/// Concurrency limits and per-tenant queues of deliveries.
#[derive(Debug)]
pub(crate) struct Limits {
    global: usize,
    per_tenant: usize,
    state: Mutex<DispatchState>,
    /// Signalled whenever the last in-flight delivery finishes.
    idle: Notify,
}

impl Limits {
    pub(crate) fn new(options: &EngineOptions) -> Self {
        Limits {
            global: options.max_in_flight.max(1),
            per_tenant: options.max_in_flight_per_tenant.max(1),
            state: Mutex::new(DispatchState::default()),
            idle: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DispatchState> {
        // Poison means a panic while held; every update below leaves the
        // counters consistent before anything can panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// Resolves once no delivery is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Queues `jobs`; returns those that may start now.
    fn submit(&self, jobs: Vec<Job>) -> Vec<Job> {
        let mut state = self.lock();
        for job in jobs {
            let tenant = job.entry.key.tenant.clone();
            let queue = state.tenants.entry(tenant.clone()).or_default();
            queue.waiting.push_back(job);
            if !queue.is_ready && queue.in_flight < self.per_tenant {
                queue.is_ready = true;
                state.ready.push_back(tenant);
            }
        }
        self.start_ready(&mut state)
    }

    /// A delivery of `tenant` finished; returns the jobs that may start now.
    fn finish(&self, tenant: &TenantName, stopping: bool) -> Vec<Job> {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some(queue) = state.tenants.get_mut(tenant) {
            queue.in_flight = queue.in_flight.saturating_sub(1);
            if !queue.is_ready && !queue.waiting.is_empty() {
                queue.is_ready = true;
                state.ready.push_back(tenant.clone());
            }
        }
        if state.in_flight == 0 {
            self.idle.notify_waiters();
        }
        if stopping {
            // Queued entries stay pending in the store for the next start.
            state.tenants.clear();
            state.ready.clear();
            return Vec::new();
        }
        self.start_ready(&mut state)
    }

    /// Takes jobs from ready tenants, in turn, while global slots are free.
    fn start_ready(&self, state: &mut DispatchState) -> Vec<Job> {
        let mut starting = Vec::new();
        while state.in_flight < self.global {
            let Some(tenant) = state.ready.pop_front() else {
                break;
            };
            let Some(queue) = state.tenants.get_mut(&tenant) else {
                continue;
            };
            queue.is_ready = false;
            let Some(job) = queue.waiting.pop_front() else {
                continue;
            };
            queue.in_flight += 1;
            let still_ready = !queue.waiting.is_empty() && queue.in_flight < self.per_tenant;
            if still_ready {
                queue.is_ready = true;
            } else if queue.waiting.is_empty() && queue.in_flight == 0 {
                state.tenants.remove(&tenant);
            }
            state.in_flight += 1;
            starting.push(job);
            if still_ready {
                state.ready.push_back(tenant);
            }
        }
        starting
    }
}

/// Hands fired entries to the dispatcher.
pub(crate) fn fire(
    shared: &Arc<Shared>,
    partition: PartitionId,
    lease: &Arc<PartitionLease>,
    entries: Vec<(DueCursor, Option<EventRecord>)>,
) {
    let mut jobs = Vec::with_capacity(entries.len());
    for (entry, record) in entries {
        // A schedule's control event plans occurrences instead of
        // delivering; it takes no delivery slot, so a slow tenant cannot
        // delay it.
        if belfry_core::schedule::schedule_of_control(&entry.key.id).is_some() {
            let (shared, lease) = (shared.clone(), lease.clone());
            tokio::spawn(async move {
                crate::schedules::fire(shared, partition, lease, entry).await;
            });
            continue;
        }
        jobs.push(Job {
            partition,
            lease: lease.clone(),
            entry,
            record,
        });
    }
    let starting = shared.limits.submit(jobs);
    start(shared, starting);
}

fn start(shared: &Arc<Shared>, jobs: Vec<Job>) {
    for job in jobs {
        let slot = Slot {
            shared: shared.clone(),
            tenant: job.entry.key.tenant.clone(),
        };
        tokio::spawn(async move {
            deliver_one(&slot.shared, job).await;
            drop(slot);
        });
    }
}

/// A held delivery slot; released (and the next jobs started) on drop, so
/// even a panicking delivery cannot leak it.
struct Slot {
    shared: Arc<Shared>,
    tenant: TenantName,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let stopping = self
            .shared
            .stopping
            .load(std::sync::atomic::Ordering::SeqCst);
        let next = self.shared.limits.finish(&self.tenant, stopping);
        start(&self.shared, next);
    }
}

/// One delivery, holding a tenant slot and a global slot. The outcome is
/// sent to the recorder before the slots are released, so "no delivery in
/// flight" implies "every outcome handed over".
async fn deliver_one(shared: &Arc<Shared>, job: Job) {
    let Job {
        partition,
        lease,
        entry,
        record: read_ahead,
    } = job;
    if shared.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        // Not started: it stays pending in the store for the next start.
        return;
    }
    let fence = Some(Fence {
        partition,
        epoch: lease.epoch,
    });
    // The window is a hint; the record decides whether this is still due.
    let read = match read_ahead {
        Some(record) => Ok(Some(record)),
        None => shared.store.get_event(&entry.key).await,
    };
    let record = match read {
        Ok(Some(record)) => record,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(key = ?entry.key, %error, "reading a due event failed; retrying it shortly");
            retry_entry_later(shared, partition, entry);
            return;
        }
    };
    if !record.status.is_pending() || record.next_fire_at != Some(entry.due) {
        return;
    }
    // A second copy of a version whose delivery is in progress (see
    // `claims`); released on any early return below.
    let Some(claim) = shared
        .claims
        .claim(partition, &entry.key, record.version.clone())
    else {
        return;
    };
    let now = shared.clock.now();
    // The look-back is for downtime: lateness counts from when this node
    // could first have fired the version, which for one submitted (or
    // moved) past-due is its last change, not its instant. Such an event
    // fires at once, as BigBen does.
    let firable_since = entry.due.max(record.updated_at);
    if record.status == EventStatus::Scheduled
        && now.as_millis() - firable_since.as_millis() > shared.options.lookback.as_millis() as i64
    {
        let reason = format!(
            "missed: came due at {} while the node was down, more than the look-back of {} s ago",
            entry.due,
            shared.options.lookback.as_secs()
        );
        claim.hand_over();
        let _ = shared.outcomes.send(Outcome {
            command: KeyedCommand {
                key: entry.key,
                command: EventCommand::Expire { reason },
                fence,
            },
            version: record.version,
        });
        return;
    }
    let report = match shared.tenants.get(&shared.store, &entry.key.tenant).await {
        Ok(Some(tenant)) => {
            // Checked last, right before the send: a node paused past its
            // lease must not deliver for a partition someone else now owns.
            if !lease.may_fire() {
                tracing::debug!(partition = %partition, "lease lapsed before delivery; holding the event");
                // Back into the window if the lease is renewed; dropped
                // with the worker if the partition went to another node.
                retry_entry_later(shared, partition, entry);
                return;
            }
            let started = Instant::now();
            let result = shared
                .sinks
                .deliver(Delivery {
                    tenant: &tenant,
                    event: &record,
                    attempt: record.attempts + 1,
                    triggered_at: now,
                })
                .await;
            AttemptReport {
                started_at: now,
                duration_ms: started.elapsed().as_millis() as u64,
                verdict: result.verdict,
                http_status: result.http_status,
                error: result.error,
            }
        }
        Ok(None) => AttemptReport {
            started_at: now,
            duration_ms: 0,
            verdict: Verdict::Permanent,
            http_status: None,
            error: Some(format!("tenant not registered: {}", entry.key.tenant)),
        },
        Err(error) => {
            tracing::warn!(tenant = %entry.key.tenant, %error, "reading the tenant failed; retrying shortly");
            retry_entry_later(shared, partition, entry);
            return;
        }
    };
    claim.hand_over();
    let _ = shared.outcomes.send(Outcome {
        command: KeyedCommand {
            key: entry.key,
            command: EventCommand::RecordAttempt {
                version: record.version.clone(),
                report,
            },
            fence,
        },
        version: record.version,
    });
}

/// Puts an entry back in its partition's window after a pause, for a store
/// hiccup that prevented even reading it.
pub(crate) fn retry_entry_later(shared: &Arc<Shared>, partition: PartitionId, entry: DueCursor) {
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        shared
            .owned
            .send(partition, crate::partition::PartitionMsg::Offer(entry));
    });
}
