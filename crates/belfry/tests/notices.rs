//! Failure notices (`docs/api.md`, notices) end to end: a real `belfry
//! serve` process, a receiver as the tenant's sink and a second one as its
//! notice target. A failed event, a pause and a resume each send a signed
//! notice; a notice target that hangs does not delay the tenant's
//! deliveries.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::{Duration, Instant};

use belfry_core::{SigningSecrets, Timestamp};
use belfry_sinks::signing::Signer;
use belfry_testkit::{
    BelfryLaunch, BelfryProcess, Receiver, RecordedRequest, Response, get_json, post_json, put_json,
};
use serde_json::{Value, json};

mod common;
use common::{now_ms, rfc3339, sample, scrape};

/// Generous bound for anything the node must finish.
const DEADLINE: Duration = Duration::from_secs(60);

/// How late a delivery may come after its instant on a loaded test
/// machine.
const LATE: Duration = Duration::from_millis(1_500);

/// One delivery of the tenant at a time: a notice that took a delivery
/// slot would hold every delivery behind it. The circuit breaker is off:
/// these tests fail events on purpose, and an open circuit (tested in
/// `breaker.rs`) would hold the rest of them.
async fn start_node(dir: &std::path::Path) -> BelfryProcess {
    let config = dir.join("belfry.toml");
    std::fs::write(
        &config,
        "[limits.tenants.\"acme\"]\nmax_concurrent_deliveries = 1\n\
         [engine.circuit_breaker]\nfailure_threshold = 0\n",
    )
    .unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"))
        .arg("--config")
        .arg(config.to_str().unwrap());
    BelfryProcess::start(launch).await.expect("belfry starts")
}

/// Registers `acme` delivering to `sink` with notices to `notify`;
/// answers its signing secret.
async fn register(node: &BelfryProcess, sink: &Receiver, notify: &Receiver) -> String {
    let (status, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({
            "sink": {"type": "http", "url": sink.url("/hook"), "timeout_ms": 2_000},
            "notify": {"url": notify.url("/notices")},
        }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["notify"]["url"], notify.url("/notices"), "{body}");
    body["signing_secret"].as_str().unwrap().to_string()
}

/// Schedules `id` at `at` with at most one attempt.
async fn schedule(node: &BelfryProcess, id: &str, at: i64) -> Value {
    let (status, answer) = put_json(
        &node.url(&format!("/v1/tenants/acme/events/{id}")),
        &json!({"deliver_at": rfc3339(at), "payload": id, "max_attempts": 1}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    answer
}

/// The first notice the receiver got that `matches`, waiting for it.
async fn notice(receiver: &Receiver, matches: impl Fn(&Value) -> bool) -> (RecordedRequest, Value) {
    let started = Instant::now();
    loop {
        let found = receiver.requests().into_iter().find_map(|request| {
            let body = request.body_json().ok()?;
            matches(&body).then_some((request, body))
        });
        if let Some(found) = found {
            return found;
        }
        let seen: Vec<String> = receiver.requests().iter().map(|r| r.body_text()).collect();
        assert!(started.elapsed() < DEADLINE, "no such notice; got {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the Standard Webhooks signature of a notice.
fn assert_signed(request: &RecordedRequest, secret: &str) {
    let header = |name: &str| {
        request
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header"))
    };
    let timestamp = header("webhook-timestamp");
    let at = Timestamp::from_millis(timestamp.parse::<i64>().unwrap() * 1_000);
    let signer = Signer::new(&SigningSecrets::new(secret.to_string())).unwrap();
    assert_eq!(
        header("webhook-signature"),
        signer.signature(header("webhook-id"), timestamp, &request.body, at),
        "the notice is signed with the tenant's secret"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_event_a_pause_and_a_resume_each_send_a_signed_notice() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Receiver::start().await;
    sink.set_default_status(500);
    let notices = Receiver::start().await;
    let node = start_node(dir.path()).await;
    let secret = register(&node, &sink, &notices).await;
    let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
    assert_eq!(view["notify"]["url"], notices.url("/notices"), "{view}");

    let event = schedule(&node, "e1", now_ms() + 300).await;
    let version = event["version"].as_str().unwrap().to_string();
    let (request, body) = notice(&notices, |body| body["type"] == "event_failed").await;
    assert_eq!(request.path, "/notices");
    assert_eq!(body["tenant"], "acme", "{body}");
    assert_eq!(body["event_id"], "e1", "{body}");
    assert_eq!(body["version"], version.as_str(), "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    assert_eq!(body["id"], format!("event_failed/e1/{version}"), "{body}");
    assert!(
        body["reason"].as_str().is_some_and(|r| r.contains("500")),
        "{body}"
    );
    assert_signed(&request, &secret);
    let (_, stored) = get_json(&node.url("/v1/tenants/acme/events/e1")).await;
    assert_eq!(stored["status"], "failed", "{stored}");
    // Notices are the engine's own: the tenant's listing shows its events
    // only.
    let (_, listing) = get_json(&node.url("/v1/tenants/acme/events")).await;
    let ids: Vec<&str> = listing["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(ids, ["e1"], "{listing}");

    let (status, paused) = post_json(
        &node.url("/v1/tenants/acme/pause"),
        &json!({"reason": "maintenance"}),
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    let (request, body) = notice(&notices, |body| body["type"] == "paused").await;
    assert_eq!(body["reason"], "maintenance", "{body}");
    assert_eq!(body["at"], paused["pause"]["since"], "{body}");
    assert_signed(&request, &secret);

    let (status, resumed) = post_json(&node.url("/v1/tenants/acme/resume"), &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    let (request, body) = notice(&notices, |body| body["type"] == "resumed").await;
    assert_eq!(body["at"], resumed["pause"]["since"], "{body}");
    assert_signed(&request, &secret);

    // Each notice once (the receiver accepted every one at once).
    assert_eq!(notices.count(), 3, "{:?}", notices.requests());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notice_target_that_hangs_does_not_delay_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Receiver::start().await;
    // Events named `bad-…` fail; the others are accepted.
    sink.set_responder(|request| {
        if request.body_text().contains("bad-") {
            Response::status(500)
        } else {
            Response::status(200)
        }
    });
    let notices = Receiver::start().await;
    notices.set_default(Response::status(200).with_delay(Duration::from_secs(600)));
    let node = start_node(dir.path()).await;
    register(&node, &sink, &notices).await;

    // Ten failures: ten notices, each hanging until its timeout.
    let at = now_ms() + 300;
    for i in 0..10 {
        schedule(&node, &format!("bad-{i}"), at).await;
    }
    let started = Instant::now();
    while notices.count() < 10 {
        assert!(
            started.elapsed() < DEADLINE,
            "notices attempted: {}",
            notices.count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // With the notices hanging, the tenant's deliveries (one at a time)
    // still arrive on time.
    let due = now_ms() + 500;
    for i in 0..5 {
        schedule(&node, &format!("good-{i}"), due + i * 100).await;
    }
    let started = Instant::now();
    let good = |sink: &Receiver| -> Vec<RecordedRequest> {
        sink.requests()
            .into_iter()
            .filter(|r| r.body_text().contains("good-"))
            .collect()
    };
    while good(&sink).len() < 5 {
        assert!(
            started.elapsed() < DEADLINE,
            "deliveries: {}",
            good(&sink).len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for request in good(&sink) {
        let body = request.body_json().unwrap();
        let id = body["id"].as_str().unwrap();
        let i: i64 = id.strip_prefix("good-").unwrap().parse().unwrap();
        let late = request.arrived_at_ms - (due + i * 100);
        assert!(
            (0..LATE.as_millis() as i64).contains(&late),
            "{id} arrived {late} ms after its instant"
        );
    }
    // The hanging notices are retried once their attempts time out.
    let started = Instant::now();
    while notices.count() < 11 {
        assert!(started.elapsed() < DEADLINE, "no notice retried");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A receiver's `410 Gone` fails the event and pauses the tenant: two
/// notices.
#[tokio::test(flavor = "multi_thread")]
async fn a_410_gone_sends_the_failure_and_the_pause() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Receiver::start().await;
    sink.set_default_status(410);
    let notices = Receiver::start().await;
    let node = start_node(dir.path()).await;
    let secret = register(&node, &sink, &notices).await;
    schedule(&node, "gone", now_ms() + 300).await;
    let (_, failed) = notice(&notices, |body| body["type"] == "event_failed").await;
    assert_eq!(failed["event_id"], "gone", "{failed}");
    let (request, paused) = notice(&notices, |body| body["type"] == "paused").await;
    assert!(
        paused["reason"].as_str().is_some_and(|r| r.contains("410")),
        "{paused}"
    );
    assert_signed(&request, &secret);
    let (_, view) = get_json(&node.url("/v1/tenants/acme")).await;
    assert_eq!(view["pause"]["since"], paused["at"], "{view}");
}

/// A pull event a worker fails for good sends a notice too.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_event_failed_by_its_worker_sends_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let notices = Receiver::start().await;
    let node = start_node(dir.path()).await;
    let (status, body) = put_json(
        &node.url("/v1/tenants/jobs"),
        &json!({"sink": {"type": "pull"}, "notify": {"url": notices.url("/notices")}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, event) = put_json(
        &node.url("/v1/tenants/jobs/events/job-1"),
        &json!({"deliver_at": rfc3339(now_ms()), "payload": "x"}),
    )
    .await;
    assert_eq!(status, 201, "{event}");
    let started = Instant::now();
    let lease = loop {
        let (status, claimed) = post_json(
            &node.url("/v1/tenants/jobs/leases"),
            &json!({"worker_id": "w", "max_events": 1, "wait_ms": 1000, "lease_ms": 30_000}),
        )
        .await;
        assert_eq!(status, 200, "{claimed}");
        if let Some(lease) = claimed["leases"].get(0) {
            break lease.clone();
        }
        assert!(started.elapsed() < DEADLINE, "nothing to claim");
    };
    let lease_id = lease["lease_id"].as_str().unwrap();
    let (status, failed) = post_json(
        &node.url(&format!("/v1/leases/{lease_id}/fail")),
        &json!({"error": {"code": "bad_input", "message": "no such customer"}, "permanent": true}),
    )
    .await;
    assert_eq!(status, 200, "{failed}");
    assert_eq!(failed["state"], "failed", "{failed}");

    let (request, body) = notice(&notices, |body| body["type"] == "event_failed").await;
    assert_eq!(body["tenant"], "jobs", "{body}");
    assert_eq!(body["event_id"], "job-1", "{body}");
    assert_eq!(body["version"], event["version"], "{body}");
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("bad_input")),
        "{body}"
    );
    assert!(request.header("webhook-signature").is_some());
}

/// A tenant whose notice target never answers keeps at most 100 notices
/// pending: the rest are dropped and counted.
#[tokio::test(flavor = "multi_thread")]
async fn pending_notices_are_capped_and_the_rest_counted() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Receiver::start().await;
    sink.set_default_status(500);
    let notices = Receiver::start().await;
    notices.set_default(Response::status(200).with_delay(Duration::from_secs(600)));
    let node = start_node(dir.path()).await;
    register(&node, &sink, &notices).await;
    let at = now_ms() + 300;
    let events = 110;
    let batch: Vec<Value> = (0..events)
        .map(|i| json!({"id": format!("e{i}"), "deliver_at": rfc3339(at), "max_attempts": 1}))
        .collect();
    let (status, body) = post_json(
        &node.url("/v1/tenants/acme/events"),
        &json!({"events": batch}),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");

    let started = Instant::now();
    loop {
        let metrics = scrape(&node).await;
        let raised = sample(
            &metrics,
            r#"belfry_notices_raised_total{kind="event_failed"}"#,
        );
        let dropped = sample(
            &metrics,
            r#"belfry_notices_dropped_total{kind="event_failed"}"#,
        );
        if raised.unwrap_or(0.0) + dropped.unwrap_or(0.0) >= events as f64 {
            assert_eq!(raised, Some(100.0), "{metrics}");
            assert_eq!(dropped, Some(10.0), "{metrics}");
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "raised {raised:?}, dropped {dropped:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pause holds the tenant's lanes at once, in every partition, with its
/// due events behind them; its notice still goes out at once, not at the
/// lanes' next recheck (5 s) or at the resume.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_notice_goes_out_at_once_past_the_held_events() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Receiver::start().await;
    let notify = Receiver::start().await;
    let node = start_node(dir.path()).await;
    register(&node, &sink, &notify).await;
    // A backlog that is held from its instant on.
    let due = now_ms() + 1_000;
    let batch: Vec<Value> = (0..200)
        .map(|i| json!({"id": format!("b{i}"), "deliver_at": rfc3339(due), "payload": "b"}))
        .collect();
    let (status, answer) = post_json(
        &node.url("/v1/tenants/acme/events"),
        &json!({ "events": batch }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = post_json(&node.url("/v1/tenants/acme/pause"), &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let paused_at = Instant::now();
    notice(&notify, |body| body["type"] == "paused").await;
    let took = paused_at.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the pause notice took {took:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(sink.requests().is_empty(), "nothing delivered while paused");
}

/// A schedule whose node was down past its misfire threshold: the
/// occurrences it missed raise one `schedule_missed` notice for the
/// catch-up, counting them all (those stored `missed` and those beyond
/// the recording cap), and no notice per occurrence.
#[tokio::test(flavor = "multi_thread")]
async fn a_schedule_catch_up_sends_one_notice_counting_its_missed_occurrences() {
    let dir = tempfile::tempdir().unwrap();
    let sink = Receiver::start().await;
    let notices = Receiver::start().await;
    let config = dir.path().join("belfry.toml");
    std::fs::write(&config, "[engine.circuit_breaker]\nfailure_threshold = 0\n").unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
        .arg("--config")
        .arg(config.to_str().unwrap())
        .env("BELFRY_ENGINE__SCHEDULE_LEAD_MS", "500")
        .env("BELFRY_ENGINE__SCHEDULE_MISFIRE_THRESHOLD_MS", "1000")
        // Two stored `missed`, the rest only counted in the summary.
        .env("BELFRY_ENGINE__SCHEDULE_MAX_MISSED_RECORDED", "2");
    let mut node = BelfryProcess::start(launch).await.expect("belfry starts");
    let secret = register(&node, &sink, &notices).await;
    let (status, body) = put_json(
        &node.url("/v1/tenants/acme/schedules/tick"),
        &json!({"expression": "@every 1s", "type": "every", "misfire": {"policy": "skip"}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    sink.wait_for_count(2, DEADLINE).await.unwrap();

    // Down for 6 s: the occurrences of most of that time are reached more
    // than the threshold late when the node is back.
    node.kill_9();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restarted_at = now_ms();
    node.restart().await.expect("belfry restarts");

    let (request, body) = notice(&notices, |body| body["type"] == "schedule_missed").await;
    assert_signed(&request, &secret);
    assert_eq!(body["tenant"], "acme", "{body}");
    assert_eq!(body["schedule_id"], "tick", "{body}");
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("misfire policy skip")),
        "{body}"
    );
    let (_, schedule) = get_json(&node.url("/v1/tenants/acme/schedules/tick")).await;
    let recorded = schedule["missed"]["recorded"].as_u64().unwrap();
    let summarized = schedule["missed"]["summarized"].as_u64().unwrap();
    assert_eq!(recorded, 2, "{schedule}");
    assert!(summarized >= 1, "{schedule}");
    assert_eq!(
        body["missed"]["count"].as_u64(),
        Some(recorded + summarized),
        "{body} {schedule}"
    );
    let instant = |field: &str| {
        Timestamp::parse_rfc3339(body["missed"][field].as_str().unwrap())
            .unwrap()
            .as_millis()
    };
    assert!(
        instant("first") < instant("last") && instant("last") < restarted_at,
        "{body}"
    );
    assert_eq!(
        body["id"],
        format!("schedule_missed/tick/{}", instant("first")),
        "{body}"
    );

    // One notice for the catch-up: a tenant's notices are written in the
    // order raised, and none per occurrence came before it.
    let metrics = scrape(&node).await;
    assert_eq!(
        sample(
            &metrics,
            r#"belfry_notices_raised_total{kind="schedule_missed"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"belfry_notices_raised_total{kind="event_missed"}"#
        )
        .unwrap_or(0.0),
        0.0,
        "{metrics}"
    );
    let kinds: Vec<String> = notices
        .requests()
        .iter()
        .filter_map(|r| r.body_json().ok())
        .map(|b| b["type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(kinds, ["schedule_missed"], "{kinds:?}");
}
