//! Relative instants and debounce end to end (`docs/api.md`, "Relative
//! instants and debounce"): a real `belfry serve` process and a real
//! receiver.
//!
//! The debounce scenario is the rule "100 writes of one event 1 s apart,
//! delay 5 s, maximum wait 30 s: delivered 30 s after the first write,
//! once" scaled down in time by 10: 100 writes 100 ms apart, delay 500 ms,
//! maximum wait 3 s. Its 9.9 s of writes make three full series (each
//! delivered once, 3 s after its first write) and a last one cut short
//! (delivered 500 ms after its last write).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use belfry_core::Timestamp;
use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, put_json};
use serde_json::{Value, json};

mod common;
use common::now_ms;

/// Generous bound for anything the node must finish.
const DEADLINE: Duration = Duration::from_secs(60);

/// How late a delivery may come after its instant.
const LATE_MS: i64 = 50;

async fn start_node(dir: &std::path::Path) -> BelfryProcess {
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn register(node: &BelfryProcess, receiver: &Receiver) {
    let (status, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({"sink": {"type": "http", "url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

fn millis(instant: &Value) -> i64 {
    Timestamp::parse_rfc3339(instant.as_str().expect("an instant"))
        .expect("RFC 3339")
        .as_millis()
}

/// One write as the client saw it.
struct Write {
    sent_ms: i64,
    answered_ms: i64,
    answer: Value,
}

#[tokio::test]
async fn debounced_writes_are_delivered_once_per_series_at_its_start_plus_the_maximum_wait() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path()).await;
    register(&node, &receiver).await;
    let url = node.url("/v1/tenants/acme/events/d1");

    let mut writes = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    for i in 0..100 {
        ticks.tick().await;
        let sent_ms = now_ms();
        let (status, answer) = put_json(
            &url,
            &json!({"debounce": {"delay_ms": 500, "max_wait_ms": 3_000}, "payload": format!("w{i}")}),
        )
        .await;
        assert!(
            status == 200 || status == 201,
            "write {i}: {status} {answer}"
        );
        writes.push(Write {
            sent_ms,
            answered_ms: now_ms(),
            answer,
        });
    }

    // The series as the answers tell them: their first write's acceptance,
    // between its sending and its answer, and the instant of their last.
    let mut series: Vec<(i64, &Write, &Write)> = Vec::new();
    for write in &writes {
        let since = millis(&write.answer["debounce_since"]);
        match series.last_mut() {
            Some((start, _, last)) if *start == since => *last = write,
            _ => {
                assert!(
                    (write.sent_ms..=write.answered_ms).contains(&since),
                    "a series starts at the acceptance of its first write: {}",
                    write.answer
                );
                series.push((since, write, write));
            }
        }
        let due = millis(&write.answer["deliver_at"]);
        assert!(
            due <= since + 3_000,
            "past the maximum wait: {}",
            write.answer
        );
    }
    assert!(series.len() >= 3, "{} series", series.len());
    let (_, _, last_write) = series.last().unwrap();
    let last_due = millis(&last_write.answer["deliver_at"]);

    // Every series delivered; the last one once the event is delivered
    // with the last write's version.
    let last_version = last_write.answer["version"].clone();
    let started = Instant::now();
    loop {
        let (status, event) = get_json(&url).await;
        assert_eq!(status, 200, "{event}");
        if event["status"] == "delivered" && event["version"] == last_version {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "not delivered: {event}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliveries: Vec<_> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.header("x-belfry-event-id") == Some("d1"))
        .collect();
    let mut per_version: HashMap<&str, Vec<i64>> = HashMap::new();
    for delivery in &deliveries {
        let version = delivery.header("idempotency-key").unwrap_or_default();
        per_version
            .entry(version)
            .or_default()
            .push(delivery.arrived_at_ms);
    }

    // Each series' last version is delivered once: a full series at its
    // start + 3 s, never early; the last one at its last write's instant.
    // No other version is delivered.
    let mut raced = 0;
    for (i, (since, first, last)) in series.iter().enumerate() {
        let version = last.answer["version"].as_str().unwrap();
        let due = if i + 1 < series.len() {
            since + 3_000
        } else {
            last_due
        };
        match per_version.remove(version).as_deref() {
            Some([arrived]) => {
                let late = arrived - due;
                assert!(
                    (0..=LATE_MS).contains(&late),
                    "series {i} (first write {}, last {}) due at {due}, delivered {late} ms after",
                    first.answer,
                    last.answer
                );
            }
            // The next series' first write came as this one fell due, and
            // moved it before its delivery started (the edit contract: a
            // change after the instant races the delivery). Its content
            // goes with the next series.
            None if i + 1 < series.len() && (due..=due + LATE_MS).contains(&series[i + 1].0) => {
                raced += 1;
            }
            other => panic!(
                "series {i} (first write {}, last {}) due at {due}: delivered at {other:?}",
                first.answer, last.answer
            ),
        }
    }
    assert!(
        per_version.is_empty(),
        "other versions delivered: {per_version:?}"
    );
    assert!(raced < series.len() - 1, "no full series was delivered");
    let first_late = deliveries[0].arrived_at_ms - (writes[0].sent_ms + 3_000);
    assert!(
        first_late >= 0,
        "the first delivery came before the first write + 3 s"
    );
}

#[tokio::test]
async fn a_delay_counts_from_the_nodes_acceptance() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path()).await;
    register(&node, &receiver).await;
    let url = node.url("/v1/tenants/acme/events/later");

    let sent_ms = now_ms();
    let (status, answer) = put_json(&url, &json!({"delay_ms": 300, "payload": "p"})).await;
    let answered_ms = now_ms();
    assert_eq!(status, 201, "{answer}");
    let due = millis(&answer["deliver_at"]);
    assert!(
        (sent_ms + 300..=answered_ms + 300).contains(&due),
        "{answer}"
    );
    assert!(answer.get("debounce_since").is_none(), "{answer}");
    let arrived = receiver
        .wait_for_count(1, DEADLINE)
        .await
        .expect("delivered");
    let late = arrived[0].arrived_at_ms - due;
    assert!((0..=LATE_MS).contains(&late), "{late} ms late");

    // Exactly one of deliver_at, delay_ms and debounce.
    for body in [
        json!({"delay_ms": 300, "deliver_at": "2030-01-31T04:00:30Z"}),
        json!({"delay_ms": 300, "debounce": {"delay_ms": 1, "max_wait_ms": 2}}),
        json!({"payload": "p"}),
        json!({"debounce": {"delay_ms": 500, "max_wait_ms": 100}}),
        json!({"delay_ms": 31_622_400_001_u64}),
    ] {
        let (status, answer) = put_json(&url, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
}
