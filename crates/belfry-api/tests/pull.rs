//! Pull tenants over the API: their registration (`docs/pull.md`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use axum::http::StatusCode;
use common::{FaultScope, Harness};
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
    // A default back-off (omitted fields as for an event's) and declared
    // queues, through either API.
    let full = h
        .put(
            "/v1/tenants/jobs",
            &json!({ "sink": { "type": "pull", "backoff": { "initial_delay_ms": 250 },
                               "queues": ["emails", "sms"] } }),
        )
        .await;
    assert_eq!(full.status, StatusCode::OK, "{full:?}");
    let backoff = json!({ "initial_delay_ms": 250, "multiplier": 2.0, "max_delay_ms": 3600000 });
    assert_eq!(
        h.get("/v1/tenants/jobs").await.body["sink"],
        json!({ "type": "pull", "backoff": backoff, "queues": ["emails", "sms"] })
    );
    assert_eq!(
        h.get("/events/tenants").await.body["jobs"]["props"],
        json!({ "max_attempts": 20, "backoff": backoff, "queues": ["emails", "sms"] })
    );
    let bigben = h
        .post(
            "/events/tenant/register",
            &json!({ "tenant": "jobs2", "type": "PULL",
                     "props": { "max_attempts": 4, "backoff": backoff, "queues": ["sms"] } }),
        )
        .await;
    assert_eq!(bigben.status, StatusCode::OK, "{bigben:?}");
    assert_eq!(
        h.get("/v1/tenants/jobs2").await.body["sink"],
        json!({ "type": "pull", "max_attempts": 4, "backoff": backoff, "queues": ["sms"] })
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
            json!({ "type": "http", "url": "http://a/", "max_attempts": 0 }),
            "max_attempts",
        ),
        (
            json!({ "type": "pull", "backoff": { "multiplier": 0.5 } }),
            "backoff.multiplier",
        ),
        (
            json!({ "type": "pull", "backoff": { "initial_delay_ms": 0 } }),
            "backoff.initial_delay_ms",
        ),
        (
            json!({ "type": "pull", "backoff": { "initial_delay_ms": 500, "max_delay_ms": 100 } }),
            "backoff.max_delay_ms",
        ),
        (
            json!({ "type": "pull", "backoff": { "jitter": 1 } }),
            "jitter",
        ),
        (json!({ "type": "pull", "backoff": 100 }), "backoff"),
        (json!({ "type": "pull", "queues": [] }), "queues"),
        (json!({ "type": "pull", "queues": "emails" }), "queues"),
        (json!({ "type": "pull", "queues": ["a b"] }), "queues"),
        (json!({ "type": "pull", "queues": [7] }), "queues"),
        (
            json!({ "type": "pull", "queues": ["a", "b", "a"] }),
            "queues",
        ),
        (
            json!({ "type": "pull", "queues": (0..33).map(|i| format!("q{i}")).collect::<Vec<_>>() }),
            "queues",
        ),
        (
            json!({ "type": "kafka", "topic": "t", "queues": ["a"] }),
            "queues",
        ),
        (
            json!({ "type": "builtin", "processor": "log", "backoff": {} }),
            "backoff",
        ),
    ] {
        let answer = h.put("/v1/tenants/new", &json!({ "sink": sink })).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(answer.body["error"]["code"], "invalid_sink", "{answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message} names {field}");
    }
    for (props, field) in [
        (json!({ "topic": "x" }), "props.topic"),
        (json!({ "queues": [] }), "queues"),
        (
            json!({ "backoff": { "multiplier": 101 } }),
            "props.backoff.multiplier",
        ),
    ] {
        let bigben = h
            .post(
                "/events/tenant/register",
                &json!({ "tenant": "new", "type": "PULL", "props": props }),
            )
            .await;
        assert_eq!(bigben.status, StatusCode::BAD_REQUEST, "{bigben:?}");
        let message = bigben.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{bigben:?} names {field}");
    }
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

/// Claims `tenant`'s due events as `body` says (a worker id is added).
async fn claim(h: &Harness, tenant: &str, body: serde_json::Value) -> Vec<serde_json::Value> {
    let mut body = body;
    body["worker_id"] = json!("w-1");
    let answer = h.post(&format!("/v1/tenants/{tenant}/leases"), &body).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body["leases"].as_array().unwrap().clone()
}

fn instant(value: &serde_json::Value) -> belfry_core::Timestamp {
    belfry_core::Timestamp::parse_rfc3339(value.as_str().unwrap()).unwrap()
}

fn now() -> belfry_core::Timestamp {
    use belfry_core::Clock;
    belfry_clock::SystemClock.now()
}

/// A pull tenant `jobs` with one event `e1` due at once.
async fn one_due_event(h: &Harness) {
    let tenant = h
        .put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    assert_eq!(tenant.status, StatusCode::CREATED, "{tenant:?}");
    let put = h
        .put(
            "/v1/tenants/jobs/events/e1",
            &json!({ "deliver_at": common::from_now(50), "payload": "work" }),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
}

async fn lease_call(
    h: &Harness,
    lease: &serde_json::Value,
    call: &str,
    body: serde_json::Value,
) -> common::Answer {
    let id = lease["lease_id"].as_str().unwrap();
    h.post(&format!("/v1/leases/{id}/{call}"), &body).await
}

#[tokio::test]
async fn a_release_counts_no_attempt_and_offers_the_event_again_after_its_delay() {
    let h = Harness::start().await;
    one_due_event(&h).await;
    let first = claim_one(&h, "jobs").await;
    assert_eq!(first["attempt"], 1);
    let released = lease_call(&h, &first, "release", json!({ "delay_ms": 1500 })).await;
    assert_eq!(released.status, StatusCode::OK, "{released:?}");
    assert_eq!(released.body["state"], "scheduled");
    let again_at = instant(&released.body["next_attempt_at"]);
    assert!(
        claim(&h, "jobs", json!({})).await.is_empty(),
        "not offered before the delay"
    );
    let second = claim_one(&h, "jobs").await;
    assert!(now() >= again_at, "offered before its delay ended");
    assert_eq!(second["event"]["id"], "e1");
    assert_eq!(second["attempt"], 1, "a release counts no attempt");
    assert_ne!(second["lease_id"], first["lease_id"]);
    let old = lease_call(&h, &first, "heartbeat", json!({})).await;
    assert_eq!(old.status, StatusCode::CONFLICT, "{old:?}");
    assert_eq!(old.body["error"]["code"], "lease_lost");
    let done = lease_call(&h, &second, "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let event = h.get("/v1/tenants/jobs/events/e1").await;
    assert_eq!(event.body["status"], "delivered", "{event:?}");
    assert_eq!(event.body["attempts"], 1, "{event:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn a_heartbeat_extends_the_lease_but_never_past_its_deadline() {
    let mut engine = belfry_engine::EngineOptions {
        shutdown_grace: std::time::Duration::from_millis(500),
        ..Default::default()
    };
    // The deadline is the event's instant plus its backlog limit.
    engine.retry.backlog_limit = std::time::Duration::from_secs(20);
    let h = Harness::with_engine_options(Default::default(), engine).await;
    one_due_event(&h).await;
    let leases = claim(&h, "jobs", json!({ "wait_ms": 20000, "lease_ms": 2000 })).await;
    let lease = &leases[0];
    let deadline = instant(&lease["deadline_at"]);
    let event_time = instant(&lease["event"]["deliver_at"]);
    assert_eq!(
        deadline,
        event_time.plus(std::time::Duration::from_secs(20))
    );
    let first_expiry = instant(&lease["lease_expires_at"]);
    let beat = lease_call(&h, lease, "heartbeat", json!({ "extend_ms": 5000 })).await;
    assert_eq!(beat.status, StatusCode::OK, "{beat:?}");
    let extended = instant(&beat.body["lease_expires_at"]);
    assert!(extended > first_expiry, "{extended:?} > {first_expiry:?}");
    assert!(extended < deadline);
    let beat = lease_call(&h, lease, "heartbeat", json!({ "extend_ms": 600000 })).await;
    assert_eq!(beat.status, StatusCode::OK, "{beat:?}");
    assert_eq!(instant(&beat.body["lease_expires_at"]), deadline, "capped");
    assert_eq!(beat.body["cancel_requested"], false);
    let done = lease_call(&h, lease, "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn an_expired_lease_is_lost_counted_and_the_event_offered_again() {
    let h = Harness::start().await;
    one_due_event(&h).await;
    let first = claim(&h, "jobs", json!({ "wait_ms": 20000, "lease_ms": 1000 })).await;
    let first = &first[0];
    assert_eq!(first["attempt"], 1);
    // Never heartbeated: it expires, then the event comes due after its
    // back-off.
    let second = claim_one(&h, "jobs").await;
    assert!(now() >= instant(&first["lease_expires_at"]));
    assert_eq!(second["event"]["id"], "e1");
    assert_eq!(second["attempt"], 2, "the expiry counted an attempt");
    for call in ["heartbeat", "complete", "release"] {
        let late = lease_call(&h, first, call, json!({})).await;
        assert_eq!(late.status, StatusCode::CONFLICT, "{call}: {late:?}");
        assert_eq!(late.body["error"]["code"], "lease_lost", "{late:?}");
    }
    let attempts = h.get("/v1/tenants/jobs/events/e1/attempts").await;
    assert_eq!(attempts.status, StatusCode::OK, "{attempts:?}");
    assert!(
        attempts.body.to_string().contains("lease_expired"),
        "{attempts:?}"
    );
    let done = lease_call(&h, &second, "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let event = h.get("/v1/tenants/jobs/events/e1").await;
    assert_eq!(event.body["status"], "delivered", "{event:?}");
    assert_eq!(event.body["attempts"], 2, "{event:?}");
    h.shutdown().await;
}

fn engine(h: &Harness) -> belfry_engine::EngineHandle {
    h.engine.as_ref().expect("the engine runs").handle()
}

/// Waits until the event is fired to the pull queue (outstanding in its
/// partition core, ready in the queue).
async fn wait_ready(h: &Harness) {
    wait_ready_entries(h, 1).await;
}

/// Waits until `n` entries are ready in the pull queue. Not the partition
/// cores' outstanding count: an entry is outstanding from when it is
/// popped, before its record is read and it reaches the queue.
async fn wait_ready_entries(h: &Harness, n: usize) {
    let engine = engine(h);
    common::wait_until("events handed to the pull queue", || {
        let engine = engine.clone();
        async move { engine.metrics_state().pull.ready == n }
    })
    .await;
}

fn lease_writes_fail(h: &Harness) {
    h.faults.set(
        FaultScope::LeaseWrites,
        belfry_store::StoreError::Unavailable("lease writes down".into()),
    );
}

/// The lease's next heartbeat says `cancel_requested` (lease writes fail
/// meanwhile: the queue answers from what it was told, not from the
/// store), and its complete and release are `lease_lost`.
async fn assert_cancel_requested(h: &Harness, lease: &serde_json::Value) {
    lease_writes_fail(h);
    let beat = lease_call(h, lease, "heartbeat", json!({ "extend_ms": 60000 })).await;
    assert_eq!(beat.status, StatusCode::OK, "{beat:?}");
    assert_eq!(beat.body["cancel_requested"], true, "{beat:?}");
    for call in ["complete", "release"] {
        let answer = lease_call(h, lease, call, json!({})).await;
        assert_eq!(answer.status, StatusCode::CONFLICT, "{call}: {answer:?}");
        assert_eq!(answer.body["error"]["code"], "lease_lost", "{answer:?}");
    }
    assert_eq!(h.faults.injected(), 0, "no lease write was needed");
    h.faults.clear();
}

#[tokio::test]
async fn a_cancelled_leased_event_asks_its_worker_to_stop_and_cannot_complete() {
    let h = Harness::start().await;
    one_due_event(&h).await;
    let lease = claim_one(&h, "jobs").await;
    let cancel = h.delete("/v1/tenants/jobs/events/e1").await;
    assert!(cancel.status.is_success(), "{cancel:?}");
    assert_eq!(
        engine(&h).pull().stats().cancelled,
        1,
        "the queue knows before the cancel is answered"
    );
    assert_cancel_requested(&h, &lease).await;
    let event = h.get("/v1/tenants/jobs/events/e1").await;
    assert_eq!(event.body["status"], "cancelled", "{event:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn a_cancel_made_through_another_node_reaches_the_queue_by_its_wake_up() {
    use belfry_core::event::{Effect, EventCommand};
    let h = Harness::start().await;
    one_due_event(&h).await;
    let lease = claim_one(&h, "jobs").await;
    // Another node's cancel: written to the shared store, then announced
    // (NOTIFY in a cluster) as a bare wake-up without the record.
    let key = belfry_core::EventKey::new(
        belfry_core::TenantName::new("jobs").unwrap(),
        belfry_core::EventId::new("e1").unwrap(),
    );
    let applied = h
        .store
        .apply(belfry_store::ApplyParams {
            commands: vec![belfry_store::KeyedCommand {
                key: key.clone(),
                command: EventCommand::Cancel,
                fence: None,
            }],
            now: now(),
            retry: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(engine(&h).pull().stats().cancelled, 0, "not told yet");
    let at = instant(&lease["due_at"]);
    engine(&h).wake(applied[0].partition, key, Effect::Disarm { at });
    let handle = engine(&h);
    common::wait_until("the queue told of the cancel", || {
        let handle = handle.clone();
        async move { handle.pull().stats().cancelled == 1 }
    })
    .await;
    assert_cancel_requested(&h, &lease).await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_ready_event_cancelled_before_any_claim_is_never_leased() {
    let h = Harness::start().await;
    one_due_event(&h).await;
    wait_ready(&h).await;
    let cancel = h.delete("/v1/tenants/jobs/events/e1").await;
    assert!(cancel.status.is_success(), "{cancel:?}");
    assert_eq!(engine(&h).pull().stats().cancelled, 1, "dropped at once");
    // The answer promises the queue dropped it (above); the partition's
    // core may learn that the entry finished a moment later.
    let handle = engine(&h);
    common::wait_until("the entry finished in its core", || {
        let handle = handle.clone();
        async move { handle.partitions().outstanding() == 0 }
    })
    .await;
    lease_writes_fail(&h);
    assert!(
        claim(&h, "jobs", json!({ "wait_ms": 300 }))
            .await
            .is_empty()
    );
    assert_eq!(h.faults.injected(), 0, "no grant was even tried");
    assert_eq!(engine(&h).pull().stats().granted, 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_moved_ready_event_is_leased_at_its_new_instant_only() {
    let h = Harness::start().await;
    one_due_event(&h).await;
    wait_ready(&h).await;
    let moved = h
        .put(
            "/v1/tenants/jobs/events/e1",
            &json!({ "deliver_at": common::from_now(1500), "payload": "work" }),
        )
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{moved:?}");
    assert_eq!(
        engine(&h).pull().stats().cancelled,
        1,
        "the old version left"
    );
    let new_instant = instant(&moved.body["deliver_at"]);
    let lease = claim_one(&h, "jobs").await;
    assert!(now() >= new_instant, "leased before its new instant");
    assert_eq!(instant(&lease["due_at"]), new_instant);
    assert_eq!(lease["attempt"], 1);
    let done = lease_call(&h, &lease, "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    assert_eq!(engine(&h).pull().stats().granted, 1, "leased once");
    h.shutdown().await;
}

#[tokio::test]
async fn a_long_poll_is_answered_when_an_event_comes_due_during_its_wait() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let started = std::time::Instant::now();
    let (leases, put) = tokio::join!(claim(&h, "jobs", json!({ "wait_ms": 20000 })), async {
        // Scheduled once the claim is (very likely) parked; either
        // order must answer the claim with the event.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        h.put(
            "/v1/tenants/jobs/events/late",
            &json!({ "deliver_at": common::from_now(700) }),
        )
        .await
    });
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0]["event"]["id"], "late");
    assert!(now() >= instant(&leases[0]["due_at"]), "never early");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "answered when due, not at the end of the wait"
    );
    h.shutdown().await;
}

/// A key stored directly (as the CLI does); returns its secret.
async fn stored_key(h: &Harness, tenant: Option<&str>, role: belfry_core::auth::Role) -> String {
    let secret = belfry_core::auth::KeySecret::generate().unwrap();
    let key = belfry_core::auth::ApiKey::new(
        &secret,
        tenant.map(|t| belfry_core::TenantName::new(t).unwrap()),
        role,
        now(),
        None,
    )
    .unwrap();
    assert!(h.store.put_api_key(key).await.unwrap());
    secret.expose().to_string()
}

#[tokio::test]
async fn only_worker_keys_of_the_tenant_and_admins_claim_and_call_leases() {
    use axum::http::Method;
    use belfry_core::auth::Role;
    let h = Harness::start().await;
    let admin = stored_key(&h, None, Role::Admin).await;
    let reader = stored_key(&h, Some("acme"), Role::Read).await;
    let writer = stored_key(&h, Some("acme"), Role::Write).await;
    let worker = stored_key(&h, Some("acme"), Role::Worker).await;
    let stranger = stored_key(&h, Some("beta"), Role::Worker).await;
    for tenant in ["acme", "beta"] {
        let put = h
            .send_as(
                Some(&admin),
                Method::PUT,
                &format!("/v1/tenants/{tenant}"),
                Some(&json!({ "sink": { "type": "pull" } })),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
        for id in ["e1", "e2"] {
            let event = h
                .send_as(
                    Some(&admin),
                    Method::PUT,
                    &format!("/v1/tenants/{tenant}/events/{id}"),
                    Some(&json!({ "deliver_at": common::from_now(0) })),
                )
                .await;
            assert_eq!(event.status, StatusCode::CREATED, "{event:?}");
        }
    }
    let claim_as = |key: &str| {
        let key = key.to_string();
        let h = &h;
        async move {
            h.send_as(
                Some(&key),
                Method::POST,
                "/v1/tenants/acme/leases",
                Some(&json!({ "worker_id": "w", "wait_ms": 20000 })),
            )
            .await
        }
    };
    for key in [&reader, &writer] {
        let answer = claim_as(key).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
    }
    let answer = claim_as(&stranger).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{answer:?}");
    let anonymous = h
        .post("/v1/tenants/acme/leases", &json!({ "worker_id": "w" }))
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{anonymous:?}");
    let mut leases = Vec::new();
    for key in [&worker, &admin] {
        let answer = claim_as(key).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body["leases"].as_array().unwrap().len(), 1);
        leases.push(
            answer.body["leases"][0]["lease_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let call_as = |key: &str, lease: &str, call: &str| {
        let (key, path) = (key.to_string(), format!("/v1/leases/{lease}/{call}"));
        let h = &h;
        async move {
            h.send_as(Some(&key), Method::POST, &path, Some(&json!({})))
                .await
        }
    };
    for key in [&reader, &writer] {
        let answer = call_as(key, &leases[0], "complete").await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
    }
    let answer = call_as(&stranger, &leases[0], "complete").await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], "lease_lost");
    // The stranger's refusal changed nothing: the owners still end them.
    let done = call_as(&worker, &leases[0], "complete").await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let done = call_as(&admin, &leases[1], "complete").await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    for id in ["e1", "e2"] {
        let other = h.event("beta", id).await.unwrap();
        assert_eq!(other.attempts, 0, "beta's events untouched: {other:?}");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn bad_lease_call_bodies_are_refused_naming_the_field_and_change_nothing() {
    let h = Harness::start().await;
    one_due_event(&h).await;
    let lease = claim_one(&h, "jobs").await;
    let before = h.snapshot(&[]).await;
    let long_result = "x".repeat(64 * 1024 + 1);
    for (call, body, field) in [
        ("heartbeat", json!({ "extend_ms": 999 }), "extend_ms"),
        (
            "heartbeat",
            json!({ "extend_ms": 43_200_001u64 }),
            "extend_ms",
        ),
        ("heartbeat", json!({ "extend_ms": -1 }), "extend_ms"),
        ("heartbeat", json!({ "extend": 5000 }), "extend"),
        ("complete", json!({ "result": long_result }), "result"),
        ("fail", json!({}), "error"),
        ("fail", json!({ "error": { "code": "a b" } }), "code"),
        (
            "fail",
            json!({ "error": { "code": "x" }, "retry_after_ms": 86_400_001u64 }),
            "retry_after_ms",
        ),
        (
            "fail",
            json!({ "error": { "code": "x", "message": "m".repeat(4097) } }),
            "message",
        ),
        ("release", json!({ "delay_ms": 86_400_001u64 }), "delay_ms"),
        ("release", json!({ "delay_ms": "soon" }), "delay_ms"),
    ] {
        let answer = lease_call(&h, &lease, call, body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{call}: {answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{call}: {message} names {field}");
    }
    let id = lease["lease_id"].as_str().unwrap();
    let not_json = h
        .raw(
            axum::http::Method::POST,
            &format!("/v1/leases/{id}/complete"),
            Some("application/json"),
            "{",
        )
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST, "{not_json:?}");
    assert_eq!(h.snapshot(&[]).await, before);
    let done = lease_call(&h, &lease, "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "the lease is intact: {done:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn a_cron_schedule_of_a_pull_tenant_produces_claimable_occurrences() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let path = "/v1/tenants/jobs/schedules/tick";
    let created = h
        .put(
            path,
            &json!({ "expression": "@every 1s", "type": "every", "payload": "tock",
                     "queue": "ticks", "max_attempts": 4, "max_age_ms": 600000,
                     "attempt_timeout_ms": 5000 }),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["queue"], "ticks", "{created:?}");
    assert_eq!(created.body["max_age_ms"], 600000, "{created:?}");
    assert_eq!(created.body["attempt_timeout_ms"], 5000, "{created:?}");
    let bad = h
        .put(
            "/v1/tenants/jobs/schedules/bad",
            &json!({ "expression": "@every 1s", "type": "every", "max_attempts": 0 }),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..2 {
        let lease = claim_one(&h, "jobs").await;
        let id = lease["event"]["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("tick@"), "{lease}");
        assert_eq!(lease["event"]["payload"], "tock");
        assert_eq!(lease["attempt"], 1);
        assert_eq!(lease["queue"], "ticks", "the schedule's queue");
        assert_eq!(lease["max_attempts"], 4, "the schedule's cap");
        let event = h.get(&format!("/v1/tenants/jobs/events/{id}")).await;
        assert_eq!(
            event.body["max_age_ms"], 600000,
            "the schedule's: {event:?}"
        );
        assert_eq!(event.body["attempt_timeout_ms"], 5000, "{event:?}");
        assert!(now() >= instant(&lease["due_at"]), "never early");
        let done = lease_call(&h, &lease, "complete", json!({})).await;
        assert_eq!(done.status, StatusCode::OK, "{done:?}");
        assert!(seen.insert(id), "each occurrence is claimed once");
    }
    let history = h.get(&format!("{path}/occurrences")).await;
    let delivered = history.body["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["status"] == "delivered")
        .count();
    assert!(delivered >= 2, "{history:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn events_name_their_queue_and_claims_take_from_theirs_in_turn() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    for (id, queue) in [
        ("a1", "alpha"),
        ("a2", "alpha"),
        ("a3", "alpha"),
        ("b1", "beta"),
    ] {
        let put = h
            .put(
                &format!("/v1/tenants/jobs/events/{id}"),
                &json!({ "deliver_at": common::from_now(0), "queue": queue }),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
        assert_eq!(put.body["queue"], queue);
    }
    let plain = h
        .put(
            "/v1/tenants/jobs/events/d1",
            &json!({ "deliver_at": common::from_now(0), "queue": "default" }),
        )
        .await;
    assert_eq!(plain.body.get("queue"), None, "the default is not shown");
    wait_ready_entries(&h, 5).await;
    let beta = claim(&h, "jobs", json!({ "max_events": 5, "queues": ["beta"] })).await;
    assert_eq!(beta.len(), 1, "{beta:?}");
    assert_eq!(beta[0]["queue"], "beta");
    assert_eq!(beta[0]["event"]["queue"], "beta");
    assert_eq!(beta[0]["event"]["id"], "b1");
    // Queues take turns: one of each before a second of alpha.
    let two = claim(&h, "jobs", json!({ "max_events": 2 })).await;
    let mut queues: Vec<&str> = two.iter().map(|l| l["queue"].as_str().unwrap()).collect();
    queues.sort_unstable();
    assert_eq!(queues, ["alpha", "default"], "{two:?}");
    assert!(
        claim(&h, "jobs", json!({ "queues": ["beta", "default"] }))
            .await
            .is_empty(),
        "nothing left in those queues"
    );
    let rest = claim(&h, "jobs", json!({ "max_events": 5, "queues": ["alpha"] })).await;
    assert_eq!(rest.len(), 2, "{rest:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn an_event_caps_its_own_attempts_and_backs_off_its_own_way() {
    let h = Harness::start().await;
    h.put(
        "/v1/tenants/jobs",
        &json!({ "sink": { "type": "pull", "max_attempts": 5 } }),
    )
    .await;
    let put = h
        .put(
            "/v1/tenants/jobs/events/once",
            &json!({ "deliver_at": common::from_now(0), "max_attempts": 1 }),
        )
        .await;
    assert_eq!(put.body["max_attempts"], 1, "{put:?}");
    let lease = claim_one(&h, "jobs").await;
    assert_eq!(lease["max_attempts"], 1);
    let failed = lease_call(&h, &lease, "fail", json!({ "error": { "code": "boom" } })).await;
    assert_eq!(failed.body["state"], "failed", "{failed:?}");
    let backoff = json!({ "initial_delay_ms": 100, "multiplier": 1.5, "max_delay_ms": 200 });
    let put = h
        .put(
            "/v1/tenants/jobs/events/quick",
            &json!({ "deliver_at": common::from_now(0), "backoff": backoff }),
        )
        .await;
    assert_eq!(put.body["backoff"], backoff, "{put:?}");
    let lease = claim_one(&h, "jobs").await;
    assert_eq!(lease["max_attempts"], 5, "the tenant's cap");
    let before = now();
    let failed = lease_call(&h, &lease, "fail", json!({ "error": { "code": "boom" } })).await;
    assert_eq!(failed.body["state"], "scheduled", "{failed:?}");
    let next = instant(&failed.body["next_attempt_at"]);
    assert!(
        next < before.plus(std::time::Duration::from_millis(1000)),
        "the event's 100 ms back-off, not the node's 1 s: {next:?} after {before:?}"
    );
    let again = claim_one(&h, "jobs").await;
    assert_eq!(again["attempt"], 2);
    h.shutdown().await;
}

/// `failed`'s `next_attempt_at`, which must come `delay` after `before`
/// at the earliest and `delay` after now at the latest.
fn assert_next_attempt_after(
    failed: &common::Answer,
    before: belfry_core::Timestamp,
    delay_ms: u64,
) {
    assert_eq!(failed.status, StatusCode::OK, "{failed:?}");
    assert_eq!(failed.body["state"], "scheduled", "{failed:?}");
    let next = instant(&failed.body["next_attempt_at"]);
    let delay = std::time::Duration::from_millis(delay_ms);
    assert!(
        next >= before.plus(delay) && next <= now().plus(delay),
        "{next:?}: {delay_ms} ms after the fail ({before:?})"
    );
}

#[tokio::test]
async fn a_tenants_default_back_off_and_cap_apply_to_events_without_their_own() {
    let h = Harness::start().await;
    // An hour: far from the node's 1 s, so the answer cannot be the node's.
    let hour = 3_600_000;
    let tenant = h
        .put(
            "/v1/tenants/jobs",
            &json!({ "sink": { "type": "pull", "max_attempts": 3,
                               "backoff": { "initial_delay_ms": hour, "multiplier": 1 } } }),
        )
        .await;
    assert_eq!(tenant.status, StatusCode::CREATED, "{tenant:?}");
    for (id, own) in [
        ("plain", json!({})),
        ("own", json!({ "backoff": { "initial_delay_ms": 60000 } })),
    ] {
        let mut body = own.clone();
        body["deliver_at"] = json!(common::from_now(0));
        let put = h.put(&format!("/v1/tenants/jobs/events/{id}"), &body).await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
        let lease = claim_one(&h, "jobs").await;
        assert_eq!(lease["event"]["id"], id);
        assert_eq!(lease["max_attempts"], 3, "the tenant's cap");
        let before = now();
        let failed = lease_call(&h, &lease, "fail", json!({ "error": { "code": "boom" } })).await;
        let expected = if id == "plain" { hour } else { 60_000 };
        assert_next_attempt_after(&failed, before, expected);
        let event = h.get(&format!("/v1/tenants/jobs/events/{id}")).await;
        assert_eq!(event.body["status"], "retrying", "{event:?}");
        assert_eq!(
            event.body["next_attempt_at"],
            failed.body["next_attempt_at"]
        );
    }

    // The tenant's defaults are read when an attempt comes due: an event
    // leased under the old ones and released gets the new ones at its
    // next lease.
    h.put(
        "/v1/tenants/jobs/events/later",
        &json!({ "deliver_at": common::from_now(0) }),
    )
    .await;
    let lease = claim_one(&h, "jobs").await;
    assert_eq!(lease["event"]["id"], "later");
    assert_eq!(lease["max_attempts"], 3);
    let changed = h
        .put(
            "/v1/tenants/jobs",
            &json!({ "sink": { "type": "pull", "max_attempts": 2,
                               "backoff": { "initial_delay_ms": 120000, "multiplier": 1 } } }),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{changed:?}");
    let released = lease_call(&h, &lease, "release", json!({})).await;
    assert_eq!(released.status, StatusCode::OK, "{released:?}");
    let lease = claim_one(&h, "jobs").await;
    assert_eq!(lease["event"]["id"], "later");
    assert_eq!(lease["attempt"], 1);
    assert_eq!(lease["max_attempts"], 2, "the tenant's current cap");
    let before = now();
    let failed = lease_call(&h, &lease, "fail", json!({ "error": { "code": "boom" } })).await;
    assert_next_attempt_after(&failed, before, 120_000);

    // The cap: with one attempt left to none, a failure is final.
    h.put(
        "/v1/tenants/jobs",
        &json!({ "sink": { "type": "pull", "max_attempts": 1 } }),
    )
    .await;
    h.put(
        "/v1/tenants/jobs/events/once",
        &json!({ "deliver_at": common::from_now(0) }),
    )
    .await;
    let lease = claim_one(&h, "jobs").await;
    assert_eq!(lease["event"]["id"], "once");
    assert_eq!(lease["max_attempts"], 1);
    let failed = lease_call(&h, &lease, "fail", json!({ "error": { "code": "boom" } })).await;
    assert_eq!(failed.body["state"], "failed", "{failed:?}");
    let event = h.get("/v1/tenants/jobs/events/once").await;
    assert_eq!(event.body["status"], "failed", "{event:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn declared_queues_refuse_events_schedules_and_claims_naming_others() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    // Named before the tenant declared its queues: kept, and still claimed
    // by a claim that names no queue.
    let legacy = h
        .put(
            "/v1/tenants/jobs/events/legacy",
            &json!({ "deliver_at": common::from_now(0), "queue": "fax" }),
        )
        .await;
    assert_eq!(legacy.status, StatusCode::CREATED, "{legacy:?}");
    let declared = h
        .put(
            "/v1/tenants/jobs",
            &json!({ "sink": { "type": "pull", "queues": ["emails", "sms"] } }),
        )
        .await;
    assert_eq!(declared.status, StatusCode::OK, "{declared:?}");
    wait_ready_entries(&h, 1).await;

    let before = h.snapshot(&["jobs"]).await;
    let refused = |answer: &common::Answer, field: &str| {
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(
            answer.body["error"]["code"], "invalid_request",
            "{answer:?}"
        );
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{field} names \"fax\"")) && message.contains("emails"),
            "{message:?} names {field} and the declared queues"
        );
    };
    let event = h
        .put(
            "/v1/tenants/jobs/events/e1",
            &json!({ "deliver_at": common::from_now(0), "queue": "fax" }),
        )
        .await;
    refused(&event, "queue");
    let schedule = h
        .put(
            "/v1/tenants/jobs/schedules/s1",
            &json!({ "expression": "@every 1s", "type": "every", "queue": "fax" }),
        )
        .await;
    refused(&schedule, "queue");
    let claim_answer = h
        .post(
            "/v1/tenants/jobs/leases",
            &json!({ "worker_id": "w", "queues": ["sms", "fax"] }),
        )
        .await;
    refused(&claim_answer, "queues");
    let batch = h
        .post(
            "/v1/tenants/jobs/events",
            &json!({ "events": [
                { "id": "b1", "deliver_at": common::from_now(60000), "queue": "fax" },
            ] }),
        )
        .await;
    assert_eq!(batch.body["results"][0]["outcome"], "rejected", "{batch:?}");
    assert_eq!(
        batch.body["results"][0]["error"]["code"], "invalid_request",
        "{batch:?}"
    );
    assert_eq!(h.snapshot(&["jobs"]).await, before, "nothing stored");

    // Declared queues and `default` (named or not) are taken.
    let batch = h
        .post(
            "/v1/tenants/jobs/events",
            &json!({ "events": [
                { "id": "b1", "deliver_at": common::from_now(0), "queue": "fax" },
                { "id": "b2", "deliver_at": common::from_now(0), "queue": "emails" },
                { "id": "b3", "deliver_at": common::from_now(0), "queue": "default" },
                { "id": "b4", "deliver_at": common::from_now(0) },
            ] }),
        )
        .await;
    let outcomes: Vec<&str> = batch.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["rejected", "created", "created", "created"],
        "{batch:?}"
    );
    let schedule = h
        .put(
            "/v1/tenants/jobs/schedules/s1",
            &json!({ "expression": "@every 1h", "type": "every", "queue": "sms",
                     "start_at": common::from_now(86_400_000) }),
        )
        .await;
    assert_eq!(schedule.status, StatusCode::CREATED, "{schedule:?}");
    wait_ready_entries(&h, 4).await;
    let emails = claim(
        &h,
        "jobs",
        json!({ "max_events": 5, "queues": ["emails", "default"] }),
    )
    .await;
    let mut ids: Vec<&str> = emails
        .iter()
        .map(|l| l["event"]["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["b2", "b3", "b4"], "{emails:?}");
    let rest = claim(&h, "jobs", json!({ "max_events": 5 })).await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0]["event"]["id"], "legacy");
    assert_eq!(rest[0]["queue"], "fax");
    h.shutdown().await;
}

#[tokio::test]
async fn bad_queue_and_attempt_fields_are_refused_naming_the_field() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let before = h.snapshot(&["jobs"]).await;
    for (fields, named) in [
        (json!({ "queue": "a b" }), "queue"),
        (json!({ "queue": "" }), "queue"),
        (json!({ "queue": "q".repeat(65) }), "queue"),
        (json!({ "max_attempts": 0 }), "max_attempts"),
        (json!({ "max_attempts": 1001 }), "max_attempts"),
        (json!({ "max_attempts": "many" }), "max_attempts"),
        (
            json!({ "backoff": { "multiplier": 0.5 } }),
            "backoff.multiplier",
        ),
        (
            json!({ "backoff": { "initial_delay_ms": 0 } }),
            "backoff.initial_delay_ms",
        ),
        (
            json!({ "backoff": { "initial_delay_ms": 500, "max_delay_ms": 100 } }),
            "backoff.max_delay_ms",
        ),
        (json!({ "backoff": { "jitter": 1 } }), "jitter"),
    ] {
        let mut body = fields.clone();
        body["deliver_at"] = json!(common::from_now(1000));
        let answer = h.put("/v1/tenants/jobs/events/bad", &body).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{fields}: {answer:?}"
        );
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{message:?} names {named}");
        let batch = h
            .post(
                "/v1/tenants/jobs/events",
                &json!({ "events": [{ "id": "bad", "deliver_at": body["deliver_at"], "queue": body.get("queue"), "max_attempts": body.get("max_attempts"), "backoff": body.get("backoff") }] }),
            )
            .await;
        assert_eq!(
            batch.body["results"][0]["outcome"], "rejected",
            "{fields}: {batch:?}"
        );
        let message = batch.body["results"][0]["error"]["message"]
            .as_str()
            .unwrap();
        assert!(message.contains(named), "{message:?} names {named}");
    }
    for (body, named) in [
        (json!({ "worker_id": "w", "queues": [] }), "queues"),
        (json!({ "worker_id": "w", "queues": ["a b"] }), "queues"),
        (json!({ "worker_id": "w", "queues": "alpha" }), "queues"),
    ] {
        let answer = h.post("/v1/tenants/jobs/leases", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{message:?} names {named}");
    }
    assert_eq!(h.snapshot(&["jobs"]).await, before);
    h.shutdown().await;
}

/// Claims until `count` leases of `tenant` are held.
async fn claim_n(h: &Harness, tenant: &str, count: usize) -> Vec<serde_json::Value> {
    let mut leases = Vec::new();
    while leases.len() < count {
        leases.extend(claim(h, tenant, json!({ "max_events": 100, "wait_ms": 20000 })).await);
    }
    leases
}

#[tokio::test]
async fn a_batch_completes_each_lease_on_its_own_and_a_bad_batch_changes_nothing() {
    let h = Harness::start().await;
    for tenant in ["jobs", "other"] {
        h.put(
            &format!("/v1/tenants/{tenant}"),
            &json!({ "sink": { "type": "pull" } }),
        )
        .await;
    }
    for (tenant, id) in [
        ("jobs", "e0"),
        ("jobs", "e1"),
        ("jobs", "e2"),
        ("other", "o1"),
    ] {
        let put = h
            .put(
                &format!("/v1/tenants/{tenant}/events/{id}"),
                &json!({ "deliver_at": common::from_now(50), "payload": "work" }),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    }
    let mut jobs = claim_n(&h, "jobs", 3).await;
    jobs.sort_by_key(|l| l["event"]["id"].as_str().unwrap().to_string());
    let other = claim_n(&h, "other", 1).await;
    let id = |lease: &serde_json::Value| lease["lease_id"].as_str().unwrap().to_string();
    let route = "/v1/tenants/jobs/leases/complete";

    let too_many: Vec<_> = (0..101)
        .map(|_| json!({ "lease_id": id(&jobs[0]) }))
        .collect();
    for (body, names) in [
        (json!({ "leases": [] }), "leases"),
        (json!({ "leases": too_many }), "leases"),
        (
            json!({ "leases": [{ "lease_id": id(&jobs[0]) }, { "lease_id": "garbage" }] }),
            "leases[1].lease_id",
        ),
        (
            json!({ "leases": [{ "lease_id": id(&jobs[0]), "result": "x".repeat(70_000) }] }),
            "leases[0].result",
        ),
    ] {
        let answer = h.post(route, &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        assert_eq!(answer.body["error"]["code"], "invalid_request");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{message} names {names}");
    }
    let unknown_field = h
        .post(
            route,
            &json!({ "leases": [{ "lease_id": id(&jobs[0]), "extra": 1 }] }),
        )
        .await;
    assert_eq!(
        unknown_field.status,
        StatusCode::BAD_REQUEST,
        "{unknown_field:?}"
    );
    let e0 = h.get("/v1/tenants/jobs/events/e0").await;
    assert_eq!(
        e0.body["status"], "scheduled",
        "a bad batch changed nothing: {e0:?}"
    );

    let answer = h
        .post(
            route,
            &json!({ "leases": [
                { "lease_id": id(&jobs[0]), "result": { "rows": 3 } },
                { "lease_id": id(&jobs[1]) },
                { "lease_id": id(&other[0]) },
                { "lease_id": id(&jobs[0]) },
            ] }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{answer:?}");
    assert_eq!(
        results[0],
        json!({ "lease_id": id(&jobs[0]), "state": "delivered" })
    );
    assert_eq!(
        results[1],
        json!({ "lease_id": id(&jobs[1]), "state": "delivered" })
    );
    // Another tenant's lease is as unknown as one never issued.
    assert_eq!(results[2]["lease_id"], id(&other[0]));
    assert_eq!(results[2]["error"]["code"], "lease_lost", "{answer:?}");
    // A repeat answers as the first did.
    assert_eq!(results[3]["state"], "delivered", "{answer:?}");
    for (tenant, event, status) in [
        ("jobs", "e0", "delivered"),
        ("jobs", "e1", "delivered"),
        ("jobs", "e2", "scheduled"),
        ("other", "o1", "scheduled"),
    ] {
        let found = h.get(&format!("/v1/tenants/{tenant}/events/{event}")).await;
        assert_eq!(found.body["status"], status, "{tenant}/{event}: {found:?}");
    }
    // The other tenant's lease is still held by its worker.
    let done = lease_call(&h, &other[0], "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    h.shutdown().await;
}

/// Completes answered through the lease writer: many at once go to the
/// store in few `change_leases` calls (group commit), and when one writer
/// shard's commit fails, no change of the batch reads as done; the
/// worker's repeat then completes both.
#[tokio::test]
async fn completes_are_written_in_batches_and_a_failed_shard_reads_as_unavailable() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let shard = |id: &str| {
        let key = belfry_core::EventKey::new(
            belfry_core::TenantName::new("jobs").unwrap(),
            belfry_core::EventId::new(id).unwrap(),
        );
        h.embedded.writer_shard(&key)
    };
    let ids: Vec<String> = (0..40).map(|i| format!("e{i}")).collect();
    for id in &ids {
        let put = h
            .put(
                &format!("/v1/tenants/jobs/events/{id}"),
                &json!({ "deliver_at": common::from_now(50), "payload": "work" }),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    }
    let leases = claim_n(&h, "jobs", ids.len()).await;
    let route = "/v1/tenants/jobs/leases/complete";
    let items: Vec<_> = leases
        .iter()
        .map(|l| json!({ "lease_id": l["lease_id"] }))
        .collect();
    let (calls_before, changes_before) = h.faults.lease_batches();
    let answer = h.post(route, &json!({ "leases": items })).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    for result in answer.body["results"].as_array().unwrap() {
        assert_eq!(result["state"], "delivered", "{answer:?}");
    }
    let (calls, changes) = h.faults.lease_batches();
    let (calls, changes) = (calls - calls_before, changes - changes_before);
    assert_eq!(
        changes,
        ids.len() as u64,
        "every complete went through a batch"
    );
    assert!(calls <= 4, "{changes} completes took {calls} store calls");

    // Two events of different writer shards; the first one's commit fails.
    let failing = "f-0".to_string();
    let other = (1..)
        .map(|i| format!("f-{i}"))
        .find(|id| shard(id) != shard(&failing))
        .unwrap();
    for id in [&failing, &other] {
        h.put(
            &format!("/v1/tenants/jobs/events/{id}"),
            &json!({ "deliver_at": common::from_now(50), "payload": "work" }),
        )
        .await;
    }
    let leases = claim_n(&h, "jobs", 2).await;
    let items: Vec<_> = leases
        .iter()
        .map(|l| json!({ "lease_id": l["lease_id"] }))
        .collect();
    let failing_key = belfry_core::EventKey::new(
        belfry_core::TenantName::new("jobs").unwrap(),
        belfry_core::EventId::new(&failing).unwrap(),
    );
    h.embedded.fail_commits_of(&failing_key, 1);
    let answer = h.post(route, &json!({ "leases": items.clone() })).await;
    let results = answer.body["results"].as_array().unwrap();
    for (lease, result) in leases.iter().zip(results) {
        if lease["event"]["id"] == failing.as_str() {
            assert_ne!(result["state"], "delivered", "{answer:?}");
            assert_eq!(result["error"]["code"], "store_unavailable", "{answer:?}");
        }
    }
    let found = h.get(&format!("/v1/tenants/jobs/events/{failing}")).await;
    assert_eq!(found.body["status"], "scheduled", "{found:?}");
    // The repeat: the part that did commit answers as a repeat does.
    let answer = h.post(route, &json!({ "leases": items })).await;
    for result in answer.body["results"].as_array().unwrap() {
        assert_eq!(result["state"], "delivered", "{answer:?}");
    }
    for id in [&failing, &other] {
        let found = h.get(&format!("/v1/tenants/jobs/events/{id}")).await;
        assert_eq!(found.body["status"], "delivered", "{found:?}");
    }
    h.shutdown().await;
}

/// A repeated complete, fail or release that the queue no longer
/// remembers (here it remembers nothing) is answered from the store's
/// record of its lease. While that record cannot be read, whether the
/// call was recorded is not known: `503 store_unavailable`, never
/// `lease_lost` (its worker would give up on an event it ended).
#[tokio::test]
async fn a_repeat_whose_record_cannot_be_read_is_unavailable_not_lost() {
    let engine_options = belfry_engine::EngineOptions {
        shutdown_grace: std::time::Duration::from_millis(500),
        pull: belfry_core::pull::PullConfig {
            max_remembered: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let h = Harness::with_engine_options(Default::default(), engine_options).await;
    one_due_event(&h).await;
    let lease = claim_one(&h, "jobs").await;
    let done = lease_call(&h, &lease, "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    h.faults.set(
        FaultScope::LeaseReads,
        belfry_store::StoreError::Unavailable("lease reads down".into()),
    );
    for call in ["complete", "fail", "release"] {
        let body = if call == "fail" {
            json!({ "error": { "code": "boom" } })
        } else {
            json!({})
        };
        let answer = lease_call(&h, &lease, call, body).await;
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{call}: {answer:?}"
        );
        assert_eq!(
            answer.body["error"]["code"], "store_unavailable",
            "{answer:?}"
        );
    }
    assert!(h.faults.injected() >= 3, "the record was asked for");
    h.faults.clear();
    let again = lease_call(&h, &lease, "complete", json!({})).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body["state"], "delivered", "{again:?}");
    let release = lease_call(&h, &lease, "release", json!({})).await;
    assert_eq!(release.status, StatusCode::CONFLICT, "{release:?}");
    assert_eq!(release.body["error"]["code"], "lease_lost", "{release:?}");
    h.shutdown().await;
}

/// Cluster mode over one store, without PostgreSQL: node "a" owns no
/// partition and forwards calls on leases to the owner its view names
/// (node "b", the harness's node, owning every partition at epoch 0).
struct OtherNode {
    app: axum::Router,
    owners: std::sync::Arc<Owners>,
    engine: belfry_engine::Engine,
}

/// The secret nodes "a" and "b" share.
const CLUSTER_SECRET: [u8; 32] = [7; 32];

/// Who owns every partition, as node "a" sees it (`None`: no live owner).
#[derive(Debug)]
struct Owners {
    owner: std::sync::Mutex<Option<belfry_api::PartitionOwner>>,
    peers: belfry_api::PeerAuth,
}

impl belfry_api::ClusterView for Owners {
    fn members(&self) -> Vec<belfry_api::ClusterMember> {
        Vec::new()
    }

    fn owner_of(&self, _: belfry_core::PartitionId) -> Option<belfry_api::PartitionOwner> {
        self.owner.lock().unwrap().clone()
    }

    fn peers(&self) -> Option<&belfry_api::PeerAuth> {
        Some(&self.peers)
    }
}

/// Node "b" (the harness's engine), as a cluster node accepting "a"'s
/// signed forwards.
#[derive(Debug)]
struct NodeB(belfry_api::PeerAuth);

impl belfry_api::ClusterView for NodeB {
    fn members(&self) -> Vec<belfry_api::ClusterMember> {
        Vec::new()
    }

    fn peers(&self) -> Option<&belfry_api::PeerAuth> {
        Some(&self.0)
    }
}

/// The harness's node as node "b" of a cluster with "a".
fn node_b(h: &Harness) -> axum::Router {
    belfry_api::router(belfry_api::ApiState {
        cluster: std::sync::Arc::new(NodeB(belfry_api::PeerAuth::new("b", &CLUSTER_SECRET))),
        ..h.state.clone()
    })
}

/// Node "a" joins no real cluster: nothing here coordinates.
#[derive(Debug)]
struct NoCoordinator;

fn not_here<T>() -> belfry_store::StoreResult<T> {
    Err(belfry_store::StoreError::Unavailable(
        "no coordinator in this test".into(),
    ))
}

#[async_trait::async_trait]
impl belfry_store::cluster::Coordinator for NoCoordinator {
    async fn heartbeat(
        &self,
        _: &belfry_store::cluster::NodeInfo,
        _: std::time::Duration,
    ) -> belfry_store::StoreResult<Vec<belfry_store::cluster::NodeStatus>> {
        not_here()
    }
    async fn leave(&self, _: &belfry_store::cluster::NodeId) -> belfry_store::StoreResult<()> {
        not_here()
    }
    async fn remove_dead_nodes(
        &self,
        _: std::time::Duration,
    ) -> belfry_store::StoreResult<Vec<belfry_store::cluster::NodeStatus>> {
        not_here()
    }
    async fn claim_leadership(
        &self,
        _: &belfry_store::cluster::NodeId,
        _: std::time::Duration,
    ) -> belfry_store::StoreResult<belfry_store::cluster::LeaderLease> {
        not_here()
    }
    async fn release_leadership(
        &self,
        _: &belfry_store::cluster::NodeId,
    ) -> belfry_store::StoreResult<()> {
        not_here()
    }
    async fn assign(
        &self,
        _: &belfry_store::cluster::NodeId,
        _: u64,
        _: Vec<(belfry_core::PartitionId, belfry_store::cluster::NodeId)>,
    ) -> belfry_store::StoreResult<()> {
        not_here()
    }
    async fn renew_ownership(
        &self,
        _: &belfry_store::cluster::NodeId,
        _: std::time::Duration,
    ) -> belfry_store::StoreResult<Vec<belfry_store::cluster::OwnedPartition>> {
        not_here()
    }
    async fn release_partitions(
        &self,
        _: &belfry_store::cluster::NodeId,
        _: &[(belfry_core::PartitionId, u64)],
    ) -> belfry_store::StoreResult<Vec<belfry_core::PartitionId>> {
        not_here()
    }
    async fn assignments(
        &self,
    ) -> belfry_store::StoreResult<Vec<belfry_store::cluster::PartitionAssignment>> {
        not_here()
    }
    async fn leader(
        &self,
    ) -> belfry_store::StoreResult<Option<belfry_store::cluster::LeaderLease>> {
        not_here()
    }
}

impl OtherNode {
    fn start(h: &Harness) -> OtherNode {
        use std::sync::Arc;
        let options = belfry_engine::EngineOptions {
            shutdown_grace: std::time::Duration::from_millis(500),
            ..Default::default()
        };
        let sinks = belfry_sinks::Sinks::new(Default::default()).unwrap();
        let engine = belfry_engine::Engine::start_unowned(
            options,
            h.store.clone(),
            sinks,
            Arc::new(belfry_clock::SystemClock),
        );
        engine.handle().pull().join_cluster(
            belfry_store::cluster::NodeId("a".into()),
            Arc::new(NoCoordinator),
        );
        let owners = Arc::new(Owners {
            owner: std::sync::Mutex::new(None),
            peers: belfry_api::PeerAuth::new("a", &CLUSTER_SECRET),
        });
        let state = belfry_api::ApiState {
            engine: engine.handle(),
            options: Default::default(),
            cluster: owners.clone(),
            auth: Arc::new(belfry_api::Auth::new(
                Default::default(),
                h.store.clone(),
                "127.0.0.1:8081".parse().unwrap(),
                Arc::new(belfry_clock::SystemClock),
            )),
            metrics: None,
        };
        OtherNode {
            app: belfry_api::router(state),
            owners,
            engine,
        }
    }

    /// Every partition owned by node "b" at epoch 0, reached at `url`;
    /// `None`: no live owner.
    fn owned_at(&self, url: Option<&str>) {
        *self.owners.owner.lock().unwrap() = url.map(|url| belfry_api::PartitionOwner {
            node: "b".into(),
            url: url.into(),
            epoch: 0,
        });
    }

    async fn post(&self, path: &str, body: serde_json::Value) -> common::Answer {
        let request = axum::http::Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        common::send_to(&self.app, request).await
    }

    async fn call(
        &self,
        lease: &serde_json::Value,
        call: &str,
        body: serde_json::Value,
    ) -> common::Answer {
        let id = lease["lease_id"].as_str().unwrap();
        self.post(&format!("/v1/leases/{id}/{call}"), body).await
    }

    async fn shutdown(self) {
        drop(self.app);
        self.engine.shutdown().await;
    }
}

/// Reads one HTTP/1.1 request (with a `content-length` body, as the
/// forwarding client sends) from `stream`.
async fn read_request(
    stream: &mut tokio::net::TcpStream,
) -> Option<axum::http::Request<axum::body::Body>> {
    use tokio::io::AsyncReadExt;
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = std::str::from_utf8(&buffer[..head_end]).ok()?.to_owned();
    let mut lines = head.split("\r\n").filter(|line| !line.is_empty());
    let mut first = lines.next()?.split(' ');
    let mut request = axum::http::Request::builder()
        .method(first.next()?)
        .uri(first.next()?);
    let mut length = 0;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse().ok()?;
        }
        request = request.header(name, value.trim());
    }
    while buffer.len() < head_end + length {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    request.body(axum::body::Body::from(body)).ok()
}

/// Node "b" as seen by a node forwarding to it, killed between its
/// commit and its answer: each request reaching this address is served
/// by `app` (which records the call) to the end, then the connection is
/// dropped without a byte back. Returns its URL.
async fn owner_that_never_answers(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let app = app.clone();
            tokio::spawn(async move {
                if let Some(request) = read_request(&mut stream).await {
                    common::send_to(&app, request).await;
                }
                drop(stream);
            });
        }
    });
    url
}

fn assert_not_known(answer: &common::Answer) {
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert_eq!(
        answer.body["error"]["code"], "node_unavailable",
        "{answer:?}"
    );
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("not known"), "{message}");
    assert!(!message.contains("nothing changed"), "{message}");
}

/// A worker's call reaches node "a", which forwards it to the lease's
/// owner "b"; "b" records it and dies before its answer reaches "a" (or
/// "a" sees no live owner at all). A complete, fail or release is then
/// answered from the store's record of exactly that lease, as "b" would
/// have; only what the record cannot tell (a lease still live there, a
/// heartbeat) is `503 node_unavailable`, saying the outcome is not known.
#[tokio::test]
async fn a_call_whose_owner_recorded_it_but_never_answered_is_answered_from_the_record() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    for id in ["e1", "e2", "e3", "e4"] {
        let put = h
            .put(
                &format!("/v1/tenants/jobs/events/{id}"),
                &json!({ "deliver_at": common::from_now(50) }),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    }
    let leases = claim_n(&h, "jobs", 4).await;
    let lease = |id: &str| {
        leases
            .iter()
            .find(|lease| lease["event"]["id"] == id)
            .unwrap()
            .clone()
    };
    let a = OtherNode::start(&h);
    let b = owner_that_never_answers(node_b(&h)).await;
    a.owned_at(Some(&b));

    let done = a.call(&lease("e1"), "complete", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    assert_eq!(done.body, json!({ "state": "delivered" }));
    let fail = json!({ "error": { "code": "boom" }, "retry_after_ms": 60000 });
    let failed = a.call(&lease("e2"), "fail", fail.clone()).await;
    assert_eq!(failed.status, StatusCode::OK, "{failed:?}");
    assert_eq!(failed.body["state"], "scheduled", "{failed:?}");
    let on_b = lease_call(&h, &lease("e2"), "fail", fail).await;
    assert_eq!(failed.body, on_b.body, "answered as the owner answers");
    let released = a
        .call(&lease("e3"), "release", json!({ "delay_ms": 60000 }))
        .await;
    assert_eq!(released.status, StatusCode::OK, "{released:?}");
    let on_b = lease_call(&h, &lease("e3"), "release", json!({ "delay_ms": 60000 })).await;
    assert_eq!(released.body, on_b.body, "answered as the owner answers");
    // A heartbeat extended on "b" leaves no outcome in the record.
    assert_not_known(&a.call(&lease("e4"), "heartbeat", json!({})).await);

    // No live owner: the record answers what it shows.
    a.owned_at(None);
    let again = a.call(&lease("e1"), "complete", json!({})).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_not_known(&a.call(&lease("e4"), "complete", json!({})).await);
    let batch = json!({ "leases": [
        { "lease_id": lease("e1")["lease_id"] },
        { "lease_id": lease("e4")["lease_id"] },
    ] });
    let answer = a.post("/v1/tenants/jobs/leases/complete", batch).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(results[0]["state"], "delivered", "{answer:?}");
    assert_eq!(
        results[1]["error"]["code"], "node_unavailable",
        "{answer:?}"
    );
    let e4 = h.get("/v1/tenants/jobs/events/e4").await;
    assert_eq!(e4.body["status"], "scheduled", "not completed: {e4:?}");

    // A batch item recorded on "b", whose answer never came back.
    a.owned_at(Some(&b));
    let batch = json!({ "leases": [{ "lease_id": lease("e4")["lease_id"] }] });
    let answer = a.post("/v1/tenants/jobs/leases/complete", batch).await;
    assert_eq!(
        answer.body["results"][0]["state"], "delivered",
        "{answer:?}"
    );

    for (id, status) in [
        ("e1", "delivered"),
        ("e2", "retrying"),
        ("e3", "scheduled"),
        ("e4", "delivered"),
    ] {
        let event = h.get(&format!("/v1/tenants/jobs/events/{id}")).await;
        assert_eq!(event.body["status"], status, "{event:?}");
    }
    a.shutdown().await;
    h.shutdown().await;
}

/// Nodes holding different cluster secrets (or clocks too far apart)
/// refuse each other's forwards: the worker gets what an owner that does
/// not answer gives (the store's record, else `node_unavailable`), never
/// the owner's `forward_refused`, and nothing changes on the owner.
#[tokio::test]
async fn a_forward_the_owner_refuses_counts_as_unanswered() {
    let h = Harness::start().await;
    h.put("/v1/tenants/jobs", &json!({ "sink": { "type": "pull" } }))
        .await;
    let put = h
        .put(
            "/v1/tenants/jobs/events/e1",
            &json!({ "deliver_at": common::from_now(50) }),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let lease = claim_n(&h, "jobs", 1).await.remove(0);
    let a = OtherNode::start(&h);
    let other_secret = belfry_api::router(belfry_api::ApiState {
        cluster: std::sync::Arc::new(NodeB(belfry_api::PeerAuth::new("b", &[8; 32]))),
        ..h.state.clone()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, other_secret).await });
    a.owned_at(Some(&url));

    assert_not_known(&a.call(&lease, "complete", json!({})).await);
    let e1 = h.get("/v1/tenants/jobs/events/e1").await;
    assert_ne!(e1.body["status"], "delivered", "not completed: {e1:?}");
    a.shutdown().await;
    h.shutdown().await;
}
