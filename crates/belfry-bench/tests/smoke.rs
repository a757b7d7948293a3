//! Smoke runs of every scenario with tiny counts against the debug `belfry`
//! binary, so the tool keeps working. Nothing here asserts speed: only that
//! each run completes, reports valid JSON, and saw nothing missing or early.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// `belfry` next to the bench binary (`target/<profile>/`). `scripts/test.sh`
/// builds it before the tests run.
fn belfry_binary() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_belfry-bench"));
    let belfry = bench
        .parent()
        .expect("the bench binary lives in a directory")
        .join(format!("belfry{}", std::env::consts::EXE_SUFFIX));
    assert!(
        belfry.is_file(),
        "no belfry binary at {}: build it first with `cargo build -p belfry` (scripts/test.sh does)",
        belfry.display()
    );
    belfry
}

/// Runs `belfry-bench <args> --json` against the debug node (the `cluster`
/// case also launches a throwaway PostgreSQL: its binaries must be
/// installed, as `scripts/test.sh` does); returns its
/// JSON report.
fn bench(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_belfry-bench"))
        .args(args)
        .arg("--belfry-bin")
        .arg(belfry_binary())
        .args(["--json", "--threads", "1"])
        .output()
        .expect("run belfry-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "belfry-bench {args:?} failed with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("belfry-bench {args:?} printed no JSON ({e}):\n{stdout}\nstderr:\n{stderr}")
    })
}

fn assert_all_acknowledged(report: &Value, events: u64) {
    let ingest = &report["ingest"];
    assert_eq!(ingest["acknowledged_events"], events, "{report:#}");
    assert_eq!(ingest["unacknowledged_events"], 0, "{report:#}");
    assert_eq!(ingest["failed_requests"], 0, "{report:#}");
}

fn assert_all_delivered_never_early(report: &Value, events: u64) {
    let delivery = &report["delivery"];
    assert_eq!(delivery["delivered"], events, "{report:#}");
    assert_eq!(delivery["missing"], 0, "{report:#}");
    assert_eq!(delivery["early"], 0, "{report:#}");
    assert_eq!(delivery["unknown"], 0, "{report:#}");
    assert_eq!(delivery["scheduled_header_mismatch"], 0, "{report:#}");
    assert!(delivery["lateness_ms"]["max"].is_number(), "{report:#}");
}

#[test]
fn ingest_batched_and_single_event() {
    let batched = bench(&["ingest", "--count", "300", "--batch", "100"]);
    assert_eq!(batched["scenario"], "ingest");
    assert_all_acknowledged(&batched, 300);
    assert!(
        batched["node"]["peak_rss_bytes"].as_u64().unwrap() > 0,
        "{batched:#}"
    );

    let single = bench(&[
        "ingest",
        "--count",
        "50",
        "--batch",
        "1",
        "--concurrency",
        "8",
    ]);
    assert_all_acknowledged(&single, 50);
    assert_eq!(single["ingest"]["requests"], 50);
}

#[test]
fn steady_delivers_everything_never_early() {
    let report = bench(&[
        "steady",
        "--rate",
        "50",
        "--duration",
        "2s",
        "--lead-ms",
        "3000",
        "--batch",
        "25",
    ]);
    assert_all_acknowledged(&report, 100);
    assert_all_delivered_never_early(&report, 100);
}

#[test]
fn mixed_fires_while_a_stream_ingests() {
    let report = bench(&[
        "mixed",
        "--rate",
        "50",
        "--duration",
        "2s",
        "--lead-ms",
        "3000",
        "--batch",
        "25",
        "--ingest-rate",
        "500",
        "--ingest-batch",
        "50",
    ]);
    assert_eq!(report["scenario"], "mixed");
    assert_all_acknowledged(&report, 100);
    // `unknown` 0: none of the streamed events fired.
    assert_all_delivered_never_early(&report, 100);
    let stream = &report["mixed"]["stream"]["ingest"];
    assert!(
        stream["acknowledged_events"].as_u64().unwrap() >= 500,
        "{report:#}"
    );
    assert_eq!(stream["unacknowledged_events"], 0, "{report:#}");
    assert!(
        report["mixed"]["acknowledged_while_firing"]
            .as_u64()
            .unwrap()
            > 0,
        "{report:#}"
    );
}

#[test]
fn hung_tenants_do_not_stop_a_healthy_one() {
    let report = bench(&[
        "hung",
        "--hung-tenants",
        "2",
        "--hung-events",
        "500",
        "--healthy-rate",
        "50",
        "--duration",
        "2s",
        "--lead-ms",
        "3000",
        "--batch",
        "100",
    ]);
    assert_eq!(report["scenario"], "hung");
    assert_all_acknowledged(&report, 1000);
    assert_all_delivered_never_early(&report, 100);
    let hung = &report["hung"];
    assert_eq!(
        hung["healthy_ingest"]["acknowledged_events"], 100,
        "{report:#}"
    );
    // Deliveries to the hung tenants reached the endpoint and hang there.
    assert!(
        hung["connections_with_request"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    assert!(
        hung["node_rss_max_while_due_bytes"].as_u64().unwrap() > 0,
        "{report:#}"
    );
}

#[test]
fn steady_on_postgres_when_a_server_is_given() {
    // Only with an existing server (`BELFRY_TEST_DATABASE_URL`): the node
    // gets a fresh database on it, dropped at the end.
    let Some(url) = std::env::var("BELFRY_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!("skipped: BELFRY_TEST_DATABASE_URL is not set");
        return;
    };
    let report = bench(&[
        "steady",
        "--rate",
        "50",
        "--duration",
        "2s",
        "--lead-ms",
        "3000",
        "--batch",
        "25",
        "--database-url",
        url.trim(),
    ]);
    assert_eq!(report["params"]["database"], "postgres", "{report:#}");
    assert_all_acknowledged(&report, 100);
    assert_all_delivered_never_early(&report, 100);
}

#[test]
fn burst_delivers_everything_never_early() {
    let report = bench(&["burst", "--count", "200", "--lead-ms", "3000"]);
    assert_all_acknowledged(&report, 200);
    assert_all_delivered_never_early(&report, 200);
}

#[test]
fn backlog_survives_kill_9_and_restart() {
    let report = bench(&["backlog", "--count", "500", "--batch", "100"]);
    assert_all_acknowledged(&report, 500);
    let backlog = &report["backlog"];
    assert_eq!(backlog["pending_events"], 500, "{report:#}");
    assert!(
        backlog["data_dir_allocated_bytes"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    assert!(backlog["restart_to_serving_ms"].is_number(), "{report:#}");
    // The spot check after the restart found every sampled event.
    assert_eq!(report["warnings"], Value::Array(vec![]), "{report:#}");
}

#[test]
fn cluster_of_two_nodes_delivers_everything_never_early() {
    // A throwaway PostgreSQL (the test harness's), two debug nodes.
    let report = bench(&[
        "cluster",
        "--nodes",
        "2",
        "--count",
        "200",
        "--spread-ms",
        "1000",
        "--lead-ms",
        "4000",
        "--batch",
        "50",
    ]);
    assert_eq!(report["scenario"], "cluster");
    assert_all_acknowledged(&report, 200);
    assert_all_delivered_never_early(&report, 200);
    let cluster = &report["cluster"];
    assert_eq!(cluster["nodes"], 2, "{report:#}");
    let shares: Vec<u64> = cluster["per_node"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["partitions_at_start"].as_u64().unwrap())
        .collect();
    assert_eq!(shares.iter().sum::<u64>(), 64, "{report:#}");
    assert!(cluster["failover"].is_null(), "{report:#}");
}

#[test]
fn receive_measures_an_external_peer() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_belfry-bench"))
        .args([
            "receive",
            "--port",
            &port.to_string(),
            "--expect",
            "3",
            "--timeout",
            "60s",
        ])
        .args(["--json", "--threads", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A stand-in peer: three events carrying their instant in a header or
    // the body, one delivered twice.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let send = |request: String| {
        // Poll until the receiver listens (it starts asynchronously).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(mut stream) => {
                    use std::io::{Read, Write};
                    stream.write_all(request.as_bytes()).unwrap();
                    let mut answer = [0u8; 64];
                    let _ = stream.read(&mut answer);
                    return;
                }
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("the receiver never listened: {e}"),
            }
        }
    };
    let by_header = |id: &str| {
        format!(
            "POST /hook HTTP/1.1\r\nhost: x\r\nx-event-id: {id}\r\nx-scheduled-at: {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            now_ms - 5
        )
    };
    let body = format!(r#"{{"id":"c","scheduled_at":{}}}"#, now_ms - 5);
    send(format!(
        "POST /hook HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    // Three requests but two events so far: the receiver must keep waiting
    // for the third distinct one.
    send(by_header("a"));
    send(by_header("a"));
    send(by_header("b"));
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let delivery = &report["delivery"];
    assert_eq!(delivery["delivered"], 3, "{report:#}");
    assert_eq!(delivery["duplicates"], 1, "{report:#}");
    assert_eq!(delivery["missing"], 0, "{report:#}");
    assert_eq!(delivery["early"], 0, "{report:#}");
}

#[test]
fn schedules_fire_their_occurrences_never_early() {
    // Every second rather than every minute, so a few seconds see several
    // occurrences of each schedule.
    let report = bench(&[
        "schedules",
        "--count",
        "20",
        "--every-second",
        "--duration",
        "4s",
        "--grace-ms",
        "20000",
    ]);
    assert_eq!(report["scenario"], "schedules");
    assert_all_acknowledged(&report, 20);
    let delivery = &report["delivery"];
    assert!(delivery["delivered"].as_u64().unwrap() >= 1, "{report:#}");
    assert_eq!(delivery["early"], 0, "{report:#}");
    assert_eq!(delivery["unknown"], 0, "{report:#}");
    assert_eq!(delivery["scheduled_header_mismatch"], 0, "{report:#}");
}

/// `kafka ingest` and `kafka burst` against `belfry-kafka-mock` (built by
/// `scripts/test.sh` next to the bench binary): every request answered
/// `ACCEPTED` once and found, every event's record consumed once, never
/// early.
#[test]
fn kafka_ingests_from_a_topic_and_delivers_to_one() {
    let ingest = bench(&["kafka", "ingest", "--count", "300", "--partitions", "4"]);
    assert_eq!(ingest["scenario"], "kafka-ingest");
    let answers = &ingest["kafka"]["answers"];
    assert_eq!(answers["accepted"], 300, "{ingest:#}");
    assert_eq!(answers["other"], 0, "{ingest:#}");
    assert_eq!(answers["answered_twice"], 0, "{ingest:#}");
    assert_eq!(answers["dead_letters"], 0, "{ingest:#}");
    assert_eq!(answers["spot_found"], answers["spot_checked"], "{ingest:#}");
    assert!(
        answers["events_per_s"].as_f64().unwrap() > 0.0,
        "{ingest:#}"
    );

    let burst = bench(&["kafka", "burst", "--count", "200", "--lead-ms", "3000"]);
    assert_eq!(burst["scenario"], "kafka-burst");
    assert_all_acknowledged(&burst, 200);
    assert_all_delivered_never_early(&burst, 200);
    assert_eq!(burst["delivery"]["duplicates"], 0, "{burst:#}");
    assert!(
        burst["kafka"]["record_timestamp_lateness_ms"]["max"].is_number(),
        "{burst:#}"
    );
}

#[test]
fn pull_workers_complete_every_event_once_never_early() {
    let lateness = bench(&[
        "pull",
        "lateness",
        "--rate",
        "100",
        "--duration",
        "2s",
        "--workers",
        "2",
        "--lead-ms",
        "2000",
    ]);
    let throughput = bench(&[
        "pull",
        "throughput",
        "--count",
        "300",
        "--workers",
        "2",
        "--lead-ms",
        "2000",
        "--batch-complete",
    ]);
    for (report, events) in [(&lateness, 200), (&throughput, 300)] {
        assert_all_acknowledged(report, events);
        let pull = &report["pull"];
        assert_eq!(pull["completed"], events, "{report:#}");
        assert_eq!(pull["missing"], 0, "{report:#}");
        assert_eq!(pull["early"], 0, "{report:#}");
        assert_eq!(pull["complete_errors"], 0, "{report:#}");
        assert!(pull["lease_lateness_ms"]["p50"].is_number(), "{report:#}");
        assert!(pull["events_per_s"].as_f64().unwrap() > 0.0, "{report:#}");
        // The node's own counters agree with the workers.
        assert_eq!(
            pull["node_pull_metrics"]["belfry_pull_lease_ends_total{outcome=\"completed\"}"],
            events as f64,
            "{report:#}"
        );
    }
}
