//! The `mixed` scenario: a steady firing rate measured for lateness as
//! `steady` does, while a second client ingests new events at a steady
//! rate.
//!
//! 1. `--rate` × `--duration` events `e<n>` are scheduled, due uniformly
//!    from `--lead-ms` on (as `steady`).
//! 2. As soon as they are acknowledged, a paced stream starts: requests of
//!    `--ingest-batch` events `i<k>` at `--ingest-rate` events/s, at most
//!    `--ingest-concurrency` in flight, until the last due instant. Event
//!    `i<k>` is due `--ingest-due-after-ms` + `k` ms after the last firing
//!    instant: outside the timer window, so none fires during the run (one
//!    that did would show as an `unknown` delivery).
//! 3. The firing events' deliveries are checked as `steady`'s; the stream's
//!    acknowledged events are also counted between the first and the last
//!    due instant, with the node's CPU over that span.

use anyhow::Context;
use serde_json::json;

use crate::cli::MixedArgs;
use crate::deliveries::analyze_workload;
use crate::load::{self, Pace, PacedStream};
use crate::report::{MixedReport, Report};
use crate::scenarios::{
    Load, Meter, Session, Shape, await_deliveries, database_param, ingest_warnings, load_params,
    merge, scheduled_late,
};
use crate::workload::{BodyWriter, now_ms};

/// Sleeps until wall-clock `at_ms` (returns at once when it passed).
pub(crate) async fn sleep_until_ms(at_ms: i64) {
    let wait = at_ms - now_ms();
    if wait > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(wait.unsigned_abs())).await;
    }
}

pub async fn run(args: MixedArgs) -> anyhow::Result<Report> {
    let load = Load::from(&args.load);
    let session = Session::open(&args.node, load).await?;
    let shape = Shape::steady("mixed", &args.steady);
    let workload = shape.workload(&session.tenant, load.payload_bytes);
    let first_due = workload.due_ms.iter().copied().min().unwrap_or(0);
    let last_due = workload.due_ms.iter().copied().max().unwrap_or(0);

    session.receiver.reserve(workload.len());
    let meter = Meter::start(&session.node).await;
    let ingest = session.ingest(&workload, load, "mixed").await;
    let mut warnings = ingest_warnings(&ingest);
    warnings.extend(scheduled_late(&ingest, first_due));

    let batch = args.ingest_batch.max(1);
    let writer = BodyWriter::new(&session.tenant, load.payload_bytes);
    let stream_base =
        last_due + i64::try_from(args.ingest_due_after_ms).context("--ingest-due-after-ms")?;
    let make = move |n: usize| {
        let first = n * batch;
        let events = (first..first + batch).map(|k| (k, stream_base + k as i64));
        (writer.body("i", events), batch)
    };
    let stream = PacedStream::start(
        load::client(args.ingest_concurrency)?,
        session.node.url("/events/schedule"),
        make,
        Pace {
            rate: args.ingest_rate,
            batch,
            concurrency: args.ingest_concurrency,
            stop_at_ms: last_due,
        },
    );

    sleep_until_ms(first_due).await;
    let acked_at_first = stream.acknowledged();
    let node_at_first = session.node.sample();
    let pg_at_first = session.node.postgres_cpu().await;
    sleep_until_ms(last_due).await;
    let acked_at_last = stream.acknowledged();
    let node_at_last = session.node.sample();
    let pg_at_last = session.node.postgres_cpu().await;
    let stream = stream.finish().await?;
    if stream.ingest.failed_requests > 0 || stream.ingest.unacknowledged_events > 0 {
        warnings.push(format!(
            "the ingest stream had {} unacknowledged events ({} failed requests; first: {})",
            stream.ingest.unacknowledged_events,
            stream.ingest.failed_requests,
            stream.ingest.first_error.as_deref().unwrap_or("-")
        ));
    }

    let records = await_deliveries(
        &session.receiver,
        &workload,
        shape.grace_ms,
        "mixed delivery",
    )
    .await;
    let delivery = analyze_workload(&records, &workload);
    let measured = meter.stop(&session.node).await;

    let firing_s = ((last_due - first_due).max(1)) as f64 / 1000.0;
    let acknowledged_while_firing = acked_at_last.saturating_sub(acked_at_first);
    let mixed = MixedReport {
        stream,
        acknowledged_while_firing,
        events_per_s_while_firing: acknowledged_while_firing as f64 / firing_s,
        node_cpu_while_firing: node_at_first
            .zip(node_at_last)
            .map(|(a, b)| b.cpu_since(&a)),
        node_run_queue_wait_while_firing_s: node_at_first
            .zip(node_at_last)
            .map(|(a, b)| b.run_queue_wait_s - a.run_queue_wait_s),
        postgres_cpu_while_firing: pg_at_first
            .zip(pg_at_last)
            .map(|(a, b)| crate::database::minus(b, a)),
    };
    let params = json!({
        "ingest_rate": args.ingest_rate,
        "ingest_batch": batch,
        "ingest_concurrency": args.ingest_concurrency,
        "ingest_due_after_ms": args.ingest_due_after_ms,
        "database": database_param(&args.node),
        "node": session.node.base_url(),
    });
    let params = merge(merge(load_params(load), shape.params), params);
    let report = Report {
        ingest: Some(ingest),
        delivery: Some(delivery),
        mixed: Some(mixed),
        ..measured.report("mixed", params, warnings)
    };
    session.close().await;
    Ok(report)
}
