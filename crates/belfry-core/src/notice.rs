//! Notices: a small signed message to a tenant's notice target (its
//! `notify` in [`crate::TenantConfig`]) when one of its events ends
//! `failed`, `expired` or `missed`, when a schedule's firing ends
//! occurrences `missed` (one notice per firing, see
//! [`Notice::ScheduleMissed`]), when its deliveries are paused or resumed,
//! and when its circuit opens or closes.
//!
//! A notice is itself a durable event of the same tenant, due when it is
//! raised, under an internal id ([`slot_id`]) no client id can collide
//! with. The fire path routes it by its id ([`is_notice`],
//! [`crate::fire::decide::Route::Notice`]) to the notice target instead of
//! the sink, outside the tenant's delivery slots and even while the tenant
//! is paused, and retries it like any event, for at most
//! [`NOTICE_MAX_AGE`].
//!
//! # Bounded
//! A tenant has [`MAX_PENDING_NOTICES`] notice slots: a notice takes the
//! first free one (absent, or holding a finished notice) in the order
//! [`probe`] gives for its identity, and is dropped when every slot holds
//! a pending notice. So a tenant's notices never take more than that many
//! records, pending or finished, whatever its failure rate or its notice
//! target's health.
//!
//! # One notice per slot
//! A slot is read, then written only if it is still as read
//! ([`if_unchanged`]): of two nodes that found one slot free at once, one
//! writes it and the other reads it again and moves on, so neither notice
//! is lost.
//!
//! # Idempotent
//! A notice has an identity ([`Notice::identity`]): an event's notice names
//! the event and its version, a pause its start. Raising a notice whose
//! identity a pending slot already holds changes nothing ([`SlotState`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::event::{DeliveryOption, EventCommand, EventRecord, EventStatus, Precondition};
use crate::ids::{EventId, EventKey, EventVersion, TenantName};
use crate::policy::EventSettings;
use crate::schedule::{MissedRange, ScheduleId};
use crate::time::Timestamp;

/// Notice slots per tenant: at most this many notices are pending at once;
/// more are dropped (and counted).
pub const MAX_PENDING_NOTICES: usize = 100;

/// A notice not delivered this long after it was raised ends `expired`,
/// freeing its slot.
pub const NOTICE_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The internal ids of notices start with this (after the internal mark).
const NOTICE_PREFIX: &str = "notice/";

/// What a notice tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    EventFailed,
    EventExpired,
    EventMissed,
    Paused,
    Resumed,
    CircuitOpened,
    CircuitClosed,
    ScheduleMissed,
}

impl NoticeKind {
    pub const ALL: [NoticeKind; 8] = [
        NoticeKind::EventFailed,
        NoticeKind::EventExpired,
        NoticeKind::EventMissed,
        NoticeKind::Paused,
        NoticeKind::Resumed,
        NoticeKind::CircuitOpened,
        NoticeKind::CircuitClosed,
        NoticeKind::ScheduleMissed,
    ];

    /// The message's `type`, and the metrics' `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::EventFailed => "event_failed",
            NoticeKind::EventExpired => "event_expired",
            NoticeKind::EventMissed => "event_missed",
            NoticeKind::Paused => "paused",
            NoticeKind::Resumed => "resumed",
            NoticeKind::CircuitOpened => "circuit_opened",
            NoticeKind::CircuitClosed => "circuit_closed",
            NoticeKind::ScheduleMissed => "schedule_missed",
        }
    }
}

/// One notice, as the engine raises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A client event ended `failed`, `expired` or `missed`.
    EventEnded {
        event_id: EventId,
        version: EventVersion,
        status: EventStatus,
        reason: Option<String>,
        at: Timestamp,
    },
    /// The tenant's deliveries were paused at `since`.
    Paused {
        reason: Option<String>,
        since: Timestamp,
    },
    /// The tenant's deliveries were resumed at `since`.
    Resumed { since: Timestamp },
    /// The tenant's circuit opened at `at`: its deliveries are held back.
    CircuitOpened {
        reason: Option<String>,
        at: Timestamp,
    },
    /// The tenant's circuit closed at `at`: its deliveries flow again.
    CircuitClosed { at: Timestamp },
    /// One firing of a schedule found occurrences it could not deliver
    /// (missed: reached too late, or past the tenant's quota) and ended
    /// them `missed` at `at`. One notice per firing, not one per
    /// occurrence: a catch-up after an outage is one incident, and a
    /// frequent schedule's (up to 100 stored per firing, more counted)
    /// would otherwise fill the tenant's notice slots and crowd out the
    /// notices of its other failures.
    ScheduleMissed {
        schedule: ScheduleId,
        missed: MissedRange,
        reason: Option<String>,
        at: Timestamp,
    },
}

/// A notice's body, as the notice target receives it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeMessage {
    /// The [`NoticeKind`].
    #[serde(rename = "type")]
    pub kind: NoticeKind,
    /// The notice's identity: the same for every copy of one notice
    /// (at-least-once), different between notices.
    pub id: String,
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EventStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A `schedule_missed` notice's schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<String>,
    /// A `schedule_missed` notice's count of missed occurrences, and the
    /// first and last of them (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<MissedCount>,
    /// When it happened, RFC 3339.
    pub at: String,
}

/// How many occurrences one schedule firing missed, from when to when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissedCount {
    pub count: u64,
    pub first: String,
    pub last: String,
}

impl Notice {
    /// The notice of `record`'s end, when it is a client event that ended
    /// `failed`, `expired` or `missed`; `None` for any other record (a
    /// notice itself, a schedule's control event: no notice of notices).
    pub fn of_ending(record: &EventRecord) -> Option<Notice> {
        if record.key.id.is_internal() {
            return None;
        }
        match record.status {
            EventStatus::Failed | EventStatus::Expired | EventStatus::Missed => {
                Some(Notice::EventEnded {
                    event_id: record.key.id.clone(),
                    version: record.version.clone(),
                    status: record.status,
                    reason: record.last_error.clone(),
                    at: record.finished_at.unwrap_or(record.updated_at),
                })
            }
            _ => None,
        }
    }

    /// The notice of `key` at `version` failed for good at `at` for
    /// `reason` (a pull event: [`crate::pull::LeaseChange::dead_reason`]);
    /// `None` for an internal event.
    pub fn of_failure(
        key: &EventKey,
        version: &EventVersion,
        reason: &str,
        at: Timestamp,
    ) -> Option<Notice> {
        (!key.id.is_internal()).then(|| Notice::EventEnded {
            event_id: key.id.clone(),
            version: version.clone(),
            status: EventStatus::Failed,
            reason: Some(reason.to_string()),
            at,
        })
    }

    /// The notice of a schedule firing that ended the occurrences
    /// `recorded` (their instants) `missed` for `reason` and counted
    /// `summarized` more in its summary; `None` when it missed nothing.
    pub fn of_missed_occurrences(
        schedule: &ScheduleId,
        recorded: &[Timestamp],
        summarized: Option<MissedRange>,
        reason: Option<String>,
        at: Timestamp,
    ) -> Option<Notice> {
        let missed = recorded
            .iter()
            .fold(summarized, |range, &at| Some(MissedRange::add(range, at)))?;
        Some(Notice::ScheduleMissed {
            schedule: schedule.clone(),
            missed,
            reason,
            at,
        })
    }

    pub fn kind(&self) -> NoticeKind {
        match self {
            Notice::EventEnded { status, .. } => match status {
                EventStatus::Expired => NoticeKind::EventExpired,
                EventStatus::Missed => NoticeKind::EventMissed,
                _ => NoticeKind::EventFailed,
            },
            Notice::Paused { .. } => NoticeKind::Paused,
            Notice::Resumed { .. } => NoticeKind::Resumed,
            Notice::CircuitOpened { .. } => NoticeKind::CircuitOpened,
            Notice::CircuitClosed { .. } => NoticeKind::CircuitClosed,
            Notice::ScheduleMissed { .. } => NoticeKind::ScheduleMissed,
        }
    }

    /// When it happened.
    pub fn at(&self) -> Timestamp {
        match self {
            Notice::EventEnded { at, .. }
            | Notice::CircuitOpened { at, .. }
            | Notice::CircuitClosed { at }
            | Notice::ScheduleMissed { at, .. } => *at,
            Notice::Paused { since, .. } | Notice::Resumed { since } => *since,
        }
    }

    /// The notice's identity: an event's notice names the event and its
    /// version; a pause or resume its start (pausing a paused tenant keeps
    /// it), a circuit change its instant, a schedule's missed occurrences
    /// the schedule and the first of them (a firing run again after a
    /// crash raises the same notice).
    pub fn identity(&self) -> String {
        let kind = self.kind().as_str();
        match self {
            Notice::EventEnded {
                event_id, version, ..
            } => format!("{kind}/{event_id}/{version}"),
            Notice::ScheduleMissed {
                schedule, missed, ..
            } => format!("{kind}/{schedule}/{}", missed.first.as_millis()),
            _ => format!("{kind}/{}", self.at().as_millis()),
        }
    }

    /// The body the notice target receives.
    pub fn message(&self, tenant: &TenantName) -> NoticeMessage {
        let (event_id, version, status, reason) = match self {
            Notice::EventEnded {
                event_id,
                version,
                status,
                reason,
                ..
            } => (
                Some(event_id.to_string()),
                Some(version.to_string()),
                Some(*status),
                reason.clone(),
            ),
            Notice::Paused { reason, .. } | Notice::CircuitOpened { reason, .. } => {
                (None, None, None, reason.clone())
            }
            Notice::ScheduleMissed { reason, .. } => (None, None, None, reason.clone()),
            Notice::Resumed { .. } | Notice::CircuitClosed { .. } => (None, None, None, None),
        };
        let (schedule_id, missed) = match self {
            Notice::ScheduleMissed {
                schedule, missed, ..
            } => (
                Some(schedule.to_string()),
                Some(MissedCount {
                    count: missed.count,
                    first: missed.first.to_rfc3339(),
                    last: missed.last.to_rfc3339(),
                }),
            ),
            _ => (None, None),
        };
        NoticeMessage {
            kind: self.kind(),
            id: self.identity(),
            tenant: tenant.to_string(),
            event_id,
            version,
            status,
            reason,
            schedule_id,
            missed,
            at: self.at().to_rfc3339(),
        }
    }
}

/// The internal id of notice slot `slot`.
pub fn slot_id(slot: usize) -> EventId {
    EventId::internal(&format!("{NOTICE_PREFIX}{slot}"))
        .unwrap_or_else(|_| unreachable!("a slot number is a valid id"))
}

/// Whether `id` is a notice's (a slot's).
pub fn is_notice(id: &EventId) -> bool {
    id.internal_rest()
        .is_some_and(|rest| rest.starts_with(NOTICE_PREFIX))
}

/// The slots a notice of `identity` tries, in order: every one of the
/// `slots`, from one its identity picks (so notices raised together spread
/// over the slots, and the same notice looks first where it was put).
pub fn probe(identity: &str, slots: usize) -> impl Iterator<Item = usize> {
    let slots = slots.max(1);
    // FNV-1a: stable across builds, unlike the std hasher.
    let hash = identity.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let first = (hash % slots as u64) as usize;
    (0..slots).map(move |i| (first + i) % slots)
}

/// What a notice slot holds, for a notice of a given identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Nothing, or a finished notice: the notice may take it.
    Free,
    /// A pending copy of this very notice: raising it again is done.
    Same,
    /// Another pending notice.
    Busy,
}

/// The state of a slot holding `record` for a notice of `identity`.
pub fn slot_state(record: Option<&EventRecord>, identity: &str) -> SlotState {
    let Some(record) = record.filter(|record| record.status.is_pending()) else {
        return SlotState::Free;
    };
    let held = record
        .payload
        .as_deref()
        .and_then(|payload| serde_json::from_str::<NoticeMessage>(payload).ok());
    match held {
        Some(held) if held.id == identity => SlotState::Same,
        _ => SlotState::Busy,
    }
}

/// The command that writes `notice` of `tenant` into a free slot holding
/// `current` (if anything), due at once (`now`), as `new_version`. A
/// slot's new notice must not share its old one's instant: an upsert at
/// the same instant would keep a delivered record delivered.
pub fn write_command(
    notice: &Notice,
    tenant: &TenantName,
    current: Option<&EventRecord>,
    now: Timestamp,
    new_version: EventVersion,
) -> EventCommand {
    let at = match current {
        Some(current) if current.event_time == now => now.plus(Duration::from_millis(1)),
        _ => now,
    };
    let payload = serde_json::to_string(&notice.message(tenant))
        .unwrap_or_else(|_| unreachable!("a notice message always encodes"));
    EventCommand::Upsert {
        event_time: at,
        payload: Some(payload),
        delivery: DeliveryOption::PayloadOnly,
        settings: EventSettings {
            max_age_ms: Some(NOTICE_MAX_AGE.as_millis() as u64),
            ..EventSettings::default()
        },
        new_version,
    }
}

/// `command` (a slot's write), applied only while the slot is still as
/// it was read (`current`): the same version, or still absent. Another
/// node may write the slot between the read and the write; its notice
/// then stays and this one answers
/// [`crate::event::CommandOutcome::PreconditionFailed`].
pub fn if_unchanged(current: Option<&EventRecord>, command: EventCommand) -> EventCommand {
    let precondition = match current {
        Some(record) => Precondition::Versions(vec![record.version.clone()]),
        None => Precondition::Absent,
    };
    EventCommand::IfMatch {
        precondition,
        command: Box::new(command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::PartitionId;
    use crate::schedule::{ScheduleId, control_event_id};

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn v2() -> EventVersion {
        EventVersion::from_string("v2".to_string())
    }

    fn tenant() -> TenantName {
        TenantName::new("acme".to_string()).unwrap()
    }

    fn record(id: EventId, status: EventStatus, payload: Option<String>) -> EventRecord {
        EventRecord {
            key: EventKey::new(tenant(), id),
            partition: PartitionId(0),
            version: EventVersion::from_string("v1".to_string()),
            event_time: ts(1_000),
            payload,
            delivery: DeliveryOption::FullEvent,
            status,
            next_fire_at: None,
            attempts: 1,
            last_error: Some("HTTP 500 Internal Server Error".to_string()),
            triggered_at: None,
            created_at: ts(0),
            updated_at: ts(2_000),
            finished_at: Some(ts(2_000)),
            settings: EventSettings::default(),
            debounce_since: None,
        }
    }

    fn failed() -> Notice {
        let event = record(
            EventId::new("e1".to_string()).unwrap(),
            EventStatus::Failed,
            None,
        );
        Notice::of_ending(&event).unwrap()
    }

    #[test]
    fn a_failed_event_gives_a_notice_naming_it_and_its_version() {
        let message = failed().message(&tenant());
        assert_eq!(
            serde_json::to_value(&message).unwrap(),
            serde_json::json!({
                "type": "event_failed",
                "id": "event_failed/e1/v1",
                "tenant": "acme",
                "event_id": "e1",
                "version": "v1",
                "status": "failed",
                "reason": "HTTP 500 Internal Server Error",
                "at": "1970-01-01T00:00:02Z",
            })
        );
    }

    #[test]
    fn only_client_events_that_ended_badly_give_notices() {
        let id = || EventId::new("e1".to_string()).unwrap();
        for (status, kind) in [
            (EventStatus::Failed, Some(NoticeKind::EventFailed)),
            (EventStatus::Expired, Some(NoticeKind::EventExpired)),
            (EventStatus::Missed, Some(NoticeKind::EventMissed)),
            (EventStatus::Delivered, None),
            (EventStatus::Cancelled, None),
            (EventStatus::Retrying, None),
            (EventStatus::Scheduled, None),
        ] {
            let notice = Notice::of_ending(&record(id(), status, None));
            assert_eq!(notice.map(|n| n.kind()), kind, "{status:?}");
        }
        // No notice of a notice, nor of a schedule's control event.
        assert_eq!(
            Notice::of_ending(&record(slot_id(3), EventStatus::Failed, None)),
            None
        );
        let control = control_event_id(&ScheduleId::new("nightly".to_string()).unwrap());
        assert_eq!(
            Notice::of_ending(&record(control, EventStatus::Failed, None)),
            None
        );
    }

    #[test]
    fn a_failure_named_directly_gives_a_notice_unless_internal() {
        let key = EventKey::new(tenant(), EventId::new("job".to_string()).unwrap());
        let version = EventVersion::from_string("v3".to_string());
        let notice = Notice::of_failure(&key, &version, "worker: bad input", ts(9_000)).unwrap();
        assert_eq!(notice.kind(), NoticeKind::EventFailed);
        assert_eq!(notice.identity(), "event_failed/job/v3");
        let notice_key = EventKey::new(tenant(), slot_id(1));
        assert_eq!(Notice::of_failure(&notice_key, &version, "x", ts(1)), None);
    }

    #[test]
    fn only_a_lease_change_that_kills_its_event_names_a_failure() {
        use crate::pull::{LeaseChange, Resolution};
        let dead = LeaseChange::Resolve {
            resolution: Resolution::Dead {
                reason: "worker: bad input".to_string(),
            },
            report: None,
        };
        assert_eq!(dead.dead_reason(), Some("worker: bad input"));
        let retry = LeaseChange::Resolve {
            resolution: Resolution::Retry { at: ts(10_000) },
            report: None,
        };
        assert_eq!(retry.dead_reason(), None);
        let extend = LeaseChange::Extend {
            expires_at: ts(10_000),
        };
        assert_eq!(extend.dead_reason(), None);
    }

    #[test]
    fn pause_and_circuit_notices_have_no_event() {
        let paused = Notice::Paused {
            reason: Some("the receiver answered 410 Gone".to_string()),
            since: ts(5_000),
        };
        assert_eq!(
            serde_json::to_value(paused.message(&tenant())).unwrap(),
            serde_json::json!({
                "type": "paused",
                "id": "paused/5000",
                "tenant": "acme",
                "reason": "the receiver answered 410 Gone",
                "at": "1970-01-01T00:00:05Z",
            })
        );
        assert_eq!(
            Notice::Resumed { since: ts(6_000) }.identity(),
            "resumed/6000"
        );
        let opened = Notice::CircuitOpened {
            reason: None,
            at: ts(7_000),
        };
        assert_eq!(opened.kind().as_str(), "circuit_opened");
        assert_eq!(
            Notice::CircuitClosed { at: ts(8_000) }.kind(),
            NoticeKind::CircuitClosed
        );
    }

    #[test]
    fn notice_ids_are_internal_and_known_by_their_prefix() {
        let id = slot_id(42);
        assert!(id.is_internal());
        assert!(is_notice(&id));
        assert!(!is_notice(&EventId::new("notice/42".to_string()).unwrap()));
        let control = control_event_id(&ScheduleId::new("n".to_string()).unwrap());
        assert!(!is_notice(&control));
    }

    #[test]
    fn the_probe_visits_every_slot_once_starting_where_the_identity_says() {
        let order: Vec<usize> = probe("event_failed/e1/v1", 10).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_eq!(order, probe("event_failed/e1/v1", 10).collect::<Vec<_>>());
        // Different notices start at different slots (mostly).
        let firsts: std::collections::HashSet<usize> = (0..50)
            .map(|i| probe(&format!("event_failed/e{i}/v1"), 100).next().unwrap())
            .collect();
        assert!(firsts.len() > 30, "{}", firsts.len());
    }

    #[test]
    fn a_slot_is_free_unless_a_pending_notice_holds_it() {
        let notice = failed();
        let identity = notice.identity();
        let payload = serde_json::to_string(&notice.message(&tenant())).unwrap();
        let other =
            serde_json::to_string(&Notice::Resumed { since: ts(1) }.message(&tenant())).unwrap();
        assert_eq!(slot_state(None, &identity), SlotState::Free);
        let finished = record(slot_id(0), EventStatus::Delivered, Some(other.clone()));
        assert_eq!(slot_state(Some(&finished), &identity), SlotState::Free);
        let same = record(slot_id(0), EventStatus::Retrying, Some(payload));
        assert_eq!(slot_state(Some(&same), &identity), SlotState::Same);
        let busy = record(slot_id(0), EventStatus::Scheduled, Some(other));
        assert_eq!(slot_state(Some(&busy), &identity), SlotState::Busy);
    }

    #[test]
    fn the_cap_holds_whatever_the_number_raised() {
        // A tenant whose notices are never delivered: the slots fill, then
        // every further notice is dropped.
        let slots = 8;
        let mut held: Vec<Option<EventRecord>> = vec![None; slots];
        let mut dropped = 0;
        for i in 0..100 {
            let notice = Notice::EventEnded {
                event_id: EventId::new(format!("e{i}")).unwrap(),
                version: EventVersion::from_string("v1".to_string()),
                status: EventStatus::Failed,
                reason: None,
                at: ts(i),
            };
            let identity = notice.identity();
            let free = probe(&identity, slots)
                .find(|&slot| slot_state(held[slot].as_ref(), &identity) != SlotState::Busy);
            match free {
                Some(slot) => {
                    let payload = serde_json::to_string(&notice.message(&tenant())).unwrap();
                    held[slot] = Some(record(slot_id(slot), EventStatus::Scheduled, Some(payload)));
                }
                None => dropped += 1,
            }
        }
        assert!(held.iter().all(Option::is_some));
        assert_eq!(dropped, 100 - slots);
    }

    #[test]
    fn a_reused_slot_gets_a_new_instant() {
        let notice = failed();
        let current = record(slot_id(0), EventStatus::Delivered, None);
        let EventCommand::Upsert {
            event_time,
            delivery,
            settings,
            ..
        } = write_command(&notice, &tenant(), Some(&current), ts(1_000), v2())
        else {
            panic!("an upsert");
        };
        assert_eq!(event_time, ts(1_001));
        assert_eq!(delivery, DeliveryOption::PayloadOnly);
        assert_eq!(settings.max_age_ms, Some(NOTICE_MAX_AGE.as_millis() as u64));
        let EventCommand::Upsert { event_time, .. } =
            write_command(&notice, &tenant(), None, ts(1_000), v2())
        else {
            panic!("an upsert");
        };
        assert_eq!(event_time, ts(1_000));
    }

    #[test]
    fn a_slot_is_written_only_while_it_is_as_read() {
        let notice = failed();
        let precondition = |current: Option<&EventRecord>| {
            let command = write_command(&notice, &tenant(), current, ts(1_000), v2());
            match if_unchanged(current, command.clone()) {
                EventCommand::IfMatch {
                    precondition,
                    command: inner,
                } => {
                    assert_eq!(*inner, command);
                    precondition
                }
                other => panic!("not conditional: {other:?}"),
            }
        };
        let held = record(slot_id(0), EventStatus::Delivered, None);
        let mut rewritten = held.clone();
        rewritten.version = v2();
        // Read absent: written only while still absent.
        let absent = precondition(None);
        assert!(absent.holds(None));
        assert!(!absent.holds(Some(&held)));
        // Read holding v1: written only while it still holds v1.
        let as_read = precondition(Some(&held));
        assert!(as_read.holds(Some(&held)));
        assert!(!as_read.holds(Some(&rewritten)));
        assert!(!as_read.holds(None));
    }

    #[test]
    fn a_schedule_firing_that_missed_occurrences_gives_one_notice_counting_them() {
        let schedule = ScheduleId::new("every-minute".to_string()).unwrap();
        let recorded = [ts(60_000), ts(120_000), ts(180_000)];
        let summarized = Some(MissedRange {
            count: 10,
            first: ts(240_000),
            last: ts(780_000),
        });
        let reason = "missed: the schedule reached this occurrence more than 60 s late \
                      (misfire policy skip)";
        let notice = Notice::of_missed_occurrences(
            &schedule,
            &recorded,
            summarized,
            Some(reason.to_string()),
            ts(900_000),
        )
        .unwrap();
        assert_eq!(notice.kind(), NoticeKind::ScheduleMissed);
        assert_eq!(
            serde_json::to_value(notice.message(&tenant())).unwrap(),
            serde_json::json!({
                "type": "schedule_missed",
                "id": "schedule_missed/every-minute/60000",
                "tenant": "acme",
                "schedule_id": "every-minute",
                "missed": {
                    "count": 13,
                    "first": "1970-01-01T00:01:00Z",
                    "last": "1970-01-01T00:13:00Z",
                },
                "reason": reason,
                "at": "1970-01-01T00:15:00Z",
            })
        );
        // Only counted, none stored: still told.
        let counted = Notice::of_missed_occurrences(&schedule, &[], summarized, None, ts(1));
        assert_eq!(
            counted.map(|n| n.identity()),
            Some("schedule_missed/every-minute/240000".to_string())
        );
        // Nothing missed: no notice.
        assert_eq!(
            Notice::of_missed_occurrences(&schedule, &[], None, None, ts(1)),
            None
        );
    }
}
