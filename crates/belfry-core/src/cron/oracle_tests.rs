//! Property tests of `next_after` against a brute-force oracle.
//!
//! The oracle knows nothing of segments or croner: it walks real time one
//! minute (or second) at a time, reads the local time with jiff, matches the
//! fields with its own tiny parser, and applies the DST rules as stated in
//! the module doc:
//! - a real instant fires when its local time matches and either the job
//!   fires on both instants of a fold or this is the first instant of that
//!   local time;
//! - a fixed-time job (hour field not `*`) also fires at a spring-forward
//!   transition when any local time inside the gap matches.

use std::collections::BTreeSet;

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use proptest::prelude::*;

use super::*;
use crate::time::Timestamp;

/// Zones with and without DST, whole-hour and odd shifts, both hemispheres,
/// transitions at 00:00 (Santiago, Sao Paulo until 2019) and 02:00.
const ZONES: [&str; 12] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "America/Santiago",
    "America/Sao_Paulo",
    "America/St_Johns",
    "Pacific/Chatham",
    "Asia/Kolkata",
    "Asia/Kathmandu",
];

/// One field of a generated expression: its text and the values it means.
#[derive(Debug, Clone)]
struct Field {
    text: String,
    values: BTreeSet<u32>,
    is_star: bool,
}

fn star(min: u32, max: u32) -> Field {
    Field {
        text: "*".to_owned(),
        values: (min..=max).collect(),
        is_star: true,
    }
}

/// A random field over `min..=max`: `*`, a value, a range, a step, a
/// stepped range or a list; `favoured` values (DST hours) come up often.
fn field(
    min: u32,
    max: u32,
    favoured: Vec<u32>,
    star_weight: u32,
    single_weight: u32,
) -> BoxedStrategy<Field> {
    let value = prop_oneof![
        (min..=max).boxed(),
        proptest::sample::select(if favoured.is_empty() {
            vec![min]
        } else {
            favoured
        })
        .boxed(),
    ];
    let single = value.clone().prop_map(|v| Field {
        text: v.to_string(),
        values: BTreeSet::from([v]),
        is_star: false,
    });
    let range = (value.clone(), 0..=max - min).prop_map(move |(a, len)| {
        let b = (a + len).min(max);
        Field {
            text: format!("{a}-{b}"),
            values: (a..=b).collect(),
            is_star: false,
        }
    });
    let step = (2..=(max - min + 1).clamp(2, 30)).prop_map(move |n| Field {
        text: format!("*/{n}"),
        values: (min..=max)
            .filter(|v| (v - min).is_multiple_of(n))
            .collect(),
        is_star: false,
    });
    let stepped_range = (value.clone(), 0..=max - min, 2u32..=7).prop_map(move |(a, len, n)| {
        let b = (a + len).min(max);
        Field {
            text: format!("{a}-{b}/{n}"),
            values: (a..=b).step_by(n as usize).collect(),
            is_star: false,
        }
    });
    let list = proptest::collection::btree_set(value, 2..=4).prop_map(|values| Field {
        text: values
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        values,
        is_star: false,
    });
    prop_oneof![
        star_weight => Just(star(min, max)),
        single_weight => single,
        1 => range,
        2 => step,
        1 => stepped_range,
        1 => list,
    ]
    .boxed()
}

/// A generated UNIX (5 fields) or SPRING-without-days (6 fields) expression.
#[derive(Debug, Clone)]
struct Expr {
    second: Option<Field>,
    minute: Field,
    hour: Field,
    day_of_month: Field,
    month: Field,
    day_of_week: Field,
}

impl Expr {
    fn text(&self) -> String {
        let days = format!(
            "{} {} {}",
            self.day_of_month.text, self.month.text, self.day_of_week.text
        );
        match &self.second {
            Some(second) => format!(
                "{} {} {} {days}",
                second.text, self.minute.text, self.hour.text
            ),
            None => format!("{} {} {days}", self.minute.text, self.hour.text),
        }
    }

    fn kind(&self) -> CronKind {
        if self.second.is_some() {
            CronKind::Spring
        } else {
            CronKind::Unix
        }
    }

    fn step_secs(&self) -> i64 {
        if self.second.is_some() { 1 } else { 60 }
    }

    fn every_hour(&self) -> bool {
        self.hour.values.len() == 24
    }

    fn fires_on_both_fold_instants(&self) -> bool {
        let seconds = self.second.as_ref().map_or(1, |s| s.values.len());
        self.every_hour() || seconds * self.minute.values.len() > 1
    }

    fn matches(&self, local: DateTime) -> bool {
        let second_ok = match &self.second {
            Some(second) => second.values.contains(&(local.second() as u32)),
            None => local.second() == 0,
        };
        let day_of_month_ok = self.day_of_month.values.contains(&(local.day() as u32));
        let weekday = local.weekday().to_sunday_zero_offset() as u32;
        let day_of_week_ok = self.day_of_week.values.contains(&weekday)
            || (weekday == 0 && self.day_of_week.values.contains(&7));
        // Vixie cron (UNIX): both restricted → either; otherwise both.
        // SPRING ANDs them, and its generated day fields are all `*`.
        let day_ok =
            if self.second.is_none() && !self.day_of_month.is_star && !self.day_of_week.is_star {
                day_of_month_ok || day_of_week_ok
            } else {
                day_of_month_ok && day_of_week_ok
            };
        second_ok
            && self.minute.values.contains(&(local.minute() as u32))
            && self.hour.values.contains(&(local.hour() as u32))
            && self.month.values.contains(&(local.month() as u32))
            && day_ok
    }
}

fn minute_expr() -> impl Strategy<Value = Expr> {
    minute_expr_with(field(0, 23, vec![0, 1, 2, 3], 3, 2))
}

/// Fixed-time-leaning: the hour is mostly a single value in the hours
/// where transitions happen, so gaps and folds are hit often.
fn fixed_time_expr() -> impl Strategy<Value = Expr> {
    minute_expr_with(field(0, 23, vec![0, 1, 2, 3], 1, 6))
}

fn minute_expr_with(hour: BoxedStrategy<Field>) -> impl Strategy<Value = Expr> {
    (
        field(0, 59, vec![0, 15, 30, 45], 2, 2),
        hour,
        field(1, 31, vec![1, 28, 31], 8, 2),
        field(1, 12, vec![3, 4, 10, 11], 8, 2),
        field(0, 6, vec![0], 8, 2),
    )
        .prop_map(|(minute, hour, day_of_month, month, day_of_week)| Expr {
            second: None,
            minute,
            hour,
            day_of_month,
            month,
            day_of_week,
        })
}

fn second_expr() -> impl Strategy<Value = Expr> {
    (
        field(0, 59, vec![0, 30], 1, 2),
        field(0, 59, vec![0, 30, 59], 2, 2),
        field(0, 23, vec![0, 1, 2, 3], 3, 2),
    )
        .prop_map(|(second, minute, hour)| Expr {
            second: Some(second),
            minute,
            hour,
            day_of_month: star(1, 31),
            month: star(1, 12),
            day_of_week: star(0, 6),
        })
}

/// A start instant: near one of the zone's transitions (within a few
/// hours either side), or anywhere in 2015–2030.
fn start_instant(
    zone: &'static str,
    near_transition_only: bool,
) -> impl Strategy<Value = (&'static str, i64)> {
    let year_start = jiff::Timestamp::from_second(1_420_070_400).unwrap(); // 2015-01-01
    (
        0usize..40,
        -4 * 3_600i64..4 * 3_600,
        0i64..16 * 365 * 86_400,
        any::<bool>(),
    )
        .prop_map(move |(nth, jitter, anywhere, near_transition)| {
            let tz = TimeZone::get(zone).unwrap();
            let transition = tz.following(year_start).nth(nth).map(|t| t.timestamp());
            let start = match transition {
                Some(t) if near_transition || near_transition_only => t.as_second() + jitter,
                _ => year_start.as_second() + anywhere,
            };
            (zone, start)
        })
}

fn zone_and_start() -> impl Strategy<Value = (&'static str, i64)> {
    proptest::sample::select(ZONES.to_vec()).prop_flat_map(|zone| start_instant(zone, false))
}

fn zone_and_transition() -> impl Strategy<Value = (&'static str, i64)> {
    // UTC and the fixed zones have no transitions; leave them out here.
    proptest::sample::select(ZONES[1..10].to_vec()).prop_flat_map(|zone| start_instant(zone, true))
}

/// The oracle: the first firing in `(after, after + horizon]`, or `None`.
fn oracle_next(expr: &Expr, tz: &TimeZone, after: i64, horizon: i64) -> Option<i64> {
    let step = expr.step_secs();
    let mut t = after.div_euclid(step) * step + step;
    while t <= after + horizon {
        let instant = jiff::Timestamp::from_second(t).unwrap();
        let offset = tz.to_offset(instant);
        let local = offset.to_datetime(instant);
        if expr.matches(local) {
            let first = tz.to_ambiguous_timestamp(local).earlier().unwrap();
            if expr.fires_on_both_fold_instants() || first == instant {
                return Some(t);
            }
        }
        if !expr.every_hour() {
            let before = tz.to_offset(jiff::Timestamp::from_second(t - 1).unwrap());
            if before.seconds() < offset.seconds() {
                // A spring-forward transition at t: scan the gap's local times.
                let gap = i64::from(offset.seconds() - before.seconds());
                let gap_start = before.to_datetime(instant);
                let any_match = (0..gap / step)
                    .any(|k| expr.matches(gap_start + jiff::SignedDuration::from_secs(k * step)));
                if any_match {
                    return Some(t);
                }
            }
        }
        t += step;
    }
    None
}

/// Compares up to `count` successive occurrences with the oracle.
fn check_against_oracle(expr: &Expr, zone: &str, start: i64, horizon: i64, count: usize) {
    let tz = TimeZone::get(zone).unwrap();
    let spec = match CronSpec::parse(&expr.text(), expr.kind(), Some(zone)) {
        Ok(spec) => spec,
        // e.g. `* * 30 2 *`: then the oracle must not find a match either.
        Err(CronError::NeverMatches(_)) => {
            assert_eq!(
                oracle_next(expr, &tz, start, horizon),
                None,
                "{}",
                expr.text()
            );
            return;
        }
        Err(error) => panic!("'{}' should parse: {error}", expr.text()),
    };
    let mut after = start;
    for n in 0..count {
        let ours = spec
            .next_after(Timestamp::from_millis(after * 1_000))
            .map(|t| t.as_millis() / 1_000);
        let want = oracle_next(expr, &tz, after, horizon);
        match want {
            Some(want) => {
                assert_eq!(
                    ours,
                    Some(want),
                    "#{n} of '{}' in {zone} after {}",
                    expr.text(),
                    jiff::Timestamp::from_second(after).unwrap()
                );
                after = want;
            }
            None => {
                // Nothing within the horizon: ours must be beyond it too.
                assert!(
                    ours.is_none_or(|ours| ours > after + horizon),
                    "#{n} of '{}' in {zone} after {}: ours {ours:?}, oracle none within {horizon}s",
                    expr.text(),
                    jiff::Timestamp::from_second(after).unwrap()
                );
                return;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn five_field_next_after_matches_the_oracle(
        expr in minute_expr(),
        (zone, start) in zone_and_start(),
    ) {
        check_against_oracle(&expr, zone, start, 3 * 86_400, 6);
    }

    #[test]
    fn fixed_time_next_after_matches_the_oracle_on_transition_days(
        expr in fixed_time_expr(),
        (zone, start) in zone_and_transition(),
    ) {
        check_against_oracle(&expr, zone, start, 2 * 86_400, 4);
    }

    #[test]
    fn seconds_next_after_matches_the_oracle(
        expr in second_expr(),
        (zone, start) in zone_and_start(),
    ) {
        check_against_oracle(&expr, zone, start, 3 * 3_600, 6);
    }

    /// Away from transitions, Belfry and croner (a widely used library)
    /// agree.
    #[test]
    fn agrees_with_croner_on_ordinary_days(
        expr in minute_expr(),
        zone in proptest::sample::select(ZONES.to_vec()),
        day in 0i64..16 * 365,
    ) {
        let tz = TimeZone::get(zone).unwrap();
        let start = 1_420_070_400 + day * 86_400;
        let start_ts = jiff::Timestamp::from_second(start).unwrap();
        // Compare only up to a day before the next transition.
        let quiet_until = tz
            .following(start_ts)
            .next()
            .map_or(i64::MAX, |t| t.timestamp().as_second() - 86_400);
        prop_assume!(quiet_until > start);
        let spec = CronSpec::parse(&expr.text(), CronKind::Unix, Some(zone));
        // `* * 30 2 *` and friends are refused; nothing to compare.
        prop_assume!(spec.is_ok());
        let spec = spec.unwrap();
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .build()
            .parse(&expr.text())
            .unwrap();
        let theirs = cron
            .iter_after(start_ts.to_zoned(tz))
            .map(|z| z.timestamp().as_second())
            .take_while(|t| *t < quiet_until)
            .take(5);
        let ours = spec
            .occurrences_after(Timestamp::from_millis(start * 1_000))
            .map(|t| t.as_millis() / 1_000);
        for (theirs, ours) in theirs.zip(ours) {
            prop_assert_eq!(ours, theirs, "'{}' in {}", expr.text(), zone);
        }
    }
}

#[test]
fn oracle_itself_follows_the_stated_rules() {
    // Guard against an oracle that agrees with a wrong implementation by
    // being wrong the same way: check it on the hand-worked Berlin days.
    let daily = Expr {
        second: None,
        minute: Field {
            text: "30".into(),
            values: BTreeSet::from([30]),
            is_star: false,
        },
        hour: Field {
            text: "2".into(),
            values: BTreeSet::from([2]),
            is_star: false,
        },
        day_of_month: star(1, 31),
        month: star(1, 12),
        day_of_week: star(0, 6),
    };
    let tz = TimeZone::get("Europe/Berlin").unwrap();
    let at = |text: &str| Timestamp::parse_rfc3339(text).unwrap().as_millis() / 1_000;
    assert_eq!(
        oracle_next(&daily, &tz, at("2027-03-27T12:00:00Z"), 86_400 * 2),
        Some(at("2027-03-28T01:00:00Z"))
    );
    assert_eq!(
        oracle_next(&daily, &tz, at("2027-10-31T00:30:00Z"), 86_400 * 2),
        Some(at("2027-11-01T01:30:00Z"))
    );
}
