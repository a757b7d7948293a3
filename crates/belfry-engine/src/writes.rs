//! Writes made for callers that may go away: API requests, ingested
//! batches, bulk action pages, schedule management ([`EngineHandle::apply`]
//! and the like).
//!
//! The store call and the routing of its timer effects run in a task of
//! their own, which the caller only awaits. A caller that goes away (its
//! client reset the connection, `server.request_timeout_ms` passed, the
//! ingest stopped) drops its wait, not the write: once commands are handed
//! to the store, whatever it commits reaches the owning partition. Routed
//! only by the caller, a change committed unheard left the partition
//! firing what it had read ahead (a cancelled event delivered, a moved one
//! at its old instant), and the client's retry found nothing left to do.
//!
//! A write that fails may still have committed (the store answers an error
//! after its commit, or a batch failed in part): the entries of the events
//! whose outcome is unknown that have fired already read their records
//! again before delivering (`Input::MayHaveChanged`), and their partitions
//! reload their windows, so they fire from what the store holds, not from
//! what they read ahead.
//!
//! Shutdown waits for the writes in flight ([`Writes::wait_idle`]).
//!
//! [`EngineHandle::apply`]: crate::EngineHandle::apply

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use belfry_core::fire::Input;
use belfry_core::{EventKey, PartitionId};
use belfry_store::{Applied, KeyedCommand, StoreError, StoreResult};
use tokio::sync::Notify;

use crate::Shared;

/// The writes in flight.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Writes {
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves once no write is in flight.
    pub(crate) async fn wait_idle(&self) {
        crate::tasks::wait_until(&self.idle, || self.in_flight() == 0).await;
    }
}

/// Counts one write in flight until dropped (with its task).
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: Arc<Shared>) -> Self {
        shared.writes.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(shared)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.writes.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.writes.idle.notify_waiters();
        }
    }
}

/// Applies `commands` and routes their effects, in a task the caller's
/// going away does not stop; `then` runs in that task once every command
/// was applied (e.g. quota accounting of a schedule created).
///
/// # Errors
/// As [`belfry_store::Store::apply`]; [`StoreError::Unavailable`] if the
/// runtime stopped the task.
pub(crate) async fn apply(
    shared: &Arc<Shared>,
    commands: Vec<KeyedCommand>,
    then: impl FnOnce(&Shared) + Send + 'static,
) -> StoreResult<Vec<Applied>> {
    let in_flight = InFlight::new(shared.clone());
    let task = shared.env.tasks.spawn_joined(async move {
        let shared = &in_flight.0;
        let partitions = shared.env.store.partitions();
        // In input order, as the store answers a partial failure.
        let of_command: Vec<(PartitionId, EventKey)> = commands
            .iter()
            .map(|c| (partitions.partition_of(&c.key), c.key.clone()))
            .collect();
        let result = shared.env.apply_now(commands).await;
        match &result {
            Ok(applied) => {
                shared.route_effects(applied);
                shared.quotas.applied(applied);
                then(shared);
            }
            Err(StoreError::Partial(partial)) => {
                let mut unknown = Vec::new();
                for (result, command) in partial.results.iter().zip(of_command) {
                    match result {
                        Ok(applied) => {
                            shared.route_effects(std::slice::from_ref(applied));
                            shared.quotas.applied(std::slice::from_ref(applied));
                        }
                        Err(_) => unknown.push(command),
                    }
                }
                unsure(shared, unknown);
            }
            Err(_) => unsure(shared, of_command),
        }
        result
    });
    task.join().await.unwrap_or_else(|| {
        Err(StoreError::Unavailable(
            "the write was stopped by shutdown; it may or may not have been made".to_string(),
        ))
    })
}

/// The commands of these events failed: they may have been made all the
/// same, so their fired entries read their records again and their
/// partitions page their windows in again (dropping what they read ahead)
/// rather than trust them.
fn unsure(shared: &Shared, events: Vec<(PartitionId, EventKey)>) {
    let now = shared.env.clock.now();
    let mut partitions = BTreeSet::new();
    for (partition, key) in events {
        shared
            .owned
            .input(partition, Input::MayHaveChanged(key), now);
        partitions.insert(partition);
    }
    for partition in partitions {
        shared.owned.input(partition, Input::Reload, now);
    }
}
