//! Pull workers end to end (`docs/pull.md`): a real `belfry serve`
//! process, workers making real HTTP calls, a worker that stops
//! heartbeating, and kill -9 of the node while workers hold leases.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::{call, now_ms, rfc3339};

/// Generous bound for anything the node must finish.
const DEADLINE: Duration = Duration::from_secs(120);

async fn start_node(dir: &std::path::Path) -> BelfryProcess {
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn pull_tenant(node: &BelfryProcess, tenant: &str) {
    pull_tenant_with(node, tenant, json!({ "type": "pull" })).await;
}

async fn pull_tenant_with(node: &BelfryProcess, tenant: &str, sink: Value) {
    let (status, body) = put_json(
        &node.url(&format!("/v1/tenants/{tenant}")),
        &json!({ "sink": sink }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

fn instant(text: &Value) -> belfry_core::Timestamp {
    belfry_core::Timestamp::parse_rfc3339(text.as_str().expect("an instant"))
        .expect("an RFC 3339 instant")
}

/// Schedules `ids` of `tenant` at `at_ms`, in batches.
async fn schedule(node: &BelfryProcess, tenant: &str, ids: &[String], at_ms: i64) {
    for chunk in ids.chunks(500) {
        let batch: Vec<Value> = chunk
            .iter()
            .map(|id| json!({ "id": id, "deliver_at": rfc3339(at_ms), "payload": id }))
            .collect();
        let (status, body) = post_json(
            &node.url(&format!("/v1/tenants/{tenant}/events")),
            &json!({ "events": batch }),
        )
        .await;
        assert!(status == 200 || status == 201, "{status} {body}");
    }
}

fn claim_body(worker: &str, max_events: u32, lease_ms: u64) -> Value {
    json!({ "worker_id": worker, "max_events": max_events, "wait_ms": 1000, "lease_ms": lease_ms })
}

/// Every event of `tenant` with `status`, paged.
async fn ids_with_status(node: &BelfryProcess, tenant: &str, status: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tenants/{tenant}/events?status={status}&limit=500");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (code, body) = get_json(&node.url(&path)).await;
        assert_eq!(code, 200, "{body}");
        events.extend(body["events"].as_array().unwrap().iter().cloned());
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return events,
        }
    }
}

/// Claims one lease of `tenant` as `worker`, polling until `DEADLINE`.
async fn claim_one(base: &str, tenant: &str, worker: &str, lease_ms: u64) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = call(
            base,
            &format!("/v1/tenants/{tenant}/leases"),
            &claim_body(worker, 1, lease_ms),
        )
        .await
        .expect("the node answers");
        assert_eq!(status, 200, "{body}");
        if let Some(lease) = body["leases"].get(0) {
            return lease.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{worker} got nothing"
        );
    }
}

/// `what` on `lease` with the smallest valid body.
async fn lease_call(base: &str, lease: &Value, what: &str) -> (u16, Value) {
    let id = lease["lease_id"].as_str().unwrap();
    let body = match what {
        "fail" => json!({ "error": { "code": "late" } }),
        _ => json!({}),
    };
    call(base, &format!("/v1/leases/{id}/{what}"), &body)
        .await
        .expect("the node answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_loses_its_lease_and_another_completes_the_event() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path()).await;
    pull_tenant(&node, "jobs").await;
    schedule(&node, "jobs", &["e1".to_string()], now_ms()).await;
    let base = node.base_url();

    // Worker A claims, heartbeats, hands its lease out and hangs until it
    // is killed (aborted): it never heartbeats again.
    let (leased, lease_of_a) = tokio::sync::oneshot::channel();
    let worker_a = tokio::spawn({
        let base = base.clone();
        async move {
            let lease = claim_one(&base, "jobs", "a", 1000).await;
            assert_eq!(lease_call(&base, &lease, "heartbeat").await.0, 200);
            leased.send(lease).unwrap();
            std::future::pending::<()>().await
        }
    });
    let lease_a = lease_of_a.await.expect("worker a leased e1");
    worker_a.abort();
    assert_eq!(lease_a["attempt"], 1);

    let lease_b = claim_one(&base, "jobs", "b", 30000).await;
    assert_eq!(lease_b["event"]["id"], "e1");
    assert_eq!(
        lease_b["attempt"], 2,
        "worker a's expiry counted: {lease_b}"
    );
    let (status, body) = lease_call(&base, &lease_b, "complete").await;
    assert_eq!(status, 200, "{body}");

    // Worker A wakes up late.
    for what in ["complete", "heartbeat"] {
        let (status, body) = lease_call(&base, &lease_a, what).await;
        assert_eq!(status, 409, "{what}: {body}");
        assert_eq!(body["error"]["code"], "lease_lost", "{body}");
    }
    let (_, event) = get_json(&node.url("/v1/tenants/jobs/events/e1")).await;
    assert_eq!(event["status"], "delivered", "{event}");
    assert_eq!(event["attempts"], 2, "{event}");
    let (_, attempts) = get_json(&node.url("/v1/tenants/jobs/events/e1/attempts")).await;
    assert!(attempts.to_string().contains("lease_expired"), "{attempts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_complete_fail_or_release_answers_the_same_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path()).await;
    pull_tenant(&node, "jobs").await;
    let ids = ["done", "given-back", "retried", "failed"].map(String::from);
    schedule(&node, "jobs", &ids, now_ms()).await;
    let base = node.base_url();
    let mut leases = HashMap::new();
    for _ in 0..ids.len() {
        let lease = claim_one(&base, "jobs", "a", 30000).await;
        leases.insert(lease["event"]["id"].as_str().unwrap().to_string(), lease);
    }
    let done = &leases["done"];
    assert_eq!(lease_call(&base, done, "complete").await.0, 200);
    // Each ending call with its body and its first answer.
    let mut ended = Vec::new();
    for (event, what, body) in [
        ("given-back", "release", json!({ "delay_ms": 3_600_000 })),
        (
            "retried",
            "fail",
            json!({ "error": { "code": "busy" }, "retry_after_ms": 3_600_000 }),
        ),
        (
            "failed",
            "fail",
            json!({ "error": { "code": "bad_input" }, "permanent": true }),
        ),
    ] {
        let id = leases[event]["lease_id"].as_str().unwrap().to_string();
        let path = format!("/v1/leases/{id}/{what}");
        let (status, first) = call(&base, &path, &body).await.unwrap();
        assert_eq!(status, 200, "{event}: {first}");
        ended.push((event, path, body, first));
    }

    // The worker never read those answers (say): it repeats its calls
    // after the node restarted.
    node.kill_9();
    node.restart().await.expect("restart after kill -9");
    let base = node.base_url();
    let (status, body) = lease_call(&base, done, "complete").await;
    assert_eq!(status, 200, "a repeat answers the same: {body}");
    assert_eq!(body["state"], "delivered");
    for (event, path, body, first) in &ended {
        let (status, again) = call(&base, path, body).await.unwrap();
        assert_eq!((status, &again), (200, first), "{event}");
    }
    let (_, failed) = get_json(&node.url("/v1/tenants/jobs/events/failed")).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    // Any other call on them is lease_lost.
    let given_back = &leases["given-back"];
    for (lease, what) in [
        (done, "heartbeat"),
        (done, "release"),
        (done, "fail"),
        (given_back, "complete"),
        (given_back, "fail"),
        (&leases["retried"], "complete"),
        (&leases["failed"], "release"),
    ] {
        let (status, body) = lease_call(&base, lease, what).await;
        assert_eq!(status, 409, "{what}: {body}");
        assert_eq!(body["error"]["code"], "lease_lost", "{body}");
    }
}

/// A worker holds a lease when its node is killed: after the restart the
/// lease is void (the worker's calls answer `lease_lost`), and the event
/// is leased again only once that lease's time is up, its expiry counted
/// as a failed attempt (`lease_expired` in the history): the next lease
/// carries attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_by_a_kill_9_counts_as_an_expired_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path()).await;
    pull_tenant(&node, "jobs").await;
    schedule(&node, "jobs", &["e1".to_string()], now_ms()).await;
    let first = claim_one(&node.base_url(), "jobs", "a", 3_000).await;
    assert_eq!(first["attempt"], 1, "{first}");

    node.kill_9();
    node.restart().await.expect("restart after kill -9");
    let base = node.base_url();
    let (status, body) = lease_call(&base, &first, "heartbeat").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lease_lost", "{body}");

    let again = claim_one(&base, "jobs", "b", 30_000).await;
    assert_eq!(again["event"]["id"], "e1", "{again}");
    assert_eq!(again["attempt"], 2, "the orphan's expiry counted: {again}");
    assert!(
        instant(&again["leased_at"]) >= instant(&first["lease_expires_at"]),
        "leased again before the first lease ran out: {first} {again}"
    );
    let (_, attempts) = get_json(&node.url("/v1/tenants/jobs/events/e1/attempts")).await;
    let history = attempts["attempts"].as_array().expect("a history");
    assert_eq!(history.len(), 1, "{attempts}");
    assert!(
        history[0].to_string().contains("lease_expired"),
        "{attempts}"
    );
    let (status, body) = lease_call(&base, &again, "complete").await;
    assert_eq!(status, 200, "{body}");
    let (_, event) = get_json(&node.url("/v1/tenants/jobs/events/e1")).await;
    assert_eq!(event["status"], "delivered", "{event}");
    assert_eq!(event["attempts"], 2, "{event}");
}

/// A clean stop (SIGTERM) gives the workers' leases back instead: void
/// for their calls after the restart, the event is leased again once the
/// lease's time is up, with the same attempt number and nothing in its
/// history (the node ended the lease, not its worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_through_a_clean_restart_is_given_back_without_an_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path()).await;
    pull_tenant(&node, "jobs").await;
    schedule(&node, "jobs", &["e1".to_string()], now_ms()).await;
    let first = claim_one(&node.base_url(), "jobs", "a", 3_000).await;

    let status = node.terminate().await.expect("the node exits");
    assert!(status.success(), "{status:?}");
    node.restart().await.expect("restart after SIGTERM");
    let base = node.base_url();
    let (status, body) = lease_call(&base, &first, "complete").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lease_lost", "{body}");

    let again = claim_one(&base, "jobs", "b", 30_000).await;
    assert_eq!(again["event"]["id"], "e1", "{again}");
    assert_eq!(again["attempt"], 1, "no attempt counted: {again}");
    assert!(
        instant(&again["leased_at"]) >= instant(&first["lease_expires_at"]),
        "leased again before the first lease ran out: {first} {again}"
    );
    let (_, attempts) = get_json(&node.url("/v1/tenants/jobs/events/e1/attempts")).await;
    assert_eq!(attempts["attempts"], json!([]), "{attempts}");
}

/// With `max_attempts: 1`, the expiry of a lease left by a kill -9 is the
/// last attempt: the event ends `failed` and is never leased again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_by_a_kill_9_as_the_last_attempt_fails_the_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path()).await;
    pull_tenant_with(&node, "jobs", json!({ "type": "pull", "max_attempts": 1 })).await;
    schedule(&node, "jobs", &["e1".to_string()], now_ms()).await;
    let first = claim_one(&node.base_url(), "jobs", "a", 2_000).await;
    assert_eq!(
        (&first["attempt"], &first["max_attempts"]),
        (&json!(1), &json!(1))
    );

    node.kill_9();
    node.restart().await.expect("restart after kill -9");
    let base = node.base_url();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let event = loop {
        // Workers keep claiming; none is given the event again.
        let (status, claimed) = call(
            &base,
            "/v1/tenants/jobs/leases",
            &claim_body("b", 10, 30_000),
        )
        .await
        .expect("the node answers");
        assert_eq!(status, 200, "{claimed}");
        assert_eq!(claimed["leases"], json!([]), "leased again: {claimed}");
        let (_, event) = get_json(&node.url("/v1/tenants/jobs/events/e1")).await;
        if event["status"] != "scheduled" {
            break event;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ended: {event}"
        );
    };
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(event["attempts"], 1, "{event}");
    let reason = event["last_error"].as_str().unwrap_or("");
    assert!(
        reason.contains("max_attempts") && reason.contains("lease_expired"),
        "{event}"
    );
    assert!(
        instant(&event["finished_at"]) >= instant(&first["lease_expires_at"]),
        "failed before its lease ran out: {event} {first}"
    );
    let (_, attempts) = get_json(&node.url("/v1/tenants/jobs/events/e1/attempts")).await;
    assert!(attempts.to_string().contains("lease_expired"), "{attempts}");
}

/// One answer a worker got: `None` when the node did not answer.
#[derive(Debug, Clone)]
struct Answered {
    event: String,
    lease: String,
    call: &'static str,
    answer: Option<(u16, String)>,
}

/// Events whose id ends in these are failed permanently by the workers.
fn is_bad(id: &str) -> bool {
    id.ends_with("7")
}

/// A worker: claims batches, heartbeats and ends each lease (complete, or
/// a permanent failure for [`is_bad`] events), recording every answer,
/// until `stop`. A call the node did not answer is repeated until it is.
async fn worker(
    base: String,
    worker: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
    answers: Arc<Mutex<Vec<Answered>>>,
) {
    use std::sync::atomic::Ordering;
    let name = format!("w{worker}");
    while !stop.load(Ordering::SeqCst) {
        let claimed = call(
            &base,
            "/v1/tenants/crash/leases",
            &claim_body(&name, 20, 3000),
        )
        .await;
        let leases = match claimed {
            Some((200, body)) => body["leases"].as_array().unwrap().clone(),
            Some((503, _)) | None => {
                // Killed or restarting: try again shortly.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Some((status, body)) => panic!("claim: {status} {body}"),
        };
        for lease in leases {
            let event = lease["event"]["id"].as_str().unwrap().to_string();
            let id = lease["lease_id"].as_str().unwrap().to_string();
            // Repeats a call the node did not answer (killed, restarting),
            // as a real worker would; records every answer.
            let ask = async |call_name: &'static str, body: &Value| {
                loop {
                    let answer = call(&base, &format!("/v1/leases/{id}/{call_name}"), body).await;
                    answers.lock().unwrap().push(Answered {
                        event: event.clone(),
                        lease: id.clone(),
                        call: call_name,
                        answer: answer.as_ref().map(|(s, b)| {
                            (*s, b["error"]["code"].as_str().unwrap_or("").to_string())
                        }),
                    });
                    match answer {
                        Some(answer) => return Some(answer),
                        None if stop.load(Ordering::SeqCst) => return None,
                        None => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            };
            let beat = ask("heartbeat", &json!({})).await;
            if !matches!(beat, Some((200, ref body)) if body["cancel_requested"] == false) {
                continue;
            }
            // The work.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let (what, body) = if is_bad(&event) {
                (
                    "fail",
                    json!({ "error": { "code": "bad_input" }, "permanent": true }),
                )
            } else {
                ("complete", json!({ "result": { "by": name } }))
            };
            ask(what, &body).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_node_while_workers_hold_leases_ends_every_event_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path()).await;
    pull_tenant(&node, "crash").await;
    let total = 2_000;
    let ids: Vec<String> = (0..total).map(|i| format!("e{i}")).collect();
    schedule(&node, "crash", &ids, now_ms()).await;

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..8)
        .map(|w| tokio::spawn(worker(node.base_url(), w, stop.clone(), answers.clone())))
        .collect();
    // Kill once a fair share is done, while the workers hold leases.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while answers.lock().unwrap().len() < total / 2 {
        assert!(tokio::time::Instant::now() < deadline, "workers stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.kill_9();
    node.restart().await.expect("restart after kill -9");

    let deadline = tokio::time::Instant::now() + DEADLINE;
    let (delivered, failed) = loop {
        let delivered = ids_with_status(&node, "crash", "delivered").await;
        let failed = ids_with_status(&node, "crash", "failed").await;
        if delivered.len() + failed.len() == total || tokio::time::Instant::now() >= deadline {
            break (delivered, failed);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(
        delivered.len() + failed.len(),
        total,
        "every event ends delivered or failed; {} delivered, {} failed\n{}",
        delivered.len(),
        failed.len(),
        node.logs_tail(40)
    );
    for event in &failed {
        let id = event["id"].as_str().unwrap();
        assert!(is_bad(id), "only bad events fail: {event}");
        assert!(
            event["last_error"]
                .as_str()
                .unwrap_or("")
                .contains("bad_input"),
            "the reason is recorded: {event}"
        );
    }
    let bad = ids.iter().filter(|id| is_bad(id)).count();
    assert_eq!(failed.len(), bad);

    // No event was ended by two leases: a second worker only ever ran an
    // event whose first lease was lost (409) or unanswered (the kill).
    let answers = answers.lock().unwrap().clone();
    let mut ended: HashMap<&str, HashSet<&str>> = HashMap::new();
    for a in &answers {
        if matches!(a.call, "complete" | "fail") && matches!(a.answer, Some((200, _))) {
            ended.entry(&a.event).or_default().insert(&a.lease);
        }
        if let Some((status, code)) = &a.answer {
            assert!(
                *status == 200 || (*status == 409 && code == "lease_lost") || *status == 503,
                "unexpected answer {a:?}"
            );
        }
    }
    let twice: Vec<_> = ended
        .iter()
        .filter(|(_, leases)| leases.len() > 1)
        .collect();
    assert!(twice.is_empty(), "ended by two leases: {twice:?}");
    // A call is repeated until answered, and a repeated complete (or
    // fail) answers the same after the restart: every delivered event was
    // completed with a 200.
    let completed: HashSet<&str> = answers
        .iter()
        .filter(|a| a.call == "complete" && matches!(a.answer, Some((200, _))))
        .map(|a| a.event.as_str())
        .collect();
    let delivered_ids: HashSet<&str> = delivered
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(completed, delivered_ids, "delivered events without a 200");
    // Every other lease of an event was told it was lost.
    let mut lost_leases = HashSet::new();
    for a in &answers {
        if matches!(&a.answer, Some((409, code)) if code == "lease_lost") {
            lost_leases.insert(a.lease.as_str());
        }
    }
    for a in &answers {
        let unanswered_fail = a.call == "fail" && a.answer.is_none();
        let ending = unanswered_fail
            || ended
                .get(a.event.as_str())
                .is_some_and(|l| l.contains(a.lease.as_str()));
        assert!(
            ending || lost_leases.contains(a.lease.as_str()),
            "a lease neither ended its event nor was lost: {a:?}"
        );
    }
    let lost = answers
        .iter()
        .filter(|a| matches!(a.answer, Some((409, _))))
        .count();
    let unanswered = answers.iter().filter(|a| a.answer.is_none()).count();
    eprintln!(
        "{} answers, {lost} lease_lost, {unanswered} unanswered (the kill), {} events ended with a 200",
        answers.len(),
        ended.len()
    );
}
