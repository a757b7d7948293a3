//! The `hung` scenario: tenants whose webhook never answers, millions of
//! their events due at once, and a healthy tenant next to them.
//!
//! 1. The hung endpoint is a TCP listener on loopback that accepts every
//!    connection, reads (and discards) what arrives, and never writes: each
//!    delivery to it waits for the tenant's timeout. It only counts
//!    connections and bytes, so its memory does not grow with the events.
//! 2. `--hung-tenants` tenants `<tenant>-hung<i>` are registered with it
//!    as their webhook and `timeout_ms` = `--hung-timeout-ms` (the node caps
//!    it at `http.max_tenant_timeout_ms`); the healthy tenant `<tenant>`
//!    with the bench's lean receiver.
//! 3. The healthy tenant's `--healthy-rate` × `--duration` events are
//!    scheduled first, due uniformly from instant `T` on; then
//!    `--hung-events` events `h<k>` per hung tenant, all due at `T`, their
//!    request bodies made as they are sent (requests alternate over the
//!    hung tenants).
//! 4. From `T` on the node's RSS is read every 500 ms; the healthy
//!    tenant's deliveries are checked as `steady`'s (lateness, early,
//!    missing, duplicates).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use crate::cli::HungArgs;
use crate::deliveries::analyze_workload;
use crate::load::Bodies;
use crate::mixed::sleep_until_ms;
use crate::report::{HungReport, Report};
use crate::scenarios::{
    Load, Meter, Session, await_deliveries, database_param, events_over, ingest_warnings,
    load_params, merge,
};
use crate::workload::{BodyWriter, ms_from_now};

/// How often the node's RSS is read while the hung events are due.
const RSS_POLL: Duration = Duration::from_millis(500);

/// What the hung endpoint saw.
#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    with_request: AtomicU64,
    open: AtomicU64,
    open_max: AtomicU64,
    bytes: AtomicU64,
}

/// A webhook that accepts connections and never answers.
struct HungEndpoint {
    addr: SocketAddr,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl HungEndpoint {
    async fn start() -> anyhow::Result<HungEndpoint> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the hung endpoint")?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(accept(listener, Arc::clone(&counters)));
        Ok(HungEndpoint {
            addr,
            counters,
            task,
        })
    }

    fn url(&self) -> String {
        format!("http://{}/hung", self.addr)
    }
}

impl Drop for HungEndpoint {
    fn drop(&mut self) {
        // Dropping the accept task drops its connections with it.
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, counters: Arc<Counters>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    counters.accepted.fetch_add(1, Ordering::Relaxed);
                    let open = counters.open.fetch_add(1, Ordering::Relaxed) + 1;
                    counters.open_max.fetch_max(open, Ordering::Relaxed);
                    connections.spawn(hold(stream, Arc::clone(&counters)));
                }
                // Out of file descriptors, most likely: wait for some to close.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Reads until the peer closes; never writes.
async fn hold(mut stream: TcpStream, counters: Arc<Counters>) {
    let mut buffer = [0u8; 1024];
    let mut requested = false;
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if !requested {
            requested = true;
            counters.with_request.fetch_add(1, Ordering::Relaxed);
        }
    }
    counters.open.fetch_sub(1, Ordering::Relaxed);
}

/// Default time from scheduling to the hung events' instant: room to
/// ingest at 50k events/s, plus 10 s.
fn default_lead_ms(events: usize) -> u64 {
    10_000 + events as u64 / 50
}

pub async fn run(args: HungArgs) -> anyhow::Result<Report> {
    let load = Load::from(&args.load);
    let session = Session::open(&args.node, load).await?;
    let endpoint = HungEndpoint::start().await?;
    let tenants = args.hung_tenants.max(1);
    let hung_names: Vec<String> = (0..tenants)
        .map(|i| format!("{}-hung{i}", session.tenant))
        .collect();
    for name in &hung_names {
        session
            .node
            .register_tenant_props(
                &session.client,
                name,
                json!({"url": endpoint.url(), "timeout_ms": args.hung_timeout_ms}),
            )
            .await
            .with_context(|| session.node.logs_tail())?;
    }

    let (duration_ms, healthy_count) = events_over(args.healthy_rate, args.duration);
    let per_tenant = args.hung_events;
    let hung_total = per_tenant.saturating_mul(tenants);
    let lead_ms = args
        .lead_ms
        .unwrap_or_else(|| default_lead_ms(hung_total + healthy_count));
    let due_at = ms_from_now(lead_ms);
    let healthy = session.workload(healthy_count, due_at, duration_ms, load);

    session.receiver.reserve(healthy.len());
    let meter = Meter::start(&session.node).await;
    let healthy_ingest = session.ingest(&healthy, load, "hung: healthy tenant").await;
    let mut warnings = ingest_warnings(&healthy_ingest);

    let batch = load.batch;
    let requests_per_tenant = per_tenant.div_ceil(batch);
    let writers: Vec<BodyWriter> = hung_names
        .iter()
        .map(|name| BodyWriter::new(name, load.payload_bytes))
        .collect();
    let bodies = Bodies::on_demand(hung_total, requests_per_tenant * tenants, move |n| {
        let (tenant, chunk) = (n % tenants, n / tenants);
        let first = chunk * batch;
        let last = (first + batch).min(per_tenant);
        let events = (first..last).map(|k| (k, due_at));
        (writers[tenant].body("h", events), last - first)
    });
    let hung_ingest = session
        .ingest_bodies(bodies, batch, load.concurrency, "hung: hung tenants")
        .await;
    warnings.extend(ingest_warnings(&hung_ingest));
    if hung_ingest.finished_at_ms > due_at {
        warnings.push(format!(
            "scheduling finished {} ms after the hung events' instant (raise --lead-ms): the healthy tenant's first events came due during ingest",
            hung_ingest.finished_at_ms - due_at
        ));
    }

    sleep_until_ms(due_at).await;
    let (at_due, rss_peak) = session.node.watch_rss(RSS_POLL);
    let label = "hung: healthy tenant delivery";
    let records = await_deliveries(&session.receiver, &healthy, args.grace_ms, label).await;
    let measured = meter.stop(&session.node).await;
    let after = measured.after;
    let rss_max = rss_peak.stop_with(after);
    let delivery = analyze_workload(&records, &healthy);
    let counters = &endpoint.counters;
    let hung = HungReport {
        hung_tenants: tenants,
        events_per_hung_tenant: per_tenant,
        hung_timeout_ms: args.hung_timeout_ms,
        hung_due_at_ms: due_at,
        healthy_rate: args.healthy_rate,
        healthy_ingest,
        node_cpu_while_due: at_due.zip(after).map(|(a, b)| b.cpu_since(&a)),
        node_run_queue_wait_while_due_s: at_due
            .zip(after)
            .map(|(a, b)| b.run_queue_wait_s - a.run_queue_wait_s),
        node_rss_max_while_due_bytes: rss_max,
        connections_accepted: counters.accepted.load(Ordering::Relaxed),
        connections_with_request: counters.with_request.load(Ordering::Relaxed),
        connections_open_max: counters.open_max.load(Ordering::Relaxed),
        connections_open_at_end: counters.open.load(Ordering::Relaxed),
        bytes_received: counters.bytes.load(Ordering::Relaxed),
    };
    let params = json!({
        "hung_tenants": tenants,
        "hung_events": per_tenant,
        "hung_timeout_ms": args.hung_timeout_ms,
        "healthy_rate": args.healthy_rate,
        "duration_ms": duration_ms,
        "healthy_count": healthy_count,
        "lead_ms": lead_ms,
        "grace_ms": args.grace_ms,
        "database": database_param(&args.node),
        "node": session.node.base_url(),
    });
    let report = Report {
        ingest: Some(hung_ingest),
        delivery: Some(delivery),
        hung: Some(hung),
        ..measured.report("hung", merge(load_params(load), params), warnings)
    };
    drop(endpoint);
    session.close().await;
    Ok(report)
}
