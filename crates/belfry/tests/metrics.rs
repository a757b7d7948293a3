//! `GET /metrics` of a real `belfry` process, parsed by Prometheus's own
//! text parser (PyPI `prometheus_client`, in the test venv): after real
//! deliveries to a real receiver, the counters and the lateness histogram
//! agree with what the receiver saw, and no tenant name or event id is in
//! any label.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, Response, Rule, post_json};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

mod common;
use common::{now_ms, rfc3339};

const TENANT: &str = "metrics-tenant";

fn parser_python() -> Option<PathBuf> {
    common::test_python("prometheus_client", "/metrics with Prometheus's parser")
}

/// One parsed sample.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// Every sample of `text`, as Prometheus's parser reads it (the test fails
/// if it refuses the text).
async fn parse(python: &Path, text: &str) -> Vec<Sample> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/parse_metrics.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            Sample {
                name: v["name"].as_str().unwrap().to_string(),
                labels: v["labels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect(),
                value: v["value"].as_f64().unwrap(),
            }
        })
        .collect()
}

/// The value of the sample `name` with exactly these labels (among others
/// it may have), or 0 when absent.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .find(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map_or(0.0, |s| s.value)
}

async fn scrape(node: &BelfryProcess) -> String {
    let response = belfry_testkit::http_client()
        .get(node.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_agree_with_what_the_receiver_saw() {
    let Some(python) = parser_python() else {
        return;
    };
    let receiver = Receiver::start().await;
    // The /refuse path answers 400: a permanent failure, the event is dead.
    receiver.push_rule(Rule::always(Response::status(400)).for_path("/refuse"));
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(BelfryLaunch::new(
        env!("CARGO_BIN_EXE_belfry"),
        dir.path().join("data"),
    ))
    .await
    .expect("belfry starts");

    for (tenant, path) in [(TENANT, "/hook"), ("metrics-refused", "/refuse")] {
        let (status, body) = post_json(
            &node.url("/events/tenant/register"),
            &json!({"tenant": tenant, "type": "HTTP", "props": {"url": receiver.url(path)}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let at = rfc3339(now_ms() + 300);
    let mut events: Vec<Value> = (0..40)
        .map(
            |i| json!({"id": format!("ok-{i}"), "tenant": TENANT, "eventTime": at, "payload": "p"}),
        )
        .collect();
    events.extend(
        (0..5).map(|i| json!({"id": format!("no-{i}"), "tenant": "metrics-refused", "eventTime": at, "payload": "p"})),
    );
    let (status, body) = post_json(&node.url("/events/schedule"), &Value::Array(events)).await;
    assert_eq!(status, 200, "{body}");

    // Wait until the receiver saw all 45 and the node recorded them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let samples = loop {
        let text = scrape(&node).await;
        let samples = parse(&python, &text).await;
        let ended = value(
            &samples,
            "belfry_events_ended_total",
            &[("status", "delivered")],
        ) + value(
            &samples,
            "belfry_events_ended_total",
            &[("status", "failed")],
        );
        if ended >= 45.0 {
            assert!(
                !text.contains(TENANT),
                "a tenant name is in a label:\n{text}"
            );
            assert!(!text.contains("ok-1"), "an event id is in a label:\n{text}");
            break samples;
        }
        assert!(
            Instant::now() < deadline,
            "only {ended} of 45 events ended; the node's log:\n{}",
            node.logs_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(receiver.count(), 45);

    let deliveries = |outcome| {
        value(
            &samples,
            "belfry_deliveries_total",
            &[("channel", "http"), ("outcome", outcome)],
        )
    };
    assert_eq!(deliveries("delivered"), 40.0);
    assert_eq!(deliveries("permanent"), 5.0);
    assert_eq!(deliveries("retry"), 0.0);
    assert_eq!(
        value(
            &samples,
            "belfry_events_ended_total",
            &[("status", "failed")]
        ),
        5.0
    );
    // Every first attempt is in the lateness histogram, none before its
    // instant (Belfry never fires early), all within the +Inf bucket.
    assert_eq!(
        value(
            &samples,
            "belfry_fire_lateness_seconds_count",
            &[("attempt", "first")]
        ),
        45.0
    );
    assert_eq!(
        value(
            &samples,
            "belfry_fire_lateness_seconds_bucket",
            &[("attempt", "first"), ("le", "+Inf")]
        ),
        45.0
    );
    assert_eq!(
        value(
            &samples,
            "belfry_delivery_duration_seconds_count",
            &[("channel", "http")]
        ),
        45.0
    );
    assert_eq!(value(&samples, "belfry_partitions_owned", &[]), 64.0);
    assert_eq!(
        value(&samples, "belfry_partition_epoch", &[("partition", "0")]),
        0.0
    );
    assert!(value(&samples, "belfry_window_capacity", &[]) > 0.0);
    assert_eq!(value(&samples, "belfry_deliveries_in_flight", &[]), 0.0);
    // The API's requests by route template; the store's group commits.
    assert_eq!(
        value(
            &samples,
            "belfry_http_requests_total",
            &[
                ("route", "/events/schedule"),
                ("method", "POST"),
                ("status", "200")
            ]
        ),
        1.0
    );
    assert!(
        value(
            &samples,
            "belfry_store_commit_duration_seconds_count",
            &[("store", "embedded")]
        ) >= 2.0
    );
    assert!(
        value(
            &samples,
            "belfry_store_commit_batch_commands_sum",
            &[("store", "embedded")]
        ) >= 90.0,
        "45 schedules and 45 outcomes were committed"
    );
}

/// `POST path` with `body`; the status and the JSON answer.
async fn post(node: &BelfryProcess, path: &str, body: &Value) -> (u16, Value) {
    post_json(&node.url(path), body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_metrics_count_claims_lease_ends_and_lost_leases() {
    let Some(python) = parser_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(BelfryLaunch::new(
        env!("CARGO_BIN_EXE_belfry"),
        dir.path().join("data"),
    ))
    .await
    .expect("belfry starts");
    let tenant = "metrics-pull";
    let (status, body) = belfry_testkit::put_json(
        &node.url(&format!("/v1/tenants/{tenant}")),
        &json!({ "sink": { "type": "pull" } }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let at = rfc3339(now_ms() + 300);
    let events: Vec<Value> = (0..3)
        .map(|i| json!({ "id": format!("job-{i}"), "deliver_at": at, "payload": "p" }))
        .collect();
    let (status, body) = post(
        &node,
        &format!("/v1/tenants/{tenant}/events"),
        &json!({ "events": events }),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");

    // Long-poll until all three are leased (they may come in several
    // answers as they come due).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut leases = Vec::new();
    while leases.len() < 3 {
        assert!(Instant::now() < deadline, "only {} leased", leases.len());
        let (status, body) = post(
            &node,
            &format!("/v1/tenants/{tenant}/leases"),
            &json!({ "worker_id": "w1", "max_events": 3, "wait_ms": 2000 }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        leases.extend(
            body["leases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["lease_id"].as_str().unwrap().to_string()),
        );
    }
    for id in &leases[..2] {
        let (status, body) = post(&node, &format!("/v1/leases/{id}/complete"), &json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = post(
        &node,
        &format!("/v1/leases/{}/fail", leases[2]),
        &json!({ "error": { "code": "bad_input" }, "permanent": true }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A completed lease is not held any more: its heartbeat is lost.
    let (status, body) = post(
        &node,
        &format!("/v1/leases/{}/heartbeat", leases[0]),
        &json!({}),
    )
    .await;
    assert_eq!(status, 409, "{body}");

    let text = scrape(&node).await;
    assert!(
        !text.contains(tenant),
        "a tenant name is in a label:\n{text}"
    );
    let samples = parse(&python, &text).await;
    let ends = |outcome| {
        value(
            &samples,
            "belfry_pull_lease_ends_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(value(&samples, "belfry_pull_grants_total", &[]), 3.0);
    assert_eq!(ends("completed"), 2.0);
    assert_eq!(ends("failed"), 1.0);
    assert_eq!(ends("released"), 0.0);
    assert_eq!(ends("expired"), 0.0);
    assert_eq!(
        value(
            &samples,
            "belfry_pull_errors_total",
            &[("code", "lease_lost")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "belfry_pull_lease_lateness_seconds_count",
            &[("attempt", "first")]
        ),
        3.0
    );
    assert!(
        value(
            &samples,
            "belfry_pull_claim_wait_seconds_count",
            &[("result", "leases")]
        ) >= 1.0
    );
    assert_eq!(value(&samples, "belfry_pull_ready_entries", &[]), 0.0);
    assert_eq!(value(&samples, "belfry_pull_leases_held", &[]), 0.0);
    assert_eq!(value(&samples, "belfry_pull_claims_parked", &[]), 0.0);
    assert_eq!(value(&samples, "belfry_pull_refused_total", &[]), 0.0);
}
