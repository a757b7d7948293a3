//! Pausing and resuming a tenant's deliveries, on the real `belfry`
//! binary with a real webhook receiver: a paused tenant gets nothing while
//! its events come due, the pause survives a kill -9, and after the resume
//! every event arrives once, in due order, on its first attempt.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashSet;
use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339, sample, scrape};

/// Generous bounds: tests check behaviour, benchmarks measure speed.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(120);

/// One partition and one delivery at a time for the tenant: the receiver
/// then sees the due order itself (with several partitions, or several
/// deliveries in flight, a backlog due at once arrives interleaved, as
/// after any downtime).
async fn start_node(dir: &std::path::Path) -> BelfryProcess {
    let config = dir.join("belfry.toml");
    std::fs::write(
        &config,
        "[limits.tenants.\"acme\"]\nmax_concurrent_deliveries = 1\n",
    )
    .unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"))
        .arg("--partitions")
        .arg("1")
        .arg("--config")
        .arg(config.to_str().unwrap());
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn pause_resume_round(events: usize) {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.reserve(events);
    let mut node = start_node(dir.path()).await;
    let (status, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({"sink": {"type": "http", "url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let (status, paused) = post_json(
        &node.url("/v1/tenants/acme/pause"),
        &json!({"reason": "receiver incident"}),
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["pause"]["paused"], true, "{paused}");
    assert_eq!(paused["pause"]["reason"], "receiver incident");
    let since = paused["pause"]["since"].clone();
    // Idempotent: a second pause keeps when it began.
    let (status, again) = post_json(&node.url("/v1/tenants/acme/pause"), &json!({})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["pause"], paused["pause"]);

    // One event per millisecond, due from 1 s from now on.
    let first_due = now_ms() + 1_000;
    let ids: Vec<String> = (0..events).map(|i| format!("e{i:05}")).collect();
    for (chunk, ids) in ids.chunks(500).enumerate() {
        let batch: Vec<Value> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let at = first_due + (chunk * 500 + i) as i64;
                json!({"id": id, "tenant": "acme", "eventTime": rfc3339(at), "payload": id})
            })
            .collect();
        let (status, body) = post_json(&node.url("/events/schedule"), &Value::Array(batch)).await;
        assert_eq!(status, 200, "{body}");
    }
    let last_due = first_due + events as i64 - 1;

    // All came due a while ago: none was delivered, none spent an attempt.
    tokio::time::sleep(Duration::from_millis(
        (last_due + 2_000 - now_ms()).max(0) as u64
    ))
    .await;
    assert_eq!(receiver.count(), 0, "a paused tenant got deliveries");
    for id in [&ids[0], &ids[events - 1]] {
        let (status, event) = get_json(&node.url(&format!("/v1/tenants/acme/events/{id}"))).await;
        assert_eq!(status, 200, "{event}");
        assert_eq!(event["status"], "scheduled", "{event}");
        assert_eq!(event["attempts"], 0, "{event}");
    }
    let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
    assert_eq!(view["pause"]["paused"], true, "{view}");
    assert_eq!(view["pause"]["since"], since);
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, r#"belfry_tenant_paused{tenant="acme"}"#),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "belfry_tenants_paused"), Some(1.0));
    // Its pull workers would be refused too; its audit log says who paused.
    let (_, audit) = get_json(&node.url("/v1/audit")).await;
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter_map(|e| e["action"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(actions.contains(&"tenant_paused"), "{audit}");

    // The pause is durable: a kill -9 and a restart keep it.
    node.kill_9();
    node.restart().await.expect("restart after kill -9");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        receiver.count(),
        0,
        "delivered after a restart while paused"
    );
    let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
    assert_eq!(view["pause"]["paused"], true, "{view}");
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, r#"belfry_tenant_paused{tenant="acme"}"#),
        Some(1.0),
        "{metrics}"
    );

    let resumed_at = now_ms();
    let (status, resumed) = post_json(&node.url("/v1/tenants/acme/resume"), &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["pause"]["paused"], false, "{resumed}");
    receiver
        .wait_for_count(events, DELIVERY_DEADLINE)
        .await
        .unwrap();
    // Let anything extra (a duplicate) show up before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), events, "each event delivered exactly once");
    let arrived: Vec<String> = requests
        .iter()
        .map(|r| {
            r.header("x-belfry-event-id")
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        arrived.iter().collect::<HashSet<_>>().len(),
        events,
        "none lost"
    );
    assert_eq!(arrived, ids, "in due order");
    for request in &requests {
        assert!(
            request.arrived_at_ms >= resumed_at,
            "delivered before the resume"
        );
        assert_eq!(
            request.header("x-belfry-attempt"),
            Some("1"),
            "the pause spent no attempt"
        );
    }
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, r#"belfry_tenant_paused{tenant="acme"}"#),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "belfry_tenants_paused"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tenant_gets_nothing_and_everything_in_order_after_the_resume() {
    pause_resume_round(2_000).await;
}

/// The issue's size, 10,000 events (about 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_paused_events_all_arrive_in_order_after_the_resume() {
    pause_resume_round(10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_pull_tenants_workers_are_refused_and_pausing_needs_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path()).await;
    let (status, body) = put_json(
        &node.url("/v1/tenants/workers"),
        &json!({"sink": {"type": "pull"}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let leases = node.url("/v1/tenants/workers/leases");
    let no_wait = json!({"worker_id": "w1", "wait_ms": 0});
    let claim = || post_json(&leases, &no_wait);
    let (status, body) = claim().await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post_json(&node.url("/v1/tenants/workers/pause"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["pause"]["reason"].is_null(), "{body}");
    let (status, body) = claim().await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "tenant_paused");
    let (status, _) = post_json(&node.url("/v1/tenants/workers/resume"), &json!({})).await;
    assert_eq!(status, 200);
    let (status, body) = claim().await;
    assert_eq!(status, 200, "{body}");

    for action in ["pause", "resume"] {
        let (status, body) = post_json(
            &node.url(&format!("/v1/tenants/nobody/{action}")),
            &json!({}),
        )
        .await;
        assert_eq!(status, 404, "{action}: {body}");
    }
    let (status, body) = post_json(
        &node.url("/v1/tenants/workers/pause"),
        &json!({"reason": "x".repeat(1_025)}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
}
