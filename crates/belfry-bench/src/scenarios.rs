//! The scenarios: each prepares a workload, drives the node, and returns a
//! [`Report`].

use std::time::Duration;

use anyhow::Context;
use belfry_testkit::{Receiver, RecordedRequest};
use serde_json::json;

use crate::cli::{
    BacklogArgs, BurstArgs, IngestArgs, LoadArgs, NodeArgs, ReceiveArgs, SteadyArgs, SteadyRate,
};
use crate::deliveries::{self, analyze_peer, analyze_workload};
use crate::load::{self, Bodies, IngestReport};
use crate::node::Node;
use crate::report::{BacklogReport, NodeReport, Report};
use crate::stats::{CpuSplit, ProcessSample, dir_size};
use crate::workload::{Workload, ms_from_now, now_ms};

/// Events far in the future are due this long after the start of the run.
pub(crate) const FAR_FUTURE_MS: i64 = 24 * 3600 * 1000;

/// Waited after the last expected delivery, so late duplicates are counted.
pub(crate) const SETTLE: Duration = Duration::from_secs(1);

/// Load settings with the scenario's defaults filled in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) batch: usize,
    pub(crate) concurrency: usize,
    pub(crate) payload_bytes: usize,
    /// Events and tenant carry delivery policies (`--policy`).
    pub(crate) policy: bool,
}

impl Load {
    pub(crate) fn from(args: &LoadArgs) -> Self {
        let batch = args.batch.unwrap_or(1000).max(1);
        // One event per request needs many connections to fill the node's
        // group commit; batches need only a few.
        let default_concurrency = if batch == 1 { 64 } else { 4 };
        Load {
            batch,
            concurrency: args.concurrency.unwrap_or(default_concurrency).max(1),
            payload_bytes: args.payload_bytes.unwrap_or(100),
            policy: args.policy,
        }
    }
}

/// A node, a receiver registered as a tenant's webhook, and a client.
pub(crate) struct Session {
    pub(crate) client: reqwest::Client,
    pub(crate) node: Node,
    pub(crate) receiver: Receiver,
    pub(crate) tenant: String,
    /// Events go through `/v1` with their own delivery policies.
    pub(crate) policy: bool,
}

impl Session {
    pub(crate) async fn open(args: &NodeArgs, load: Load) -> anyhow::Result<Self> {
        if args.with_api_key {
            load::API_KEY.get_or_init(|| {
                belfry_core::auth::KeySecret::generate()
                    .map(|k| k.expose().to_string())
                    .unwrap_or_default()
            });
        }
        let client = load::client(load.concurrency)?;
        let receiver = Receiver::start_lean().await;
        let node = Node::open(args, &client).await?;
        let tenant = args
            .tenant
            .clone()
            .unwrap_or_else(|| format!("bench-{}", now_ms()));
        node.register_tenant(&client, &tenant, &receiver.url("/hook"))
            .await
            .with_context(|| node.logs_tail())?;
        if load.policy {
            node.set_delivery_defaults(&client, &tenant, &receiver.url("/hook"))
                .await
                .with_context(|| node.logs_tail())?;
        }
        Ok(Session {
            client,
            node,
            receiver,
            tenant,
            policy: load.policy,
        })
    }

    /// `count` events over `spread_ms` from a day from now: none comes due
    /// during a run.
    pub(crate) fn far_future(&self, count: usize, spread_ms: u64, load: Load) -> Workload {
        self.workload(count, now_ms() + FAR_FUTURE_MS, spread_ms, load)
    }

    /// `count` events of the session's tenant over `spread_ms` from
    /// `first_due`.
    pub(crate) fn workload(
        &self,
        count: usize,
        first_due: i64,
        spread_ms: u64,
        load: Load,
    ) -> Workload {
        Workload::uniform(
            &self.tenant,
            count,
            first_due,
            spread_ms,
            load.payload_bytes,
        )
    }

    /// Stops the node and drops its PostgreSQL database, if any.
    pub(crate) async fn close(self) {
        self.node.close().await;
    }

    pub(crate) async fn ingest(
        &self,
        workload: &Workload,
        load: Load,
        label: &str,
    ) -> IngestReport {
        let bodies = Bodies::prebuilt(if self.policy {
            workload.v1_request_bodies(load.batch)
        } else {
            workload.request_bodies(load.batch)
        });
        self.ingest_bodies(bodies, load.batch, load.concurrency, label)
            .await
    }

    /// Sends `bodies` (of up to `batch` events each) to the node's
    /// `/events/schedule`, `concurrency` requests at a time.
    pub(crate) async fn ingest_bodies(
        &self,
        bodies: Bodies,
        batch: usize,
        concurrency: usize,
        label: &str,
    ) -> IngestReport {
        let urls = [if self.policy {
            self.node.url(&format!(
                "/v1/tenants/{}/events",
                self.tenant.replace('/', "%2F")
            ))
        } else {
            self.node.url("/events/schedule")
        }];
        load::run(&self.client, &urls, bodies, batch, concurrency, label).await
    }
}

/// `"embedded"`, or `"postgres"` for a node on `--database-url`.
pub(crate) fn database_param(node: &NodeArgs) -> &'static str {
    if node.database_url.is_some() {
        "postgres"
    } else {
        "embedded"
    }
}

pub(crate) fn load_params(load: Load) -> serde_json::Value {
    json!({"batch": load.batch, "concurrency": load.concurrency, "payload_bytes": load.payload_bytes, "policy": load.policy})
}

pub(crate) fn merge(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(base), serde_json::Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

pub(crate) fn ingest_warnings(ingest: &IngestReport) -> Vec<String> {
    let mut warnings = Vec::new();
    if ingest.unacknowledged_events > 0 {
        warnings.push(format!(
            "{} events were not acknowledged ({} failed requests; first: {})",
            ingest.unacknowledged_events,
            ingest.failed_requests,
            ingest.first_error.as_deref().unwrap_or("-")
        ));
    }
    warnings
}

pub async fn ingest(args: IngestArgs) -> anyhow::Result<Report> {
    let load = Load::from(&args.load);
    let session = Session::open(&args.node, load).await?;
    let workload = session.far_future(args.count, args.spread_ms, load);
    let meter = Meter::start(&session.node).await;
    let ingest = session.ingest(&workload, load, "ingest").await;
    let measured = meter.stop(&session.node).await;
    let params = merge(
        load_params(load),
        json!({"count": args.count, "spread_ms": args.spread_ms, "node": session.node.base_url()}),
    );
    let warnings = ingest_warnings(&ingest);
    let report = Report {
        ingest: Some(ingest),
        ..measured.report("ingest", params, warnings)
    };
    session.close().await;
    Ok(report)
}

/// The node's, PostgreSQL's (a node on `--database-url`) and this tool's
/// resource use over a measured span.
pub(crate) struct Meter {
    node: Option<ProcessSample>,
    postgres: Option<CpuSplit>,
    bench: Option<ProcessSample>,
}

/// What a [`Meter`] measured.
pub(crate) struct Measured {
    /// The node at the end of the span.
    pub(crate) after: Option<ProcessSample>,
    node: Option<NodeReport>,
    postgres_cpu: Option<CpuSplit>,
    bench_cpu: Option<CpuSplit>,
}

impl Meter {
    pub(crate) async fn start(node: &Node) -> Meter {
        Meter {
            node: node.sample(),
            postgres: node.postgres_cpu().await,
            bench: own_sample(),
        }
    }

    pub(crate) async fn stop(self, node: &Node) -> Measured {
        let after = node.sample();
        let postgres_cpu = match (node.postgres_cpu().await, self.postgres) {
            (Some(after), Some(before)) => Some(crate::database::minus(after, before)),
            _ => None,
        };
        Measured {
            after,
            node: NodeReport::over(self.node, after),
            postgres_cpu,
            bench_cpu: own_cpu_since(self.bench),
        }
    }
}

impl Measured {
    /// The scenario's report with the span's resource use; the scenario
    /// fills in what else it measured.
    pub(crate) fn report(
        self,
        scenario: &'static str,
        params: serde_json::Value,
        warnings: Vec<String>,
    ) -> Report {
        Report {
            scenario,
            params,
            warnings,
            node: self.node,
            postgres_cpu: self.postgres_cpu,
            bench_cpu: self.bench_cpu,
            ..Report::default()
        }
    }
}

/// Waits until every event of `workload` arrived, at most `grace_ms` past
/// its last due instant, then [`SETTLE`] for late duplicates.
pub(crate) async fn await_deliveries(
    receiver: &Receiver,
    workload: &Workload,
    grace_ms: u64,
    label: &str,
) -> Vec<RecordedRequest> {
    let last_due = workload.due_ms.iter().copied().max().unwrap_or(0);
    let deadline = last_due.saturating_add(i64::try_from(grace_ms).unwrap_or(i64::MAX));
    deliveries::wait_for(
        receiver,
        workload.len(),
        deadline,
        SETTLE,
        label,
        |records| analyze_workload(records, workload).delivered,
    )
    .await
}

/// The warning when scheduling ended after the first event came due.
pub(crate) fn scheduled_late(ingest: &IngestReport, first_due: i64) -> Option<String> {
    (ingest.finished_at_ms > first_due).then(|| {
        format!(
            "scheduling finished {} ms after the first due instant (raise --lead-ms)",
            ingest.finished_at_ms - first_due
        )
    })
}

/// When a scenario's events come due: `count` of them spread over
/// `spread_ms`, the first `lead_ms` after scheduling starts.
pub(crate) struct Shape {
    pub(crate) scenario: &'static str,
    pub(crate) count: usize,
    pub(crate) lead_ms: u64,
    pub(crate) spread_ms: u64,
    pub(crate) grace_ms: u64,
    /// The settings, for the report.
    pub(crate) params: serde_json::Value,
}

impl Shape {
    /// `rate` events/s coming due for `duration`.
    pub(crate) fn steady(scenario: &'static str, steady: &SteadyRate) -> Shape {
        let (duration_ms, count) = events_over(steady.rate, steady.duration);
        let lead_ms = steady.lead_ms.unwrap_or_else(|| default_lead_ms(count));
        let grace_ms = steady.grace_ms;
        Shape {
            scenario,
            count,
            lead_ms,
            spread_ms: duration_ms,
            grace_ms,
            params: json!({"rate": steady.rate, "duration_ms": duration_ms, "count": count, "lead_ms": lead_ms, "grace_ms": grace_ms}),
        }
    }

    /// `count` events due at one instant.
    pub(crate) fn burst(
        scenario: &'static str,
        count: usize,
        lead_ms: Option<u64>,
        grace_ms: u64,
    ) -> Shape {
        let lead_ms = lead_ms.unwrap_or_else(|| default_lead_ms(count));
        Shape {
            scenario,
            count,
            lead_ms,
            spread_ms: 0,
            grace_ms,
            params: json!({"count": count, "lead_ms": lead_ms, "grace_ms": grace_ms}),
        }
    }

    /// The events of `tenant`, the first due `lead_ms` from now.
    pub(crate) fn workload(&self, tenant: &str, payload_bytes: usize) -> Workload {
        let first_due = ms_from_now(self.lead_ms);
        Workload::uniform(tenant, self.count, first_due, self.spread_ms, payload_bytes)
    }
}

/// `duration` in ms, and how many events `rate` per second make over it.
pub(crate) fn events_over(rate: u64, duration: Duration) -> (u64, usize) {
    let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let count = usize::try_from(rate.saturating_mul(duration_ms) / 1000).unwrap_or(usize::MAX);
    (duration_ms, count)
}

pub(crate) fn own_sample() -> Option<ProcessSample> {
    ProcessSample::read(std::process::id())
}

pub(crate) fn own_cpu_since(before: Option<ProcessSample>) -> Option<CpuSplit> {
    before.zip(own_sample()).map(|(b, a)| a.cpu_since(&b))
}

/// Default time from scheduling to the first due instant: room to ingest
/// at 20k events/s, plus 5 s.
pub(crate) fn default_lead_ms(count: usize) -> u64 {
    5_000 + count as u64 / 20
}

/// Schedules `workload`, waits for its deliveries, and reports both.
async fn schedule_and_deliver(
    session: &Session,
    workload: &Workload,
    load: Load,
    grace_ms: u64,
    scenario: &'static str,
    params: serde_json::Value,
) -> Report {
    session.receiver.reserve(workload.len());
    let meter = Meter::start(&session.node).await;
    let ingest = session.ingest(workload, load, scenario).await;
    let mut warnings = ingest_warnings(&ingest);
    let first_due = workload.due_ms.iter().copied().min().unwrap_or(0);
    if ingest.finished_at_ms > first_due {
        warnings.push(format!(
            "ingest finished {} ms after the first due instant: early lateness includes ingest contention (raise --lead-ms)",
            ingest.finished_at_ms - first_due
        ));
    }
    let label = format!("{scenario} delivery");
    let records = await_deliveries(&session.receiver, workload, grace_ms, &label).await;
    let delivery = analyze_workload(&records, workload);
    let measured = meter.stop(&session.node).await;
    let params = merge(
        merge(load_params(load), params),
        json!({"node": session.node.base_url()}),
    );
    Report {
        ingest: Some(ingest),
        delivery: Some(delivery),
        ..measured.report(scenario, params, warnings)
    }
}

pub async fn steady(args: SteadyArgs) -> anyhow::Result<Report> {
    deliver(
        Shape::steady("steady", &args.steady),
        &args.load,
        &args.node,
    )
    .await
}

pub async fn burst(args: BurstArgs) -> anyhow::Result<Report> {
    let shape = Shape::burst("burst", args.count, args.lead_ms, args.grace_ms);
    deliver(shape, &args.load, &args.node).await
}

/// Schedules the shape's events on a fresh session and waits for them.
async fn deliver(shape: Shape, load: &LoadArgs, node: &NodeArgs) -> anyhow::Result<Report> {
    let load = Load::from(load);
    let session = Session::open(node, load).await?;
    let workload = shape.workload(&session.tenant, load.payload_bytes);
    let params = merge(shape.params, json!({"database": database_param(node)}));
    let report = schedule_and_deliver(
        &session,
        &workload,
        load,
        shape.grace_ms,
        shape.scenario,
        params,
    )
    .await;
    session.close().await;
    Ok(report)
}

pub async fn backlog(args: BacklogArgs) -> anyhow::Result<Report> {
    let load = Load::from(&args.load);
    let mut session = Session::open(&args.node, load).await?;
    let workload = session.far_future(args.count, args.spread_ms, load);
    let before = session.node.sample();
    let bench_before = own_sample();
    let ingest = session.ingest(&workload, load, "backlog").await;
    let mut warnings = ingest_warnings(&ingest);
    let loaded = session.node.sample();
    let bench_cpu = own_cpu_since(bench_before);
    let data_dir = session
        .node
        .data_dir()
        .filter(|_| args.node.database_url.is_none());
    let (data_dir_bytes, data_dir_allocated_bytes) = match data_dir {
        Some(dir) => dir_size(dir).with_context(|| format!("measure {}", dir.display()))?,
        None => {
            warnings.push("--target or --database-url node: data dir size not measured".into());
            (0, 0)
        }
    };
    let pending = ingest.acknowledged_events;
    let restart = if args.no_restart {
        None
    } else {
        session.node.kill_9_and_restart().await?
    };
    let mut rss_after_restart = None;
    if restart.is_some() {
        tokio::time::sleep(Duration::from_secs(2)).await;
        rss_after_restart = session.node.sample().map(|s| s.rss_bytes);
        let (found, checked) = spot_check(
            &session.client,
            &session.node,
            &session.tenant,
            workload.len(),
        )
        .await;
        if found < checked {
            warnings.push(format!(
                "after the restart only {found} of {checked} sampled acknowledged events were found"
            ));
        }
    }
    let report = Report {
        scenario: "backlog",
        params: merge(
            load_params(load),
            json!({"count": args.count, "spread_ms": args.spread_ms, "node": session.node.base_url(), "database": database_param(&args.node)}),
        ),
        warnings,
        ingest: Some(ingest),
        node: NodeReport::over(before, loaded),
        backlog: Some(BacklogReport {
            pending_events: pending,
            data_dir_bytes,
            data_dir_allocated_bytes,
            bytes_per_event: data_dir_allocated_bytes as f64 / pending.max(1) as f64,
            rss_before_restart_bytes: loaded.map(|s| s.rss_bytes),
            restart_to_serving_ms: restart.map(|d| d.as_secs_f64() * 1000.0),
            rss_after_restart_bytes: rss_after_restart,
        }),
        bench_cpu,
        ..Report::default()
    };
    session.close().await;
    Ok(report)
}

/// Looks up 20 events `e<n>` spread over `count` with `GET
/// /events/find`; returns `(found, checked)`.
pub(crate) async fn spot_check(
    client: &reqwest::Client,
    node: &Node,
    tenant: &str,
    count: usize,
) -> (usize, usize) {
    let samples = 20.min(count);
    let mut found = 0;
    for k in 0..samples {
        let url = format!(
            "{}?id=e{}&tenant={}",
            node.url("/events/find"),
            k * count / samples.max(1),
            percent_encode(tenant)
        );
        let ok = client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        found += usize::from(ok);
    }
    (found, samples)
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub(crate) fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn receive(args: ReceiveArgs) -> anyhow::Result<Report> {
    let receiver = Receiver::start_on_port(args.port, false)
        .await
        .with_context(|| format!("listen on 127.0.0.1:{}", args.port))?;
    eprintln!(
        "belfry-bench: receiving on {} ; expecting {} deliveries",
        receiver.url("/hook"),
        args.expect
    );
    let timeout_ms = i64::try_from(args.timeout.as_millis()).unwrap_or(i64::MAX);
    let records = deliveries::wait_for(
        &receiver,
        args.expect,
        now_ms().saturating_add(timeout_ms),
        SETTLE,
        "receive",
        |records| analyze_peer(records, args.expect).delivered,
    )
    .await;
    Ok(Report {
        scenario: "receive",
        params: json!({"port": receiver.addr().port(), "expect": args.expect}),
        delivery: Some(analyze_peer(&records, args.expect)),
        warnings: Vec::new(),
        ..Report::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_are_percent_encoded() {
        assert_eq!(percent_encode("a/b c-1"), "a%2Fb%20c-1");
    }
}
