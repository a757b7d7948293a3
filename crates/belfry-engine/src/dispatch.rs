//! From a fired timer entry to a recorded attempt.
//!
//! Each fired entry becomes a small task that waits for a slot of its tenant
//! and then a global slot (in that order, so a slow tenant's backlog waits
//! on its own slots without holding global ones), re-reads the event, and
//! delivers it. The number of such tasks is bounded by the timer windows'
//! capacity (`max_events_in_memory`), never by what is pending in the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use belfry_core::event::{AttemptReport, EventCommand};
use belfry_core::{DueCursor, EventStatus, PartitionId, TenantName, Verdict};
use belfry_sinks::Delivery;
use belfry_store::{Fence, KeyedCommand};
use tokio::sync::Semaphore;

use crate::ownership::PartitionLease;
use crate::{EngineOptions, Shared};

/// Concurrency limits of deliveries.
#[derive(Debug)]
pub(crate) struct Limits {
    global: Arc<Semaphore>,
    global_size: usize,
    per_tenant_size: usize,
    per_tenant: Mutex<HashMap<TenantName, Arc<Semaphore>>>,
}

impl Limits {
    pub(crate) fn new(options: &EngineOptions) -> Self {
        let global_size = options.max_in_flight.max(1);
        Limits {
            global: Arc::new(Semaphore::new(global_size)),
            global_size,
            per_tenant_size: options.max_in_flight_per_tenant.max(1),
            per_tenant: Mutex::new(HashMap::new()),
        }
    }

    fn tenant(&self, tenant: &TenantName) -> Arc<Semaphore> {
        // Poison only means another task panicked while inserting; the map
        // is still consistent.
        let mut map = self.per_tenant.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(tenant.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant_size)))
            .clone()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.global_size - self.global.available_permits()
    }

    /// Resolves once no delivery holds a global slot.
    pub(crate) async fn wait_idle(&self) {
        let size = u32::try_from(self.global_size).unwrap_or(u32::MAX);
        let _all = self.global.acquire_many(size).await;
    }
}

/// Hands fired entries to delivery tasks.
pub(crate) fn fire(
    shared: &Arc<Shared>,
    partition: PartitionId,
    lease: &Arc<PartitionLease>,
    entries: Vec<DueCursor>,
) {
    for entry in entries {
        let shared = shared.clone();
        let lease = lease.clone();
        tokio::spawn(async move { deliver_one(shared, partition, lease, entry).await });
    }
}

async fn deliver_one(
    shared: Arc<Shared>,
    partition: PartitionId,
    lease: Arc<PartitionLease>,
    entry: DueCursor,
) {
    let tenant_slots = shared.limits.tenant(&entry.key.tenant);
    let Ok(_tenant_slot) = tenant_slots.acquire_owned().await else {
        return;
    };
    let Ok(_global_slot) = shared.limits.global.clone().acquire_owned().await else {
        return;
    };
    if shared.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        // Not started: it stays pending in the store for the next start.
        return;
    }
    let fence = Some(Fence {
        partition,
        epoch: lease.epoch,
    });
    // The window is a hint; the store decides whether this is still due.
    let record = match shared.store.get_event(&entry.key).await {
        Ok(Some(record)) => record,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(key = ?entry.key, %error, "reading a due event failed; retrying it shortly");
            retry_entry_later(&shared, partition, entry);
            return;
        }
    };
    if !record.status.is_pending() || record.next_fire_at != Some(entry.due) {
        return;
    }
    let now = shared.clock.now();
    if record.status == EventStatus::Scheduled
        && now.as_millis() - entry.due.as_millis() > shared.options.lookback.as_millis() as i64
    {
        let reason = format!(
            "missed: came due at {} while the node was down, more than the look-back of {} s ago",
            entry.due,
            shared.options.lookback.as_secs()
        );
        let _ = shared.outcomes.send(KeyedCommand {
            key: entry.key,
            command: EventCommand::Expire { reason },
            fence,
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
                retry_entry_later(&shared, partition, entry);
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
            retry_entry_later(&shared, partition, entry);
            return;
        }
    };
    let _ = shared.outcomes.send(KeyedCommand {
        key: entry.key,
        command: EventCommand::RecordAttempt {
            version: record.version,
            report,
        },
        fence,
    });
}

/// Puts an entry back in its partition's window after a pause, for a store
/// hiccup that prevented even reading it.
fn retry_entry_later(shared: &Arc<Shared>, partition: PartitionId, entry: DueCursor) {
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        shared
            .owned
            .send(partition, crate::partition::PartitionMsg::Offer(entry));
    });
}
