//! Relative instants and debounce end to end (`docs/api.md`, "Relative
//! instants and debounce"): a real `belfry serve` process and a real
//! receiver.
//!
//! The debounce scenario is the rule at its own scale (about 105 s of
//! wall time): 100 writes of one event 1 s apart, delay 5 s, maximum wait
//! 30 s. Its 99 s of writes make three full series (each delivered once,
//! 30 s after its first write) and a last one cut short (delivered 5 s
//! after its last write). The write 30 s after a series' first one lands
//! on its instant: before the series' delivery is recorded it goes out
//! with it (at once, as a new version), after it it begins the next
//! series; either way the series is delivered 30 s after its first write.
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
    payload: String,
    answer: Value,
}

/// The scenario's writes, debounce and spacing.
const WRITES: usize = 100;
const WRITE_EVERY: Duration = Duration::from_secs(1);
const DELAY_MS: i64 = 5_000;
const MAX_WAIT_MS: i64 = 30_000;

/// One series as the answers tell it: its start (the acceptance of its
/// first write), its first write and its last, and the versions that the
/// writes joining it once it was due replaced while their delivery had
/// started (each may arrive too, once).
struct Series<'a> {
    since: i64,
    first: &'a Write,
    last: &'a Write,
    replaced_while_sent: Vec<String>,
}

#[tokio::test]
async fn debounced_writes_are_delivered_once_per_series_at_its_start_plus_the_maximum_wait() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path()).await;
    register(&node, &receiver).await;
    let url = node.url("/v1/tenants/acme/events/d1");
    let debounce = json!({"delay_ms": DELAY_MS, "max_wait_ms": MAX_WAIT_MS});

    let mut writes: Vec<Write> = Vec::new();
    let mut ticks = tokio::time::interval(WRITE_EVERY);
    for i in 0..WRITES {
        ticks.tick().await;
        let payload = format!("w{i}");
        let sent_ms = now_ms();
        let (status, answer) =
            put_json(&url, &json!({"debounce": debounce, "payload": payload})).await;
        assert!(
            status == 200 || status == 201,
            "write {i}: {status} {answer}"
        );
        writes.push(Write {
            sent_ms,
            answered_ms: now_ms(),
            payload,
            answer,
        });
    }

    // The series as the answers tell them. A write continues a series
    // while its instant has not come; one that lands on the same instant
    // (the cap reached) keeps the version, one that moves it makes a new
    // one. A write once the series is due, before its delivery was
    // recorded, joins it: due at once, a new version.
    let mut series: Vec<Series> = Vec::new();
    for (i, write) in writes.iter().enumerate() {
        let since = millis(&write.answer["debounce_since"]);
        let due = millis(&write.answer["deliver_at"]);
        match series.last_mut() {
            Some(current) if current.since == since => {
                let previous = &current.last.answer;
                // Joined once due: past the cap by its acceptance (a write
                // accepted before the cap lands on the cap itself).
                if due > since + MAX_WAIT_MS {
                    assert!(
                        (write.sent_ms..=write.answered_ms + 1).contains(&due)
                            && previous["version"] != write.answer["version"],
                        "write {i} joined its due series: due at once, a new version: {}",
                        write.answer
                    );
                    match write.answer["previous_delivery"].as_str() {
                        Some("started") => current
                            .replaced_while_sent
                            .push(previous["version"].as_str().unwrap().to_owned()),
                        Some("not_started") => {}
                        other => panic!("write {i}: previous_delivery {other:?}"),
                    }
                } else {
                    assert_eq!(
                        previous["deliver_at"] == write.answer["deliver_at"],
                        previous["version"] == write.answer["version"],
                        "write {i}: a new version exactly when the instant moves: {previous} then {}",
                        write.answer
                    );
                }
                current.last = write;
            }
            _ => {
                assert!(
                    (write.sent_ms..=write.answered_ms).contains(&since),
                    "a series starts at the acceptance of its first write: {}",
                    write.answer
                );
                series.push(Series {
                    since,
                    first: write,
                    last: write,
                    replaced_while_sent: Vec::new(),
                });
            }
        }
        assert!(
            due <= (since + MAX_WAIT_MS).max(write.answered_ms),
            "past the maximum wait: {}",
            write.answer
        );
    }
    assert_eq!(
        series.len(),
        4,
        "three full series and a last one cut short: {:?}",
        series.iter().map(|s| &s.first.payload).collect::<Vec<_>>()
    );
    let last_write = series.last().unwrap().last;
    let last_due = millis(&last_write.answer["deliver_at"]);
    assert!(
        (last_write.sent_ms + DELAY_MS..=last_write.answered_ms + DELAY_MS).contains(&last_due),
        "the last series is due 5 s after its last write: {}",
        last_write.answer
    );

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
    // Room for a (wrong) second delivery of the last version.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deliveries: Vec<_> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.header("x-belfry-event-id") == Some("d1"))
        .collect();
    let mut per_version: HashMap<&str, Vec<(i64, Value)>> = HashMap::new();
    for delivery in &deliveries {
        let version = delivery.header("idempotency-key").unwrap_or_default();
        let body = delivery.body_json().expect("a JSON body");
        per_version
            .entry(version)
            .or_default()
            .push((delivery.arrived_at_ms, body["payload"].clone()));
    }

    // Each series' last version is delivered once, with its last write's
    // payload: a full series at its start + 30 s (or, joined once due, at
    // its last write), never early; the last one 5 s after its last write.
    // A version replaced while its delivery had started arrives once too;
    // no other version arrives.
    let mut lateness = Vec::new();
    let mut also_sent = 0;
    for (i, current) in series.iter().enumerate() {
        let version = current.last.answer["version"].as_str().unwrap();
        let due = if i + 1 < series.len() {
            (current.since + MAX_WAIT_MS).max(millis(&current.last.answer["deliver_at"]))
        } else {
            last_due
        };
        match per_version.remove(version).as_deref() {
            Some([(arrived, payload)]) => {
                let late = arrived - due;
                assert!(
                    (0..=LATE_MS).contains(&late),
                    "series {i} (first write {}, last {}) due at {due}, delivered {late} ms after",
                    current.first.answer,
                    current.last.answer
                );
                assert_eq!(payload, current.last.payload.as_str(), "series {i}");
                lateness.push(late);
            }
            other => panic!(
                "series {i} (first write {}, last {}) due at {due}: delivered {other:?}",
                current.first.answer, current.last.answer
            ),
        }
        for replaced in &current.replaced_while_sent {
            if let Some(arrivals) = per_version.remove(replaced.as_str()) {
                assert_eq!(arrivals.len(), 1, "series {i}: {replaced} arrived twice");
                also_sent += 1;
            }
        }
    }
    assert!(
        per_version.is_empty(),
        "other versions delivered: {per_version:?}"
    );
    eprintln!(
        "series starting with {:?}, ending with {:?}; delivered late by {lateness:?} ms; \
         versions replaced while sent that arrived too: {also_sent}",
        series.iter().map(|s| &s.first.payload).collect::<Vec<_>>(),
        series.iter().map(|s| &s.last.payload).collect::<Vec<_>>()
    );

    // The first delivery: 30 s after the first write, never early, at
    // most 50 ms late.
    let arrived = deliveries[0].arrived_at_ms;
    assert!(
        arrived >= writes[0].sent_ms + MAX_WAIT_MS,
        "delivered {} ms before the first write + 30 s",
        writes[0].sent_ms + MAX_WAIT_MS - arrived
    );
    assert!(
        arrived <= writes[0].answered_ms + MAX_WAIT_MS + LATE_MS,
        "delivered {} ms after the first write's answer + 30 s",
        arrived - writes[0].answered_ms - MAX_WAIT_MS
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
