//! `/health/live` and `/health/ready` on the real router, engine and
//! embedded store; outages come from the fault switch in `common`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use belfry_api::{Auth, AuthOptions};
use belfry_clock::SystemClock;
use belfry_core::Clock;
use belfry_core::auth::{ApiKey, KeySecret, Role};
use belfry_store::StoreError;
use common::{Answer, FaultScope, Harness};
use serde_json::json;

/// Longer than the readiness probe's reuse (1 s) and timeout (2 s).
const SETTLE: Duration = Duration::from_secs(10);

/// Polls `/health/ready` until it answers `status`; returns that answer.
async fn ready_becomes(h: &Harness, status: StatusCode) -> Answer {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let answer = h.get("/health/ready").await;
        if answer.status == status {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/health/ready never answered {status}: last {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn live_and_ready_answer_200_on_a_healthy_node() {
    let h = Harness::start().await;
    let live = h.get("/health/live").await;
    assert_eq!(live.status, StatusCode::OK, "{live:?}");
    assert_eq!(live.body, json!({ "status": "live" }));
    let ready = ready_becomes(&h, StatusCode::OK).await;
    assert_eq!(ready.body, json!({ "status": "ready" }));
    assert!(
        ready
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/json")),
        "{ready:?}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn health_routes_need_no_key_where_every_other_route_does() {
    let mut h = Harness::start().await;
    // A key exists and the listener is not loopback: nothing runs open.
    let secret = KeySecret::generate().unwrap();
    let key = ApiKey::new(&secret, None, Role::Admin, SystemClock.now(), None).unwrap();
    assert!(h.store.put_api_key(key).await.unwrap());
    let mut state = h.state.clone();
    state.auth = Arc::new(Auth::new(
        AuthOptions::default(),
        h.store.clone(),
        "10.1.2.3:8080".parse().unwrap(),
        Arc::new(SystemClock),
    ));
    h.app = belfry_api::router(state);

    assert_eq!(
        h.get("/v1/tenants").await.status,
        StatusCode::UNAUTHORIZED,
        "the node must require keys for this test to mean anything"
    );
    assert_eq!(h.get("/health/live").await.status, StatusCode::OK);
    ready_becomes(&h, StatusCode::OK).await;
    h.shutdown().await;
}

#[tokio::test]
async fn ready_is_503_during_a_store_outage_and_200_after_it() {
    let h = Harness::start().await;
    h.register_log("acme").await;
    ready_becomes(&h, StatusCode::OK).await;

    // What the store says must not reach the body.
    h.faults.set(
        FaultScope::ClientCalls,
        StoreError::Unavailable("connection to 10.9.9.9:5432 refused (secret-detail)".into()),
    );
    let down = ready_becomes(&h, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(down.body["status"], "not_ready", "{down:?}");
    assert_eq!(down.body["reason"], "store_unavailable", "{down:?}");
    let text = down.body.to_string();
    for leak in ["10.9.9.9", "secret-detail", "acme"] {
        assert!(!text.contains(leak), "{leak} leaked: {text}");
    }
    // Liveness does not depend on the store.
    assert_eq!(h.get("/health/live").await.status, StatusCode::OK);

    h.faults.clear();
    let back = ready_becomes(&h, StatusCode::OK).await;
    assert_eq!(back.body, json!({ "status": "ready" }));
    h.shutdown().await;
}

#[tokio::test]
async fn ready_waits_for_the_partitions_first_window_page() {
    let h = Harness::with_fault_from_start(
        FaultScope::DuePages,
        StoreError::Unavailable("due index unreadable".into()),
    )
    .await;
    // Partitions keep failing to load: not ready, however long we ask.
    for _ in 0..5 {
        let answer = h.get("/health/ready").await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
        assert_eq!(answer.body["reason"], "partitions_loading", "{answer:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(h.get("/health/live").await.status, StatusCode::OK);
    let loaded = h.state.engine.partitions().loaded();
    assert!(loaded.owned > 0 && loaded.loaded == 0, "{loaded:?}");

    h.faults.clear();
    ready_becomes(&h, StatusCode::OK).await;
    assert!(h.state.engine.partitions().loaded().all());
    h.shutdown().await;
}

#[tokio::test]
async fn an_outage_reads_store_unavailable_while_partitions_also_cannot_load() {
    // Down from the start: the partitions never load and the store does
    // not answer; the cause to report is the store.
    let h = Harness::with_fault_from_start(
        FaultScope::Everything,
        StoreError::Unavailable("connection refused".into()),
    )
    .await;
    let loaded = h.state.engine.partitions().loaded();
    assert!(!loaded.all(), "{loaded:?}");
    let down = ready_becomes(&h, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(down.body["reason"], "store_unavailable", "{down:?}");

    h.faults.clear();
    ready_becomes(&h, StatusCode::OK).await;
    h.shutdown().await;
}
