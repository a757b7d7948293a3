//! Webhook signing secrets (shown once, rotated with an overlap, signing
//! real deliveries) and the egress policy as a client sees it: refused
//! deliveries in the attempt history with `egress_blocked`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use belfry_core::{SigningSecrets, Timestamp};
use belfry_sinks::signing::Signer;
use belfry_testkit::{Receiver, RecordedRequest};
use common::{DEADLINE, Harness, from_now};
use serde_json::{Value, json};

fn http_sink(url: &str) -> Value {
    json!({ "sink": { "type": "http", "url": url } })
}

async fn wait_for_status(h: &Harness, path: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let answer = h.get(path).await;
        if answer.body["status"] == status {
            return answer.body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {status}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `v1,` signature `secret` gives a received request.
fn signature(secret: &str, request: &RecordedRequest) -> String {
    Signer::new(&SigningSecrets::new(secret.to_string()))
        .unwrap()
        .signature(
            request.header("webhook-id").unwrap(),
            request.header("webhook-timestamp").unwrap(),
            &request.body,
            Timestamp::from_millis(0),
        )
}

#[tokio::test]
async fn the_secret_is_answered_at_registration_only() {
    let h = Harness::start().await;
    let created = h
        .put("/v1/tenants/acme", &http_sink("http://svc.internal/hook"))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let secret = created.body["signing_secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{secret}");

    // Re-registering (e.g. a new URL) keeps the secret and does not show it.
    let replaced = h
        .put("/v1/tenants/acme", &http_sink("http://svc.internal/other"))
        .await;
    assert_eq!(replaced.status, StatusCode::OK);
    assert!(
        replaced.body.get("signing_secret").is_none(),
        "{replaced:?}"
    );
    for path in ["/v1/tenants/acme", "/v1/tenants", "/events/tenants"] {
        let answer = h.get(path).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(
            !answer.body.to_string().contains("whsec_"),
            "{path}: {answer:?}"
        );
    }
    // Another tenant gets its own.
    let other = h
        .put("/v1/tenants/beta", &http_sink("http://svc.internal/b"))
        .await;
    assert_ne!(other.body["signing_secret"], created.body["signing_secret"]);
    h.shutdown().await;
}

#[tokio::test]
async fn rotation_answers_the_new_secret_and_the_old_ones_expiry() {
    let h = Harness::start().await;
    let created = h
        .put("/v1/tenants/acme", &http_sink("http://svc.internal/hook"))
        .await;
    let first = created.body["signing_secret"].as_str().unwrap().to_string();

    let rotated = h
        .post("/v1/tenants/acme/signing-secrets/rotate", &json!({}))
        .await;
    assert_eq!(rotated.status, StatusCode::OK, "{rotated:?}");
    let second = rotated.body["signing_secret"].as_str().unwrap();
    assert!(second.starts_with("whsec_"));
    assert_ne!(second, first);
    assert_eq!(rotated.body["tenant"], "acme");
    let expires = rotated.body["old_secret_expires_at"].as_str().unwrap();
    let expires = Timestamp::parse_rfc3339(expires).unwrap();
    let in_a_day = Timestamp::parse_rfc3339(&from_now(24 * 3600 * 1000)).unwrap();
    assert!(
        expires.as_millis().abs_diff(in_a_day.as_millis()) < 60_000,
        "the default overlap is a day"
    );

    let now = h
        .post(
            "/v1/tenants/acme/signing-secrets/rotate",
            &json!({ "grace_period_secs": 0 }),
        )
        .await;
    assert_eq!(now.status, StatusCode::OK);
    assert!(now.body["old_secret_expires_at"].is_null());

    for (body, code) in [
        (json!({ "grace_period_secs": "soon" }), "invalid_request"),
        (json!({ "grace_period_secs": -1 }), "invalid_request"),
        (
            json!({ "grace_period_secs": 99_999_999 }),
            "invalid_request",
        ),
        (json!({ "extra": 1 }), "invalid_request"),
    ] {
        let answer = h
            .post("/v1/tenants/acme/signing-secrets/rotate", &body)
            .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(answer.body["error"]["code"], code);
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains("u64") && !message.contains("whsec_"),
            "{message}"
        );
    }
    let missing = h
        .post("/v1/tenants/ghost/signing-secrets/rotate", &json!({}))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["code"], "tenant_not_found");
    h.shutdown().await;
}

#[tokio::test]
async fn deliveries_are_signed_and_carry_both_signatures_during_a_rotation() {
    let receiver = Receiver::start().await;
    let h = Harness::start().await;
    let created = h
        .put("/v1/tenants/acme", &http_sink(&receiver.url("/hook")))
        .await;
    let old = created.body["signing_secret"].as_str().unwrap().to_string();

    h.put(
        "/v1/tenants/acme/events/before",
        &json!({ "deliver_at": from_now(-5), "payload": "{\"n\":1}" }),
    )
    .await;
    wait_for_status(&h, "/v1/tenants/acme/events/before", "delivered").await;
    let rotated = h
        .post("/v1/tenants/acme/signing-secrets/rotate", &json!({}))
        .await;
    let new = rotated.body["signing_secret"].as_str().unwrap().to_string();
    let during = h
        .put(
            "/v1/tenants/acme/events/during",
            &json!({ "deliver_at": from_now(-5), "payload": "{\"n\":2}" }),
        )
        .await;
    wait_for_status(&h, "/v1/tenants/acme/events/during", "delivered").await;

    let seen = receiver.wait_for_count(2, DEADLINE).await.unwrap();
    let before = &seen[0];
    assert_eq!(
        before.header("webhook-signature").unwrap(),
        signature(&old, before)
    );
    let after = &seen[1];
    assert_eq!(
        after.header("webhook-id").unwrap(),
        during.body["version"].as_str().unwrap(),
        "the id is the idempotency key"
    );
    assert_eq!(after.header("webhook-id"), after.header("idempotency-key"));
    assert_eq!(
        after.header("webhook-signature").unwrap(),
        format!("{} {}", signature(&new, after), signature(&old, after))
    );
    let timestamp: i64 = after.header("webhook-timestamp").unwrap().parse().unwrap();
    let now = Timestamp::parse_rfc3339(&from_now(0)).unwrap().as_millis() / 1000;
    assert!((now - timestamp).abs() < 60, "{timestamp} vs {now}");
    h.shutdown().await;
}

#[tokio::test]
async fn forbidden_addresses_are_refused_at_registration() {
    // Always refused, whatever the policy (this harness runs `internal`):
    // a 400 naming the address and its range, and nothing stored. At
    // delivery the sinks refuse them too (names resolving there).
    let h = Harness::start().await;
    for (tenant, url, address) in [
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254",
        ),
        ("link-local", "http://[fe80::1]:8080/hook", "fe80::1"),
        (
            "mapped",
            "http://[::ffff:169.254.169.254]/",
            "169.254.169.254",
        ),
    ] {
        let registered = h
            .put(&format!("/v1/tenants/{tenant}"), &http_sink(url))
            .await;
        assert_eq!(registered.status, StatusCode::BAD_REQUEST, "{registered:?}");
        assert_eq!(registered.body["error"]["code"], "invalid_sink");
        let message = registered.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("egress_blocked: {address} is ")),
            "{message}"
        );
        let shown = h.get(&format!("/v1/tenants/{tenant}")).await;
        assert_eq!(shown.status, StatusCode::NOT_FOUND);
    }
    h.shutdown().await;
}

#[tokio::test]
async fn webhook_urls_and_headers_are_checked_at_registration() {
    let h = Harness::start().await;
    let long = format!("http://svc.internal/{}", "a".repeat(2048));
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("x-h{i}"), json!("v"))).collect();
    for (sink, code) in [
        (json!({ "type": "http", "url": long }), "invalid_sink"),
        (
            json!({ "type": "http", "url": "http://@/x" }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://h:99999/" }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://h:0/" }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "gopher://h/" }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://user:hunter2@/x" }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://h/", "headers": many }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://h/", "headers": { "x": "v".repeat(5000) } }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://h/", "headers": { "x": 1 } }),
            "invalid_sink",
        ),
        (json!({ "type": "http", "url": 5 }), "invalid_sink"),
        (
            json!({ "type": "http", "url": "http://h/", "timeout_ms": "soon" }),
            "invalid_sink",
        ),
        (
            json!({ "type": "http", "url": "http://h/", "timeout_ms": -1 }),
            "invalid_sink",
        ),
    ] {
        let answer = h.put("/v1/tenants/t", &json!({ "sink": sink })).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{sink}: {answer:?}");
        assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        for word in ["u64", "expected", "invalid type", "hunter2"] {
            assert!(!message.contains(word), "{message}");
        }
        assert!(message.len() < 300, "{message}");
    }
    // BigBen's registration validates the same way.
    let answer = h
        .post(
            "/events/tenant/register",
            &json!({ "tenant": "t", "type": "HTTP", "props": { "url": "http://h:99999/" } }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(h.get("/v1/tenants/t").await.status, StatusCode::NOT_FOUND);
    h.shutdown().await;
}

/// A BigBen registration's status, `webhook-signing-secret` header and
/// body.
async fn bigben_register(h: &Harness, body: &Value) -> (StatusCode, Option<String>, Value) {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = Request::post("/events/tenant/register")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = h.app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let secret = response
        .headers()
        .get("webhook-signing-secret")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, secret, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn bigben_registration_answers_the_secret_in_a_header_and_keeps_its_body() {
    let receiver = Receiver::start().await;
    let h = Harness::start().await;
    let config = json!({ "tenant": "TenantB/ProgramB/EnvC", "type": "HTTP",
                         "props": { "url": receiver.url("/bigben") } });
    let (status, secret, body) = bigben_register(&h, &config).await;
    assert_eq!(status, StatusCode::OK);
    let secret = secret.expect("a new tenant's secret");
    assert!(secret.starts_with("whsec_"));
    // BigBen's shape: tenant -> ProcessorConfig, nothing more.
    assert_eq!(
        body,
        json!({ "TenantB/ProgramB/EnvC": { "tenant": "TenantB/ProgramB/EnvC", "type": "HTTP",
                 "props": { "url": receiver.url("/bigben"), "headers": {} } } })
    );
    let (_, again, _) = bigben_register(&h, &config).await;
    assert_eq!(again, None, "shown once");

    // Its deliveries are signed with it.
    let scheduled = h
        .post(
            "/events/schedule",
            &json!([{ "id": "e1", "eventTime": from_now(-5), "tenant": "TenantB/ProgramB/EnvC",
                      "payload": "{}" }]),
        )
        .await;
    assert_eq!(scheduled.status, StatusCode::OK, "{scheduled:?}");
    let seen = receiver.wait_for_count(1, DEADLINE).await.unwrap();
    assert_eq!(
        seen[0].header("webhook-signature").unwrap(),
        signature(&secret, &seen[0])
    );
    h.shutdown().await;
}
