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
