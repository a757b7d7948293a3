//! English descriptions of schedules ("every 5 seconds", "at 02:30 every
//! day"), for BigBen's `/cron` answer and the preview API.
//!
//! Common shapes get a natural phrase; anything else falls back to a
//! field-by-field phrase that is plain but never wrong.

use super::expr::{CalendarRule, CronSpec, Fields, IntervalRule, Rule};

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

impl CronSpec {
    /// A human-readable English description of when this schedule fires,
    /// e.g. `every 5 seconds`, `at 02:30 every day (Europe/Berlin)`.
    pub fn describe(&self) -> String {
        match &self.rule {
            Rule::Interval(interval) => describe_interval(interval),
            Rule::Calendar(calendar) => {
                let text = describe_calendar(calendar);
                // Clock times mean nothing without their zone; pure
                // repetitions (every N minutes) read the same in any zone.
                if self.zone_name != "UTC" && mentions_clock_time(&calendar.fields) {
                    format!("{text} ({})", self.zone_name)
                } else {
                    text
                }
            }
        }
    }
}

fn describe_interval(interval: &IntervalRule) -> String {
    let mut rest = interval.period_ms;
    let mut parts = Vec::new();
    for (unit_ms, name) in [
        (86_400_000, "day"),
        (3_600_000, "hour"),
        (60_000, "minute"),
        (1_000, "second"),
        (1, "millisecond"),
    ] {
        let count = rest / unit_ms;
        rest %= unit_ms;
        if count > 0 {
            parts.push(plural(count, name));
        }
    }
    if parts.len() == 1 && parts[0].starts_with("1 ") {
        // "every 1 hour" reads better as "every hour".
        return format!("every {}", &parts[0][2..]);
    }
    format!("every {}", parts.join(" "))
}

fn plural(count: i64, unit: &str) -> String {
    if count == 1 {
        format!("1 {unit}")
    } else {
        format!("{count} {unit}s")
    }
}

/// A field's shape, as far as the phrasing cares.
enum Shape {
    Any,
    /// `*/n` or `0/n`.
    Every(u32),
    Value(u32),
    Values(Vec<u32>),
    Other,
}

fn shape(field: &str) -> Shape {
    if field == "*" || field == "?" {
        return Shape::Any;
    }
    if let Some(step) = field
        .strip_prefix("*/")
        .or_else(|| field.strip_prefix("0/"))
        .and_then(|step| step.parse().ok())
    {
        return if step == 1 {
            Shape::Any
        } else {
            Shape::Every(step)
        };
    }
    if let Ok(value) = field.parse() {
        return Shape::Value(value);
    }
    let values: Option<Vec<u32>> = field.split(',').map(|v| v.parse().ok()).collect();
    match values {
        Some(values) if values.len() > 1 => Shape::Values(values),
        _ => Shape::Other,
    }
}

fn mentions_clock_time(fields: &Fields) -> bool {
    !matches!(shape(&fields.hour), Shape::Any)
}

fn describe_calendar(rule: &CalendarRule) -> String {
    let fields = &rule.fields;
    let days_and = rule.cron.pattern.matches_dom_and_dow();
    let days = describe_days(fields, rule.quartz_weekdays, days_and);
    let (time, is_repetition) = describe_time(fields);
    match days {
        None if is_repetition => time,
        None => format!("{time} every day"),
        Some(days) => format!("{time} {days}"),
    }
}

/// The time-of-day part, and whether it is a pure repetition ("every 5
/// minutes") that needs no "every day".
fn describe_time(fields: &Fields) -> (String, bool) {
    use Shape::{Any, Every, Value, Values};
    let second = shape(&fields.second);
    let minute = shape(&fields.minute);
    let hour = shape(&fields.hour);
    match (&second, &minute, &hour) {
        (Any, Any, Any) => ("every second".to_owned(), true),
        (Every(n), Any, Any) => (format!("every {n} seconds"), true),
        (Value(0), Any, Any) => ("every minute".to_owned(), true),
        (Value(0), Every(n), Any) => (format!("every {n} minutes"), true),
        (Value(0), Value(m), Any) => (format!("at minute {m} of every hour"), true),
        (Value(0), Value(m), Every(n)) => (
            format!("at minute {m} past every {} hour", ordinal(*n)),
            true,
        ),
        (Value(0), Every(n), Value(h)) => (format!("every {n} minutes during hour {h:02}"), false),
        (Value(0), Any, Value(h)) => (format!("every minute during hour {h:02}"), false),
        (Value(s), Value(m), Value(h)) => (format!("at {}", clock(*h, *m, *s)), false),
        (Value(s), Value(m), Values(hours)) => {
            let times: Vec<String> = hours.iter().map(|h| clock(*h, *m, *s)).collect();
            (format!("at {}", join_and(&times)), false)
        }
        _ => (
            format!(
                "at second {}, minute {}, hour {}",
                fields.second, fields.minute, fields.hour
            ),
            false,
        ),
    }
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn clock(hour: u32, minute: u32, second: u32) -> String {
    if second == 0 {
        format!("{hour:02}:{minute:02}")
    } else {
        format!("{hour:02}:{minute:02}:{second:02}")
    }
}

/// The day part, or `None` for every day.
fn describe_days(fields: &Fields, quartz_weekdays: bool, days_and: bool) -> Option<String> {
    let day_of_month = shape(&fields.day_of_month);
    let month = shape(&fields.month);
    let day_of_week = shape(&fields.day_of_week);
    let mut parts = Vec::new();
    match (&day_of_month, &month) {
        (Shape::Any, Shape::Any) => {}
        (Shape::Value(day), Shape::Value(month)) if (1..=12).contains(month) => {
            parts.push(format!("on {} {day}", MONTHS[*month as usize - 1]));
        }
        _ => {
            match &day_of_month {
                Shape::Any => {}
                Shape::Value(day) => parts.push(format!("on day {day} of the month")),
                _ if fields.day_of_month.eq_ignore_ascii_case("L") => {
                    parts.push("on the last day of the month".to_owned());
                }
                _ => parts.push(format!("on day-of-month {}", fields.day_of_month)),
            }
            match &month {
                Shape::Any => {}
                Shape::Value(m) if (1..=12).contains(m) => {
                    parts.push(format!("in {}", MONTHS[*m as usize - 1]));
                }
                _ => parts.push(format!("in month {}", fields.month)),
            }
        }
    }
    match weekday_phrase(&fields.day_of_week, &day_of_week, quartz_weekdays) {
        None => {}
        Some(phrase) => {
            // UNIX ORs two restricted day fields; SPRING and CRON4J AND
            // them (Quartz forbids the pair).
            if !matches!(day_of_month, Shape::Any) {
                let joiner = if days_and { "and only" } else { "or" };
                parts.push(format!("{joiner} {phrase}"));
            } else {
                parts.push(phrase);
            }
        }
    }
    if let Some(year) = &fields.year
        && year != "*"
    {
        parts.push(format!("in year {year}"));
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join(" "))
    }
}

fn weekday_phrase(text: &str, shape: &Shape, quartz_weekdays: bool) -> Option<String> {
    let name = |number: u32| -> Option<&'static str> {
        let index = if quartz_weekdays {
            number.checked_sub(1)?
        } else {
            number % 7
        };
        WEEKDAYS.get(index as usize).copied()
    };
    match shape {
        Shape::Any => None,
        Shape::Value(day) => Some(match name(*day) {
            Some(day) => format!("on {day}"),
            None => format!("on day-of-week {text}"),
        }),
        Shape::Values(days) => {
            let names: Option<Vec<String>> =
                days.iter().map(|d| name(*d).map(str::to_owned)).collect();
            Some(match names {
                Some(names) => format!("on {}", join_and(&names)),
                None => format!("on day-of-week {text}"),
            })
        }
        _ => {
            let range = text
                .split_once('-')
                .and_then(|(a, b)| Some((name(a.parse().ok()?)?, name(b.parse().ok()?)?)));
            Some(match range {
                Some((first, last)) => format!("on {first} through {last}"),
                None => format!("on day-of-week {text}"),
            })
        }
    }
}

fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}
