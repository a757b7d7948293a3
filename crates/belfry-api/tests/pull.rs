//! Pull tenants over the API: their registration (`docs/pull.md`).

mod common;

use axum::http::StatusCode;
use common::Harness;
use serde_json::json;

#[tokio::test]
async fn a_pull_tenant_is_registered_and_shown_in_both_apis() {
    let h = Harness::start().await;
    let created = h
        .put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["sink"], json!({ "type": "pull" }));
    let replaced = h
        .put(
            "/v1/tenants/jobs",
            &json!({ "sink": { "type": "pull", "max_attempts": 3 } }),
        )
        .await;
    assert_eq!(replaced.status, StatusCode::OK, "{replaced:?}");
    assert_eq!(
        h.get("/v1/tenants/jobs").await.body["sink"],
        json!({ "type": "pull", "max_attempts": 3 })
    );
    assert_eq!(
        h.get("/events/tenants").await.body["jobs"],
        json!({ "tenant": "jobs", "type": "PULL", "props": { "max_attempts": 3 } })
    );
    let bigben = h
        .post(
            "/events/tenant/register",
            &json!({ "tenant": "jobs2", "type": "PULL", "props": {} }),
        )
        .await;
    assert_eq!(bigben.status, StatusCode::OK, "{bigben:?}");
    assert_eq!(
        h.get("/v1/tenants/jobs2").await.body["sink"],
        json!({ "type": "pull" })
    );
    h.shutdown().await;
}

#[tokio::test]
async fn bad_pull_tenants_change_nothing() {
    let h = Harness::start().await;
    h.register_log("keep").await;
    let before = h.snapshot(&[]).await;
    for (sink, field) in [
        (json!({ "type": "pull", "max_attempts": 0 }), "max_attempts"),
        (
            json!({ "type": "pull", "max_attempts": 1001 }),
            "max_attempts",
        ),
        (
            json!({ "type": "pull", "max_attempts": "many" }),
            "max_attempts",
        ),
        (json!({ "type": "pull", "url": "http://a/" }), "url"),
        (
            json!({ "type": "http", "url": "http://a/", "max_attempts": 3 }),
            "max_attempts",
        ),
    ] {
        let answer = h.put("/v1/tenants/new", &json!({ "sink": sink })).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(answer.body["error"]["code"], "invalid_sink", "{answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message} names {field}");
    }
    let bigben = h
        .post(
            "/events/tenant/register",
            &json!({ "tenant": "new", "type": "PULL", "props": { "topic": "x" } }),
        )
        .await;
    assert_eq!(bigben.status, StatusCode::BAD_REQUEST, "{bigben:?}");
    assert_eq!(h.snapshot(&["new"]).await, before);
    h.shutdown().await;
}

/// Claims one lease of `tenant`, long-polling up to the test deadline.
async fn claim_one(h: &Harness, tenant: &str) -> serde_json::Value {
    let answer = h
        .post(
            &format!("/v1/tenants/{tenant}/leases"),
            &json!({ "worker_id": "w-1", "wait_ms": 20000, "lease_ms": 30000 }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let leases = answer.body["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{answer:?}");
    leases[0].clone()
}

#[tokio::test]
async fn a_due_event_is_claimed_completed_once_and_its_lease_then_lost() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let put = h
        .put(
            "/v1/tenants/jobs/events/e1",
            &json!({ "deliver_at": common::from_now(200), "payload": "work" }),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let lease = claim_one(&h, "jobs").await;
    assert_eq!(lease["event"]["id"], "e1");
    assert_eq!(lease["event"]["payload"], "work");
    assert_eq!(lease["attempt"], 1);
    assert_eq!(lease["max_attempts"], 20);
    assert_eq!(lease["heartbeat_interval_ms"], 10000);
    let id = lease["lease_id"].as_str().unwrap();
    let beat = h
        .post(
            &format!("/v1/leases/{id}/heartbeat"),
            &json!({ "extend_ms": 60000 }),
        )
        .await;
    assert_eq!(beat.status, StatusCode::OK, "{beat:?}");
    assert_eq!(beat.body["cancel_requested"], false);
    let bad = h
        .post(
            &format!("/v1/leases/{id}/fail"),
            &json!({ "error": { "code": "" } }),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    let done = h
        .post(
            &format!("/v1/leases/{id}/complete"),
            &json!({ "result": { "ok": true } }),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let again = h
        .post(&format!("/v1/leases/{id}/complete"), &json!({}))
        .await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "a repeat answers the same: {again:?}"
    );
    let beat = h
        .post(&format!("/v1/leases/{id}/heartbeat"), &json!({}))
        .await;
    assert_eq!(beat.status, StatusCode::CONFLICT, "{beat:?}");
    assert_eq!(beat.body["error"]["code"], "lease_lost");
    let event = h.get("/v1/tenants/jobs/events/e1").await;
    assert_eq!(event.body["status"], "delivered", "{event:?}");
    let garbage = h.post("/v1/leases/not-a-lease/complete", &json!({})).await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST, "{garbage:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn a_retriable_failure_offers_the_event_again_with_the_next_attempt() {
    let h = Harness::start().await;
    h.put(
        "/v1/tenants/jobs",
        &json!({ "sink": { "type": "pull", "max_attempts": 2 } }),
    )
    .await;
    h.put(
        "/v1/tenants/jobs/events/e1",
        &json!({ "deliver_at": common::from_now(100) }),
    )
    .await;
    let first = claim_one(&h, "jobs").await;
    let id = first["lease_id"].as_str().unwrap();
    let failed = h
        .post(
            &format!("/v1/leases/{id}/fail"),
            &json!({ "error": { "code": "boom", "message": "try again" }, "retry_after_ms": 200 }),
        )
        .await;
    assert_eq!(failed.status, StatusCode::OK, "{failed:?}");
    assert_eq!(failed.body["state"], "scheduled");
    let second = claim_one(&h, "jobs").await;
    assert_eq!(second["attempt"], 2);
    let id = second["lease_id"].as_str().unwrap();
    let failed = h
        .post(
            &format!("/v1/leases/{id}/fail"),
            &json!({ "error": { "code": "boom" } }),
        )
        .await;
    assert_eq!(failed.status, StatusCode::OK, "{failed:?}");
    assert_eq!(
        failed.body["state"], "failed",
        "attempts are capped: {failed:?}"
    );
    let event = h.get("/v1/tenants/jobs/events/e1").await;
    assert_eq!(event.body["status"], "failed", "{event:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn claims_of_a_push_tenant_or_with_bad_bodies_are_refused() {
    let h = Harness::start().await;
    h.register_log("push").await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let push = h
        .post("/v1/tenants/push/leases", &json!({ "worker_id": "w" }))
        .await;
    assert_eq!(push.status, StatusCode::BAD_REQUEST, "{push:?}");
    for (body, field) in [
        (json!({}), "worker_id"),
        (json!({ "worker_id": "w", "max_events": 101 }), "max_events"),
        (json!({ "worker_id": "w", "wait_ms": 30001 }), "wait_ms"),
        (json!({ "worker_id": "w", "lease_ms": 999 }), "lease_ms"),
    ] {
        let answer = h.post("/v1/tenants/jobs/leases", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message} names {field}");
    }
    let empty = h
        .post("/v1/tenants/jobs/leases", &json!({ "worker_id": "w" }))
        .await;
    assert_eq!(empty.status, StatusCode::OK, "{empty:?}");
    assert_eq!(empty.body, json!({ "leases": [] }));
    h.shutdown().await;
}
