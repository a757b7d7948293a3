//! Bulk actions across a crash: a real `belfry` process, killed with -9
//! in the middle of a bulk cancel of 20,000 events, resumes the action
//! after its restart and completes it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json, post_json, put_json};
use serde_json::{Value, json};

const EVENTS: usize = 20_000;
const PAGE: usize = 200;
const DEADLINE: Duration = Duration::from_secs(120);

/// How many of the tenant's events have `status`, paging through the
/// listing.
async fn count(node: &BelfryProcess, status: &str) -> usize {
    let mut total = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tenants/acme/events?status={status}&limit=1000");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (code, page) = get_json(&node.url(&path)).await;
        assert_eq!(code, 200, "{page}");
        total += page["events"].as_array().unwrap().len();
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return total,
        }
    }
}

async fn view(node: &BelfryProcess, id: &str) -> Value {
    let (code, body) = get_json(&node.url(&format!("/v1/bulk-actions/{id}"))).await;
    assert_eq!(code, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_a_bulk_action_resumes_it_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    // A pause between pages spreads the 100 pages over at least 5 s, so
    // the kill lands in the middle.
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
        .env("BELFRY_ENGINE__BULK_PAGE_SIZE", PAGE.to_string())
        .env("BELFRY_ENGINE__BULK_PAGE_PAUSE_MS", "50");
    let mut node = BelfryProcess::start(launch).await.expect("belfry starts");
    let (code, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({ "sink": { "type": "builtin", "processor": "log" } }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    for chunk in (0..EVENTS).collect::<Vec<_>>().chunks(5_000) {
        let events: Vec<Value> = chunk
            .iter()
            .map(|i| json!({ "id": format!("e{i:05}"), "deliver_at": "2099-01-31T04:00:30Z" }))
            .collect();
        let (code, body) = post_json(
            &node.url("/v1/tenants/acme/events"),
            &json!({ "events": events }),
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(body["rejected"], 0);
        assert_eq!(body["failed"], 0);
    }

    let (code, created) = post_json(
        &node.url("/v1/bulk-actions"),
        &json!({ "action": "cancel", "filter": { "tenant": "acme", "status": "scheduled" } }),
    )
    .await;
    assert_eq!(code, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let before_kill = loop {
        let current = view(&node, &id).await;
        if current["matched"].as_u64().unwrap() >= 10 * PAGE as u64 {
            break current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress: {current}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(before_kill["state"], "running", "{before_kill}");
    node.kill_9();

    node.restart().await.expect("restart after kill -9");
    let after_restart = view(&node, &id).await;
    assert!(
        after_restart["matched"].as_u64() >= before_kill["matched"].as_u64(),
        "saved progress survives the crash: {before_kill} then {after_restart}"
    );
    let done = loop {
        let current = view(&node, &id).await;
        if current["state"] != "running" {
            break current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never resumed to the end: {current}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["state"], "completed", "{done}");
    let n = |field: &str| done[field].as_u64().unwrap() as usize;
    assert_eq!(
        n("matched"),
        n("succeeded") + n("skipped") + n("failed"),
        "{done}"
    );
    assert_eq!(n("failed"), 0, "{done}");
    // At most the page in progress at the kill went uncounted (its events
    // were cancelled but not saved as such); nothing was counted twice.
    assert!(
        n("matched") <= EVENTS && n("matched") + PAGE >= EVENTS,
        "{done}"
    );
    // Every event handled.
    assert_eq!(count(&node, "scheduled").await, 0);
    assert_eq!(count(&node, "cancelled").await, EVENTS);
    node.terminate().await;
}
