//! `/v1/bulk-actions` through the real router, engine and embedded store:
//! a bulk redrive of a thousand dead events, a bulk delete of 500 (and the
//! single delete's roles), cancels paged and stopped,
//! schedules paused and resumed in bulk, store failures retried, roles,
//! and bad input refused without a change.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use belfry_api::ApiOptions;
use belfry_clock::SystemClock;
use belfry_core::auth::{ApiKey, AuditAction, KeySecret, Role};
use belfry_core::{Clock, EventStatus, TenantName};
use belfry_engine::EngineOptions;
use belfry_store::{AuditPageParams, CountEventsParams, ListBulkActionsParams, StoreError};
use belfry_testkit::Receiver;
use common::{Answer, DEADLINE, FUTURE, FaultScope, Harness, from_now, wait_until};
use serde_json::{Value, json};

/// A key stored directly (as `belfry keys create` does): `(id, secret)`.
async fn key(h: &Harness, tenant: Option<&str>, role: Role) -> (String, String) {
    let secret = KeySecret::generate().unwrap();
    let key = ApiKey::new(
        &secret,
        tenant.map(|t| TenantName::new(t).unwrap()),
        role,
        SystemClock.now(),
        None,
    )
    .unwrap();
    let id = key.id.to_string();
    assert!(h.store.put_api_key(key).await.unwrap());
    (id, secret.expose().to_string())
}

async fn count(h: &Harness, tenant: &str, status: EventStatus) -> u64 {
    h.store
        .count_events(CountEventsParams {
            tenant: TenantName::new(tenant).unwrap(),
            status,
            at_most: 1_000_000,
        })
        .await
        .unwrap()
}

/// Polls the action until it is no longer running; returns its view.
async fn finished(h: &Harness, key: Option<&str>, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let answer = h
            .send_as(key, Method::GET, &format!("/v1/bulk-actions/{id}"), None)
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        if answer.body["state"] != "running" {
            return answer.body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_balanced(view: &Value) {
    let n = |field: &str| view[field].as_u64().unwrap();
    assert_eq!(
        n("matched"),
        n("succeeded") + n("skipped") + n("failed"),
        "{view}"
    );
}

/// A bodiless GET, or a POST of `{}`, with `key`.
async fn call(h: &Harness, key: String, method: Method, path: String) -> Answer {
    let body = (method == Method::POST).then(|| json!({}));
    h.send_as(Some(&key), method, &path, body.as_ref()).await
}

async fn create(h: &Harness, key: Option<&str>, body: Value) -> Answer {
    h.send_as(key, Method::POST, "/v1/bulk-actions", Some(&body))
        .await
}

/// Schedules `n` events of `tenant` in batches of 500 (ids `e0000`…).
async fn schedule(h: &Harness, key: Option<&str>, tenant: &str, n: usize, deliver_at: &str) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let events: Vec<Value> = chunk
            .iter()
            .map(|i| json!({ "id": format!("e{i:04}"), "deliver_at": deliver_at }))
            .collect();
        let answer = h
            .send_as(
                key,
                Method::POST,
                &format!("/v1/tenants/{tenant}/events"),
                Some(&json!({ "events": events })),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body["rejected"], 0, "{answer:?}");
        assert_eq!(answer.body["failed"], 0, "{answer:?}");
    }
}

/// The "done when": a tenant with 1,000 failed events, one bulk
/// redrive (five full pages and an empty one), every event delivered, and
/// the audit log names the key that did it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_failed_events_are_redriven_in_bulk_and_delivered() {
    let receiver = Receiver::start().await;
    receiver.set_default_status(422);
    let h = Harness::start().await;
    let (key_id, writer) = key(&h, Some("acme"), Role::Write).await;
    let writer = Some(writer.as_str());
    let registered = h
        .send_as(
            writer,
            Method::PUT,
            "/v1/tenants/acme",
            Some(&json!({ "sink": { "type": "http", "url": receiver.url("/hook") } })),
        )
        .await;
    assert_eq!(registered.status, StatusCode::CREATED, "{registered:?}");
    schedule(&h, writer, "acme", 1_000, &from_now(-1_000)).await;
    wait_until("1,000 failed events", || async {
        count(&h, "acme", EventStatus::Failed).await == 1_000
    })
    .await;
    assert_eq!(receiver.count(), 1_000);

    receiver.set_default_status(200);
    let created = create(
        &h,
        writer,
        json!({ "action": "redrive", "filter": { "tenant": "acme", "status": "failed" } }),
    )
    .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("bulk_"), "{id}");
    assert_eq!(
        created.headers["location"].to_str().unwrap(),
        format!("/v1/bulk-actions/{id}")
    );
    assert_eq!(created.body["action"], "redrive");
    assert_eq!(
        created.body["filter"],
        json!({ "tenant": "acme", "status": "failed" })
    );
    assert_eq!(created.body["created_by"], key_id.as_str());
    assert_eq!(created.body["finished_at"], Value::Null);

    let done = finished(&h, writer, &id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["matched"], 1_000, "{done}");
    assert_eq!(done["succeeded"], 1_000, "{done}");
    assert_eq!(done["skipped"], 0, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    assert!(done["finished_at"].is_string(), "{done}");
    assert_eq!(done["error"], Value::Null);

    wait_until("every redriven event delivered", || async {
        count(&h, "acme", EventStatus::Delivered).await == 1_000
    })
    .await;
    assert_eq!(count(&h, "acme", EventStatus::Failed).await, 0);
    assert_eq!(receiver.count(), 2_000, "each event sent once more");
    // A new version each: the redelivery carries a new idempotency key.
    let keys: std::collections::HashSet<String> = receiver
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_string())
        .collect();
    assert_eq!(keys.len(), 2_000);

    let audit = h
        .store
        .list_audit(AuditPageParams {
            after: None,
            limit: 10_000,
        })
        .await
        .unwrap();
    let entries: Vec<_> = audit
        .iter()
        .filter(|e| e.action == AuditAction::BulkActionCreated)
        .collect();
    assert_eq!(entries.len(), 1, "one entry per bulk action: {audit:?}");
    assert_eq!(entries[0].actor, key_id);
    assert_eq!(entries[0].tenant.as_ref().unwrap().as_str(), "acme");
    assert_eq!(entries[0].target.as_deref(), Some(id.as_str()));
    assert!(
        !audit.iter().any(|e| e.action == AuditAction::EventRedriven),
        "no entry per event"
    );

    // Listed, newest first; a second run finds nothing left to redrive.
    let again = create(
        &h,
        writer,
        json!({ "action": "redrive", "filter": { "tenant": "acme", "status": "failed" } }),
    )
    .await;
    let again_id = again.body["id"].as_str().unwrap().to_string();
    let empty = finished(&h, writer, &again_id).await;
    assert_eq!(
        (&empty["state"], &empty["matched"]),
        (&json!("completed"), &json!(0))
    );
    let listed = h
        .send_as(writer, Method::GET, "/v1/bulk-actions", None)
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{listed:?}");
    let ids: Vec<&str> = listed.body["bulk_actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [again_id.as_str(), id.as_str()]);
    assert_eq!(listed.body["next_cursor"], Value::Null);
    h.shutdown().await;
}

/// A bulk delete of 500 failed events (three pages of 200) takes each
/// with its history and leaves the pending ones; a delete needs a status
/// filter and a finished status. The single delete is a writer's: a
/// reader is refused (403), another tenant's writer finds nothing (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_failed_events_are_deleted_in_bulk() {
    let receiver = Receiver::start().await;
    receiver.set_default_status(422);
    let h = Harness::start().await;
    let (_, writer) = key(&h, Some("acme"), Role::Write).await;
    let (_, reader) = key(&h, Some("acme"), Role::Read).await;
    let (_, other) = key(&h, Some("beta"), Role::Write).await;
    let writer_secret = writer.clone();
    let writer = Some(writer.as_str());
    let registered = h
        .send_as(
            writer,
            Method::PUT,
            "/v1/tenants/acme",
            Some(&json!({ "sink": { "type": "http", "url": receiver.url("/hook") } })),
        )
        .await;
    assert_eq!(registered.status, StatusCode::CREATED, "{registered:?}");
    schedule(&h, writer, "acme", 500, &from_now(-1_000)).await;
    wait_until("500 failed events", || async {
        count(&h, "acme", EventStatus::Failed).await == 500
    })
    .await;
    let later = h
        .send_as(
            writer,
            Method::PUT,
            "/v1/tenants/acme/events/later",
            Some(&json!({ "deliver_at": FUTURE })),
        )
        .await;
    assert_eq!(later.status, StatusCode::CREATED, "{later:?}");

    let single = |key: String, id: &str| {
        call(
            &h,
            key,
            Method::POST,
            format!("/v1/tenants/acme/events/{id}/delete"),
        )
    };
    let refused = single(reader.clone(), "e0000").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{refused:?}");
    let foreign = single(other.clone(), "e0000").await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{foreign:?}");
    for bad in [
        json!({ "action": "delete", "filter": { "tenant": "acme" } }),
        json!({ "action": "delete", "filter": { "tenant": "acme", "status": "scheduled" } }),
        json!({ "action": "delete", "filter": { "tenant": "acme", "status": "paused" } }),
    ] {
        let answer = create(&h, writer, bad.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}: {answer:?}");
        assert_eq!(answer.body["error"]["code"], "invalid_request");
    }
    assert_eq!(count(&h, "acme", EventStatus::Failed).await, 500);

    let created = create(
        &h,
        writer,
        json!({ "action": "delete", "filter": { "tenant": "acme", "status": "failed" } }),
    )
    .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{created:?}");
    assert_eq!(created.body["action"], "delete");
    let id = created.body["id"].as_str().unwrap().to_string();
    let done = finished(&h, writer, &id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["matched"], 500, "{done}");
    assert_eq!(done["succeeded"], 500, "{done}");
    assert_eq!(done["skipped"], 0, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    assert_balanced(&done);

    assert_eq!(count(&h, "acme", EventStatus::Failed).await, 0);
    assert_eq!(count(&h, "acme", EventStatus::Scheduled).await, 1);
    let key_of = |id: &str| {
        belfry_core::EventKey::new(
            TenantName::new("acme").unwrap(),
            belfry_core::EventId::new(id).unwrap(),
        )
    };
    assert_eq!(h.store.get_event(&key_of("e0499")).await.unwrap(), None);
    assert!(
        h.store
            .attempts(&key_of("e0000"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let gone = single(writer_secret, "e0000").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{gone:?}");
    assert_eq!(receiver.count(), 500, "nothing was sent again");
    h.shutdown().await;
}

/// A cancel without a status filter over pending and finished events:
/// pages of 50, the finished ones skipped; a second action stopped by a
/// cancel keeps what its pages did, counted; a finished one cannot be
/// cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancels_page_through_and_a_cancel_stops_them() {
    // Pages of 50, spread out, so that the second action can be stopped
    // half way (40 pages take at least 4 s).
    let engine_options = EngineOptions {
        shutdown_grace: Duration::from_millis(500),
        bulk_page_size: 50,
        bulk_page_pause: Duration::from_millis(100),
        ..EngineOptions::default()
    };
    let h = Harness::with_engine_options(ApiOptions::default(), engine_options).await;
    h.register_log("acme").await;
    h.register_log("slow").await;
    schedule(&h, None, "acme", 230, FUTURE).await;
    // Ten finished already (cancelled one by one): skipped in bulk.
    for i in 0..10 {
        let answer = h.delete(&format!("/v1/tenants/acme/events/e{i:04}")).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }
    let created = create(
        &h,
        None,
        json!({ "action": "cancel", "filter": { "tenant": "acme", "to": "2100-01-01T00:00:00Z" } }),
    )
    .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{created:?}");
    assert_eq!(created.body["created_by"], Value::Null, "open mode");
    let id = created.body["id"].as_str().unwrap();
    let done = finished(&h, None, id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["matched"], 230, "{done}");
    assert_eq!(done["succeeded"], 220, "{done}");
    assert_eq!(done["skipped"], 10, "{done}");
    assert_eq!(count(&h, "acme", EventStatus::Cancelled).await, 230);
    let again = h
        .post(&format!("/v1/bulk-actions/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
    assert_eq!(again.body["error"]["code"], "already_finished");

    // Stopped half way: a slow action (its pages spread out) is cancelled
    // once it has done some pages.
    schedule(&h, None, "slow", 2_000, FUTURE).await;
    let slow = create(
        &h,
        None,
        json!({ "action": "cancel", "filter": { "tenant": "slow", "status": "scheduled" } }),
    )
    .await;
    let slow_id = slow.body["id"].as_str().unwrap().to_string();
    wait_until("a first page", || async {
        h.get(&format!("/v1/bulk-actions/{slow_id}")).await.body["matched"]
            .as_u64()
            .unwrap()
            > 0
    })
    .await;
    let cancelled = h
        .post(&format!("/v1/bulk-actions/{slow_id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.body["state"], "cancelled");
    assert!(cancelled.body["finished_at"].is_string());
    // The page in progress at the cancel is still counted: wait until the
    // view and the store agree.
    wait_until("the counts match the store", || async {
        let view = h.get(&format!("/v1/bulk-actions/{slow_id}")).await.body;
        view["succeeded"].as_u64().unwrap() == count(&h, "slow", EventStatus::Cancelled).await
    })
    .await;
    let view = h.get(&format!("/v1/bulk-actions/{slow_id}")).await.body;
    assert_eq!(view["state"], "cancelled");
    assert_balanced(&view);
    let stopped_at = count(&h, "slow", EventStatus::Cancelled).await;
    assert!(stopped_at < 2_000, "stopped half way: {view}");
    assert_eq!(
        stopped_at + count(&h, "slow", EventStatus::Scheduled).await,
        2_000
    );
    let audit = h
        .store
        .list_audit(AuditPageParams {
            after: None,
            limit: 100,
        })
        .await
        .unwrap();
    let actions: Vec<_> = audit.iter().map(|e| (e.action, e.actor.as_str())).collect();
    assert!(
        actions.contains(&(AuditAction::BulkActionCreated, "open")),
        "{actions:?}"
    );
    assert!(
        actions.contains(&(AuditAction::BulkActionCancelled, "open")),
        "{actions:?}"
    );
    h.shutdown().await;
}

/// Schedules are paused and resumed in bulk: an already paused one is
/// skipped; a status filter selects; resumed ones plan again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_paused_and_resumed_in_bulk() {
    let h = Harness::start().await;
    h.register_log("acme").await;
    for i in 0..5 {
        let answer = h
            .put(
                &format!("/v1/tenants/acme/schedules/s{i}"),
                &json!({ "expression": "0 0 1 1 *", "payload": "yearly" }),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    }
    let paused = h
        .post("/v1/tenants/acme/schedules/s0/pause", &json!({}))
        .await;
    assert_eq!(paused.status, StatusCode::OK, "{paused:?}");

    let statuses = || async {
        let listed = h.get("/v1/tenants/acme/schedules").await;
        listed.body["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["status"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };

    let pause = create(
        &h,
        None,
        json!({ "action": "pause", "filter": { "tenant": "acme" } }),
    )
    .await;
    assert_eq!(pause.status, StatusCode::ACCEPTED, "{pause:?}");
    assert_eq!(pause.body["filter"], json!({ "tenant": "acme" }));
    let done = finished(&h, None, pause.body["id"].as_str().unwrap()).await;
    assert_eq!(
        (
            &done["state"],
            &done["matched"],
            &done["succeeded"],
            &done["skipped"]
        ),
        (&json!("completed"), &json!(5), &json!(4), &json!(1)),
        "{done}"
    );
    assert_eq!(statuses().await, vec!["paused"; 5]);

    let resume = create(
        &h,
        None,
        json!({ "action": "resume", "filter": { "tenant": "acme", "status": "paused" } }),
    )
    .await;
    assert_eq!(resume.status, StatusCode::ACCEPTED, "{resume:?}");
    let done = finished(&h, None, resume.body["id"].as_str().unwrap()).await;
    assert_eq!(
        (&done["state"], &done["matched"], &done["succeeded"]),
        (&json!("completed"), &json!(5), &json!(5)),
        "{done}"
    );
    assert_eq!(statuses().await, vec!["active"; 5]);
    let one = h.get("/v1/tenants/acme/schedules/s3").await;
    assert!(one.body["next_occurrence"].is_string(), "{one:?}");

    // Event filters make no sense for schedules, nor statuses they never act on.
    for (body, message) in [
        (
            json!({ "action": "pause", "filter": { "tenant": "acme", "from": FUTURE } }),
            "filtered by status only",
        ),
        (
            json!({ "action": "resume", "filter": { "tenant": "acme", "status": "active" } }),
            "paused schedules",
        ),
        (
            json!({ "action": "pause", "filter": { "tenant": "acme", "status": "failed" } }),
            "unknown status",
        ),
    ] {
        let refused = create(&h, None, body.clone()).await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{body}: {refused:?}"
        );
        let text = refused.body["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{body}: {text}");
    }
    h.shutdown().await;
}

/// A page whose writes fail as a whole (the store is unavailable) is
/// retried with back-off, not counted as failed items; once the store is
/// back the action completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_on_a_page_is_retried_not_counted() {
    let h = Harness::start().await;
    h.register_log("acme").await;
    schedule(&h, None, "acme", 120, FUTURE).await;
    h.faults.set(
        FaultScope::Apply,
        StoreError::Unavailable("database restarting".into()),
    );
    let created = create(
        &h,
        None,
        json!({ "action": "cancel", "filter": { "tenant": "acme", "status": "scheduled" } }),
    )
    .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{created:?}");
    let id = created.body["id"].as_str().unwrap().to_string();
    wait_until("the page tried twice", || async {
        h.faults.injected() >= 2
    })
    .await;
    let during = h.get(&format!("/v1/bulk-actions/{id}")).await.body;
    assert_eq!(during["state"], "running", "{during}");
    assert_eq!(during["failed"], 0, "{during}");
    h.faults.clear();
    let done = finished(&h, None, &id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["matched"], 120, "{done}");
    assert_eq!(done["succeeded"], 120, "{done}");
    assert_eq!(done["failed"], 0, "{done}");
    assert_eq!(count(&h, "acme", EventStatus::Cancelled).await, 120);
    h.shutdown().await;
}

/// Roles: a read key reads its tenant's actions but cannot create or
/// cancel (403); another tenant's key gets 404 for everything of acme's;
/// a tenant key lists only its own; an admin sees all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_and_tenants_are_honoured() {
    let h = Harness::start().await;
    let (_, admin) = key(&h, None, Role::Admin).await;
    let (_, reader) = key(&h, Some("acme"), Role::Read).await;
    let (_, writer) = key(&h, Some("acme"), Role::Write).await;
    let (_, other) = key(&h, Some("beta"), Role::Write).await;
    let body = |tenant: &str| json!({ "action": "cancel", "filter": { "tenant": tenant, "status": "scheduled", "from": FUTURE } });

    let refused = create(&h, Some(&reader), body("acme")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{refused:?}");
    let foreign = create(&h, Some(&other), body("acme")).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{foreign:?}");
    assert_eq!(foreign.body["error"]["code"], "tenant_not_found");
    assert!(
        h.store
            .list_bulk_actions(ListBulkActionsParams {
                tenant: None,
                before: None,
                limit: 10
            })
            .await
            .unwrap()
            .is_empty(),
        "refused requests store nothing"
    );

    let acme = create(&h, Some(&writer), body("acme")).await;
    assert_eq!(acme.status, StatusCode::ACCEPTED, "{acme:?}");
    let acme_id = acme.body["id"].as_str().unwrap().to_string();
    let beta = create(&h, Some(&other), body("beta")).await;
    assert_eq!(beta.status, StatusCode::ACCEPTED, "{beta:?}");
    let beta_id = beta.body["id"].as_str().unwrap().to_string();
    finished(&h, Some(&writer), &acme_id).await;
    finished(&h, Some(&other), &beta_id).await;

    let get = |key: &str, id: &str| {
        call(
            &h,
            key.to_string(),
            Method::GET,
            format!("/v1/bulk-actions/{id}"),
        )
    };
    assert_eq!(get(&reader, &acme_id).await.status, StatusCode::OK);
    let hidden = get(&other, &acme_id).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{hidden:?}");
    assert_eq!(hidden.body["error"]["code"], "bulk_action_not_found");
    // No oracle: someone else's action and an unknown one look alike.
    let unknown_id = "bulk_000000000001abcdefghij";
    let unknown = get(&other, unknown_id).await;
    assert_eq!(
        hidden.body["error"]["message"]
            .as_str()
            .unwrap()
            .replace(&acme_id, "x"),
        unknown.body["error"]["message"]
            .as_str()
            .unwrap()
            .replace(unknown_id, "x")
    );
    let cancel = |key: &str, id: &str| {
        call(
            &h,
            key.to_string(),
            Method::POST,
            format!("/v1/bulk-actions/{id}/cancel"),
        )
    };
    assert_eq!(
        cancel(&reader, &acme_id).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(cancel(&other, &acme_id).await.status, StatusCode::NOT_FOUND);
    assert_eq!(cancel(&writer, &acme_id).await.status, StatusCode::CONFLICT);

    let list = |key: &str, query: &str| {
        call(
            &h,
            key.to_string(),
            Method::GET,
            format!("/v1/bulk-actions{query}"),
        )
    };
    let ids = |answer: &Answer| -> Vec<String> {
        answer.body["bulk_actions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&list(&reader, "").await), [acme_id.as_str()]);
    assert_eq!(
        ids(&list(&reader, "?tenant=acme").await),
        [acme_id.as_str()]
    );
    let foreign_list = list(&reader, "?tenant=beta").await;
    assert_eq!(
        foreign_list.status,
        StatusCode::NOT_FOUND,
        "{foreign_list:?}"
    );
    assert_eq!(
        ids(&list(&admin, "").await),
        [beta_id.as_str(), acme_id.as_str()]
    );
    assert_eq!(ids(&list(&admin, "?tenant=beta").await), [beta_id.as_str()]);
    // Pages of one, newest first.
    let first = list(&admin, "?limit=1").await;
    assert_eq!(ids(&first), [beta_id.as_str()]);
    let cursor = first.body["next_cursor"].as_str().unwrap().to_string();
    let second = list(&admin, &format!("?limit=1&cursor={cursor}")).await;
    assert_eq!(ids(&second), [acme_id.as_str()]);
    assert_eq!(second.body["next_cursor"], Value::Null);
    h.shutdown().await;
}

/// Bad input is a 400 (or 404 for ids) with a clear message, and stores
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bulk_requests_are_refused_and_change_nothing() {
    let h = Harness::start().await;
    h.register_log("acme").await;
    let before = h.snapshot(&[]).await;
    for (body, code) in [
        (
            json!({ "action": "delete", "filter": { "tenant": "acme" } }),
            "invalid_request",
        ),
        (json!({ "action": "cancel" }), "invalid_request"),
        (
            json!({ "action": "cancel", "filter": {} }),
            "invalid_request",
        ),
        (
            json!({ "action": "cancel", "filter": { "tenant": "" } }),
            "invalid_name",
        ),
        (
            json!({ "action": "cancel", "filter": { "tenant": "acme", "status": "gone" } }),
            "invalid_request",
        ),
        (
            json!({ "action": "cancel", "filter": { "tenant": "acme", "status": "delivered" } }),
            "invalid_request",
        ),
        (
            json!({ "action": "redrive", "filter": { "tenant": "acme", "status": "scheduled" } }),
            "invalid_request",
        ),
        (
            json!({ "action": "redrive", "filter": { "tenant": "acme", "from": "yesterday" } }),
            "invalid_time",
        ),
        (
            json!({ "action": "redrive", "filter": { "tenant": "acme", "to": "2030-01-01T00:00:00" } }),
            "invalid_time",
        ),
        (
            json!({ "action": "redrive", "filter": { "tenant": "acme" }, "dry_run": true }),
            "invalid_request",
        ),
        (
            json!({ "action": "redrive", "filter": { "tenant": "acme", "id": "x" } }),
            "invalid_request",
        ),
        (
            json!({ "action": 7, "filter": { "tenant": "acme" } }),
            "invalid_request",
        ),
        (json!([]), "invalid_request"),
    ] {
        let answer = create(&h, None, body.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        assert_eq!(answer.body["error"]["code"], code, "{body}: {answer:?}");
    }
    let broken = h
        .raw(
            Method::POST,
            "/v1/bulk-actions",
            Some("application/json"),
            "{\"action\":",
        )
        .await;
    assert_eq!(broken.status, StatusCode::BAD_REQUEST, "{broken:?}");
    for path in [
        "/v1/bulk-actions/bulk_000000000001abcdefghij",
        "/v1/bulk-actions/nope",
        "/v1/bulk-actions/..%2F..%2Fetc",
    ] {
        let answer = h.get(path).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}: {answer:?}");
        let cancel = h.post(&format!("{path}/cancel"), &json!({})).await;
        assert_eq!(cancel.status, StatusCode::NOT_FOUND, "{path}: {cancel:?}");
    }
    for (query, code) in [
        ("?cursor=nope", "invalid_cursor"),
        ("?limit=0", "invalid_query"),
        ("?limit=100000", "invalid_query"),
        ("?tenant=", "invalid_name"),
        ("?status=running", "invalid_query"),
    ] {
        let answer = h.get(&format!("/v1/bulk-actions{query}")).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{query}: {answer:?}"
        );
        assert_eq!(answer.body["error"]["code"], code, "{query}: {answer:?}");
    }
    assert_eq!(h.snapshot(&[]).await, before);
    assert!(
        h.store
            .list_bulk_actions(ListBulkActionsParams {
                tenant: None,
                before: None,
                limit: 10
            })
            .await
            .unwrap()
            .is_empty()
    );
    h.shutdown().await;
}
