//! Conditional edits end to end (`docs/api.md`, "Conditional edits"): a
//! real `belfry serve` process and a real receiver. `ETag` and `If-Match`
//! on an event's `PUT` and cancel, and the `previous_delivery` a cancel or
//! a move answers.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, Response, Rule, http_client};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

/// Generous bound for anything the node must finish.
const DEADLINE: Duration = Duration::from_secs(60);

async fn start_node(dir: &std::path::Path) -> BelfryProcess {
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    BelfryProcess::start(launch).await.expect("belfry starts")
}

/// An answer: status, `ETag` and JSON body.
struct Answer {
    status: u16,
    etag: Option<String>,
    body: Value,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { status, etag, body }
}

/// `PUT` of the event with `body`, and `If-Match` when given.
async fn put(url: &str, body: &Value, if_match: Option<&str>) -> Answer {
    let mut request = http_client().put(url).json(body);
    if let Some(tag) = if_match {
        request = request.header("if-match", tag);
    }
    send(request).await
}

async fn cancel(url: &str, if_match: Option<&str>) -> Answer {
    let mut request = http_client().delete(url);
    if let Some(tag) = if_match {
        request = request.header("if-match", tag);
    }
    send(request).await
}

/// Registers tenant `name` with `sink` on `node`.
async fn register(node: &BelfryProcess, name: &str, sink: Value) {
    let url = node.url(&format!("/v1/tenants/{name}"));
    let tenant = put(&url, &json!({ "sink": sink }), None).await;
    assert_eq!(tenant.status, 201, "{}", tenant.body);
}

async fn get(url: &str) -> Answer {
    send(http_client().get(url)).await
}

/// The event once `done` holds for it.
async fn wait_for(url: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let answer = get(url).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        if done(&answer.body) {
            return answer.body;
        }
        assert!(started.elapsed() < DEADLINE, "not {what}: {}", answer.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn quoted(version: &Value) -> String {
    format!("\"{}\"", version.as_str().expect("a version"))
}

#[tokio::test]
async fn a_stale_if_match_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path()).await;
    register(
        &node,
        "acme",
        json!({"type": "http", "url": receiver.url("/hook")}),
    )
    .await;
    let url = node.url("/v1/tenants/acme/events/e1");
    let far = now_ms() + 600_000;

    let created = put(&url, &json!({"deliver_at": rfc3339(far)}), None).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let v1 = quoted(&created.body["version"]);
    assert_eq!(created.etag.as_deref(), Some(v1.as_str()));
    assert!(created.body.get("previous_delivery").is_none(), "a create");
    let read = get(&url).await;
    assert_eq!(read.etag.as_deref(), Some(v1.as_str()));

    // A stale version: neither a move nor a cancel changes anything.
    let moved_elsewhere = json!({"deliver_at": rfc3339(far + 1_000), "payload": "x"});
    let stale = put(&url, &moved_elsewhere, Some("\"not-the-version\"")).await;
    assert_eq!(stale.status, 412, "{}", stale.body);
    assert_eq!(stale.body["error"]["code"], "precondition_failed");
    let stale = cancel(&url, Some("\"not-the-version\"")).await;
    assert_eq!(stale.status, 412, "{}", stale.body);
    let after = get(&url).await.body;
    assert_eq!(after, read.body, "nothing changed");

    // The current version: the move applies; its delivery had not started.
    let moved = put(&url, &moved_elsewhere, Some(&v1)).await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(moved.body["previous_delivery"], "not_started");
    let v2 = quoted(&moved.body["version"]);
    assert_ne!(v1, v2);
    assert_eq!(moved.etag.as_deref(), Some(v2.as_str()));
    // The version read before is stale now (unquoted works too): another
    // write under it is refused, the same one again is the write that
    // was applied (see the retry test below).
    let elsewhere_again = json!({"deliver_at": rfc3339(far + 2_000), "payload": "x"});
    let again = put(&url, &elsewhere_again, Some(v1.trim_matches('"'))).await;
    assert_eq!(again.status, 412, "{}", again.body);
    let repeated = put(&url, &moved_elsewhere, Some(v1.trim_matches('"'))).await;
    assert_eq!(repeated.status, 200, "{}", repeated.body);
    assert_eq!(repeated.etag.as_deref(), Some(v2.as_str()));
    // A same-instant update keeps the version and has nothing to report.
    let same_instant = json!({"deliver_at": rfc3339(far + 1_000)});
    let same = put(&url, &same_instant, Some(&v2)).await;
    assert_eq!(same.status, 200, "{}", same.body);
    assert_eq!(same.etag.as_deref(), Some(v2.as_str()));
    assert!(
        same.body.get("previous_delivery").is_none(),
        "{}",
        same.body
    );

    // `*`: the event must exist; an unknown one is not created.
    let unknown_url = node.url("/v1/tenants/acme/events/unknown");
    let unknown = put(
        &unknown_url,
        &json!({"deliver_at": rfc3339(far)}),
        Some("*"),
    )
    .await;
    assert_eq!(unknown.status, 412, "{}", unknown.body);
    assert_eq!(get(&unknown_url).await.status, 404);
    // A weak tag never matches; a list holds when one of its tags does.
    let weak = put(&url, &moved_elsewhere, Some(&format!("W/{v2}"))).await;
    assert_eq!(weak.status, 412, "{}", weak.body);
    let list = put(&url, &same_instant, Some(&format!("\"x\", {v2}"))).await;
    assert_eq!(list.status, 200, "{}", list.body);

    let cancelled = cancel(&url, Some("*")).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["status"], "cancelled");
    assert_eq!(cancelled.body["previous_delivery"], "not_started");
    assert_eq!(receiver.count(), 0);
}

#[tokio::test]
async fn cancel_and_move_answers_tell_whether_delivery_started() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    // The first attempt fails: the event is retrying, an attempt recorded.
    receiver.push_rule(Rule::first(1, Response::status(503)));
    let node = start_node(dir.path()).await;
    register(
        &node,
        "acme",
        json!({"type": "http", "url": receiver.url("/hook")}),
    )
    .await;
    let url = node.url("/v1/tenants/acme/events/e1");
    // Its retry a minute later: the test moves it first.
    let slow_retry = json!({"initial_delay_ms": 60_000, "max_delay_ms": 60_000});
    let created = put(
        &url,
        &json!({"deliver_at": rfc3339(now_ms() + 200), "backoff": slow_retry}),
        None,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let retrying = wait_for(&url, "retrying", |e| e["status"] == "retrying").await;
    let moved = put(
        &url,
        &json!({"deliver_at": rfc3339(now_ms() + 200)}),
        Some(&quoted(&retrying["version"])),
    )
    .await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(moved.body["previous_delivery"], "started");

    // The new version is delivered (the receiver answers 200 now); moving
    // it again reports its delivery finished, and it is sent again.
    let delivered = wait_for(&url, "delivered", |e| e["status"] == "delivered").await;
    assert_eq!(delivered["version"], moved.body["version"]);
    let again = put(
        &url,
        &json!({"deliver_at": rfc3339(now_ms() + 600_000)}),
        Some(&quoted(&delivered["version"])),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["previous_delivery"], "finished");
    let cancelled = cancel(&url, Some(&quoted(&again.body["version"]))).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["previous_delivery"], "not_started");
    assert_eq!(receiver.count(), 2, "the failed attempt and the delivery");
}

/// An attempt in flight (the receiver holds the request) is not recorded
/// yet: the answer still says the delivery started. Cancelled or moved
/// before it fires, a version never reaches the receiver.
#[tokio::test]
async fn an_attempt_in_flight_counts_as_started() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    // Every answer takes 3 s: long enough to edit during the attempt.
    receiver.set_default(Response::status(200).with_delay(Duration::from_secs(3)));
    let node = start_node(dir.path()).await;
    register(
        &node,
        "acme",
        json!({"type": "http", "url": receiver.url("/hook")}),
    )
    .await;

    for (id, edit) in [("cancelled", "cancel"), ("moved", "move")] {
        let url = node.url(&format!("/v1/tenants/acme/events/{id}"));
        let sent_before = receiver.count();
        let created = put(&url, &json!({"deliver_at": rfc3339(now_ms() + 100)}), None).await;
        assert_eq!(created.status, 201, "{}", created.body);
        receiver
            .wait_for_count(sent_before + 1, DEADLINE)
            .await
            .expect("the attempt reaches the receiver");
        let answer = match edit {
            "cancel" => cancel(&url, None).await,
            _ => {
                let later = json!({"deliver_at": rfc3339(now_ms() + 600_000)});
                put(&url, &later, None).await
            }
        };
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            answer.body["previous_delivery"], "started",
            "{edit} during the attempt: {}",
            answer.body
        );
    }

    // Not yet fired: not started, and never sent (a marker due after it
    // arrives, and it did not).
    let url = node.url("/v1/tenants/acme/events/early");
    let due = now_ms() + 1_000;
    let created = put(&url, &json!({"deliver_at": rfc3339(due)}), None).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let cancelled = cancel(&url, None).await;
    assert_eq!(cancelled.body["previous_delivery"], "not_started");
    let marker = node.url("/v1/tenants/acme/events/marker");
    let created = put(&marker, &json!({"deliver_at": rfc3339(due + 100)}), None).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let ids: Vec<String> = receiver
        .wait_for_count(3, DEADLINE)
        .await
        .expect("the marker arrives")
        .iter()
        .map(|r| r.header("x-belfry-event-id").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        ids,
        ["cancelled", "moved", "marker"],
        "what reached the receiver"
    );
}

/// A pull tenant's version has started once a worker holds its lease;
/// one that is only ready in the queue has not, and no worker gets it
/// after the cancel.
#[tokio::test]
async fn a_pull_lease_counts_as_started_a_ready_entry_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path()).await;
    register(&node, "jobs", json!({"type": "pull"})).await;
    let due = rfc3339(now_ms());
    for id in ["leased", "ready"] {
        let url = node.url(&format!("/v1/tenants/jobs/events/{id}"));
        let created = put(&url, &json!({"deliver_at": due}), None).await;
        assert_eq!(created.status, 201, "{}", created.body);
    }
    let claim = json!({"worker_id": "w", "max_events": 1, "wait_ms": 5_000, "lease_ms": 60_000});
    let claimed = send(
        http_client()
            .post(node.url("/v1/tenants/jobs/leases"))
            .json(&claim),
    )
    .await;
    assert_eq!(claimed.status, 200, "{}", claimed.body);
    let leased = claimed.body["leases"][0]["event"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ready = if leased == "leased" {
        "ready"
    } else {
        "leased"
    };

    let answer = cancel(
        &node.url(&format!("/v1/tenants/jobs/events/{leased}")),
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body["previous_delivery"], "started",
        "{}",
        answer.body
    );
    let answer = cancel(&node.url(&format!("/v1/tenants/jobs/events/{ready}")), None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body["previous_delivery"], "not_started",
        "{}",
        answer.body
    );
    let claim = json!({"worker_id": "w", "max_events": 10, "wait_ms": 0, "lease_ms": 60_000});
    let again = send(
        http_client()
            .post(node.url("/v1/tenants/jobs/leases"))
            .json(&claim),
    )
    .await;
    assert_eq!(again.body["leases"], json!([]), "{}", again.body);
}

/// A conditional `PUT` sent again (its first answer lost: a reset, a
/// timeout) finds the version its first try made: it succeeds with that
/// version, unchanged, where a different write under the same stale tag
/// is refused.
#[tokio::test]
async fn a_conditional_put_sent_again_after_it_applied_succeeds_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path()).await;
    register(&node, "acme", json!({"type": "pull"})).await;
    let url = node.url("/v1/tenants/acme/events/e1");
    let created = put(
        &url,
        &json!({"deliver_at": rfc3339(now_ms() + 600_000)}),
        None,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let tag = quoted(&created.body["version"]);
    let move_to = json!({"deliver_at": rfc3339(now_ms() + 900_000), "payload": "p"});
    let first = put(&url, &move_to, Some(&tag)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_ne!(first.body["version"], created.body["version"]);

    let again = put(&url, &move_to, Some(&tag)).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["version"], first.body["version"]);
    assert_eq!(again.etag, first.etag);
    let stored = get(&url).await;
    assert_eq!(stored.body["version"], first.body["version"]);
    assert_eq!(
        stored.body["updated_at"], first.body["updated_at"],
        "nothing written"
    );

    let other = json!({"deliver_at": rfc3339(now_ms() + 900_000), "payload": "other"});
    let refused = put(&url, &other, Some(&tag)).await;
    assert_eq!(refused.status, 412, "{}", refused.body);
}
