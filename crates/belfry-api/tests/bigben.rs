//! BigBen's HTTP API, route by route and outcome by outcome, over the real
//! router, store and engine (the contract restated in `docs/api.md`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use belfry_api::ApiOptions;
use belfry_core::EventStatus;
use belfry_testkit::{Receiver, Response};
use common::{DEADLINE, FUTURE, Harness, encode, from_now};
use serde_json::{Value, json};

const TENANT: &str = "TenantB/ProgramB/EnvC";

fn item(id: &str, event_time: &str) -> Value {
    json!({ "id": id, "eventTime": event_time, "tenant": TENANT, "payload": "{\"orderId\":42}" })
}

fn find_path(tenant: &str, id: &str) -> String {
    format!("/events/find?tenant={}&id={}", encode(tenant), encode(id))
}

#[tokio::test]
async fn ping_and_cluster() {
    let h = Harness::start().await;
    let ping = h.get("/ping").await;
    assert_eq!(ping.status, StatusCode::OK);
    assert_eq!(ping.body, json!({ "status": "OK" }));
    let cluster = h.get("/events/cluster").await;
    assert_eq!(cluster.status, StatusCode::OK);
    assert_eq!(cluster.body, json!({ "127.0.0.1:8080": "Master" }));
    h.shutdown().await;
}

#[tokio::test]
async fn tenant_registration_answers_every_tenant_and_replaces() {
    let h = Harness::start().await;
    let first = h
        .post(
            "/events/tenant/register",
            &json!({ "tenant": TENANT, "type": "HTTP",
                     "props": { "url": "http://svc.internal/callbacks", "headers": { "h1": "v1" } } }),
        )
        .await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body,
        // Header values are write-only: masked in every answer.
        json!({ TENANT: { "tenant": TENANT, "type": "HTTP",
                          "props": { "url": "http://svc.internal/callbacks", "headers": { "h1": "****" } } } })
    );
    let second = h
        .post(
            "/events/tenant/register",
            &json!({ "tenant": "other", "type": "CUSTOM_CLASS",
                     "props": { "eventProcessorClass": "log" } }),
        )
        .await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body.as_object().unwrap().len(), 2);
    assert_eq!(
        second.body["other"],
        json!({ "tenant": "other", "type": "CUSTOM_CLASS", "props": { "eventProcessorClass": "log" } })
    );
    // Re-registering replaces.
    h.register_http(TENANT, "http://new.internal/hook").await;
    let tenants = h.get("/events/tenants").await;
    assert_eq!(tenants.status, StatusCode::OK);
    assert_eq!(
        tenants.body[TENANT]["props"],
        json!({ "url": "http://new.internal/hook", "headers": {} })
    );
    assert_eq!(tenants.body.as_object().unwrap().len(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn bad_tenant_registrations_are_400_and_change_nothing() {
    let h = Harness::start().await;
    h.register_log("keep").await;
    let before = h.snapshot(&[]).await;
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "type": "HTTP", "props": { "url": "http://a/" } }),
            "tenant must not be null",
        ),
        (
            json!({ "tenant": "t", "props": { "url": "http://a/" } }),
            "type must not be null",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP" }),
            "props must not be null",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP", "props": {} }),
            "props.url is required",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP", "props": { "url": "not a url" } }),
            "url must start with",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP", "props": { "url": "http://a/", "headers": { "bad header": "v" } } }),
            "header name",
        ),
        (
            json!({ "tenant": "t", "type": "CUSTOM_CLASS", "props": { "eventProcessorClass": "com.acme.Nope" } }),
            "unknown eventProcessorClass",
        ),
        (
            // Refused either way: a build without Kafka refuses MESSAGING,
            // one with it refuses acks=1 (tests/kafka_tenants.rs).
            json!({ "tenant": "t", "type": "MESSAGING", "props": { "topic": "out", "bootstrap.servers": "k:9092", "acks": "1" } }),
            if cfg!(feature = "kafka") {
                "acks"
            } else {
                "MESSAGING"
            },
        ),
        (
            json!({ "tenant": "t", "type": "SMOKE", "props": {} }),
            "unknown type",
        ),
        (
            json!({ "tenant": "", "type": "HTTP", "props": { "url": "http://a/" } }),
            "must not be empty",
        ),
        (
            json!({ "tenant": 5, "type": "HTTP", "props": { "url": "http://a/" } }),
            "tenant must be a string",
        ),
        (
            json!({ "tenant": "t", "type": 1, "props": { "url": "http://a/" } }),
            "type must be a string",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP", "props": [] }),
            "props must be an object",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP", "props": { "url": "http://a/", "timeout_ms": "x" } }),
            "props.timeout_ms must be a whole number",
        ),
        (
            json!({ "tenant": "t", "type": "HTTP", "props": { "url": "http://h:99999/" } }),
            "port",
        ),
        (json!([1, 2]), "wrong shape"),
    ];
    for (body, expected) in cases {
        let answer = h.post("/events/tenant/register", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        let message = answer.body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(expected),
            "{body}: {message:?} lacks {expected:?}"
        );
        for word in ["u64", "invalid type"] {
            assert!(!message.contains(word), "{body}: {message:?}");
        }
        assert_eq!(answer.body.as_object().unwrap().len(), 1, "{answer:?}");
    }
    let broken = h
        .raw(
            Method::POST,
            "/events/tenant/register",
            Some("application/json"),
            "{\"tenant\":",
        )
        .await;
    assert_eq!(broken.status, StatusCode::BAD_REQUEST);
    assert!(
        broken.body["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    assert_eq!(h.snapshot(&["t"]).await, before);
    h.shutdown().await;
}

#[tokio::test]
async fn each_validation_message_in_order() {
    let h = Harness::start().await;
    h.register_log(TENANT).await;
    let before = h.snapshot(&["unknown"]).await;
    let cases: Vec<(Value, &str)> = vec![
        // 1 beats every later rule.
        (
            json!({ "id": "a", "payload": "p", "deliveryOption": "PAYLOAD_ONLY" }),
            "tenant not present",
        ),
        // 2 beats 3.
        (
            json!({ "id": "a", "tenant": "unknown" }),
            "event time not present",
        ),
        // 3 beats 4 and 5.
        (
            json!({ "id": "a", "tenant": "unknown", "eventTime": "garbage", "deliveryOption": "PAYLOAD_ONLY" }),
            "tenant not registered / unknown tenant: unknown",
        ),
        // 4 beats 5.
        (
            json!({ "id": "a", "tenant": TENANT, "eventTime": "garbage", "deliveryOption": "PAYLOAD_ONLY" }),
            "payload must not be null for deliveryOption PAYLOAD_ONLY",
        ),
        (
            json!({ "id": "a", "tenant": TENANT, "eventTime": "2030-01-31T04:00:30" }),
            "event time can not be parsed. Must be in ISO 8601 format.",
        ),
        (
            json!({ "tenant": TENANT, "eventTime": FUTURE }),
            "id not present",
        ),
        (
            json!({ "id": "x".repeat(501), "tenant": TENANT, "eventTime": FUTURE }),
            "event id is longer than 500 bytes",
        ),
    ];
    for (request, expected) in &cases {
        let answer = h.post("/events/schedule", &json!([request])).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{request}: {answer:?}"
        );
        let item = &answer.body[0];
        assert_eq!(item["eventStatus"], "REJECTED", "{item}");
        assert_eq!(item["error"]["code"], 400, "{item}");
        assert_eq!(item["error"]["message"], *expected, "{item}");
        assert_eq!(item["eventId"], Value::Null);
        // The request is echoed, nulls present.
        for field in [
            "id",
            "eventTime",
            "tenant",
            "payload",
            "mode",
            "deliveryOption",
            "eventId",
            "triggeredAt",
        ] {
            assert!(item.get(field).is_some(), "{field} missing from {item}");
        }
    }
    assert_eq!(h.snapshot(&["unknown"]).await, before);
    h.shutdown().await;
}

#[tokio::test]
async fn overall_status_is_400_206_or_200() {
    let h = Harness::start().await;
    h.register_log(TENANT).await;
    let all_rejected = h
        .post(
            "/events/schedule",
            &json!([{ "id": "a" }, { "id": "b", "tenant": TENANT }]),
        )
        .await;
    assert_eq!(all_rejected.status, StatusCode::BAD_REQUEST);
    assert_eq!(all_rejected.body.as_array().unwrap().len(), 2);

    let some = h
        .post(
            "/events/schedule",
            &json!([item("ok-1", FUTURE), { "id": "bad" }, item("ok-2", FUTURE)]),
        )
        .await;
    assert_eq!(some.status, StatusCode::PARTIAL_CONTENT);
    let statuses: Vec<&Value> = some
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["eventStatus"])
        .collect();
    assert_eq!(
        statuses,
        [&json!("ACCEPTED"), &json!("REJECTED"), &json!("ACCEPTED")]
    );
    assert_eq!(some.body[0]["id"], "ok-1");
    assert_eq!(some.body[2]["id"], "ok-2");

    let none = h
        .post("/events/schedule", &json!([item("ok-3", FUTURE)]))
        .await;
    assert_eq!(none.status, StatusCode::OK);
    let empty = h.post("/events/schedule", &json!([])).await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.body, json!([]));
    h.shutdown().await;
}

#[tokio::test]
async fn upsert_accepted_updated_moved_and_remove() {
    let h = Harness::start().await;
    h.register_log(TENANT).await;
    let created = h
        .post("/events/schedule", &json!([item("e1", FUTURE)]))
        .await;
    assert_eq!(created.status, StatusCode::OK);
    let first = &created.body[0];
    assert_eq!(first["eventStatus"], "ACCEPTED");
    assert_eq!(first["error"], Value::Null);
    assert_eq!(first["triggeredAt"], Value::Null);
    assert_eq!(first["mode"], "UPSERT");
    assert_eq!(first["deliveryOption"], "FULL_EVENT");
    let version = first["eventId"].as_str().unwrap().to_string();
    let stored = h.event(TENANT, "e1").await.unwrap();
    assert_eq!(stored.version.as_str(), version);
    assert_eq!(stored.payload.as_deref(), Some("{\"orderId\":42}"));

    // Same instant (other offset): payload replaced, same version.
    let same = json!([{ "id": "e1", "tenant": TENANT, "eventTime": "2099-01-31T09:30:30+05:30", "payload": "new" }]);
    let updated = h.post("/events/schedule", &same).await;
    assert_eq!(updated.body[0]["eventStatus"], "UPDATED");
    assert_eq!(updated.body[0]["eventId"], version.as_str());
    assert_eq!(
        h.event(TENANT, "e1").await.unwrap().payload.as_deref(),
        Some("new")
    );

    // Other instant: moved, new version.
    let moved = h
        .post(
            "/events/schedule",
            &json!([item("e1", "2099-02-01T00:00:00Z")]),
        )
        .await;
    assert_eq!(moved.body[0]["eventStatus"], "UPDATED");
    let new_version = moved.body[0]["eventId"].as_str().unwrap();
    assert_ne!(new_version, version);
    assert_eq!(
        h.event(TENANT, "e1").await.unwrap().version.as_str(),
        new_version
    );

    // REMOVE: deleted, then unknown → null status; no eventTime needed.
    let remove = json!([{ "id": "e1", "tenant": TENANT, "mode": "REMOVE" }]);
    let deleted = h.post("/events/schedule", &remove).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body[0]["eventStatus"], "DELETED");
    assert_eq!(deleted.body[0]["mode"], "REMOVE");
    assert_eq!(
        h.event(TENANT, "e1").await.unwrap().status,
        EventStatus::Cancelled
    );
    let again = h.post("/events/schedule", &remove).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body[0]["eventStatus"], Value::Null);
    assert_eq!(again.body[0]["error"], Value::Null);
    let unknown = h
        .post(
            "/events/schedule",
            &json!([{ "id": "never", "tenant": TENANT, "mode": "REMOVE" }]),
        )
        .await;
    assert_eq!(unknown.status, StatusCode::OK);
    assert_eq!(unknown.body[0]["eventStatus"], Value::Null);
    assert_eq!(
        h.get(&find_path(TENANT, "e1")).await.status,
        StatusCode::NOT_FOUND
    );
    h.shutdown().await;
}

#[tokio::test]
async fn past_due_is_triggered_stored_and_delivered() {
    let receiver = Receiver::start().await;
    let h = Harness::start().await;
    h.register_http(TENANT, &receiver.url("/hook")).await;
    let past = from_now(-60_000);
    let answer = h
        .post("/events/schedule", &json!([item("late", &past)]))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let item = &answer.body[0];
    assert_eq!(item["eventStatus"], "TRIGGERED");
    assert!(item["triggeredAt"].is_string(), "{item}");
    assert!(item["eventId"].is_string(), "{item}");
    // Stored (BigBen lost these), and delivered at once.
    assert!(h.event(TENANT, "late").await.is_some());
    let requests = receiver.wait_for_count(1, DEADLINE).await.unwrap();
    let body = requests[0].body_json().unwrap();
    assert_eq!(body["id"], "late");
    assert_eq!(body["eventStatus"], "TRIGGERED");
    assert_eq!(body["eventId"], item["eventId"]);
    let found = h.wait_for_find_status(TENANT, "late", "PROCESSED").await;
    assert!(found["triggeredAt"].is_string());
    h.shutdown().await;
}

#[tokio::test]
async fn lapse_offset_answers_triggered_but_never_fires_early() {
    let receiver = Receiver::start().await;
    let h = Harness::with_options(ApiOptions {
        lapse_offset_ms: 3_600_000,
        ..ApiOptions::default()
    })
    .await;
    h.register_http(TENANT, &receiver.url("/hook")).await;
    let soon = from_now(600_000);
    let answer = h
        .post("/events/schedule", &json!([item("soon", &soon)]))
        .await;
    assert_eq!(answer.body[0]["eventStatus"], "TRIGGERED");
    let stored = h.event(TENANT, "soon").await.unwrap();
    assert_eq!(stored.status, EventStatus::Scheduled);
    assert_eq!(receiver.count(), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn find_reports_unprocessed_processed_and_error() {
    let receiver = Receiver::start().await;
    receiver.push_rule(
        belfry_testkit::Rule::always(Response::status(400).with_body("bad order"))
            .for_path("/refuse"),
    );
    let h = Harness::start().await;
    h.register_http(TENANT, &receiver.url("/hook")).await;
    h.register_http("refusing", &receiver.url("/refuse")).await;

    h.post("/events/schedule", &json!([item("waiting", FUTURE)]))
        .await;
    let waiting = h.get(&find_path(TENANT, "waiting")).await;
    assert_eq!(waiting.status, StatusCode::OK);
    assert_eq!(waiting.body["eventStatus"], "UN_PROCESSED");
    assert_eq!(waiting.body["eventTime"], "2099-01-31T04:00:30Z");
    assert_eq!(waiting.body["tenant"], TENANT);
    assert_eq!(waiting.body["payload"], "{\"orderId\":42}");
    assert_eq!(waiting.body["error"], Value::Null);

    // Offsets come back as the same instant in UTC.
    h.post(
        "/events/schedule",
        &json!([{ "id": "offset", "tenant": TENANT, "eventTime": "2099-01-31T09:30:30.250+05:30" }]),
    )
    .await;
    let offset = h.get(&find_path(TENANT, "offset")).await;
    assert_eq!(offset.body["eventTime"], "2099-01-31T04:00:30.25Z");

    h.post("/events/schedule", &json!([item("now", &from_now(-10))]))
        .await;
    let processed = h.wait_for_find_status(TENANT, "now", "PROCESSED").await;
    assert!(processed["triggeredAt"].is_string());
    assert_eq!(processed["error"], Value::Null);

    let refused = json!([{ "id": "r", "tenant": "refusing", "eventTime": from_now(-10) }]);
    h.post("/events/schedule", &refused).await;
    let failed = h.wait_for_find_status("refusing", "r", "ERROR").await;
    assert_eq!(failed["error"]["code"], 400, "{failed}");
    // The status and its reason, never the receiver's body.
    assert_eq!(
        failed["error"]["message"], "HTTP 400 Bad Request",
        "{failed}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn find_reports_retrying_as_error_with_last_status() {
    let receiver = Receiver::start().await;
    receiver.set_default_status(503);
    let h = Harness::start().await;
    h.register_http(TENANT, &receiver.url("/hook")).await;
    h.post("/events/schedule", &json!([item("flaky", &from_now(-10))]))
        .await;
    let retrying = h.wait_for_find_status(TENANT, "flaky", "ERROR").await;
    assert_eq!(retrying["error"]["code"], 503, "{retrying}");
    assert_eq!(
        h.event(TENANT, "flaky").await.unwrap().status,
        EventStatus::Retrying
    );
    h.shutdown().await;
}

#[tokio::test]
async fn find_and_dryrun_errors() {
    let h = Harness::start().await;
    h.register_log(TENANT).await;
    for path in [
        "/events/find?tenant=x",
        "/events/find?id=x",
        "/events/find",
        "/events/find?id=&tenant=x",
    ] {
        let answer = h.get(path).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
        assert!(
            answer.body["message"]
                .as_str()
                .unwrap()
                .contains("is required"),
            "{answer:?}"
        );
    }
    let missing = h.get(&find_path(TENANT, "nope")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body, json!({ "status": "not found" }));
    let dry_missing = h
        .send(
            Method::POST,
            &format!("/events/dryrun?tenant={}&id=nope", encode(TENANT)),
            None,
        )
        .await;
    assert_eq!(dry_missing.status, StatusCode::NOT_FOUND);
    assert_eq!(dry_missing.body, json!({ "status": "not found" }));
    let dry_no_param = h.send(Method::POST, "/events/dryrun?id=x", None).await;
    assert_eq!(dry_no_param.status, StatusCode::BAD_REQUEST);
    // BigBen's older parameter name still works.
    h.post("/events/schedule", &json!([item("b1", FUTURE)]))
        .await;
    let legacy = h
        .get(&format!(
            "/events/find?tenant={}&bucketId=b1",
            encode(TENANT)
        ))
        .await;
    assert_eq!(legacy.status, StatusCode::OK);
    assert_eq!(legacy.body["id"], "b1");
    h.shutdown().await;
}

#[tokio::test]
async fn dryrun_delivers_now_without_changing_state() {
    let receiver = Receiver::start().await;
    let h = Harness::start().await;
    h.register_http(TENANT, &receiver.url("/hook")).await;
    h.post("/events/schedule", &json!([item("dry", FUTURE)]))
        .await;
    let before = h.event(TENANT, "dry").await.unwrap();
    let answer = h
        .send(
            Method::POST,
            &format!("/events/dryrun?tenant={}&id=dry", encode(TENANT)),
            None,
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["eventStatus"], "UN_PROCESSED");
    assert_eq!(answer.body["error"], Value::Null);
    let requests = receiver.wait_for_count(1, DEADLINE).await.unwrap();
    assert_eq!(requests[0].body_json().unwrap()["id"], "dry");
    assert_eq!(h.event(TENANT, "dry").await.unwrap(), before);

    // A cancelled event is not found and not delivered.
    h.post(
        "/events/schedule",
        &json!([{ "id": "dry", "tenant": TENANT, "mode": "REMOVE" }]),
    )
    .await;
    let gone = h
        .send(
            Method::POST,
            &format!("/events/dryrun?tenant={}&id=dry", encode(TENANT)),
            None,
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(receiver.count(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_schedule_requests_are_400_and_change_nothing() {
    let h = Harness::with_options(ApiOptions {
        max_batch: 3,
        max_body_bytes: 4_096,
        ..ApiOptions::default()
    })
    .await;
    h.register_log(TENANT).await;
    h.post("/events/schedule", &json!([item("keep", FUTURE)]))
        .await;
    let before = h.snapshot(&[]).await;
    let cases: Vec<(Option<&str>, Vec<u8>, StatusCode, &str)> = vec![
        (Some("application/json"), b"[{".to_vec(), StatusCode::BAD_REQUEST, "not valid JSON"),
        (Some("application/json"), b"".to_vec(), StatusCode::BAD_REQUEST, "not valid JSON"),
        (Some("application/json"), br#"{"id":"a"}"#.to_vec(), StatusCode::BAD_REQUEST, "wrong shape"),
        (Some("application/json"), br#"[{"id":5}]"#.to_vec(), StatusCode::BAD_REQUEST, "[0].id: expected a string, found integer"),
        (Some("application/json"), br#"[{"id":"a","mode":"SMASH"}]"#.to_vec(), StatusCode::BAD_REQUEST, "unknown mode \"SMASH\""),
        (Some("application/json"), br#"[{"id":"a","mode":5}]"#.to_vec(), StatusCode::BAD_REQUEST, "expected a string"),
        (Some("application/json"), br#"[{"id":"a","deliveryOption":"LOUD"}]"#.to_vec(), StatusCode::BAD_REQUEST, "unknown deliveryOption"),
        (Some("application/json"), br#"[5]"#.to_vec(), StatusCode::BAD_REQUEST, "expected an EventRequest object"),
        (Some("application/json"), br#"[{"id":"a","payload":{"x":1}}]"#.to_vec(), StatusCode::BAD_REQUEST, "payload: expected a string, found an object"),
        (Some("text/plain"), b"[]".to_vec(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "application/json"),
        (
            Some("application/json"),
            serde_json::to_vec(&json!([item("a", FUTURE), item("b", FUTURE), item("c", FUTURE), item("d", FUTURE)])).unwrap(),
            StatusCode::BAD_REQUEST,
            "too many events",
        ),
        (
            Some("application/json"),
            serde_json::to_vec(&json!([{ "id": "big", "tenant": TENANT, "eventTime": FUTURE, "payload": "x".repeat(5_000) }])).unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than 4096 bytes",
        ),
    ];
    for (content_type, body, status, expected) in cases {
        let text = String::from_utf8_lossy(&body)
            .chars()
            .take(80)
            .collect::<String>();
        let answer = h
            .raw(Method::POST, "/events/schedule", content_type, body)
            .await;
        assert_eq!(answer.status, status, "{text}: {answer:?}");
        let message = answer.body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(expected),
            "{text}: {message:?} lacks {expected:?}"
        );
        for leak in [
            "belfry",
            "::",
            "EventRequest\u{20}at",
            "Mode",
            "DeliveryOption",
            "struct",
            "enum",
        ] {
            assert!(!message.contains(leak), "{message} leaks {leak}");
        }
        assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    }
    assert_eq!(h.snapshot(&[]).await, before);
    // No content type at all is accepted as JSON.
    let untyped = h
        .raw(
            Method::POST,
            "/events/schedule",
            None,
            serde_json::to_vec(&json!([item("keep", FUTURE)])).unwrap(),
        )
        .await;
    assert_eq!(untyped.status, StatusCode::OK);
    assert_eq!(untyped.body[0]["eventStatus"], "UPDATED");
    h.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_are_json() {
    let h = Harness::start().await;
    let unknown = h.get("/events/nope").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body["message"].is_string());
    let wrong_method = h.get("/events/schedule").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(wrong_method.body["message"].is_string());
    h.shutdown().await;
}
