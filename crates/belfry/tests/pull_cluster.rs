//! Pull workers in a cluster (`docs/pull.md`, "In a cluster"): real
//! `belfry` nodes sharing a real PostgreSQL, workers making real HTTP
//! calls to one node for events whose partitions another node owns, and
//! the done-when scenario (kill -9 of a worker and of a node while
//! 3 workers and 2 nodes process 100,000 events).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_core::{EventId, EventKey, PartitionCount, TenantName};
use belfry_testkit::postgres::PgServer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

const SETTLE: Duration = Duration::from_secs(60);
const PARTITIONS: u16 = 64;

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

/// `POST path` with `body`; `None` when the node did not answer.
async fn call(base: &str, path: &str, body: &Value) -> Option<(u16, Value)> {
    let response = belfry_testkit::http_client()
        .post(format!("{base}{path}"))
        .timeout(Duration::from_secs(40))
        .json(body)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await.ok()?;
    Some((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
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
