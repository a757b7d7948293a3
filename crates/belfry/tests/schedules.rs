//! Recurring schedules through a kill -9 of the real binary: every
//! occurrence ends in its history, each misfire policy does what it says,
//! and nothing delivered is delivered again (beyond the one in flight at
//! the kill, which at-least-once allows).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashMap;
use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json, put_json};
use serde_json::{Value, json};

mod common;
use common::now_ms;

const TENANT: &str = "acme";
const DEADLINE: Duration = Duration::from_secs(60);
/// Occurrences are created this long ahead (configured below).
const LEAD_MS: i64 = 1_000;
/// Occurrences reached more than this late count as misfired.
const MISFIRE_THRESHOLD_MS: i64 = 3_000;
const DOWNTIME: Duration = Duration::from_secs(15);
const POLICIES: [(&str, &str); 3] = [
    ("once", r#"{"policy": "fire_once"}"#),
    ("all", r#"{"policy": "fire_all", "cap": 100}"#),
    ("skip", r#"{"policy": "skip"}"#),
];

/// `(id, scheduled_at ms, status)` of a schedule's occurrences.
async fn history(node: &BelfryProcess, id: &str) -> Vec<(String, i64, String)> {
    let (status, body) = get_json(&node.url(&format!(
        "/v1/tenants/{TENANT}/schedules/{id}/occurrences?limit=1000"
    )))
    .await;
    assert_eq!(status, 200, "{body}");
    body["occurrences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let at = belfry_core::Timestamp::parse_rfc3339(o["scheduled_at"].as_str().unwrap())
                .unwrap()
                .as_millis();
            (
                o["id"].as_str().unwrap().to_string(),
                at,
                o["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_survive_kill_9_with_their_misfire_policies() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
        .env("BELFRY_ENGINE__SCHEDULE_LEAD_MS", LEAD_MS.to_string())
        .env(
            "BELFRY_ENGINE__SCHEDULE_MISFIRE_THRESHOLD_MS",
            MISFIRE_THRESHOLD_MS.to_string(),
        );
    let mut node = BelfryProcess::start(launch).await.expect("belfry starts");
    let (status, body) = post_json(
        &node.url("/events/tenant/register"),
        &json!({"tenant": TENANT, "type": "HTTP", "props": {"url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for (id, misfire) in POLICIES {
        let misfire: Value = serde_json::from_str(misfire).unwrap();
        let (status, body) = put_json(
            &node.url(&format!("/v1/tenants/{TENANT}/schedules/{id}")),
            &json!({"expression": "@every 2s", "type": "every", "misfire": misfire}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    // A few on-time deliveries of each before the kill.
    receiver.wait_for_count(6, DEADLINE).await.unwrap();
    let killed_at = now_ms();
    node.kill_9();
    tokio::time::sleep(DOWNTIME).await;
    let restarted_at = now_ms();
    node.restart().await.expect("belfry restarts");

    // Wait until every occurrence up to the restart has a final status.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut histories = HashMap::new();
    for (id, _) in POLICIES {
        loop {
            let found = history(&node, id).await;
            let settled = found
                .iter()
                .filter(|(_, at, _)| *at <= restarted_at)
                .all(|(_, _, status)| status == "delivered" || status == "missed");
            let reached = found.last().is_some_and(|(_, at, _)| *at > restarted_at);
            if settled && reached {
                histories.insert(id, found);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never settled: {found:?}\n{}",
                node.logs_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let requests = receiver.requests();
    for (id, _) in POLICIES {
        let found = &histories[id];
        // Every occurrence, once, 2 s apart: none vanished over the kill.
        for pair in found.windows(2) {
            assert_eq!(pair[1].1 - pair[0].1, 2_000, "{id}: a gap in {found:?}");
        }
        // Delivered occurrences reached the receiver under their id, and
        // only once, unless the delivery was in flight at the kill.
        for (occurrence, _, status) in found.iter().filter(|(_, _, s)| s == "delivered") {
            let arrivals: Vec<i64> = requests
                .iter()
                .filter(|r| r.header("x-belfry-event-id") == Some(occurrence.as_str()))
                .map(|r| r.arrived_at_ms)
                .collect();
            assert!(
                !arrivals.is_empty(),
                "{occurrence} is {status} but never arrived"
            );
            if arrivals.len() > 1 {
                assert!(
                    arrivals.len() == 2 && (arrivals[0] - killed_at).abs() < 1_000,
                    "{occurrence} delivered {} times: {arrivals:?}",
                    arrivals.len()
                );
            }
        }
        // Occurrences surely created after the restart and surely more than
        // the threshold late when planned: the misfire policy decided them.
        let missed_window: Vec<&(String, i64, String)> = found
            .iter()
            .filter(|(_, at, _)| {
                *at > killed_at + LEAD_MS + 1_000
                    && *at < restarted_at - MISFIRE_THRESHOLD_MS - 1_000
            })
            .collect();
        assert!(missed_window.len() >= 3, "{id}: {missed_window:?}");
        let delivered = missed_window
            .iter()
            .filter(|(_, _, s)| s == "delivered")
            .count();
        let missed = missed_window
            .iter()
            .filter(|(_, _, s)| s == "missed")
            .count();
        assert_eq!(delivered + missed, missed_window.len(), "{id}");
        match id {
            "once" => assert!(delivered <= 1 && missed >= 2, "{id}: {missed_window:?}"),
            "all" => assert_eq!(missed, 0, "{id}: {missed_window:?}"),
            _ => assert_eq!(delivered, 0, "{id}: {missed_window:?}"),
        }
        // fire_once delivers exactly one late occurrence over the downtime.
        if id == "once" {
            let late_delivered = found
                .iter()
                .filter(|(_, at, s)| {
                    s == "delivered"
                        && *at > killed_at + LEAD_MS + 1_000
                        && *at < restarted_at - MISFIRE_THRESHOLD_MS
                })
                .count();
            assert!(late_delivered <= 1, "{found:?}");
        }
        // No occurrence ends any other way.
        assert!(
            found
                .iter()
                .all(|(_, _, s)| ["delivered", "missed", "scheduled", "retrying"]
                    .contains(&s.as_str())),
            "{id}: {found:?}"
        );
    }

    // The schedules carry on after the restart.
    let (status, body) = get_json(&node.url(&format!("/v1/tenants/{TENANT}/schedules/skip"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "active");
    assert!(body["missed"]["recorded"].as_u64().unwrap() >= 3, "{body}");
    node.terminate().await;
}
