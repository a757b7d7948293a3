//! The `pull` scenarios: workers of a pull tenant (`docs/pull.md`)
//! claiming leases over HTTP and completing each.
//!
//! 1. The node (started, `--database-url`, or `--target`; or `--nodes N`
//!    nodes on one PostgreSQL database, the `cluster` scenario's harness)
//!    gets a `PULL` tenant; the events `e<n>` are scheduled through
//!    `POST /events/schedule` as in the other scenarios (round-robin over
//!    the nodes).
//! 2. `--workers` workers each loop: `POST /v1/tenants/{t}/leases`
//!    (`max_events`, `wait_ms`: a long-poll), then one
//!    `POST /v1/leases/{id}/complete` per lease, all of a batch at once (so
//!    the node's group commit can batch them), then claim again.
//! 3. Per lease the worker keeps the node's lateness (`leased_at` −
//!    `due_at`, both the node's clock) and its own (arrival of the claim's
//!    answer − the instant the event was scheduled for, this machine's
//!    wall clock); per call, its latency.
//!
//! With `--batch-complete` a worker completes a claim's leases in one
//! `POST /v1/tenants/{t}/leases/complete` instead.
//!
//! `lateness`: events come due at `--rate` for `--duration` while the
//! workers wait. `throughput`: `--count` events due at one instant, the
//! workers start claiming then; claim-and-complete events/s from the first
//! claim to the last complete, and the node's CPU per event.
//!
//! The run ends when every event was completed once, or at its deadline;
//! the workers' open long-polls are dropped then (the node abandons them).
//!
//! With `--nodes N`, worker `i` claims and completes on node `i mod N`;
//! a claim reaches the other nodes' ready entries (`docs/pull.md`, "In a
//! cluster"), so fewer workers than nodes (`--workers 1`) measure
//! cross-node claims and forwarded completions.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Notify;

use belfry_testkit::BelfryProcess;

use crate::cli::{PullArgs, PullCommonArgs, PullMode};
use crate::cluster::{Cluster, Launch, sample_nodes, sum_between};
use crate::database::{Database, PostgresCpu};
use crate::load::{self, Bodies, IngestReport};
use crate::mixed::sleep_until_ms;
use crate::node::{Node, partitions_arg};
use crate::report::{NodeReport, Report, percentiles};
use crate::scenarios::{
    Load, database_param, default_lead_ms, ingest_warnings, load_params, merge, own_cpu_since,
    own_sample, percent_encode,
};
use crate::stats::{CpuSplit, Percentiles, ProcessSample};
use crate::workload::{Workload, ms_from_now, now_ms, parse_instant_ms};

/// The targets: lateness on one node and in a cluster,
/// throughput on one node.
const LATENESS_P99_TARGET_MS: f64 = 10.0;
const CLUSTER_LATENESS_P99_TARGET_MS: f64 = 50.0;
const THROUGHPUT_TARGET_EVENTS_PER_S: f64 = 20_000.0;

/// A worker pauses this long after a failed claim before the next.
const ERROR_PAUSE: Duration = Duration::from_millis(20);

/// What a `pull` run measured beyond ingest.
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    /// `lateness` or `throughput`.
    pub mode: &'static str,
    pub workers: usize,
    pub max_events: u32,
    pub wait_ms: u64,
    pub lease_ms: u64,
    /// A claim's leases were completed in one batch request.
    pub batch_complete: bool,
    /// Events scheduled and acknowledged.
    pub events: usize,
    /// Events completed (`200` to a complete), each counted once.
    pub completed: usize,
    /// Events never leased before the deadline.
    pub missing: usize,
    /// Leases beyond the first of an event (an expiry, a lost answer).
    pub duplicate_leases: u64,
    /// Leases granted before the event's instant (must be 0).
    pub early: u64,
    pub claims: u64,
    /// Claims answered with no lease (their wait ended).
    pub empty_claims: u64,
    pub claim_errors: u64,
    pub complete_errors: u64,
    pub first_error: Option<String>,
    /// Leases per claim answered with at least one.
    pub leases_per_claim: f64,
    /// `leased_at` − `due_at` of each lease, the node's clock, ms.
    pub lease_lateness_ms: Option<Percentiles>,
    /// Arrival of the claim's answer at the worker − the event's scheduled
    /// instant, this machine's clock, ms: what a worker experiences.
    pub received_lateness_ms: Option<Percentiles>,
    /// Latency of claims that carried leases, ms (a long-poll's wait
    /// included).
    pub claim_latency_ms: Option<Percentiles>,
    pub complete_latency_ms: Option<Percentiles>,
    /// From the first claim to the last complete answered.
    pub seconds: f64,
    /// Events completed per second over `seconds`.
    pub events_per_s: f64,
    /// The node's CPU over the same span, and per completed event.
    pub node_cpu: Option<CpuSplit>,
    pub node_cpu_per_event_us: Option<f64>,
    /// The workers' (this tool's) CPU per completed event.
    pub bench_cpu_per_event_us: Option<f64>,
    /// The node's own pull counters at the end (`GET /metrics`), when it
    /// exports them: refusals at the ready bound, `lease_lost` answers.
    pub node_pull_metrics: Option<Value>,
    /// The target for this mode, and whether the run met it.
    pub target: String,
    pub target_met: bool,
}

/// Counters and samples the workers share.
#[derive(Default)]
struct Tally {
    claims: AtomicU64,
    empty_claims: AtomicU64,
    claim_errors: AtomicU64,
    complete_errors: AtomicU64,
    leases: AtomicU64,
    duplicate_leases: AtomicU64,
    early: AtomicU64,
    completed: AtomicUsize,
    last_complete_ms: AtomicI64,
    first_error: Mutex<Option<String>>,
    samples: Mutex<Samples>,
}

#[derive(Default)]
struct Samples {
    /// Per event index: leases seen, completes succeeded.
    leased: Vec<u32>,
    done: Vec<bool>,
    lease_late_ms: Vec<i64>,
    received_late_ms: Vec<i64>,
    claim_latency_us: Vec<i64>,
    complete_latency_us: Vec<i64>,
}

impl Tally {
    fn new(events: usize) -> Self {
        let tally = Tally::default();
        {
            let mut samples = lock(&tally.samples);
            samples.leased = vec![0; events];
            samples.done = vec![false; events];
        }
        tally
    }

    fn error(&self, text: String) {
        lock(&self.first_error).get_or_insert(text);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A worker that panicked leaves usable counters.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What every worker needs.
struct Crew {
    client: reqwest::Client,
    /// Every node's base URL; worker `i` works on node `i mod N`.
    base_urls: Vec<String>,
    /// The tenant, percent-encoded for paths.
    tenant_path: String,
    common: PullCommonArgs,
    workload: Workload,
    tally: Tally,
    stop: AtomicBool,
    all_done: Notify,
}

pub async fn run(args: PullArgs) -> anyhow::Result<Report> {
    match args.mode {
        PullMode::Lateness(args) => {
            let count = usize::try_from(
                args.rate
                    .saturating_mul(u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX))
                    / 1000,
            )
            .unwrap_or(usize::MAX);
            let spread_ms = u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX);
            let params = json!({"rate": args.rate, "duration_ms": spread_ms});
            measure("lateness", &args.common, count, spread_ms, params).await
        }
        PullMode::Throughput(args) => {
            let params = json!({});
            measure("throughput", &args.common, args.count, 0, params).await
        }
    }
}

/// Schedules `count` events due over `spread_ms` from the lead on, runs
/// the workers from the first due instant, and reports.
async fn measure(
    mode: &'static str,
    common: &PullCommonArgs,
    count: usize,
    spread_ms: u64,
    mode_params: Value,
) -> anyhow::Result<Report> {
    let load = Load::from(&common.load);
    if common.node.with_api_key {
        load::API_KEY.get_or_init(|| {
            belfry_core::auth::KeySecret::generate()
                .map(|k| k.expose().to_string())
                .unwrap_or_default()
        });
    }
    let connections = common.workers * (common.max_events as usize + 1) + load.concurrency;
    let client = load::client(connections)?;
    let nodes = Nodes::open(common, &client).await?;
    let tenant = common
        .node
        .tenant
        .clone()
        .unwrap_or_else(|| format!("bench-pull-{}", now_ms()));
    let first_node = Node::Running {
        base_url: nodes.base_urls()[0].clone(),
        pid: None,
    };
    first_node
        .register_tenant_config(
            &client,
            &json!({"tenant": tenant, "type": "PULL", "props": {}}),
        )
        .await
        .with_context(|| nodes.logs_tail())?;

    let lead_ms = common.lead_ms.unwrap_or_else(|| default_lead_ms(count));
    let first_due = ms_from_now(lead_ms);
    let workload = Workload::uniform(&tenant, count, first_due, spread_ms, load.payload_bytes);
    let last_due = workload.due_ms.iter().copied().max().unwrap_or(first_due);
    let bodies = Bodies::prebuilt(workload.request_bodies(load.batch));
    let schedule_urls: Vec<String> = nodes
        .base_urls()
        .iter()
        .map(|base| format!("{base}/events/schedule"))
        .collect();
    let ingest = load::run(
        &client,
        &schedule_urls,
        bodies,
        load.batch,
        load.concurrency,
        mode,
    )
    .await;
    let mut warnings = ingest_warnings(&ingest);
    if ingest.finished_at_ms > first_due {
        warnings.push(format!(
            "ingest finished {} ms after the first due instant (raise --lead-ms)",
            ingest.finished_at_ms - first_due
        ));
    }

    let crew = Arc::new(Crew {
        client,
        base_urls: nodes.base_urls(),
        tenant_path: percent_encode(&tenant),
        common: common.clone(),
        tally: Tally::new(workload.len()),
        workload,
        stop: AtomicBool::new(false),
        all_done: Notify::new(),
    });
    // Lateness: the workers are waiting before anything is due.
    // Throughput: they start at the instant, on a backlog.
    if mode == "throughput" {
        sleep_until_ms(first_due).await;
    }
    let node_before = nodes.samples(&[]);
    let pg_before = nodes.postgres_cpu().await;
    let bench_before = own_sample();
    let started_ms = now_ms();
    let mut workers = tokio::task::JoinSet::new();
    for index in 0..common.workers {
        workers.spawn(work(Arc::clone(&crew), index));
    }
    let deadline = last_due.saturating_add(i64::try_from(common.grace_ms).unwrap_or(i64::MAX));
    let expected = usize::try_from(ingest.acknowledged_events).unwrap_or(usize::MAX);
    wait_done(&crew, expected, deadline).await;
    crew.stop.store(true, Ordering::Relaxed);
    // Drops the long-polls still open: the node abandons those claims.
    workers.shutdown().await;
    let node_after = nodes.samples(&node_before);
    let postgres_cpu = match (nodes.postgres_cpu().await, pg_before) {
        (Some(after), Some(before)) => Some(crate::database::minus(after, before)),
        _ => None,
    };
    let bench_cpu = own_cpu_since(bench_before);
    let node_pull_metrics = scrape_pull_metrics(&crew.client, &crew.base_urls[0]).await;
    let node_cpu = (node_before.iter().all(Option::is_some) && !node_before.is_empty())
        .then(|| sum_between(&node_before, &node_after));

    let pull = summarize(
        mode,
        &crew,
        &ingest,
        started_ms,
        node_cpu,
        bench_cpu,
        node_pull_metrics,
    );
    if pull.missing > 0 {
        warnings.push(format!(
            "{} events were not completed by the deadline",
            pull.missing
        ));
    }
    if pull.early > 0 {
        warnings.push(format!("{} leases were granted early", pull.early));
    }
    let report = Report {
        scenario: if mode == "lateness" {
            "pull-lateness"
        } else {
            "pull-throughput"
        },
        params: merge(
            merge(load_params(load), mode_params),
            json!({
                "count": count, "lead_ms": lead_ms, "grace_ms": common.grace_ms,
                "workers": common.workers, "max_events": common.max_events,
                "wait_ms": common.wait_ms, "lease_ms": common.lease_ms,
                "batch_complete": common.batch_complete,
                "nodes": nodes.base_urls(), "database": nodes.database(common),
            }),
        ),
        warnings,
        ingest: Some(ingest),
        // One node: its RSS and CPU; several: their CPU is in `pull`.
        node: match (node_before.as_slice(), node_after.as_slice()) {
            ([Some(before)], [Some(after)]) => Some(NodeReport::between(before, after)),
            _ => None,
        },
        pull: Some(pull),
        postgres_cpu,
        bench_cpu,
        ..Report::default()
    };
    nodes.close().await;
    Ok(report)
}

/// The node or nodes under test.
enum Nodes {
    One(Node),
    /// `--nodes N`: the `cluster` scenario's harness.
    Cluster {
        cluster: Cluster,
        database: Database,
        postgres_cpu: Option<PostgresCpu>,
    },
}

impl Nodes {
    async fn open(common: &PullCommonArgs, client: &reqwest::Client) -> anyhow::Result<Nodes> {
        if common.nodes <= 1 {
            return Ok(Nodes::One(Node::open(&common.node, client).await?));
        }
        let database = Database::create(common.node.database_url.as_deref()).await?;
        let launch = Launch {
            belfry_bin: common.node.belfry_bin.as_ref(),
            nodes: common.nodes,
            node_args: &common.node.node_args,
            node_env: &common.node.node_env,
        };
        let cluster = Cluster::start(&launch, &database.url).await?;
        cluster
            .wait_settled(
                client,
                usize::from(common.nodes),
                partitions_arg(&common.node.node_args),
            )
            .await?;
        let postgres_cpu = PostgresCpu::start(&database.url).await;
        Ok(Nodes::Cluster {
            cluster,
            database,
            postgres_cpu,
        })
    }

    fn base_urls(&self) -> Vec<String> {
        match self {
            Nodes::One(node) => vec![node.base_url()],
            Nodes::Cluster { cluster, .. } => {
                cluster.nodes.iter().map(BelfryProcess::base_url).collect()
            }
        }
    }

    /// Each node's resource use now (a node that died keeps `previous`).
    fn samples(&self, previous: &[Option<ProcessSample>]) -> Vec<Option<ProcessSample>> {
        match self {
            Nodes::One(node) => vec![node.sample()],
            Nodes::Cluster { cluster, .. } => sample_nodes(cluster, previous),
        }
    }

    async fn postgres_cpu(&self) -> Option<CpuSplit> {
        match self {
            Nodes::One(node) => node.postgres_cpu().await,
            Nodes::Cluster { postgres_cpu, .. } => Some(postgres_cpu.as_ref()?.total().await),
        }
    }

    fn database(&self, common: &PullCommonArgs) -> &'static str {
        match self {
            Nodes::One(_) => database_param(&common.node),
            Nodes::Cluster { .. } => "postgres",
        }
    }

    fn logs_tail(&self) -> String {
        match self {
            Nodes::One(node) => node.logs_tail(),
            Nodes::Cluster { cluster, .. } => cluster
                .nodes
                .first()
                .map(|n| n.logs_tail(20))
                .unwrap_or_default(),
        }
    }

    async fn close(self) {
        match self {
            Nodes::One(node) => node.close().await,
            Nodes::Cluster {
                mut cluster,
                database,
                postgres_cpu,
            } => {
                for node in &mut cluster.nodes {
                    node.kill_9();
                }
                drop(postgres_cpu);
                database.drop_external().await;
            }
        }
    }
}

/// Waits until `expected` events were completed or `deadline_ms` passed,
/// printing progress on stderr every second.
async fn wait_done(crew: &Crew, expected: usize, deadline_ms: i64) {
    let mut last_print = Instant::now();
    loop {
        let completed = crew.tally.completed.load(Ordering::Relaxed);
        if completed >= expected || now_ms() > deadline_ms {
            return;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            eprintln!("pull: {completed}/{expected} completed");
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), crew.all_done.notified()).await;
    }
}

/// One worker: claim, complete every lease of the answer at once, repeat.
async fn work(crew: Arc<Crew>, index: usize) {
    let body = json!({
        "worker_id": format!("bench-w{index}"),
        "max_events": crew.common.max_events,
        "wait_ms": crew.common.wait_ms,
        "lease_ms": crew.common.lease_ms,
    });
    let tally = &crew.tally;
    let base_url = &crew.base_urls[index % crew.base_urls.len()];
    let claim_url = format!("{base_url}/v1/tenants/{}/leases", crew.tenant_path);
    while !crew.stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        tally.claims.fetch_add(1, Ordering::Relaxed);
        let answer = match post(&crew.client, &claim_url, &body).await {
            Ok((200, answer)) => answer,
            Ok((status, answer)) => {
                tally.claim_errors.fetch_add(1, Ordering::Relaxed);
                tally.error(format!("claim answered {status}: {answer}"));
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
            Err(error) => {
                tally.claim_errors.fetch_add(1, Ordering::Relaxed);
                tally.error(format!("claim failed: {error:#}"));
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        let received_ms = now_ms();
        let claim_us = micros(sent.elapsed());
        let leases = answer["leases"].as_array().cloned().unwrap_or_default();
        if leases.is_empty() {
            tally.empty_claims.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut to_complete = Vec::with_capacity(leases.len());
        {
            let mut samples = lock(&tally.samples);
            samples.claim_latency_us.push(claim_us);
            for lease in &leases {
                let index = lease["event"]["id"]
                    .as_str()
                    .and_then(|id| crew.workload.index_of(id));
                let due = lease["due_at"].as_str().and_then(parse_instant_ms);
                let leased = lease["leased_at"].as_str().and_then(parse_instant_ms);
                if let (Some(index), Some(due), Some(leased)) = (index, due, leased) {
                    let asked = crew.workload.due_ms[index];
                    samples.leased[index] += 1;
                    if samples.leased[index] > 1 {
                        tally.duplicate_leases.fetch_add(1, Ordering::Relaxed);
                    }
                    if leased < asked {
                        tally.early.fetch_add(1, Ordering::Relaxed);
                    }
                    samples.lease_late_ms.push(leased - due);
                    samples.received_late_ms.push(received_ms - asked);
                    if let Some(id) = lease["lease_id"].as_str() {
                        to_complete.push((id.to_string(), index));
                    }
                }
            }
        }
        tally
            .leases
            .fetch_add(leases.len() as u64, Ordering::Relaxed);
        if crew.common.batch_complete {
            complete_batch(&crew, base_url, to_complete).await;
        } else {
            let mut completes = tokio::task::JoinSet::new();
            for (id, index) in to_complete {
                let url = format!("{base_url}/v1/leases/{id}/complete");
                completes.spawn(complete(Arc::clone(&crew), url, index));
            }
            while completes.join_next().await.is_some() {}
        }
    }
}

/// Completes a claim's leases in one `POST
/// /v1/tenants/{t}/leases/complete`; marks each event done whose item
/// answered `delivered`.
async fn complete_batch(crew: &Crew, base_url: &str, leases: Vec<(String, usize)>) {
    let tally = &crew.tally;
    let url = format!("{base_url}/v1/tenants/{}/leases/complete", crew.tenant_path);
    let body = json!({
        "leases": leases.iter().map(|(id, _)| json!({ "lease_id": id })).collect::<Vec<_>>(),
    });
    let sent = Instant::now();
    match post(&crew.client, &url, &body).await {
        Ok((200, answer)) => {
            let took = micros(sent.elapsed());
            let results = answer["results"].as_array().cloned().unwrap_or_default();
            for ((_, index), result) in leases.iter().zip(&results) {
                if result["state"] == "delivered" {
                    mark_done(crew, *index, took);
                } else {
                    tally.complete_errors.fetch_add(1, Ordering::Relaxed);
                    tally.error(format!("a batch item answered {result}"));
                }
            }
        }
        Ok((status, answer)) => {
            tally
                .complete_errors
                .fetch_add(leases.len() as u64, Ordering::Relaxed);
            tally.error(format!("batch complete answered {status}: {answer}"));
        }
        Err(error) => {
            tally
                .complete_errors
                .fetch_add(leases.len() as u64, Ordering::Relaxed);
            tally.error(format!("batch complete failed: {error:#}"));
        }
    }
}

/// Event `index` was completed, answered after `took_us`.
fn mark_done(crew: &Crew, index: usize, took_us: i64) {
    let tally = &crew.tally;
    let first = {
        let mut samples = lock(&tally.samples);
        samples.complete_latency_us.push(took_us);
        !std::mem::replace(&mut samples.done[index], true)
    };
    tally
        .last_complete_ms
        .fetch_max(now_ms(), Ordering::Relaxed);
    if first && tally.completed.fetch_add(1, Ordering::Relaxed) + 1 >= crew.workload.len() {
        crew.all_done.notify_one();
    }
}

/// Completes one lease (`url`: its complete route on the node that
/// granted it); marks its event done on `200`.
async fn complete(crew: Arc<Crew>, url: String, index: usize) {
    let tally = &crew.tally;
    let sent = Instant::now();
    match post(&crew.client, &url, &json!({})).await {
        Ok((200, _)) => mark_done(&crew, index, micros(sent.elapsed())),
        Ok((status, answer)) => {
            tally.complete_errors.fetch_add(1, Ordering::Relaxed);
            tally.error(format!("complete answered {status}: {answer}"));
        }
        Err(error) => {
            tally.complete_errors.fetch_add(1, Ordering::Relaxed);
            tally.error(format!("complete failed: {error:#}"));
        }
    }
}

/// `POST url` with a JSON body; the status and the JSON answer.
async fn post(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
    let response = client.post(url).json(body).send().await?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// The node's `belfry_pull_*` samples (name with labels → value), when it
/// exports them and answers `/metrics` without a key (or with the bench's).
async fn scrape_pull_metrics(client: &reqwest::Client, base_url: &str) -> Option<Value> {
    let text = client
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let samples: serde_json::Map<String, Value> = text
        .lines()
        .filter(|line| line.starts_with("belfry_pull_") && !line.contains("_bucket{"))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_string(), json!(value.parse::<f64>().ok()?)))
        })
        .collect();
    (!samples.is_empty()).then_some(Value::Object(samples))
}

fn summarize(
    mode: &'static str,
    crew: &Crew,
    ingest: &IngestReport,
    started_ms: i64,
    node_cpu: Option<CpuSplit>,
    bench_cpu: Option<CpuSplit>,
    node_pull_metrics: Option<Value>,
) -> PullReport {
    let tally = &crew.tally;
    let mut samples = lock(&tally.samples);
    let completed = tally.completed.load(Ordering::Relaxed);
    let leased_events = samples.leased.iter().filter(|&&n| n > 0).count();
    let last_complete = tally.last_complete_ms.load(Ordering::Relaxed);
    let seconds = (last_complete - started_ms).max(1) as f64 / 1000.0;
    let per_event = |cpu: Option<CpuSplit>| {
        cpu.filter(|_| completed > 0)
            .map(|c| (c.user_s + c.system_s) * 1e6 / completed as f64)
    };
    let claims = tally.claims.load(Ordering::Relaxed);
    let empty = tally.empty_claims.load(Ordering::Relaxed);
    let errors = tally.claim_errors.load(Ordering::Relaxed);
    let lease_lateness_ms = Percentiles::of(&mut samples.lease_late_ms);
    let events_per_s = completed as f64 / seconds;
    let (target, target_met) = if mode == "lateness" {
        let (limit, scope) = if crew.base_urls.len() > 1 {
            (CLUSTER_LATENESS_P99_TARGET_MS, "in a cluster")
        } else {
            (LATENESS_P99_TARGET_MS, "on one node")
        };
        (
            format!("lease lateness p99 <= {limit} ms {scope}"),
            lease_lateness_ms.is_some_and(|p| p.p99 <= limit),
        )
    } else {
        (
            format!("claim-and-complete >= {THROUGHPUT_TARGET_EVENTS_PER_S} events/s on one node"),
            events_per_s >= THROUGHPUT_TARGET_EVENTS_PER_S,
        )
    };
    PullReport {
        mode,
        workers: crew.common.workers,
        max_events: crew.common.max_events,
        wait_ms: crew.common.wait_ms,
        lease_ms: crew.common.lease_ms,
        batch_complete: crew.common.batch_complete,
        events: usize::try_from(ingest.acknowledged_events).unwrap_or(usize::MAX),
        completed,
        missing: crew.workload.len() - leased_events,
        duplicate_leases: tally.duplicate_leases.load(Ordering::Relaxed),
        early: tally.early.load(Ordering::Relaxed),
        claims,
        empty_claims: empty,
        claim_errors: errors,
        complete_errors: tally.complete_errors.load(Ordering::Relaxed),
        first_error: lock(&tally.first_error).clone(),
        leases_per_claim: tally.leases.load(Ordering::Relaxed) as f64
            / claims.saturating_sub(empty + errors).max(1) as f64,
        lease_lateness_ms,
        received_lateness_ms: Percentiles::of(&mut samples.received_late_ms),
        claim_latency_ms: Percentiles::of(&mut samples.claim_latency_us).map(|p| p.scaled(1000.0)),
        complete_latency_ms: Percentiles::of(&mut samples.complete_latency_us)
            .map(|p| p.scaled(1000.0)),
        seconds,
        events_per_s,
        node_cpu,
        node_cpu_per_event_us: per_event(node_cpu),
        bench_cpu_per_event_us: per_event(bench_cpu),
        node_pull_metrics,
        target,
        target_met,
    }
}

/// The report's table rows for a `pull` run.
pub(crate) fn rows(pull: &PullReport, rows: &mut Vec<(String, String)>) {
    rows.push((
        "pull workers".into(),
        format!(
            "{} workers, max_events {}, wait_ms {}, lease_ms {}, completes {}",
            pull.workers,
            pull.max_events,
            pull.wait_ms,
            pull.lease_ms,
            if pull.batch_complete {
                "batched per claim"
            } else {
                "one request per lease"
            }
        ),
    ));
    rows.push((
        "  completed".into(),
        format!(
            "{} of {} ({} missing, {} duplicate leases, {} early)",
            pull.completed, pull.events, pull.missing, pull.duplicate_leases, pull.early
        ),
    ));
    rows.push((
        "  rate".into(),
        format!(
            "{:.0} events/s over {:.2} s (first claim to last complete)",
            pull.events_per_s, pull.seconds
        ),
    ));
    rows.push((
        "  claims".into(),
        format!(
            "{} ({} empty, {} errors), {:.1} leases per claim; {} complete errors",
            pull.claims,
            pull.empty_claims,
            pull.claim_errors,
            pull.leases_per_claim,
            pull.complete_errors
        ),
    ));
    let optional = [
        ("  lateness ms (node)", pull.lease_lateness_ms),
        ("  lateness ms (worker)", pull.received_lateness_ms),
        ("  claim latency ms", pull.claim_latency_ms),
        ("  complete latency ms", pull.complete_latency_ms),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            rows.push((name.into(), percentiles(value)));
        }
    }
    if let Some(per_event) = pull.node_cpu_per_event_us {
        rows.push((
            "  node CPU per event".into(),
            format!(
                "{per_event:.1} µs (bench: {:.1} µs)",
                pull.bench_cpu_per_event_us.unwrap_or(0.0)
            ),
        ));
    }
    if let Some(error) = &pull.first_error {
        rows.push(("  first error".into(), error.clone()));
    }
    rows.push((
        "  target".into(),
        format!(
            "{}: {}",
            pull.target,
            if pull.target_met { "met" } else { "NOT met" }
        ),
    ));
}
