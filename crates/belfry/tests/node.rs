//! End-to-end tests of the real `belfry` binary: a real process, a real
//! webhook receiver, real kill -9.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

/// Generous bounds: tests check behaviour, benchmarks measure speed.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(60);

async fn start_node(dir: &std::path::Path, env: &[(&str, &str)]) -> BelfryProcess {
    let mut launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    for (k, v) in env {
        launch = launch.env(*k, *v);
    }
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn register(node: &BelfryProcess, tenant: &str, url: &str) {
    let (status, body) = post_json(
        &node.url("/events/tenant/register"),
        &json!({"tenant": tenant, "type": "HTTP", "props": {"url": url}}),
    )
    .await;
    assert_eq!(status, 200, "register: {body}");
}

fn event(tenant: &str, id: &str, at_ms: i64) -> Value {
    json!({"id": id, "tenant": tenant, "eventTime": rfc3339(at_ms), "payload": format!("p-{id}")})
}

/// `(X-Belfry-Event-Id, arrival ms, X-Belfry-Scheduled-At)` of each delivery.
fn arrivals(receiver: &Receiver) -> Vec<(String, i64, String)> {
    receiver
        .requests()
        .into_iter()
        .map(|r| {
            (
                r.header("x-belfry-event-id")
                    .unwrap_or_default()
                    .to_string(),
                r.arrived_at_ms,
                r.header("x-belfry-scheduled-at")
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_fire_at_their_instant_and_never_before() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path(), &[]).await;
    register(&node, "acme/billing", &receiver.url("/hook")).await;

    let base = now_ms();
    let mut due = HashMap::new();
    let batch: Vec<Value> = (0..30)
        .map(|i| {
            let at = base + 2_000 + i * 100;
            due.insert(format!("e{i}"), at);
            event("acme/billing", &format!("e{i}"), at)
        })
        .collect();
    let (status, body) = post_json(&node.url("/events/schedule"), &Value::Array(batch)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.as_array()
            .unwrap()
            .iter()
            .all(|i| i["eventStatus"] == "ACCEPTED")
    );

    receiver
        .wait_for_count(30, DELIVERY_DEADLINE)
        .await
        .unwrap();
    for (id, arrived, _) in arrivals(&receiver) {
        let at = due[&id];
        assert!(arrived >= at, "{id} arrived {} ms early", at - arrived);
        // Generous: a loaded CI machine may be slow. The benchmark measures
        // real lateness.
        assert!(
            arrived - at < 2_000,
            "{id} arrived {} ms late",
            arrived - at
        );
    }
    let (status, found) = get_json(&node.url("/events/find?tenant=acme%2Fbilling&id=e0")).await;
    assert_eq!(status, 200);
    assert_eq!(found["eventStatus"], "PROCESSED", "{found}");
}

/// Schedules batches until told to stop; returns the ids whose batch was
/// acknowledged with 200.
async fn load_until_killed(
    url: String,
    loader: usize,
    due_at: i64,
    acknowledged_total: Arc<AtomicUsize>,
) -> Vec<String> {
    let mut acknowledged = Vec::new();
    let client = belfry_testkit::http_client();
    for b in 0.. {
        let ids: Vec<String> = (0..500).map(|i| format!("l{loader}-b{b}-{i}")).collect();
        let body: Vec<Value> = ids.iter().map(|id| event("crash", id, due_at)).collect();
        match client.post(&url).json(&body).send().await {
            Ok(response) if response.status().as_u16() == 200 => {
                // Only a complete, read answer counts as an acknowledgement.
                if response.bytes().await.is_ok() {
                    acknowledged_total.fetch_add(ids.len(), Ordering::SeqCst);
                    acknowledged.extend(ids);
                }
            }
            Ok(response) => panic!("unexpected status {}", response.status()),
            Err(_) => break, // The node was killed mid-request.
        }
    }
    acknowledged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_ingest_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start_lean().await;
    let mut node = start_node(dir.path(), &[]).await;
    register(&node, "crash", &receiver.url("/hook")).await;

    // How many acknowledged events before the kill; a thorough run sets
    // BELFRY_TEST_CRASH_EVENTS=100000 (the default keeps CI short).
    let kill_after: usize = std::env::var("BELFRY_TEST_CRASH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    // Due after the restart, so nothing is delivered before the kill and any
    // duplicate would be a real bug (allowing ingest at ≥ 5k events/s).
    let due_at = now_ms() + 15_000 + kill_after as i64 / 5;
    let url = node.url("/events/schedule");
    let acknowledged_total = Arc::new(AtomicUsize::new(0));
    let loaders: Vec<_> = (0..4)
        .map(|loader| {
            tokio::spawn(load_until_killed(
                url.clone(),
                loader,
                due_at,
                acknowledged_total.clone(),
            ))
        })
        .collect();
    // Kill mid-stream, while all four loaders have requests in flight.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while acknowledged_total.load(Ordering::SeqCst) < kill_after
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    node.kill_9();
    let mut acknowledged = HashSet::new();
    for loader in loaders {
        acknowledged.extend(loader.await.unwrap());
    }
    assert!(
        acknowledged.len() >= kill_after,
        "too few acknowledged before the kill: {}",
        acknowledged.len()
    );

    node.restart().await.expect("restart after kill -9");
    // Wait for every acknowledged id itself: events stored but not yet
    // acknowledged at the kill are delivered too, so a count alone could be
    // reached while acknowledged ones are still on their way.
    let deadline = tokio::time::Instant::now() + DELIVERY_DEADLINE;
    let missing = loop {
        let delivered: HashSet<String> =
            arrivals(&receiver).into_iter().map(|(id, ..)| id).collect();
        let missing: Vec<&String> = acknowledged
            .iter()
            .filter(|id| !delivered.contains(*id))
            .collect();
        if missing.is_empty() || tokio::time::Instant::now() >= deadline {
            break missing.into_iter().take(10).cloned().collect::<Vec<_>>();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        missing.is_empty(),
        "acknowledged but never delivered: {missing:?}\n{}",
        node.logs_tail(40)
    );
    // Give stragglers a moment to show up as duplicates, if any.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered: Vec<String> = arrivals(&receiver).into_iter().map(|(id, ..)| id).collect();
    let unique: HashSet<&String> = delivered.iter().collect();
    assert_eq!(
        unique.len(),
        delivered.len(),
        "duplicates although nothing was in flight at the kill"
    );
    for (_, arrived, _) in arrivals(&receiver) {
        assert!(arrived >= due_at, "delivered early");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_delivery_redelivers_only_in_flight_ones() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start_lean().await;
    // A slow receiver keeps deliveries in flight at the kill.
    receiver
        .set_default(belfry_testkit::Response::status(200).with_delay(Duration::from_millis(20)));
    let mut node = start_node(dir.path(), &[("BELFRY_ENGINE__MAX_IN_FLIGHT", "64")]).await;
    register(&node, "slow", &receiver.url("/hook")).await;
    let due_at = now_ms() + 1_500;
    let total = 3_000;
    for chunk in 0..(total / 500) {
        let body: Vec<Value> = (0..500)
            .map(|i| event("slow", &format!("d{chunk}-{i}"), due_at))
            .collect();
        let (status, _) = post_json(&node.url("/events/schedule"), &Value::Array(body)).await;
        assert_eq!(status, 200);
    }
    receiver
        .wait_for_count(300, DELIVERY_DEADLINE)
        .await
        .unwrap();
    node.kill_9();
    let before_restart = receiver.count();
    node.restart().await.expect("restart");
    let deadline = tokio::time::Instant::now() + DELIVERY_DEADLINE;
    loop {
        let unique: HashSet<String> = arrivals(&receiver).into_iter().map(|(id, ..)| id).collect();
        if unique.len() == total {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {total} delivered",
            unique.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered = arrivals(&receiver);
    let duplicates = delivered.len() - total;
    // At most what was in flight (64) plus outcomes not yet recorded
    // (one recorder batch) at the kill.
    assert!(
        duplicates <= 64 + before_restart.min(2_048),
        "{duplicates} duplicates"
    );
    let keys: HashSet<String> = receiver
        .requests()
        .iter()
        .filter_map(|r| r.header("idempotency-key").map(str::to_string))
        .collect();
    assert_eq!(
        keys.len(),
        total,
        "one idempotency key per event, stable across redelivery"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_due_while_down_fire_at_start_and_old_ones_are_recorded_missed() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let mut node = start_node(dir.path(), &[("BELFRY_ENGINE__LOOKBACK_MS", "3000")]).await;
    register(&node, "t", &receiver.url("/hook")).await;
    let base = now_ms();
    let body = json!([
        event("t", "recent", base + 5_500),
        event("t", "old", base + 1_000),
    ]);
    let (status, _) = post_json(&node.url("/events/schedule"), &body).await;
    assert_eq!(status, 200);
    node.kill_9();
    // "old" comes due 1 s from base and is > 3 s late when the node returns
    // at ~base + 6.5 s; "recent" is ~1 s late: inside the look-back.
    let wait_until = base + 6_500;
    tokio::time::sleep(Duration::from_millis((wait_until - now_ms()).max(0) as u64)).await;
    node.restart().await.unwrap();
    receiver.wait_for_count(1, DELIVERY_DEADLINE).await.unwrap();
    assert_eq!(arrivals(&receiver)[0].0, "recent");
    let deadline = tokio::time::Instant::now() + DELIVERY_DEADLINE;
    loop {
        let (status, old) = get_json(&node.url("/v1/tenants/t/events/old")).await;
        assert_eq!(status, 200, "{old}");
        if old["status"] == "missed" {
            assert!(
                old["last_error"].as_str().unwrap().contains("missed"),
                "{old}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "old never recorded as missed: {old}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        receiver.count(),
        1,
        "the missed event must not be delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_work_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver
        .set_default(belfry_testkit::Response::status(200).with_delay(Duration::from_millis(800)));
    let mut node = start_node(dir.path(), &[]).await;
    register(&node, "t", &receiver.url("/hook")).await;
    let (status, _) = post_json(
        &node.url("/events/schedule"),
        &json!([event("t", "slow", now_ms())]),
    )
    .await;
    assert_eq!(status, 200);
    // Wait until the delivery is in flight, then ask the node to stop.
    let deadline = tokio::time::Instant::now() + DELIVERY_DEADLINE;
    while receiver.count() == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let exit = node.terminate().await.expect("exit status");
    assert!(
        exit.success(),
        "exit status {exit:?}\n{}",
        node.logs_tail(30)
    );
    // The in-flight delivery's outcome was recorded before exit: after a
    // restart it is delivered, not re-sent.
    node.restart().await.unwrap();
    let (_, found) = get_json(&node.url("/v1/tenants/t/events/slow")).await;
    assert_eq!(found["status"], "delivered", "{found}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.count(), 1);
}

/// A log written to a file (here: the harness's `stdout.log`) must be plain
/// text: colour codes belong on a terminal only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    // Empty means unset (no-color.org): only the file decides.
    let mut node = start_node(dir.path(), &[("NO_COLOR", ""), ("RUST_LOG", "info")]).await;
    let exit = node.terminate().await.expect("exit status");
    assert!(exit.success(), "{exit:?}");
    let logs = node.logs_tail(usize::MAX);
    assert!(logs.contains("belfry is serving"), "{logs}");
    assert!(logs.contains("belfry stopped"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "ESC in a log file:\n{logs:?}");
}

/// Runs `belfry ARGS` to its end (at most a minute); returns whether it
/// succeeded and everything it printed.
async fn run_belfry(args: &[&str]) -> (std::process::ExitStatus, String) {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_belfry"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("belfry spawns");
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("belfry {args:?} still runs after a minute"))
        .expect("output");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, printed)
}

/// A second node on a data directory another process holds refuses to
/// start, saying so and naming the holder (not the storage engine's bare
/// `Locked`); so does `belfry keys create`. The first node keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_a_held_data_dir_names_the_process_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = start_node(dir.path(), &[]).await;
    let holder = format!(
        "in use by another belfry process (pid {})",
        first.pid().unwrap()
    );
    let data_dir = first.data_dir().to_str().unwrap().to_string();

    let (status, printed) =
        run_belfry(&["serve", "--listen", "127.0.0.1:0", "--data-dir", &data_dir]).await;
    assert!(!status.success(), "the second node started: {printed}");
    assert!(printed.contains(&holder), "{printed}");
    assert!(!printed.contains("Locked"), "{printed}");

    let (status, printed) =
        run_belfry(&["keys", "create", "--role", "admin", "--data-dir", &data_dir]).await;
    assert!(
        !status.success(),
        "keys create opened a held store: {printed}"
    );
    assert!(printed.contains(&holder), "{printed}");

    let (status, _) = get_json(&first.url("/v1/tenants")).await;
    assert_eq!(status, 200, "the first node still serves");
}
