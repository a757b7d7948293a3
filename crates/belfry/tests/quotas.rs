//! Per-tenant quotas on a real `belfry serve` process, through both APIs:
//! the refusal codes clients rely on (`429 quota_exceeded`, `413
//! payload_too_large`) and that a refused request stores nothing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json, post_json, put_json};
use serde_json::{Value, json};

const TENANT: &str = "acme";
const LATER: &str = "2099-01-01T00:00:00Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_refuse_with_stable_codes_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(
        BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
            .env("BELFRY_LIMITS__MAX_PENDING_EVENTS_PER_TENANT", "3")
            .env("BELFRY_LIMITS__MAX_SCHEDULES_PER_TENANT", "1")
            .env("BELFRY_LIMITS__MAX_PAYLOAD_BYTES", "64"),
    )
    .await
    .expect("belfry starts");
    let (status, body) = post_json(
        &node.url("/events/tenant/register"),
        &json!({"tenant": TENANT, "type": "HTTP", "props": {"url": "http://127.0.0.1:9/hook"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = node.url(&format!("/v1/tenants/{TENANT}/events"));
    let event = |id: &str| node.url(&format!("/v1/tenants/{TENANT}/events/{id}"));

    // Three fit.
    let batch: Vec<Value> = (0..3)
        .map(|i| json!({"id": format!("e{i}"), "deliver_at": LATER, "payload": "p"}))
        .collect();
    let (status, body) = post_json(&events, &json!({ "events": batch })).await;
    assert_eq!(status, 200, "{body}");

    // The fourth, through each API, is refused with the stable code.
    let (status, body) = put_json(&event("e3"), &json!({"deliver_at": LATER})).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let (status, body) = post_json(
        &events,
        &json!({"events": [{"id": "e3", "deliver_at": LATER}]}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let (status, body) = post_json(
        &node.url("/events/schedule"),
        &json!([{"id": "e3", "tenant": TENANT, "eventTime": LATER, "payload": "p"}]),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("pending events"),
        "BigBen's envelope: {body}"
    );
    let (status, _) = get_json(&event("e3")).await;
    assert_eq!(status, 404, "nothing was stored");

    // Moving an event that is pending is no new one.
    let (status, body) = put_json(
        &event("e0"),
        &json!({"deliver_at": "2099-01-02T00:00:00Z", "payload": "moved"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A payload over the limit: 413, whatever the count.
    let big = "x".repeat(65);
    let (status, body) =
        put_json(&event("e0"), &json!({"deliver_at": LATER, "payload": big})).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    let (_, body) = get_json(&event("e0")).await;
    assert_eq!(body["payload"], "moved", "unchanged: {body}");

    // One schedule fits, the second does not.
    let schedule = |id: &str| node.url(&format!("/v1/tenants/{TENANT}/schedules/{id}"));
    let definition = json!({"expression": "@every 1h", "type": "every"});
    let (status, body) = put_json(&schedule("s1"), &definition).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = put_json(&schedule("s2"), &definition).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let (status, body) = put_json(&schedule("s1"), &definition).await;
    assert_eq!(status, 200, "replacing is allowed: {body}");
}
