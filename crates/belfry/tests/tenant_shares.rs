//! One tenant must not starve the others of a node's shared resources: a
//! real `belfry serve` process attacked through its API the way a
//! tenant's own key could, and the per-tenant share or budget that stops
//! each attack (`docs/security.md`, "Per-tenant quotas").
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::{call, now_ms, rfc3339};

/// Generous bound for anything the node must finish.
const DEADLINE: Duration = Duration::from_secs(60);
const LATER: &str = "2099-01-01T00:00:00Z";

async fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> BelfryProcess {
    let mut launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    for (key, value) in env {
        launch = launch.env(*key, *value);
    }
    BelfryProcess::start(launch).await.expect("belfry starts")
}

async fn tenant(node: &BelfryProcess, name: &str, sink: Value) {
    let (status, body) = put_json(
        &node.url(&format!("/v1/tenants/{name}")),
        &json!({ "sink": sink }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

async fn schedule(node: &BelfryProcess, tenant: &str, ids: &[String], deliver_at: &str) {
    let batch: Vec<Value> = ids
        .iter()
        .map(|id| json!({ "id": id, "deliver_at": deliver_at, "payload": id }))
        .collect();
    let (status, body) = post_json(
        &node.url(&format!("/v1/tenants/{tenant}/events")),
        &json!({ "events": batch }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Polls `probe` until it answers `Some`, at most `DEADLINE`.
async fn wait_until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn status_of(node: &BelfryProcess, tenant: &str, id: &str) -> String {
    let (_, body) = get_json(&node.url(&format!("/v1/tenants/{tenant}/events/{id}"))).await;
    body["status"].as_str().unwrap_or_default().to_string()
}

/// A worker key of one tenant claims everything it can with the longest
/// lease: it gets its share of the node's leases (a tenth by default), a
/// further claim says which limit, a 12 h lease is refused, and another
/// tenant's worker is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_hold_every_lease_of_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), &[("BELFRY_PULL__MAX_LEASES", "20")]).await;
    tenant(&node, "greedy", json!({ "type": "pull" })).await;
    tenant(&node, "fair", json!({ "type": "pull" })).await;
    let now = rfc3339(now_ms());
    schedule(&node, "greedy", &ids("g", 40), &now).await;
    schedule(&node, "fair", &ids("f", 1), &now).await;
    let base = node.base_url();
    let claim = |tenant: &'static str, lease_ms: u64| {
        let base = base.clone();
        async move {
            call(
                &base,
                &format!("/v1/tenants/{tenant}/leases"),
                &json!({ "worker_id": "w", "max_events": 100, "wait_ms": 1000, "lease_ms": lease_ms }),
            )
            .await
            .expect("the node answers")
        }
    };

    let (status, body) = claim("greedy", 12 * 3600 * 1000).await;
    assert_eq!(status, 400, "a 12 h lease is refused: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lease_ms"),
        "{body}"
    );

    // Claims until the events are ready, then everything it may hold.
    let mut held = 0;
    let refusal = wait_until("greedy reaches its lease share", || {
        let claim = claim("greedy", 900_000);
        async move { Some(claim.await) }
    })
    .await;
    let mut last = refusal;
    while last.0 == 200 {
        held += last.1["leases"].as_array().unwrap().len();
        assert!(held <= 2, "greedy holds {held} of the node's 20 leases");
        last = claim("greedy", 900_000).await;
    }
    assert_eq!(held, 2, "a tenth of pull.max_leases");
    assert_eq!(last.0, 429, "{:?}", last.1);
    assert_eq!(last.1["error"]["code"], "too_many_leases", "{:?}", last.1);
    assert!(
        last.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("pull.max_leases_per_tenant"),
        "says which limit: {:?}",
        last.1
    );

    let (status, body) = claim("fair", 30_000).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"].as_array().unwrap().len(), 1, "{body}");
}

/// A tenant queues bulk actions: past its limit they are refused, and the
/// runner works on one of its actions at a time, so another tenant's
/// action finishes while the first tenant's slow ones still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_take_every_bulk_action_slot() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(
        dir.path(),
        &[
            ("BELFRY_ENGINE__BULK_PAGE_SIZE", "1"),
            ("BELFRY_ENGINE__BULK_PAGE_PAUSE_MS", "500"),
        ],
    )
    .await;
    let hook = json!({ "type": "http", "url": "http://127.0.0.1:9/hook" });
    tenant(&node, "greedy", hook.clone()).await;
    tenant(&node, "fair", hook).await;
    schedule(&node, "greedy", &ids("g", 40), LATER).await;
    schedule(&node, "fair", &ids("f", 1), LATER).await;
    // A redrive of pending events skips each, one page at a time: slow.
    let create = |tenant: &str| {
        let url = node.url("/v1/bulk-actions");
        let body = json!({ "action": "redrive", "filter": { "tenant": tenant } });
        async move { post_json(&url, &body).await }
    };
    let mut accepted = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let (status, body) = create("greedy").await;
        match status {
            202 => accepted.push(body["id"].as_str().unwrap().to_string()),
            _ => {
                refused = Some((status, body));
                break;
            }
        }
    }
    assert_eq!(accepted.len(), 2, "limits.max_bulk_actions_per_tenant");
    let (status, body) = refused.expect("the third is refused");
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_bulk_actions", "{body}");

    let (status, body) = create("fair").await;
    assert_eq!(status, 202, "{body}");
    let fair = body["id"].as_str().unwrap().to_string();
    let state = |id: String| {
        let url = node.url(&format!("/v1/bulk-actions/{id}"));
        async move {
            get_json(&url).await.1["state"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    wait_until("fair's action completes", || {
        let state = state(fair.clone());
        async move { (state.await == "completed").then_some(()) }
    })
    .await;
    for id in &accepted {
        assert_eq!(
            state(id.clone()).await,
            "running",
            "greedy's 40 slow pages are not done before fair's one"
        );
    }
}

/// A tenant's schedules carry payloads past the payload limit and create
/// occurrences past its pending quota: the first is refused, the second
/// stored `missed` with the reason instead of pending (and delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_count_against_the_payload_limit_and_the_pending_quota() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start(
        dir.path(),
        &[
            ("BELFRY_LIMITS__MAX_PAYLOAD_BYTES", "64"),
            ("BELFRY_LIMITS__MAX_PENDING_EVENTS_PER_TENANT", "3"),
        ],
    )
    .await;
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    let put = |id: &str, body: Value| {
        let url = node.url(&format!("/v1/tenants/acme/schedules/{id}"));
        async move { put_json(&url, &body).await }
    };
    let (status, body) = put(
        "big",
        json!({ "expression": "@every 1s", "type": "every", "payload": "x".repeat(65) }),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    let (status, _) = get_json(&node.url("/v1/tenants/acme/schedules/big")).await;
    assert_eq!(status, 404, "nothing was stored");

    // The quota is full; the schedule's occurrences are refused.
    schedule(&node, "acme", &ids("e", 3), LATER).await;
    let (status, body) = put(
        "tick",
        json!({ "expression": "@every 1s", "type": "every", "payload": "p" }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let occurrence = wait_until("an occurrence is stored", || {
        let url = node.url("/v1/tenants/acme/schedules/tick/occurrences");
        async move {
            let (_, body) = get_json(&url).await;
            body["occurrences"]
                .as_array()
                .and_then(|all| all.first().cloned())
        }
    })
    .await;
    assert_eq!(occurrence["status"], "missed", "{occurrence}");
    assert!(
        occurrence["last_error"]
            .as_str()
            .is_some_and(|reason| reason.contains("pending events")),
        "the reason names the quota: {occurrence}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.count(), 0, "nothing past the quota was delivered");
}

/// Redriving a dead event makes it pending again: refused at the pending
/// quota like a create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_counts_against_the_pending_quota() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.set_default_status(400);
    let node = start(
        dir.path(),
        &[("BELFRY_LIMITS__MAX_PENDING_EVENTS_PER_TENANT", "2")],
    )
    .await;
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    schedule(&node, "acme", &ids("dead", 1), &rfc3339(now_ms())).await;
    wait_until("the event fails for good", || {
        let status = status_of(&node, "acme", "dead0");
        async move { (status.await == "failed").then_some(()) }
    })
    .await;
    // The node's estimate still holds the dead event as pending until it
    // is a second old and counted again (docs/security.md, "Precision").
    tokio::time::sleep(Duration::from_millis(1100)).await;
    schedule(&node, "acme", &ids("e", 2), LATER).await;
    let (status, body) = post_json(
        &node.url("/v1/tenants/acme/events/dead0/redrive"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    assert_eq!(status_of(&node, "acme", "dead0").await, "failed");
}

/// Dry runs deliver now, outside the delivery limits: a tenant's burst of
/// them is cut at its dry-run rate, with a 429 that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_are_rate_limited_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start(dir.path(), &[]).await;
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    schedule(&node, "acme", &ids("e", 1), LATER).await;
    let started = tokio::time::Instant::now();
    let mut limited = None;
    for _ in 0..30 {
        let (status, body) =
            post_json(&node.url("/events/dryrun?tenant=acme&id=e0"), &json!({})).await;
        if status == 429 {
            limited = Some(body);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let body = limited.expect("a burst of 30 dry runs is cut");
    assert!(
        body.to_string().contains("limits.max_dry_runs_per_second"),
        "says which limit: {body}"
    );
    // 5 at once, 5 a second after.
    let allowed = 5.0 + 5.0 * elapsed + 1.0;
    assert!(
        (receiver.count() as f64) <= allowed,
        "{} deliveries in {elapsed:.1} s",
        receiver.count()
    );
}

/// Many requests at once near a tenant's quota: one count of its pending
/// events runs, the others share it (`belfry_quota_counts_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_one_quota_count() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(
        dir.path(),
        &[("BELFRY_LIMITS__MAX_PENDING_EVENTS_PER_TENANT", "1000")],
    )
    .await;
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": "http://127.0.0.1:9/hook" }),
    )
    .await;
    // The tenant's first writes on this node: each needs a count.
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..32 {
        let url = node.url("/v1/tenants/acme/events");
        writes.spawn(async move {
            post_json(
                &url,
                &json!({ "events": [{ "id": format!("c{i}"), "deliver_at": LATER }] }),
            )
            .await
        });
    }
    while let Some(answer) = writes.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let metrics = belfry_testkit::http_client()
        .get(node.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counts: f64 = metrics
        .lines()
        .find(|line| line.starts_with("belfry_quota_counts_total{kind=\"pending_events\"}"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("belfry_quota_counts_total is exported");
    assert!(
        counts <= 2.0,
        "{counts} counts for 32 concurrent first writes"
    );
}

async fn put_schedule(node: &BelfryProcess, tenant: &str, id: &str, body: Value) -> (u16, Value) {
    put_json(
        &node.url(&format!("/v1/tenants/{tenant}/schedules/{id}")),
        &body,
    )
    .await
}

/// 10,000 schedules firing every second are 600,000 occurrences a minute
/// (each a stored event with the schedule's payload, and a delivery),
/// all within the pending quota. With the default budget of 10,000
/// occurrences a minute, the 167th `@every 1s` schedule is refused with
/// a 429 that says why and stores nothing; a lower rate or a delete makes
/// room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_cannot_fire_past_the_tenant_s_occurrence_budget() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), &[]).await;
    tenant(
        &node,
        "greedy",
        json!({ "type": "http", "url": "http://127.0.0.1:9/hook" }),
    )
    .await;
    // Starting in 2099: nothing fires; each still counts at its peak.
    let every = |period: &str| {
        json!({
            "expression": format!("@every {period}"), "type": "every",
            "start_at": LATER, "payload": "x".repeat(1024),
        })
    };
    let mut refused = None;
    for i in 0..200 {
        let (status, body) = put_schedule(&node, "greedy", &format!("s{i}"), every("1s")).await;
        if status != 201 {
            refused = Some((i, status, body));
            break;
        }
    }
    let (created, status, body) = refused.expect("200 schedules firing every second are refused");
    assert_eq!(created, 166, "166 × 60 = 9,960 a minute fit in 10,000");
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("10020") && message.contains("limits.max_schedule_occurrences_per_minute"),
        "says how many and which limit: {message}"
    );
    let (status, _) = get_json(&node.url("/v1/tenants/greedy/schedules/s166")).await;
    assert_eq!(status, 404, "nothing was stored");

    // Lowering one (60 → 30 a minute) makes room for another every
    // second; raising it back is then refused; a delete makes room.
    let (status, body) = put_schedule(&node, "greedy", "s0", every("2s")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = put_schedule(&node, "greedy", "s166", every("1s")).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = put_schedule(&node, "greedy", "s0", every("1s")).await;
    assert_eq!(status, 429, "10,020 again: {body}");
    let (status, _) = put_schedule(&node, "greedy", "s167", every("1s")).await;
    assert_eq!(status, 429);
    let (status, body) = belfry_testkit::delete(&node.url("/v1/tenants/greedy/schedules/s1")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = put_schedule(&node, "greedy", "s167", every("1s")).await;
    assert_eq!(status, 201, "{body}");
}

/// Schedules that fit the budget when made, then a node with a lower
/// budget (the operator lowered it): each firing takes tokens, and the
/// occurrences past the budget are not created, only counted in the
/// schedule's `missed.over_budget`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occurrences_past_the_budget_are_not_created_when_schedules_fire() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let mut node = start(dir.path(), &[]).await;
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    let schedules = ids("tick", 5);
    for id in &schedules {
        let (status, body) = put_schedule(
            &node,
            "acme",
            id,
            json!({ "expression": "@every 1s", "type": "every", "payload": "p" }),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    node.terminate().await;
    let restarted_ms = now_ms();
    let node = start(
        dir.path(),
        &[("BELFRY_LIMITS__MAX_SCHEDULE_OCCURRENCES_PER_MINUTE", "6")],
    )
    .await;
    let started = tokio::time::Instant::now();
    let over_budget = |node: &BelfryProcess| {
        let urls: Vec<String> = schedules
            .iter()
            .map(|id| node.url(&format!("/v1/tenants/acme/schedules/{id}")))
            .collect();
        async move {
            let mut total = 0;
            for url in urls {
                let (_, body) = get_json(&url).await;
                total += body["missed"]["over_budget"].as_u64().unwrap_or(0);
            }
            total
        }
    };
    // Five schedules every second against 6 a minute: ~5 over a second.
    wait_until("firings pass the budget", || {
        let total = over_budget(&node);
        async move { (total.await >= 25).then_some(()) }
    })
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    // Occurrences after the lead of the first node were created by this one.
    let created_after = restarted_ms + 6_000;
    let mut created = 0;
    for id in &schedules {
        let (_, body) = get_json(&node.url(&format!(
            "/v1/tenants/acme/schedules/{id}/occurrences?limit=1000"
        )))
        .await;
        created += body["occurrences"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| {
                let at = o["scheduled_at"].as_str().unwrap();
                belfry_core::Timestamp::parse_rfc3339(at)
                    .unwrap()
                    .as_millis()
                    > created_after
            })
            .count();
    }
    let allowed = 6.0 + 6.0 * elapsed / 60.0 + 1.0;
    assert!(
        (created as f64) <= allowed,
        "{created} occurrences created in {elapsed:.1} s against a budget of 6 a minute"
    );
}

/// A bulk redrive makes failed events pending again, page by page: at the
/// pending quota it stops, recorded as failed with the reason, and the
/// events it did not reach stay failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_redrive_stops_at_the_pending_quota() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.set_default_status(400);
    let node = start(
        dir.path(),
        &[
            ("BELFRY_LIMITS__MAX_PENDING_EVENTS_PER_TENANT", "3"),
            ("BELFRY_ENGINE__BULK_PAGE_SIZE", "1"),
        ],
    )
    .await;
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    let dead = ids("dead", 2);
    schedule(&node, "acme", &dead, &rfc3339(now_ms())).await;
    for id in &dead {
        wait_until("the event fails for good", || {
            let status = status_of(&node, "acme", id);
            async move { (status.await == "failed").then_some(()) }
        })
        .await;
    }
    // Refused until the node's estimate, a second old, is counted again
    // without the failed events (docs/security.md, "Precision").
    wait_until("two pending events fit", || {
        let url = node.url("/v1/tenants/acme/events");
        let batch = json!({ "events": [
            { "id": "e0", "deliver_at": LATER }, { "id": "e1", "deliver_at": LATER },
        ] });
        async move { (post_json(&url, &batch).await.0 == 200).then_some(()) }
    })
    .await;
    // A redriven event is then retried, so it stays pending.
    receiver.set_default_status(503);
    // Two pending and two failed under a quota of three: the first page
    // fits, the second would pass it.
    let (status, body) = post_json(
        &node.url("/v1/bulk-actions"),
        &json!({ "action": "redrive", "filter": { "tenant": "acme", "status": "failed" } }),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let url = node.url(&format!(
        "/v1/bulk-actions/{}",
        body["id"].as_str().unwrap()
    ));
    let action = wait_until("the bulk redrive ends", || {
        let url = url.clone();
        async move {
            let (_, body) = get_json(&url).await;
            (body["state"] != "running").then_some(body)
        }
    })
    .await;
    assert_eq!(action["state"], "failed", "{action}");
    let reason = action["error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("limits.max_pending_events_per_tenant"),
        "says why: {action}"
    );
    let mut still_failed = 0;
    for id in &dead {
        if status_of(&node, "acme", id).await == "failed" {
            still_failed += 1;
        }
    }
    assert_eq!(
        still_failed, 1,
        "the first page was redriven, the second stopped at the quota"
    );
}

/// A dry run is a delivery to the tenant's receiver: it takes a token of
/// the tenant's delivery rate too, so a burst of dry runs cannot pass the
/// rate its operator set to protect that receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_take_from_the_tenant_s_delivery_rate() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let config = dir.path().join("belfry.toml");
    std::fs::write(
        &config,
        "[limits.tenants.\"acme\"]\nmax_deliveries_per_second = 2\n",
    )
    .unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
        .arg("--config")
        .arg(config.to_str().unwrap());
    let node = BelfryProcess::start(launch).await.expect("belfry starts");
    tenant(
        &node,
        "acme",
        json!({ "type": "http", "url": receiver.url("/hook") }),
    )
    .await;
    schedule(&node, "acme", &ids("e", 1), LATER).await;
    let started = tokio::time::Instant::now();
    let mut limited = Vec::new();
    for _ in 0..30 {
        let (status, body) =
            post_json(&node.url("/events/dryrun?tenant=acme&id=e0"), &json!({})).await;
        if status == 429 {
            limited.push(body.to_string());
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        limited
            .iter()
            .any(|body| body.contains("max_deliveries_per_second")),
        "one refusal names the delivery rate: {limited:?}"
    );
    // 2 at once, 2 a second after (the dry-run rate alone allows 5).
    let allowed = 2.0 + 2.0 * elapsed + 1.0;
    assert!(
        (receiver.count() as f64) <= allowed,
        "{} deliveries in {elapsed:.1} s",
        receiver.count()
    );
}
