//! The native `/v1` API: every route, its error cases, and that a bad
//! request changes nothing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use axum::http::{Method, StatusCode};
use belfry_api::ApiOptions;
use belfry_core::EventStatus;
use belfry_testkit::{Receiver, Response, Rule};
use common::{DEADLINE, FUTURE, Harness, encode, from_now};
use serde_json::{Value, json};

fn log_sink() -> Value {
    json!({ "sink": { "type": "builtin", "processor": "log" } })
}

fn tenant_path(tenant: &str) -> String {
    format!("/v1/tenants/{}", encode(tenant))
}

fn event_path(tenant: &str, id: &str) -> String {
    format!("/v1/tenants/{}/events/{}", encode(tenant), encode(id))
}

fn assert_error(answer: &common::Answer, status: StatusCode, code: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
    assert!(answer.body["error"]["message"].is_string(), "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
}

#[tokio::test]
async fn tenant_crud() {
    let h = Harness::start().await;
    let mut created = h
        .put(
            "/v1/tenants/acme",
            &json!({ "sink": { "type": "http", "url": "http://svc.internal/hook",
                               "headers": { "x-key": "k" }, "timeout_ms": 2500 } }),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    // The signing secret is answered this once (tests/webhook_security.rs).
    let secret = created
        .body
        .as_object_mut()
        .unwrap()
        .remove("signing_secret");
    assert!(secret.unwrap().as_str().unwrap().starts_with("whsec_"));
    assert_eq!(
        created.body,
        // Header values are write-only: masked in every answer. An http
        // tenant's endpoint has a circuit breaker, closed at first.
        json!({ "name": "acme", "sink": { "type": "http", "url": "http://svc.internal/hook",
                                          "headers": { "x-key": "****" }, "timeout_ms": 2500 },
                "circuit": { "state": "closed", "since": null, "consecutive_failures": 0,
                             "next_probe_at": null } })
    );
    let replaced = h.put("/v1/tenants/acme", &log_sink()).await;
    assert_eq!(replaced.status, StatusCode::OK);
    assert_eq!(
        replaced.body["sink"],
        json!({ "type": "builtin", "processor": "log" })
    );
    assert!(replaced.body.get("circuit").is_none(), "{replaced:?}");
    let fetched = h.get("/v1/tenants/acme").await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.body, replaced.body);
    h.put("/v1/tenants/beta", &log_sink()).await;
    let list = h.get("/v1/tenants").await;
    assert_eq!(list.status, StatusCode::OK);
    let names: Vec<&str> = list.body["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme", "beta"]);
    // Both APIs see the same tenants.
    assert_eq!(
        h.get("/events/tenants")
            .await
            .body
            .as_object()
            .unwrap()
            .len(),
        2
    );

    let deleted = h.delete("/v1/tenants/acme").await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(deleted.body, Value::Null);
    assert_error(
        &h.delete("/v1/tenants/acme").await,
        StatusCode::NOT_FOUND,
        "tenant_not_found",
    );
    assert_error(
        &h.get("/v1/tenants/acme").await,
        StatusCode::NOT_FOUND,
        "tenant_not_found",
    );
    h.shutdown().await;
}

/// A sink field its type does not use is refused by name: the first one
/// given (the delivery policy fields apply to every delivering type).
#[tokio::test]
async fn stray_sink_fields_are_named() {
    let h = Harness::start().await;
    let cases = [
        (
            json!({ "type": "http", "url": "http://a/", "topic": "t", "processor": "log" }),
            "field processor does not apply to sink type http",
        ),
        (
            json!({ "type": "builtin", "processor": "log", "max_attempts": 3 }),
            "field max_attempts does not apply to sink type builtin",
        ),
        (
            json!({ "type": "builtin", "processor": "log", "timeout_ms": 5 }),
            "field timeout_ms does not apply to sink type builtin",
        ),
        (
            json!({ "type": "kafka", "topic": "t", "queues": ["a"] }),
            "field queues does not apply to sink type kafka",
        ),
        (
            json!({ "type": "pull", "max_attempts": 3, "key": "none" }),
            "field key does not apply to sink type pull",
        ),
    ];
    for (sink, message) in cases {
        let answer = h.put("/v1/tenants/new", &json!({ "sink": sink })).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, "invalid_sink");
        assert_eq!(answer.body["error"]["message"], message, "{sink}");
    }
}

/// A notice target is a URL or a Kafka topic, checked like a sink's; the
/// tenant views show it, and a `PUT` without it removes it.
#[tokio::test]
async fn a_notice_target_is_checked_shown_and_replaced() {
    let h = Harness::start().await;
    let receiver = Receiver::start().await;
    let sink = json!({ "type": "http", "url": receiver.url("/hook") });
    let cases = [
        (json!("https://a/"), "notify must be an object"),
        (
            json!({ "url": "https://a/", "kafka_topic": "t" }),
            "notify must hold exactly one string field: url or kafka_topic",
        ),
        (
            json!({ "topic": "t" }),
            "notify must hold exactly one string field: url or kafka_topic",
        ),
        (
            json!({ "url": "ftp://a/" }),
            "notify: url must start with http:// or https://",
        ),
        (
            json!({ "kafka_topic": " " }),
            "notify: topic must not be empty",
        ),
    ];
    for (notify, message) in cases {
        let body = json!({ "sink": sink, "notify": notify });
        let answer = h.put("/v1/tenants/acme", &body).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, "invalid_sink");
        assert_eq!(answer.body["error"]["message"], message, "{notify}");
    }
    assert_eq!(
        h.get("/v1/tenants/acme").await.status,
        StatusCode::NOT_FOUND
    );

    let notify = json!({ "url": receiver.url("/notices") });
    let answer = h
        .put(
            "/v1/tenants/acme",
            &json!({ "sink": sink, "notify": notify }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(answer.body["notify"], notify);
    assert_eq!(h.get("/v1/tenants/acme").await.body["notify"], notify);
    let listed = h.get("/v1/tenants").await;
    assert_eq!(listed.body["tenants"][0]["notify"], notify, "{listed:?}");
    // A BigBen registration (which knows no notice target) keeps it.
    h.register_http("acme", &receiver.url("/other")).await;
    let view = h.get("/v1/tenants/acme").await;
    assert_eq!(view.body["notify"], notify, "{view:?}");
    assert_eq!(view.body["sink"]["url"], receiver.url("/other"), "{view:?}");
    let answer = h.put("/v1/tenants/acme", &json!({ "sink": sink })).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert!(answer.body.get("notify").is_none(), "{answer:?}");
}

#[tokio::test]
async fn bad_tenant_requests_change_nothing() {
    let h = Harness::with_options(ApiOptions {
        max_body_bytes: 1_024,
        ..ApiOptions::default()
    })
    .await;
    h.put("/v1/tenants/keep", &log_sink()).await;
    let before = h.snapshot(&[]).await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "invalid_request"),
        (json!({ "sink": 5 }), "invalid_request"),
        (json!({ "sink": { "type": "http" } }), "invalid_sink"),
        (
            json!({ "sink": { "type": "http", "url": "ftp://x" } }),
            "invalid_sink",
        ),
        (
            json!({ "sink": { "type": "http", "url": "http:// spaced" } }),
            "invalid_sink",
        ),
        (
            json!({ "sink": { "type": "http", "url": "http://a/", "headers": { "bad header": "v" } } }),
            "invalid_sink",
        ),
        (
            json!({ "sink": { "type": "http", "url": "http://a/", "processor": "log" } }),
            "invalid_sink",
        ),
        (
            json!({ "sink": { "type": "http", "url": "http://a/", "timeout_ms": "soon" } }),
            "invalid_sink",
        ),
        (
            json!({ "sink": { "type": "builtin", "processor": "nope" } }),
            "unsupported_sink",
        ),
        (
            // Without Kafka in the build: unsupported; with it, invalid
            // (no bootstrap.servers).
            json!({ "sink": { "type": "kafka", "topic": "out" } }),
            if cfg!(feature = "kafka") {
                "invalid_sink"
            } else {
                "unsupported_sink"
            },
        ),
        (
            json!({ "sink": { "type": "carrier-pigeon" } }),
            "invalid_sink",
        ),
        (
            json!({ "sink": { "type": "builtin", "processor": "log" }, "extra": 1 }),
            "invalid_request",
        ),
        (json!([]), "invalid_request"),
    ];
    for (body, code) in cases {
        let answer = h.put("/v1/tenants/new", &body).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, code);
        let message = answer.body["error"]["message"].as_str().unwrap();
        for leak in ["::", "SinkSpec", "PutTenant", "struct", "enum"] {
            assert!(!message.contains(leak), "{message} leaks {leak}");
        }
    }
    let broken = h
        .raw(
            Method::PUT,
            "/v1/tenants/new",
            Some("application/json"),
            "{\"sink\":",
        )
        .await;
    assert_error(&broken, StatusCode::BAD_REQUEST, "invalid_json");
    let text = h
        .raw(Method::PUT, "/v1/tenants/new", Some("text/plain"), "hello")
        .await;
    assert_error(
        &text,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let huge = h
        .put("/v1/tenants/new", &json!({ "sink": { "type": "http", "url": format!("http://a/{}", "x".repeat(2_000)) } }))
        .await;
    assert_error(&huge, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    let long_name = h.put(&tenant_path(&"t".repeat(201)), &log_sink()).await;
    assert_error(&long_name, StatusCode::BAD_REQUEST, "invalid_name");
    let control = h.put("/v1/tenants/a%0Ab", &log_sink()).await;
    assert_error(&control, StatusCode::BAD_REQUEST, "invalid_name");
    let not_utf8 = h.put("/v1/tenants/a%FFb", &log_sink()).await;
    assert_error(&not_utf8, StatusCode::BAD_REQUEST, "invalid_name");
    assert_eq!(h.snapshot(&["new"]).await, before);
    h.shutdown().await;
}

#[tokio::test]
async fn names_with_slashes_spaces_and_non_ascii_are_one_segment() {
    let h = Harness::start().await;
    let tenant = "TenantB/ProgramB/EnvC";
    let id = "order 42/étape 2 ✓";
    let created = h.put(&tenant_path(tenant), &log_sink()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["name"], tenant);
    let event = h
        .put(&event_path(tenant, id), &json!({ "deliver_at": FUTURE }))
        .await;
    assert_eq!(event.status, StatusCode::CREATED, "{event:?}");
    assert_eq!(event.body["tenant"], tenant);
    assert_eq!(event.body["id"], id);
    let fetched = h.get(&event_path(tenant, id)).await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.body["id"], id);
    assert!(h.event(tenant, id).await.is_some());
    // Unencoded slashes are other paths, not this event.
    let split = h.get(&format!("/v1/tenants/{tenant}/events/x")).await;
    assert_error(&split, StatusCode::NOT_FOUND, "not_found");
    // The attempts route still works with an encoded id that ends in "attempts".
    let tricky = "a/attempts";
    h.put(
        &event_path(tenant, tricky),
        &json!({ "deliver_at": FUTURE }),
    )
    .await;
    let attempts = h
        .get(&format!("{}/attempts", event_path(tenant, tricky)))
        .await;
    assert_eq!(attempts.status, StatusCode::OK);
    assert_eq!(attempts.body, json!({ "attempts": [] }));
    h.shutdown().await;
}

#[tokio::test]
async fn event_put_get_update_cancel() {
    let h = Harness::start().await;
    h.put("/v1/tenants/acme", &log_sink()).await;
    let created = h
        .put(
            "/v1/tenants/acme/events/e1",
            &json!({ "deliver_at": "2099-01-31T09:30:30+05:30", "payload": "hi" }),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let view = &created.body;
    assert_eq!(view["tenant"], "acme");
    assert_eq!(view["id"], "e1");
    assert_eq!(view["deliver_at"], "2099-01-31T04:00:30Z");
    assert_eq!(view["status"], "scheduled");
    assert_eq!(view["attempts"], 0);
    assert_eq!(view["next_attempt_at"], "2099-01-31T04:00:30Z");
    assert_eq!(view["payload"], "hi");
    assert_eq!(view["delivery"], "full_event");
    for field in ["version", "created_at", "updated_at"] {
        assert!(view[field].is_string(), "{field}: {view}");
    }
    for field in ["last_error", "triggered_at", "finished_at"] {
        assert_eq!(view[field], Value::Null, "{field}: {view}");
    }
    let version = view["version"].clone();

    let updated = h
        .put(
            "/v1/tenants/acme/events/e1",
            &json!({ "deliver_at": "2099-01-31T04:00:30Z", "payload": "p", "delivery": "payload_only" }),
        )
        .await;
    assert_eq!(updated.status, StatusCode::OK);
    assert_eq!(updated.body["version"], version);
    assert_eq!(updated.body["delivery"], "payload_only");
    let moved = h
        .put(
            "/v1/tenants/acme/events/e1",
            &json!({ "deliver_at": "2099-02-01T00:00:00Z" }),
        )
        .await;
    assert_eq!(moved.status, StatusCode::OK);
    assert_ne!(moved.body["version"], version);
    assert_eq!(moved.body["previous_delivery"], "not_started");
    let mut view = moved.body.clone();
    view.as_object_mut().unwrap().remove("previous_delivery");
    assert_eq!(h.get("/v1/tenants/acme/events/e1").await.body, view);

    let cancelled = h.delete("/v1/tenants/acme/events/e1").await;
    assert_eq!(cancelled.status, StatusCode::OK);
    assert_eq!(cancelled.body["status"], "cancelled");
    assert!(cancelled.body["finished_at"].is_string());
    assert_eq!(cancelled.body["next_attempt_at"], Value::Null);
    assert_error(
        &h.delete("/v1/tenants/acme/events/e1").await,
        StatusCode::NOT_FOUND,
        "event_not_found",
    );
    assert_error(
        &h.delete("/v1/tenants/acme/events/never").await,
        StatusCode::NOT_FOUND,
        "event_not_found",
    );
    assert_error(
        &h.get("/v1/tenants/acme/events/never").await,
        StatusCode::NOT_FOUND,
        "event_not_found",
    );
    assert_error(
        &h.get("/v1/tenants/acme/events/never/attempts").await,
        StatusCode::NOT_FOUND,
        "event_not_found",
    );
    h.shutdown().await;
}

#[tokio::test]
async fn cancel_of_a_finished_event_is_409() {
    let receiver = Receiver::start().await;
    let h = Harness::start().await;
    h.put(
        "/v1/tenants/acme",
        &json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    h.put(
        "/v1/tenants/acme/events/now",
        &json!({ "deliver_at": from_now(-5) }),
    )
    .await;
    receiver.wait_for_count(1, DEADLINE).await.unwrap();
    wait_for_status(&h, "acme", "now", "delivered").await;
    let before = h.snapshot(&[]).await;
    let conflict = h.delete("/v1/tenants/acme/events/now").await;
    assert_error(&conflict, StatusCode::CONFLICT, "already_finished");
    assert_eq!(h.snapshot(&[]).await, before);
    h.shutdown().await;
}

async fn wait_for_status(h: &Harness, tenant: &str, id: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let answer = h.get(&event_path(tenant, id)).await;
        if answer.body["status"] == status {
            return answer.body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {status}: {answer:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn delivery_history_is_listed() {
    let receiver = Receiver::start().await;
    receiver.push_rule(Rule::first(1, Response::status(500).with_body("try later")));
    let h = Harness::start().await;
    h.put(
        "/v1/tenants/acme",
        &json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    h.put(
        "/v1/tenants/acme/events/flaky",
        &json!({ "deliver_at": from_now(-5) }),
    )
    .await;
    let done = wait_for_status(&h, "acme", "flaky", "delivered").await;
    assert_eq!(done["attempts"], 2);
    assert!(done["triggered_at"].is_string());
    let history = h.get("/v1/tenants/acme/events/flaky/attempts").await;
    assert_eq!(history.status, StatusCode::OK);
    let attempts = history.body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{history:?}");
    assert_eq!(attempts[0]["number"], 1);
    assert_eq!(attempts[0]["outcome"], "retry");
    assert_eq!(attempts[0]["http_status"], 500);
    // The status and its reason, never the receiver's body.
    assert_eq!(
        attempts[0]["error"], "HTTP 500 Internal Server Error",
        "{history:?}"
    );
    assert_eq!(attempts[1]["number"], 2);
    assert_eq!(attempts[1]["outcome"], "delivered");
    assert_eq!(attempts[1]["version"], done["version"]);
    for attempt in attempts {
        assert!(attempt["started_at"].is_string());
        assert!(attempt["duration_ms"].is_u64());
    }
    h.shutdown().await;
}

/// A dead event (refused with 400) is sent again by a redrive once its
/// receiver accepts: a new version and attempt series, due at once,
/// delivered; the audit log names the action. Only dead events may be
/// redriven, and a refused redrive changes nothing.
#[tokio::test]
async fn a_failed_event_is_redriven_and_delivered() {
    let receiver = Receiver::start().await;
    receiver.push_rule(Rule::first(
        1,
        Response::status(400).with_body("bad payload"),
    ));
    let h = Harness::start().await;
    h.put(
        "/v1/tenants/acme",
        &json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    h.put(
        "/v1/tenants/acme/events/dead",
        &json!({ "deliver_at": from_now(-5) }),
    )
    .await;
    let failed = wait_for_status(&h, "acme", "dead", "failed").await;

    let redriven = h
        .post("/v1/tenants/acme/events/dead/redrive", &json!({}))
        .await;
    assert_eq!(redriven.status, StatusCode::OK, "{redriven:?}");
    assert_eq!(redriven.body["status"], "scheduled");
    assert_ne!(redriven.body["version"], failed["version"]);
    assert_eq!(redriven.body["deliver_at"], failed["deliver_at"]);
    let delivered = wait_for_status(&h, "acme", "dead", "delivered").await;
    assert_eq!(delivered["attempts"], 1, "a new attempt series");
    assert_eq!(receiver.count(), 2);
    let history = h.get("/v1/tenants/acme/events/dead/attempts").await;
    let attempts = history.body["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "the old series stays: {history:?}");
    assert_eq!(attempts[0]["outcome"], "permanent");
    assert_eq!(attempts[1]["outcome"], "delivered");
    let audit = h.get("/v1/audit").await;
    assert!(
        audit.body["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "event_redriven" && e["target"] == "dead"),
        "{audit:?}"
    );

    // Delivered (not dead), unknown: refused, nothing changes.
    let before = h.snapshot(&[]).await;
    let again = h
        .post("/v1/tenants/acme/events/dead/redrive", &json!({}))
        .await;
    assert_error(&again, StatusCode::CONFLICT, "not_redrivable");
    let unknown = h
        .post("/v1/tenants/acme/events/nope/redrive", &json!({}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");
    assert_eq!(h.snapshot(&[]).await, before);
    h.shutdown().await;
}

/// A finished event is deleted with its history (204), audited, and its
/// id is free again; a pending one is refused with 409 `event_pending`,
/// an unknown or already deleted one with 404, and neither changes
/// anything.
#[tokio::test]
async fn a_finished_event_is_deleted_with_its_history() {
    let receiver = Receiver::start().await;
    receiver.set_default_status(400);
    let h = Harness::start().await;
    h.put(
        "/v1/tenants/acme",
        &json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    h.put(
        "/v1/tenants/acme/events/dead",
        &json!({ "deliver_at": from_now(-5) }),
    )
    .await;
    h.put(
        "/v1/tenants/acme/events/later",
        &json!({ "deliver_at": FUTURE }),
    )
    .await;
    wait_for_status(&h, "acme", "dead", "failed").await;

    let before = h.snapshot(&[]).await;
    let pending = h
        .post("/v1/tenants/acme/events/later/delete", &json!({}))
        .await;
    assert_error(&pending, StatusCode::CONFLICT, "event_pending");
    let unknown = h
        .post("/v1/tenants/acme/events/nope/delete", &json!({}))
        .await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "event_not_found");
    let bad = h
        .post("/v1/tenants/acme/events/a%0Ab/delete", &json!({}))
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_name");
    assert_eq!(h.snapshot(&[]).await, before);

    let deleted = h
        .post("/v1/tenants/acme/events/dead/delete", &json!({}))
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_error(
        &h.get("/v1/tenants/acme/events/dead").await,
        StatusCode::NOT_FOUND,
        "event_not_found",
    );
    let history = h.get("/v1/tenants/acme/events/dead/attempts").await;
    assert!(
        history.status == StatusCode::NOT_FOUND
            || history.body["attempts"]
                .as_array()
                .is_some_and(Vec::is_empty),
        "{history:?}"
    );
    let listed = h.get("/v1/tenants/acme/events?status=failed").await;
    assert_eq!(listed.body["events"], json!([]), "{listed:?}");
    let again = h
        .post("/v1/tenants/acme/events/dead/delete", &json!({}))
        .await;
    assert_error(&again, StatusCode::NOT_FOUND, "event_not_found");
    let audit = h.get("/v1/audit").await;
    let entries: Vec<&Value> = audit.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "event_deleted")
        .collect();
    assert_eq!(entries.len(), 1, "{audit:?}");
    assert_eq!(entries[0]["tenant"], "acme");
    assert_eq!(entries[0]["target"], "dead");

    // The id is free: scheduling it again creates a new event.
    let created = h
        .put(
            "/v1/tenants/acme/events/dead",
            &json!({ "deliver_at": FUTURE }),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["attempts"], 0);
    h.shutdown().await;
}

#[tokio::test]
async fn bad_event_requests_change_nothing() {
    let h = Harness::start().await;
    h.put("/v1/tenants/acme", &log_sink()).await;
    h.put(
        "/v1/tenants/acme/events/keep",
        &json!({ "deliver_at": FUTURE }),
    )
    .await;
    let before = h.snapshot(&["ghost"]).await;
    let cases: Vec<(String, Value, StatusCode, &str)> = vec![
        (
            "/v1/tenants/acme/events/e".into(),
            json!({}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": 5 }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": "tomorrow" }),
            StatusCode::BAD_REQUEST,
            "invalid_time",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": "2030-01-31T04:00:30" }),
            StatusCode::BAD_REQUEST,
            "invalid_time",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": FUTURE, "delivery": "payload_only" }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": FUTURE, "delivery": "smoke" }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": FUTURE, "delivery": 5 }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!([1]),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": FUTURE, "deliverAt": FUTURE }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "/v1/tenants/acme/events/e".into(),
            json!({ "deliver_at": FUTURE, "payload": {"a": 1} }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            event_path("acme", &"i".repeat(501)),
            json!({ "deliver_at": FUTURE }),
            StatusCode::BAD_REQUEST,
            "invalid_name",
        ),
        (
            "/v1/tenants/ghost/events/e".into(),
            json!({ "deliver_at": FUTURE }),
            StatusCode::NOT_FOUND,
            "tenant_not_found",
        ),
        // Overwriting "keep" with a bad body must not touch it either.
        (
            "/v1/tenants/acme/events/keep".into(),
            json!({ "deliver_at": "nope" }),
            StatusCode::BAD_REQUEST,
            "invalid_time",
        ),
    ];
    for (path, body, status, code) in cases {
        let answer = h.put(&path, &body).await;
        assert_error(&answer, status, code);
        let message = answer.body["error"]["message"].as_str().unwrap();
        for leak in ["::", "PutEvent", "Delivery", "struct", "enum"] {
            assert!(!message.contains(leak), "{message} leaks {leak}");
        }
    }
    let broken = h
        .raw(
            Method::PUT,
            "/v1/tenants/acme/events/e",
            Some("application/json"),
            "{",
        )
        .await;
    assert_error(&broken, StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(h.snapshot(&["ghost"]).await, before);
    h.shutdown().await;
}

#[tokio::test]
async fn batch_applies_valid_items_and_rejects_the_rest() {
    let h = Harness::with_options(ApiOptions {
        max_batch: 4,
        ..ApiOptions::default()
    })
    .await;
    h.put("/v1/tenants/acme", &log_sink()).await;
    h.put(
        "/v1/tenants/acme/events/old",
        &json!({ "deliver_at": FUTURE }),
    )
    .await;
    let answer = h
        .post(
            "/v1/tenants/acme/events",
            &json!({ "events": [
                { "id": "new", "deliver_at": FUTURE, "payload": "p" },
                { "id": "old", "deliver_at": FUTURE, "payload": "changed" },
                { "id": "bad-time", "deliver_at": "never" },
                { "deliver_at": FUTURE },
            ] }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(answer.body["rejected"], 2);
    assert_eq!(results[0]["id"], "new");
    assert_eq!(results[0]["outcome"], "created");
    assert!(results[0]["version"].is_string());
    assert_eq!(results[1]["outcome"], "updated");
    assert_eq!(results[2]["id"], "bad-time");
    assert_eq!(results[2]["outcome"], "rejected");
    assert_eq!(results[2]["error"]["code"], "invalid_time");
    assert_eq!(results[3]["id"], Value::Null);
    assert_eq!(results[3]["error"]["code"], "invalid_request");
    assert!(h.event("acme", "new").await.is_some());
    assert_eq!(
        h.event("acme", "old").await.unwrap().payload.as_deref(),
        Some("changed")
    );
    assert!(h.event("acme", "bad-time").await.is_none());

    let before = h.snapshot(&["ghost"]).await;
    let five: Vec<Value> = (0..5)
        .map(|i| json!({ "id": format!("n{i}"), "deliver_at": FUTURE }))
        .collect();
    assert_error(
        &h.post("/v1/tenants/acme/events", &json!({ "events": five }))
            .await,
        StatusCode::BAD_REQUEST,
        "batch_too_large",
    );
    assert_error(
        &h.post(
            "/v1/tenants/ghost/events",
            &json!({ "events": [{ "id": "x", "deliver_at": FUTURE }] }),
        )
        .await,
        StatusCode::NOT_FOUND,
        "tenant_not_found",
    );
    assert_error(
        &h.post("/v1/tenants/acme/events", &json!({ "events": 3 }))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    assert_error(
        &h.post("/v1/tenants/acme/events", &json!([])).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    assert_eq!(h.snapshot(&["ghost"]).await, before);
    h.shutdown().await;
}

#[tokio::test]
async fn list_pages_by_id_with_filters() {
    let h = Harness::start().await;
    h.put("/v1/tenants/acme", &log_sink()).await;
    for (id, at) in [
        ("c", "2099-01-03T00:00:00Z"),
        ("a", "2099-01-01T00:00:00Z"),
        ("b", "2099-01-02T00:00:00Z"),
        ("d", "2099-01-04T00:00:00Z"),
    ] {
        h.put(
            &format!("/v1/tenants/acme/events/{id}"),
            &json!({ "deliver_at": at }),
        )
        .await;
    }
    h.delete("/v1/tenants/acme/events/d").await;

    let mut seen = Vec::new();
    let mut path = "/v1/tenants/acme/events?limit=2".to_string();
    loop {
        let page = h.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{page:?}");
        for event in page.body["events"].as_array().unwrap() {
            seen.push(event["id"].as_str().unwrap().to_string());
        }
        match page.body["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/tenants/acme/events?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d"]);

    let scheduled = h.get("/v1/tenants/acme/events?status=scheduled").await;
    let ids: Vec<&str> = scheduled.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(scheduled.body["next_cursor"], Value::Null);
    let window = h
        .get(&format!(
            "/v1/tenants/acme/events?from={}&to={}",
            encode("2099-01-02T00:00:00Z"),
            encode("2099-01-04T00:00:00+00:00")
        ))
        .await;
    let ids: Vec<&str> = window.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["b", "c"]);
    let empty = h.get("/v1/tenants/nobody/events").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.body, json!({ "events": [], "next_cursor": null }));

    for (query, code) in [
        ("status=sleeping", "invalid_query"),
        ("limit=0", "invalid_query"),
        ("limit=1001", "invalid_query"),
        ("limit=ten", "invalid_query"),
        ("from=yesterday", "invalid_time"),
        ("cursor=zz", "invalid_cursor"),
        ("colour=red", "invalid_query"),
    ] {
        let answer = h.get(&format!("/v1/tenants/acme/events?{query}")).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, code);
    }
    h.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_and_methods_use_the_envelope() {
    let h = Harness::start().await;
    assert_error(&h.get("/v1/nope").await, StatusCode::NOT_FOUND, "not_found");
    assert_error(&h.get("/v1").await, StatusCode::NOT_FOUND, "not_found");
    assert_error(
        &h.post("/v1/tenants", &json!({})).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    assert_error(
        &h.send(Method::PATCH, "/v1/tenants/acme/events/e", Some(&json!({})))
            .await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    let payload_time = h.get("/v1/tenants/acme/events/e/attempts/more").await;
    assert_error(&payload_time, StatusCode::NOT_FOUND, "not_found");
    h.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_event_is_visible_in_v1_but_not_found_in_bigben() {
    let h = Harness::start().await;
    h.put("/v1/tenants/acme", &log_sink()).await;
    h.put(
        "/v1/tenants/acme/events/gone",
        &json!({ "deliver_at": FUTURE }),
    )
    .await;
    h.delete("/v1/tenants/acme/events/gone").await;
    let view = h.get("/v1/tenants/acme/events/gone").await;
    assert_eq!(view.body["status"], "cancelled");
    assert_eq!(
        h.event("acme", "gone").await.unwrap().status,
        EventStatus::Cancelled
    );
    let find = h.get("/events/find?tenant=acme&id=gone").await;
    assert_eq!(find.status, StatusCode::NOT_FOUND);
    h.shutdown().await;
}

#[tokio::test]
async fn batch_items_may_carry_a_delay_or_a_debounce() {
    use belfry_core::{Clock, Timestamp};
    let h = Harness::start().await;
    h.put("/v1/tenants/acme", &log_sink()).await;
    let instant = |view: &Value| {
        Timestamp::parse_rfc3339(view["deliver_at"].as_str().unwrap())
            .unwrap()
            .as_millis()
    };
    let before = belfry_clock::SystemClock.now().as_millis();
    let answer = h
        .post(
            "/v1/tenants/acme/events",
            &json!({"events": [
                {"id": "later", "delay_ms": 3_600_000},
                {"id": "bounced", "debounce": {"delay_ms": 60_000, "max_wait_ms": 600_000}},
                {"id": "both", "delay_ms": 1, "deliver_at": "2099-01-31T04:00:30Z"},
                {"id": "neither"},
            ]}),
        )
        .await;
    let after = belfry_clock::SystemClock.now().as_millis();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let outcomes: Vec<&str> = answer.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["created", "created", "rejected", "rejected"]);
    let later = h.get("/v1/tenants/acme/events/later").await.body;
    assert!((before + 3_600_000..=after + 3_600_000).contains(&instant(&later)));
    assert!(later.get("debounce_since").is_none(), "{later}");
    let bounced = h.get("/v1/tenants/acme/events/bounced").await.body;
    let since = Timestamp::parse_rfc3339(bounced["debounce_since"].as_str().unwrap())
        .unwrap()
        .as_millis();
    assert!((before..=after).contains(&since), "{bounced}");
    assert_eq!(instant(&bounced), since + 60_000);
}
