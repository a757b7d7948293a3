//! Kafka delivery end to end, as a BigBen user sees it: a real `belfry`
//! process, a Kafka-protocol broker in its own process (the testkit's
//! `KafkaBroker`: librdkafka's mock cluster, or the broker
//! `BELFRY_TEST_KAFKA_BOOTSTRAP` names), a `MESSAGING` tenant registered
//! through BigBen's API, events scheduled through BigBen's API, and an
//! independent consumer (Python's `confluent-kafka`, see
//! `tests/support/kafka_consumer.py`) reading the tenant's topic. A third
//! test runs a `/v1` tenant in the fenced (transactional) mode, read with
//! `read_committed`; another sends a tenant's failure notice to its notice
//! topic.
//!
//! The consumer's interpreter is the one named by `BELFRY_TEST_PYTHON`,
//! else a virtual environment this test makes under
//! `target/belfry-test-venv` (`pip install`, once). Without `python3` the
//! tests are skipped with a loud message. The broker outage test needs the
//! mock broker (fault injection) and says so when skipped.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]
#![cfg(feature = "kafka")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use belfry_core::{SigningSecrets, Timestamp};
use belfry_sinks::signing::Signer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, KafkaBroker, get_json, post_json, put_json};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

mod common;
use common::{now_ms, rfc3339};

const DEADLINE: Duration = Duration::from_secs(60);
const TENANT: &str = "TenantA/ProgramB/EnvC";

/// A Python interpreter with the independent Kafka consumer.
fn consumer_python() -> Option<PathBuf> {
    common::test_python("confluent_kafka", "Kafka delivery end to end")
}

/// The independent consumer, reading one topic from its start.
struct Consumer {
    child: tokio::process::Child,
    lines: Lines<BufReader<ChildStdout>>,
}

/// One record as the consumer printed it.
#[derive(Debug, Clone)]
struct Record {
    key: Option<String>,
    value: String,
    headers: BTreeMap<String, String>,
    timestamp: i64,
    received_ms: i64,
}

impl Consumer {
    async fn start(python: &Path, broker: &KafkaBroker, topic: &str) -> Consumer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/kafka_consumer.py");
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .arg(broker.bootstrap_servers())
            .arg(topic)
            .arg(format!("belfry-e2e-{}-{topic}", std::process::id()))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the Python consumer starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .expect("the consumer starts in time")
            .unwrap()
            .expect("the consumer prints ready");
        assert_eq!(first, r#"{"ready": true}"#);
        Consumer { child, lines }
    }

    /// Records until `count` arrived (or the deadline), then whatever else
    /// arrives within `linger` (duplicates would).
    async fn read(&mut self, count: usize, linger: Duration) -> Vec<Record> {
        let mut records = Vec::new();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let until = if records.len() >= count {
                tokio::time::Instant::now() + linger
            } else {
                deadline
            };
            let line = match tokio::time::timeout_at(until, self.lines.next_line()).await {
                Ok(line) => line.unwrap().expect("the consumer keeps running"),
                Err(_) => break,
            };
            let value: Value = serde_json::from_str(&line).unwrap();
            if value.get("error").is_some() {
                continue;
            }
            records.push(Record {
                key: value["key"].as_str().map(String::from),
                value: value["value"].as_str().unwrap_or_default().to_string(),
                headers: value["headers"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect(),
                timestamp: value["timestamp"].as_i64().unwrap(),
                received_ms: value["received_ms"].as_i64().unwrap(),
            });
            if records.len() >= count && linger.is_zero() {
                break;
            }
        }
        records
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn start_node(dir: &Path, env: &[(&str, &str)]) -> BelfryProcess {
    let mut launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    for (key, value) in env {
        launch = launch.env(*key, *value);
    }
    BelfryProcess::start(launch).await.expect("belfry starts")
}

/// Registers the BigBen `MESSAGING` tenant; answers its signing secret.
async fn register_messaging(node: &BelfryProcess, broker: &KafkaBroker, topic: &str) -> String {
    belfry_testkit::install_crypto_provider();
    let answer = reqwest::Client::new()
        .post(node.url("/events/tenant/register"))
        .json(&json!({
            "tenant": TENANT,
            "type": "MESSAGING",
            "props": { "topic": topic, "bootstrap.servers": broker.bootstrap_servers() },
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let secret = answer
        .headers()
        .get("webhook-signing-secret")
        .expect("a new tenant's signing secret")
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body[TENANT]["type"], "MESSAGING", "{body}");
    assert_eq!(body[TENANT]["props"]["topic"], topic, "{body}");
    secret
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messaging_tenant_receives_every_event_once_never_early() {
    let Some(python) = consumer_python() else {
        return;
    };
    let topic = format!("bigben-out-{}", std::process::id());
    let broker = KafkaBroker::start_with(1, &[(&topic, 3)]);
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    let secret = register_messaging(&node, &broker, &topic).await;
    let mut consumer = Consumer::start(&python, &broker, &topic).await;

    // 30 events due within 2-3.5 s, half FULL_EVENT, half PAYLOAD_ONLY.
    let base = now_ms() + 2_000;
    let requests: Vec<Value> = (0..30)
        .map(|i| {
            json!({
                "id": format!("order-{i}"),
                "eventTime": rfc3339(base + i * 50),
                "tenant": TENANT,
                "payload": format!("{{\"order\":{i}}}"),
                "deliveryOption": if i % 2 == 0 { "FULL_EVENT" } else { "PAYLOAD_ONLY" },
            })
        })
        .collect();
    let (code, answers) = post_json(&node.url("/events/schedule"), &Value::from(requests)).await;
    assert_eq!(code, 200, "{answers}");
    let versions: BTreeMap<String, String> = answers
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            assert_eq!(a["eventStatus"], "ACCEPTED", "{a}");
            (
                a["id"].as_str().unwrap().to_string(),
                a["eventId"].as_str().unwrap().to_string(),
            )
        })
        .collect();

    let records = consumer.read(30, Duration::from_secs(2)).await;
    if records.len() != 30 {
        node.print_logs();
    }
    assert_eq!(records.len(), 30, "every event once: {records:?}");
    let signer = Signer::new(&SigningSecrets::new(secret)).unwrap();
    let mut seen = BTreeMap::new();
    for record in &records {
        let id = record.key.clone().expect("keyed by the event id");
        let i: i64 = id.strip_prefix("order-").unwrap().parse().unwrap();
        let due = base + i * 50;
        assert!(seen.insert(id.clone(), ()).is_none(), "{id} twice");
        assert!(
            record.received_ms >= due,
            "{id} arrived {} ms early",
            due - record.received_ms
        );
        assert!(record.timestamp >= due, "{id} triggered before its instant");
        let header = |name: &str| record.headers.get(name).map(String::as_str);
        assert_eq!(header("x-belfry-event-id"), Some(id.as_str()));
        assert_eq!(header("x-belfry-tenant"), Some(TENANT));
        assert_eq!(
            header("x-belfry-scheduled-at"),
            Some(rfc3339(due).as_str()),
            "{record:?}"
        );
        assert_eq!(header("x-belfry-attempt"), Some("1"));
        assert_eq!(header("idempotency-key"), Some(versions[&id].as_str()));
        assert_eq!(
            header("x-belfry-epoch"),
            Some("0"),
            "a single node: epoch 0"
        );
        assert_eq!(header("webhook-id"), Some(versions[&id].as_str()));
        let timestamp = header("webhook-timestamp").unwrap();
        let triggered = Timestamp::from_millis(timestamp.parse::<i64>().unwrap() * 1_000);
        assert_eq!(
            header("webhook-signature"),
            Some(
                signer
                    .signature(
                        &versions[&id],
                        timestamp,
                        record.value.as_bytes(),
                        triggered
                    )
                    .as_str()
            )
        );
        let payload = format!("{{\"order\":{i}}}");
        if i % 2 == 0 {
            let body: Value = serde_json::from_str(&record.value).unwrap();
            assert_eq!(body["id"], id.as_str());
            assert_eq!(body["tenant"], TENANT);
            assert_eq!(body["eventId"], versions[&id].as_str());
            assert_eq!(body["eventStatus"], "TRIGGERED");
            assert_eq!(body["deliveryOption"], "FULL_EVENT");
            assert_eq!(body["payload"], payload.as_str());
            assert_eq!(
                Timestamp::parse_rfc3339(body["triggeredAt"].as_str().unwrap())
                    .unwrap()
                    .as_millis(),
                record.timestamp
            );
        } else {
            assert_eq!(record.value, payload, "PAYLOAD_ONLY: the raw payload");
        }
    }
    // BigBen's find: every event PROCESSED.
    for id in versions.keys() {
        let (code, found) = get_json(&node.url(&format!(
            "/events/find?tenant={}&id={id}",
            TENANT.replace('/', "%2F")
        )))
        .await;
        assert_eq!(code, 200);
        assert_eq!(found["eventStatus"], "PROCESSED", "{found}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_during_delivery_loses_nothing() {
    let Some(python) = consumer_python() else {
        return;
    };
    let topic = format!("outage-{}", std::process::id());
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    if !broker.supports_faults() {
        eprintln!("SKIPPED: the broker outage needs the mock broker (fault injection)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(
        dir.path(),
        &[
            ("BELFRY_ENGINE__RETRY__INITIAL_DELAY_MS", "500"),
            ("BELFRY_ENGINE__RETRY__MAX_DELAY_MS", "1000"),
        ],
    )
    .await;
    let (code, body) = put_json(
        &node.url("/v1/tenants/outage"),
        &json!({ "sink": { "type": "kafka", "topic": topic, "props": {
            "bootstrap.servers": broker.bootstrap_servers(),
            // Each attempt gives up on the broker after 1 s.
            "message.timeout.ms": "1000",
        } } }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let mut consumer = Consumer::start(&python, &broker, &topic).await;

    // One delivery first, so the producer is connected when the broker
    // goes away.
    let event_path = |id: &str| node.url(&format!("/v1/tenants/outage/events/{id}"));
    let (code, body) = put_json(
        &event_path("warm-up"),
        &json!({ "deliver_at": rfc3339(now_ms()), "payload": "w" }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let warm = consumer.read(1, Duration::ZERO).await;
    if warm.len() != 1 {
        node.print_logs();
        panic!(
            "warm-up not read: {:?}",
            get_json(&event_path("warm-up")).await
        );
    }

    broker.broker_down(1).unwrap();
    let due = now_ms() + 500;
    let ids: Vec<String> = (0..10).map(|i| format!("e{i}")).collect();
    for id in &ids {
        let (code, body) = put_json(
            &event_path(id),
            &json!({ "deliver_at": rfc3339(due), "payload": id }),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    // Every event fails at least once while the broker is down.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    for id in &ids {
        loop {
            let (_, event) = get_json(&event_path(id)).await;
            if event["attempts"].as_u64().unwrap_or(0) >= 1 {
                assert_eq!(event["status"], "retrying", "{event}");
                break;
            }
            if tokio::time::Instant::now() > deadline {
                node.print_logs();
                panic!("{id} never attempted: {event}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    broker.broker_up(1).unwrap();

    let records = consumer.read(10, Duration::from_secs(2)).await;
    let mut keys: Vec<String> = records.iter().filter_map(|r| r.key.clone()).collect();
    keys.sort();
    if keys != ids {
        node.print_logs();
        for id in &ids {
            eprintln!("{id}: {:?}", get_json(&event_path(id)).await);
        }
    }
    assert_eq!(keys, ids, "every event once, none lost: {records:?}");
    for id in &ids {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let event = loop {
            let (_, event) = get_json(&event_path(id)).await;
            if event["status"] == "delivered" {
                break event;
            }
            assert!(tokio::time::Instant::now() < deadline, "{event}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let attempts_made = event["attempts"].as_u64().unwrap();
        assert!(attempts_made >= 2, "{event}");
        let (_, history) = get_json(&format!("{}/attempts", event_path(id))).await;
        let attempts = history["attempts"].as_array().unwrap();
        assert_eq!(attempts.len() as u64, attempts_made, "{history}");
        let outcomes: Vec<&str> = attempts
            .iter()
            .map(|a| a["outcome"].as_str().unwrap())
            .collect();
        assert_eq!(
            outcomes.iter().filter(|o| **o == "delivered").count(),
            1,
            "{history}"
        );
        assert_eq!(
            outcomes.iter().filter(|o| **o == "retry").count() as u64,
            attempts_made - 1,
            "{history}"
        );
        for failed in attempts.iter().filter(|a| a["outcome"] == "retry") {
            assert!(
                failed["error"].as_str().unwrap().starts_with("kafka"),
                "the reason is recorded: {history}"
            );
        }
        let record = records
            .iter()
            .find(|r| r.key.as_deref() == Some(id))
            .unwrap();
        assert_eq!(
            record.headers["x-belfry-attempt"],
            attempts_made.to_string(),
            "the record says which attempt delivered it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_mode_tenant_commits_every_event_for_read_committed_consumers() {
    let Some(python) = consumer_python() else {
        return;
    };
    let topic = format!("fenced-{}", std::process::id());
    let broker = KafkaBroker::start_with(1, &[(&topic, 2)]);
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    let (code, body) = put_json(
        &node.url("/v1/tenants/fenced"),
        &json!({ "sink": { "type": "kafka", "topic": topic, "transactional": true,
            "props": { "bootstrap.servers": broker.bootstrap_servers() } } }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["sink"]["transactional"], true, "{body}");
    // The consumer reads with isolation.level=read_committed.
    let mut consumer = Consumer::start(&python, &broker, &topic).await;
    let due = now_ms() + 1_000;
    // Zero-padded: sorted keys compare equal to this list.
    let ids: Vec<String> = (0..12).map(|i| format!("f{i:02}")).collect();
    for id in &ids {
        let (code, body) = put_json(
            &node.url(&format!("/v1/tenants/fenced/events/{id}")),
            &json!({ "deliver_at": rfc3339(due), "payload": id }),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    let records = consumer.read(ids.len(), Duration::from_secs(2)).await;
    let mut keys: Vec<String> = records.iter().filter_map(|r| r.key.clone()).collect();
    keys.sort();
    if keys != ids {
        node.print_logs();
    }
    assert_eq!(keys, ids, "every event once: {records:?}");
    for record in &records {
        assert!(record.received_ms >= due, "early: {record:?}");
        assert_eq!(record.headers["x-belfry-epoch"], "0", "{record:?}");
        assert_eq!(record.headers["x-belfry-attempt"], "1", "{record:?}");
    }
}

/// Waits until event `id` of `tenant` is finished; answers its view and
/// its attempt history.
async fn finished_with_history(node: &BelfryProcess, tenant: &str, id: &str) -> (Value, Value) {
    let path = node.url(&format!("/v1/tenants/{tenant}/events/{id}"));
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (_, event) = get_json(&path).await;
        if event["finished_at"].is_string() {
            let (_, history) = get_json(&format!("{path}/attempts")).await;
            return (event, history);
        }
        if tokio::time::Instant::now() > deadline {
            node.print_logs();
            panic!("{tenant}/{id} not finished: {event}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Kafka tenant's delivery policy against a broker that is down: an
/// event's own attempt cap, back-off and attempt timeout, and the tenant's
/// defaults for an event without its own, each ending `failed` after
/// exactly its attempts, the back-off apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_tenants_policy_caps_and_spaces_its_attempts() {
    let topic = format!("policy-{}", std::process::id());
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    if !broker.supports_faults() {
        eprintln!("SKIPPED: the broker outage needs the mock broker (fault injection)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    let backoff = json!({ "initial_delay_ms": 100, "multiplier": 1.0, "max_delay_ms": 100 });
    let sink = |delivery: Value| {
        let mut sink = json!({ "type": "kafka", "topic": topic, "props": {
            "bootstrap.servers": broker.bootstrap_servers(),
            // An attempt without its own timeout gives up on the broker after 1 s.
            "message.timeout.ms": "1000",
        } });
        if let (Some(sink), Some(delivery)) = (sink.as_object_mut(), delivery.as_object()) {
            sink.extend(delivery.clone());
        }
        sink
    };
    for (tenant, delivery) in [
        ("own", json!({})),
        ("defaults", json!({ "max_attempts": 2, "backoff": backoff })),
    ] {
        let (code, body) = put_json(
            &node.url(&format!("/v1/tenants/{tenant}")),
            &json!({ "sink": sink(delivery) }),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    // One delivery first, so the producer is connected when the broker
    // goes away (both tenants share it: same servers and settings).
    let warm_up = node.url("/v1/tenants/own/events/warm-up");
    let (code, body) = put_json(&warm_up, &json!({ "deliver_at": rfc3339(now_ms()) })).await;
    assert_eq!(code, 201, "{body}");
    let (event, _) = finished_with_history(&node, "own", "warm-up").await;
    assert_eq!(event["status"], "delivered", "{event}");

    broker.broker_down(1).unwrap();
    let due = rfc3339(now_ms() + 300);
    let events = [
        (
            "own",
            "capped",
            json!({ "deliver_at": due, "max_attempts": 2, "backoff": backoff,
                    "attempt_timeout_ms": 300 }),
        ),
        ("defaults", "plain", json!({ "deliver_at": due })),
    ];
    for (tenant, id, body) in &events {
        let (code, answer) = put_json(
            &node.url(&format!("/v1/tenants/{tenant}/events/{id}")),
            body,
        )
        .await;
        assert_eq!(code, 201, "{answer}");
    }
    for (tenant, id, _) in &events {
        let (event, history) = finished_with_history(&node, tenant, id).await;
        assert_eq!(event["status"], "failed", "{event}");
        assert_eq!(event["attempts"], 2, "{event}");
        let attempts = history["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "exactly two attempts of {id}: {history}");
        let started = |a: &Value| {
            Timestamp::parse_rfc3339(a["started_at"].as_str().unwrap())
                .unwrap()
                .as_millis()
        };
        let first_end = started(&attempts[0]) + attempts[0]["duration_ms"].as_i64().unwrap();
        let apart = started(&attempts[1]) - first_end;
        // The back-off counts from when the first attempt was recorded,
        // a little after it ended; both instants are cut to the ms.
        assert!(
            (99..=100 + 250).contains(&apart),
            "{id}: the second attempt started {apart} ms after the first ended: {history}"
        );
        for attempt in attempts {
            assert_eq!(attempt["outcome"], "retry", "{history}");
        }
        if *id == "capped" {
            // Its own 300 ms attempt timeout, not the producer's 1 s.
            for attempt in attempts {
                let took = attempt["duration_ms"].as_i64().unwrap();
                assert!((300..1000).contains(&took), "{history}");
                assert!(
                    attempt["error"]
                        .as_str()
                        .unwrap()
                        .contains("within the attempt timeout (300 ms)"),
                    "{history}"
                );
            }
        }
    }
}

/// A Kafka tenant whose notice target is a topic (`notify.kafka_topic`):
/// an event that ends failed (a record larger than the tenant's
/// `message.max.bytes`: permanent) sends a signed notice record to that
/// topic, produced with the tenant's sink settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_event_sends_a_signed_notice_record_to_the_notice_topic() {
    let Some(python) = consumer_python() else {
        return;
    };
    let topic = format!("orders-{}", std::process::id());
    let notices = format!("notices-{}", std::process::id());
    let broker = KafkaBroker::start_with(1, &[(&topic, 1), (&notices, 1)]);
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    let (code, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({
            "sink": { "type": "kafka", "topic": topic, "props": {
                "bootstrap.servers": broker.bootstrap_servers(),
                // A notice fits; the event below does not.
                "message.max.bytes": "2000",
            } },
            "notify": { "kafka_topic": notices },
        }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["notify"]["kafka_topic"], notices.as_str(), "{body}");
    let secret = body["signing_secret"].as_str().unwrap().to_string();
    let mut consumer = Consumer::start(&python, &broker, &notices).await;

    let (code, event) = put_json(
        &node.url("/v1/tenants/acme/events/too-big"),
        &json!({ "deliver_at": rfc3339(now_ms() + 300), "payload": "x".repeat(5_000) }),
    )
    .await;
    assert_eq!(code, 201, "{event}");
    let version = event["version"].as_str().unwrap();

    let records = consumer.read(1, Duration::from_secs(1)).await;
    if records.len() != 1 {
        node.print_logs();
    }
    assert_eq!(records.len(), 1, "one notice record: {records:?}");
    let record = &records[0];
    let body: Value = serde_json::from_str(&record.value).unwrap();
    assert_eq!(body["type"], "event_failed", "{body}");
    assert_eq!(
        body["id"],
        format!("event_failed/too-big/{version}"),
        "{body}"
    );
    assert_eq!(body["tenant"], "acme", "{body}");
    assert_eq!(body["event_id"], "too-big", "{body}");
    assert_eq!(body["version"], version, "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.to_lowercase().contains("too large")),
        "{body}"
    );
    let (_, stored) = get_json(&node.url("/v1/tenants/acme/events/too-big")).await;
    assert_eq!(stored["status"], "failed", "{stored}");

    // Signed like a delivery, with the tenant's secret.
    let header = |name: &str| {
        record
            .headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header: {record:?}"))
            .as_str()
    };
    let timestamp = header("webhook-timestamp");
    let at = Timestamp::from_millis(timestamp.parse::<i64>().unwrap() * 1_000);
    let signer = Signer::new(&SigningSecrets::new(secret)).unwrap();
    assert_eq!(
        header("webhook-signature"),
        signer.signature(header("webhook-id"), timestamp, record.value.as_bytes(), at),
        "the notice is signed with the tenant's secret"
    );
}
