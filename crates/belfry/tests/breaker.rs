//! The circuit breaker of a tenant endpoint, on the real `belfry` binary
//! with a real webhook receiver: while the receiver answers 503 and
//! thousands of events come due, only a few attempts reach it (the ones
//! that open the circuit, then one probe per cool-down); the tenant view
//! and `/metrics` show the open circuit; once it recovers, a probe closes
//! the circuit and every event is delivered, none failed.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339, sample, scrape};

/// The most attempts an outage may cost: the failures that open the
/// circuit (5, and the few in flight then) and one probe per cool-down.
const MAX_OUTAGE_ATTEMPTS: usize = 48;

struct Outage {
    events: usize,
    /// How long the receiver answers 503; the events come due over it.
    length: Duration,
    /// `[engine.circuit_breaker]` lines; empty: the defaults.
    breaker: &'static str,
}

async fn start_node(dir: &std::path::Path, breaker: &str) -> BelfryProcess {
    let config = dir.join("belfry.toml");
    std::fs::write(&config, format!("[engine.circuit_breaker]\n{breaker}")).unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"))
        .arg("--config")
        .arg(config.to_str().unwrap());
    BelfryProcess::start(launch).await.expect("belfry starts")
}

/// The event ids of the receiver's requests.
fn ids_of(requests: &[belfry_testkit::RecordedRequest]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            r.header("x-belfry-event-id")
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

async fn attempt_errors(node: &BelfryProcess, id: &str) -> Vec<String> {
    let (status, body) =
        get_json(&node.url(&format!("/v1/tenants/acme/events/{id}/attempts"))).await;
    assert_eq!(status, 200, "{body}");
    body["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["error"].as_str().map(str::to_string))
        .collect()
}

/// How many of the tenant's events have `status` (pages through them all).
async fn count_with_status(node: &BelfryProcess, status: &str) -> usize {
    let mut count = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut url = node.url(&format!(
            "/v1/tenants/acme/events?status={status}&limit=1000"
        ));
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let (code, body) = get_json(&url).await;
        assert_eq!(code, 200, "{body}");
        count += body["events"].as_array().unwrap().len();
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return count,
        }
    }
}

/// The `type` of every notice the notice target got, in arrival order.
fn notice_types(notices: &Receiver) -> Vec<String> {
    notices
        .requests()
        .iter()
        .map(|r| r.body_json().unwrap()["type"].as_str().unwrap().to_string())
        .collect()
}

async fn outage_round(outage: Outage) {
    let Outage {
        events,
        length,
        breaker,
    } = outage;
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.reserve(events + 1_000);
    receiver.set_default_status(503);
    let node = start_node(dir.path(), breaker).await;
    let notices = Receiver::start().await;
    let (status, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({"sink": {"type": "http", "url": receiver.url("/hook")},
                "notify": {"url": notices.url("/notices")}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["circuit"]["state"], "closed", "{body}");

    // The receiver is down from now; the events come due evenly over the
    // outage, from 1 s on, the last 5 s before its end.
    let down_at = now_ms();
    let up_at = down_at + length.as_millis() as i64;
    let first_due = down_at + 1_000;
    let spread = (up_at - 5_000 - first_due).max(1);
    let ids: Vec<String> = (0..events).map(|i| format!("e{i:05}")).collect();
    for (chunk, chunk_ids) in ids.chunks(500).enumerate() {
        let batch: Vec<Value> = chunk_ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let n = (chunk * 500 + i) as i64;
                let at = first_due + spread * n / events as i64;
                json!({"id": id, "tenant": "acme", "eventTime": rfc3339(at), "payload": id})
            })
            .collect();
        let (status, body) = post_json(&node.url("/events/schedule"), &Value::Array(batch)).await;
        assert_eq!(status, 200, "{body}");
    }

    // The circuit opens, and the tenant view says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    let open = loop {
        let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
        if view["circuit"]["state"] == "open" {
            break view;
        }
        assert!(
            Instant::now() < deadline,
            "the circuit never opened: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let circuit = &open["circuit"];
    assert!(circuit["since"].is_string(), "{open}");
    assert!(circuit["next_probe_at"].is_string(), "{open}");
    assert_eq!(circuit["consecutive_failures"], 0, "{open}");
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, "belfry_circuits_open"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, r#"belfry_tenant_circuit_open{tenant="acme"}"#),
        Some(1.0),
        "{metrics}"
    );

    // The outage runs to its end; the circuit stays open (or half-open
    // while a probe is out) throughout.
    while now_ms() < up_at - 200 {
        let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
        assert_ne!(view["circuit"]["state"], "closed", "{view}");
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    tokio::time::sleep(Duration::from_millis((up_at - now_ms()).max(0) as u64)).await;
    let during = receiver.take_requests();
    // The notice target heard of the opening during the outage, although
    // the tenant's lanes are held (once: a failed probe reopening it is
    // not news).
    assert_eq!(
        notice_types(&notices),
        vec!["circuit_opened".to_string()],
        "the notices during the outage"
    );
    receiver.set_default_status(200);
    let recovered_at = now_ms();
    assert!(
        during.len() <= MAX_OUTAGE_ATTEMPTS,
        "{} attempts reached the receiver during the outage (at most {MAX_OUTAGE_ATTEMPTS}): {:?}",
        during.len(),
        ids_of(&during)
    );
    assert!(during.len() >= 5, "the circuit opened after 5 failures");
    eprintln!(
        "{} attempts reached the receiver during the outage of {} s ({events} events due)",
        during.len(),
        length.as_secs()
    );
    // None came due before its time: every event's first request is after
    // its instant.
    for request in &during {
        let scheduled = request.header("x-belfry-scheduled-at").unwrap();
        let due = belfry_core::Timestamp::parse_rfc3339(scheduled).unwrap();
        assert!(
            request.arrived_at_ms >= due.as_millis(),
            "early: {scheduled}"
        );
    }

    // Recovered: the next probe closes the circuit, and every event goes
    // out (the longest cool-down, then the backlog).
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut delivered: HashSet<String> = HashSet::new();
    let mut after = Vec::new();
    while delivered.len() < events {
        assert!(
            Instant::now() < deadline,
            "{} of {events} events delivered after the recovery",
            delivered.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let requests = receiver.take_requests();
        delivered.extend(ids_of(&requests));
        after.extend(requests);
    }
    assert_eq!(delivered, ids.iter().cloned().collect::<HashSet<_>>());
    assert!(after.iter().all(|r| r.arrived_at_ms >= recovered_at));
    let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
    assert_eq!(view["circuit"]["state"], "closed", "{view}");
    assert_eq!(view["circuit"]["consecutive_failures"], 0, "{view}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while notice_types(&notices).len() < 2 {
        assert!(Instant::now() < deadline, "no closing notice");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        notice_types(&notices),
        vec!["circuit_opened".to_string(), "circuit_closed".to_string()]
    );

    // Nothing failed, nothing is left pending: every event is delivered.
    for status in ["failed", "scheduled", "retrying", "missed", "expired"] {
        assert_eq!(count_with_status(&node, status).await, 0, "{status}");
    }
    assert_eq!(count_with_status(&node, "delivered").await, events);

    // The attempt history says which attempt opened the circuit and which
    // were probes; the first request after the recovery was the probe
    // that closed it.
    // (A request may arrive between the count and the switch: the probe
    // that closed it is the first after the switch, or the last before,
    // and a probe failed then is among the first after.)
    let mut probed: HashSet<String> = ids_of(&during).into_iter().collect();
    probed.extend(ids_of(&after).into_iter().take(2));
    let (mut opened, mut failed_probes, mut closers) = (0, 0, 0);
    for id in &probed {
        for error in attempt_errors(&node, id).await {
            opened += usize::from(error.contains("the circuit opened after 5 consecutive"));
            failed_probes += usize::from(error.contains("probe: the probe failed, next probe in"));
            closers += usize::from(error == "probe: the circuit closed");
        }
    }
    assert_eq!(opened, 1, "one opening");
    assert!(failed_probes >= 1, "probes failed during the outage");
    assert_eq!(closers, 1, "one probe closed it");
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, "belfry_circuits_open"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, r#"belfry_tenant_circuit_open{tenant="acme"}"#),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"belfry_circuit_transitions_total{state="closed"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"belfry_circuit_transitions_total{state="open"}"#
        ),
        Some(1.0 + failed_probes as f64),
        "{metrics}"
    );
}

/// A short outage with short cool-downs (about 40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_costs_a_few_attempts_and_every_event_arrives_after_it() {
    outage_round(Outage {
        events: 2_000,
        length: Duration::from_secs(20),
        breaker: "cool_down_ms = 1000\nmax_cool_down_ms = 4000\n",
    })
    .await;
}

/// The issue's scenario with the defaults: the receiver down for 5 minutes
/// while 10,000 events come due (about 6 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_minute_outage_of_ten_thousand_events_costs_a_few_dozen_attempts() {
    outage_round(Outage {
        events: 10_000,
        length: Duration::from_secs(300),
        breaker: "",
    })
    .await;
}

/// `failure_threshold = 0` turns the breaker off: every retry that comes
/// due is sent (with the breaker, 20 events failing at once would cost
/// their first attempts and then one probe per cool-down), and the tenant
/// view shows no circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threshold_zero_turns_the_breaker_off() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.set_default_status(503);
    let node = start_node(dir.path(), "failure_threshold = 0\n").await;
    let (status, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({"sink": {"type": "http", "url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert!(body.get("circuit").is_none(), "{body}");
    let at = rfc3339(now_ms() + 200);
    let batch: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("e{i}"), "tenant": "acme", "eventTime": at, "payload": "x"}))
        .collect();
    let (status, body) = post_json(&node.url("/events/schedule"), &Value::Array(batch)).await;
    assert_eq!(status, 200, "{body}");
    // Attempts 1 to 4 of each: 0, 1, 2 and 3 s after the instant.
    receiver
        .wait_for_count(80, Duration::from_secs(30))
        .await
        .unwrap();
    let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
    assert!(view.get("circuit").is_none(), "{view}");
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(&metrics, "belfry_circuits_open"),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        !metrics.contains("belfry_circuit_transitions_total{"),
        "{metrics}"
    );
}
