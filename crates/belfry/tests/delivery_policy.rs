//! Delivery policy end to end (`docs/api.md`, delivery policy): a real
//! `belfry serve` process and a real receiver. An event's own attempt cap
//! and back-off, its tenant's defaults, its expiry, and the receiver's
//! `Retry-After` (seconds and HTTP date) and `410 Gone`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::{Duration, Instant};

use belfry_testkit::{
    BelfryLaunch, BelfryProcess, Receiver, RecordedRequest, Response, get_json, put_json,
};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339};

/// Generous bound for anything the node must finish.
const DEADLINE: Duration = Duration::from_secs(60);

/// How late an attempt may come after the instant it is due: the timer's
/// wake-up, the dispatch and the request on a loaded test machine.
const LATE: Duration = Duration::from_millis(250);

/// How much later than a receiver's `Retry-After` asked its next attempt
/// may come (the bound).
const RETRY_AFTER_SLACK: Duration = Duration::from_millis(50);

async fn start_node(dir: &std::path::Path) -> BelfryProcess {
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn register(node: &BelfryProcess, tenant: &str, sink: Value) {
    let (status, body) = put_json(
        &node.url(&format!("/v1/tenants/{tenant}")),
        &json!({ "sink": sink }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// Schedules `id` of `tenant` 300 ms from now, with `extra` fields.
async fn schedule(node: &BelfryProcess, tenant: &str, id: &str, extra: Value) -> i64 {
    let at = now_ms() + 300;
    let mut body = json!({ "deliver_at": rfc3339(at), "payload": id });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let (status, answer) = put_json(
        &node.url(&format!("/v1/tenants/{tenant}/events/{id}")),
        &body,
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    at
}

/// The event once its status is terminal.
async fn finished(node: &BelfryProcess, tenant: &str, id: &str) -> Value {
    let started = Instant::now();
    loop {
        let (status, event) =
            get_json(&node.url(&format!("/v1/tenants/{tenant}/events/{id}"))).await;
        assert_eq!(status, 200, "{event}");
        if event["finished_at"].is_string() {
            return event;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{tenant}/{id} not finished: {event}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The requests the receiver got for event `id`.
fn attempts_of(receiver: &Receiver, id: &str) -> Vec<RecordedRequest> {
    receiver
        .requests()
        .into_iter()
        .filter(|r| r.header("x-belfry-event-id") == Some(id))
        .collect()
}

/// The gap between two arrivals.
fn gap(earlier: &RecordedRequest, later: &RecordedRequest) -> Duration {
    later.arrived_at.duration_since(earlier.arrived_at)
}

#[tokio::test]
async fn an_events_attempt_cap_and_back_off_and_its_tenants_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.set_default_status(500);
    let mut node = start_node(dir.path()).await;
    let backoff = json!({ "initial_delay_ms": 100, "multiplier": 1.0, "max_delay_ms": 100 });
    register(
        &node,
        "own",
        json!({ "type": "http", "url": receiver.url("/own") }),
    )
    .await;
    register(
        &node,
        "defaults",
        json!({ "type": "http", "url": receiver.url("/defaults"),
                "max_attempts": 2, "backoff": backoff }),
    )
    .await;
    schedule(
        &node,
        "own",
        "capped",
        json!({ "max_attempts": 2, "backoff": backoff }),
    )
    .await;
    schedule(&node, "defaults", "plain", json!({})).await;

    for (tenant, id) in [("own", "capped"), ("defaults", "plain")] {
        let event = finished(&node, tenant, id).await;
        assert_eq!(event["status"], "failed", "{event}");
        assert_eq!(event["attempts"], 2, "{event}");
        assert!(
            event["last_error"]
                .as_str()
                .unwrap()
                .starts_with("gave up after 2 attempts (max_attempts reached): HTTP 500"),
            "{event}"
        );
        let attempts = attempts_of(&receiver, id);
        assert_eq!(attempts.len(), 2, "exactly two attempts of {id}");
        let apart = gap(&attempts[0], &attempts[1]);
        assert!(
            apart >= Duration::from_millis(100) && apart <= Duration::from_millis(100) + LATE,
            "{id}: attempts {apart:?} apart"
        );
    }
    node.terminate().await;
}

#[tokio::test]
async fn an_event_whose_expiry_passes_under_503s_ends_expired_without_a_late_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.set_default_status(503);
    let mut node = start_node(dir.path()).await;
    register(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    let backoff = json!({ "initial_delay_ms": 400, "multiplier": 1.0, "max_delay_ms": 400 });
    let expire_at = now_ms() + 300 + 1_500;
    schedule(
        &node,
        "acme",
        "stale",
        json!({ "backoff": backoff, "expire_at": rfc3339(expire_at) }),
    )
    .await;

    let event = finished(&node, "acme", "stale").await;
    assert_eq!(event["status"], "expired", "{event}");
    assert!(
        event["last_error"]
            .as_str()
            .unwrap()
            .starts_with("expired: not delivered by its expiry at"),
        "{event}"
    );
    let finished_at = belfry_core::Timestamp::parse_rfc3339(event["finished_at"].as_str().unwrap())
        .unwrap()
        .as_millis();
    assert!(
        finished_at >= expire_at,
        "ended at {finished_at}, before its expiry"
    );
    let attempts = attempts_of(&receiver, "stale");
    assert!(attempts.len() >= 3, "it was retried: {}", attempts.len());
    for attempt in &attempts {
        assert!(
            attempt.arrived_at_ms < expire_at,
            "an attempt at {} came after the expiry {expire_at}",
            attempt.arrived_at_ms
        );
    }
    assert_eq!(event["attempts"], attempts.len(), "{event}");
    node.terminate().await;
}

/// `ms` as an HTTP date (IMF-fixdate), truncated to the second.
fn http_date(ms: i64) -> String {
    let at = jiff::Timestamp::from_millisecond(ms).unwrap();
    at.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

#[tokio::test]
async fn retry_after_in_seconds_or_as_a_date_sets_the_next_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    // Each event's first attempt is refused with a `Retry-After`, the next
    // is accepted.
    // The values: 20 s, and a date about as far ahead.
    let date_ms = (now_ms() + 20_000).div_euclid(1_000) * 1_000 + 1_000;
    let date = http_date(date_ms);
    receiver.set_responder(move |request| {
        let first = request.header("x-belfry-attempt") == Some("1");
        match (request.path.as_str(), first) {
            ("/seconds", true) => Response::status(429).with_header("Retry-After", "20"),
            ("/date", true) => Response::status(503).with_header("Retry-After", date.as_str()),
            _ => Response::status(200),
        }
    });
    let mut node = start_node(dir.path()).await;
    register(
        &node,
        "seconds",
        json!({ "type": "http", "url": receiver.url("/seconds") }),
    )
    .await;
    register(
        &node,
        "date",
        json!({ "type": "http", "url": receiver.url("/date") }),
    )
    .await;
    schedule(&node, "seconds", "slow-down", json!({})).await;
    schedule(&node, "date", "come-back", json!({})).await;

    let event = finished(&node, "seconds", "slow-down").await;
    assert_eq!(event["status"], "delivered", "{event}");
    let attempts = attempts_of(&receiver, "slow-down");
    assert_eq!(attempts.len(), 2);
    let apart = gap(&attempts[0], &attempts[1]);
    assert!(
        apart >= Duration::from_secs(20) && apart <= Duration::from_secs(20) + RETRY_AFTER_SLACK,
        "Retry-After: 20 gave a next attempt {apart:?} later"
    );

    let event = finished(&node, "date", "come-back").await;
    assert_eq!(event["status"], "delivered", "{event}");
    let attempts = attempts_of(&receiver, "come-back");
    assert_eq!(attempts.len(), 2);
    let second = attempts[1].arrived_at_ms;
    assert!(
        second >= date_ms && second <= date_ms + RETRY_AFTER_SLACK.as_millis() as i64,
        "Retry-After at {date_ms} gave a next attempt at {second}"
    );
    node.terminate().await;
}

#[tokio::test]
async fn a_410_gone_ends_the_event_and_pauses_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.set_default_status(410);
    let mut node = start_node(dir.path()).await;
    register(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/gone") }),
    )
    .await;
    schedule(&node, "acme", "orphan", json!({})).await;
    let event = finished(&node, "acme", "orphan").await;
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(event["attempts"], 1, "{event}");
    assert_eq!(event["last_error"], "HTTP 410 Gone", "{event}");
    assert_eq!(attempts_of(&receiver, "orphan").len(), 1);
    // The pause is stored right after the failure is recorded.
    let started = Instant::now();
    let view = loop {
        let (status, view) = get_json(&node.url("/v1/tenants/acme")).await;
        assert_eq!(status, 200, "{view}");
        if view["pause"]["paused"] == true {
            break view;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the tenant was not paused: {view}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        view["pause"]["reason"], "the receiver answered 410 Gone",
        "{view}"
    );
    node.terminate().await;
}

#[tokio::test]
async fn a_pull_event_whose_expiry_passes_unclaimed_ends_expired_and_is_never_granted() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path()).await;
    register(&node, "workers", json!({ "type": "pull" })).await;
    let expiry = now_ms() + 800;
    schedule(
        &node,
        "workers",
        "lapsing",
        json!({ "expire_at": rfc3339(expiry) }),
    )
    .await;
    // Nobody claims: it waits in the ready queue until its expiry.
    let event = finished(&node, "workers", "lapsing").await;
    assert_eq!(event["status"], "expired", "{event}");
    assert_eq!(event["attempts"], 0, "{event}");
    let finished_at = belfry_core::Timestamp::parse_rfc3339(event["finished_at"].as_str().unwrap())
        .unwrap()
        .as_millis();
    assert!(finished_at >= expiry, "ended before its expiry: {event}");
    let (status, answer) = belfry_testkit::post_json(
        &node.url("/v1/tenants/workers/leases"),
        &json!({ "worker_id": "w1", "max_events": 10, "lease_ms": 30000, "wait_ms": 0 }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["leases"], json!([]), "never granted: {answer}");
    node.terminate().await;
}
