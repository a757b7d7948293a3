//! What the runtime decides about one fired entry, once it holds the
//! entry's stored record: whether it is still due, whether it expired past
//! the look-back, and which channel takes it (or none, while its tenant
//! is paused).
//!
//! The window is a hint; these checks against the record are the truth,
//! and every runtime (the engine's dispatcher, the simulations) calls them
//! rather than restating them.

use std::time::Duration;

use crate::event::{EventRecord, EventStatus};
use crate::ids::EventKey;
use crate::policy::{DeliveryPolicy, NodeDefaults};
use crate::retry::RetryPolicy;
use crate::schedule::schedule_of_control;
use crate::tenant::{SinkConfig, TenantPause};
use crate::time::Timestamp;
use crate::timer::DueCursor;

/// Whether `record` still wants the attempt `entry` fired for: pending, and
/// due at that very instant (a moved or finished event was fired from a
/// stale window and is dropped).
pub fn still_due(record: &EventRecord, entry: &DueCursor) -> bool {
    record.status.is_pending() && record.next_fire_at == Some(entry.due)
}

/// The reason to store `record` as missed instead of delivering it at
/// `now`, when its first attempt comes more than `lookback` after it could
/// first have fired; `None` to deliver it.
///
/// The look-back is for downtime: lateness counts from when a node could
/// first have fired the version, which for one submitted (or moved)
/// past-due is its last change, not its instant, and for one of a tenant
/// resumed since (`resumed_since`) the resume: what a pause held back is
/// delivered late, never missed. Such an event fires at once, as BigBen
/// does. Retries are never expired here.
pub fn lookback_expiry(
    record: &EventRecord,
    entry: &DueCursor,
    now: Timestamp,
    lookback: Duration,
    resumed_since: Option<Timestamp>,
) -> Option<String> {
    if record.status != EventStatus::Scheduled {
        return None;
    }
    let firable_since = entry
        .due
        .max(record.updated_at)
        .max(resumed_since.unwrap_or(Timestamp::MIN));
    let late = i128::from(now.as_millis()) - i128::from(firable_since.as_millis());
    if late <= lookback.as_millis() as i128 {
        return None;
    }
    Some(format!(
        "missed: came due at {} while the node was down, more than the look-back of {} s ago",
        entry.due,
        lookback.as_secs()
    ))
}

/// The attempts of `record`, an event of a tenant delivering to `sink`, on
/// a node retrying by `node` ([`DeliveryPolicy::resolve`]): its own
/// settings, else its tenant's defaults, else the node's. The runtime
/// calls it when each attempt comes due, with the tenant as its cache has
/// it then: a change of the tenant's defaults applies to the next attempt
/// that comes due after it.
pub fn delivery_policy(
    sink: &SinkConfig,
    record: &EventRecord,
    node: &RetryPolicy,
) -> DeliveryPolicy {
    let node = if sink.is_pull() {
        NodeDefaults::pull(node)
    } else {
        NodeDefaults::push(node)
    };
    DeliveryPolicy::resolve(
        node,
        sink.delivery_defaults(),
        &record.settings,
        record.event_time,
    )
}

/// The reason to end `record` `expired` instead of attempting it at
/// `now`: its expiry (`expire_at`, `max_age_ms`, in `policy`) has come.
/// `None` to go on. Every attempt, the first and each retry, is checked.
pub fn policy_expiry(
    record: &EventRecord,
    policy: &DeliveryPolicy,
    now: Timestamp,
) -> Option<String> {
    let expiry = policy.expires_at.filter(|_| policy.expired(now))?;
    Some(match record.attempts {
        0 => format!("expired: not delivered by its expiry at {expiry}"),
        attempts => format!(
            "expired: not delivered by its expiry at {expiry} (after {attempts} attempts: {})",
            record.last_error.as_deref().unwrap_or("no error recorded")
        ),
    })
}

/// Where a fired entry goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A schedule's control event: it plans occurrences instead of
    /// delivering, and takes no delivery slot (a slow tenant cannot delay
    /// it). Known from the key alone, before any slot or tenant read.
    Schedule,
    /// A pull tenant's event: handed to the pull queue, where it waits for
    /// a worker's claim.
    Pull,
    /// Pushed to the tenant's sink (HTTP, Kafka, built-in).
    Push,
    /// A notice (`crate::notice`): to the tenant's notice target, outside
    /// the tenant's delivery slots (a slow notice target cannot delay its
    /// deliveries) and even while it is paused (the pause is news). Known
    /// from the key alone.
    Notice,
    /// Its tenant is paused: not delivered and nothing recorded. The entry
    /// goes back to its partition's window, which holds the tenant's lane
    /// until it resumes ([`super::Finish::Held`]).
    Hold,
}

impl Route {
    /// Whether the entry is delivered at all (a control event plans
    /// instead). Only pushed and pulled entries queue for a delivery slot.
    pub fn delivers(self) -> bool {
        !matches!(self, Route::Schedule)
    }
}

/// The route of a fired entry known from its key alone: [`Route::Schedule`]
/// for a control event, [`Route::Notice`] for a notice, `None` when its
/// tenant's sink decides ([`route`]).
pub fn route_of_key(key: &EventKey) -> Option<Route> {
    if crate::notice::is_notice(&key.id) {
        return Some(Route::Notice);
    }
    schedule_of_control(&key.id).map(|_| Route::Schedule)
}

/// The route of a fired entry of a tenant delivering to `sink`, paused or
/// not (`pause`). A schedule's control event plans occurrences even while
/// its tenant is paused: they are stored as events, and held like them.
pub fn route(key: &EventKey, sink: &SinkConfig, pause: Option<&TenantPause>) -> Route {
    if let Some(route) = route_of_key(key) {
        return route;
    }
    if pause.is_some_and(|pause| pause.paused) {
        return Route::Hold;
    }
    match sink {
        SinkConfig::Pull(_) => Route::Pull,
        SinkConfig::Http(_) | SinkConfig::Kafka(_) | SinkConfig::Builtin(_) => Route::Push,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{DeliveryOption, EventSettings};
    use crate::ids::{EventId, EventVersion, TenantName};
    use crate::partition::PartitionId;
    use crate::schedule::{ScheduleId, control_event_id};
    use crate::tenant::{BuiltinTarget, PullTarget};

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn key(id: &str) -> EventKey {
        EventKey::new(
            TenantName::new("acme".to_string()).unwrap(),
            EventId::new(id.to_string()).unwrap(),
        )
    }

    fn entry(due: i64) -> DueCursor {
        DueCursor {
            due: ts(due),
            key: key("e"),
        }
    }

    fn record(status: EventStatus, next_fire_at: Option<i64>, updated_at: i64) -> EventRecord {
        EventRecord {
            debounce_since: None,
            key: key("e"),
            partition: PartitionId(0),
            version: EventVersion::from_string("v1".to_string()),
            event_time: ts(1_000),
            payload: None,
            delivery: DeliveryOption::FullEvent,
            status,
            next_fire_at: next_fire_at.map(ts),
            attempts: 0,
            last_error: None,
            triggered_at: None,
            created_at: ts(0),
            updated_at: ts(updated_at),
            finished_at: None,
            settings: EventSettings::default(),
        }
    }

    #[test]
    fn only_a_pending_record_due_at_the_fired_instant_is_still_due() {
        assert!(still_due(
            &record(EventStatus::Scheduled, Some(1_000), 0),
            &entry(1_000)
        ));
        assert!(still_due(
            &record(EventStatus::Retrying, Some(1_000), 0),
            &entry(1_000)
        ));
        // Moved since the window read it.
        assert!(!still_due(
            &record(EventStatus::Scheduled, Some(2_000), 0),
            &entry(1_000)
        ));
        // Finished meanwhile.
        assert!(!still_due(
            &record(EventStatus::Delivered, None, 0),
            &entry(1_000)
        ));
        assert!(!still_due(
            &record(EventStatus::Cancelled, None, 0),
            &entry(1_000)
        ));
    }

    #[test]
    fn lookback_counts_from_the_later_of_due_and_last_change() {
        let lookback = Duration::from_secs(10);
        let late = record(EventStatus::Scheduled, Some(1_000), 0);
        assert_eq!(
            lookback_expiry(&late, &entry(1_000), ts(11_000), lookback, None),
            None
        );
        let reason = lookback_expiry(&late, &entry(1_000), ts(11_001), lookback, None).unwrap();
        assert_eq!(
            reason,
            "missed: came due at 1970-01-01T00:00:01Z while the node was down, \
             more than the look-back of 10 s ago"
        );
        // Submitted past-due: it fires at once.
        let submitted_late = record(EventStatus::Scheduled, Some(1_000), 50_000);
        assert_eq!(
            lookback_expiry(&submitted_late, &entry(1_000), ts(55_000), lookback, None),
            None
        );
        // Retries are never expired by the look-back.
        let retrying = record(EventStatus::Retrying, Some(1_000), 0);
        assert_eq!(
            lookback_expiry(&retrying, &entry(1_000), ts(1_000_000), lookback, None),
            None
        );
    }

    #[test]
    fn an_attempt_at_or_past_the_expiry_is_not_made() {
        let policy = DeliveryPolicy {
            expires_at: Some(ts(5_000)),
            ..DeliveryPolicy::default()
        };
        let mut due = record(EventStatus::Scheduled, Some(1_000), 0);
        assert_eq!(policy_expiry(&due, &policy, ts(4_999)), None);
        assert_eq!(
            policy_expiry(&due, &policy, ts(5_000)).unwrap(),
            "expired: not delivered by its expiry at 1970-01-01T00:00:05Z"
        );
        due.attempts = 2;
        due.last_error = Some("HTTP 503 Service Unavailable".into());
        assert_eq!(
            policy_expiry(&due, &policy, ts(9_000)).unwrap(),
            "expired: not delivered by its expiry at 1970-01-01T00:00:05Z \
             (after 2 attempts: HTTP 503 Service Unavailable)"
        );
        assert_eq!(
            policy_expiry(&due, &DeliveryPolicy::default(), ts(9_000)),
            None
        );
    }

    #[test]
    fn lookback_counts_a_resumed_tenants_events_from_the_resume() {
        let lookback = Duration::from_secs(10);
        let held = record(EventStatus::Scheduled, Some(1_000), 0);
        // Paused from 0 to 100 s: its event due at 1 s is 90 s late at the
        // resume, and delivered, not missed.
        let resumed = Some(ts(100_000));
        assert_eq!(
            lookback_expiry(&held, &entry(1_000), ts(100_500), lookback, resumed),
            None
        );
        // A node down for longer than the look-back after the resume still
        // misses it.
        assert!(lookback_expiry(&held, &entry(1_000), ts(110_001), lookback, resumed).is_some());
    }

    #[test]
    fn lookback_survives_extreme_instants() {
        let r = record(EventStatus::Scheduled, Some(i64::MIN), i64::MIN);
        let e = DueCursor {
            due: Timestamp::MIN,
            key: key("e"),
        };
        assert!(lookback_expiry(&r, &e, ts(i64::MAX), Duration::ZERO, None).is_some());
        assert!(lookback_expiry(&r, &e, ts(i64::MAX), Duration::MAX, None).is_none());
        assert!(
            lookback_expiry(&r, &e, ts(i64::MAX), Duration::ZERO, Some(Timestamp::MIN)).is_some()
        );
    }

    #[test]
    fn control_events_route_to_the_planner_whatever_the_sink() {
        let control = EventKey::new(
            TenantName::new("acme".to_string()).unwrap(),
            control_event_id(&ScheduleId::new("nightly".to_string()).unwrap()),
        );
        let pull = SinkConfig::Pull(PullTarget::default());
        let log = SinkConfig::Builtin(BuiltinTarget {
            processor: "log".to_string(),
        });
        assert_eq!(route_of_key(&control), Some(Route::Schedule));
        assert_eq!(route(&control, &pull, None), Route::Schedule);
        assert!(!Route::Schedule.delivers());
        assert_eq!(route_of_key(&key("e")), None);
        assert_eq!(route(&key("e"), &pull, None), Route::Pull);
        assert_eq!(route(&key("e"), &log, None), Route::Push);
        assert!(Route::Pull.delivers() && Route::Push.delivers());
    }

    #[test]
    fn a_paused_tenants_events_are_held_and_its_schedules_still_plan() {
        let log = SinkConfig::Builtin(BuiltinTarget {
            processor: "log".to_string(),
        });
        let pull = SinkConfig::Pull(PullTarget::default());
        let paused = TenantPause::paused(None, Some("incident".to_string()), ts(5));
        let resumed = TenantPause::resumed(Some(&paused), ts(9)).unwrap();
        assert_eq!(route(&key("e"), &log, Some(&paused)), Route::Hold);
        assert_eq!(route(&key("e"), &pull, Some(&paused)), Route::Hold);
        assert_eq!(route(&key("e"), &log, Some(&resumed)), Route::Push);
        assert_eq!(route(&key("e"), &pull, Some(&resumed)), Route::Pull);
        let control = EventKey::new(
            TenantName::new("acme".to_string()).unwrap(),
            control_event_id(&ScheduleId::new("nightly".to_string()).unwrap()),
        );
        assert_eq!(route(&control, &log, Some(&paused)), Route::Schedule);
    }

    #[test]
    fn notices_route_to_the_notice_target_even_while_paused() {
        let notice = EventKey::new(
            TenantName::new("acme".to_string()).unwrap(),
            crate::notice::slot_id(7),
        );
        let log = SinkConfig::Builtin(BuiltinTarget {
            processor: "log".to_string(),
        });
        let pull = SinkConfig::Pull(PullTarget::default());
        let paused = TenantPause::paused(None, None, ts(5));
        assert_eq!(route_of_key(&notice), Some(Route::Notice));
        assert_eq!(route(&notice, &log, None), Route::Notice);
        assert_eq!(route(&notice, &pull, Some(&paused)), Route::Notice);
        assert!(Route::Notice.delivers());
        // A client id that looks like one is the client's.
        assert_eq!(route_of_key(&key("notice/7")), None);
    }

    #[test]
    fn pausing_and_resuming_are_idempotent() {
        let first = TenantPause::paused(None, Some("incident".to_string()), ts(5));
        assert_eq!(
            first,
            TenantPause {
                paused: true,
                reason: Some("incident".to_string()),
                since: ts(5)
            }
        );
        // Paused again later: since (and the reason, unless a new one is
        // given) stay.
        assert_eq!(TenantPause::paused(Some(&first), None, ts(7)), first);
        assert_eq!(
            TenantPause::paused(Some(&first), Some("gone".to_string()), ts(7)).reason,
            Some("gone".to_string())
        );
        assert_eq!(first.resumed_since(), None);
        let resumed = TenantPause::resumed(Some(&first), ts(9)).unwrap();
        assert!(!resumed.paused);
        assert_eq!(resumed.resumed_since(), Some(ts(9)));
        // Nothing to resume.
        assert_eq!(TenantPause::resumed(Some(&resumed), ts(11)), None);
        assert_eq!(TenantPause::resumed(None, ts(11)), None);
        // Paused again after a resume: a new pause from now.
        assert_eq!(
            TenantPause::paused(Some(&resumed), None, ts(12)).since,
            ts(12)
        );
    }
}
