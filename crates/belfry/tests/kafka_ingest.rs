//! Kafka ingestion end to end: a real `belfry` process configured with
//! `[kafka.ingest]`, a real Kafka-protocol broker (the mock cluster in its
//! own process, or the broker named by `BELFRY_TEST_KAFKA_BOOTSTRAP`), a
//! webhook receiver, and an independent client (Python `confluent-kafka`)
//! producing BigBen `EventRequest` records keyed `tenant/id` and reading
//! answers, dead letters and the group's committed offsets.
//!
//! The client needs Python 3 with `confluent-kafka`: the interpreter named
//! by `BELFRY_TEST_PYTHON`, else a virtual environment this test makes
//! under `target/belfry-test-venv` (`pip install`, once). Without
//! `python3` at all the tests are skipped with a loud message. The mock
//! broker must be built (`cargo build -p belfry-kafka-mock`;
//! `scripts/test.sh` does).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, KafkaBroker, Receiver, get_json, post_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

const DEADLINE: Duration = Duration::from_secs(120);
const TENANT: &str = "TenantB/ProgramB/EnvC";

/// A Python interpreter with the independent Kafka client.
fn client_python() -> Option<PathBuf> {
    common::test_python("confluent_kafka", "Kafka ingestion end to end")
}

/// The Python client (`tests/support/kafka_client.py`).
struct Client {
    python: PathBuf,
    bootstrap: String,
}

impl Client {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/kafka_client.py")
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.python);
        command
            .arg(Self::script())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Produces `(key, value)` records in order; returns each record's
    /// `(key, partition, offset)` as Kafka acknowledged it.
    async fn produce(&self, dir: &Path, topic: &str, records: &[(String, String)]) -> Produced {
        let input = dir.join(format!("{topic}-in.jsonl"));
        let output = dir.join(format!("{topic}-out.jsonl"));
        let lines: String = records
            .iter()
            .map(|(key, value)| json!({ "key": key, "value": value }).to_string() + "\n")
            .collect();
        std::fs::write(&input, lines).unwrap();
        let out = self
            .command(&[
                "produce",
                &self.bootstrap,
                topic,
                input.to_str().unwrap(),
                output.to_str().unwrap(),
            ])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "produce: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Produced::read(&output)
    }

    /// The first `count` records of `topic`: `{key, value, headers}`.
    async fn consume(&self, topic: &str, count: usize) -> Vec<Value> {
        let out = self
            .command(&["consume", &self.bootstrap, topic, &count.to_string(), "60"])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "consume {topic}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// The group's committed offset per partition (-1: none).
    async fn committed(&self, group: &str, topic: &str, partitions: u32) -> Vec<i64> {
        let out = self
            .command(&[
                "committed",
                &self.bootstrap,
                group,
                topic,
                &partitions.to_string(),
            ])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "committed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// Where each produced record went.
struct Produced(Vec<(String, i32, i64)>);

impl Produced {
    fn read(path: &Path) -> Produced {
        let text = std::fs::read_to_string(path).unwrap();
        Produced(
            text.lines()
                .map(|line| {
                    let v: Value = serde_json::from_str(line).unwrap();
                    (
                        v["key"].as_str().unwrap().to_string(),
                        v["partition"].as_i64().unwrap() as i32,
                        v["offset"].as_i64().unwrap(),
                    )
                })
                .collect(),
        )
    }
}

/// `belfry.toml` with `[kafka.ingest]` reading `topic` (and `-responses`,
/// `-dlq` for answers and dead letters); `None`: without ingestion.
fn write_config(dir: &Path, bootstrap: &str, topic: &str, ingest: bool) -> PathBuf {
    let path = dir.join(if ingest {
        "belfry.toml"
    } else {
        "belfry-no-kafka.toml"
    });
    let text = if ingest {
        format!(
            "[kafka.ingest]\n\
             bootstrap_servers = \"{bootstrap}\"\n\
             topics = [\"{topic}\"]\n\
             group_id = \"belfry-e2e\"\n\
             response_topic = \"{topic}-responses\"\n\
             dead_letter_topic = \"{topic}-dlq\"\n\
             allowed_tenants = [\"*\"]\n\
             commit_interval_ms = 200\n\
             [kafka.ingest.consumer]\n\
             \"session.timeout.ms\" = \"6000\"\n\
             \"heartbeat.interval.ms\" = \"500\"\n\
             \"max.poll.interval.ms\" = \"10000\"\n"
        )
    } else {
        String::new()
    };
    std::fs::write(&path, text).unwrap();
    path
}

async fn start_node(data: &Path, config: &Path) -> BelfryProcess {
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), data)
        .arg("--config")
        .arg(config.to_str().unwrap());
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn register(node: &BelfryProcess, url: &str) {
    let (status, body) = post_json(
        &node.url("/events/tenant/register"),
        &json!({"tenant": TENANT, "type": "HTTP", "props": {"url": url}}),
    )
    .await;
    assert_eq!(status, 200, "register: {body}");
}

fn request(id: &str, at_ms: i64, mode: &str) -> (String, String) {
    (
        format!("{TENANT}/{id}"),
        json!({ "id": id, "eventTime": rfc3339(at_ms), "tenant": TENANT,
                "payload": format!("{{\"id\":\"{id}\"}}"), "mode": mode })
        .to_string(),
    )
}

async fn find(node: &BelfryProcess, id: &str) -> (u16, Value) {
    get_json(&node.url(&format!("/events/find?id={id}&tenant={}", encode(TENANT)))).await
}

/// Deliveries per event id (`X-Belfry-Event-Id`, kept by lean receivers
/// too).
fn deliveries(receiver: &Receiver) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for request in receiver.requests() {
        let id = request.header("x-belfry-event-id").unwrap().to_string();
        *counts.entry(id).or_default() += 1;
    }
    counts
}

/// Percent-encodes the `/` of tenant names for a path or query.
fn encode(text: &str) -> String {
    text.replace('/', "%2F")
}

/// A BigBen client that produces `EventRequest` records and reads the
/// answers works unchanged: events are stored (find), delivered once, a
/// REMOVE keyed like its UPSERT cancels it, bad records are dead-lettered
/// with their reason and answered `REJECTED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bigben_requests_through_a_topic_are_stored_delivered_and_answered() {
    let Some(python) = client_python() else {
        return;
    };
    let topic = "bigben-in";
    let broker = KafkaBroker::start_with(
        1,
        &[(topic, 3), ("bigben-in-responses", 1), ("bigben-in-dlq", 1)],
    );
    let client = Client {
        python,
        bootstrap: broker.bootstrap_servers().to_string(),
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), broker.bootstrap_servers(), topic, true);
    let mut node = start_node(&dir.path().join("data"), &config).await;
    let receiver = Receiver::start().await;
    register(&node, &receiver.url("/hook")).await;

    let soon = now_ms() + 4_000;
    let records = vec![
        request("order-1", soon, "UPSERT"),
        request("order-2", soon, "UPSERT"),
        request("order-2", soon, "REMOVE"),
        request("late", now_ms() - 60_000, "UPSERT"),
        (format!("{TENANT}/broken"), "{\"id\": ".to_string()),
        (
            "nobody/x".to_string(),
            json!({ "id": "x", "eventTime": rfc3339(soon), "tenant": "nobody" }).to_string(),
        ),
    ];
    client.produce(dir.path(), topic, &records).await;

    let answers = client.consume("bigben-in-responses", records.len()).await;
    let status_of = |key: &str| -> Vec<String> {
        answers
            .iter()
            .filter(|a| a["key"] == key)
            .map(|a| {
                let body: Value = serde_json::from_str(a["value"].as_str().unwrap()).unwrap();
                body["eventStatus"].as_str().unwrap_or("null").to_string()
            })
            .collect()
    };
    assert_eq!(status_of(&format!("{TENANT}/order-1")), ["ACCEPTED"]);
    assert_eq!(
        status_of(&format!("{TENANT}/order-2")),
        ["ACCEPTED", "DELETED"]
    );
    assert_eq!(status_of(&format!("{TENANT}/late")), ["TRIGGERED"]);
    assert_eq!(status_of(&format!("{TENANT}/broken")), ["REJECTED"]);
    assert_eq!(status_of("nobody/x"), ["REJECTED"]);

    let dead = client.consume("bigben-in-dlq", 2).await;
    let reasons: HashMap<String, (String, String)> = dead
        .iter()
        .map(|d| {
            let headers = &d["headers"];
            (
                d["key"].as_str().unwrap().to_string(),
                (
                    headers["belfry-dlq-code"].as_str().unwrap().to_string(),
                    headers["belfry-dlq-reason"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(reasons[&format!("{TENANT}/broken")].0, "invalid_json");
    assert_eq!(reasons["nobody/x"].0, "unknown_tenant");
    assert!(
        reasons["nobody/x"]
            .1
            .starts_with("tenant not registered / unknown tenant"),
        "{reasons:?}"
    );
    let broken = dead
        .iter()
        .find(|d| d["key"] == format!("{TENANT}/broken"))
        .unwrap();
    assert_eq!(broken["value"], "{\"id\": ", "the record itself, unchanged");

    let (status, found) = find(&node, "order-1").await;
    assert_eq!(status, 200, "stored: {found}");
    assert_eq!(find(&node, "order-2").await.0, 404);

    receiver.wait_for_count(2, DEADLINE).await.unwrap();
    // Past order-1's instant, with time for a wrong second delivery.
    tokio::time::sleep(Duration::from_millis(
        (soon - now_ms()).max(0) as u64 + 1_500,
    ))
    .await;
    let delivered = deliveries(&receiver);
    assert_eq!(
        delivered,
        HashMap::from([("order-1".to_string(), 1), ("late".to_string(), 1)])
    );
    let (_, found) = find(&node, "order-1").await;
    assert_eq!(found["eventStatus"], "PROCESSED");
    let committed = client.committed("belfry-e2e", topic, 3).await;
    assert_eq!(
        committed.iter().map(|c| (*c).max(0)).sum::<i64>(),
        records.len() as i64,
        "every offset committed, bad records included: {committed:?}"
    );
    node.terminate().await;
}

/// kill -9 in the middle of ingesting 20,000 records (set
/// `BELFRY_TEST_KAFKA_RECORDS` for more): every record below the committed
/// offsets is stored (checked with ingestion off); after the restart the
/// rest is read again and every event is delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_ingestion_loses_nothing_and_delivers_once() {
    let Some(python) = client_python() else {
        return;
    };
    let records_count: usize = std::env::var("BELFRY_TEST_KAFKA_RECORDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    const PARTITIONS: u32 = 4;
    let topic = "crash-in";
    let broker = KafkaBroker::start_with(
        1,
        &[
            (topic, PARTITIONS),
            ("crash-in-responses", 1),
            ("crash-in-dlq", 1),
        ],
    );
    let client = Client {
        python,
        bootstrap: broker.bootstrap_servers().to_string(),
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let with_kafka = write_config(dir.path(), broker.bootstrap_servers(), topic, true);
    let without_kafka = write_config(dir.path(), broker.bootstrap_servers(), topic, false);
    let mut node = start_node(&data, &with_kafka).await;
    let receiver = Receiver::start_lean().await;
    receiver.reserve(records_count);
    register(&node, &receiver.url("/hook")).await;

    // Due after the crash, the check and the restart: each delivery
    // happens after the restart, so each must happen exactly once.
    let due = now_ms() + 25_000 + records_count as i64;
    let ids: Vec<String> = (0..records_count).map(|i| format!("e{i:05}")).collect();
    let records: Vec<(String, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| request(id, due + (i as i64 % 2_000), "UPSERT"))
        .collect();
    let started = Instant::now();
    let produced = client.produce(dir.path(), topic, &records).await;
    assert_eq!(produced.0.len(), records_count);
    eprintln!(
        "produced {records_count} records in {:?}",
        started.elapsed()
    );

    // Kill once part of the records is committed, not all.
    let committed_before = loop {
        let committed: i64 = client
            .committed("belfry-e2e", topic, PARTITIONS)
            .await
            .iter()
            .map(|c| (*c).max(0))
            .sum();
        if committed >= (records_count / 10) as i64 {
            node.kill_9();
            break committed;
        }
        assert!(started.elapsed() < DEADLINE, "nothing committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let committed = client.committed("belfry-e2e", topic, PARTITIONS).await;
    let committed_sum: i64 = committed.iter().map(|c| (*c).max(0)).sum();
    eprintln!(
        "killed at {committed_before} committed ({:?} after producing started); committed now {committed:?} = {committed_sum}",
        started.elapsed()
    );
    assert!(
        committed_sum < records_count as i64,
        "the kill came after everything was committed; produce more or faster"
    );

    // Ingestion off: what the store holds is exactly what was written
    // before the kill.
    let mut checker = start_node(&data, &without_kafka).await;
    let stored = stored_ids(&checker).await;
    let below: Vec<&String> = produced
        .0
        .iter()
        .filter(|(_, partition, offset)| *offset < committed[*partition as usize])
        .map(|(key, _, _)| key)
        .collect();
    assert_eq!(below.len() as i64, committed_sum);
    let missing: Vec<&&String> = below
        .iter()
        .filter(|key| !stored.contains(key.rsplit('/').next().unwrap()))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "committed but not stored: {missing:?} ({} stored)",
        stored.len()
    );
    eprintln!(
        "{} stored at the kill, {} of them committed",
        stored.len(),
        committed_sum
    );
    checker.terminate().await;

    // Ingestion on again: the rest is read (the uncommitted part again).
    let restarted = Instant::now();
    let mut node = start_node(&data, &with_kafka).await;
    let deadline = Instant::now() + DEADLINE;
    let mut first_commit: Option<(Instant, i64)> = None;
    loop {
        let committed: i64 = client
            .committed("belfry-e2e", topic, PARTITIONS)
            .await
            .iter()
            .map(|c| (*c).max(0))
            .sum();
        if first_commit.is_none() && committed > committed_sum {
            first_commit = Some((Instant::now(), committed));
        }
        if committed == records_count as i64 {
            break;
        }
        assert!(Instant::now() < deadline, "only {committed} committed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (first_at, first_count) = first_commit.unwrap_or((Instant::now(), 0));
    let rate =
        (records_count as i64 - first_count) as f64 / first_at.elapsed().as_secs_f64().max(0.001);
    eprintln!(
        "after the restart: all {records_count} committed {:?} after the start (group join included); \
         {:.0} records/s committed between the first commit and the last (debug build)",
        restarted.elapsed(),
        rate
    );
    assert!(
        now_ms() < due,
        "ingestion took past the events' instant; raise `due`"
    );
    receiver
        .wait_for_count(
            records_count,
            Duration::from_millis((due - now_ms()) as u64) + DEADLINE,
        )
        .await
        .unwrap();
    // Time for a wrong second delivery.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delivered = deliveries(&receiver);
    assert_eq!(delivered.len(), records_count, "every event delivered");
    let twice: Vec<(&String, &usize)> = delivered.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    node.terminate().await;
}

/// Every event id the node stores for the tenant (`/v1` list, all pages).
async fn stored_ids(node: &BelfryProcess) -> HashSet<String> {
    let tenant = encode(TENANT);
    let mut ids = HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tenants/{tenant}/events?limit=1000");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (status, page) = get_json(&node.url(&path)).await;
        assert_eq!(status, 200, "{page}");
        for event in page["events"].as_array().unwrap() {
            ids.insert(event["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return ids,
        }
    }
}
