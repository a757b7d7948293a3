//! Recurring schedules on the durable event path.
//!
//! A schedule is one *control event* in its tenant (see
//! [`belfry_core::schedule`]): its payload is the definition, its instant the
//! next materialization time. The control event rides the ordinary machinery
//! (partitioned, windowed, fenced, failed over) and when it fires,
//! [`fire`] runs the pure planner and stores the result:
//!
//! 1. the occurrences (deterministic ids `"{schedule}@{instant}"`, the
//!    same text as their idempotency key), missed ones expired in the same
//!    batch. These writes are unfenced, like a client's, so that other
//!    partitions' owners are woken in a cluster; storing them twice is a
//!    no-op (an upsert at the same instant never re-fires).
//! 2. then, fenced by the control event's partition epoch and conditional
//!    on its fired version ([`EventCommand::UpsertIfCurrent`]), the control
//!    event moved to its next time with its progress (or parked when the
//!    schedule is complete). A crash between 1 and 2 re-runs the same plan.
//!
//! Management ([`Schedules::put`] and friends) writes the
//! control event like a client writes an event, so any node may serve it.
//! Every change gives the control event a new version (cancel, then
//! upsert), so a firing in progress stands down at step 2 and the new
//! version plans with the new definition (its step 1 may have created the
//! old definition's occurrences due within the lead: the only trace a race
//! leaves). Already-created future occurrences are cancelled on update,
//! pause and delete.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::event::{DeliveryOption, EventCommand};
use belfry_core::fire::decide::still_due;
use belfry_core::notice::Notice;
use belfry_core::schedule::firing::{self, Firing};
use belfry_core::schedule::{
    self, Fate, PARKED_AT, Plan, Progress, Schedule, ScheduleError, ScheduleId, ScheduleStatus,
    control_event_id,
};
use belfry_core::{
    DueCursor, EventId, EventKey, EventRecord, EventStatus, EventVersion, PartitionId, TenantName,
    Timestamp,
};
use belfry_store::{Fence, KeyedCommand, StoreError, StoreResult};

use crate::partition::{Term, Ticket};
use crate::schedule_scan::{SCAN_PAGE, control_error, live};
use crate::{EngineHandle, Shared};

/// Schedule firings in progress at once; enough to keep group commit busy.
pub(crate) const MAX_CONCURRENT_FIRINGS: usize = 128;
/// Pause before re-running a firing that failed on a store error.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Why a schedule operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleOpError {
    /// The definition is not valid; the message is safe for clients.
    #[error(transparent)]
    Invalid(#[from] ScheduleError),
    #[error("no schedule {0:?}")]
    NotFound(ScheduleId),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Creating it would pass the tenant's quota of schedules, or storing
    /// it its budget of occurrences per minute.
    #[error(transparent)]
    Quota(#[from] crate::quotas::QuotaExceeded),
}

impl From<crate::quotas::QuotaError> for ScheduleOpError {
    fn from(error: crate::quotas::QuotaError) -> Self {
        match error {
            crate::quotas::QuotaError::Exceeded(exceeded) => ScheduleOpError::Quota(exceeded),
            crate::quotas::QuotaError::Store(store) => ScheduleOpError::Store(store),
        }
    }
}

/// A stored schedule as clients see it.
#[derive(Debug, Clone)]
pub struct ScheduleState {
    pub tenant: TenantName,
    pub schedule: Schedule,
    /// The next occurrence not created yet; `None` when paused or complete.
    pub next_occurrence: Option<Timestamp>,
    /// Set when the control event itself failed (an unreadable definition).
    pub error: Option<String>,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    Updated,
}

/// Handles one fired control event (see the module doc); its ticket is
/// finished by the caller.
pub(crate) async fn fire(shared: Arc<Shared>, ticket: &Ticket) {
    let Ok(_permit) = shared
        .fire_path
        .schedule_firings
        .clone()
        .acquire_owned()
        .await
    else {
        return;
    };
    let (partition, term, entry) = (
        ticket.partition(),
        ticket.term().clone(),
        ticket.entry().clone(),
    );
    // Boxed: a waiting firing is then a task of a few dozen bytes, not one
    // the size of the whole firing's state (a window may hold a million).
    Box::pin(fire_with_permit(shared, partition, term, entry)).await;
}

async fn fire_with_permit(
    shared: Arc<Shared>,
    partition: PartitionId,
    term: Arc<Term>,
    entry: DueCursor,
) {
    if shared.env.tasks.stopping() || !term.may_fire() {
        // Stays pending in the store; the next start (or owner) fires it.
        return;
    }
    let fence = Fence {
        partition,
        epoch: term.epoch,
    };
    match fire_once(&shared, fence, &entry).await {
        Ok(()) => {}
        Err(StoreError::Fenced { .. }) => {
            tracing::debug!(key = ?entry.key, "schedule firing fenced: the partition moved");
        }
        Err(error) => {
            tracing::warn!(key = ?entry.key, %error, "schedule firing failed; retrying it shortly");
            retry_later(&shared, partition, entry);
        }
    }
}

/// Offers the control event to its partition again after a pause (a store
/// hiccup); the plan is re-run from the stored state then.
fn retry_later(shared: &Arc<Shared>, partition: PartitionId, entry: DueCursor) {
    let tasks = shared.env.tasks.clone();
    let shared = shared.clone();
    tasks.spawn(async move {
        crate::tasks::pause(RETRY_PAUSE).await;
        shared.owned.input(
            partition,
            belfry_core::fire::Input::Offer(entry),
            shared.env.clock.now(),
        );
    });
}

async fn fire_once(shared: &Arc<Shared>, fence: Fence, entry: &DueCursor) -> StoreResult<()> {
    let Some(record) = shared.env.store.get_event(&entry.key).await? else {
        return Ok(());
    };
    if !still_due(&record, entry) {
        return Ok(());
    }
    let now = shared.env.clock.now();
    let (definition, spec) = match Firing::of(&record) {
        Firing::Plan(definition, spec) => (definition, spec),
        Firing::Stop(error) => {
            tracing::error!(key = ?entry.key, %error, "schedule definition unusable");
            let expire = KeyedCommand {
                key: entry.key.clone(),
                command: firing::stop_command(&error),
                fence: Some(fence),
            };
            return apply(shared, vec![expire]).await;
        }
        Firing::Park(definition) => {
            let park = control_move(&entry.key, &record, PARKED_AT, &definition, fence);
            return apply(shared, vec![park]).await;
        }
    };

    let mut plan = schedule::plan(&definition, &spec, now, shared.env.options.plan_limits());
    let over_budget = shared
        .quotas
        .spend_occurrences(&entry.key.tenant, &mut plan, now);
    if over_budget > 0 {
        belfry_metrics::cron_occurrences(belfry_metrics::Occurrence::OverBudget, over_budget);
        tracing::debug!(
            key = ?entry.key,
            over_budget,
            "schedule occurrences past the tenant's budget not created"
        );
    }
    let mut occurrences = occurrence_commands(&entry.key.tenant, &plan, &shared.env.options);
    refuse_over_quota(shared, &mut occurrences).await?;
    // One notice for the firing's missed occurrences, not one each: a
    // catch-up after an outage is one incident, and a frequent schedule's
    // (up to 100 stored per firing) would fill the tenant's notice slots.
    let missed = missed_notice(&plan, &occurrences, now);
    if !occurrences.is_empty() {
        apply_occurrences(shared, occurrences).await?;
        count_occurrences(&plan);
    }
    if let Some(notice) = missed {
        crate::notices::raise(shared, &entry.key.tenant, notice);
    }

    let at = firing::next_control_at(&record, plan.next);
    let control = control_move(&entry.key, &record, at, &plan.schedule, fence);
    apply(shared, vec![control]).await
}

/// Occurrences count against their tenant's pending quota (and the payload
/// limit, for a schedule stored before it was lowered): if the pending
/// ones would pass it, they are all stored `missed` with the reason
/// instead, so a tenant's schedules cannot pile up pending events (and
/// deliveries) past what its own writes may.
async fn refuse_over_quota(
    shared: &Arc<Shared>,
    occurrences: &mut Vec<KeyedCommand>,
) -> StoreResult<()> {
    let expired: std::collections::HashSet<EventKey> = occurrences
        .iter()
        .filter(|c| matches!(c.command, EventCommand::Expire { .. }))
        .map(|c| c.key.clone())
        .collect();
    let pending: Vec<KeyedCommand> = occurrences
        .iter()
        .filter(|c| !expired.contains(&c.key))
        .cloned()
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let handle = EngineHandle {
        inner: shared.clone(),
    };
    let Some(exceeded) = handle.quotas().refuse_occurrences(&pending).await? else {
        return Ok(());
    };
    let reason = match exceeded {
        crate::quotas::QuotaExceeded::PendingEvents { limit, .. } => format!(
            "missed: the tenant has its quota of {limit} pending events \
             (limits.max_pending_events_per_tenant)"
        ),
        crate::quotas::QuotaExceeded::PayloadTooLarge { size, limit } => format!(
            "missed: the schedule's payload of {size} bytes is larger than the {limit} bytes \
             allowed (limits.max_payload_bytes)"
        ),
        other => format!("missed: {other}"),
    };
    tracing::info!(tenant = %pending[0].key.tenant.as_str(), %reason, "schedule occurrences stored missed");
    for command in pending {
        occurrences.push(KeyedCommand {
            key: command.key,
            command: EventCommand::Expire {
                reason: reason.clone(),
            },
            fence: None,
        });
    }
    Ok(())
}

/// Counts a stored plan's occurrences for `/metrics`: late ones the skip
/// policy passed over are `skipped`, the other late ones `missed`.
fn count_occurrences(plan: &Plan) {
    use belfry_metrics::{Occurrence, cron_occurrences};
    let missed = plan
        .occurrences
        .iter()
        .filter(|o| o.fate == Fate::Missed)
        .count() as u64;
    let fired = plan.occurrences.len() as u64 - missed;
    cron_occurrences(Occurrence::Fired, fired);
    let late = if plan.schedule.misfire == belfry_core::MisfirePolicy::Skip {
        Occurrence::Skipped
    } else {
        Occurrence::Missed
    };
    cron_occurrences(late, missed);
}

/// Moves the fired control event `record` to `at` with `schedule`, unless
/// it changed version meanwhile.
fn control_move(
    key: &EventKey,
    record: &EventRecord,
    at: Timestamp,
    schedule: &Schedule,
    fence: Fence,
) -> KeyedCommand {
    KeyedCommand {
        key: key.clone(),
        command: firing::control_command(record, at, schedule),
        fence: Some(fence),
    }
}

/// The upserts (and expiries) of a plan's occurrences.
fn occurrence_commands(
    tenant: &TenantName,
    plan: &Plan,
    options: &crate::EngineOptions,
) -> Vec<KeyedCommand> {
    let planned = firing::occurrence_commands(tenant, plan, options.schedule_misfire_threshold);
    for id in &planned.too_long {
        // Schedule ids leave room for the suffix (MAX_SCHEDULE_ID_LEN).
        tracing::error!(occurrence = ?id, "occurrence id too long; skipped");
    }
    planned
        .commands
        .into_iter()
        .map(|(key, command)| KeyedCommand {
            key,
            command,
            fence: None,
        })
        .collect()
}

fn control_upsert(
    key: &EventKey,
    at: Timestamp,
    schedule: &Schedule,
    fence: Option<Fence>,
) -> KeyedCommand {
    KeyedCommand {
        key: key.clone(),
        command: EventCommand::Upsert {
            event_time: at,
            payload: Some(schedule.to_json()),
            delivery: DeliveryOption::FullEvent,
            new_version: EventVersion::generate(),
            settings: Default::default(),
        },
        fence,
    }
}

async fn apply(shared: &Arc<Shared>, commands: Vec<KeyedCommand>) -> StoreResult<()> {
    let applied = shared.env.apply_now(commands).await?;
    // Occurrences count in the pending estimate (control events do not).
    shared.quotas.applied(&applied);
    shared.route_effects(&applied);
    Ok(())
}

/// Stores a firing's occurrences. Those it ends `missed` (reached too
/// late, or past the tenant's quota) raise no notice each: the firing
/// raises one for all of them ([`missed_notice`]).
async fn apply_occurrences(
    shared: &Arc<Shared>,
    occurrences: Vec<KeyedCommand>,
) -> StoreResult<()> {
    let applied = shared.env.apply_now(occurrences).await?;
    shared.quotas.applied(&applied);
    shared.route_effects_without_notices(&applied);
    Ok(())
}

/// The notice of a firing whose `occurrences` end some `missed`, or whose
/// `plan` only counted some ([`Notice::ScheduleMissed`]); `None` when it
/// missed none. Decided from the commands, not their outcomes, so a
/// firing run again after a crash raises the same notice.
fn missed_notice(plan: &Plan, occurrences: &[KeyedCommand], now: Timestamp) -> Option<Notice> {
    let instants: HashMap<&EventKey, Timestamp> = occurrences
        .iter()
        .filter_map(|c| match &c.command {
            EventCommand::Upsert { event_time, .. } => Some((&c.key, *event_time)),
            _ => None,
        })
        .collect();
    let mut reason = None;
    let mut recorded = Vec::new();
    for command in occurrences {
        if let EventCommand::Expire { reason: why } = &command.command {
            reason.get_or_insert_with(|| why.clone());
            recorded.extend(instants.get(&command.key).copied());
        }
    }
    Notice::of_missed_occurrences(&plan.schedule.id, &recorded, plan.summarized, reason, now)
}

/// Schedule management ([`EngineHandle::schedules`]).
#[derive(Debug, Clone, Copy)]
pub struct Schedules<'a> {
    pub(crate) engine: &'a EngineHandle,
}

impl Schedules<'_> {
    fn now(&self) -> Timestamp {
        self.engine.now()
    }

    /// Creates or replaces a schedule; takes effect at once. `schedule`'s
    /// `status`, `progress` and timestamps are set here (an update keeps
    /// the progress and a paused status).
    ///
    /// # Errors
    /// An invalid definition (nothing is written), or a store failure.
    pub async fn put(
        &self,
        tenant: &TenantName,
        mut schedule: Schedule,
    ) -> Result<(PutOutcome, ScheduleState), ScheduleOpError> {
        let spec = schedule.validate()?;
        self.engine
            .quotas()
            .check_schedule_payload(schedule.payload.as_deref())?;
        let now = self.now();
        let existing = self.read_schedule(tenant, &schedule.id).await?;
        let old = existing.and_then(|(_, s)| live(s));
        let old_rate = old.as_ref().map_or(0, crate::quotas::schedule_rate);
        let outcome = match old {
            Some(old) => {
                schedule.created_at = old.created_at;
                // A completed schedule whose new definition has occurrences
                // left (a later end, a higher maximum) runs again.
                schedule.status = match old.status {
                    ScheduleStatus::Paused => ScheduleStatus::Paused,
                    _ => ScheduleStatus::Active,
                };
                // Occurrences up to the old cursor were handled; future ones
                // are cancelled below and planned again from now.
                schedule.progress = Progress {
                    cursor: old.progress.cursor.min(now),
                    ..old.progress
                };
                PutOutcome::Updated
            }
            None => {
                schedule.created_at = now;
                schedule.status = ScheduleStatus::Active;
                schedule.progress = Progress::starting_after(now);
                PutOutcome::Created
            }
        };
        schedule.updated_at = now;
        if outcome == PutOutcome::Created {
            self.engine.quotas().check_schedule_quota(tenant).await?;
        }
        let mut commands = self
            .cancel_future_occurrences(tenant, &schedule.id, now)
            .await?;
        commands.extend(self.control_commands(tenant, &mut schedule, &spec));
        // After control_commands: a definition with nothing left is
        // completed there and counts nothing.
        let new_rate = belfry_core::schedule::budget::rate_of(&schedule, &spec);
        self.engine
            .quotas()
            .check_schedule_rate(tenant, old_rate, new_rate)
            .await?;
        let created = (outcome == PutOutcome::Created).then(|| tenant.clone());
        let changed = tenant.clone();
        self.engine
            .apply_then(commands, move |shared| {
                if let Some(tenant) = created {
                    shared.quotas.schedule_created(&tenant);
                }
                shared
                    .quotas
                    .schedule_rate_changed(&changed, old_rate, new_rate);
            })
            .await?;
        Ok((outcome, self.state(tenant, schedule, None)))
    }

    /// Pauses a schedule: no occurrence is created until it is resumed;
    /// future occurrences already created are cancelled.
    ///
    /// # Errors
    /// Unknown schedule, or a store failure.
    pub async fn pause(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
    ) -> Result<ScheduleState, ScheduleOpError> {
        self.change_status(tenant, id, ScheduleStatus::Paused).await
    }

    /// Resumes a paused schedule from now on (occurrences that fell in the
    /// pause are not created, nor counted as missed).
    ///
    /// # Errors
    /// Unknown schedule, or a store failure.
    pub async fn resume(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
    ) -> Result<ScheduleState, ScheduleOpError> {
        self.change_status(tenant, id, ScheduleStatus::Active).await
    }

    async fn change_status(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
        status: ScheduleStatus,
    ) -> Result<ScheduleState, ScheduleOpError> {
        let Some(schedule) = self
            .read_schedule(tenant, id)
            .await?
            .and_then(|(_, s)| live(s))
        else {
            return Err(ScheduleOpError::NotFound(id.clone()));
        };
        match self.status_change(tenant, schedule.clone(), status).await? {
            None => Ok(self.state(tenant, schedule, None)),
            Some((commands, changed)) => {
                self.engine.apply(commands).await?;
                Ok(self.state(tenant, changed, None))
            }
        }
    }

    /// The writes that move a live `schedule` to `status` (active or
    /// paused), and the schedule as they leave it; `None` when there is
    /// nothing to change (it is completed, or in `status` already). Bulk
    /// pauses and resumes apply many of these in one batch.
    ///
    /// # Errors
    /// An unreadable definition, or a store failure.
    pub(crate) async fn status_change(
        &self,
        tenant: &TenantName,
        mut schedule: Schedule,
        status: ScheduleStatus,
    ) -> Result<Option<(Vec<KeyedCommand>, Schedule)>, ScheduleOpError> {
        if schedule.status == ScheduleStatus::Completed || schedule.status == status {
            return Ok(None);
        }
        let now = self.now();
        let spec = schedule.spec().map_err(ScheduleError::from)?;
        if status == ScheduleStatus::Active {
            schedule.progress.cursor = schedule.progress.cursor.max(now);
        }
        schedule.status = status;
        schedule.updated_at = now;
        let mut commands = self
            .cancel_future_occurrences(tenant, &schedule.id, now)
            .await?;
        commands.extend(self.control_commands(tenant, &mut schedule, &spec));
        Ok(Some((commands, schedule)))
    }

    /// Deletes a schedule and cancels its future occurrences; its
    /// occurrence history stays until retention. Returns the schedule as
    /// it was.
    ///
    /// # Errors
    /// Unknown schedule, or a store failure.
    pub async fn delete(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
    ) -> Result<Schedule, ScheduleOpError> {
        let now = self.now();
        let Some((record, found)) = self.read_schedule(tenant, id).await? else {
            return Err(ScheduleOpError::NotFound(id.clone()));
        };
        let Some(mut schedule) = live(found) else {
            return Err(ScheduleOpError::NotFound(id.clone()));
        };
        let before = schedule.clone();
        schedule.status = ScheduleStatus::Deleted;
        schedule.updated_at = now;
        let key = EventKey::new(tenant.clone(), control_event_id(id));
        let mut commands = self.cancel_future_occurrences(tenant, id, now).await?;
        commands.push(control_upsert(&key, record.event_time, &schedule, None));
        commands.push(KeyedCommand {
            key,
            command: EventCommand::Cancel,
            fence: None,
        });
        let deleted = tenant.clone();
        let rate = crate::quotas::schedule_rate(&before);
        self.engine
            .apply_then(commands, move |shared| {
                shared.quotas.schedule_deleted(&deleted);
                shared.quotas.schedule_rate_changed(&deleted, rate, 0);
            })
            .await?;
        Ok(before)
    }

    /// A schedule, unless unknown or deleted.
    ///
    /// # Errors
    /// A store failure.
    pub async fn get(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
    ) -> Result<Option<ScheduleState>, ScheduleOpError> {
        Ok(self
            .read_schedule(tenant, id)
            .await?
            .and_then(|(record, schedule)| {
                let error = control_error(&record);
                live(schedule).map(|s| self.state(tenant, s, error))
            }))
    }

    /// A tenant's schedules by id, after `after` (exclusive), at most
    /// `limit`.
    ///
    /// # Errors
    /// A store failure.
    pub async fn list(
        &self,
        tenant: &TenantName,
        after: Option<&ScheduleId>,
        limit: usize,
    ) -> Result<Vec<ScheduleState>, ScheduleOpError> {
        let found =
            crate::schedule_scan::live_schedules(self.engine.store(), tenant, after, limit).await?;
        Ok(found
            .into_iter()
            .map(|found| self.state(tenant, found.schedule, found.error))
            .collect())
    }

    /// A schedule's occurrences (its history and what is already created),
    /// in id order (the instant's order), after `after` (exclusive), at
    /// most `limit`.
    ///
    /// # Errors
    /// A store failure.
    pub async fn occurrences(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
        after: Option<&EventId>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, ScheduleOpError> {
        let prefix = id.occurrence_prefix();
        let start = match after {
            Some(after) => after.clone(),
            None => EventId::new(prefix.clone()).map_err(ScheduleError::from)?,
        };
        let page = self.events_after(tenant, start, limit).await?;
        Ok(page
            .into_iter()
            .take_while(|r| r.key.id.as_str().starts_with(&prefix))
            .collect())
    }

    /// A tenant's events in id order after `after` (exclusive): control
    /// events and occurrences are found by id prefix this way.
    async fn events_after(
        &self,
        tenant: &TenantName,
        after: EventId,
        limit: usize,
    ) -> StoreResult<Vec<EventRecord>> {
        crate::schedule_scan::events_after(self.engine.store(), tenant, after, limit).await
    }

    /// The control event and its definition, whatever its status.
    async fn read_schedule(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
    ) -> StoreResult<Option<(EventRecord, Schedule)>> {
        let key = EventKey::new(tenant.clone(), control_event_id(id));
        let Some(record) = self.engine.store().get_event(&key).await? else {
            return Ok(None);
        };
        let Some(schedule) = record
            .payload
            .as_deref()
            .and_then(|p| Schedule::from_json(p).ok())
        else {
            tracing::error!(?key, "schedule control event without a readable definition");
            return Ok(None);
        };
        Ok(Some((record, schedule)))
    }

    /// Cancels of the schedule's pending occurrences due after `now`.
    async fn cancel_future_occurrences(
        &self,
        tenant: &TenantName,
        id: &ScheduleId,
        now: Timestamp,
    ) -> Result<Vec<KeyedCommand>, ScheduleOpError> {
        let prefix = id.occurrence_prefix();
        // Ids sort by instant (same text form for one schedule); start a
        // second early because "…:00.5Z" sorts before "…:00Z".
        let from_second = Timestamp::from_millis(now.as_millis().div_euclid(1_000) * 1_000 - 1_000);
        let mut cursor = EventId::new(format!("{prefix}{}", from_second.to_rfc3339()))
            .map_err(ScheduleError::from)?;
        let mut commands = Vec::new();
        loop {
            let page = self.events_after(tenant, cursor.clone(), SCAN_PAGE).await?;
            let full = page.len() == SCAN_PAGE;
            let mut ended = false;
            for record in page {
                if !record.key.id.as_str().starts_with(&prefix) {
                    ended = true;
                    break;
                }
                cursor = record.key.id.clone();
                if record.status == EventStatus::Scheduled && record.event_time > now {
                    commands.push(KeyedCommand {
                        key: record.key,
                        command: EventCommand::Cancel,
                        fence: None,
                    });
                }
            }
            if ended || !full {
                return Ok(commands);
            }
        }
    }

    /// Cancel, then upsert: the control event always gets a new version, so
    /// a firing in progress stands down (see the module doc).
    fn control_commands(
        &self,
        tenant: &TenantName,
        schedule: &mut Schedule,
        spec: &belfry_core::CronSpec,
    ) -> Vec<KeyedCommand> {
        let key = EventKey::new(tenant.clone(), control_event_id(&schedule.id));
        let cancel = KeyedCommand {
            key: key.clone(),
            command: EventCommand::Cancel,
            fence: None,
        };
        let at = match (schedule.status, schedule.next_occurrence(spec)) {
            (ScheduleStatus::Active, Some(next)) => {
                Schedule::materialize_at(next, self.engine.options().schedule_lead)
            }
            (ScheduleStatus::Active, None) => {
                schedule.status = ScheduleStatus::Completed;
                PARKED_AT
            }
            _ => PARKED_AT,
        };
        vec![cancel, control_upsert(&key, at, schedule, None)]
    }

    fn state(
        &self,
        tenant: &TenantName,
        schedule: Schedule,
        error: Option<String>,
    ) -> ScheduleState {
        let now = self.now();
        let next_occurrence = match (schedule.status, schedule.spec()) {
            // Created ahead of time (within the lead): the next one after
            // now exists already.
            (ScheduleStatus::Active, Ok(spec)) if schedule.progress.cursor > now => {
                let after = schedule
                    .start_at
                    .map_or(now, |start| now.max(start.minus(Duration::from_millis(1))));
                spec.next_after(after)
            }
            (ScheduleStatus::Active, Ok(spec)) => schedule.next_occurrence(&spec),
            _ => None,
        };
        ScheduleState {
            tenant: tenant.clone(),
            schedule,
            next_occurrence,
            error,
        }
    }
}
