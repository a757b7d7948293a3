//! What a fired control event stores, decided from its record: whether its
//! definition plans, parks or stops the schedule, the commands of a plan's
//! occurrences, and where the control event moves next.
//!
//! The runtime adds what needs a store or a clock: the quota budget spent
//! on the plan, the fence, and applying the commands in order (occurrences
//! first, then the control event, conditional on its fired version).

use std::time::Duration;

use crate::cron::{CronSpec, OccurrenceId};
use crate::event::{DeliveryOption, EventCommand, EventRecord};
use crate::ids::{EventKey, EventVersion, TenantName};
use crate::time::Timestamp;

use super::{
    Fate, MisfirePolicy, NextStep, PARKED_AT, Plan, Schedule, ScheduleError, ScheduleStatus,
};

/// What a fired control event does with its stored definition.
#[derive(Debug)]
pub enum Firing {
    /// The definition cannot be read: the control event ends missed with
    /// the reason ([`stop_command`]), never dropped silently.
    Stop(ScheduleError),
    /// Paused (or ended): plans nothing; the control event parks.
    Park(Schedule),
    /// Active: plan its occurrences with this definition.
    Plan(Schedule, CronSpec),
}

impl Firing {
    /// Reads the control event's definition.
    pub fn of(record: &EventRecord) -> Firing {
        let definition = record
            .payload
            .as_deref()
            .ok_or_else(|| ScheduleError::Corrupt("no definition".into()))
            .and_then(Schedule::from_json)
            .and_then(|s| s.spec().map(|spec| (s, spec)).map_err(ScheduleError::from));
        match definition {
            Err(error) => Firing::Stop(error),
            Ok((schedule, _)) if schedule.status != ScheduleStatus::Active => {
                Firing::Park(schedule)
            }
            Ok((schedule, spec)) => Firing::Plan(schedule, spec),
        }
    }
}

/// Ends a control event whose definition is unusable; GET shows the reason.
pub fn stop_command(error: &ScheduleError) -> EventCommand {
    EventCommand::Expire {
        reason: format!("schedule stopped: {error}"),
    }
}

/// Where the fired control event `record` moves after a plan: its next
/// time, or parked when the schedule is complete (so it stays visible).
/// Never its current instant: an upsert at the same instant would not
/// re-arm it.
pub fn next_control_at(record: &EventRecord, next: NextStep) -> Timestamp {
    let at = match next {
        NextStep::At(at) => at,
        NextStep::Complete => PARKED_AT,
    };
    if at == record.event_time {
        at.plus(Duration::from_millis(1))
    } else {
        at
    }
}

/// Moves the fired control event `record` to `at` with `schedule`, unless
/// it changed version meanwhile (a client's change wins, and its control
/// event plans with the new definition).
pub fn control_command(record: &EventRecord, at: Timestamp, schedule: &Schedule) -> EventCommand {
    EventCommand::UpsertIfCurrent {
        expected: record.version.clone(),
        event_time: at,
        payload: Some(schedule.to_json()),
        delivery: DeliveryOption::FullEvent,
        new_version: EventVersion::generate(),
    }
}

/// The writes of a plan's occurrences.
#[derive(Debug, Default)]
pub struct OccurrenceCommands {
    /// Upserts (and, for missed occurrences, their expiry right after), in
    /// the plan's order.
    pub commands: Vec<(EventKey, EventCommand)>,
    /// Occurrences whose id does not fit an event id; not stored. Schedule
    /// ids leave room for the suffix, so this stays empty.
    pub too_long: Vec<OccurrenceId>,
}

/// The upserts (and expiries) of `plan`'s occurrences in `tenant`; missed
/// ones are reported against `misfire_threshold`.
pub fn occurrence_commands(
    tenant: &TenantName,
    plan: &Plan,
    misfire_threshold: Duration,
) -> OccurrenceCommands {
    let schedule = &plan.schedule;
    let mut out = OccurrenceCommands {
        commands: Vec::with_capacity(plan.occurrences.len()),
        too_long: Vec::new(),
    };
    for occurrence in &plan.occurrences {
        let id = OccurrenceId::new(
            tenant.clone(),
            schedule.id.as_event_id().clone(),
            occurrence.at,
        );
        let Ok(key) = id.event_key() else {
            out.too_long.push(id);
            continue;
        };
        out.commands.push((
            key.clone(),
            EventCommand::Upsert {
                event_time: occurrence.at,
                payload: schedule.payload.clone(),
                delivery: schedule.delivery,
                new_version: id.event_version(),
                settings: schedule.settings.clone(),
            },
        ));
        if occurrence.fate == Fate::Missed {
            out.commands.push((
                key,
                EventCommand::Expire {
                    reason: format!(
                        "missed: the schedule reached this occurrence more than {} s late \
                         (misfire policy {})",
                        misfire_threshold.as_secs(),
                        misfire_name(schedule.misfire)
                    ),
                },
            ));
        }
    }
    out
}

fn misfire_name(policy: MisfirePolicy) -> &'static str {
    match policy {
        MisfirePolicy::FireOnce => "fire_once",
        MisfirePolicy::FireAll { .. } => "fire_all",
        MisfirePolicy::Skip => "skip",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventSettings, EventStatus};
    use crate::partition::PartitionId;
    use crate::schedule::{
        DEFAULT_CATCH_UP_WINDOW, PlannedOccurrence, Progress, ScheduleId, control_event_id,
    };

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn tenant() -> TenantName {
        TenantName::new("acme").unwrap()
    }

    fn schedule(status: ScheduleStatus, misfire: MisfirePolicy) -> Schedule {
        Schedule {
            id: ScheduleId::new("job").unwrap(),
            expression: "@every 2s".to_string(),
            kind: "EVERY".to_string(),
            time_zone: "UTC".to_string(),
            payload: Some("p".to_string()),
            delivery: DeliveryOption::FullEvent,
            start_at: None,
            end_at: None,
            max_occurrences: None,
            misfire,
            catch_up_window: DEFAULT_CATCH_UP_WINDOW,
            status,
            created_at: at(0),
            updated_at: at(0),
            progress: Progress::starting_after(at(0)),
            settings: EventSettings::default(),
        }
    }

    fn control(payload: Option<String>, event_time: i64) -> EventRecord {
        let id = ScheduleId::new("job").unwrap();
        EventRecord {
            debounce_since: None,
            key: EventKey::new(tenant(), control_event_id(&id)),
            partition: PartitionId(0),
            version: EventVersion::from_string("v1".to_string()),
            event_time: at(event_time),
            payload,
            delivery: DeliveryOption::FullEvent,
            status: EventStatus::Scheduled,
            next_fire_at: Some(at(event_time)),
            attempts: 0,
            last_error: None,
            triggered_at: None,
            created_at: at(0),
            updated_at: at(0),
            finished_at: None,
            settings: EventSettings::default(),
        }
    }

    #[test]
    fn the_definition_decides_plan_park_or_stop() {
        let active = schedule(ScheduleStatus::Active, MisfirePolicy::FireOnce);
        assert!(matches!(
            Firing::of(&control(Some(active.to_json()), 0)),
            Firing::Plan(s, _) if s == active
        ));
        let paused = schedule(ScheduleStatus::Paused, MisfirePolicy::FireOnce);
        assert!(matches!(
            Firing::of(&control(Some(paused.to_json()), 0)),
            Firing::Park(s) if s == paused
        ));
        let Firing::Stop(error) = Firing::of(&control(None, 0)) else {
            panic!("no definition must stop the schedule");
        };
        let EventCommand::Expire { reason } = stop_command(&error) else {
            panic!("a stop expires the control event");
        };
        assert!(reason.starts_with("schedule stopped: "), "{reason}");
        let mut bad = schedule(ScheduleStatus::Active, MisfirePolicy::FireOnce);
        bad.expression = "not cron".to_string();
        assert!(matches!(
            Firing::of(&control(Some(bad.to_json()), 0)),
            Firing::Stop(_)
        ));
    }

    #[test]
    fn the_control_event_never_moves_to_its_own_instant() {
        let record = control(None, 5_000);
        assert_eq!(next_control_at(&record, NextStep::At(at(7_000))), at(7_000));
        assert_eq!(next_control_at(&record, NextStep::At(at(5_000))), at(5_001));
        assert_eq!(next_control_at(&record, NextStep::Complete), PARKED_AT);
        let EventCommand::UpsertIfCurrent {
            expected,
            event_time,
            ..
        } = control_command(
            &record,
            at(7_000),
            &schedule(ScheduleStatus::Active, MisfirePolicy::Skip),
        )
        else {
            panic!("the control event moves conditionally");
        };
        assert_eq!((expected, event_time), (record.version, at(7_000)));
    }

    #[test]
    fn missed_occurrences_are_stored_then_expired_with_the_policy_named() {
        let plan = Plan {
            occurrences: vec![
                PlannedOccurrence {
                    at: at(1_000),
                    fate: Fate::Missed,
                },
                PlannedOccurrence {
                    at: at(2_000),
                    fate: Fate::Deliver,
                },
            ],
            schedule: schedule(ScheduleStatus::Active, MisfirePolicy::FireAll { cap: 3 }),
            next: NextStep::At(at(4_000)),
            summarized: None,
        };
        let out = occurrence_commands(&tenant(), &plan, Duration::from_secs(60));
        assert!(out.too_long.is_empty());
        let kinds: Vec<_> = out
            .commands
            .iter()
            .map(|(key, command)| match command {
                EventCommand::Upsert { event_time, .. } => {
                    format!("{} upsert {}", key.id.as_str(), event_time.as_millis())
                }
                EventCommand::Expire { reason } => format!("{} expire {reason}", key.id.as_str()),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "job@1970-01-01T00:00:01Z upsert 1000",
                "job@1970-01-01T00:00:01Z expire missed: the schedule reached this occurrence \
                 more than 60 s late (misfire policy fire_all)",
                "job@1970-01-01T00:00:02Z upsert 2000",
            ]
        );
    }
}
