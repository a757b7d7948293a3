use std::time::Duration;

use super::*;

const SEC: i64 = 1_000;

fn ts(text: &str) -> Timestamp {
    Timestamp::parse_rfc3339(text).unwrap()
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn schedule(expression: &str, kind: &str, cursor: Timestamp) -> Schedule {
    Schedule {
        id: ScheduleId::new("job").unwrap(),
        expression: expression.to_string(),
        kind: kind.to_string(),
        time_zone: "UTC".to_string(),
        payload: Some("p".to_string()),
        delivery: DeliveryOption::FullEvent,
        start_at: None,
        end_at: None,
        max_occurrences: None,
        misfire: MisfirePolicy::FireOnce,
        catch_up_window: DEFAULT_CATCH_UP_WINDOW,
        status: ScheduleStatus::Active,
        created_at: cursor,
        updated_at: cursor,
        progress: Progress::starting_after(cursor),
        settings: Default::default(),
    }
}

fn every_2s(cursor: Timestamp) -> Schedule {
    schedule("@every 2s", "EVERY", cursor)
}

fn run(s: &Schedule, now: Timestamp) -> Plan {
    plan(s, &s.validate().unwrap(), now, PlanLimits::default())
}

fn fates(plan: &Plan) -> Vec<(i64, Fate)> {
    plan.occurrences
        .iter()
        .map(|o| (o.at.as_millis(), o.fate))
        .collect()
}

#[test]
fn ids_reject_at_and_control_ids_are_internal() {
    assert_eq!(ScheduleId::new("a@b"), Err(ScheduleError::IdContainsAt));
    assert!(matches!(ScheduleId::new(""), Err(ScheduleError::Id(_))));
    assert_eq!(
        ScheduleId::new("x".repeat(401)),
        Err(ScheduleError::IdTooLong)
    );
    let id = ScheduleId::new("x".repeat(400)).unwrap();
    let control = control_event_id(&id);
    assert!(control.is_internal());
    assert_eq!(schedule_of_control(&control), Some(id.as_str()));
    assert_eq!(
        schedule_of_control(&EventId::new("schedule/x").unwrap()),
        None
    );
}

#[test]
fn definition_round_trips_as_json() {
    let mut s = every_2s(at(0));
    s.misfire = MisfirePolicy::FireAll { cap: 3 };
    s.end_at = Some(at(5 * SEC));
    let back = Schedule::from_json(&s.to_json()).unwrap();
    assert_eq!(back, s);
    assert!(
        s.to_json()
            .contains(r#""misfire":{"policy":"fire_all","cap":3}"#)
    );
    assert!(matches!(
        Schedule::from_json("{}"),
        Err(ScheduleError::Corrupt(_))
    ));
}

#[test]
fn validation_names_the_problem() {
    let mut s = schedule("61 * * * *", "UNIX", at(0));
    assert!(matches!(s.validate(), Err(ScheduleError::Cron(_))));
    s = schedule("* * * * *", "UNIX", at(0));
    s.time_zone = "Mars/Olympus".into();
    assert!(matches!(
        s.validate(),
        Err(ScheduleError::Cron(CronError::UnknownTimeZone(_)))
    ));
    s = every_2s(at(0));
    s.start_at = Some(at(10));
    s.end_at = Some(at(10));
    assert_eq!(s.validate().unwrap_err(), ScheduleError::EndBeforeStart);
    s = every_2s(at(0));
    s.max_occurrences = Some(0);
    assert_eq!(s.validate().unwrap_err(), ScheduleError::ZeroMaxOccurrences);
    s = every_2s(at(0));
    s.misfire = MisfirePolicy::FireAll { cap: 0 };
    assert_eq!(s.validate().unwrap_err(), ScheduleError::FireAllCap);
    s = every_2s(at(0));
    s.payload = None;
    s.delivery = DeliveryOption::PayloadOnly;
    assert_eq!(s.validate().unwrap_err(), ScheduleError::PayloadRequired);
}

#[test]
fn normal_firing_creates_what_is_due_within_the_lead_and_comes_back_before_the_next() {
    // Created at 100 s; the control event first fires at 102 s − 5 s.
    let s = every_2s(at(100 * SEC));
    let first = run(&s, at(97 * SEC));
    assert_eq!(fates(&first), vec![(102 * SEC, Fate::Deliver)]);
    assert_eq!(first.next, NextStep::At(at(99 * SEC)));
    assert_eq!(first.schedule.progress.cursor, at(102 * SEC));
    assert_eq!(first.schedule.progress.occurrences, 1);

    let second = run(&first.schedule, at(99 * SEC));
    assert_eq!(fates(&second), vec![(104 * SEC, Fate::Deliver)]);
    assert_eq!(second.next, NextStep::At(at(101 * SEC)));

    // Fired a bit late (under the misfire threshold): everything up to
    // now + lead is created, nothing is missed.
    let late = run(&second.schedule, at(110 * SEC));
    assert_eq!(
        fates(&late),
        (106..=114)
            .step_by(2)
            .map(|s| (s * SEC, Fate::Deliver))
            .collect::<Vec<_>>()
    );
    assert_eq!(late.next, NextStep::At(at(111 * SEC)));
}

#[test]
fn the_first_occurrence_is_strictly_after_the_cursor() {
    let s = every_2s(at(100 * SEC));
    let p = run(&s, at(100 * SEC));
    assert_eq!(fates(&p)[0].0, 102 * SEC);
}

/// A node down from 100 s to 300 s: 99 occurrences (102..=298) missed.
fn after_downtime(misfire: MisfirePolicy) -> Plan {
    let mut s = every_2s(at(100 * SEC));
    s.misfire = misfire;
    run(&s, at(300 * SEC))
}

fn counts(plan: &Plan) -> (Vec<i64>, usize) {
    let delivered = plan
        .occurrences
        .iter()
        .filter(|o| o.fate == Fate::Deliver)
        .map(|o| o.at.as_millis() / SEC)
        .collect();
    let missed = plan
        .occurrences
        .iter()
        .filter(|o| o.fate == Fate::Missed)
        .count();
    (delivered, missed)
}

#[test]
fn fire_once_delivers_the_latest_missed_once_and_records_the_rest() {
    let p = after_downtime(MisfirePolicy::FireOnce);
    let (delivered, missed) = counts(&p);
    // Occurrences up to now − 60 s are missed; 240..=304 are merely late
    // or still ahead; the latest missed one (238) is delivered.
    let mut expected = vec![238];
    expected.extend((240..=304).step_by(2));
    assert_eq!(delivered, expected);
    assert_eq!(missed, (102..238).step_by(2).count());
    assert_eq!(p.schedule.progress.missed.recorded, missed as u64);
    assert_eq!(
        p.schedule.progress.occurrences,
        (102..=304).step_by(2).count() as u64
    );
}

#[test]
fn fire_all_delivers_the_latest_cap_missed() {
    let p = after_downtime(MisfirePolicy::FireAll { cap: 3 });
    let (delivered, missed) = counts(&p);
    assert_eq!(&delivered[..4], &[234, 236, 238, 240]);
    assert_eq!(missed, (102..234).step_by(2).count());
}

#[test]
fn skip_records_every_missed_one() {
    let p = after_downtime(MisfirePolicy::Skip);
    let (delivered, missed) = counts(&p);
    assert_eq!(delivered[0], 240);
    assert_eq!(missed, (102..240).step_by(2).count());
}

#[test]
fn the_catch_up_window_limits_what_the_policy_may_deliver() {
    let mut s = every_2s(at(100 * SEC));
    s.misfire = MisfirePolicy::FireAll { cap: 1_000 };
    s.catch_up_window = Duration::from_secs(70);
    let p = run(&s, at(300 * SEC));
    let (delivered, missed) = counts(&p);
    // Missed ones from 230 s on are inside the window.
    assert_eq!(delivered[0], 230);
    assert_eq!(missed, (102..230).step_by(2).count());

    // Nothing inside the window: fire_once delivers nothing late.
    let mut s = schedule("0 0 * * *", "UNIX", ts("2030-01-01T00:00:00Z"));
    s.catch_up_window = Duration::from_secs(3_600);
    let p = run(&s, ts("2030-01-03T12:00:00Z"));
    assert_eq!(
        fates(&p),
        vec![
            (ts("2030-01-02T00:00:00Z").as_millis(), Fate::Missed),
            (ts("2030-01-03T00:00:00Z").as_millis(), Fate::Missed),
        ]
    );
    assert_eq!(
        p.next,
        NextStep::At(ts("2030-01-04T00:00:00Z").minus(Duration::from_secs(5)))
    );
}

#[test]
fn missed_beyond_the_recording_cap_go_into_the_summary() {
    let s = every_2s(at(0));
    let limits = PlanLimits {
        max_missed_recorded: 10,
        ..PlanLimits::default()
    };
    let p = plan(&s, &s.validate().unwrap(), at(1_000 * SEC), limits);
    let (delivered, missed) = counts(&p);
    assert_eq!(missed, 10);
    let summary = p.schedule.progress.missed;
    assert_eq!(summary.recorded, 10);
    // 2..=938 are missed (469), 938 delivered by fire_once: 468 missed.
    assert_eq!(summary.summarized, 468 - 10);
    assert_eq!(summary.first_summarized, Some(at(22 * SEC)));
    assert_eq!(summary.last_summarized, Some(at(936 * SEC)));
    assert_eq!(delivered[0], 938);
    // This firing's own share of the summary, for its notice.
    assert_eq!(
        p.summarized,
        Some(MissedRange {
            count: 468 - 10,
            first: at(22 * SEC),
            last: at(936 * SEC),
        })
    );
    // A second firing counts only its own.
    let again = plan(&p.schedule, &s.validate().unwrap(), at(1_010 * SEC), limits);
    assert_eq!(again.summarized, None, "nothing missed since");
}

#[test]
fn a_firing_cut_short_continues_at_once_and_keeps_the_latest_for_the_policy() {
    let mut s = every_2s(at(0));
    s.misfire = MisfirePolicy::FireAll { cap: 2 };
    let limits = PlanLimits {
        max_per_firing: 100,
        max_missed_recorded: 1_000,
        ..PlanLimits::default()
    };
    let now = at(1_000 * SEC);
    let spec = s.validate().unwrap();
    let mut current = s;
    let mut all = Vec::new();
    for _ in 0..20 {
        let p = plan(&current, &spec, now, limits);
        all.extend(p.occurrences.iter().copied());
        current = p.schedule;
        if p.next != NextStep::At(now) {
            assert_eq!(p.next, NextStep::At(at(1_001 * SEC)));
            break;
        }
    }
    let instants: Vec<i64> = all.iter().map(|o| o.at.as_millis() / SEC).collect();
    assert_eq!(instants, (2..=1_004).step_by(2).collect::<Vec<_>>());
    let delivered: Vec<i64> = all
        .iter()
        .filter(|o| o.fate == Fate::Deliver)
        .map(|o| o.at.as_millis() / SEC)
        .take(3)
        .collect();
    assert_eq!(delivered, vec![936, 938, 940]);
    assert_eq!(current.progress.occurrences, 502);
}

#[test]
fn end_and_maximum_complete_the_schedule() {
    let mut s = every_2s(at(100 * SEC));
    s.end_at = Some(at(106 * SEC));
    let p = run(&s, at(110 * SEC));
    assert_eq!(
        fates(&p),
        vec![
            (102 * SEC, Fate::Deliver),
            (104 * SEC, Fate::Deliver),
            (106 * SEC, Fate::Deliver)
        ]
    );
    assert_eq!(p.next, NextStep::Complete);
    assert_eq!(p.schedule.status, ScheduleStatus::Completed);

    let mut s = every_2s(at(100 * SEC));
    s.max_occurrences = Some(3);
    let first = run(&s, at(99 * SEC));
    assert_eq!(fates(&first).len(), 2);
    assert!(matches!(first.next, NextStep::At(_)));
    let second = run(&first.schedule, at(103 * SEC));
    assert_eq!(fates(&second), vec![(106 * SEC, Fate::Deliver)]);
    assert_eq!(second.next, NextStep::Complete);
    assert_eq!(second.schedule.next_occurrence(&s.spec().unwrap()), None);
}

#[test]
fn start_at_bounds_and_anchors() {
    let mut s = every_2s(at(0));
    s.start_at = Some(at(10_500));
    let spec = s.validate().unwrap();
    assert_eq!(s.next_occurrence(&spec), Some(at(10_500)));
    assert_eq!(
        s.upcoming(&spec, 3),
        vec![at(10_500), at(12_500), at(14_500)]
    );
    let p = run(&s, at(0));
    assert!(p.occurrences.is_empty());
    assert_eq!(p.next, NextStep::At(at(5_500)));
}

#[test]
fn dst_days_come_from_the_cron_spec() {
    // 02:30 daily in Berlin: on 2027-03-28 the clock jumps 02:00 → 03:00;
    // the run happens once, at 03:00 CEST (01:00Z).
    let mut s = schedule("30 2 * * *", "UNIX", ts("2027-03-27T12:00:00Z"));
    s.time_zone = "Europe/Berlin".into();
    let p = run(&s, ts("2027-03-29T12:00:00Z"));
    assert_eq!(
        p.occurrences.iter().map(|o| o.at).collect::<Vec<_>>(),
        vec![ts("2027-03-28T01:00:00Z"), ts("2027-03-29T00:30:00Z")]
    );
    // 01:30 in New York on the fall-back day 2027-11-07: once, at EDT.
    let mut s = schedule("30 1 * * *", "UNIX", ts("2027-11-06T12:00:00Z"));
    s.time_zone = "America/New_York".into();
    let p = run(&s, ts("2027-11-07T12:00:00Z"));
    assert_eq!(
        p.occurrences.iter().map(|o| o.at).collect::<Vec<_>>(),
        vec![ts("2027-11-07T05:30:00Z")]
    );
}
