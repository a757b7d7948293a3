//! Scale check of recurring schedules on one node: N schedules `@every P`
//! spread evenly over the period, on the real embedded store, delivered to
//! the built-in `log` processor (so the measurement is the scheduler, not a
//! webhook). Reports creation rate, RSS, and fire lateness (attempt start −
//! scheduled instant) of every occurrence due in the measured span.
//!
//! `cargo run --release -p belfry-engine --example schedule_scale -- N PERIOD_S RUN_S [DIR]`
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_clock::SystemClock;
use belfry_core::schedule::{DEFAULT_CATCH_UP_WINDOW, Progress};
use belfry_core::tenant::BuiltinTarget;
use belfry_core::{
    Clock, DeliveryOption, EventStatus, MisfirePolicy, PartitionCount, Schedule, ScheduleId,
    ScheduleStatus, SinkConfig, TenantConfig, TenantName, Timestamp,
};
use belfry_engine::{Engine, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::{EmbeddedOptions, EmbeddedStore, ListEventsParams, SharedStore};
use futures::StreamExt;

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        / 1024
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let period_s: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(60);
    let run_s: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(120);
    let dir = tempfile::tempdir_in(args.get(4).map_or("/tmp", String::as_str)).unwrap();
    let store: SharedStore = Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.path().to_path_buf(),
            partitions: PartitionCount::new(64).unwrap(),
            writers: None,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap(),
    );
    let engine = Engine::start(
        EngineOptions::default(),
        store.clone(),
        Sinks::new(Default::default()).unwrap(),
        Arc::new(SystemClock),
    );
    let handle = engine.handle();
    let tenant = TenantName::new("bench").unwrap();
    store
        .put_tenant(TenantConfig {
            name: tenant.clone(),
            sink: SinkConfig::Builtin(BuiltinTarget {
                processor: "log".into(),
            }),
            signing: None,
            notify: None,
        })
        .await
        .unwrap();

    let period_ms = period_s as i64 * 1_000;
    // Anchored a full period ahead so creation (which takes a while) is
    // over before the first occurrences.
    let base = SystemClock.now().as_millis() / 1_000 * 1_000 + period_ms;
    let started = Instant::now();
    let created = futures::stream::iter(0..count)
        .map(|i| {
            let handle = handle.clone();
            let tenant = tenant.clone();
            async move {
                let zero = Timestamp::from_millis(0);
                let offset = (i as i64 * period_ms) / count as i64;
                let schedule = Schedule {
                    id: ScheduleId::new(format!("s{i:07}")).unwrap(),
                    expression: format!("@every {period_s}s"),
                    kind: "EVERY".into(),
                    time_zone: "UTC".into(),
                    payload: Some("tick".into()),
                    delivery: DeliveryOption::PayloadOnly,
                    start_at: Some(Timestamp::from_millis(base + offset)),
                    end_at: None,
                    max_occurrences: None,
                    misfire: MisfirePolicy::FireOnce,
                    catch_up_window: DEFAULT_CATCH_UP_WINDOW,
                    status: ScheduleStatus::Active,
                    created_at: zero,
                    updated_at: zero,
                    progress: Progress::starting_after(zero),
                    settings: Default::default(),
                };
                handle.schedules().put(&tenant, schedule).await.is_ok()
            }
        })
        .buffer_unordered(1_024)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    let create_s = started.elapsed().as_secs_f64();
    println!(
        "created {created} schedules in {create_s:.1} s ({:.0}/s), RSS {} MiB",
        created as f64 / create_s,
        rss_mib()
    );

    // Measure `run_s` of occurrences from the first one on (or from now,
    // if creation overran the first period).
    let measure_from = SystemClock.now().as_millis().max(base);
    let measure_to = measure_from + run_s as i64 * 1_000;
    let mut max_rss = 0;
    // Plus a margin for the last ones to be delivered and recorded.
    while SystemClock.now().as_millis() < measure_to + 10_000 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        max_rss = max_rss.max(rss_mib());
    }

    let mut lateness = Vec::new();
    let (mut pending_late, mut missed, mut early, mut total) = (0u64, 0u64, 0u64, 0u64);
    let mut after = None;
    loop {
        let page = store
            .list_events(ListEventsParams {
                tenant: tenant.clone(),
                status: None,
                from: Some(Timestamp::from_millis(measure_from)),
                to: Some(Timestamp::from_millis(measure_to)),
                after: after.clone(),
                limit: 10_000,
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key.id.clone());
        for record in &page {
            if record.key.id.is_internal() {
                continue;
            }
            total += 1;
            match (record.status, record.triggered_at) {
                (EventStatus::Delivered, Some(at)) => {
                    let late = at.as_millis() - record.event_time.as_millis();
                    if late < 0 {
                        early += 1;
                    }
                    lateness.push(late);
                }
                (EventStatus::Missed, _) => missed += 1,
                _ => pending_late += 1,
            }
        }
    }
    lateness.sort_unstable();
    let expected = count as i64 * (measure_to - measure_from) / period_ms;
    println!(
        "occurrences due in {:.0} s: {total} (expected ≈ {expected}), delivered {}, missed {missed}, \
         not yet delivered {pending_late}, early {early}",
        (measure_to - measure_from) as f64 / 1_000.0,
        lateness.len()
    );
    println!(
        "fire lateness ms: p50 {} p90 {} p99 {} p99.9 {} max {}; max RSS {max_rss} MiB",
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.9),
        percentile(&lateness, 0.99),
        percentile(&lateness, 0.999),
        lateness.last().copied().unwrap_or(0)
    );
    engine.shutdown().await;
}
