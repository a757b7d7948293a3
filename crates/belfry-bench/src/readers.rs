//! The `readers` scenario: many clients listing large events and reading
//! their answers slowly, next to a healthy tenant's deliveries.
//!
//! 1. A tenant `<tenant>-big` gets `--reader-events` events of
//!    `--reader-payload-bytes` each, due far in the future (never
//!    delivered); the healthy tenant `<tenant>` gets `--healthy-rate` ×
//!    `--duration` events due uniformly from instant `T` on.
//! 2. From `T` on, `--readers` clients each list the big tenant's events
//!    (`GET /v1/tenants/{t}/events?limit=1000`, one connection per page,
//!    first page again and again) and read every answer at
//!    `--read-bytes-per-s`, until the healthy tenant's last instant.
//! 3. Meanwhile the node's RSS is read every 200 ms; the healthy tenant's
//!    deliveries are checked as `steady`'s (lateness, early, missing,
//!    duplicates).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cli::ReadersArgs;
use crate::deliveries::analyze_workload;
use crate::load::Bodies;
use crate::mixed::sleep_until_ms;
use crate::report::Report;
use crate::scenarios::{
    FAR_FUTURE_MS, Load, Meter, Session, await_deliveries, database_param, events_over,
    ingest_warnings, load_params, merge, scheduled_late,
};
use crate::workload::{BodyWriter, ms_from_now, now_ms};

/// How often the node's RSS is read while the readers read.
const RSS_POLL: Duration = Duration::from_millis(200);
/// Bytes a reader takes from its socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// What the readers saw.
#[derive(Debug, Clone, Serialize)]
pub struct ReadersReport {
    pub readers: usize,
    pub reader_events: usize,
    pub reader_payload_bytes: usize,
    pub read_bytes_per_s: u64,
    /// Answers read to their end with `200`.
    pub answers_complete: u64,
    /// Answers `503` (the node's answer budget was spent).
    pub answers_busy: u64,
    /// Answers with another status, or cut off.
    pub answers_other: u64,
    pub bytes_read: u64,
    pub node_rss_at_start_bytes: Option<u64>,
    pub node_rss_max_while_reading_bytes: Option<u64>,
}

#[derive(Default)]
struct Counters {
    complete: AtomicU64,
    busy: AtomicU64,
    other: AtomicU64,
    bytes: AtomicU64,
}

/// One page, read at `bytes_per_s`; counted by its status line.
async fn read_page(
    address: &str,
    path: &str,
    bytes_per_s: u64,
    counters: &Counters,
) -> anyhow::Result<()> {
    let mut stream = TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let pause = Duration::from_secs_f64(READ_CHUNK as f64 / bytes_per_s.max(1) as f64);
    let mut buffer = vec![0u8; READ_CHUNK];
    let mut head = Vec::new();
    loop {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if head.len() < 16 {
            head.extend_from_slice(&buffer[..n.min(16)]);
        }
        tokio::time::sleep(pause).await;
    }
    let counter = if head.starts_with(b"HTTP/1.1 200") {
        &counters.complete
    } else if head.starts_with(b"HTTP/1.1 503") {
        &counters.busy
    } else {
        &counters.other
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

pub async fn run(args: ReadersArgs) -> anyhow::Result<Report> {
    let load = Load::from(&args.load);
    let session = Session::open(&args.node, load).await?;
    let big = format!("{}-big", session.tenant);
    session
        .node
        .register_tenant_props(
            &session.client,
            &big,
            json!({"url": session.receiver.url("/never")}),
        )
        .await
        .with_context(|| session.node.logs_tail())?;

    // The big tenant's events: as many per request as a 1 MiB body holds.
    let per_request = (900 * 1024 / args.reader_payload_bytes.max(1)).max(1);
    let events = args.reader_events;
    let writer = BodyWriter::new(&big, args.reader_payload_bytes);
    let far = now_ms() + FAR_FUTURE_MS;
    let bodies = Bodies::on_demand(events, events.div_ceil(per_request), move |n| {
        let first = n * per_request;
        let last = (first + per_request).min(events);
        (
            writer.body("r", (first..last).map(|k| (k, far))),
            last - first,
        )
    });
    let big_ingest = session
        .ingest_bodies(
            bodies,
            per_request,
            load.concurrency,
            "readers: large events",
        )
        .await;
    let mut warnings = ingest_warnings(&big_ingest);

    let (duration_ms, healthy_count) = events_over(args.healthy_rate, args.duration);
    let due_at = ms_from_now(args.lead_ms);
    let healthy = session.workload(healthy_count, due_at, duration_ms, load);
    let last_healthy_due = healthy.due_ms.iter().copied().max().unwrap_or(due_at);
    session.receiver.reserve(healthy.len());
    let meter = Meter::start(&session.node).await;
    let healthy_ingest = session
        .ingest(&healthy, load, "readers: healthy tenant")
        .await;
    warnings.extend(ingest_warnings(&healthy_ingest));
    warnings.extend(scheduled_late(&healthy_ingest, due_at));

    sleep_until_ms(due_at).await;
    let (at_start, rss_peak) = session.node.watch_rss(RSS_POLL);
    let counters = Arc::new(Counters::default());
    let address = session
        .node
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let path = format!("/v1/tenants/{}/events?limit=1000", big.replace('/', "%2F"));
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..args.readers {
        let (counters, address, path) = (Arc::clone(&counters), address.clone(), path.clone());
        let rate = args.read_bytes_per_s;
        readers.spawn(async move {
            while now_ms() < last_healthy_due {
                if read_page(&address, &path, rate, &counters).await.is_err() {
                    counters.other.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
    }

    let label = "readers: healthy tenant delivery";
    let records = await_deliveries(&session.receiver, &healthy, args.grace_ms, label).await;
    // Readers end with their page under way.
    while readers.join_next().await.is_some() {}
    let measured = meter.stop(&session.node).await;
    let rss_max = rss_peak.stop_with(measured.after);
    let delivery = analyze_workload(&records, &healthy);
    let readers_report = ReadersReport {
        readers: args.readers,
        reader_events: events,
        reader_payload_bytes: args.reader_payload_bytes,
        read_bytes_per_s: args.read_bytes_per_s,
        answers_complete: counters.complete.load(Ordering::Relaxed),
        answers_busy: counters.busy.load(Ordering::Relaxed),
        answers_other: counters.other.load(Ordering::Relaxed),
        bytes_read: counters.bytes.load(Ordering::Relaxed),
        node_rss_at_start_bytes: at_start.map(|s| s.rss_bytes),
        node_rss_max_while_reading_bytes: rss_max,
    };
    let params = json!({
        "readers": args.readers,
        "reader_events": events,
        "reader_payload_bytes": args.reader_payload_bytes,
        "read_bytes_per_s": args.read_bytes_per_s,
        "healthy_rate": args.healthy_rate,
        "duration_ms": duration_ms,
        "healthy_count": healthy_count,
        "lead_ms": args.lead_ms,
        "grace_ms": args.grace_ms,
        "database": database_param(&args.node),
        "node": session.node.base_url(),
    });
    let report = Report {
        ingest: Some(big_ingest),
        delivery: Some(delivery),
        readers: Some(readers_report),
        ..measured.report("readers", merge(load_params(load), params), warnings)
    };
    session.close().await;
    Ok(report)
}
