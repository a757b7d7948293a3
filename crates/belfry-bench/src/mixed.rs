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
use crate::deliveries::{self, analyze_workload};
use crate::load::{self, PacedStream};
use crate::report::{MixedReport, NodeReport, Report};
use crate::scenarios::{
    Load, SETTLE, Session, database_param, default_lead_ms, ingest_warnings, load_params, merge,
    own_cpu_since, own_sample, pg_since,
};
use crate::workload::{BodyWriter, Workload, now_ms};

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
    let duration_ms = u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX);
    let count = usize::try_from(args.rate.saturating_mul(duration_ms) / 1000).unwrap_or(usize::MAX);
    let lead_ms = args.lead_ms.unwrap_or_else(|| default_lead_ms(count));
    let workload = Workload::uniform(
        &session.tenant,
        count,
        now_ms() + i64::try_from(lead_ms).unwrap_or(i64::MAX),
        duration_ms,
        load.payload_bytes,
    );
    let first_due = workload.due_ms.iter().copied().min().unwrap_or(0);
    let last_due = workload.due_ms.iter().copied().max().unwrap_or(0);

    session.receiver.reserve(workload.len());
    let before = session.node.sample();
    let pg_before = session.node.postgres_cpu().await;
    let bench_before = own_sample();
    let ingest = session.ingest(&workload, load, "mixed").await;
    let mut warnings = ingest_warnings(&ingest);
    if ingest.finished_at_ms > first_due {
        warnings.push(format!(
            "scheduling finished {} ms after the first due instant (raise --lead-ms)",
            ingest.finished_at_ms - first_due
        ));
    }

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
        args.ingest_rate,
        batch,
        args.ingest_concurrency,
        last_due,
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

    let deadline = last_due.saturating_add(i64::try_from(args.grace_ms).unwrap_or(i64::MAX));
    let records = deliveries::wait_for(
        &session.receiver,
        workload.len(),
        deadline,
        SETTLE,
        "mixed delivery",
        |records| analyze_workload(records, &workload).delivered,
    )
    .await;
    let delivery = analyze_workload(&records, &workload);
    let after = session.node.sample();
    let postgres_cpu = pg_since(&session, pg_before).await;
    let bench_cpu = own_cpu_since(bench_before);

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
        "rate": args.rate,
        "duration_ms": duration_ms,
        "count": count,
        "lead_ms": lead_ms,
        "grace_ms": args.grace_ms,
        "ingest_rate": args.ingest_rate,
        "ingest_batch": batch,
        "ingest_concurrency": args.ingest_concurrency,
        "ingest_due_after_ms": args.ingest_due_after_ms,
        "database": database_param(&args.node),
        "node": session.node.base_url(),
    });
    let report = Report {
        scenario: "mixed",
        params: merge(load_params(load), params),
        warnings,
        ingest: Some(ingest),
        delivery: Some(delivery),
        node: before.zip(after).map(|(b, a)| NodeReport::between(&b, &a)),
        backlog: None,
        cluster: None,
        mixed: Some(mixed),
        hung: None,
        readers: None,
        kafka: None,
        pull: None,
        postgres_cpu,
        load_average_before: None,
        load_average_after: None,
        bench_cpu,
    };
    session.close().await;
    Ok(report)
}
