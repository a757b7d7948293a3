//! What clients see when the store fails: BigBen's per-item `ERROR`, the
//! `/v1` envelope with 503/500, never internal details, and nothing claimed
//! stored that was not.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use belfry_api::ApiOptions;
use belfry_core::{EventId, EventKey, TenantName};
use belfry_engine::EngineOptions;
use belfry_store::StoreError;
use common::{FUTURE, FaultScope, Harness, from_now};
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
    // A failed write may have been committed with its answer lost: never
    // "nothing was changed".
    let message = put.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("may or may not"), "{message}");
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

/// Ids of tenant `acme`: one the failing writer shard writes, and ids of
/// another shard.
fn ids_across_shards(h: &Harness) -> (String, Vec<String>) {
    let shard = |id: &str| {
        let key = EventKey::new(TenantName::new("acme").unwrap(), EventId::new(id).unwrap());
        h.embedded.writer_shard(&key)
    };
    let lost = "lost".to_string();
    let lost_shard = shard(&lost);
    let others = (0..)
        .map(|i| format!("kept-{i}"))
        .filter(|id| shard(id) != lost_shard)
        .take(2)
        .collect();
    (lost, others)
}

/// A batch the embedded store commits only in part (one writer shard's
/// commit fails): each stored item gets its real answer and its timer is
/// armed at once, only the other item is `ERROR`, and the batch answers
/// 206 (not 200, not a blanket 503).
#[tokio::test]
async fn bigben_schedule_answers_a_partly_failed_batch_per_item() {
    // No repair pages: the near event below can reach its window only
    // through the effects of its own apply.
    let h = Harness::with_engine_options(
        ApiOptions::default(),
        EngineOptions {
            shutdown_grace: Duration::from_millis(500),
            repair_interval: Duration::ZERO,
            ..EngineOptions::default()
        },
    )
    .await;
    h.register_log("acme").await;
    // The windows are loaded once something has fired: a near event stored
    // later reaches its window only through the effects of its apply.
    let warm_up = h
        .post(
            "/events/schedule",
            &json!([{ "id": "warm-up", "eventTime": from_now(200), "tenant": "acme" }]),
        )
        .await;
    assert_eq!(warm_up.status, StatusCode::OK, "{warm_up:?}");
    h.wait_for_find_status("acme", "warm-up", "PROCESSED").await;

    let (lost, kept) = ids_across_shards(&h);
    let (far, near) = (&kept[0], &kept[1]);
    let lost_key = EventKey::new(
        TenantName::new("acme").unwrap(),
        EventId::new(&lost).unwrap(),
    );
    h.embedded.fail_commits_of(&lost_key, 1);
    let answer = h
        .post(
            "/events/schedule",
            &json!([
                item(far),
                item(&lost),
                { "id": near, "eventTime": from_now(1_500), "tenant": "acme" },
            ]),
        )
        .await;
    assert_eq!(answer.status, StatusCode::PARTIAL_CONTENT, "{answer:?}");
    let items = answer.body.as_array().unwrap();
    for (index, id) in [(0, far), (2, near)] {
        assert_eq!(items[index]["id"], id.as_str());
        assert_eq!(items[index]["eventStatus"], "ACCEPTED", "{answer:?}");
        assert_eq!(items[index]["error"], Value::Null);
        let stored = h
            .event("acme", id)
            .await
            .expect("an ACCEPTED item is stored");
        assert_eq!(items[index]["eventId"], stored.version.as_str());
    }
    assert_eq!(items[1]["id"], lost.as_str());
    assert_eq!(items[1]["eventStatus"], "ERROR");
    assert_eq!(items[1]["error"]["code"], 500);
    assert_eq!(items[1]["eventId"], Value::Null);
    assert!(!answer.body.to_string().contains("injected"));
    assert!(h.event("acme", &lost).await.is_none());

    // The stored near event fires on time: its effect reached the window.
    h.wait_for_find_status("acme", near, "PROCESSED").await;
    // The failed item, sent again, is stored.
    let again = h.post("/events/schedule", &json!([item(&lost)])).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body[0]["eventStatus"], "ACCEPTED");
    h.shutdown().await;
}

/// The same through `/v1`'s batch: per-item `error` with the store's code,
/// counted in `failed`; a single-event call on the failing shard is a 500.
#[tokio::test]
async fn v1_batch_answers_a_partly_failed_batch_per_item() {
    let h = Harness::start().await;
    h.register_log("acme").await;
    let (lost, kept) = ids_across_shards(&h);
    let (first, second) = (&kept[0], &kept[1]);
    let lost_key = EventKey::new(
        TenantName::new("acme").unwrap(),
        EventId::new(&lost).unwrap(),
    );

    h.embedded.fail_commits_of(&lost_key, 1);
    let answer = h
        .post(
            "/v1/tenants/acme/events",
            &json!({ "events": [
                { "id": first, "deliver_at": FUTURE },
                { "id": lost, "deliver_at": FUTURE },
                { "id": second, "deliver_at": "tomorrow" },
            ] }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(results[0]["outcome"], "created");
    assert_eq!(results[1]["id"], lost.as_str());
    assert_eq!(results[1]["outcome"], "error");
    assert_eq!(results[1]["error"]["code"], "internal");
    assert_eq!(results[2]["outcome"], "rejected");
    assert_eq!(answer.body["rejected"], 1);
    assert_eq!(answer.body["failed"], 1);
    assert!(!answer.body.to_string().contains("injected"));
    assert!(h.event("acme", first).await.is_some());
    assert!(h.event("acme", &lost).await.is_none());

    h.embedded.fail_commits_of(&lost_key, 1);
    let put = h
        .put(
            &format!("/v1/tenants/acme/events/{lost}"),
            &json!({ "deliver_at": FUTURE }),
        )
        .await;
    assert_eq!(put.status, StatusCode::INTERNAL_SERVER_ERROR, "{put:?}");
    assert_eq!(put.body["error"]["code"], "internal");
    assert!(h.event("acme", &lost).await.is_none());
    h.shutdown().await;
}
