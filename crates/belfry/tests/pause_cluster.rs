//! Pausing and resuming a tenant in a cluster: two real `belfry` nodes
//! sharing a real PostgreSQL, a real webhook receiver, and one tenant whose
//! events come due on partitions of both nodes.
//!
//! The contract under test (`docs/api.md`, "Pause and resume"): a pause
//! takes effect at once on the node that took it, and on the others as
//! soon as the store's announcement of it arrives, so no event due a
//! moment after the pause answered is delivered by any node; a resume
//! reaches the other nodes the same way; after it every event arrives
//! once, on its first attempt, each partition's in due order. (Were the
//! announcement lost, the bounds would be the other nodes' tenant cache,
//! 5 s, and a held partition's recheck, about 10 s.)
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use belfry_core::{EventId, EventKey, PartitionCount, TenantName};
use belfry_testkit::postgres::PgServer;
use belfry_testkit::{
    BelfryLaunch, BelfryProcess, Receiver, RecordedRequest, get_json, post_json, put_json,
};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339, sample, scrape};

/// Generous bound for the cluster to settle and for the backlog to drain.
const SETTLE: Duration = Duration::from_secs(60);

/// How long another node may go on delivering a paused tenant's events:
/// the store's announcement reaching it, on a loaded machine.
const OTHER_NODE_SEES_PAUSE_MS: i64 = 1_000;

/// How long another node may hold a resumed tenant's events: the same.
const OTHER_NODE_SEES_RESUME_MS: i64 = 1_000;

/// Room for a delivery checked just before the bound to reach the receiver.
const IN_FLIGHT_MS: i64 = 1_500;

/// One delivery at a time per node for the tenant: each partition's
/// events then reach the receiver in due order.
async fn start_node(url: &str, dir: &std::path::Path) -> BelfryProcess {
    let config = dir.join("belfry.toml");
    std::fs::write(
        &config,
        "[limits.tenants.\"acme\"]\nmax_concurrent_deliveries = 1\n",
    )
    .unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("unused"))
        .arg("--database-url")
        .arg(url)
        .arg("--config")
        .arg(config.to_str().unwrap());
    BelfryProcess::start(launch).await.expect("node starts")
}

/// Partition → the index in `nodes` of its owner, once the partitions are
/// spread evenly (32 each) and both nodes agree on who owns what.
async fn owners_when_balanced(nodes: &[BelfryProcess]) -> HashMap<u16, usize> {
    let deadline = Instant::now() + SETTLE;
    'poll: loop {
        assert!(
            Instant::now() < deadline,
            "the partitions never spread evenly"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut seen = Vec::new();
        for node in nodes {
            let (_, detail) = get_json(&node.url("/v1/cluster")).await;
            let Some(members) = detail["nodes"].as_array() else {
                continue 'poll;
            };
            let mut owners = HashMap::new();
            for member in members {
                let address = member["address"].as_str().unwrap_or_default();
                let Some(index) = nodes.iter().position(|n| n.base_url().ends_with(address)) else {
                    continue 'poll;
                };
                let partitions = member["partitions"].as_array().cloned().unwrap_or_default();
                if partitions.len() != 32 || member.get("moving_to").is_some() {
                    continue 'poll;
                }
                for partition in partitions {
                    if partition.get("moving_to").is_some() {
                        continue 'poll;
                    }
                    owners.insert(partition["partition"].as_u64().unwrap() as u16, index);
                }
            }
            if owners.len() != 64 {
                continue 'poll;
            }
            seen.push(owners);
        }
        if seen.windows(2).all(|pair| pair[0] == pair[1]) {
            return seen.pop().unwrap();
        }
    }
}

fn partition_of(id: &str) -> u16 {
    let key = EventKey::new(TenantName::new("acme").unwrap(), EventId::new(id).unwrap());
    PartitionCount::DEFAULT.partition_of(&key).0
}

/// One scheduled event.
struct Planned {
    due: i64,
    partition: u16,
    /// Index of the node owning its partition.
    owner: usize,
}

/// Sleeps until the wall-clock instant `at_ms`.
async fn sleep_until_ms(at_ms: i64) {
    tokio::time::sleep(Duration::from_millis((at_ms - now_ms()).max(0) as u64)).await;
}

fn event_id(request: &RecordedRequest) -> String {
    request
        .header("x-belfry-event-id")
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_through_one_node_holds_the_others_at_once_and_a_resume_through_another_delivers_all_in_order()
 {
    let url = PgServer::shared().fresh_database().await;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut nodes = Vec::new();
    for dir in &dirs {
        nodes.push(start_node(&url, dir.path()).await);
    }
    let owners = owners_when_balanced(&nodes).await;
    let (a, b) = (0, 1);

    let receiver = Receiver::start().await;
    receiver.reserve(2_000);
    let (status, body) = put_json(
        &nodes[a].url("/v1/tenants/acme"),
        &json!({"sink": {"type": "http", "url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // An event every 20 ms for 12 s, through both nodes; the pause comes
    // 2 s in, so both nodes are delivering the tenant (and have it in
    // their caches) when it comes.
    let first_due = now_ms() + 3_000;
    let mut planned: BTreeMap<String, Planned> = BTreeMap::new();
    let ids: Vec<String> = (0..600).map(|i| format!("p{i:04}")).collect();
    for (chunk, ids) in ids.chunks(200).enumerate() {
        let batch: Vec<Value> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let due = first_due + (chunk * 200 + i) as i64 * 20;
                let partition = partition_of(id);
                planned.insert(
                    id.clone(),
                    Planned {
                        due,
                        partition,
                        owner: owners[&partition],
                    },
                );
                json!({"id": id, "tenant": "acme", "eventTime": rfc3339(due), "payload": id})
            })
            .collect();
        let node = &nodes[chunk % 2];
        let (status, body) = post_json(&node.url("/events/schedule"), &Value::Array(batch)).await;
        assert_eq!(status, 200, "{body}");
    }
    assert!(now_ms() < first_due, "scheduling took too long");
    for owner in [a, b] {
        assert!(
            planned.values().filter(|p| p.owner == owner).count() > 200,
            "the events are not spread over both nodes"
        );
    }
    let last_due = planned.values().map(|p| p.due).max().unwrap();

    // Replacing the tenant (as it was) through node B drops it from B's
    // cache; B's next delivery reads it again. The pause then finds B's
    // cache at its freshest: only the announcement stops B before the
    // cache's 5 s are out.
    sleep_until_ms(first_due + 1_800).await;
    let (status, body) = put_json(
        &nodes[b].url("/v1/tenants/acme"),
        &json!({"sink": {"type": "http", "url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    sleep_until_ms(first_due + 2_000).await;
    let before_pause = receiver.requests();
    assert!(
        before_pause
            .iter()
            .any(|r| planned[&event_id(r)].owner == b),
        "node B delivered nothing before the pause: the test would prove nothing"
    );
    let (status, paused) = post_json(
        &nodes[a].url("/v1/tenants/acme/pause"),
        &json!({"reason": "receiver incident"}),
    )
    .await;
    let paused_at = now_ms();
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["pause"]["paused"], true, "{paused}");

    // Both nodes show the pause at once: their views read the store.
    for node in [a, b] {
        let (status, view) = get_json(&nodes[node].url("/v1/tenants/acme")).await;
        assert_eq!(status, 200, "{view}");
        assert_eq!(view["pause"], paused["pause"], "node {node}: {view}");
    }

    // Past node B's window and the in-flight room, nothing arrives any more.
    sleep_until_ms(paused_at + OTHER_NODE_SEES_PAUSE_MS + IN_FLIGHT_MS).await;
    let settled = receiver.count();
    sleep_until_ms(last_due + 2_000).await;
    let while_paused = receiver.requests();
    assert_eq!(
        while_paused.len(),
        settled,
        "deliveries arrived more than {} ms after the pause answered",
        OTHER_NODE_SEES_PAUSE_MS + IN_FLIGHT_MS
    );
    let mut late_on_b = 0;
    let mut latest_on_b = i64::MIN;
    for request in &while_paused {
        let id = event_id(request);
        let event = &planned[&id];
        // Node A holds at once: nothing of its own due after the answer.
        assert!(
            event.owner != a || event.due < paused_at,
            "{id} (node A's partition {}) due {} ms after the pause answered, delivered",
            event.partition,
            event.due - paused_at
        );
        // Node B once the announcement reached it.
        assert!(
            event.due < paused_at + OTHER_NODE_SEES_PAUSE_MS,
            "{id} (node B's partition {}) due {} ms after the pause answered, delivered",
            event.partition,
            event.due - paused_at
        );
        if event.owner == b && event.due >= paused_at {
            late_on_b += 1;
            latest_on_b = latest_on_b.max(event.due - paused_at);
        }
    }
    eprintln!(
        "node B delivered {late_on_b} events due after the pause answered, the last due {latest_on_b} ms after it (allowed: those due within {OTHER_NODE_SEES_PAUSE_MS} ms)"
    );
    let held: Vec<&String> = planned
        .keys()
        .filter(|id| !while_paused.iter().any(|r| event_id(r) == **id))
        .collect();
    assert!(
        held.len() > 300,
        "only {} events held: the pause came too late to test anything",
        held.len()
    );
    // The held events wait with no attempt spent, whichever node is asked.
    for owner in [a, b] {
        let id = held
            .iter()
            .rev()
            .find(|id| planned[**id].owner == owner)
            .expect("held events on both nodes");
        let asked = &nodes[1 - owner];
        let (status, event) = get_json(&asked.url(&format!("/v1/tenants/acme/events/{id}"))).await;
        assert_eq!(status, 200, "{event}");
        assert_eq!(event["status"], "scheduled", "{event}");
        assert_eq!(event["attempts"], 0, "{event}");
    }
    for node in [a, b] {
        let (_, view) = get_json(&nodes[node].url("/v1/tenants/acme")).await;
        assert_eq!(view["pause"]["paused"], true, "node {node}: {view}");
        assert_eq!(view["pause"]["since"], paused["pause"]["since"]);
        let metrics = scrape(&nodes[node]).await;
        assert_eq!(
            sample(&metrics, r#"belfry_tenant_paused{tenant="acme"}"#),
            Some(1.0),
            "node {node}: {metrics}"
        );
    }

    // Resume through the other node.
    let resume_sent = now_ms();
    let (status, resumed) = post_json(&nodes[b].url("/v1/tenants/acme/resume"), &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["pause"]["paused"], false, "{resumed}");
    for node in [a, b] {
        let (_, view) = get_json(&nodes[node].url("/v1/tenants/acme")).await;
        assert_eq!(view["pause"]["paused"], false, "node {node}: {view}");
    }

    let deadline = Instant::now() + SETTLE;
    while receiver.count() < planned.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} delivered {SETTLE:?} after the resume",
            receiver.count(),
            planned.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let anything extra (a duplicate) show up before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let requests = receiver.requests();
    let mut arrivals: HashMap<String, Vec<&RecordedRequest>> = HashMap::new();
    for request in &requests {
        arrivals.entry(event_id(request)).or_default().push(request);
    }
    let missing: Vec<&String> = planned
        .keys()
        .filter(|id| !arrivals.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    let doubled: Vec<&String> = arrivals
        .iter()
        .filter(|(_, got)| got.len() > 1)
        .map(|(id, _)| id)
        .collect();
    assert!(doubled.is_empty(), "delivered more than once: {doubled:?}");
    assert_eq!(requests.len(), planned.len(), "only the tenant's events");

    let mut first_after_resume: [Option<i64>; 2] = [None, None];
    for id in &held {
        let request = arrivals[*id][0];
        let event = &planned[*id];
        assert!(
            request.arrived_at_ms >= resume_sent,
            "{id} held, then delivered before the resume"
        );
        assert_eq!(request.header("x-belfry-attempt"), Some("1"), "{id}");
        let first = &mut first_after_resume[event.owner];
        *first = Some(first.map_or(request.arrived_at_ms, |at| at.min(request.arrived_at_ms)));
    }
    // Node B took the resume: its held partitions go on at once; node A
    // once the announcement reached it.
    for (owner, bound) in [(b, 1_000), (a, OTHER_NODE_SEES_RESUME_MS)] {
        let first = first_after_resume[owner].expect("held events on both nodes");
        eprintln!(
            "node {owner}: first held event delivered {} ms after the resume was sent",
            first - resume_sent
        );
        assert!(
            first - resume_sent <= bound,
            "node {owner} delivered its first held event {} ms after the resume (bound {bound} ms)",
            first - resume_sent
        );
    }

    // Each partition's events reached the receiver in due order.
    let mut per_partition: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for request in &requests {
        let id = request.header("x-belfry-event-id").unwrap_or_default();
        per_partition
            .entry(planned[id].partition)
            .or_default()
            .push(id);
    }
    for (partition, arrived) in &per_partition {
        let mut in_due_order = arrived.clone();
        in_due_order.sort_by_key(|id| (planned[*id].due, *id));
        assert_eq!(
            arrived, &in_due_order,
            "partition {partition} delivered out of due order"
        );
    }
    for node in [a, b] {
        let metrics = scrape(&nodes[node]).await;
        assert_eq!(
            sample(&metrics, r#"belfry_tenant_paused{tenant="acme"}"#),
            Some(0.0),
            "node {node}: {metrics}"
        );
    }
}
