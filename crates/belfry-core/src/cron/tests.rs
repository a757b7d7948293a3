use super::*;
use crate::time::Timestamp;

fn ts(text: &str) -> Timestamp {
    Timestamp::parse_rfc3339(text).unwrap()
}

fn croner_next(expr: &str, seconds: bool, tz: &str, from: &str, n: usize) -> Vec<String> {
    use croner::parser::{CronParser, Seconds};
    let cron = CronParser::builder()
        .seconds(if seconds { Seconds::Required } else { Seconds::Disallowed })
        .build()
        .parse(expr)
        .unwrap();
    let zone = jiff::tz::TimeZone::get(tz).unwrap();
    let start = jiff::Timestamp::from_millisecond(ts(from).as_millis()).unwrap().to_zoned(zone);
    cron.iter_after(start).take(n).map(|z| z.timestamp().to_string()).collect()
}

#[test]
fn explore() {
    for (expr, secs, tz, from) in [
        ("30 2 * * *", false, "Europe/Berlin", "2027-03-27T00:00:00Z"),
        ("30 2,14 * * *", false, "Europe/Berlin", "2027-03-27T00:00:00Z"),
        ("*/15 0-5 * * *", false, "Europe/Berlin", "2027-03-28T00:00:00Z"),
        ("*/15 0-5 * * *", false, "Europe/Berlin", "2027-10-30T23:30:00Z"),
        ("30 2 * * *", false, "Europe/Berlin", "2027-10-30T00:00:00Z"),
        ("0 * * * *", false, "America/New_York", "2027-11-07T04:00:00Z"),
        ("*/15 * * * *", false, "America/New_York", "2027-11-07T05:00:00Z"),
        ("30 1 * * *", false, "America/New_York", "2027-11-06T00:00:00Z"),
    ] {
        let ours: Vec<String> = CronSpec::parse(expr, CronKind::Unix, Some(tz)).unwrap()
            .occurrences_after(ts(from)).take(10).map(|t| t.to_rfc3339()).collect();
        let theirs = croner_next(expr, secs, tz, from, 10);
        println!("{expr} {tz} {from}\n ours   {ours:?}\n croner {theirs:?}");
    }
}
