//! Unit tests: each kind, the DST rules on real transition days, the places
//! where Belfry deliberately differs from croner, descriptions, ids.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use super::*;
use crate::ids::{EventId, TenantName};
use crate::time::Timestamp;

fn ts(text: &str) -> Timestamp {
    Timestamp::parse_rfc3339(text).unwrap()
}

fn spec(expression: &str, kind: CronKind, zone: &str) -> CronSpec {
    CronSpec::parse(expression, kind, Some(zone)).unwrap()
}

/// The next `n` occurrences after `from`, as RFC 3339 UTC strings.
fn next_n(expression: &str, kind: CronKind, zone: &str, from: &str, n: usize) -> Vec<String> {
    spec(expression, kind, zone)
        .occurrences_after(ts(from))
        .take(n)
        .map(|t| t.to_rfc3339())
        .collect()
}

/// `n` instants `step_secs` apart, starting at `first`.
fn every(first: &str, step_secs: i64, n: usize) -> Vec<String> {
    (0..n as i64)
        .map(|k| Timestamp::from_millis(ts(first).as_millis() + k * step_secs * 1_000).to_rfc3339())
        .collect()
}

/// What croner 4 itself answers (its own DST handling, jiff `Zoned`).
fn croner_next(expression: &str, zone: &str, from: &str, n: usize) -> Vec<String> {
    let cron = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Disallowed)
        .build()
        .parse(expression)
        .unwrap();
    let zone = jiff::tz::TimeZone::get(zone).unwrap();
    let start = jiff::Timestamp::from_millisecond(ts(from).as_millis())
        .unwrap()
        .to_zoned(zone);
    cron.iter_after(start)
        .take(n)
        .map(|z| z.timestamp().to_string())
        .collect()
}

// ---------------------------------------------------------------- kinds

#[test]
fn unix_five_fields_in_utc_by_default() {
    let spec = CronSpec::parse("*/10 * * * *", CronKind::Unix, None).unwrap();
    assert_eq!(spec.time_zone_name(), "UTC");
    let got: Vec<_> = spec
        .occurrences_after(ts("2027-01-01T00:05:00Z"))
        .take(3)
        .map(|t| t.to_rfc3339())
        .collect();
    assert_eq!(
        got,
        [
            "2027-01-01T00:10:00Z",
            "2027-01-01T00:20:00Z",
            "2027-01-01T00:30:00Z"
        ]
    );
}

#[test]
fn next_after_is_strictly_after() {
    let spec = spec("0 12 * * *", CronKind::Unix, "UTC");
    assert_eq!(
        spec.next_after(ts("2027-01-01T12:00:00Z")),
        Some(ts("2027-01-02T12:00:00Z"))
    );
    assert_eq!(
        spec.next_after(ts("2027-01-01T11:59:59.999Z")),
        Some(ts("2027-01-01T12:00:00Z"))
    );
}

#[test]
fn unix_sunday_is_zero_or_seven_and_day_fields_are_ored() {
    // 2027-01-03 is a Sunday.
    assert_eq!(
        next_n(
            "0 9 * * 0",
            CronKind::Unix,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-01-03T09:00:00Z"]
    );
    assert_eq!(
        next_n(
            "0 9 * * 7",
            CronKind::Unix,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-01-03T09:00:00Z"]
    );
    // Day 15 OR Sunday (Vixie cron).
    assert_eq!(
        next_n(
            "0 9 15 * SUN",
            CronKind::Unix,
            "UTC",
            "2027-01-01T00:00:00Z",
            3
        ),
        [
            "2027-01-03T09:00:00Z",
            "2027-01-10T09:00:00Z",
            "2027-01-15T09:00:00Z"
        ]
    );
}

#[test]
fn quartz_seconds_question_mark_l_w_hash_and_year() {
    assert_eq!(
        next_n(
            "*/5 * * * * ? *",
            CronKind::Quartz,
            "UTC",
            "2027-01-01T00:00:00Z",
            3
        ),
        [
            "2027-01-01T00:00:05Z",
            "2027-01-01T00:00:10Z",
            "2027-01-01T00:00:15Z"
        ]
    );
    // Quartz Sunday is 1: 2027-01-03 is a Sunday.
    assert_eq!(
        next_n(
            "0 0 9 ? * 1",
            CronKind::Quartz,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-01-03T09:00:00Z"]
    );
    // Last day of the month.
    assert_eq!(
        next_n(
            "0 0 12 L * ?",
            CronKind::Quartz,
            "UTC",
            "2027-02-01T00:00:00Z",
            2
        ),
        ["2027-02-28T12:00:00Z", "2027-03-31T12:00:00Z"]
    );
    // Nearest weekday to the 1st: 2027-05-01 is a Saturday → Monday 3rd
    // (W does not cross into the previous month).
    assert_eq!(
        next_n(
            "0 0 12 1W * ?",
            CronKind::Quartz,
            "UTC",
            "2027-04-02T00:00:00Z",
            1
        ),
        ["2027-05-03T12:00:00Z"]
    );
    // Third Friday (Quartz Friday = 6): 2027-01-15.
    assert_eq!(
        next_n(
            "0 0 12 ? * 6#3",
            CronKind::Quartz,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-01-15T12:00:00Z"]
    );
    // Year field: only 2028.
    assert_eq!(
        next_n(
            "0 0 0 1 1 ? 2028",
            CronKind::Quartz,
            "UTC",
            "2027-06-01T00:00:00Z",
            2
        ),
        ["2028-01-01T00:00:00Z"]
    );
    // Sloppy Quartz step `0/15`.
    assert_eq!(
        next_n(
            "0 0/15 * * * ?",
            CronKind::Quartz,
            "UTC",
            "2027-01-01T00:00:00Z",
            2
        ),
        ["2027-01-01T00:15:00Z", "2027-01-01T00:30:00Z"]
    );
}

#[test]
fn quartz_rejects_both_day_fields() {
    let error = CronSpec::parse("0 0 12 1 * MON", CronKind::Quartz, None).unwrap_err();
    assert!(error.to_string().contains("'?'"), "{error}");
}

#[test]
fn spring_six_fields_sunday_zero_and_day_fields_anded() {
    assert_eq!(
        next_n(
            "30 0 9 * * 0",
            CronKind::Spring,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-01-03T09:00:30Z"]
    );
    // Friday the 13th only (AND): 2027-08-13 is the first in 2027.
    assert_eq!(
        next_n(
            "0 0 0 13 * FRI",
            CronKind::Spring,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-08-13T00:00:00Z"]
    );
}

#[test]
fn cron4j_maps_onto_unix_and_rejects_its_extensions() {
    assert_eq!(
        next_n(
            "0 0 13 * 5",
            CronKind::Cron4j,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-08-13T00:00:00Z"]
    );
    assert_eq!(
        next_n(
            "0 12 L * *",
            CronKind::Cron4j,
            "UTC",
            "2027-02-01T00:00:00Z",
            1
        ),
        ["2027-02-28T12:00:00Z"]
    );
    for bad in [
        "0 5 * * *|8 10 * * *",
        "0 12 ? * 1",
        "0 12 1W * *",
        "0 12 * * 5#2",
    ] {
        let error = CronSpec::parse(bad, CronKind::Cron4j, None).unwrap_err();
        assert!(
            matches!(error, CronError::Unsupported { .. }),
            "{bad}: {error}"
        );
    }
    // Day names with a W are fine.
    assert!(CronSpec::parse("0 12 * * WED", CronKind::Cron4j, None).is_ok());
}

#[test]
fn macros_in_any_kind() {
    let from = "2027-01-01T10:30:00Z";
    for kind in [
        CronKind::Unix,
        CronKind::Quartz,
        CronKind::Spring,
        CronKind::Cron4j,
    ] {
        assert_eq!(
            next_n("@hourly", kind, "UTC", from, 1),
            ["2027-01-01T11:00:00Z"]
        );
        assert_eq!(
            next_n("@daily", kind, "UTC", from, 1),
            ["2027-01-02T00:00:00Z"]
        );
        assert_eq!(
            next_n("@midnight", kind, "UTC", from, 1),
            ["2027-01-02T00:00:00Z"]
        );
        // 2027-01-03 is a Sunday.
        assert_eq!(
            next_n("@weekly", kind, "UTC", from, 1),
            ["2027-01-03T00:00:00Z"]
        );
        assert_eq!(
            next_n("@monthly", kind, "UTC", from, 1),
            ["2027-02-01T00:00:00Z"]
        );
        assert_eq!(
            next_n("@yearly", kind, "UTC", from, 1),
            ["2028-01-01T00:00:00Z"]
        );
        assert_eq!(
            next_n("@annually", kind, "UTC", from, 1),
            ["2028-01-01T00:00:00Z"]
        );
    }
    // Macros follow the zone: midnight in Berlin is 23:00 UTC in winter.
    assert_eq!(
        next_n("@daily", CronKind::Unix, "Europe/Berlin", from, 1),
        ["2027-01-01T23:00:00Z"]
    );
}

#[test]
fn every_intervals_are_anchored_in_real_time() {
    assert_eq!(
        next_n(
            "@every 30s",
            CronKind::Every,
            "UTC",
            "2027-01-01T00:00:10Z",
            3
        ),
        [
            "2027-01-01T00:00:30Z",
            "2027-01-01T00:01:00Z",
            "2027-01-01T00:01:30Z"
        ]
    );
    assert_eq!(
        next_n(
            "@every 5m",
            CronKind::Unix,
            "UTC",
            "2027-01-01T00:00:00Z",
            1
        ),
        ["2027-01-01T00:05:00Z"]
    );
    // 1h30m from the epoch: 2027-01-01T00:00Z is 1,798,761,600 s after it,
    // a multiple of 5,400 s? 1,798,761,600 / 5,400 = 333,104 exactly.
    assert_eq!(
        next_n(
            "@every 1h30m",
            CronKind::Every,
            "UTC",
            "2027-01-01T00:00:00Z",
            2
        ),
        ["2027-01-01T01:30:00Z", "2027-01-01T03:00:00Z"]
    );
    // A bare duration under EVERY, and a custom anchor.
    let spec = CronSpec::parse("45s", CronKind::Every, None)
        .unwrap()
        .with_anchor(ts("2027-01-01T00:00:07Z"));
    assert_eq!(
        spec.next_after(ts("2027-01-01T00:00:07Z")),
        Some(ts("2027-01-01T00:00:52Z"))
    );
    assert_eq!(
        spec.next_after(ts("2026-12-31T23:59:59Z")),
        Some(ts("2027-01-01T00:00:07Z"))
    );
}

#[test]
fn every_ignores_dst() {
    // Berlin's spring-forward at 01:00 UTC: the rhythm is plain UTC.
    assert_eq!(
        next_n(
            "@every 20m",
            CronKind::Every,
            "Europe/Berlin",
            "2027-03-28T00:30:00Z",
            4
        ),
        every("2027-03-28T00:40:00Z", 1_200, 4)
    );
}

#[test]
fn errors_are_clear() {
    let cases: [(&str, CronKind, Option<&str>, &str); 12] = [
        ("", CronKind::Unix, None, "empty"),
        ("* * * *", CronKind::Unix, None, "5 fields"),
        ("0 * * * * *", CronKind::Unix, None, "use type QUARTZ"),
        ("* * * * *", CronKind::Quartz, None, "use type UNIX"),
        (
            "61 * * * *",
            CronKind::Unix,
            None,
            "invalid UNIX expression",
        ),
        ("@fortnightly", CronKind::Unix, None, "unknown macro"),
        ("@every 10x", CronKind::Every, None, "invalid interval"),
        ("@every", CronKind::Every, None, "invalid interval"),
        ("@every 500ms", CronKind::Every, None, "out of range"),
        ("0 0 30 2 *", CronKind::Unix, None, "never matches"),
        (
            "* * * * *",
            CronKind::Unix,
            Some("Mars/Olympus"),
            "unknown time zone",
        ),
        ("0 12 * * *", CronKind::Every, None, "invalid interval"),
    ];
    for (expression, kind, zone, needle) in cases {
        let error = CronSpec::parse(expression, kind, zone).unwrap_err();
        assert!(
            error.to_string().contains(needle),
            "{expression:?}: {error} (wanted {needle:?})"
        );
    }
    let error = "LINUX".parse::<CronKind>().unwrap_err();
    assert!(error.to_string().contains("UNIX, QUARTZ"), "{error}");
    assert_eq!("quartz".parse::<CronKind>(), Ok(CronKind::Quartz));
    // Long input is clipped in messages.
    let long = format!("{} * * * *", "70,".repeat(60) + "70");
    let message = CronSpec::parse(&long, CronKind::Unix, None)
        .unwrap_err()
        .to_string();
    assert!(message.len() < 200, "{message}");
}

#[test]
fn zone_names_are_iana_and_case_insensitive_lookups_are_canonicalized() {
    let spec = CronSpec::parse("0 0 * * *", CronKind::Unix, Some("europe/berlin")).unwrap();
    assert_eq!(spec.time_zone_name(), "Europe/Berlin");
}

// ---------------------------------------------------------------- DST
//
// Europe/Berlin: 2027-03-28 02:00 CET → 03:00 CEST at 01:00Z;
//                2027-10-31 03:00 CEST → 02:00 CET at 01:00Z.
// America/New_York: 2027-03-14 02:00 EST → 03:00 EDT at 07:00Z;
//                   2027-11-07 02:00 EDT → 01:00 EST at 06:00Z.

#[test]
fn berlin_daily_fixed_time_fires_once_each_day() {
    // Spring forward: 02:30 does not exist → 03:00 CEST (01:00Z).
    assert_eq!(
        next_n(
            "30 2 * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-03-27T00:00:00Z",
            3
        ),
        [
            "2027-03-27T01:30:00Z",
            "2027-03-28T01:00:00Z",
            "2027-03-29T00:30:00Z"
        ]
    );
    // Fall back: 02:30 happens twice → the first (CEST, 00:30Z) only.
    assert_eq!(
        next_n(
            "30 2 * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-10-30T00:00:00Z",
            3
        ),
        [
            "2027-10-30T00:30:00Z",
            "2027-10-31T00:30:00Z",
            "2027-11-01T01:30:00Z"
        ]
    );
    // Starting inside the second pass of the fold does not fire again.
    assert_eq!(
        next_n(
            "30 2 * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-10-31T01:10:00Z",
            1
        ),
        ["2027-11-01T01:30:00Z"]
    );
}

#[test]
fn new_york_daily_fixed_time_fires_once_each_day() {
    assert_eq!(
        next_n(
            "30 2 * * *",
            CronKind::Unix,
            "America/New_York",
            "2027-03-13T00:00:00Z",
            3
        ),
        [
            "2027-03-13T07:30:00Z",
            "2027-03-14T07:00:00Z",
            "2027-03-15T06:30:00Z"
        ]
    );
    assert_eq!(
        next_n(
            "30 1 * * *",
            CronKind::Unix,
            "America/New_York",
            "2027-11-06T00:00:00Z",
            3
        ),
        [
            "2027-11-06T05:30:00Z",
            "2027-11-07T05:30:00Z",
            "2027-11-08T06:30:00Z"
        ]
    );
}

#[test]
fn hourly_fires_every_real_hour() {
    // Berlin spring: 01:00 CET, then 03:00 CEST one real hour later.
    assert_eq!(
        next_n(
            "0 * * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-03-27T23:30:00Z",
            4
        ),
        every("2027-03-28T00:00:00Z", 3_600, 4)
    );
    // Berlin fall: 02:00 CEST and 02:00 CET both fire.
    assert_eq!(
        next_n(
            "0 * * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-10-30T23:30:00Z",
            4
        ),
        every("2027-10-31T00:00:00Z", 3_600, 4)
    );
    assert_eq!(
        next_n(
            "0 * * * *",
            CronKind::Unix,
            "America/New_York",
            "2027-03-14T05:30:00Z",
            4
        ),
        every("2027-03-14T06:00:00Z", 3_600, 4)
    );
    // New York fall: 01:00 EDT (05:00Z) and 01:00 EST (06:00Z).
    assert_eq!(
        next_n(
            "0 * * * *",
            CronKind::Unix,
            "America/New_York",
            "2027-11-07T04:30:00Z",
            4
        ),
        every("2027-11-07T05:00:00Z", 3_600, 4)
    );
    // @hourly is the same rule.
    assert_eq!(
        next_n(
            "@hourly",
            CronKind::Unix,
            "America/New_York",
            "2027-11-07T04:30:00Z",
            4
        ),
        every("2027-11-07T05:00:00Z", 3_600, 4)
    );
}

#[test]
fn every_fifteen_minutes_keeps_real_time_rhythm() {
    for (zone, transition) in [
        ("Europe/Berlin", "2027-03-28T01:00:00Z"),
        ("Europe/Berlin", "2027-10-31T01:00:00Z"),
        ("America/New_York", "2027-03-14T07:00:00Z"),
        ("America/New_York", "2027-11-07T06:00:00Z"),
    ] {
        let from = Timestamp::from_millis(ts(transition).as_millis() - 2 * 3_600_000);
        let got = next_n("*/15 * * * *", CronKind::Unix, zone, &from.to_rfc3339(), 16);
        let first = Timestamp::from_millis(from.as_millis() + 900_000).to_rfc3339();
        assert_eq!(got, every(&first, 900, 16), "{zone} around {transition}");
    }
}

#[test]
fn every_n_seconds_keeps_real_time_rhythm() {
    for (zone, transition) in [
        ("Europe/Berlin", "2027-03-28T01:00:00Z"),
        ("Europe/Berlin", "2027-10-31T01:00:00Z"),
        ("America/New_York", "2027-03-14T07:00:00Z"),
        ("America/New_York", "2027-11-07T06:00:00Z"),
    ] {
        let from = Timestamp::from_millis(ts(transition).as_millis() - 60_000);
        let got = next_n(
            "*/20 * * * * ?",
            CronKind::Quartz,
            zone,
            &from.to_rfc3339(),
            9,
        );
        let first = Timestamp::from_millis(from.as_millis() + 20_000).to_rfc3339();
        assert_eq!(got, every(&first, 20, 9), "{zone} around {transition}");
        // And a whole hour later the rhythm is unbroken.
        let spec = spec("*/20 * * * * ?", CronKind::Quartz, zone);
        let count = spec
            .occurrences_after(from)
            .take_while(|t| t.as_millis() <= from.as_millis() + 2 * 3_600_000)
            .count();
        assert_eq!(count, 2 * 180, "{zone} around {transition}");
    }
}

#[test]
fn restricted_hours_repeating_within_the_hour() {
    // Spring: the gap's 02:00..02:45 collapse into 03:00 CEST; no pause.
    assert_eq!(
        next_n(
            "*/15 0-5 * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-03-28T00:00:00Z",
            6
        ),
        every("2027-03-28T00:15:00Z", 900, 6)
    );
    // Fall: hour 02 happens twice and both run: no hour-long pause.
    assert_eq!(
        next_n(
            "*/15 0-5 * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-10-30T23:30:00Z",
            12
        ),
        every("2027-10-30T23:45:00Z", 900, 12)
    );
}

#[test]
fn overrides_of_croner() {
    // A twice-daily fixed-time job: croner (which calls only single-valued
    // hour/minute/second fixed-time) loses the 02:30 run on spring-forward
    // day; Belfry runs it at 03:00 CEST.
    let ours = next_n(
        "30 2,14 * * *",
        CronKind::Unix,
        "Europe/Berlin",
        "2027-03-27T12:00:00Z",
        3,
    );
    assert_eq!(
        ours,
        [
            "2027-03-27T13:30:00Z",
            "2027-03-28T01:00:00Z",
            "2027-03-28T12:30:00Z"
        ]
    );
    let croner = croner_next("30 2,14 * * *", "Europe/Berlin", "2027-03-27T12:00:00Z", 3);
    assert_eq!(
        croner,
        [
            "2027-03-27T13:30:00Z",
            "2027-03-28T12:30:00Z",
            "2027-03-29T00:30:00Z"
        ]
    );
    // Every 15 minutes during hour 2 only: croner skips the whole day on
    // spring-forward; Belfry runs once at the first instant after the gap.
    let ours = next_n(
        "*/15 2 * * *",
        CronKind::Unix,
        "America/New_York",
        "2027-03-14T00:00:00Z",
        1,
    );
    assert_eq!(ours, ["2027-03-14T07:00:00Z"]);
    let croner = croner_next(
        "*/15 2 * * *",
        "America/New_York",
        "2027-03-14T00:00:00Z",
        1,
    );
    assert_eq!(croner, ["2027-03-15T06:00:00Z"]);
}

#[test]
fn zones_without_dst_and_odd_offsets() {
    assert_eq!(
        next_n(
            "0 9 * * *",
            CronKind::Unix,
            "Asia/Kolkata",
            "2027-03-28T00:00:00Z",
            2
        ),
        ["2027-03-28T03:30:00Z", "2027-03-29T03:30:00Z"]
    );
    assert_eq!(
        next_n(
            "0 9 * * *",
            CronKind::Unix,
            "Asia/Kathmandu",
            "2027-03-28T00:00:00Z",
            1
        ),
        ["2027-03-28T03:15:00Z"]
    );
}

#[test]
fn rare_and_far_matches_are_found() {
    // Feb 29: next leap day after 2027 is 2028-02-29.
    assert_eq!(
        next_n(
            "0 12 29 2 *",
            CronKind::Unix,
            "Europe/Berlin",
            "2027-03-01T00:00:00Z",
            2
        ),
        ["2028-02-29T11:00:00Z", "2032-02-29T11:00:00Z"]
    );
    // A Quartz year in the past has no next occurrence.
    let past = spec("0 0 0 1 1 ? 2020", CronKind::Quartz, "UTC");
    assert_eq!(past.next_after(ts("2027-01-01T00:00:00Z")), None);
}

// ---------------------------------------------------------- description

#[test]
fn descriptions() {
    let cases = [
        (
            "*/5 * * * * ? *",
            CronKind::Quartz,
            "UTC",
            "every 5 seconds",
        ),
        ("* * * * * ?", CronKind::Quartz, "UTC", "every second"),
        ("* * * * *", CronKind::Unix, "UTC", "every minute"),
        ("*/15 * * * *", CronKind::Unix, "UTC", "every 15 minutes"),
        (
            "0 * * * *",
            CronKind::Unix,
            "UTC",
            "at minute 0 of every hour",
        ),
        (
            "@hourly",
            CronKind::Unix,
            "UTC",
            "at minute 0 of every hour",
        ),
        ("30 2 * * *", CronKind::Unix, "UTC", "at 02:30 every day"),
        (
            "30 2 * * *",
            CronKind::Unix,
            "Europe/Berlin",
            "at 02:30 every day (Europe/Berlin)",
        ),
        ("0 0 * * *", CronKind::Unix, "UTC", "at 00:00 every day"),
        (
            "0 9 * * 1-5",
            CronKind::Unix,
            "UTC",
            "at 09:00 on Monday through Friday",
        ),
        (
            "0 0 9 ? * 2-6",
            CronKind::Quartz,
            "UTC",
            "at 09:00 on Monday through Friday",
        ),
        ("0 0 * * 0", CronKind::Unix, "UTC", "at 00:00 on Sunday"),
        ("0 0 1 1 *", CronKind::Unix, "UTC", "at 00:00 on January 1"),
        (
            "0 0 1 * *",
            CronKind::Unix,
            "UTC",
            "at 00:00 on day 1 of the month",
        ),
        (
            "15 10 * * 1,3,5",
            CronKind::Unix,
            "UTC",
            "at 10:15 on Monday, Wednesday and Friday",
        ),
        (
            "0 9,17 * * *",
            CronKind::Unix,
            "UTC",
            "at 09:00 and 17:00 every day",
        ),
        (
            "5 4 3 2 1 ? 2030",
            CronKind::Quartz,
            "UTC",
            "at 03:04:05 on January 2 in year 2030",
        ),
        ("@every 30s", CronKind::Every, "UTC", "every 30 seconds"),
        (
            "@every 1h30m",
            CronKind::Every,
            "UTC",
            "every 1 hour 30 minutes",
        ),
        ("@every 1h", CronKind::Every, "UTC", "every hour"),
        (
            "*/7 1-5 * * *",
            CronKind::Unix,
            "UTC",
            "at second 0, minute */7, hour 1-5 every day",
        ),
    ];
    for (expression, kind, zone, want) in cases {
        assert_eq!(
            spec(expression, kind, zone).describe(),
            want,
            "{expression}"
        );
    }
}

// ---------------------------------------------------------- occurrence id

#[test]
fn occurrence_ids_are_deterministic() {
    let id = OccurrenceId::new(
        TenantName::new("TenantB/ProgramB/EnvC").unwrap(),
        EventId::new("nightly-report").unwrap(),
        ts("2027-03-28T01:00:00Z"),
    );
    assert_eq!(id.to_string(), "nightly-report@2027-03-28T01:00:00Z");
    let key = id.event_key().unwrap();
    assert_eq!(key.tenant.as_str(), "TenantB/ProgramB/EnvC");
    assert_eq!(key.id.as_str(), "nightly-report@2027-03-28T01:00:00Z");
    assert_eq!(
        id.event_version().as_str(),
        "nightly-report@2027-03-28T01:00:00Z"
    );
    let again = OccurrenceId::new(id.tenant.clone(), id.schedule_id.clone(), id.scheduled_at);
    assert_eq!(again.event_version(), id.event_version());
    // A schedule id at the maximum length leaves no room for the suffix.
    let long = OccurrenceId::new(
        id.tenant.clone(),
        EventId::new("x".repeat(EventId::MAX_LEN)).unwrap(),
        id.scheduled_at,
    );
    assert!(long.event_key().is_err());
}

// ---------------------------------------------------------- found by fuzzing

/// A field that is an empty list (`,`) matched nothing, and checking that
/// the expression ever fires searched for many seconds: one request could
/// hold a CPU. Such fields are refused at once, in every kind.
#[test]
fn empty_list_items_are_refused_at_once() {
    for (expression, kind) in [
        ("*/2 , * * * 1", CronKind::Quartz),
        ("0 , * * * ?", CronKind::Quartz),
        (", * * * *", CronKind::Unix),
        ("1,,2 * * * *", CronKind::Unix),
        ("0 * * * *,", CronKind::Cron4j),
        ("0 0 , * * *", CronKind::Spring),
    ] {
        let started = std::time::Instant::now();
        let error = CronSpec::parse(expression, kind, Some("America/New_York")).unwrap_err();
        assert!(
            error.to_string().contains("empty list item"),
            "{expression}: {error}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{expression}"
        );
    }
}
