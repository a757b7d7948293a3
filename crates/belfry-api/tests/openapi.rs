//! `GET /openapi.json`: served without a key, OpenAPI 3.1, and it covers
//! exactly the routes the router serves.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use axum::http::{Method, StatusCode};
use common::Harness;
use serde_json::Value;

/// Every route of the router (method, path template). A new route must be
/// added here and documented; the test fails until both are done.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/ping"),
    ("get", "/health/live"),
    ("get", "/health/ready"),
    ("get", "/openapi.json"),
    ("get", "/events/cluster"),
    ("post", "/events/tenant/register"),
    ("get", "/events/tenants"),
    ("post", "/events/schedule"),
    ("get", "/events/find"),
    ("post", "/events/dryrun"),
    ("post", "/cron"),
    ("get", "/cron/{tenant}/{id}"),
    ("delete", "/cron/{tenant}/{id}/{type}"),
    ("get", "/v1/tenants"),
    ("get", "/v1/tenants/{tenant}"),
    ("put", "/v1/tenants/{tenant}"),
    ("delete", "/v1/tenants/{tenant}"),
    ("post", "/v1/tenants/{tenant}/signing-secrets/rotate"),
    ("post", "/v1/tenants/{tenant}/pause"),
    ("post", "/v1/tenants/{tenant}/resume"),
    ("get", "/v1/tenants/{tenant}/events"),
    ("post", "/v1/tenants/{tenant}/events"),
    ("get", "/v1/tenants/{tenant}/events/{id}"),
    ("put", "/v1/tenants/{tenant}/events/{id}"),
    ("delete", "/v1/tenants/{tenant}/events/{id}"),
    ("get", "/v1/tenants/{tenant}/events/{id}/attempts"),
    ("post", "/v1/tenants/{tenant}/events/{id}/redrive"),
    ("post", "/v1/tenants/{tenant}/events/{id}/delete"),
    ("get", "/v1/tenants/{tenant}/schedules"),
    ("get", "/v1/tenants/{tenant}/schedules/{id}"),
    ("put", "/v1/tenants/{tenant}/schedules/{id}"),
    ("delete", "/v1/tenants/{tenant}/schedules/{id}"),
    ("post", "/v1/tenants/{tenant}/schedules/{id}/pause"),
    ("post", "/v1/tenants/{tenant}/schedules/{id}/resume"),
    ("get", "/v1/tenants/{tenant}/schedules/{id}/occurrences"),
    ("get", "/v1/cron/preview"),
    ("post", "/v1/bulk-actions"),
    ("get", "/v1/bulk-actions"),
    ("get", "/v1/bulk-actions/{id}"),
    ("post", "/v1/bulk-actions/{id}/cancel"),
    ("post", "/v1/tenants/{tenant}/leases"),
    ("post", "/v1/tenants/{tenant}/leases/complete"),
    ("post", "/v1/leases/{lease_id}/heartbeat"),
    ("post", "/v1/leases/{lease_id}/complete"),
    ("post", "/v1/leases/{lease_id}/fail"),
    ("post", "/v1/leases/{lease_id}/release"),
    ("get", "/v1/cluster"),
    ("get", "/v1/keys"),
    ("post", "/v1/keys"),
    ("delete", "/v1/keys/{id}"),
    ("get", "/v1/audit"),
    ("get", "/metrics"),
    ("get", "/v1/whoami"),
    ("get", "/ui"),
    ("get", "/ui/{asset}"),
];

async fn document(h: &Harness) -> Value {
    let answer = h.get("/openapi.json").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    answer.body
}

#[tokio::test]
async fn the_document_is_openapi_3_1_and_documents_exactly_the_routes() {
    let h = Harness::start().await;
    let doc = document(&h).await;
    if let Ok(path) = std::env::var("BELFRY_OPENAPI_DUMP") {
        std::fs::write(path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    }
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        doc["openapi"]
    );
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.push((method.clone(), path.clone()));
        }
    }
    documented.sort();
    let mut expected: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    expected.sort();
    assert_eq!(documented, expected);

    // Every documented route is served: the router's fallback (404
    // not_found / 405) never answers it.
    for (method, path) in ROUTES {
        let concrete = path
            .replace("{tenant}", "acme")
            .replace("{id}", "x")
            .replace("{lease_id}", "x")
            .replace("{type}", "UNIX")
            .replace("{asset}", "app.js");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let answer = h.send(method.clone(), &concrete, None).await;
        assert_ne!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {concrete}"
        );
        let fallback = answer.body["error"]["code"] == "not_found"
            || answer.body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no route for"));
        assert!(!fallback, "{method} {concrete}: {answer:?}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn the_document_declares_bearer_keys_error_envelopes_and_links() {
    let h = Harness::start().await;
    let doc = document(&h).await;
    let scheme = &doc["components"]["securitySchemes"]["api_key"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    for public in [
        "/ping",
        "/health/live",
        "/health/ready",
        "/openapi.json",
        "/ui",
        "/ui/{asset}",
    ] {
        assert_eq!(
            doc["paths"][public]["get"]["security"],
            serde_json::json!([{}]),
            "{public} needs no key"
        );
    }
    let schemas = &doc["components"]["schemas"];
    assert!(schemas["V1Error"]["properties"]["error"].is_object());
    // A pull tenant's defaults and declared queues (`docs/pull.md`).
    let sink = &schemas["Sink"]["properties"];
    assert_eq!(
        sink["backoff"]["oneOf"][1]["$ref"], "#/components/schemas/Backoff",
        "{sink}"
    );
    assert_eq!(sink["queues"]["items"]["type"], "string", "{sink}");
    assert_eq!(sink["queues"]["maxItems"], 32, "{sink}");
    assert_eq!(sink["max_attempts"]["maximum"], 1000, "{sink}");
    assert!(schemas["BigBenError"]["properties"]["message"].is_object());
    let put_event = &doc["paths"]["/v1/tenants/{tenant}/events/{id}"]["put"]["responses"]["201"];
    assert_eq!(put_event["links"]["GetEvent"]["operationId"], "get_event");
    assert_eq!(
        put_event["links"]["CancelEvent"]["parameters"]["id"],
        "$request.path.id"
    );
    // BigBen's schedule takes an array of EventRequests.
    let schedule_body = &doc["paths"]["/events/schedule"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"];
    assert_eq!(schedule_body["type"], "array", "{schedule_body}");
    // … and answers 400 with the per-item answers when all are REJECTED.
    let refusal = &doc["paths"]["/events/schedule"]["post"]["responses"]["400"]["content"]["application/json"]
        ["schema"]["oneOf"];
    assert_eq!(refusal[0]["type"], "array", "{refusal}");
    // The shared error answers (`V1Errors`) are listed on every route that
    // names them, with the error envelope.
    let rotate = &doc["paths"]["/v1/tenants/{tenant}/signing-secrets/rotate"]["post"]["responses"];
    for status in ["400", "401", "403", "404", "429", "500", "503"] {
        assert_eq!(
            rotate[status]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/V1Error",
            "{status}: {rotate}"
        );
    }
    // Every operationId a link names exists.
    let mut operation_ids = Vec::new();
    let mut targets = Vec::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for operation in item.as_object().unwrap().values() {
            operation_ids.push(operation["operationId"].as_str().unwrap().to_string());
            for response in operation["responses"].as_object().unwrap().values() {
                if let Some(links) = response["links"].as_object() {
                    for link in links.values() {
                        targets.push(link["operationId"].as_str().unwrap().to_string());
                    }
                }
            }
        }
    }
    assert!(targets.len() >= 10, "{targets:?}");
    for target in targets {
        assert!(operation_ids.contains(&target), "no operation {target}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn the_document_needs_no_key_where_keys_are_required() {
    let mut h = Harness::start().await;
    let secret = belfry_core::auth::KeySecret::generate().unwrap();
    let key = belfry_core::auth::ApiKey::new(
        &secret,
        None,
        belfry_core::auth::Role::Admin,
        belfry_core::Timestamp::from_millis(0),
        None,
    )
    .unwrap();
    assert!(h.store.put_api_key(key).await.unwrap());
    let mut state = h.state.clone();
    state.auth = std::sync::Arc::new(belfry_api::Auth::new(
        belfry_api::AuthOptions::default(),
        h.store.clone(),
        "10.1.2.3:8080".parse().unwrap(),
        std::sync::Arc::new(belfry_clock::SystemClock),
    ));
    h.app = belfry_api::router(state);
    assert_eq!(h.get("/v1/tenants").await.status, StatusCode::UNAUTHORIZED);
    document(&h).await;
    h.shutdown().await;
}
