//! The bulk action runner (see [`belfry_core::bulk`] for the record, its
//! progress and the claim rule).
//!
//! Every node runs one runner, started with the engine. It looks for work
//! when an action is created through this node ([`BulkActions::create`]
//! wakes it) and every [`POLL`] otherwise, which is how it finds, after a
//! restart, the actions still `running` and, in a cluster, those whose
//! runner died (their claim lapsed). It claims at most
//! [`MAX_ACTIONS_AT_ONCE`] actions, one per tenant (so one tenant's queue
//! of actions cannot hold back another's), and works on each in a task of
//! its own, page by page:
//!
//! 1. read one page of the matching items (`engine.bulk_page_size`, 200):
//!    events through [`belfry_store::Store::list_events`] with the action's
//!    filter, continuing after the saved cursor; schedules through
//!    [`crate::schedules::Schedules::list`];
//! 2. apply the page's commands in one batch through the ordinary write
//!    path ([`EngineHandle::apply`], so timers are armed and disarmed as
//!    for a client's request); a redrive gives each event a new version,
//!    and a redrive page is first checked against the tenant's pending
//!    quota like a client's redrive: a page that would pass it is not
//!    applied and the action fails with the reason;
//!    a delete removes the page's events that are still finished, in one
//!    call to [`belfry_store::Store::delete_finished`] (no timer to touch:
//!    finished events have none);
//! 3. save the tally and the cursor past the page, renewing the claim, in
//!    one compare-and-set ([`belfry_store::Store::update_bulk_action`]).
//!
//! A restart therefore resumes after the last saved page; a page applied
//! but not saved is listed again (its items are then gone from a status
//! filter, or skipped), so nothing is done twice and at most one page goes
//! uncounted. Before each page the runner reads the action again: a
//! cancel stops it there (a cancel that lands during a page makes that
//! page's save conflict; the page is merged into the cancelled record,
//! still counted). A shutdown stops it between pages too, and it gives its
//! claim up, so the next start or another node continues at once. A page whose read or write fails as a whole is
//! retried with back-off, renewing the claim meanwhile; only an item whose
//! own write failed counts as `failed`. A store error that is not
//! `Unavailable` and persists [`MAX_FAILED_ATTEMPTS`] times fails the
//! action.
//!
//! Memory: one page of records per action at work, a bounded number of
//! actions, and one page of running actions while looking for work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use belfry_core::bulk::{
    BulkAction, BulkActionId, BulkCursor, BulkKind, BulkProgress, BulkState, BulkTarget,
    ItemOutcome, PageReport,
};
use belfry_core::schedule::ScheduleId;
use belfry_core::{EventCommand, EventId, EventKey, EventVersion, TenantName, Timestamp};
use belfry_store::{
    Applied, KeyedCommand, ListEventsParams, RunningBulkActionsParams, StoreError, StoreResult,
};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::quotas::{QuotaError, QuotaExceeded};
use crate::schedules::ScheduleOpError;
use crate::{EngineHandle, Shared};

/// How often a runner looks for actions to take (besides being woken).
pub const POLL: Duration = Duration::from_secs(2);
/// Actions one node works on at once.
pub const MAX_ACTIONS_AT_ONCE: usize = 4;
/// Running actions read per store call while looking for work.
const SCAN_PAGE: usize = 100;
/// A store error other than `Unavailable` that persists this many
/// attempts in a row fails the action.
pub const MAX_FAILED_ATTEMPTS: u32 = 10;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The runner's state, shared by the engine.
#[derive(Debug)]
pub(crate) struct BulkRunner {
    /// Names this runner in claims: `local` on a single node (the only
    /// process that can open its store, so a restart takes its own claims
    /// back at once), a random id on a cluster node.
    runner_id: String,
    wake: Notify,
    /// Actions this node works on now, with their tenants.
    active: Mutex<HashMap<BulkActionId, TenantName>>,
}

impl BulkRunner {
    pub(crate) fn new(runner_id: String) -> BulkRunner {
        BulkRunner {
            runner_id,
            wake: Notify::new(),
            active: Mutex::default(),
        }
    }

    fn active(&self) -> MutexGuard<'_, HashMap<BulkActionId, TenantName>> {
        // Poison means a panic while held; the set stays usable.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a bulk action could not be cancelled.
#[derive(Debug, thiserror::Error)]
pub enum CancelBulkError {
    #[error("no bulk action {0}")]
    NotFound(BulkActionId),
    #[error("the bulk action already finished ({})", .0.state.as_str())]
    Finished(Box<BulkAction>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Bulk actions ([`EngineHandle::bulk`]).
#[derive(Debug, Clone, Copy)]
pub struct BulkActions<'a> {
    pub(crate) engine: &'a EngineHandle,
}

impl BulkActions<'_> {
    /// Stores a new bulk action and wakes this node's runner, which claims
    /// it at once. `false`: an action with its id exists (nothing stored).
    ///
    /// # Errors
    /// The tenant has its limit of running actions
    /// (`limits.max_bulk_actions_per_tenant`), or a store failure.
    pub async fn create(&self, action: BulkAction) -> Result<bool, crate::quotas::QuotaError> {
        // Checked and stored under one lock: two creates on this node
        // cannot both take the last place (other nodes' may, by one each).
        let _creating = self.engine.inner.quotas.bulk_creates.lock().await;
        self.engine
            .quotas()
            .check_bulk_quota(action.tenant())
            .await?;
        let created = self.engine.store().create_bulk_action(action).await?;
        if created {
            self.engine.inner.bulk.wake.notify_one();
        }
        Ok(created)
    }

    /// Stops a running bulk action: its runner stops after the page in
    /// progress (whose work is still counted). Answers the action as
    /// stored.
    ///
    /// # Errors
    /// Unknown, already finished, or a store failure.
    pub async fn cancel(&self, id: &BulkActionId) -> Result<BulkAction, CancelBulkError> {
        loop {
            let Some(mut action) = self.engine.store().get_bulk_action(id).await? else {
                return Err(CancelBulkError::NotFound(id.clone()));
            };
            if action.cancel(self.engine.now()).is_err() {
                return Err(CancelBulkError::Finished(Box::new(action)));
            }
            // A conflict is the runner saving a page: read and try again.
            if let Some(stored) = self.engine.store().update_bulk_action(action).await? {
                return Ok(stored);
            }
        }
    }

    /// Wakes the runner to look for work now (for tests that moved a
    /// manual clock past a claim's lapse).
    pub fn poke(&self) {
        self.engine.inner.bulk.wake.notify_one();
    }
}

/// The runner's loop: look for work, wait for a wake-up, a poll or the
/// stop signal; at the stop, wait for the action tasks (each gives its
/// claim up at its next page boundary).
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut stop = shared.env.tasks.stop_receiver();
    let mut tasks = JoinSet::new();
    loop {
        if *stop.borrow() {
            break;
        }
        if let Err(error) = take_work(&shared, &mut tasks).await {
            tracing::warn!(%error, "cannot look for bulk actions; will try again");
        }
        tokio::select! {
            () = shared.bulk.wake.notified() => {}
            () = crate::tasks::pause(POLL) => {}
            _ = stop.changed() => {}
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// Claims running actions this node may take, up to its capacity, and
/// starts a task for each.
async fn take_work(shared: &Arc<Shared>, tasks: &mut JoinSet<()>) -> StoreResult<()> {
    let runner = &shared.bulk.runner_id;
    let mut after = None;
    loop {
        if shared.bulk.active().len() >= MAX_ACTIONS_AT_ONCE {
            return Ok(());
        }
        let page = shared
            .env
            .store
            .running_bulk_actions(RunningBulkActionsParams {
                after: after.clone(),
                limit: SCAN_PAGE,
            })
            .await?;
        let full = page.len() == SCAN_PAGE;
        after = page.last().map(|action| action.id.clone());
        for action in page {
            if shared.bulk.active().len() >= MAX_ACTIONS_AT_ONCE {
                return Ok(());
            }
            {
                let active = shared.bulk.active();
                // One action per tenant at a time: a tenant's queue of
                // actions cannot take every slot from the others.
                if active.contains_key(&action.id)
                    || active.values().any(|tenant| tenant == action.tenant())
                {
                    continue;
                }
            }
            let now = shared.env.clock.now();
            let Some(claimed) = action.claimed(runner, now, shared.env.options.bulk_lease) else {
                continue;
            };
            // Lost to another runner (or a cancel): it is theirs.
            let Some(stored) = shared.env.store.update_bulk_action(claimed).await? else {
                continue;
            };
            tracing::info!(
                id = %stored.id,
                action = stored.kind.as_str(),
                tenant = %stored.tenant().as_str(),
                resumed = stored.cursor.is_some(),
                "working on a bulk action"
            );
            shared
                .bulk
                .active()
                .insert(stored.id.clone(), stored.tenant().clone());
            tasks.spawn(work(shared.clone(), stored));
        }
        if !full {
            return Ok(());
        }
    }
}

/// How one action's work ended.
enum Stop {
    /// Finished (completed, cancelled or failed), stored as such.
    Finished,
    /// Another runner holds it now, or it is gone: not ours to touch.
    Lost,
    /// The node is stopping.
    Stopping,
}

/// Works on one claimed action until it finishes, is lost, or the node
/// stops.
async fn work(shared: Arc<Shared>, action: BulkAction) {
    let id = action.id.clone();
    let mut stop = shared.env.tasks.stop_receiver();
    let ended = work_pages(&shared, action, &mut stop).await;
    match ended {
        Stop::Finished => {}
        Stop::Lost => tracing::info!(%id, "a bulk action went to another runner"),
        Stop::Stopping => tracing::info!(%id, "bulk action paused by the shutdown"),
    }
    shared.bulk.active().remove(&id);
}

async fn work_pages(
    shared: &Arc<Shared>,
    mut action: BulkAction,
    stop: &mut watch::Receiver<bool>,
) -> Stop {
    let handle = EngineHandle {
        inner: shared.clone(),
    };
    loop {
        if *stop.borrow() {
            release(shared, action).await;
            return Stop::Stopping;
        }
        // A cancel (or a takeover) since the last save stops the work
        // before another page, not after it.
        match shared.env.store.get_bulk_action(&action.id).await {
            Ok(Some(fresh)) if fresh.revision != action.revision => {
                if !fresh.held_by(&shared.bulk.runner_id) {
                    return Stop::Lost;
                }
                if fresh.state != BulkState::Running {
                    release(shared, fresh).await;
                    return Stop::Finished;
                }
                action = fresh;
            }
            Ok(None) => return Stop::Lost,
            // Unchanged; or the store failed, which the page retries.
            Ok(Some(_)) | Err(_) => {}
        }
        let page = match page_with_retries(shared, &handle, &mut action, stop).await {
            Ok(page) => page,
            Err(PageError::Stop(why)) => {
                if matches!(why, Stop::Stopping) {
                    release(shared, action).await;
                }
                return why;
            }
            Err(PageError::Fail(error)) => {
                tracing::error!(id = %action.id, %error, "bulk action failed");
                return match save(shared, action, stop, |a, now| a.fail(error.clone(), now)).await {
                    Ok(_) => Stop::Finished,
                    Err(why) => why,
                };
            }
        };
        let saved = save(shared, action, stop, |a, now| a.record_page(&page, now)).await;
        action = match saved {
            Ok(stored) if stored.state == BulkState::Running => stored,
            Ok(stored) => {
                tracing::info!(
                    id = %stored.id,
                    state = stored.state.as_str(),
                    matched = stored.progress.matched,
                    succeeded = stored.progress.succeeded,
                    skipped = stored.progress.skipped,
                    failed = stored.progress.failed,
                    "bulk action finished"
                );
                return Stop::Finished;
            }
            Err(why) => return why,
        };
        let pause = shared.env.options.bulk_page_pause;
        if !pause.is_zero() && sleep_or_stop(pause, stop).await {
            release(shared, action).await;
            return Stop::Stopping;
        }
    }
}

enum PageError {
    Stop(Stop),
    /// A persistent store failure: the action fails with this reason.
    Fail(String),
}

/// One page, retried with back-off while the store fails as a whole; the
/// claim is renewed while waiting.
async fn page_with_retries(
    shared: &Arc<Shared>,
    handle: &EngineHandle,
    action: &mut BulkAction,
    stop: &mut watch::Receiver<bool>,
) -> Result<PageReport, PageError> {
    let mut backoff = FIRST_BACKOFF;
    let mut internal_failures = 0;
    loop {
        let error = match run_page(shared, handle, action).await {
            Ok(Ok(page)) => return Ok(page),
            Ok(Err(refused)) => return Err(PageError::Fail(refused)),
            Err(error) => error,
        };
        if matches!(error, StoreError::Unavailable(_)) {
            internal_failures = 0;
        } else {
            internal_failures += 1;
            if internal_failures >= MAX_FAILED_ATTEMPTS {
                return Err(PageError::Fail(error.to_string()));
            }
        }
        tracing::warn!(id = %action.id, %error, "a bulk action page failed; retrying it");
        if sleep_or_stop(backoff, stop).await {
            return Err(PageError::Stop(Stop::Stopping));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
        // Keep the claim while the store recovers.
        let Some(fresh) = reread(shared, action).await else {
            continue;
        };
        if !fresh.held_by(&shared.bulk.runner_id) {
            return Err(PageError::Stop(Stop::Lost));
        }
        if fresh.state != BulkState::Running {
            return Err(PageError::Stop(Stop::Finished));
        }
        let now = shared.env.clock.now();
        if let Some(renewed) =
            fresh.claimed(&shared.bulk.runner_id, now, shared.env.options.bulk_lease)
            && let Ok(Some(stored)) = shared.env.store.update_bulk_action(renewed).await
        {
            *action = stored;
        }
    }
}

/// The stored action, or `None` if the store cannot say now.
async fn reread(shared: &Shared, action: &BulkAction) -> Option<BulkAction> {
    match shared.env.store.get_bulk_action(&action.id).await {
        Ok(Some(fresh)) => Some(fresh),
        Ok(None) => Some(BulkAction {
            // Gone (purged): nobody holds it.
            claim: None,
            ..action.clone()
        }),
        Err(_) => None,
    }
}

/// Reads and applies one page; `Ok(Err(reason))` when a quota refused
/// it (nothing of it applied): the action stops with that reason.
async fn run_page(
    shared: &Shared,
    handle: &EngineHandle,
    action: &BulkAction,
) -> StoreResult<Result<PageReport, String>> {
    let limit = shared.env.options.bulk_page_size.max(1);
    match action.kind.target() {
        BulkTarget::Events => event_page(shared, handle, action, limit).await,
        BulkTarget::Schedules => schedule_page(handle, action, limit).await.map(Ok),
    }
}

async fn event_page(
    shared: &Shared,
    handle: &EngineHandle,
    action: &BulkAction,
    limit: usize,
) -> StoreResult<Result<PageReport, String>> {
    let filter = &action.filter;
    // Always time-ordered (an instant bound is a filter), as the listing
    // with a filter is: it leaves out the engine's own events, and a
    // status change moves an event out of a status filter, never past the
    // cursor. The cursor continues after `(instant, id)` of the last item.
    let (from, after) = match &action.cursor {
        Some(BulkCursor { at: Some(at), id }) => (
            filter.from.map_or(*at, |from| from.max(*at)),
            Some(EventId::new(id.clone()).map_err(|e| {
                StoreError::Internal(format!("unreadable bulk action cursor: {e}"))
            })?),
        ),
        _ => (filter.from.unwrap_or(Timestamp::MIN), None),
    };
    let records = shared
        .env
        .store
        .list_events(ListEventsParams {
            tenant: filter.tenant.clone(),
            status: filter.event_status(),
            from: Some(from),
            to: filter.to,
            after,
            limit,
        })
        .await?;
    let last = records.len() < limit;
    let cursor = records.last().map(|record| BulkCursor {
        at: Some(record.event_time),
        id: record.key.id.as_str().to_string(),
    });
    let mut tally = BulkProgress::default();
    if action.kind == BulkKind::Delete {
        let keys: Vec<EventKey> = records.into_iter().map(|record| record.key).collect();
        if !keys.is_empty() {
            for deleted in shared.env.store.delete_finished(&keys).await? {
                tally.count(if deleted {
                    ItemOutcome::Succeeded
                } else {
                    ItemOutcome::Skipped
                });
            }
        }
        return Ok(Ok(PageReport {
            tally,
            cursor,
            last,
        }));
    }
    let commands: Vec<KeyedCommand> = records
        .into_iter()
        .map(|record| KeyedCommand {
            key: record.key,
            command: match action.kind {
                BulkKind::Redrive => EventCommand::Redrive {
                    new_version: EventVersion::generate(),
                },
                _ => EventCommand::Cancel,
            },
            fence: None,
        })
        .collect();
    // A redrive makes finished events pending again: like a client's
    // redrive, it counts against the tenant's pending quota.
    if action.kind == BulkKind::Redrive && !commands.is_empty() {
        match handle.quotas().check(&commands).await {
            Ok(()) => {}
            Err(QuotaError::Exceeded(QuotaExceeded::PendingEvents { tenant, limit })) => {
                return Ok(Err(format!(
                    "stopped: redriving the next page would give tenant {tenant} more than \
                     {limit} pending events, its quota (limits.max_pending_events_per_tenant); \
                     the events counted as succeeded were redriven, the others were not"
                )));
            }
            Err(QuotaError::Exceeded(other)) => return Ok(Err(format!("stopped: {other}"))),
            Err(QuotaError::Store(error)) => return Err(error),
        }
    }
    if !commands.is_empty() {
        for result in apply_page(handle, commands).await? {
            tally.count(match result {
                Some(applied) => action.kind.classify(&applied.outcome),
                None => ItemOutcome::Failed,
            });
        }
    }
    Ok(Ok(PageReport {
        tally,
        cursor,
        last,
    }))
}

/// Applies a page's commands: per command what it did, or `None` when its
/// own write failed (a batch the store committed in part). A failure of
/// the whole batch is an error: the page is retried.
async fn apply_page(
    handle: &EngineHandle,
    commands: Vec<KeyedCommand>,
) -> StoreResult<Vec<Option<Applied>>> {
    match handle.apply(commands).await {
        Ok(applied) => Ok(applied.into_iter().map(Some).collect()),
        Err(StoreError::Partial(partial)) => {
            tracing::error!(error = %partial, "part of a bulk action page failed in the store");
            Ok(partial.results.into_iter().map(Result::ok).collect())
        }
        Err(error) => Err(error),
    }
}

async fn schedule_page(
    handle: &EngineHandle,
    action: &BulkAction,
    limit: usize,
) -> StoreResult<PageReport> {
    let tenant = action.tenant();
    let after = match &action.cursor {
        Some(cursor) => Some(
            ScheduleId::new(cursor.id.clone())
                .map_err(|e| StoreError::Internal(format!("unreadable bulk action cursor: {e}")))?,
        ),
        None => None,
    };
    let schedules = handle
        .schedules()
        .list(tenant, after.as_ref(), limit)
        .await
        .map_err(schedule_store_error)?;
    let last = schedules.len() < limit;
    let cursor = schedules.last().map(|state| BulkCursor {
        at: None,
        id: state.schedule.id.as_str().to_string(),
    });
    let target = match action.kind {
        BulkKind::Resume => belfry_core::ScheduleStatus::Active,
        _ => belfry_core::ScheduleStatus::Paused,
    };
    let mut tally = BulkProgress::default();
    // Per schedule to change: how many commands it put in the batch.
    let mut changes = Vec::new();
    let mut commands = Vec::new();
    for state in schedules {
        if !action.filter.matches_schedule(state.schedule.status) {
            continue;
        }
        match handle
            .schedules()
            .status_change(tenant, state.schedule, target)
            .await
        {
            Ok(None) => tally.count(ItemOutcome::Skipped),
            Ok(Some((writes, _))) => {
                changes.push(writes.len());
                commands.extend(writes);
            }
            Err(ScheduleOpError::Store(error)) => return Err(error),
            Err(error) => {
                tracing::warn!(id = %action.id, %error, "a schedule could not be changed");
                tally.count(ItemOutcome::Failed);
            }
        }
    }
    if !commands.is_empty() {
        let mut results = apply_page(handle, commands).await?.into_iter();
        for count in changes {
            let all_written = results.by_ref().take(count).all(|r| r.is_some());
            tally.count(if all_written {
                ItemOutcome::Succeeded
            } else {
                ItemOutcome::Failed
            });
        }
    }
    Ok(PageReport {
        tally,
        cursor,
        last,
    })
}

fn schedule_store_error(error: ScheduleOpError) -> StoreError {
    match error {
        ScheduleOpError::Store(error) => error,
        other => StoreError::Internal(other.to_string()),
    }
}

/// Saves `change` applied to the action, renewing the claim of a running
/// one, with a compare-and-set. A conflict with a change that left the
/// claim ours (a client's cancel) is merged: the change is applied to the
/// fresh record and saved again. Store failures are retried with back-off.
async fn save(
    shared: &Arc<Shared>,
    mut action: BulkAction,
    stop: &mut watch::Receiver<bool>,
    change: impl Fn(&mut BulkAction, Timestamp),
) -> Result<BulkAction, Stop> {
    let runner = &shared.bulk.runner_id;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let now = shared.env.clock.now();
        let mut next = action.clone();
        change(&mut next, now);
        if next.state == BulkState::Running {
            next = next
                .claimed(runner, now, shared.env.options.bulk_lease)
                .unwrap_or(next);
        }
        let result = match shared.env.store.update_bulk_action(next).await {
            Ok(Some(stored)) => return Ok(stored),
            Ok(None) => shared.env.store.get_bulk_action(&action.id).await,
            Err(error) => Err(error),
        };
        match result {
            Ok(Some(fresh)) if fresh.held_by(runner) => action = fresh,
            Ok(_) => return Err(Stop::Lost),
            Err(error) => {
                tracing::warn!(id = %action.id, %error, "cannot save a bulk action's progress; retrying");
                // Stopping without the save: the page is listed again by
                // whoever continues (see the module doc).
                if sleep_or_stop(backoff, stop).await {
                    return Err(Stop::Stopping);
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Gives the claim up (the node is stopping, or the action was cancelled),
/// so that the next start or another node continues at once. Best
/// effort: otherwise it lapses.
async fn release(shared: &Shared, mut action: BulkAction) {
    action.release(&shared.bulk.runner_id);
    if let Err(error) = shared.env.store.update_bulk_action(action).await {
        tracing::debug!(%error, "could not give a bulk action's claim up");
    }
}

/// Sleeps for `duration`; `true` if the stop signal came first.
async fn sleep_or_stop(duration: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        () = crate::tasks::pause(duration) => false,
        _ = stop.changed() => true,
    }
}
