//! Notices ([`belfry_core::notice`]): raising them into their tenant's
//! notice slots, and delivering them to its notice target.
//!
//! # Raising
//! [`raise`] never waits: it queues the notice in memory (at most
//! [`MAX_QUEUED_PER_TENANT`] per tenant, more are dropped and counted) and
//! one task per tenant writes the queue into the tenant's slots, one
//! notice at a time, so two notices of this node never race for a slot.
//! Two nodes can (a cluster on one database): a slot is written only if
//! it is still as it was read ([`notice::if_unchanged`], decided inside
//! the store's write), so the node that lost the race reads the slot
//! again and, finding it busy, moves on to the next one. A tenant without
//! a notice target raises nothing.
//!
//! An event's notice is raised once its ending is stored (every write
//! routes its effects through [`ended`]); a crash between the two loses
//! that notice. A pause or resume raises its notice once stored
//! (`crate::tenants`).
//!
//! # Delivering
//! A notice fires like any event but takes no delivery slot and stops
//! counting against its tenant's outstanding bound before it is sent
//! (`crate::dispatch`): a slow or dead notice target holds only its
//! notices, never the tenant's deliveries. Its outcome goes to the
//! recorder like a delivery's.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use belfry_core::event::CommandOutcome;
use belfry_core::notice::{self, MAX_PENDING_NOTICES, Notice, SlotState};
use belfry_core::{EventKey, EventVersion, TenantName, Timestamp};
use belfry_store::{Applied, KeyedCommand};

use crate::Shared;

/// Notices of one tenant waiting in memory to be written, at most.
pub const MAX_QUEUED_PER_TENANT: usize = MAX_PENDING_NOTICES;

/// After every slot of a tenant was found busy, its notices are dropped
/// without reading the slots again for this long: a failure storm costs
/// one probe per interval, not one per failure.
const FULL_BACKOFF: Duration = Duration::from_secs(1);

/// Times one slot is read again after another writer changed it between
/// our read and our write; then the next slot is tried.
const SLOT_RACES: usize = 3;

/// Pause before writing a notice again after a failed read or write.
pub(crate) const WRITE_RETRY: Duration = Duration::from_millis(500);

/// The notices waiting to be written, per tenant.
#[derive(Debug, Default)]
pub(crate) struct NoticeQueues {
    queues: Mutex<HashMap<TenantName, TenantQueue>>,
}

#[derive(Debug, Default)]
struct TenantQueue {
    waiting: VecDeque<Notice>,
    /// Whether a task is writing this queue.
    writing: bool,
    /// Every slot was busy: drop without looking until then.
    full_until: Option<Timestamp>,
}

impl NoticeQueues {
    fn lock(&self) -> MutexGuard<'_, HashMap<TenantName, TenantQueue>> {
        // Poison means a panic while held; the queues stay valid.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Raises `notice` for `tenant`: queued here, written into one of the
/// tenant's notice slots by a task, delivered to its notice target. Never
/// waits. Dropped (and counted) when the tenant's queue or slots are full.
pub(crate) fn raise(shared: &Arc<Shared>, tenant: &TenantName, notice: Notice) {
    // Most tenants have no notice target: their failures cost no task.
    let cached = shared.tenants.cached(tenant);
    if cached.is_some_and(|t| t.is_none_or(|t| t.config.notify.is_none())) {
        return;
    }
    let kind = notice.kind();
    let start = {
        let mut queues = shared.notices.lock();
        let queue = queues.entry(tenant.clone()).or_default();
        let now = shared.env.clock.now();
        if queue.full_until.is_some_and(|until| now < until)
            || queue.waiting.len() >= MAX_QUEUED_PER_TENANT
        {
            belfry_metrics::notice_dropped(kind.as_str());
            return;
        }
        queue.waiting.push_back(notice);
        !std::mem::replace(&mut queue.writing, true)
    };
    if start {
        let task_shared = shared.clone();
        let tenant = tenant.clone();
        shared
            .env
            .tasks
            .spawn(async move { write_queue(&task_shared, &tenant).await });
    }
}

/// Raises the notices of the events `applied` ended `failed`, `expired`
/// or `missed`.
pub(crate) fn ended(shared: &Arc<Shared>, applied: &[Applied]) {
    for item in applied {
        let ending = matches!(
            item.outcome,
            CommandOutcome::AttemptRecorded(_)
                | CommandOutcome::AttemptAlreadyRecorded(_)
                | CommandOutcome::Expired
        );
        if let Some(notice) = item
            .record
            .as_ref()
            .filter(|_| ending)
            .and_then(Notice::of_ending)
        {
            raise(shared, &item.key.tenant, notice);
        }
    }
}

/// Writes `tenant`'s queued notices until its queue is empty.
async fn write_queue(shared: &Arc<Shared>, tenant: &TenantName) {
    loop {
        let next = {
            let mut queues = shared.notices.lock();
            let queue = queues.entry(tenant.clone()).or_default();
            match queue.waiting.pop_front() {
                Some(notice) => notice,
                None => {
                    // Done: the entry goes, so idle tenants cost nothing.
                    if queue.full_until.is_none() {
                        queues.remove(tenant);
                    } else {
                        queue.writing = false;
                    }
                    return;
                }
            }
        };
        if shared.env.tasks.stopping() {
            // Not written: lost, like a notice raised right before a crash.
            continue;
        }
        write_one(shared, tenant, next).await;
    }
}

/// Writes one notice into a free slot of `tenant`'s, retrying store
/// failures until the engine stops.
async fn write_one(shared: &Arc<Shared>, tenant: &TenantName, notice: Notice) {
    let kind = notice.kind();
    loop {
        match try_write(shared, tenant, &notice).await {
            Ok(Written::Raised) => return belfry_metrics::notice_raised(kind.as_str()),
            Ok(Written::Already | Written::NoTarget) => return,
            Ok(Written::Full) => {
                belfry_metrics::notice_dropped(kind.as_str());
                tracing::warn!(%tenant, kind = kind.as_str(), "every notice slot of the tenant is pending: the notice is dropped");
                let until = shared.env.clock.now().plus(FULL_BACKOFF);
                if let Some(queue) = shared.notices.lock().get_mut(tenant) {
                    queue.full_until = Some(until);
                }
                return;
            }
            Err(error) => {
                tracing::warn!(%tenant, %error, "writing a notice failed; retrying shortly");
                if shared.env.tasks.stopping() {
                    return;
                }
                crate::tasks::pause(WRITE_RETRY).await;
            }
        }
    }
}

enum Written {
    Raised,
    /// A pending copy of it is in a slot already.
    Already,
    /// Every slot holds another pending notice.
    Full,
    /// The tenant has no notice target (or is gone).
    NoTarget,
}

async fn try_write(
    shared: &Arc<Shared>,
    tenant: &TenantName,
    notice: &Notice,
) -> belfry_store::StoreResult<Written> {
    let has_target = shared
        .tenants
        .get(tenant)
        .await?
        .is_some_and(|t| t.config.notify.is_some());
    if !has_target {
        return Ok(Written::NoTarget);
    }
    let identity = notice.identity();
    for slot in notice::probe(&identity, MAX_PENDING_NOTICES) {
        let key = EventKey::new(tenant.clone(), notice::slot_id(slot));
        // A slot lost to another node's write is read again: it may hold
        // this very notice now, or have been freed since.
        for _ in 0..SLOT_RACES {
            let current = shared.env.store.get_event(&key).await?;
            match notice::slot_state(current.as_ref(), &identity) {
                SlotState::Busy => break,
                SlotState::Same => return Ok(Written::Already),
                SlotState::Free => {}
            }
            let command = notice::write_command(
                notice,
                tenant,
                current.as_ref(),
                shared.env.clock.now(),
                EventVersion::generate(),
            );
            let command = KeyedCommand {
                key: key.clone(),
                command: notice::if_unchanged(current.as_ref(), command),
                fence: None,
            };
            let applied = crate::writes::apply(shared, vec![command], |_| {}).await?;
            let lost = applied
                .iter()
                .any(|a| matches!(a.outcome, CommandOutcome::PreconditionFailed { .. }));
            if !lost {
                return Ok(Written::Raised);
            }
            tracing::debug!(%tenant, slot, "another writer took the notice slot first");
        }
    }
    Ok(Written::Full)
}
