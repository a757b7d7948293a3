//! Recurring schedules through BigBen's `/cron` routes and `/v1`, over the
//! real router, store and engine.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use belfry_testkit::Receiver;
use common::{DEADLINE, Harness, encode};
use serde_json::{Value, json};

const TENANT: &str = "TenantB/ProgramB/EnvC";

fn v1_path(tenant: &str, id: &str) -> String {
    format!("/v1/tenants/{}/schedules/{}", encode(tenant), encode(id))
}

#[tokio::test]
async fn bigben_cron_create_get_describe_and_delete() {
    let h = Harness::start().await;
    h.register_log(TENANT).await;
    let created = h
        .post(
            "/cron",
            &json!({ "tenant": TENANT, "id": "cronId1", "expression": "*/5 * * * * ? *", "type": "QUARTZ" }),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK, "{created:?}");
    assert_eq!(created.body["description"], "every 5 seconds");
    let cron = &created.body["cron"];
    assert_eq!(cron["tenant"], TENANT);
    assert_eq!(cron["id"], "cronId1");
    assert_eq!(cron["type"], "QUARTZ");
    assert_eq!(cron["timeZone"], "UTC");
    assert_eq!(cron["status"], "active");
    assert!(cron["nextOccurrence"].is_string());

    let path = format!("/cron/{}/cronId1", encode(TENANT));
    let described = h.get(&format!("{path}?describe=true")).await;
    assert_eq!(described.status, StatusCode::OK);
    let items = described.body.as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["description"], "every 5 seconds");
    assert_eq!(items[0]["cron"]["expression"], "*/5 * * * * ? *");
    let plain = h.get(&path).await;
    assert!(plain.body[0].get("description").is_none());
    assert_eq!(
        h.get(&format!("/cron/{}/nope", encode(TENANT))).await.body,
        json!([])
    );
    assert_eq!(
        h.get(&format!("{path}?describe=maybe")).await.status,
        StatusCode::BAD_REQUEST
    );

    // Another type than the cron's is not it; `*` is any.
    let wrong_type = h.delete(&format!("{path}/UNIX")).await;
    assert_eq!(wrong_type.status, StatusCode::NOT_FOUND);
    assert!(wrong_type.body["message"].is_string());
    let bad_type = h.delete(&format!("{path}/BOGUS")).await;
    assert_eq!(bad_type.status, StatusCode::BAD_REQUEST);
    assert!(
        bad_type.body["message"]
            .as_str()
            .unwrap()
            .contains("unknown cron type")
    );
    let deleted = h.delete(&format!("{path}/*")).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body, json!({ "status": "OK" }));
    assert_eq!(h.get(&path).await.body, json!([]));
    assert_eq!(
        h.delete(&format!("{path}/QUARTZ")).await.status,
        StatusCode::NOT_FOUND
    );
    h.shutdown().await;
}

#[tokio::test]
async fn bigben_cron_rejects_bad_input_with_messages_and_changes_nothing() {
    let h = Harness::start().await;
    h.register_log("t").await;
    let before = h.snapshot(&[]).await;
    let cases = [
        (
            json!({ "id": "c", "expression": "* * * * *", "type": "UNIX" }),
            "tenant not present",
        ),
        (
            json!({ "tenant": "t", "expression": "* * * * *" }),
            "id not present",
        ),
        (
            json!({ "tenant": "t", "id": "c" }),
            "expression not present",
        ),
        (
            json!({ "tenant": "t", "id": "c", "expression": "61 * * * *", "type": "UNIX" }),
            "invalid UNIX expression",
        ),
        (
            json!({ "tenant": "t", "id": "c", "expression": "* * * * *", "type": "NOPE" }),
            "unknown cron type",
        ),
        (
            json!({ "tenant": "t", "id": "c", "expression": "* * * * *", "timeZone": "Mars/Olympus" }),
            "unknown time zone",
        ),
        (
            json!({ "tenant": "nobody", "id": "c", "expression": "* * * * *" }),
            "tenant not registered / unknown tenant: nobody",
        ),
        (
            json!({ "tenant": "t", "id": "a@b", "expression": "* * * * *" }),
            "must not contain '@'",
        ),
        (
            json!({ "tenant": "t", "id": "c", "expression": "* * * * *",
                    "deliveryOption": "PAYLOAD_ONLY" }),
            "payload is required",
        ),
    ];
    for (body, message) in cases {
        let answer = h.post("/cron", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        let text = answer.body["message"].as_str().unwrap();
        assert!(text.contains(message), "{body}: {text}");
    }
    let not_json = h
        .raw(Method::POST, "/cron", Some("application/json"), "{")
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(h.snapshot(&[]).await, before);
    h.shutdown().await;
}

#[tokio::test]
async fn v1_schedule_lifecycle_and_history() {
    let h = Harness::start().await;
    let receiver = Receiver::start().await;
    h.register_http(TENANT, &receiver.url("/hook")).await;
    let path = v1_path(TENANT, "tick");
    let body = json!({ "expression": "@every 1s", "type": "every", "payload": "hello",
                       "delivery": "payload_only", "misfire": { "policy": "fire_all", "cap": 3 } });
    let created = h.put(&path, &body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["status"], "active");
    assert_eq!(created.body["description"], "every second");
    assert_eq!(
        created.body["misfire"],
        json!({ "policy": "fire_all", "cap": 3 })
    );
    assert!(created.body["next_occurrence"].is_string());
    let updated = h.put(&path, &body).await;
    assert_eq!(updated.status, StatusCode::OK);
    assert_eq!(updated.body["created_at"], created.body["created_at"]);

    // Occurrences are delivered and listed with their status.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let history = loop {
        let answer = h.get(&format!("{path}/occurrences")).await;
        assert_eq!(answer.status, StatusCode::OK);
        let delivered: Vec<Value> = answer.body["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["status"] == "delivered")
            .cloned()
            .collect();
        if delivered.len() >= 2 {
            break delivered;
        }
        assert!(tokio::time::Instant::now() < deadline, "{answer:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let first_id = history[0]["id"].as_str().unwrap();
    assert!(first_id.starts_with("tick@"));
    assert_eq!(
        first_id.split_once('@').unwrap().1,
        history[0]["scheduled_at"].as_str().unwrap()
    );
    let delivery = receiver
        .requests()
        .into_iter()
        .find(|r| r.header("x-belfry-event-id") == Some(first_id))
        .expect("delivered");
    assert_eq!(delivery.body_text(), "hello");
    assert_eq!(delivery.header("idempotency-key"), Some(first_id));
    let paged = h.get(&format!("{path}/occurrences?limit=1")).await;
    assert_eq!(paged.body["occurrences"].as_array().unwrap().len(), 1);
    let cursor = paged.body["next_cursor"].as_str().unwrap();
    let next = h
        .get(&format!("{path}/occurrences?limit=1&cursor={cursor}"))
        .await;
    assert_ne!(
        next.body["occurrences"][0]["id"],
        paged.body["occurrences"][0]["id"]
    );

    // Control events never show among the tenant's events.
    let events = h
        .get(&format!("/v1/tenants/{}/events?limit=1000", encode(TENANT)))
        .await;
    assert!(
        events.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["id"].as_str().unwrap().starts_with("tick@"))
    );

    let paused = h.post(&format!("{path}/pause"), &json!({})).await;
    assert_eq!(paused.status, StatusCode::OK, "{paused:?}");
    assert_eq!(paused.body["status"], "paused");
    assert_eq!(paused.body["next_occurrence"], Value::Null);
    assert_eq!(h.get(&path).await.body["status"], "paused");
    let resumed = h.post(&format!("{path}/resume"), &json!({})).await;
    assert_eq!(resumed.body["status"], "active");
    assert!(resumed.body["next_occurrence"].is_string());

    h.put(
        &v1_path(TENANT, "other"),
        &json!({ "expression": "0 9 * * 1-5", "time_zone": "Europe/Berlin" }),
    )
    .await;
    let listed = h
        .get(&format!("/v1/tenants/{}/schedules?limit=1", encode(TENANT)))
        .await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.body["schedules"][0]["id"], "other");
    let cursor = listed.body["next_cursor"].as_str().unwrap();
    let rest = h
        .get(&format!(
            "/v1/tenants/{}/schedules?limit=1&cursor={cursor}",
            encode(TENANT)
        ))
        .await;
    assert_eq!(rest.body["schedules"][0]["id"], "tick");
    assert_eq!(rest.body["next_cursor"], Value::Null);

    let deleted = h.delete(&path).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body["status"], "deleted");
    let gone = h.get(&path).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.body["error"]["code"], "schedule_not_found");
    assert_eq!(h.delete(&path).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        h.post(&format!("{path}/pause"), &json!({})).await.status,
        StatusCode::NOT_FOUND
    );
    // The history outlives the schedule.
    let history = h.get(&format!("{path}/occurrences")).await;
    assert_eq!(history.status, StatusCode::OK);
    assert!(!history.body["occurrences"].as_array().unwrap().is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn v1_schedule_errors_are_400_or_404_with_codes() {
    let h = Harness::start().await;
    h.register_log("t").await;
    let before = h.snapshot(&[]).await;
    let cases = [
        ("c", json!({ "expression": "61 * * * *" }), "invalid_cron"),
        (
            "c",
            json!({ "expression": "* * * * *", "time_zone": "Nowhere/City" }),
            "invalid_cron",
        ),
        (
            "c",
            json!({ "expression": "* * * * *", "type": "cobol" }),
            "invalid_cron",
        ),
        ("a@b", json!({ "expression": "* * * * *" }), "invalid_name"),
        (
            "c",
            json!({ "expression": "* * * * *", "start_at": "tomorrow" }),
            "invalid_time",
        ),
        (
            "c",
            json!({ "expression": "* * * * *", "start_at": "2030-01-02T00:00:00Z",
                    "end_at": "2030-01-01T00:00:00Z" }),
            "invalid_schedule",
        ),
        (
            "c",
            json!({ "expression": "* * * * *", "max_occurrences": 0 }),
            "invalid_schedule",
        ),
        (
            "c",
            json!({ "expression": "* * * * *", "misfire": { "policy": "fire_all", "cap": 0 } }),
            "invalid_schedule",
        ),
        (
            "c",
            json!({ "expression": "* * * * *", "misfire": { "policy": "sometimes" } }),
            "invalid_request",
        ),
        (
            "c",
            json!({ "expression": "* * * * *", "colour": "red" }),
            "invalid_request",
        ),
    ];
    for (id, body, code) in cases {
        let answer = h.put(&v1_path("t", id), &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        assert_eq!(answer.body["error"]["code"], code, "{body}: {answer:?}");
    }
    let unknown_tenant = h
        .put(
            &v1_path("nobody", "c"),
            &json!({ "expression": "* * * * *" }),
        )
        .await;
    assert_eq!(unknown_tenant.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown_tenant.body["error"]["code"], "tenant_not_found");
    assert_eq!(h.snapshot(&["nobody"]).await, before);

    let missing = h.get(&v1_path("t", "nope")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["code"], "schedule_not_found");
    assert_eq!(
        h.get(&format!("{}/occurrences", v1_path("t", "nope")))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get("/v1/tenants/t/schedules?limit=0").await.body["error"]["code"],
        "invalid_query"
    );
    assert_eq!(
        h.get("/v1/tenants/t/schedules?cursor=zz").await.body["error"]["code"],
        "invalid_cursor"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn preview_lists_utc_and_local_times_across_dst() {
    let h = Harness::start().await;
    let answer = h
        .get(
            "/v1/cron/preview?expression=30%202%20*%20*%20*&type=unix&timezone=Europe/Berlin\
             &from=2027-03-27T12:00:00Z&count=2",
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(
        answer.body["occurrences"],
        json!([
            { "utc": "2027-03-28T01:00:00Z", "local": "2027-03-28T03:00:00+02:00[Europe/Berlin]" },
            { "utc": "2027-03-29T00:30:00Z", "local": "2027-03-29T02:30:00+02:00[Europe/Berlin]" },
        ])
    );
    assert_eq!(
        answer.body["description"],
        "at 02:30 every day (Europe/Berlin)"
    );
    assert_eq!(answer.body["time_zone"], "Europe/Berlin");
    let default_count = h.get("/v1/cron/preview?expression=@hourly").await;
    assert_eq!(
        default_count.body["occurrences"].as_array().unwrap().len(),
        10
    );
    for (query, code) in [
        ("", "invalid_query"),
        ("expression=*%20*%20*%20*%20*&count=0", "invalid_query"),
        ("expression=*%20*%20*%20*%20*&count=1001", "invalid_query"),
        ("expression=*%20*%20*%20*%20*&from=soon", "invalid_time"),
        (
            "expression=*%20*%20*%20*%20*&timezone=Atlantis",
            "invalid_cron",
        ),
        ("expression=*%20*%20*", "invalid_cron"),
        ("expression=*%20*%20*%20*%20*&colour=red", "invalid_query"),
    ] {
        let answer = h.get(&format!("/v1/cron/preview?{query}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(answer.body["error"]["code"], code, "{query}: {answer:?}");
    }
    h.shutdown().await;
}
