//! What clients see when the store fails: BigBen's per-item `ERROR`, the
//! `/v1` envelope with 503/500, never internal details, and nothing claimed
//! stored that was not.

mod common;

use axum::http::StatusCode;
use belfry_store::StoreError;
use common::{FUTURE, FaultScope, Harness};
use serde_json::{Value, json};

const SECRET: &str = "disk /dev/vdb1 exploded at sector 42";

fn item(id: &str) -> Value {
    json!({ "id": id, "eventTime": FUTURE, "tenant": "acme" })
}

#[tokio::test]
async fn bigben_schedule_marks_every_stored_item_error() {
    let h = Harness::start().await;
    h.register_log("acme").await;

    h.faults
        .set(FaultScope::Apply, StoreError::Unavailable(SECRET.into()));
    let unavailable = h
        .post("/events/schedule", &json!([item("a"), item("b")]))
        .await;
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    for entry in unavailable.body.as_array().unwrap() {
        assert_eq!(entry["eventStatus"], "ERROR", "{entry}");
        assert_eq!(entry["error"]["code"], 500);
        assert_eq!(entry["eventId"], Value::Null);
    }
    assert!(!unavailable.body.to_string().contains("exploded"));

    h.faults
        .set(FaultScope::Apply, StoreError::Internal(SECRET.into()));
    let internal = h.post("/events/schedule", &json!([item("a")])).await;
    assert_eq!(internal.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(internal.body[0]["eventStatus"], "ERROR");
    assert!(!internal.body.to_string().contains("exploded"));

    // A rejected item stays REJECTED; the others are ERROR; not all errored.
    let mixed = h
        .post(
            "/events/schedule",
            &json!([item("a"), { "id": "no-tenant" }]),
        )
        .await;
    assert_eq!(mixed.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(mixed.body[0]["eventStatus"], "ERROR");
    assert_eq!(mixed.body[1]["eventStatus"], "REJECTED");

    // The tenant check itself failing is the same ERROR.
    h.faults.set(
        FaultScope::ClientCalls,
        StoreError::Unavailable(SECRET.into()),
    );
    let lookup = h.post("/events/schedule", &json!([item("a")])).await;
    assert_eq!(lookup.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(lookup.body[0]["eventStatus"], "ERROR");

    let find = h.get("/events/find?tenant=acme&id=a").await;
    assert_eq!(find.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(find.body["message"].is_string());
    assert!(!find.body.to_string().contains("exploded"));
    let tenants = h.get("/events/tenants").await;
    assert_eq!(tenants.status, StatusCode::SERVICE_UNAVAILABLE);

    h.faults.clear();
    assert!(h.event("acme", "a").await.is_none());
    assert!(h.event("acme", "b").await.is_none());
    h.shutdown().await;
}

#[tokio::test]
async fn v1_answers_503_or_a_generic_500() {
    let h = Harness::start().await;
    h.register_log("acme").await;

    h.faults
        .set(FaultScope::Apply, StoreError::Unavailable(SECRET.into()));
    let put = h
        .put(
            "/v1/tenants/acme/events/a",
            &json!({ "deliver_at": FUTURE }),
        )
        .await;
    assert_eq!(put.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(put.body["error"]["code"], "store_unavailable");
    let batch = h
        .post(
            "/v1/tenants/acme/events",
            &json!({ "events": [{ "id": "b", "deliver_at": FUTURE }] }),
        )
        .await;
    assert_eq!(batch.status, StatusCode::SERVICE_UNAVAILABLE);

    h.faults
        .set(FaultScope::ClientCalls, StoreError::Internal(SECRET.into()));
    for answer in [
        h.get("/v1/tenants").await,
        h.get("/v1/tenants/acme/events/a").await,
        h.get("/v1/tenants/acme/events").await,
        h.delete("/v1/tenants/acme").await,
    ] {
        assert_eq!(
            answer.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{answer:?}"
        );
        assert_eq!(answer.body["error"]["code"], "internal");
        assert!(!answer.body.to_string().contains("exploded"), "{answer:?}");
    }

    h.faults.clear();
    assert!(h.event("acme", "a").await.is_none());
    assert!(h.event("acme", "b").await.is_none());
    assert_eq!(h.get("/v1/tenants/acme").await.status, StatusCode::OK);
    h.shutdown().await;
}
