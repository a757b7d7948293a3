//! Database failover end to end: three real `belfry` nodes on a PostgreSQL
//! primary with a synchronous standby, managed by Patroni with etcd
//! ([`HaCluster`]), reached through libpq's multi-host URL with
//! `target_session_attrs=read-write`.
//!
//! Every test runs a load: a bulk of events due over the run, scheduled
//! before the fault, plus one new event scheduled every 50 ms throughout
//! (through the nodes in turn), each due 2 s after it is sent. Then:
//! - the primary's machine dies (`kill -9` of Patroni, its postmaster and
//!   backends): nothing acknowledged is lost or early, writes are accepted
//!   again within 10 s of the standby's promotion and deliveries flow
//!   within 5 s of it, every node keeps running;
//! - a planned `patronictl switchover`: at most 3 s of refused writes and
//!   no duplicate;
//! - the synchronous standby is promoted away from a primary that stays up
//!   (commits on it wait forever): the nodes use little CPU and say in
//!   `/health/ready` why they cannot write, then resume by themselves once
//!   the old primary is gone.
//!
//! The load is the issue's: 3 nodes, 20,000 events due over 30 s plus a
//! new one every 50 ms throughout. It costs no more time than a smaller
//! one (each test waits out the failover and the span either way);
//! `BELFRY_TEST_FAILOVER_SMALL=1` runs 4,000 over 24 s on a machine too
//! slow for it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_testkit::patroni::{HaCluster, Role};
use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

const SETTLE: Duration = Duration::from_secs(90);

/// Bulk events and the span they are due over.
fn bulk_size() -> (usize, i64) {
    if std::env::var("BELFRY_TEST_FAILOVER_SMALL").is_ok_and(|v| v == "1") {
        (4_000, 24_000)
    } else {
        (20_000, 30_000)
    }
}

struct Nodes {
    nodes: Vec<BelfryProcess>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Nodes {
    async fn start(url: &str, size: usize) -> Nodes {
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..size {
            let dir = tempfile::tempdir().unwrap();
            let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("unused"))
                .arg("--database-url")
                .arg(url);
            nodes.push(BelfryProcess::start(launch).await.expect("node starts"));
            dirs.push(dir);
        }
        let started = Nodes { nodes, _dirs: dirs };
        started.wait_for_members(size).await;
        started
    }

    /// Polls until every node sees `size` members and all 64 partitions
    /// owned.
    async fn wait_for_members(&self, size: usize) {
        let deadline = Instant::now() + SETTLE;
        'poll: loop {
            assert!(Instant::now() < deadline, "cluster never settled");
            tokio::time::sleep(Duration::from_millis(200)).await;
            for node in &self.nodes {
                let (_, detail) = get_json(&node.url("/v1/cluster")).await;
                let Some(nodes) = detail["nodes"].as_array() else {
                    continue 'poll;
                };
                let owned: usize = nodes
                    .iter()
                    .map(|n| n["partitions"].as_array().map_or(0, Vec::len))
                    .sum();
                if nodes.len() != size || owned != 64 {
                    continue 'poll;
                }
            }
            return;
        }
    }

    fn assert_all_running(&mut self) {
        for (index, node) in self.nodes.iter_mut().enumerate() {
            assert!(
                node.is_running(),
                "node {index} exited:\n{}",
                node.logs_tail(40)
            );
        }
    }

    fn print_logs_tail(&self, lines: usize) {
        for (index, node) in self.nodes.iter().enumerate() {
            eprintln!("--- node {index} ---\n{}", node.logs_tail(lines));
        }
    }
}

/// One write of the 50 ms trickle.
#[derive(Debug, Clone)]
struct Write {
    id: String,
    due_ms: i64,
    sent_ms: i64,
    answered_ms: i64,
    /// The HTTP status, or 0 when the request failed or timed out.
    status: u16,
}

/// Schedules one event every 50 ms, through the nodes in turn, until
/// stopped; never waits for an answer before sending the next.
struct Trickle {
    writes: Arc<Mutex<Vec<Write>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Trickle {
    fn start(nodes: &Nodes) -> Trickle {
        let urls: Vec<String> = nodes
            .nodes
            .iter()
            .map(|n| n.url("/events/schedule"))
            .collect();
        let writes = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let recorded = Arc::clone(&writes);
        let task = tokio::spawn(async move {
            let client = belfry_testkit::http_client();
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut requests = tokio::task::JoinSet::new();
            for n in 0_u64.. {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                let url = urls[n as usize % urls.len()].clone();
                let client = client.clone();
                let recorded = Arc::clone(&recorded);
                requests.spawn(async move {
                    let sent_ms = now_ms();
                    let id = format!("t{n}");
                    let due_ms = sent_ms + 2_000;
                    let body = json!([{"id": id, "tenant": "c", "eventTime": rfc3339(due_ms)}]);
                    let status = client
                        .post(&url)
                        .json(&body)
                        .timeout(Duration::from_secs(40))
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16());
                    recorded.lock().unwrap().push(Write {
                        id,
                        due_ms,
                        sent_ms,
                        answered_ms: now_ms(),
                        status,
                    });
                });
            }
            while requests.join_next().await.is_some() {}
        });
        Trickle { writes, stop, task }
    }

    /// Stops sending, waits for the answers of what was sent.
    async fn finish(self) -> Vec<Write> {
        let _ = self.stop.send(true);
        self.task.await.expect("the trickle task");
        let mut writes = self.writes.lock().unwrap().clone();
        writes.sort_by_key(|w| w.sent_ms);
        writes
    }
}

async fn register(node: &BelfryProcess, receiver: &Receiver) {
    let (status, body) = post_json(
        &node.url("/events/tenant/register"),
        &json!({"tenant": "c", "type": "HTTP", "props": {"url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// Schedules `count` events due from `first_ms` over `span_ms`, several
/// requests in flight; returns id → due.
async fn schedule_bulk(
    nodes: &Nodes,
    count: usize,
    first_ms: i64,
    span_ms: i64,
) -> HashMap<String, i64> {
    let urls: Vec<String> = nodes
        .nodes
        .iter()
        .map(|n| n.url("/events/schedule"))
        .collect();
    let lanes = urls.len() * 2;
    let mut due = HashMap::new();
    let mut bodies: Vec<Vec<Value>> = vec![Vec::new(); lanes];
    for (chunk_index, chunk) in (0..count).collect::<Vec<_>>().chunks(250).enumerate() {
        let body: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let id = format!("b{i}");
                let at = first_ms + (*i as i64 * span_ms) / count as i64;
                due.insert(id.clone(), at);
                json!({"id": id, "tenant": "c", "eventTime": rfc3339(at)})
            })
            .collect();
        bodies[chunk_index % lanes].push(Value::Array(body));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (lane, chunks) in bodies.into_iter().enumerate() {
        let url = urls[lane % urls.len()].clone();
        tasks.spawn(async move {
            for body in chunks {
                let (status, answer) = post_json(&url, &body).await;
                assert_eq!(status, 200, "{answer}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a scheduling lane");
    }
    due
}

/// Every arrival per event id so far.
fn arrivals_of(receiver: &Receiver) -> HashMap<String, Vec<i64>> {
    let mut arrivals: HashMap<String, Vec<i64>> = HashMap::new();
    for r in receiver.requests() {
        if let Some(id) = r.header("x-belfry-event-id") {
            arrivals
                .entry(id.to_string())
                .or_default()
                .push(r.arrived_at_ms);
        }
    }
    arrivals
}

/// Waits until every id in `due` arrived; panics with what is missing.
async fn wait_all(receiver: &Receiver, due: &HashMap<String, i64>, nodes: &Nodes) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let arrivals = arrivals_of(receiver);
        let missing: Vec<&String> = due
            .keys()
            .filter(|id| !arrivals.contains_key(*id))
            .collect();
        if missing.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            nodes.print_logs_tail(40);
            panic!(
                "{} of {} acknowledged events never delivered, e.g. {:?}",
                missing.len(),
                due.len(),
                &missing[..missing.len().min(10)]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a run delivered.
#[derive(Debug, Default)]
struct Outcome {
    early: usize,
    duplicates: usize,
    doubled: Vec<String>,
    late_over_1s: usize,
    worst_late_ms: i64,
}

fn outcome(due: &HashMap<String, i64>, arrivals: &HashMap<String, Vec<i64>>) -> Outcome {
    let mut report = Outcome::default();
    for (id, at) in due {
        let got = &arrivals[id];
        if got.len() > 1 {
            report.duplicates += got.len() - 1;
            if report.doubled.len() < 10 {
                report.doubled.push(id.clone());
            }
        }
        for arrived in got {
            let late = arrived - at;
            if late < 0 {
                report.early += 1;
            }
            if late > 1_000 {
                report.late_over_1s += 1;
            }
            report.worst_late_ms = report.worst_late_ms.max(late);
        }
    }
    report
}

/// The acknowledged trickle writes as id → due.
fn acknowledged(writes: &[Write]) -> HashMap<String, i64> {
    writes
        .iter()
        .filter(|w| w.status == 200)
        .map(|w| (w.id.clone(), w.due_ms))
        .collect()
}

/// Polls (off the runtime's threads) until member `index` is the primary;
/// returns the wall-clock instant it was first seen so.
async fn wait_primary(ha: &Arc<HaCluster>, index: usize) -> i64 {
    let ha = Arc::clone(ha);
    tokio::task::spawn_blocking(move || {
        ha.wait_for(
            |c| c.role(index) == Role::Primary,
            "the standby's promotion",
        )
        .expect("the standby is promoted");
        now_ms()
    })
    .await
    .expect("the poller")
}

/// The cluster, its three nodes, a receiver, the bulk load; the bulk is
/// due from `lead_ms` after it is stored.
struct Setup {
    ha: Arc<HaCluster>,
    nodes: Nodes,
    receiver: Receiver,
    bulk: HashMap<String, i64>,
    first_due_ms: i64,
}

async fn set_up(lead_ms: i64) -> Setup {
    let ha = tokio::task::spawn_blocking(|| HaCluster::launch().expect("an HA PostgreSQL"))
        .await
        .unwrap();
    let url = ha
        .create_database("belfry")
        .await
        .expect("create the database");
    let nodes = Nodes::start(&url, 3).await;
    let receiver = Receiver::start_lean().await;
    let (count, span) = bulk_size();
    receiver.reserve(count * 2);
    register(&nodes.nodes[0], &receiver).await;
    let first_due_ms = now_ms() + 15_000;
    let bulk = schedule_bulk(&nodes, count, first_due_ms, span).await;
    assert!(
        now_ms() < first_due_ms - 2_000,
        "storing the bulk took too long"
    );
    tokio::time::sleep(Duration::from_millis(
        (first_due_ms - now_ms() + lead_ms).max(0) as u64,
    ))
    .await;
    Setup {
        ha: Arc::new(ha),
        nodes,
        receiver,
        bulk,
        first_due_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_primary_under_load_loses_nothing_and_writes_resume_within_10s() {
    let mut setup = set_up(-3_000).await;
    let trickle = Trickle::start(&setup.nodes);
    // Faults strike 5 s into the bulk's span.
    tokio::time::sleep(Duration::from_millis(
        (setup.first_due_ms + 5_000 - now_ms()).max(0) as u64,
    ))
    .await;
    let old = setup.ha.primary().expect("a primary");
    let standby = 1 - old;
    let killed_ms = now_ms();
    setup.ha.kill_9(old);
    let promoted_ms = wait_primary(&setup.ha, standby).await;
    eprintln!("promoted {} ms after the kill", promoted_ms - killed_ms);
    // Long enough for writes to resume and events to flow again.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let writes = trickle.finish().await;
    setup.nodes.assert_all_running();

    let mut due = setup.bulk.clone();
    due.extend(acknowledged(&writes));
    wait_all(&setup.receiver, &due, &setup.nodes).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrivals = arrivals_of(&setup.receiver);
    let report = outcome(&due, &arrivals);
    let accepted_again_ms = writes
        .iter()
        .filter(|w| w.status == 200 && w.sent_ms > killed_ms)
        .map(|w| w.answered_ms)
        .min()
        .expect("a write accepted after the kill");
    let flowing_ms = arrivals
        .values()
        .flatten()
        .copied()
        .filter(|at| *at >= promoted_ms)
        .min()
        .expect("a delivery after the promotion");
    let refused = writes.iter().filter(|w| w.status != 200).count();
    eprintln!(
        "kill -9 of the primary: {report:?}; writes {} ({refused} refused), accepted again \
         {} ms after the promotion, deliveries {} ms after it",
        writes.len(),
        accepted_again_ms - promoted_ms,
        flowing_ms - promoted_ms
    );
    assert_eq!(report.early, 0, "delivered early: {report:?}");
    assert!(
        accepted_again_ms - promoted_ms <= 10_000,
        "writes accepted again only {} ms after the promotion",
        accepted_again_ms - promoted_ms
    );
    assert!(
        flowing_ms - promoted_ms <= 5_000,
        "deliveries flowing only {} ms after the promotion",
        flowing_ms - promoted_ms
    );
    setup.nodes.assert_all_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_switchover_under_load_refuses_writes_at_most_3s_and_doubles_nothing() {
    let mut setup = set_up(-3_000).await;
    let trickle = Trickle::start(&setup.nodes);
    tokio::time::sleep(Duration::from_millis(
        (setup.first_due_ms + 5_000 - now_ms()).max(0) as u64,
    ))
    .await;
    let old = setup.ha.primary().expect("a primary");
    let started_ms = now_ms();
    {
        let ha = Arc::clone(&setup.ha);
        tokio::task::spawn_blocking(move || ha.switchover(1 - old))
            .await
            .unwrap()
            .expect("the switchover");
    }
    eprintln!("switchover took {} ms", now_ms() - started_ms);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let writes = trickle.finish().await;
    setup.nodes.assert_all_running();

    let mut due = setup.bulk.clone();
    due.extend(acknowledged(&writes));
    wait_all(&setup.receiver, &due, &setup.nodes).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = outcome(&due, &arrivals_of(&setup.receiver));
    let refused: Vec<&Write> = writes.iter().filter(|w| w.status != 200).collect();
    let refused_span_ms = match (refused.first(), refused.last()) {
        (Some(first), Some(last)) => last.answered_ms.max(last.sent_ms + 50) - first.sent_ms,
        _ => 0,
    };
    let slowest_ms = writes
        .iter()
        .filter(|w| w.status == 200)
        .map(|w| w.answered_ms - w.sent_ms)
        .max()
        .unwrap_or(0);
    eprintln!(
        "switchover: {report:?}; writes {}, {} refused over {refused_span_ms} ms, slowest \
         accepted {slowest_ms} ms",
        writes.len(),
        refused.len()
    );
    assert_eq!(report.early, 0, "delivered early: {report:?}");
    assert_eq!(report.duplicates, 0, "delivered twice: {report:?}");
    assert!(
        refused_span_ms <= 3_000,
        "writes refused for {refused_span_ms} ms: {:?}",
        &refused[..refused.len().min(5)]
    );
}

/// User and system CPU time of a process, in clock ticks (100 per second
/// on Linux), from `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the node's stat");
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_that_hang_cost_little_cpu_say_why_and_the_node_resumes_on_the_new_primary() {
    let mut setup = set_up(-3_000).await;
    let trickle = Trickle::start(&setup.nodes);
    tokio::time::sleep(Duration::from_millis(
        (setup.first_due_ms + 5_000 - now_ms()).max(0) as u64,
    ))
    .await;
    let old = setup.ha.primary().expect("a primary");
    let standby = 1 - old;
    {
        let ha = Arc::clone(&setup.ha);
        tokio::task::spawn_blocking(move || ha.promote_away(standby))
            .await
            .unwrap()
            .expect("promote the standby away");
    }
    let promoted_ms = now_ms();
    // The nodes find out that commits hang, then wait.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let pids: Vec<u32> = setup.nodes.nodes.iter().map(|n| n.pid().unwrap()).collect();
    let before: Vec<u64> = pids.iter().map(|pid| cpu_ticks(*pid)).collect();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let seconds = window.elapsed().as_secs_f64();
    let shares: Vec<f64> = pids
        .iter()
        .zip(&before)
        .map(|(pid, start)| (cpu_ticks(*pid) - start) as f64 / 100.0 / seconds)
        .collect();
    let mut readiness = Vec::new();
    for node in &setup.nodes.nodes {
        readiness.push(get_json(&node.url("/health/ready")).await);
    }
    eprintln!("while commits hang: CPU per node {shares:?}, readiness {readiness:?}");

    // The HA manager would now demote the old primary; here it stops.
    {
        let ha = Arc::clone(&setup.ha);
        tokio::task::spawn_blocking(move || ha.stop_postgres(old))
            .await
            .unwrap()
            .expect("stop the old primary");
    }
    let stopped_ms = now_ms();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let writes = trickle.finish().await;
    setup.nodes.assert_all_running();
    let accepted_again_ms = writes
        .iter()
        .filter(|w| w.status == 200 && w.sent_ms > stopped_ms)
        .map(|w| w.answered_ms)
        .min();
    let mut due = setup.bulk.clone();
    due.extend(acknowledged(&writes));
    wait_all(&setup.receiver, &due, &setup.nodes).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = outcome(&due, &arrivals_of(&setup.receiver));
    eprintln!(
        "hanging commits: promoted at +0, old primary stopped at +{} ms, {report:?}, writes \
         accepted again {:?} ms after the stop",
        stopped_ms - promoted_ms,
        accepted_again_ms.map(|at| at - stopped_ms)
    );
    for (index, share) in shares.iter().enumerate() {
        assert!(
            *share < 0.10,
            "node {index} used {:.0} % of a core while commits hung",
            share * 100.0
        );
    }
    for (index, (status, body)) in readiness.iter().enumerate() {
        assert_eq!(*status, 503, "node {index} claims to be ready: {body}");
        assert_eq!(body["reason"], "store_not_writable", "node {index}: {body}");
    }
    assert_eq!(report.early, 0, "delivered early: {report:?}");
    assert!(
        accepted_again_ms.is_some_and(|at| at - stopped_ms <= 10_000),
        "writes not accepted again within 10 s of the old primary's stop"
    );
}
