//! Recurring schedules as data, and the pure planner that turns them into
//! occurrences.
//!
//! A schedule lives in its tenant as one *control event* (id
//! [`control_event_id`]: an internal id no client id can collide with)
//! whose payload is the [`Schedule`] as JSON and whose instant is the
//! schedule's next *materialization time*: the next occurrence minus a lead
//! (a few seconds). When the control event fires, the engine calls [`plan`],
//! which decides
//!
//! - which occurrences to create now (every one due by `now + lead`),
//!   each an ordinary event named by its [`OccurrenceId`];
//! - which occurrences were missed (due more than the misfire threshold ago,
//!   e.g. while Belfry was down) and what the schedule's [`MisfirePolicy`]
//!   does with them: deliver the latest once, deliver each up to a cap, or
//!   record them as missed;
//! - when the control event fires next, or that the schedule is complete
//!   (its end instant or its maximum number of occurrences reached).
//!
//! The engine stores the result; deterministic occurrence ids and the event
//! state machine (an upsert at the same instant never re-fires) make running
//! the same plan twice (a crash, a failover) harmless.
//!
//! # Missed occurrences never vanish
//! Each missed occurrence is stored as an event in status `missed`, up to
//! [`PlanLimits::max_missed_recorded`] per firing; beyond that cap they are
//! counted in the schedule's [`MissedSummary`] (count, first, last).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cron::{CronError, CronKind, CronSpec};
use crate::event::{DeliveryOption, EventSettings};
use crate::ids::{EventId, IdError};
use crate::time::Timestamp;

pub mod budget;
pub mod firing;

/// The text after [`crate::ids::INTERNAL_ID_MARK`] in every control event id.
pub const CONTROL_PREFIX: &str = "schedule/";

/// Where paused schedules park their control event: pending (so retention
/// never purges it) but never loaded into a timer window.
/// 9999-12-31T23:59:59Z.
pub const PARKED_AT: Timestamp = Timestamp::from_millis(253_402_300_799_000);

/// Longest schedule id: the occurrence suffix (`@` and an RFC 3339 instant)
/// and the control prefix must still fit in an [`EventId`].
pub const MAX_SCHEDULE_ID_LEN: usize = 400;

/// Most occurrences delivered per firing under `fire_all`.
pub const MAX_FIRE_ALL_CAP: u32 = 1_000;

/// Why a schedule definition was refused. Messages are safe for clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule id: {0}")]
    Id(#[from] IdError),
    #[error(
        "schedule id must not contain '@' (it separates the id from the instant in occurrence ids)"
    )]
    IdContainsAt,
    #[error("schedule id is longer than {MAX_SCHEDULE_ID_LEN} bytes")]
    IdTooLong,
    #[error(transparent)]
    Cron(#[from] CronError),
    #[error("end_at must be after start_at")]
    EndBeforeStart,
    #[error("max_occurrences must be at least 1")]
    ZeroMaxOccurrences,
    #[error("fire_all cap must be between 1 and {MAX_FIRE_ALL_CAP}")]
    FireAllCap,
    #[error("payload is required when delivery is payload only")]
    PayloadRequired,
    #[error("the stored schedule definition cannot be read: {0}")]
    Corrupt(String),
}

/// A schedule's id within its tenant: a valid event id without `@`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ScheduleId(EventId);

impl ScheduleId {
    /// # Errors
    /// Not a valid event id, longer than [`MAX_SCHEDULE_ID_LEN`], or
    /// containing `@`.
    pub fn new(value: impl Into<String>) -> Result<Self, ScheduleError> {
        let value = value.into();
        let id = EventId::new(value)?;
        if id.as_str().len() > MAX_SCHEDULE_ID_LEN {
            return Err(ScheduleError::IdTooLong);
        }
        if id.as_str().contains('@') {
            return Err(ScheduleError::IdContainsAt);
        }
        Ok(ScheduleId(id))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The schedule id as an event id (for [`crate::OccurrenceId`]).
    pub fn as_event_id(&self) -> &EventId {
        &self.0
    }

    /// `"{id}@"`: every occurrence id of this schedule starts with it.
    pub fn occurrence_prefix(&self) -> String {
        format!("{}@", self.0.as_str())
    }
}

impl TryFrom<String> for ScheduleId {
    type Error = ScheduleError;
    fn try_from(value: String) -> Result<Self, ScheduleError> {
        ScheduleId::new(value)
    }
}

impl From<ScheduleId> for String {
    fn from(value: ScheduleId) -> String {
        value.0.into()
    }
}

impl std::fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_str())
    }
}

impl std::fmt::Debug for ScheduleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0.as_str())
    }
}

/// The control event's id of `schedule`.
pub fn control_event_id(schedule: &ScheduleId) -> EventId {
    // A ScheduleId is a valid event id of at most 400 bytes; with the mark
    // and the 9-byte prefix it stays under EventId::MAX_LEN.
    EventId::internal(&format!("{CONTROL_PREFIX}{schedule}"))
        .unwrap_or_else(|_| unreachable!("schedule ids leave room for the control prefix"))
}

/// The schedule a control event id names; `None` for any other id.
pub fn schedule_of_control(id: &EventId) -> Option<&str> {
    id.internal_rest()?.strip_prefix(CONTROL_PREFIX)
}

/// What happens to occurrences that were due more than the misfire
/// threshold ago when the schedule gets to them (after downtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum MisfirePolicy {
    /// Deliver the latest missed occurrence inside the catch-up window once,
    /// now; record the others as missed.
    #[default]
    FireOnce,
    /// Deliver each missed occurrence inside the catch-up window, the latest
    /// `cap` of them; record the rest as missed.
    FireAll { cap: u32 },
    /// Record every missed occurrence as missed; go on with the next one.
    Skip,
}

impl MisfirePolicy {
    /// How many of the latest missed occurrences are delivered.
    fn deliver_count(self) -> usize {
        match self {
            MisfirePolicy::FireOnce => 1,
            MisfirePolicy::FireAll { cap } => cap as usize,
            MisfirePolicy::Skip => 0,
        }
    }
}

/// A schedule's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleStatus {
    #[default]
    Active,
    /// Creates no occurrences until resumed; its control event is parked.
    Paused,
    /// Its end instant or its maximum number of occurrences was reached.
    Completed,
    /// Deleted by the client; kept (cancelled) only until retention.
    Deleted,
}

impl ScheduleStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleStatus::Active => "active",
            ScheduleStatus::Paused => "paused",
            ScheduleStatus::Completed => "completed",
            ScheduleStatus::Deleted => "deleted",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            ScheduleStatus::Active,
            ScheduleStatus::Paused,
            ScheduleStatus::Completed,
            ScheduleStatus::Deleted,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// Missed occurrences that were not stored one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MissedSummary {
    /// Missed occurrences stored as events in status `missed`.
    pub recorded: u64,
    /// Missed occurrences beyond the per-firing cap, only counted here.
    pub summarized: u64,
    pub first_summarized: Option<Timestamp>,
    pub last_summarized: Option<Timestamp>,
    /// Occurrences not created because the tenant's schedules had used
    /// their budget ([`budget`]); only counted here.
    #[serde(default)]
    pub over_budget: u64,
}

/// How far a schedule got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Every occurrence at or before this instant has been handled
    /// (created, or recorded as missed); the planner continues after it.
    pub cursor: Timestamp,
    /// Occurrences handled so far (delivered, pending or missed): what
    /// `max_occurrences` counts.
    pub occurrences: u64,
    pub last_occurrence: Option<Timestamp>,
    pub missed: MissedSummary,
}

impl Progress {
    /// Nothing handled yet; occurrences strictly after `cursor` are due.
    pub fn starting_after(cursor: Timestamp) -> Self {
        Progress {
            cursor,
            occurrences: 0,
            last_occurrence: None,
            missed: MissedSummary::default(),
        }
    }
}

/// A recurring schedule: the payload of its control event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub id: ScheduleId,
    pub expression: String,
    /// `UNIX`, `QUARTZ`, `SPRING`, `CRON4J` or `EVERY`.
    pub kind: String,
    /// IANA zone; `UTC` by default.
    pub time_zone: String,
    pub payload: Option<String>,
    pub delivery: DeliveryOption,
    /// No occurrence before this instant; `@every` schedules count their
    /// period from it.
    pub start_at: Option<Timestamp>,
    /// No occurrence after this instant.
    pub end_at: Option<Timestamp>,
    pub max_occurrences: Option<u64>,
    pub misfire: MisfirePolicy,
    /// Missed occurrences older than this (relative to when they are
    /// found) are recorded as missed whatever the policy.
    #[serde(with = "crate::time::serde_millis", rename = "catch_up_window_ms")]
    pub catch_up_window: Duration,
    pub status: ScheduleStatus,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub progress: Progress,
    /// Given to every occurrence (its delivery settings, a pull tenant's
    /// queue). Stored under its first name, `pull`.
    #[serde(
        default,
        skip_serializing_if = "EventSettings::is_default",
        rename = "pull"
    )]
    pub settings: EventSettings,
}

/// Default catch-up window: a day, like the engine's look-back.
pub const DEFAULT_CATCH_UP_WINDOW: Duration = Duration::from_secs(24 * 3600);

impl Schedule {
    /// The parsed expression.
    ///
    /// # Errors
    /// The kind, expression or zone is not valid.
    pub fn spec(&self) -> Result<CronSpec, CronError> {
        let kind: CronKind = self.kind.parse()?;
        let spec = CronSpec::parse(&self.expression, kind, Some(&self.time_zone))?;
        Ok(match self.start_at {
            Some(start) => spec.with_anchor(start),
            None => spec,
        })
    }

    /// Checks everything a client can get wrong.
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self) -> Result<CronSpec, ScheduleError> {
        let spec = self.spec()?;
        if let (Some(start), Some(end)) = (self.start_at, self.end_at)
            && end <= start
        {
            return Err(ScheduleError::EndBeforeStart);
        }
        if self.max_occurrences == Some(0) {
            return Err(ScheduleError::ZeroMaxOccurrences);
        }
        if let MisfirePolicy::FireAll { cap } = self.misfire
            && !(1..=MAX_FIRE_ALL_CAP).contains(&cap)
        {
            return Err(ScheduleError::FireAllCap);
        }
        if self.delivery == DeliveryOption::PayloadOnly && self.payload.is_none() {
            return Err(ScheduleError::PayloadRequired);
        }
        Ok(spec)
    }

    /// Reads a control event's payload.
    ///
    /// # Errors
    /// [`ScheduleError::Corrupt`] when it is not a schedule definition.
    pub fn from_json(text: &str) -> Result<Schedule, ScheduleError> {
        serde_json::from_str(text).map_err(|e| ScheduleError::Corrupt(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and enums: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| unreachable!("schedule serializes"))
    }

    /// The first occurrence the planner has not handled yet, if the
    /// schedule has one left (ignores `status`).
    pub fn next_occurrence(&self, spec: &CronSpec) -> Option<Timestamp> {
        if self
            .max_occurrences
            .is_some_and(|max| self.progress.occurrences >= max)
        {
            return None;
        }
        let next = spec.next_after(self.lower_bound())?;
        if self.end_at.is_some_and(|end| next > end) {
            return None;
        }
        Some(next)
    }

    /// The next occurrences from the cursor on, at most `count` (for
    /// previews of a stored schedule).
    pub fn upcoming(&self, spec: &CronSpec, count: usize) -> Vec<Timestamp> {
        let left = self.max_occurrences.map_or(u64::MAX, |max| {
            max.saturating_sub(self.progress.occurrences)
        });
        spec.occurrences_after(self.lower_bound())
            .take_while(|at| self.end_at.is_none_or(|end| *at <= end))
            .take(usize::try_from(left).unwrap_or(usize::MAX).min(count))
            .collect()
    }

    /// Occurrences strictly after this are still to be handled.
    fn lower_bound(&self) -> Timestamp {
        let cursor = self.progress.cursor;
        match self.start_at {
            Some(start) => cursor.max(Timestamp::from_millis(start.as_millis() - 1)),
            None => cursor,
        }
    }

    /// When the control event should fire for `next`: `lead` earlier.
    pub fn materialize_at(next: Timestamp, lead: Duration) -> Timestamp {
        next.minus(lead)
    }
}

/// `at` in the spec's zone, RFC 3339 with the offset and the zone name
/// (`2027-03-28T03:00:00+02:00[Europe/Berlin]`), for previews.
pub fn local_time(spec: &CronSpec, at: Timestamp) -> String {
    match jiff::Timestamp::from_millisecond(at.as_millis()) {
        Ok(instant) => instant.to_zoned(spec.time_zone().clone()).to_string(),
        Err(_) => at.to_rfc3339(),
    }
}

/// The planner's knobs (engine options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    /// Occurrences are created this long before they are due.
    pub lead: Duration,
    /// An occurrence found more than this late is *missed* and handled by
    /// the misfire policy; one found less late is simply delivered late.
    pub misfire_threshold: Duration,
    /// Most occurrences handled in one firing (created or recorded); the
    /// rest are handled by the next firing, at once.
    pub max_per_firing: usize,
    /// Most missed occurrences stored as events per firing; the rest go
    /// into the [`MissedSummary`].
    pub max_missed_recorded: usize,
}

impl Default for PlanLimits {
    fn default() -> Self {
        PlanLimits {
            lead: Duration::from_secs(5),
            misfire_threshold: Duration::from_secs(60),
            max_per_firing: 10_000,
            max_missed_recorded: 100,
        }
    }
}

/// What happens to one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Stored pending: delivered at its instant (at once if already past).
    Deliver,
    /// Stored and ended as `missed` at once.
    Missed,
}

/// One occurrence to store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedOccurrence {
    pub at: Timestamp,
    pub fate: Fate,
}

/// When the control event fires next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Fire again at this instant (may be now, when a firing hit its cap).
    At(Timestamp),
    /// No occurrence left: the control event ends.
    Complete,
}

/// The decision of one firing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// In instant order.
    pub occurrences: Vec<PlannedOccurrence>,
    /// The definition with its progress moved on (status `Completed` when
    /// `next` is [`NextStep::Complete`]).
    pub schedule: Schedule,
    pub next: NextStep,
    /// The missed occurrences this firing only counted in the summary
    /// (beyond the recording cap), if any.
    pub summarized: Option<MissedRange>,
}

/// Missed occurrences of one firing: how many, the first and the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissedRange {
    pub count: u64,
    pub first: Timestamp,
    pub last: Timestamp,
}

impl MissedRange {
    /// One more missed occurrence, at `at` (after every one counted).
    pub fn add(range: Option<MissedRange>, at: Timestamp) -> MissedRange {
        match range {
            None => MissedRange {
                count: 1,
                first: at,
                last: at,
            },
            Some(range) => MissedRange {
                count: range.count + 1,
                first: range.first.min(at),
                last: range.last.max(at),
            },
        }
    }
}

/// Decides one firing of `schedule` at `now` (see the module doc).
///
/// # Contract
/// - every occurrence after the cursor and at or before `now + lead`
///   (within start, end and the maximum count) is handled exactly once
///   across successive plans, as [`Fate::Deliver`], as [`Fate::Missed`] or,
///   beyond the recording cap, in the missed summary;
/// - an occurrence is missed only when it is more than the misfire
///   threshold late; then the policy decides, restricted to the catch-up
///   window;
/// - `next` is [`NextStep::At`] `now` when a cap cut the firing short,
///   else the next occurrence minus `lead` (after `now`), or `Complete`.
pub fn plan(schedule: &Schedule, spec: &CronSpec, now: Timestamp, limits: PlanLimits) -> Plan {
    let horizon = now.plus(limits.lead);
    let late_before = now.minus(limits.misfire_threshold);
    let keep_late = schedule.misfire.deliver_count();
    let max_scan = limits.max_per_firing.max(keep_late + 1);

    let mut late = Vec::new();
    let mut timely = Vec::new();
    let mut next_occurrence = None;
    let mut complete = false;
    let mut truncated = false;
    let mut handled = schedule.progress.occurrences;
    let mut occurrences = spec.occurrences_after(schedule.lower_bound());
    loop {
        if schedule.max_occurrences.is_some_and(|max| handled >= max) {
            complete = true;
            break;
        }
        let Some(at) = occurrences.next() else {
            complete = true;
            break;
        };
        if schedule.end_at.is_some_and(|end| at > end) {
            complete = true;
            break;
        }
        if at > horizon {
            next_occurrence = Some(at);
            break;
        }
        if late.len() + timely.len() >= max_scan {
            truncated = true;
            break;
        }
        handled += 1;
        if at < late_before {
            late.push(at);
        } else {
            timely.push(at);
        }
    }

    // Cut short while still among late occurrences: which of them are the
    // latest is not known yet, so the last `keep_late` are left for the
    // next firing and all the others are missed.
    let held_back = if truncated && timely.is_empty() {
        keep_late.min(late.len())
    } else {
        0
    };
    late.truncate(late.len() - held_back);
    handled -= held_back as u64;

    let catch_up_from = now.minus(schedule.catch_up_window);
    let delivered_late: Vec<Timestamp> = if held_back > 0 {
        Vec::new()
    } else {
        late.iter()
            .rev()
            .filter(|at| **at >= catch_up_from)
            .take(keep_late)
            .copied()
            .collect()
    };

    let mut next = schedule.clone();
    let mut planned = Vec::with_capacity(late.len().min(limits.max_missed_recorded) + timely.len());
    let mut recorded_missed = 0usize;
    let mut summarized = None;
    for at in &late {
        if delivered_late.contains(at) {
            planned.push(PlannedOccurrence {
                at: *at,
                fate: Fate::Deliver,
            });
        } else if recorded_missed < limits.max_missed_recorded {
            recorded_missed += 1;
            planned.push(PlannedOccurrence {
                at: *at,
                fate: Fate::Missed,
            });
        } else {
            let summary = &mut next.progress.missed;
            summary.summarized += 1;
            summary.first_summarized.get_or_insert(*at);
            summary.last_summarized = Some(*at);
            summarized = Some(MissedRange::add(summarized, *at));
        }
    }
    next.progress.missed.recorded += recorded_missed as u64;
    planned.extend(timely.iter().map(|at| PlannedOccurrence {
        at: *at,
        fate: Fate::Deliver,
    }));

    let last_handled = timely.last().or(late.last()).copied();
    if let Some(last) = last_handled {
        next.progress.cursor = last;
        next.progress.last_occurrence = Some(last);
    }
    next.progress.occurrences = handled;

    let step = if truncated {
        NextStep::At(now)
    } else if complete {
        next.status = ScheduleStatus::Completed;
        NextStep::Complete
    } else {
        // The loop ends with the occurrence after the horizon.
        let at = next_occurrence.unwrap_or(horizon);
        NextStep::At(Schedule::materialize_at(at, limits.lead))
    };
    Plan {
        occurrences: planned,
        schedule: next,
        next: step,
        summarized,
    }
}

#[cfg(test)]
mod tests;
