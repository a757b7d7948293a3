//! Pull workers in a cluster (`docs/pull.md`, "In a cluster"): real
//! `belfry` nodes sharing a real PostgreSQL, workers making real HTTP
//! calls to one node for events whose partitions another node owns, and
//! the done-when scenario (kill -9 of a worker and of a node while
//! 3 workers and 2 nodes process 10,000 events; 100,000 with
//! `BELFRY_TEST_PULL_EVENTS=100000`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_core::{EventId, EventKey, PartitionCount, TenantName};
use belfry_testkit::postgres::PgServer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, free_port, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::{call, now_ms, rfc3339};

const SETTLE: Duration = Duration::from_secs(60);
const PARTITIONS: u16 = 64;

async fn start_node(url: &str) -> (BelfryProcess, tempfile::TempDir) {
    start_node_with(url, |launch| launch).await
}

/// [`start_node`], its launch changed by `configure` (environment, port,
/// arguments).
async fn start_node_with(
    url: &str,
    configure: impl FnOnce(BelfryLaunch) -> BelfryLaunch,
) -> (BelfryProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("unused"))
        .arg("--database-url")
        .arg(url);
    (
        BelfryProcess::start(configure(launch))
            .await
            .expect("node starts"),
        dir,
    )
}

/// Two nodes sharing `url`, once each owns its half of the partitions.
async fn two_nodes(url: &str) -> (Vec<BelfryProcess>, Vec<tempfile::TempDir>) {
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..2 {
        let (node, dir) = start_node(url).await;
        nodes.push(node);
        dirs.push(dir);
    }
    let deadline = Instant::now() + SETTLE;
    'poll: loop {
        assert!(Instant::now() < deadline, "the partitions never spread");
        tokio::time::sleep(Duration::from_millis(100)).await;
        for node in &nodes {
            let owned = owned_by(node, &nodes).await;
            if owned.iter().map(HashSet::len).collect::<Vec<_>>() != [32, 32] {
                continue 'poll;
            }
        }
        return (nodes, dirs);
    }
}

/// The partitions each of `nodes` owns, as `asked` sees it.
async fn owned_by(asked: &BelfryProcess, nodes: &[BelfryProcess]) -> Vec<HashSet<u16>> {
    let (_, detail) = get_json(&asked.url("/v1/cluster")).await;
    let views = detail["nodes"].as_array().cloned().unwrap_or_default();
    nodes
        .iter()
        .map(|node| {
            views
                .iter()
                .find(|v| {
                    v["address"]
                        .as_str()
                        .is_some_and(|a| node.base_url().ends_with(a))
                })
                .and_then(|v| v["partitions"].as_array())
                .map(|ps| {
                    ps.iter()
                        .filter_map(|p| p["partition"].as_u64())
                        .map(|p| p as u16)
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

fn partition_of(tenant: &str, id: &str) -> u16 {
    let key = EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap());
    PartitionCount::new(PARTITIONS)
        .unwrap()
        .partition_of(&key)
        .0
}

/// `count` event ids of `tenant` (prefixed) whose partitions are in `owned`.
fn ids_in(tenant: &str, prefix: &str, owned: &HashSet<u16>, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .filter(|id| owned.contains(&partition_of(tenant, id)))
        .take(count)
        .collect()
}

async fn pull_tenant(node: &BelfryProcess, tenant: &str) {
    let (status, body) = put_json(
        &node.url(&format!("/v1/tenants/{tenant}")),
        &json!({ "sink": { "type": "pull" } }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// Schedules `ids` of `tenant` at `at_ms` through `nodes` in turn, a few
/// batches in flight at once.
async fn schedule(nodes: &[String], tenant: &str, ids: &[String], at_ms: i64) {
    let batches: Vec<Value> = ids
        .chunks(500)
        .map(|chunk| {
            let events: Vec<Value> = chunk
                .iter()
                .map(|id| json!({ "id": id, "deliver_at": rfc3339(at_ms) }))
                .collect();
            json!({ "events": events })
        })
        .collect();
    for (round, group) in batches.chunks(4).enumerate() {
        let sends = group.iter().enumerate().map(|(i, batch)| {
            let base = &nodes[(round + i) % nodes.len()];
            async move {
                let url = format!("{base}/v1/tenants/{tenant}/events");
                let (status, body) = post_json(&url, batch).await;
                assert!(status == 200 || status == 201, "{status} {body}");
            }
        });
        futures_join_all(sends).await;
    }
}

/// Runs the futures concurrently (no `futures` crate in this package).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let set: Vec<_> = futures.map(Box::pin).collect();
    for future in set {
        future.await;
    }
}

async fn claim(
    base: &str,
    tenant: &str,
    worker: &str,
    max: u32,
    lease_ms: u64,
    wait_ms: u64,
) -> Vec<Value> {
    let body =
        json!({ "worker_id": worker, "max_events": max, "lease_ms": lease_ms, "wait_ms": wait_ms });
    let (status, answer) = call(base, &format!("/v1/tenants/{tenant}/leases"), &body)
        .await
        .expect("the node answers");
    assert_eq!(status, 200, "{answer}");
    answer["leases"].as_array().unwrap().clone()
}

async fn lease_call(base: &str, lease: &Value, what: &str) -> (u16, Value) {
    let id = lease["lease_id"].as_str().unwrap();
    call(base, &format!("/v1/leases/{id}/{what}"), &json!({}))
        .await
        .expect("the node answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_one_node_runs_events_the_other_node_owns_and_a_stale_lease_is_lost_there() {
    let url = PgServer::shared().fresh_database().await;
    let (nodes, _dirs) = two_nodes(&url).await;
    let owned = owned_by(&nodes[0], &nodes).await;
    pull_tenant(&nodes[0], "jobs").await;
    // Half on each node's partitions; the worker talks to node 0 only.
    let mut ids = ids_in("jobs", "a", &owned[0], 10);
    ids.extend(ids_in("jobs", "b", &owned[1], 10));
    let stale_id = ids_in("jobs", "stale", &owned[1], 1).remove(0);
    ids.push(stale_id.clone());
    let bases: Vec<String> = nodes.iter().map(|n| n.base_url()).collect();
    schedule(&bases, "jobs", &ids, now_ms()).await;
    let a = nodes[0].base_url();

    let mut leases: HashMap<String, Value> = HashMap::new();
    let deadline = Instant::now() + SETTLE;
    while leases.len() < ids.len() {
        assert!(Instant::now() < deadline, "claimed only {leases:?}");
        for lease in claim(&a, "jobs", "w", 100, 30_000, 1_000).await {
            let id = lease["event"]["id"].as_str().unwrap().to_string();
            assert!(leases.insert(id, lease).is_none(), "leased twice");
        }
    }
    for (id, lease) in &leases {
        if *id == stale_id {
            continue;
        }
        let (status, beat) = lease_call(&a, lease, "heartbeat").await;
        assert_eq!(status, 200, "{id}: {beat}");
        assert_eq!(beat["cancel_requested"], false);
        let (status, done) = lease_call(&a, lease, "complete").await;
        assert_eq!(status, 200, "{id}: {done}");
        assert_eq!(done["state"], "delivered");
        // A repeat through the other node answers the same.
        let (status, again) = lease_call(&nodes[1].base_url(), lease, "complete").await;
        assert_eq!((status, &again), (200, &done), "{id}");
    }
    for id in &ids[..20] {
        let (_, event) = get_json(&nodes[1].url(&format!("/v1/tenants/jobs/events/{id}"))).await;
        assert_eq!(event["status"], "delivered", "{event}");
    }

    // The stale lease (B's partition) is given up: its worker lets it run
    // out and another worker gets the event again, through node 0 too.
    let first = &leases[&stale_id];
    let (status, body) = call(
        &a,
        &format!(
            "/v1/leases/{}/heartbeat",
            first["lease_id"].as_str().unwrap()
        ),
        &json!({ "extend_ms": 1_000 }),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let again = loop {
        assert!(
            Instant::now() < deadline,
            "the expired lease never came back"
        );
        if let Some(lease) = claim(&a, "jobs", "w2", 1, 30_000, 1_000).await.pop() {
            break lease;
        }
    };
    assert_eq!(again["event"]["id"], stale_id.as_str());
    assert_eq!(again["attempt"], 2, "the expiry counted: {again}");
    for what in ["heartbeat", "complete"] {
        let (status, body) = lease_call(&a, first, what).await;
        assert_eq!(status, 409, "{what}: {body}");
        assert_eq!(body["error"]["code"], "lease_lost", "{body}");
    }
    let (status, body) = lease_call(&a, &again, "complete").await;
    assert_eq!(status, 200, "{body}");
}

/// What becomes of a lease a worker holds on an event of node 1's
/// partitions when node 1 goes away, seen through node 0 (which takes the
/// partition over): the old lease's calls answer `lease_lost`, and the
/// event is leased again only once that lease's time is up. Answers the
/// next lease (completed) and the nodes.
async fn lease_through_the_loss_of_node_1(
    tenant: &str,
    lose: impl AsyncFnOnce(&mut BelfryProcess),
) -> (Value, Nodes) {
    let url = PgServer::shared().fresh_database().await;
    let (mut nodes, dirs) = two_nodes(&url).await;
    let owned = owned_by(&nodes[0], &nodes).await;
    pull_tenant(&nodes[0], tenant).await;
    let id = ids_in(tenant, "orphan", &owned[1], 1).remove(0);
    let bases: Vec<String> = nodes.iter().map(|n| n.base_url()).collect();
    schedule(&bases, tenant, std::slice::from_ref(&id), now_ms()).await;
    let deadline = Instant::now() + SETTLE;
    let first = loop {
        assert!(Instant::now() < deadline, "never leased");
        if let Some(lease) = claim(&bases[1], tenant, "a", 1, 5_000, 1_000).await.pop() {
            break lease;
        }
    };
    assert_eq!(first["attempt"], 1, "{first}");

    lose(&mut nodes[1]).await;
    let a = &bases[0];
    let body = json!({ "worker_id": "b", "max_events": 1, "lease_ms": 30_000, "wait_ms": 1_000 });
    let again = loop {
        assert!(Instant::now() < deadline, "never leased again");
        match call(a, &format!("/v1/tenants/{tenant}/leases"), &body).await {
            Some((200, answer)) => {
                if let Some(lease) = answer["leases"].get(0) {
                    break lease.clone();
                }
            }
            // The partition is being taken over.
            Some((503, _)) | None => tokio::time::sleep(Duration::from_millis(100)).await,
            Some((status, answer)) => panic!("claim: {status} {answer}"),
        }
    };
    assert_eq!(again["event"]["id"], id.as_str(), "{again}");
    let instant = |lease: &Value, field: &str| {
        belfry_core::Timestamp::parse_rfc3339(lease[field].as_str().unwrap()).unwrap()
    };
    assert!(
        instant(&again, "leased_at") >= instant(&first, "lease_expires_at"),
        "leased again before the first lease ran out: {first} {again}"
    );
    let (status, body) = lease_call(a, &first, "heartbeat").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("lease_lost")),
        "{body}"
    );
    let (status, body) = lease_call(a, &again, "complete").await;
    assert_eq!(status, 200, "{body}");
    (again, (nodes, dirs))
}

/// Nodes and their directories, which live as long as they do.
type Nodes = (Vec<BelfryProcess>, Vec<tempfile::TempDir>);

/// Node 1 is killed: node 0 takes the partition over and records the
/// orphaned lease's expiry (under its own epoch) as a failed attempt
/// `lease_expired`; the next lease carries attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_by_a_killed_node_counts_as_an_expired_attempt_where_it_is_taken_over() {
    let (again, (nodes, _dirs)) =
        lease_through_the_loss_of_node_1("jobs", async |node| node.kill_9()).await;
    assert_eq!(again["attempt"], 2, "the orphan's expiry counted: {again}");
    let id = again["event"]["id"].as_str().unwrap();
    let (_, attempts) =
        get_json(&nodes[0].url(&format!("/v1/tenants/jobs/events/{id}/attempts"))).await;
    assert!(attempts.to_string().contains("lease_expired"), "{attempts}");
    let (_, event) = get_json(&nodes[0].url(&format!("/v1/tenants/jobs/events/{id}"))).await;
    assert_eq!(
        (&event["status"], &event["attempts"]),
        (&json!("delivered"), &json!(2)),
        "{event}"
    );
}

/// Node 1 stops cleanly (SIGTERM: it hands its partitions over): it gives
/// the lease back first, so no attempt is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_a_node_that_hands_over_cleanly_is_given_back_without_an_attempt() {
    let (again, (nodes, _dirs)) = lease_through_the_loss_of_node_1("jobs", async |node| {
        let status = node.terminate().await.expect("node 1 exits");
        assert!(status.success(), "{status:?}");
    })
    .await;
    assert_eq!(again["attempt"], 1, "no attempt counted: {again}");
    let id = again["event"]["id"].as_str().unwrap();
    let (_, attempts) =
        get_json(&nodes[0].url(&format!("/v1/tenants/jobs/events/{id}/attempts"))).await;
    assert_eq!(
        attempts["attempts"].as_array().map(Vec::len),
        Some(1),
        "{attempts}"
    );
    assert!(
        !attempts.to_string().contains("lease_expired"),
        "{attempts}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_parked_on_one_node_is_woken_when_an_event_the_other_node_owns_comes_due() {
    let url = PgServer::shared().fresh_database().await;
    let (nodes, _dirs) = two_nodes(&url).await;
    let owned = owned_by(&nodes[0], &nodes).await;
    pull_tenant(&nodes[0], "wake").await;
    let a = nodes[0].base_url();
    let bases: Vec<String> = nodes.iter().map(|n| n.base_url()).collect();
    let mut lateness = Vec::new();
    for round in 0..5 {
        let id = ids_in("wake", &format!("r{round}-"), &owned[1], 1).remove(0);
        let due = now_ms() + 1_500;
        schedule(&bases, "wake", std::slice::from_ref(&id), due).await;
        let lease = loop {
            if let Some(lease) = claim(&a, "wake", "w", 1, 30_000, 10_000).await.pop() {
                break lease;
            }
            assert!(now_ms() < due + 10_000, "never leased");
        };
        let received = now_ms();
        assert_eq!(lease["event"]["id"], id.as_str());
        let leased_at = belfry_core::Timestamp::parse_rfc3339(lease["leased_at"].as_str().unwrap())
            .unwrap()
            .as_millis();
        assert!(leased_at >= due, "leased before its instant: {lease}");
        assert!(
            received - due <= 2_000,
            "leased {} ms after its instant",
            received - due
        );
        lateness.push(received - due);
        assert_eq!(lease_call(&a, &lease, "complete").await.0, 200);
    }
    eprintln!("due → leased through the other node, ms: {lateness:?}");
}

/// Events whose id ends in 7 are failed permanently by the workers.
fn is_bad(id: &str) -> bool {
    id.ends_with('7')
}

/// One call a worker made: `answer` is `None` until (unless) it came.
#[derive(Debug, Clone)]
struct Record {
    event: String,
    lease: String,
    worker: usize,
    call: &'static str,
    answer: Option<(u16, String)>,
}

/// What the workers of the done-when scenario share.
struct Crew {
    /// The nodes still alive: a worker's calls go to them in turn.
    bases: Mutex<Vec<String>>,
    records: Mutex<Vec<Record>>,
    /// Leases ended with a 200 (complete or fail).
    ended: AtomicUsize,
    /// Claims answered neither 200 nor 503 (reported if the run stalls).
    odd_claims: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Crew {
    fn base(&self, turn: usize) -> String {
        let bases = self.bases.lock().unwrap();
        bases[turn % bases.len()].clone()
    }

    /// What the workers saw, for a run that did not finish in time.
    fn report(&self) -> String {
        let mut answers: HashMap<String, usize> = HashMap::new();
        for record in self.records.lock().unwrap().iter() {
            let key = match &record.answer {
                Some((status, code)) => format!("{} {status} {code}", record.call),
                None => format!("{} unanswered", record.call),
            };
            *answers.entry(key).or_default() += 1;
        }
        let odd = self.odd_claims.lock().unwrap();
        format!(
            "{} leases ended; answers: {answers:?}; odd claim answers ({}): {:?}",
            self.ended.load(Ordering::SeqCst),
            odd.len(),
            odd.iter().rev().take(5).collect::<Vec<_>>()
        )
    }
}

/// Ends one lease (complete, or a permanent failure for [`is_bad`]
/// events), repeating the call on the next node while it is unanswered
/// or `503`, as a real worker would; records every answer.
async fn end_lease(crew: Arc<Crew>, worker: usize, lease: Value) {
    let event = lease["event"]["id"].as_str().unwrap().to_string();
    let id = lease["lease_id"].as_str().unwrap().to_string();
    let (what, body) = if is_bad(&event) {
        (
            "fail",
            json!({ "error": { "code": "bad_input", "message": "odd" }, "permanent": true }),
        )
    } else {
        ("complete", json!({ "result": { "by": worker } }))
    };
    let mut record = Record {
        event,
        lease: id.clone(),
        worker,
        call: what,
        answer: None,
    };
    // Sent: if this worker is killed now, the call may still be recorded.
    crew.records.lock().unwrap().push(Record {
        call: "sent",
        ..record.clone()
    });
    for turn in worker.. {
        let answer = call(&crew.base(turn), &format!("/v1/leases/{id}/{what}"), &body).await;
        record.answer = answer
            .as_ref()
            .map(|(s, b)| (*s, b["error"]["code"].as_str().unwrap_or("").to_string()));
        crew.records.lock().unwrap().push(record.clone());
        match answer {
            Some((200, _)) => {
                crew.ended.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Some((503, _)) | None if !crew.stop.load(Ordering::SeqCst) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return,
        }
    }
}

/// A worker: claims batches through the live nodes in turn and ends each
/// lease, all of a batch at once, until `stop`.
async fn run_worker(crew: Arc<Crew>, worker: usize) {
    let name = format!("w{worker}");
    let body =
        json!({ "worker_id": name, "max_events": 100, "lease_ms": 10_000, "wait_ms": 1_000 });
    let mut turn = worker;
    while !crew.stop.load(Ordering::SeqCst) {
        turn += 1;
        let leases = match call(&crew.base(turn), "/v1/tenants/crew/leases", &body).await {
            Some((200, answer)) => answer["leases"].as_array().unwrap().clone(),
            Some((503, _)) | None => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Some((status, answer)) => {
                // Reported if the run stalls; a worker keeps working.
                {
                    let mut odd = crew.odd_claims.lock().unwrap();
                    if odd.len() < 1_000 {
                        odd.push(format!("{status} {answer}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut running = tokio::task::JoinSet::new();
        for lease in leases {
            running.spawn(end_lease(crew.clone(), worker, lease));
        }
        // Dropping the set (the worker killed) aborts its calls too.
        while running.join_next().await.is_some() {}
    }
}

/// Every event of `tenant` with `status`, paged: id → event.
async fn events_with_status(base: &str, tenant: &str, status: &str) -> HashMap<String, Value> {
    let mut events = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/tenants/{tenant}/events?status={status}&limit=500");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        // A node busy taking over a dead node's partitions may answer
        // `503 store_unavailable` (its database pool is full): retry, as
        // clients are told to.
        // A request that gets no answer in time is asked again.
        let deadline = Instant::now() + SETTLE;
        let body = loop {
            let answer = belfry_testkit::http_client()
                .get(&url)
                .timeout(Duration::from_secs(20))
                .send()
                .await;
            let (code, body) = match answer {
                Ok(response) => {
                    let code = response.status().as_u16();
                    let bytes = response.bytes().await.unwrap_or_default();
                    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
                }
                Err(error) => (0, Value::String(error.to_string())),
            };
            if code == 200 {
                break body;
            }
            assert!(
                (code == 503 || code == 0) && Instant::now() < deadline,
                "{code}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        for event in body["events"].as_array().unwrap() {
            events.insert(event["id"].as_str().unwrap().to_string(), event.clone());
        }
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return events,
        }
    }
}

/// The done-when: 3 workers and 2 nodes process the events of a
/// pull tenant while one worker and one node are each killed with -9 (the
/// node is not restarted: the survivor takes its partitions over). Every
/// event ends delivered or failed with its reason, and no event is ended
/// by two leases (a second lease of an event only ever follows a first
/// one's `lease_lost`, or a call its worker never saw answered).
///
/// 10,000 events by default (about 30 s here); the 100,000 with
/// `BELFRY_TEST_PULL_EVENTS=100000` (66–74 s on the 2-core machine with
/// batched lease writes; 216 s before them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn done_when_3_workers_and_2_nodes_process_events_through_kill_9_of_a_worker_and_a_node() {
    let total: usize = std::env::var("BELFRY_TEST_PULL_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let started = Instant::now();
    let url = PgServer::shared().fresh_database().await;
    let (mut nodes, _dirs) = two_nodes(&url).await;
    pull_tenant(&nodes[0], "crew").await;
    let bases: Vec<String> = nodes.iter().map(|n| n.base_url()).collect();
    let ids: Vec<String> = (0..total).map(|i| format!("e{i}")).collect();
    schedule(&bases, "crew", &ids, now_ms()).await;
    let scheduled = started.elapsed();

    let crew = Arc::new(Crew {
        bases: Mutex::new(bases.clone()),
        records: Mutex::new(Vec::new()),
        ended: AtomicUsize::new(0),
        odd_claims: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
    });
    let mut workers: Vec<_> = (0..3)
        .map(|w| tokio::spawn(run_worker(crew.clone(), w)))
        .collect();
    // Well inside nextest's 600 s, so a stalled run reports what it saw.
    let deadline = Instant::now() + Duration::from_secs(180 + total as u64 / 250);
    while crew.ended.load(Ordering::SeqCst) < total / 3 {
        assert!(
            Instant::now() < deadline,
            "workers stalled: {}\n{}\n{}",
            crew.report(),
            nodes[0].logs_tail(30),
            nodes[1].logs_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // kill -9 of worker 0 (its calls in flight die with it) and node 1.
    workers.remove(0).abort();
    nodes[1].kill_9();
    crew.bases.lock().unwrap().retain(|b| *b != bases[1]);
    let killed_at = started.elapsed();

    let survivor = bases[0].clone();
    let (delivered, failed) = loop {
        assert!(
            Instant::now() < deadline,
            "not every event ended: {}\n{}",
            crew.report(),
            nodes[0].logs_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Only the killed worker's last batch may end unseen.
        if crew.ended.load(Ordering::SeqCst) + 100 < total {
            continue;
        }
        let delivered = events_with_status(&survivor, "crew", "delivered").await;
        let failed = events_with_status(&survivor, "crew", "failed").await;
        if delivered.len() + failed.len() == total {
            break (delivered, failed);
        }
    };
    let processed = started.elapsed();
    crew.stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }
    let odd = crew.odd_claims.lock().unwrap().clone();
    assert!(
        odd.is_empty(),
        "claims answered neither 200 nor 503: {odd:?}"
    );

    for (id, event) in &failed {
        assert!(is_bad(id), "only bad events fail: {event}");
        assert!(
            event["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("bad_input")),
            "the reason is recorded: {event}"
        );
    }
    assert_eq!(failed.len(), ids.iter().filter(|id| is_bad(id)).count());

    let records = crew.records.lock().unwrap().clone();
    let mut ended_by: HashMap<&str, HashSet<&str>> = HashMap::new();
    let mut lost = 0;
    let mut unavailable = 0;
    for record in records.iter().filter(|r| r.call != "sent") {
        match &record.answer {
            Some((200, _)) => {
                ended_by
                    .entry(&record.event)
                    .or_default()
                    .insert(&record.lease);
            }
            Some((409, code)) if code == "lease_lost" => lost += 1,
            Some((503, code)) if code == "node_unavailable" || code == "store_unavailable" => {
                unavailable += 1;
            }
            Some(_) => panic!("unexpected answer {record:?}"),
            None => {}
        }
    }
    let twice: Vec<_> = ended_by.iter().filter(|(_, l)| l.len() > 1).collect();
    assert!(twice.is_empty(), "events ended by two leases: {twice:?}");
    // Every event ended with a 200 to one worker, or by a call its worker
    // never saw answered: the killed worker's, or one in flight on the
    // killed node. A call the killed node recorded is answered `200` from
    // the store's record by the survivor, whether it forwarded the call
    // there or the worker repeated it (docs/pull.md).
    let unanswered: HashSet<&str> = records
        .iter()
        .filter(|r| (r.call == "sent" && r.worker == 0) || (r.call != "sent" && r.answer.is_none()))
        .map(|r| r.event.as_str())
        .collect();
    for id in delivered.keys().chain(failed.keys()) {
        assert!(
            ended_by.contains_key(id.as_str()) || unanswered.contains(id.as_str()),
            "{id} ended without a 200 to any worker: {:?}",
            records
                .iter()
                .filter(|r| r.event == *id)
                .collect::<Vec<_>>()
        );
    }
    eprintln!(
        "{total} events: scheduled in {:.1} s, kill at {:.1} s, all ended at {:.1} s; \
         {} delivered, {} failed; {} calls, {lost} lease_lost, {unavailable} unavailable (503)",
        scheduled.as_secs_f64(),
        killed_at.as_secs_f64(),
        processed.as_secs_f64(),
        delivered.len(),
        failed.len(),
        records.iter().filter(|r| r.call != "sent").count(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_keep_their_queues_and_a_batch_completion_reaches_both_nodes_through_one() {
    let url = PgServer::shared().fresh_database().await;
    let (nodes, _dirs) = two_nodes(&url).await;
    let owned = owned_by(&nodes[0], &nodes).await;
    pull_tenant(&nodes[0], "q").await;
    let a = nodes[0].base_url();
    // Node 1's partitions only: every lease the worker gets through node 0
    // comes from the other node.
    let alpha = ids_in("q", "alpha-", &owned[1], 3);
    let beta = ids_in("q", "beta-", &owned[1], 3);
    let due = rfc3339(now_ms());
    for (ids, queue) in [(&alpha, "alpha"), (&beta, "beta")] {
        for id in ids {
            let (status, body) = put_json(
                &nodes[1].url(&format!("/v1/tenants/q/events/{id}")),
                &json!({ "deliver_at": due, "queue": queue }),
            )
            .await;
            assert_eq!(status, 201, "{body}");
        }
    }

    // A claim naming `beta` gets only beta's events, through node 0.
    let mut leases: Vec<Value> = Vec::new();
    let deadline = Instant::now() + SETTLE;
    while leases.len() < beta.len() {
        assert!(Instant::now() < deadline, "claimed only {leases:?}");
        let body =
            json!({ "worker_id": "w", "max_events": 10, "wait_ms": 1_000, "queues": ["beta"] });
        let (status, answer) = call(&a, "/v1/tenants/q/leases", &body)
            .await
            .expect("the node answers");
        assert_eq!(status, 200, "{answer}");
        for lease in answer["leases"].as_array().unwrap() {
            assert_eq!(lease["queue"], "beta", "{lease}");
            leases.push(lease.clone());
        }
    }
    // Then alpha's, with no queue named.
    while leases.len() < beta.len() + alpha.len() {
        assert!(Instant::now() < deadline, "claimed only {leases:?}");
        leases.extend(claim(&a, "q", "w", 10, 30_000, 1_000).await);
    }

    // One batch through node 0 completes leases node 1 holds, and answers
    // a stale one (completed already through node 1) on its own.
    let (status, done) = lease_call(&nodes[1].base_url(), &leases[0], "complete").await;
    assert_eq!(status, 200, "{done}");
    let items: Vec<Value> = leases
        .iter()
        .map(|lease| json!({ "lease_id": lease["lease_id"] }))
        .collect();
    let forged = {
        let mut text = leases[1]["lease_id"].as_str().unwrap().to_string();
        text.pop();
        text.push(if text.ends_with('A') { 'B' } else { 'A' });
        text
    };
    let mut with_forged = items.clone();
    with_forged.push(json!({ "lease_id": forged }));
    let (status, answer) = call(
        &a,
        "/v1/tenants/q/leases/complete",
        &json!({ "leases": with_forged }),
    )
    .await
    .expect("the node answers");
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), leases.len() + 1, "{answer}");
    for (result, lease) in results.iter().zip(&leases) {
        assert_eq!(result["lease_id"], lease["lease_id"], "in order: {answer}");
        assert_eq!(result["state"], "delivered", "{result}");
    }
    let last = results.last().unwrap();
    assert!(last.get("state").is_none(), "{last}");
    assert!(last["error"]["code"].is_string(), "{last}");
    for id in alpha.iter().chain(&beta) {
        let (_, event) = get_json(&nodes[0].url(&format!("/v1/tenants/q/events/{id}"))).await;
        assert_eq!(event["status"], "delivered", "{event}");
    }
}

/// `POST path` with `body` and, if given, the key as a bearer token.
async fn post_as(base: &str, key: Option<&str>, path: &str, body: &Value) -> (u16, Value) {
    let mut request = belfry_testkit::http_client()
        .post(format!("{base}{path}"))
        .timeout(Duration::from_secs(40))
        .json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    answer_of(request).await
}

async fn answer_of(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("the node answers");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One HTTP/1.1 request as it crossed the wire.
#[derive(Debug, Clone)]
struct Captured {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Captured {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Sends it again, as it was (but for `changed` headers: `None`
    /// leaves one out), to `base`.
    async fn send_to(&self, base: &str, changed: &[(&str, Option<&str>)]) -> (u16, Value) {
        let mut request = belfry_testkit::http_client()
            .post(format!("{base}{}", self.path))
            .timeout(Duration::from_secs(40))
            .body(self.body.clone());
        for (name, value) in &self.headers {
            let skip = ["host", "content-length"].contains(&name.to_ascii_lowercase().as_str())
                || changed.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
            if !skip {
                request = request.header(name, value);
            }
        }
        for (name, value) in changed {
            if let Some(value) = value {
                request = request.header(*name, *value);
            }
        }
        answer_of(request).await
    }
}

/// The requests (with `content-length` bodies, as nodes send them) in the
/// bytes a client sent on one connection.
fn requests_in(mut bytes: &[u8]) -> Vec<Captured> {
    let mut found = Vec::new();
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let first = lines.next().unwrap_or_default();
        let path = first.split(' ').nth(1).unwrap_or_default().to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let start = end + 4;
        if bytes.len() < start + length {
            break;
        }
        found.push(Captured {
            path,
            headers,
            body: bytes[start..start + length].to_vec(),
        });
        bytes = &bytes[start + length..];
    }
    found
}

/// A TCP relay to a port on 127.0.0.1 that keeps what clients sent
/// through it: a node advertising the relay's address is reached through
/// it, so the test sees what other nodes send that node.
struct Relay {
    port: u16,
    /// What clients sent, per connection.
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Relay {
    async fn to(upstream: u16) -> Relay {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let record = sent.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let index = {
                        let mut record = record.lock().unwrap();
                        record.push(Vec::new());
                        record.len() - 1
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = async {
                        let mut buffer = [0_u8; 8192];
                        while let Ok(read) = client_read.read(&mut buffer).await {
                            if read == 0 {
                                break;
                            }
                            record.lock().unwrap()[index].extend_from_slice(&buffer[..read]);
                            if server_write.write_all(&buffer[..read]).await.is_err() {
                                break;
                            }
                        }
                        let _ = server_write.shutdown().await;
                    };
                    let downstream = async {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    };
                    tokio::join!(upstream, downstream);
                });
            }
        });
        Relay { port, sent }
    }

    fn requests(&self) -> Vec<Captured> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .flat_map(|bytes| requests_in(bytes))
            .collect()
    }
}

/// The cluster as `node` sees it (`GET /v1/cluster`), once every one of
/// `count` nodes owns partitions and none is unowned or moving.
async fn settled_view(node: &BelfryProcess, admin: &str, count: usize) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        assert!(Instant::now() < deadline, "the partitions never settled");
        let (status, view) = answer_of(
            belfry_testkit::http_client()
                .get(node.url("/v1/cluster"))
                .bearer_auth(admin),
        )
        .await;
        let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
        let settled = status == 200
            && nodes.len() == count
            && view.get("unowned").is_none()
            && nodes.iter().all(|n| {
                let partitions = n["partitions"].as_array().cloned().unwrap_or_default();
                !partitions.is_empty() && partitions.iter().all(|p| p.get("moving_to").is_none())
            });
        if settled {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The partitions and id of the node advertised at `address` in `view`.
fn node_at(view: &Value, address: &str) -> (String, HashSet<u16>) {
    let node = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["address"] == address)
        .unwrap_or_else(|| panic!("no node at {address}: {view}"));
    let partitions = node["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["partition"].as_u64().unwrap() as u16)
        .collect();
    (node["id"].as_str().unwrap().to_string(), partitions)
}

/// Node A forwards a worker's calls to node B, which is reached through a
/// relay that keeps what A sent. The forward is signed for B, and the
/// worker's key does not travel. Sent again — to B (a replay), to C
/// (another node), with the marker but another principal, or without the
/// marker — it is refused; so is a marker forged by a client, with or
/// without a valid worker key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_are_signed_for_one_node_and_a_forged_replayed_or_redirected_one_is_refused() {
    let url = PgServer::shared().fresh_database().await;
    let admin = belfry_core::auth::KeySecret::generate().unwrap();
    let admin = admin.expose();
    let keyed = |launch: BelfryLaunch| launch.env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", admin);
    let (a, _a_dir) = start_node_with(&url, keyed).await;
    let b_port = free_port();
    let relay = Relay::to(b_port).await;
    let b_address = format!("127.0.0.1:{}", relay.port);
    let (b, _b_dir) = start_node_with(&url, |launch| {
        keyed(launch)
            .port(b_port)
            .arg("--advertise")
            .arg(b_address.clone())
    })
    .await;
    let (c, _c_dir) = start_node_with(&url, keyed).await;
    settled_view(&b, admin, 3).await;
    let view = settled_view(&a, admin, 3).await;
    let (b_id, b_owns) = node_at(&view, &b_address);

    let (status, body) = answer_of(
        belfry_testkit::http_client()
            .put(a.url("/v1/tenants/jobs"))
            .bearer_auth(admin)
            .json(&json!({ "sink": { "type": "pull" } })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, key) = post_as(
        &a.base_url(),
        Some(admin),
        "/v1/keys",
        &json!({ "role": "worker", "tenant": "jobs" }),
    )
    .await;
    assert_eq!(status, 201, "{key}");
    let worker = key["secret"].as_str().unwrap().to_string();
    let ids = ids_in("jobs", "e", &b_owns, 3);
    let events: Vec<Value> = ids
        .iter()
        .map(|id| json!({ "id": id, "deliver_at": rfc3339(now_ms()) }))
        .collect();
    let (status, body) = post_as(
        &a.base_url(),
        Some(admin),
        "/v1/tenants/jobs/events",
        &json!({ "events": events }),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");

    // The worker reaches A only; B's entries come through A.
    let claim_body = json!({ "worker_id": "w", "max_events": 10, "wait_ms": 1_000 });
    let mut leases = Vec::new();
    let deadline = Instant::now() + SETTLE;
    while leases.len() < ids.len() {
        assert!(Instant::now() < deadline, "claimed only {leases:?}");
        let (status, answer) = post_as(
            &a.base_url(),
            Some(&worker),
            "/v1/tenants/jobs/leases",
            &claim_body,
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        leases.extend(answer["leases"].as_array().unwrap().iter().cloned());
    }
    let beat = format!(
        "/v1/leases/{}/heartbeat",
        leases[0]["lease_id"].as_str().unwrap()
    );
    let (status, answer) = post_as(&a.base_url(), Some(&worker), &beat, &json!({})).await;
    assert_eq!(status, 200, "{answer}");

    let captured = relay.requests();
    let forwarded = captured
        .iter()
        .find(|r| r.path == beat)
        .unwrap_or_else(|| panic!("the heartbeat never went through B's relay: {captured:?}"));
    for request in &captured {
        assert!(
            request.header("authorization").is_none(),
            "the worker's key was sent to another node: {request:?}"
        );
        assert!(
            request.header("belfry-forwarded-signature").is_some(),
            "an unsigned call between nodes: {request:?}"
        );
        assert_eq!(request.header("belfry-forwarded-to"), Some(b_id.as_str()));
    }

    let refused = |(status, answer): (u16, Value), what: &str| {
        assert_eq!(status, 403, "{what}: {answer}");
        assert_eq!(
            answer["error"]["code"], "forward_refused",
            "{what}: {answer}"
        );
    };
    refused(forwarded.send_to(&b.base_url(), &[]).await, "replayed to B");
    refused(forwarded.send_to(&c.base_url(), &[]).await, "sent to C");
    refused(
        forwarded
            .send_to(&b.base_url(), &[("belfry-forwarded-for", Some("admin -"))])
            .await,
        "another principal",
    );
    // Without the marker it is a client's request, and carries no key.
    let (status, answer) = forwarded
        .send_to(&b.base_url(), &[("belfry-forwarded", None)])
        .await;
    assert_eq!(status, 401, "{answer}");

    // A marker forged by a client: refused, with a worker key or without.
    let forged = [
        ("belfry-forwarded", a_id(&view, &b_address)),
        ("belfry-forwarded-to", b_id.clone()),
        ("belfry-forwarded-at", now_ms().to_string()),
        ("belfry-forwarded-nonce", "00".repeat(16)),
        ("belfry-forwarded-for", "admin -".to_string()),
        (
            "belfry-forwarded-signature",
            format!("v1={}", "00".repeat(32)),
        ),
    ];
    for key in [None, Some(worker.as_str())] {
        let mut request = belfry_testkit::http_client()
            .post(b.url("/v1/tenants/jobs/leases"))
            .json(&claim_body);
        for (name, value) in &forged {
            request = request.header(*name, value);
        }
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        refused(answer_of(request).await, "forged");
        let mut marker_only = belfry_testkit::http_client()
            .post(b.url(&beat))
            .header("belfry-forwarded", "x")
            .json(&json!({}));
        if let Some(key) = key {
            marker_only = marker_only.bearer_auth(key);
        }
        refused(answer_of(marker_only).await, "marker only");
    }

    // The real path still works: every lease completes through A.
    for lease in &leases {
        let done = format!(
            "/v1/leases/{}/complete",
            lease["lease_id"].as_str().unwrap()
        );
        let (status, answer) = post_as(&a.base_url(), Some(&worker), &done, &json!({})).await;
        assert_eq!(status, 200, "{answer}");
    }
}

/// The id of a node of `view` other than the one at `address`.
fn a_id(view: &Value, address: &str) -> String {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["address"] != address)
        .and_then(|n| n["id"].as_str())
        .unwrap()
        .to_string()
}

/// A node with `HTTP_PROXY` set (for its webhooks) still calls the other
/// nodes directly: a proxy that records connections sees none, and the
/// forwards work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_between_nodes_never_go_through_a_proxy() {
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = proxy.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    let url = PgServer::shared().fresh_database().await;
    let (a, _a_dir) = start_node_with(&url, |launch| {
        ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"]
            .into_iter()
            .fold(launch, |launch, name| launch.env(name, proxy_url.clone()))
            .env("NO_PROXY", "")
            .env("no_proxy", "")
    })
    .await;
    let (b, _b_dir) = start_node(&url).await;
    let nodes = vec![a, b];
    let deadline = Instant::now() + SETTLE;
    let owned = loop {
        assert!(Instant::now() < deadline, "the partitions never spread");
        let owned = owned_by(&nodes[0], &nodes).await;
        if owned.iter().all(|o| !o.is_empty())
            && owned.iter().map(HashSet::len).sum::<usize>() == 64
        {
            break owned;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    pull_tenant(&nodes[0], "jobs").await;
    let ids = ids_in("jobs", "p", &owned[1], 3);
    schedule(&[nodes[1].base_url()], "jobs", &ids, now_ms()).await;

    let a = nodes[0].base_url();
    let mut leases = Vec::new();
    let deadline = Instant::now() + SETTLE;
    while leases.len() < ids.len() {
        assert_eq!(
            connections.load(Ordering::SeqCst),
            0,
            "a call to another node went to the proxy"
        );
        assert!(Instant::now() < deadline, "claimed only {leases:?}");
        leases.extend(claim(&a, "jobs", "w", 10, 30_000, 1_000).await);
    }
    for lease in &leases {
        let (status, done) = lease_call(&a, lease, "complete").await;
        assert_eq!(status, 200, "{done}");
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a call went to the proxy"
    );
}
