//! The `schedules` scenario: `--count` recurring schedules created over
//! `/v1`, then their occurrences measured like events.
//!
//! Schedule `s<i>` is Quartz `"{i % 60} * * * * ?"` (every minute at second
//! `i % 60`, so the occurrences spread over the minute), or `"* * * * * ?"`
//! with `--every-second`. Each occurrence arrives as an event named
//! `s<i>@<instant, RFC 3339 UTC>` with `X-Belfry-Scheduled-At` = that
//! instant, so lateness is arrival − the instant in the id.
//!
//! The measured span is `(T, T + duration]` where `T` is when the last
//! schedule was acknowledged: every schedule exists then, so each instant
//! of its grid in the span must be delivered exactly once (missing is
//! counted against that). Occurrences outside the span are only checked for
//! being early.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use belfry_testkit::RecordedRequest;
use serde_json::json;

use crate::cli::SchedulesArgs;
use crate::deliveries::{self, Arrival, DeliveryReport, summarize};
use crate::load::{IngestReport, clear_progress_line, progress_line};
use crate::report::{NodeReport, Report};
use crate::scenarios::{Load, SETTLE, Session, own_cpu_since, own_sample, percent_encode};
use crate::stats::{Percentiles, load_average};
use crate::workload::{now_ms, parse_instant_ms};

/// When each schedule fires: every `period_ms`, at `offset_ms(i)` into it.
#[derive(Debug, Clone, Copy)]
struct Grid {
    every_second: bool,
}

impl Grid {
    fn period_ms(self) -> i64 {
        if self.every_second { 1_000 } else { 60_000 }
    }

    fn offset_ms(self, index: usize) -> i64 {
        if self.every_second {
            0
        } else {
            (index % 60) as i64 * 1_000
        }
    }

    fn expression(self, index: usize) -> String {
        if self.every_second {
            "* * * * * ?".to_string()
        } else {
            format!("{} * * * * ?", index % 60)
        }
    }

    /// Instants of schedule `index` in `(from_ms, to_ms]`.
    fn count_in(self, index: usize, from_ms: i64, to_ms: i64) -> u64 {
        let period = self.period_ms();
        let offset = self.offset_ms(index);
        let upto = |t: i64| (t - offset).div_euclid(period);
        u64::try_from(upto(to_ms) - upto(from_ms)).unwrap_or(0)
    }

    /// Whether `instant_ms` is one of schedule `index`'s instants.
    fn is_instant_of(self, index: usize, instant_ms: i64) -> bool {
        (instant_ms - self.offset_ms(index)).rem_euclid(self.period_ms()) == 0
    }
}

pub async fn run(args: SchedulesArgs) -> anyhow::Result<Report> {
    let concurrency = args.concurrency.max(1);
    let load = Load {
        batch: 1,
        concurrency,
        payload_bytes: 0,
        policy: false,
    };
    let session = Session::open(&args.node, load).await?;
    let grid = Grid {
        every_second: args.every_second,
    };
    let load_before = load_average();
    let before = session.node.sample();
    let bench_before = own_sample();
    let creation = create(&session, args.count, concurrency, grid).await;
    let mut warnings = crate::scenarios::ingest_warnings(&creation);
    if creation.acknowledged_events < args.count as u64 {
        warnings.push("some schedules were not created: `missing` is an upper bound".into());
    }
    let span_from = creation.finished_at_ms;
    let duration_ms = i64::try_from(args.duration.as_millis()).unwrap_or(i64::MAX);
    let span_to = span_from.saturating_add(duration_ms);
    let expected = expected_in_span(args.count, grid, span_from, span_to);
    let deadline = span_to.saturating_add(i64::try_from(args.grace_ms).unwrap_or(i64::MAX));
    // Wait the whole span even if the count is reached early: the span is
    // what the run measures.
    while now_ms() < span_to {
        progress_line(&format!(
            "schedules: {} occurrences arrived, {:.0} s of the span left",
            session.receiver.count(),
            (span_to - now_ms()) as f64 / 1000.0
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    clear_progress_line();
    let records = deliveries::wait_for(
        &session.receiver,
        expected,
        deadline,
        SETTLE,
        "schedules delivery",
        |records| {
            analyze(records, args.count, grid, span_from, span_to)
                .0
                .delivered
        },
    )
    .await;
    let (delivery, outside) = analyze(&records, args.count, grid, span_from, span_to);
    let after = session.node.sample();
    let bench_cpu = own_cpu_since(bench_before);
    let load_after = load_average();
    let report = Report {
        scenario: "schedules",
        params: json!({
            "count": args.count,
            "expression": if args.every_second { "* * * * * ?".to_string() } else { "{i % 60} * * * * ?".to_string() },
            "concurrency": concurrency,
            "duration_ms": duration_ms,
            "grace_ms": args.grace_ms,
            "span_from_ms": span_from,
            "span_to_ms": span_to,
            "occurrences_outside_span": outside,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "node": session.node.base_url(),
        }),
        warnings,
        ingest: Some(creation),
        delivery: Some(delivery),
        node: NodeReport::over(before, after),
        bench_cpu,
        ..Report::default()
    };
    session.close().await;
    Ok(report)
}

/// Occurrences due in `(span_from, span_to]`. Which schedules failed to be
/// created is not tracked: with creation failures (reported as warnings)
/// the missing count is an upper bound.
fn expected_in_span(count: usize, grid: Grid, span_from: i64, span_to: i64) -> usize {
    let expected: u64 = (0..count)
        .map(|i| grid.count_in(i, span_from, span_to))
        .sum();
    usize::try_from(expected).unwrap_or(usize::MAX)
}

/// Counters shared by the creating workers.
#[derive(Default)]
struct Creation {
    next: AtomicUsize,
    acknowledged: AtomicU64,
    failed: AtomicU64,
}

/// `PUT`s every schedule with `concurrency` requests in flight; the report
/// counts one "event" per schedule.
async fn create(session: &Session, count: usize, concurrency: usize, grid: Grid) -> IngestReport {
    let base = session.node.url(&format!(
        "/v1/tenants/{}/schedules/",
        percent_encode(&session.tenant)
    ));
    let shared = Arc::new(Creation::default());
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let client = session.client.clone();
        let base = base.clone();
        let shared = Arc::clone(&shared);
        let first_error = Arc::clone(&first_error);
        workers.spawn(async move {
            let mut latencies_us = Vec::new();
            loop {
                let index = shared.next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    break;
                }
                let body = json!({
                    "expression": grid.expression(index),
                    "type": "quartz",
                    "time_zone": "UTC",
                    "payload": format!("s{index}"),
                });
                let sent = Instant::now();
                let outcome = put_schedule(&client, &format!("{base}s{index}"), &body).await;
                latencies_us.push(sent.elapsed().as_micros() as i64);
                match outcome {
                    Ok(()) => {
                        shared.acknowledged.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        shared.failed.fetch_add(1, Ordering::Relaxed);
                        let mut first = first_error
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        first.get_or_insert(error);
                    }
                }
                if index % 1000 == 0 && index > 0 {
                    progress_line(&format!("schedules: {index}/{count} created"));
                }
            }
            latencies_us
        });
    }
    let mut latencies_us = Vec::with_capacity(count);
    while let Some(done) = workers.join_next().await {
        // A worker only panics on a bug of this tool; surface it.
        latencies_us.extend(done.expect("schedule creation worker panicked"));
    }
    clear_progress_line();
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let acknowledged = shared.acknowledged.load(Ordering::Relaxed);
    let failed = shared.failed.load(Ordering::Relaxed);
    let first_error = first_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    IngestReport {
        events: count,
        requests: count,
        batch: 1,
        concurrency,
        acknowledged_events: acknowledged,
        unacknowledged_events: failed,
        failed_requests: failed,
        first_error,
        seconds: elapsed,
        events_per_s: acknowledged as f64 / elapsed,
        requests_per_s: count as f64 / elapsed,
        latency_ms: Percentiles::of(&mut latencies_us).map(|p| p.scaled(1000.0)),
        finished_at_ms: now_ms(),
    }
}

/// One `PUT`: `Ok` on 200 (replaced) or 201 (created).
async fn put_schedule(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Result<(), String> {
    let response = client
        .put(url)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let text = response.text().await.unwrap_or_default();
    Err(format!(
        "HTTP {status}: {}",
        text.chars().take(200).collect::<String>()
    ))
}

/// `s<i>@<instant>` → `(i, instant ms)`.
fn parse_occurrence_id(id: &str) -> Option<(usize, i64)> {
    let (schedule, instant) = id.split_once('@')?;
    let index = schedule.strip_prefix('s')?.parse().ok()?;
    Some((index, parse_instant_ms(instant)?))
}

/// The occurrences in the span `(span_from, span_to]` as a delivery report
/// (early also counts occurrences outside the span), and how many
/// deliveries fell outside the span.
fn analyze(
    records: &[RecordedRequest],
    count: usize,
    grid: Grid,
    span_from: i64,
    span_to: i64,
) -> (DeliveryReport, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut arrivals = Vec::with_capacity(records.len());
    let (mut unknown, mut mismatch, mut outside, mut early_outside) = (0, 0, 0, 0);
    for record in records {
        let Some((index, instant_ms)) = record
            .header("x-belfry-event-id")
            .and_then(parse_occurrence_id)
            .filter(|&(index, instant)| index < count && grid.is_instant_of(index, instant))
        else {
            unknown += 1;
            continue;
        };
        let header = record
            .header("x-belfry-scheduled-at")
            .and_then(parse_instant_ms);
        if header != Some(instant_ms) {
            mismatch += 1;
        }
        if instant_ms <= span_from || instant_ms > span_to {
            outside += 1;
            early_outside += usize::from(record.arrived_at_ms < instant_ms);
            continue;
        }
        arrivals.push(Arrival {
            arrived_ms: record.arrived_at_ms,
            scheduled_ms: instant_ms,
            first_of_event: seen.insert((index, instant_ms)),
        });
    }
    let expected = expected_in_span(count, grid, span_from, span_to);
    let mut report = summarize(&arrivals, expected, unknown, mismatch);
    report.early += early_outside;
    (report, outside)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::deliveries::recorded as record;

    #[test]
    fn minute_grid_spreads_schedules_over_the_seconds() {
        let grid = Grid {
            every_second: false,
        };
        assert_eq!(grid.expression(61), "1 * * * * ?");
        // (0, 120 s]: second 0 at 60 s and 120 s; second 1 at 1 s and 61 s.
        assert_eq!(grid.count_in(0, 0, 120_000), 2);
        assert_eq!(grid.count_in(1, 0, 120_000), 2);
        assert_eq!(grid.count_in(1, 1_000, 61_000), 1);
        assert!(grid.is_instant_of(61, 1_000) && !grid.is_instant_of(61, 2_000));
        let every = Grid { every_second: true };
        assert_eq!(every.count_in(7, 500, 5_500), 5);
    }

    #[test]
    fn occurrences_are_checked_against_the_span() {
        let grid = Grid {
            every_second: false,
        };
        // Two schedules over (0, 60 s]: s0 at 60 s, s1 at 1 s.
        let records = [
            record("s1@1970-01-01T00:00:01Z", "1000", 1_010),
            record("s1@1970-01-01T00:00:01Z", "1000", 1_500), // duplicate
            record("s0@1970-01-01T00:00:00Z", "0", -5),       // outside, early
            record("s0@1970-01-01T00:00:02Z", "2000", 2_000), // not its grid
            record("x", "0", 0),                              // unknown
        ];
        let (report, outside) = analyze(&records, 2, grid, 0, 60_000);
        assert_eq!(outside, 1);
        assert_eq!(report.expected, 2);
        assert_eq!((report.delivered, report.missing), (1, 1));
        assert_eq!((report.duplicates, report.early, report.unknown), (1, 1, 2));
        assert_eq!(report.lateness_ms.unwrap().max, 10.0);
        assert_eq!(
            parse_occurrence_id("s12@1970-01-01T00:00:01Z"),
            Some((12, 1_000))
        );
    }
}
