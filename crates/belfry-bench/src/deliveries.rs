//! What the receiver saw, checked against what was scheduled: lateness
//! (arrival − scheduled instant), early, missing and duplicate deliveries.

use std::collections::HashSet;
use std::time::Duration;

use belfry_testkit::{Receiver, RecordedRequest};
use serde::Serialize;

use crate::load::{clear_progress_line, progress_line};
use crate::stats::Percentiles;
use crate::workload::{Workload, now_ms, parse_instant_ms};

/// The delivery side of a run.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryReport {
    pub expected: usize,
    /// Distinct events delivered.
    pub delivered: usize,
    pub missing: usize,
    /// Deliveries beyond the first of an event.
    pub duplicates: usize,
    /// Deliveries that arrived before their scheduled instant (any, duplicates
    /// included). Must be 0.
    pub early: usize,
    /// Deliveries whose id is not an event of this run.
    pub unknown: usize,
    /// Deliveries whose `X-Belfry-Scheduled-At` disagrees with the instant
    /// that was scheduled (bench workloads only).
    pub scheduled_header_mismatch: usize,
    /// First arrival to last arrival, in seconds.
    pub span_s: f64,
    /// Distinct deliveries per second over the span.
    pub events_per_s: f64,
    /// Lateness of each event's first delivery, in ms (1 ms resolution:
    /// arrival is read in whole ms).
    pub lateness_ms: Option<Percentiles>,
}

/// One delivery reduced to what the statistics need.
pub(crate) struct Arrival {
    pub(crate) arrived_ms: i64,
    pub(crate) scheduled_ms: i64,
    pub(crate) first_of_event: bool,
}

pub(crate) fn summarize(
    arrivals: &[Arrival],
    expected: usize,
    unknown: usize,
    mismatch: usize,
) -> DeliveryReport {
    crate::plots::remember(
        arrivals
            .iter()
            .filter(|a| a.first_of_event)
            .map(|a| (a.scheduled_ms, a.arrived_ms)),
    );
    let delivered = arrivals.iter().filter(|a| a.first_of_event).count();
    let mut lateness: Vec<i64> = arrivals
        .iter()
        .filter(|a| a.first_of_event)
        .map(|a| a.arrived_ms - a.scheduled_ms)
        .collect();
    let first = arrivals.iter().map(|a| a.arrived_ms).min().unwrap_or(0);
    let last = arrivals.iter().map(|a| a.arrived_ms).max().unwrap_or(0);
    // A span under 1 ms is reported as 1 ms rather than an infinite rate.
    let span_s = ((last - first).max(1)) as f64 / 1000.0;
    DeliveryReport {
        expected,
        delivered,
        missing: expected.saturating_sub(delivered),
        duplicates: arrivals.len() - delivered,
        early: arrivals
            .iter()
            .filter(|a| a.arrived_ms < a.scheduled_ms)
            .count(),
        unknown,
        scheduled_header_mismatch: mismatch,
        span_s,
        events_per_s: delivered as f64 / span_s,
        lateness_ms: Percentiles::of(&mut lateness),
    }
}

/// Checks the deliveries of a bench workload: ids `e<n>`, the truth being
/// the instant the bench scheduled.
pub fn analyze_workload(records: &[RecordedRequest], workload: &Workload) -> DeliveryReport {
    let mut seen = vec![false; workload.len()];
    let mut unknown = 0;
    let mut mismatch = 0;
    let mut arrivals = Vec::with_capacity(records.len());
    for record in records {
        let Some(index) = record
            .header("x-belfry-event-id")
            .and_then(|id| workload.index_of(id))
        else {
            unknown += 1;
            continue;
        };
        let scheduled_ms = workload.due_ms[index];
        let header = record
            .header("x-belfry-scheduled-at")
            .and_then(parse_instant_ms);
        if header != Some(scheduled_ms) {
            mismatch += 1;
        }
        arrivals.push(Arrival {
            arrived_ms: record.arrived_at_ms,
            scheduled_ms,
            first_of_event: !std::mem::replace(&mut seen[index], true),
        });
    }
    write_arrivals_csv(&arrivals);
    summarize(&arrivals, workload.len(), unknown, mismatch)
}

/// With `BENCH_ARRIVALS_CSV=<path>`, writes `scheduled_ms,arrived_ms`
/// of every first delivery, for looking at lateness over time.
fn write_arrivals_csv(arrivals: &[Arrival]) {
    let Some(path) = std::env::var_os("BENCH_ARRIVALS_CSV") else {
        return;
    };
    use std::fmt::Write as _;
    let mut text = String::from("scheduled_ms,arrived_ms\n");
    for arrival in arrivals.iter().filter(|a| a.first_of_event) {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "{},{}", arrival.scheduled_ms, arrival.arrived_ms);
    }
    if let Err(error) = std::fs::write(&path, text) {
        eprintln!("cannot write {}: {error}", path.to_string_lossy());
    }
}

/// Checks deliveries from an external peer: the id comes from
/// `X-Belfry-Event-Id` / `X-Event-Id` or the body's `id`, the scheduled
/// instant from `X-Belfry-Scheduled-At` / `X-Scheduled-At` or the body's
/// `scheduled_at` / `scheduledAt` / `eventTime` (ms, seconds as a float, or
/// RFC 3339).
pub fn analyze_peer(records: &[RecordedRequest], expected: usize) -> DeliveryReport {
    let mut seen = HashSet::new();
    let mut unknown = 0;
    let mut arrivals = Vec::with_capacity(records.len());
    for record in records {
        let body = record.body_json().ok();
        let body_text = |keys: &[&str]| -> Option<String> {
            let body = body.as_ref()?;
            keys.iter().find_map(|key| match &body[*key] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
        };
        let id = record
            .header("x-belfry-event-id")
            .or_else(|| record.header("x-event-id"))
            .map(str::to_string)
            .or_else(|| body_text(&["id"]));
        let scheduled = record
            .header("x-belfry-scheduled-at")
            .or_else(|| record.header("x-scheduled-at"))
            .map(str::to_string)
            .or_else(|| body_text(&["scheduled_at", "scheduledAt", "eventTime"]))
            .and_then(|text| parse_instant_ms(&text));
        let (Some(id), Some(scheduled_ms)) = (id, scheduled) else {
            unknown += 1;
            continue;
        };
        arrivals.push(Arrival {
            arrived_ms: record.arrived_at_ms,
            scheduled_ms,
            first_of_event: seen.insert(id),
        });
    }
    summarize(&arrivals, expected, unknown, 0)
}

/// Waits until `expected` distinct events were delivered (as counted by
/// `distinct`) or `deadline_ms` (wall clock) passed, printing progress; then
/// waits `settle` more so late duplicates are counted too, and returns every
/// record.
pub async fn wait_for(
    receiver: &Receiver,
    expected: usize,
    deadline_ms: i64,
    settle: Duration,
    label: &str,
    distinct: impl Fn(&[RecordedRequest]) -> usize,
) -> Vec<RecordedRequest> {
    let mut last_print = now_ms();
    loop {
        let count = receiver.count();
        let now = now_ms();
        if now >= deadline_ms {
            break;
        }
        // Counting distinct events copies every record: only worth it once
        // enough requests arrived, and then not too often.
        if count >= expected {
            if distinct(&receiver.requests()) >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        if now - last_print >= 1000 {
            last_print = now;
            progress_line(&format!(
                "{label}: {count}/{expected} delivered, waiting up to {:.0} s more",
                (deadline_ms - now) as f64 / 1000.0
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    clear_progress_line();
    tokio::time::sleep(settle).await;
    receiver.take_requests()
}

/// A delivery as the lean receiver records it (test fixture shared by the
/// scenarios' tests).
#[cfg(test)]
pub(crate) fn recorded(id: &str, scheduled: &str, arrived_ms: i64) -> RecordedRequest {
    RecordedRequest {
        arrived_at_ms: arrived_ms,
        arrived_at: std::time::Instant::now(),
        method: reqwest::Method::POST,
        path: String::new(),
        headers: vec![
            ("x-belfry-event-id".into(), id.into()),
            ("x-belfry-scheduled-at".into(), scheduled.into()),
        ],
        body: bytes::Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::recorded as record;
    use super::*;

    #[test]
    fn counts_late_early_duplicate_missing_and_unknown() {
        let workload = Workload::uniform("t", 4, 10_000, 4, 0);
        // e0 due 10000, e1 10001, e2 10002, e3 10003 (missing).
        let records = [
            record("e0", "10000", 10_005),
            record("e1", "10001", 10_000),                // early by 1
            record("e0", "10000", 10_050),                // duplicate
            record("e2", "2000-01-01T00:00:00Z", 10_002), // header mismatch
            record("zz", "10000", 10_002),                // unknown
        ];
        let report = analyze_workload(&records, &workload);
        assert_eq!(report.delivered, 3);
        assert_eq!(report.missing, 1);
        assert_eq!(report.duplicates, 1);
        assert_eq!(report.early, 1);
        assert_eq!(report.unknown, 1);
        assert_eq!(report.scheduled_header_mismatch, 1);
        let lateness = report.lateness_ms.unwrap();
        assert_eq!((lateness.p50, lateness.max), (0.0, 5.0));
    }

    #[test]
    fn peer_deliveries_may_carry_their_instant_in_the_body() {
        let mut from_body = record("", "", 1_500);
        from_body.headers.clear();
        from_body.body = bytes::Bytes::from_static(br#"{"id":"a","scheduled_at":1000}"#);
        let records = [from_body, record("b", "1000", 1_200)];
        let report = analyze_peer(&records, 3);
        assert_eq!((report.delivered, report.missing, report.early), (2, 1, 0));
        assert_eq!(report.lateness_ms.unwrap().max, 500.0);
    }
}
