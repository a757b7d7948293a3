//! Cluster mode end to end: real `belfry` processes sharing a real
//! PostgreSQL that the test harness starts itself.
//!
//! Timing uses the default lease TTL (5 s); bounds are generous because
//! several processes share two cores here, except for clean hand-overs
//! (SIGTERM, a node joining), which must cost no duplicate and at most 1 s
//! of lateness. These tests assert behaviour; `belfry-bench cluster`
//! measures it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use belfry_testkit::postgres::PgServer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, Response, get_json, post_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

const SETTLE: Duration = Duration::from_secs(60);

struct Cluster {
    nodes: Vec<BelfryProcess>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn start_node(url: &str) -> (BelfryProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("unused"))
        .arg("--database-url")
        .arg(url);
    (
        BelfryProcess::start(launch).await.expect("node starts"),
        dir,
    )
}

impl Cluster {
    async fn start(url: &str, size: usize) -> Cluster {
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..size {
            let (node, dir) = start_node(url).await;
            nodes.push(node);
            dirs.push(dir);
        }
        let cluster = Cluster { nodes, _dirs: dirs };
        cluster.wait_for_members(size).await;
        cluster
    }

    fn alive(&self) -> impl Iterator<Item = &BelfryProcess> {
        self.nodes.iter().filter(|n| n.pid().is_some())
    }

    /// Polls until every live node reports `size` members, exactly one
    /// Master, and every partition owned.
    async fn wait_for_members(&self, size: usize) {
        let deadline = Instant::now() + SETTLE;
        'poll: loop {
            assert!(
                Instant::now() < deadline,
                "cluster never settled at {size} nodes"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            for node in self.alive() {
                let (_, view) = get_json(&node.url("/events/cluster")).await;
                let Some(members) = view.as_object() else {
                    continue 'poll;
                };
                let masters = members.values().filter(|r| *r == "Master").count();
                if members.len() != size || masters != 1 {
                    continue 'poll;
                }
                let (_, detail) = get_json(&node.url("/v1/cluster")).await;
                let owned: usize = detail["nodes"]
                    .as_array()
                    .map(|nodes| {
                        nodes
                            .iter()
                            .map(|n| n["partitions"].as_array().map_or(0, Vec::len))
                            .sum()
                    })
                    .unwrap_or(0);
                if owned != 64 {
                    continue 'poll;
                }
            }
            return;
        }
    }

    /// Polls until every live node reports `size` nodes, each owning its
    /// even share of the 64 partitions (⌊64/size⌋ or ⌈64/size⌉).
    async fn wait_for_balance(&self, size: usize) {
        let (low, high) = (64 / size, 64_usize.div_ceil(size));
        let deadline = Instant::now() + SETTLE;
        'poll: loop {
            assert!(
                Instant::now() < deadline,
                "the partitions never spread evenly over {size} nodes"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            for node in self.alive() {
                let (_, detail) = get_json(&node.url("/v1/cluster")).await;
                let Some(nodes) = detail["nodes"].as_array() else {
                    continue 'poll;
                };
                let shares: Vec<usize> = nodes
                    .iter()
                    .map(|n| n["partitions"].as_array().map_or(0, Vec::len))
                    .collect();
                if nodes.len() != size
                    || shares.iter().sum::<usize>() != 64
                    || shares.iter().any(|s| *s < low || *s > high)
                {
                    continue 'poll;
                }
            }
            return;
        }
    }

    async fn master_index(&self) -> usize {
        let asked = self.alive().next().expect("a live node");
        let (_, view) = get_json(&asked.url("/events/cluster")).await;
        let master = view
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, role)| *role == "Master")
            .map(|(address, _)| address.clone())
            .expect("a Master");
        self.nodes
            .iter()
            .position(|n| n.base_url().ends_with(&master))
            .expect("the Master is one of ours")
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

/// Schedules `count` events due from `first_ms` every `step_ms`, spreading
/// requests over the live nodes; returns id → due.
async fn schedule_spread(
    cluster: &Cluster,
    prefix: &str,
    count: usize,
    first_ms: i64,
    step_ms: i64,
) -> HashMap<String, i64> {
    let mut due = HashMap::new();
    let nodes: Vec<&BelfryProcess> = cluster.alive().collect();
    for (chunk_index, chunk) in (0..count).collect::<Vec<_>>().chunks(250).enumerate() {
        let body: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let id = format!("{prefix}{i}");
                let at = first_ms + *i as i64 * step_ms;
                due.insert(id.clone(), at);
                json!({"id": id, "tenant": "c", "eventTime": rfc3339(at)})
            })
            .collect();
        let node = nodes[chunk_index % nodes.len()];
        let (status, answer) = post_json(&node.url("/events/schedule"), &Value::Array(body)).await;
        assert_eq!(status, 200, "{answer}");
    }
    due
}

/// Like [`schedule_spread`], with several requests in flight at once (a
/// lane per node, twice), so thousands of events are stored in seconds.
async fn schedule_fast(
    cluster: &Cluster,
    prefix: &str,
    count: usize,
    first_ms: i64,
    step_ms: i64,
) -> HashMap<String, i64> {
    let nodes: Vec<String> = cluster.alive().map(|n| n.url("/events/schedule")).collect();
    let lanes = nodes.len() * 2;
    let mut due = HashMap::new();
    let mut bodies: Vec<Vec<Value>> = vec![Vec::new(); lanes];
    for (chunk_index, chunk) in (0..count).collect::<Vec<_>>().chunks(250).enumerate() {
        let body: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let id = format!("{prefix}{i}");
                let at = first_ms + *i as i64 * step_ms;
                due.insert(id.clone(), at);
                json!({"id": id, "tenant": "c", "eventTime": rfc3339(at)})
            })
            .collect();
        bodies[chunk_index % lanes].push(Value::Array(body));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (lane, chunks) in bodies.into_iter().enumerate() {
        let url = nodes[lane % nodes.len()].clone();
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

/// Duplicates and lateness of a run in which every event arrived.
#[derive(Debug)]
struct Punctuality {
    events: usize,
    duplicates: usize,
    /// Ids delivered more than once (up to 10).
    doubled: Vec<String>,
    /// Deliveries before their instant.
    early: usize,
    p99_late_ms: i64,
    worst_late_ms: i64,
    worst_id: String,
}

fn punctuality(due: &HashMap<String, i64>, arrivals: &HashMap<String, Vec<i64>>) -> Punctuality {
    let mut lateness = Vec::with_capacity(due.len());
    let mut report = Punctuality {
        events: due.len(),
        duplicates: 0,
        doubled: Vec::new(),
        early: 0,
        p99_late_ms: 0,
        worst_late_ms: 0,
        worst_id: String::new(),
    };
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
            if late > report.worst_late_ms {
                report.worst_late_ms = late;
                report.worst_id = id.clone();
            }
            lateness.push(late);
        }
    }
    lateness.sort_unstable();
    report.p99_late_ms = lateness[lateness.len() * 99 / 100];
    report
}

/// Waits until every id in `due` arrived; returns (arrivals per id).
async fn wait_all(
    receiver: &Receiver,
    due: &HashMap<String, i64>,
    within: Duration,
) -> HashMap<String, Vec<i64>> {
    let deadline = Instant::now() + within;
    loop {
        let mut arrivals: HashMap<String, Vec<i64>> = HashMap::new();
        for r in receiver.requests() {
            if let Some(id) = r.header("x-belfry-event-id") {
                arrivals
                    .entry(id.to_string())
                    .or_default()
                    .push(r.arrived_at_ms);
            }
        }
        if due.keys().all(|id| arrivals.contains_key(id)) {
            return arrivals;
        }
        if Instant::now() > deadline {
            let missing: Vec<_> = due
                .keys()
                .filter(|id| !arrivals.contains_key(*id))
                .take(10)
                .collect();
            panic!(
                "{} of {} never delivered, e.g. {missing:?}",
                due.len() - arrivals.len().min(due.len()),
                due.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_on_time(
    due: &HashMap<String, i64>,
    arrivals: &HashMap<String, Vec<i64>>,
    worst_ms: i64,
) -> usize {
    let mut duplicates = 0;
    for (id, at) in due {
        let got = &arrivals[id];
        duplicates += got.len() - 1;
        for arrived in got {
            assert!(arrived >= at, "{id} delivered {} ms early", at - arrived);
            assert!(
                arrived - at <= worst_ms,
                "{id} delivered {} ms late",
                arrived - at
            );
        }
    }
    duplicates
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_one_master_and_events_through_any_node_arrive_on_time() {
    let url = PgServer::shared().fresh_database().await;
    let cluster = Cluster::start(&url, 3).await;
    let receiver = Receiver::start_lean().await;
    register(&cluster.nodes[1], &receiver).await;
    let due = schedule_spread(&cluster, "e", 600, now_ms() + 3_000, 5).await;
    let arrivals = wait_all(&receiver, &due, SETTLE).await;
    let duplicates = assert_on_time(&due, &arrivals, 5_000);
    assert_eq!(duplicates, 0, "no failure, so no duplicate");
    // Any node answers reads for any event.
    let (status, found) = get_json(&cluster.nodes[2].url("/events/find?tenant=c&id=e7")).await;
    assert_eq!(status, 200);
    assert_eq!(found["eventStatus"], "PROCESSED", "{found}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_master_mid_load_loses_nothing_and_fails_over_within_the_lease() {
    let url = PgServer::shared().fresh_database().await;
    let mut cluster = Cluster::start(&url, 3).await;
    let receiver = Receiver::start_lean().await;
    register(&cluster.nodes[0], &receiver).await;
    let start = now_ms() + 2_000;
    let due = schedule_spread(&cluster, "m", 3_000, start, 4).await; // 12 s of events
    tokio::time::sleep(Duration::from_millis(
        (start - now_ms() + 3_000).max(0) as u64
    ))
    .await;
    let master = cluster.master_index().await;
    cluster.nodes[master].kill_9();
    let arrivals = wait_all(&receiver, &due, SETTLE).await;
    // Lease TTL 5 s + takeover + renew ticks; generous for a loaded machine.
    let duplicates = assert_on_time(&due, &arrivals, 5_000 + 8_000);
    assert!(
        duplicates <= 256,
        "{duplicates} duplicates: more than were in flight"
    );
    cluster.wait_for_members(2).await;
    // The killed node rejoins.
    cluster.nodes[master].restart().await.unwrap();
    cluster.wait_for_members(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_an_owner_moves_its_partitions_and_a_joining_node_gets_its_share() {
    let url = PgServer::shared().fresh_database().await;
    let mut cluster = Cluster::start(&url, 2).await;
    let receiver = Receiver::start_lean().await;
    register(&cluster.nodes[0], &receiver).await;
    let master = cluster.master_index().await;
    let owner = 1 - master;
    let start = now_ms() + 2_000;
    let due = schedule_spread(&cluster, "o", 2_000, start, 5).await;
    tokio::time::sleep(Duration::from_millis(
        (start - now_ms() + 2_000).max(0) as u64
    ))
    .await;
    cluster.nodes[owner].kill_9();
    let arrivals = wait_all(&receiver, &due, SETTLE).await;
    assert_on_time(&due, &arrivals, 13_000);
    cluster.wait_for_members(1).await;

    // Join: a new node takes its even share.
    let (node, dir) = start_node(&url).await;
    cluster.nodes.push(node);
    cluster._dirs.push(dir);
    cluster.wait_for_members(2).await;
    let (_, detail) = get_json(&cluster.nodes[master].url("/v1/cluster")).await;
    let shares: Vec<usize> = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["partitions"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(shares, vec![32, 32], "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_node_that_lost_its_lease_delivers_nothing_after_sigcont() {
    let url = PgServer::shared().fresh_database().await;
    let cluster = Cluster::start(&url, 2).await;
    let receiver = Receiver::start_lean().await;
    register(&cluster.nodes[0], &receiver).await;
    let victim = &cluster.nodes[0];
    // Events due while the victim is frozen (from 2 s after the stop to 9 s
    // after), none around the stop itself, so nothing is in flight then.
    let stop_at = now_ms() + 3_000;
    let due = schedule_spread(&cluster, "s", 1_400, stop_at + 2_000, 5).await;
    tokio::time::sleep(Duration::from_millis((stop_at - now_ms()).max(0) as u64)).await;
    let pid = victim.pid().unwrap().to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {name} {pid}");
    };
    signal("-STOP");
    // Longer than the lease TTL (5 s): the other node takes over.
    tokio::time::sleep(Duration::from_secs(12)).await;
    signal("-CONT");
    let arrivals = wait_all(&receiver, &due, SETTLE).await;
    // Give the resumed node every chance to (wrongly) fire what it held.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut seen = HashMap::<String, usize>::new();
    for r in receiver.requests() {
        *seen
            .entry(
                r.header("x-belfry-event-id")
                    .unwrap_or_default()
                    .to_string(),
            )
            .or_default() += 1;
    }
    let doubled: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(
        doubled.is_empty(),
        "delivered twice (the stale owner fired): {doubled:?}"
    );
    for (id, at) in &due {
        assert!(arrivals[id][0] >= *at, "{id} early");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_postgres_is_down_writes_answer_503_and_everything_fires_after_it_returns() {
    // A private server: this test stops it.
    let server = PgServer::launch().expect("a private PostgreSQL");
    let url = server.create_database("outage").await.unwrap();
    let cluster = Cluster::start(&url, 2).await;
    let receiver = Receiver::start_lean().await;
    register(&cluster.nodes[0], &receiver).await;
    let before = schedule_spread(&cluster, "before", 100, now_ms() + 6_000, 10).await;

    server.stop_immediate().unwrap();
    let (status, body) = post_json(
        &cluster.nodes[1].url("/events/schedule"),
        &json!([{"id": "during", "tenant": "c", "eventTime": rfc3339(now_ms() + 1_000)}]),
    )
    .await;
    assert!(
        status == 503 || (status == 500 && body[0]["eventStatus"] == "ERROR"),
        "a write while the database is down must not be acknowledged: {status} {body}"
    );
    let (status, _) = get_json(&cluster.nodes[0].url("/ping")).await;
    assert_eq!(status, 200, "nodes keep running");
    tokio::time::sleep(Duration::from_secs(8)).await;
    server.start().unwrap();

    let arrivals = wait_all(&receiver, &before, SETTLE).await;
    for (id, at) in &before {
        assert!(arrivals[id][0] >= *at, "{id} early");
    }
    assert!(
        receiver
            .requests()
            .iter()
            .all(|r| r.header("x-belfry-event-id") != Some("during"))
    );
    let after = schedule_spread(&cluster, "after", 50, now_ms() + 2_000, 10).await;
    wait_all(&receiver, &after, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_node_that_fires_a_schedule_loses_no_occurrence_and_doubles_none() {
    use belfry_core::schedule::{ScheduleId, control_event_id};
    use belfry_core::{EventKey, PartitionCount, TenantName};

    let url = PgServer::shared().fresh_database().await;
    let mut cluster = Cluster::start(&url, 3).await;
    let receiver = Receiver::start_lean().await;
    register(&cluster.nodes[0], &receiver).await;
    let (status, body) = belfry_testkit::put_json(
        &cluster.nodes[1].url("/v1/tenants/c/schedules/tick"),
        &json!({"expression": "@every 2s", "type": "every"}),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");

    // The node owning the control event's partition fires the schedule.
    let control = EventKey::new(
        TenantName::new("c").unwrap(),
        control_event_id(&ScheduleId::new("tick").unwrap()),
    );
    let partition = PartitionCount::DEFAULT.partition_of(&control).0;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (_, detail) = get_json(&cluster.nodes[0].url("/v1/cluster")).await;
    let owner_address = detail["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| {
            n["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["partition"] == partition)
        })
        .and_then(|n| n["address"].as_str())
        .expect("an owner")
        .to_string();
    let owner = cluster
        .nodes
        .iter()
        .position(|n| n.base_url().ends_with(&owner_address))
        .unwrap();
    let killed_at = now_ms();
    cluster.nodes[owner].kill_9();
    // Through failover (≤ TTL + a few s) and several occurrences after it.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let survivor = cluster.alive().next().unwrap();
    let (status, history) =
        get_json(&survivor.url("/v1/tenants/c/schedules/tick/occurrences?limit=1000")).await;
    assert_eq!(status, 200, "{history}");

    let mut deliveries = HashMap::<String, usize>::new();
    for r in receiver.requests() {
        *deliveries
            .entry(
                r.header("x-belfry-event-id")
                    .unwrap_or_default()
                    .to_string(),
            )
            .or_default() += 1;
    }
    let occurrences = history["occurrences"].as_array().unwrap();
    let settled: Vec<&Value> = occurrences
        .iter()
        .filter(|o| o["status"] != "scheduled" && o["status"] != "retrying")
        .collect();
    assert!(settled.len() >= 10, "too few occurrences: {history}");
    for occurrence in &settled {
        let id = occurrence["id"].as_str().unwrap();
        match occurrence["status"].as_str().unwrap() {
            "delivered" => {
                let n = deliveries.get(id).copied().unwrap_or(0);
                assert!(n >= 1, "{id} recorded delivered but never arrived");
            }
            // Recorded by the misfire policy: allowed, never silent.
            "missed" => {}
            other => panic!("{id} ended {other}: {occurrence}"),
        }
    }
    // Exactly once, except an occurrence in flight at the kill.
    let doubled: Vec<_> = deliveries.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.len() <= 1,
        "occurrences delivered twice: {doubled:?}"
    );
    // No gap: every 2 s slot from before the kill to the end has a record.
    let instants: Vec<i64> = occurrences
        .iter()
        .filter_map(|o| belfry_core::Timestamp::parse_rfc3339(o["scheduled_at"].as_str()?))
        .map(|t| t.as_millis())
        .collect();
    let around_kill: Vec<_> = instants
        .iter()
        .filter(|t| **t > killed_at - 4_000 && **t < killed_at + 12_000)
        .collect();
    assert!(
        around_kill.len() >= 7,
        "occurrences missing around the kill: {instants:?}"
    );
}

/// Sleeps until the wall-clock instant `at_ms`.
async fn sleep_until_ms(at_ms: i64) {
    tokio::time::sleep(Duration::from_millis((at_ms - now_ms()).max(0) as u64)).await;
}

/// Asserts the acceptance bounds of a clean hand-over: nothing missing
/// (checked by `wait_all`), nothing early, no duplicate, at most 1 s late.
fn assert_clean(what: &str, report: &Punctuality) {
    eprintln!("{what}, {} events: {report:?}", report.events);
    assert_eq!(report.early, 0, "{what}: delivered early: {report:?}");
    assert_eq!(report.duplicates, 0, "{what}: delivered twice: {report:?}");
    assert!(
        report.worst_late_ms <= 1_000,
        "{what}: an event was {} ms late: {report:?}",
        report.worst_late_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_delivers_every_event_once_and_within_a_second() {
    let url = PgServer::shared().fresh_database().await;
    let mut cluster = Cluster::start(&url, 3).await;
    cluster.wait_for_balance(3).await;
    let receiver = Receiver::start_lean().await;
    receiver.reserve(12_000);
    // Answers take a while, so deliveries are in flight at every hand-over.
    receiver.set_default(Response::status(200).with_delay(Duration::from_millis(50)));
    register(&cluster.nodes[0], &receiver).await;
    // 10,000 events due over 40 s.
    let first = now_ms() + 12_000;
    let due = schedule_fast(&cluster, "r", 10_000, first, 4).await;
    assert!(
        now_ms() < first - 1_000,
        "scheduling took too long to measure lateness"
    );

    // SIGTERM each node in turn, restart it, wait until it has its share
    // again; spread over the 40 s of events.
    for k in 0..3 {
        sleep_until_ms(first + 3_000 + k as i64 * 12_000).await;
        let signalled = Instant::now();
        let status = cluster.nodes[k].terminate().await.expect("the node ran");
        assert!(status.success(), "node {k} exited with {status}");
        let stopped_in = signalled.elapsed();
        cluster.nodes[k].restart().await.expect("the node restarts");
        cluster.wait_for_balance(3).await;
        eprintln!(
            "node {k}: exited {stopped_in:?} after SIGTERM, owns its share again after {:?}",
            signalled.elapsed()
        );
    }

    wait_all(&receiver, &due, SETTLE).await;
    // Room for a (wrong) second delivery to show up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_clean(
        "rolling restart",
        &punctuality(&due, &arrivals_of(&receiver)),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_a_busy_cluster_takes_its_share_without_duplicates_or_lateness() {
    let url = PgServer::shared().fresh_database().await;
    let mut cluster = Cluster::start(&url, 3).await;
    cluster.wait_for_balance(3).await;
    let receiver = Receiver::start_lean().await;
    receiver.reserve(8_000);
    receiver.set_default(Response::status(200).with_delay(Duration::from_millis(50)));
    register(&cluster.nodes[0], &receiver).await;
    // 6,000 events due over 24 s.
    let first = now_ms() + 8_000;
    let due = schedule_fast(&cluster, "j", 6_000, first, 4).await;
    assert!(
        now_ms() < first - 1_000,
        "scheduling took too long to measure lateness"
    );

    sleep_until_ms(first + 6_000).await;
    let joined = Instant::now();
    let (node, dir) = start_node(&url).await;
    cluster.nodes.push(node);
    cluster._dirs.push(dir);
    cluster.wait_for_balance(4).await;
    eprintln!(
        "the fourth node has its share {:?} after it was started",
        joined.elapsed()
    );
    assert!(
        now_ms() < first + 24_000,
        "the hand-over must happen while events come due"
    );

    wait_all(&receiver, &due, SETTLE).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_clean("join", &punctuality(&due, &arrivals_of(&receiver)));
}

/// Crash failover within 2 s: 10,000 events come due over 30 s on
/// three nodes; a node that is not the Master is killed with -9 8 s in, the
/// Master 18 s in. The dead nodes' database sessions end with them, so
/// their partitions move long before their 5 s leases would run out:
/// nothing is lost, nothing is early, no event is more than 2 s late, and
/// every duplicate is a delivery that was in flight at a kill (its first
/// delivery arrived in the second before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_node_and_then_of_the_master_under_load_costs_at_most_2_s() {
    let url = PgServer::shared().fresh_database().await;
    let mut cluster = Cluster::start(&url, 3).await;
    cluster.wait_for_balance(3).await;
    let receiver = Receiver::start_lean().await;
    receiver.reserve(12_000);
    // Answers take a while, so deliveries are in flight at each kill.
    receiver.set_default(Response::status(200).with_delay(Duration::from_millis(20)));
    register(&cluster.nodes[0], &receiver).await;
    let first = now_ms() + 10_000;
    let due = schedule_fast(&cluster, "k", 10_000, first, 3).await;
    assert!(
        now_ms() < first - 1_000,
        "scheduling took too long to measure lateness"
    );

    let mut kills = Vec::new();
    for (at, leader) in [(first + 8_000, false), (first + 18_000, true)] {
        sleep_until_ms(at).await;
        let master = cluster.master_index().await;
        let victim = if leader {
            master
        } else {
            (0..cluster.nodes.len())
                .find(|i| *i != master && cluster.nodes[*i].pid().is_some())
                .expect("a node besides the Master")
        };
        kills.push(now_ms());
        cluster.nodes[victim].kill_9();
        eprintln!(
            "killed node {victim} ({}) {} ms after the first due instant",
            if leader {
                "the Master"
            } else {
                "not the Master"
            },
            now_ms() - first
        );
    }

    wait_all(&receiver, &due, SETTLE).await;
    // Room for a (wrong) late second delivery to show up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrivals = arrivals_of(&receiver);
    let report = punctuality(&due, &arrivals);
    eprintln!("two kills, {} events: {report:?}", report.events);
    assert_eq!(report.early, 0, "delivered early: {report:?}");
    assert!(
        report.worst_late_ms <= 2_000,
        "{} was {} ms late: {report:?}",
        report.worst_id,
        report.worst_late_ms
    );
    for (id, got) in &arrivals {
        if got.len() < 2 {
            continue;
        }
        let first_arrival = got.iter().min().copied().unwrap_or_default();
        assert!(
            kills
                .iter()
                .any(|kill| (kill - 1_000..=kill + 200).contains(&first_arrival)),
            "{id} delivered {} times, first at {first_arrival}, not in flight at a kill ({kills:?})",
            got.len()
        );
    }
    cluster.wait_for_members(1).await;
}

/// What an operator reads at info: one line per change of a node's share
/// (not one per partition), no PostgreSQL NOTICE chatter (the second node's
/// schema check says "relation … already exists, skipping"), and a line
/// from the leader when it declares a killed node dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_info_log_summarizes_ownership_and_names_a_node_declared_dead() {
    let url = PgServer::shared().fresh_database().await;
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("unused"))
            .arg("--database-url")
            .arg(&url)
            .env("RUST_LOG", "info");
        nodes.push(BelfryProcess::start(launch).await.expect("node starts"));
        dirs.push(dir);
    }
    let mut cluster = Cluster { nodes, _dirs: dirs };
    cluster.wait_for_balance(2).await;
    let master = cluster.master_index().await;
    let victim = 1 - master;
    let victim_address = format!("127.0.0.1:{}", cluster.nodes[victim].port());
    cluster.nodes[victim].kill_9();

    let deadline = Instant::now() + SETTLE;
    loop {
        let logs = cluster.nodes[master].logs_tail(usize::MAX);
        if logs
            .lines()
            .any(|l| l.contains("node declared dead") && l.contains(&victim_address))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never declared {victim_address} dead:\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.wait_for_members(1).await;
    let logs = format!(
        "{}\n{}",
        cluster.nodes[master].logs_tail(usize::MAX),
        cluster.nodes[victim].logs_tail(usize::MAX)
    );
    for line in logs.lines() {
        assert!(!line.contains("already exists"), "a NOTICE at info: {line}");
        for per_partition in [
            "partition acquired",
            "partition released",
            "partition handed over",
        ] {
            assert!(
                !line.contains(per_partition),
                "a line per partition: {line}"
            );
        }
    }
    assert!(
        logs.lines().any(|l| l.contains("owns 64 partitions: 0-63")),
        "no summary of the first node's share:\n{logs}"
    );
}
