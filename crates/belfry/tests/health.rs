//! `/health/ready` of a real cluster-mode `belfry` process while its
//! PostgreSQL (a private throwaway server) goes down and comes back.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::Duration;

use belfry_testkit::postgres::PgServer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json};
use serde_json::{Value, json};

/// Generous: the node notices within its probe timeout (2 s) and reuse
/// (1 s), but two cores are shared with other processes.
const SETTLE: Duration = Duration::from_secs(60);

/// Polls `path` until it answers `status`; returns that body.
async fn answers(node: &BelfryProcess, path: &str, status: u16) -> Value {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let (got, body) = get_json(&node.url(path)).await;
        if got == status {
            return body;
        }
        if tokio::time::Instant::now() >= deadline {
            node.print_logs();
            panic!("{path} never answered {status}: last {got} {body}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_503_while_postgres_is_down_and_200_once_it_is_back() {
    // A private server: this test stops it.
    let server = PgServer::launch().expect("a private PostgreSQL");
    let url = server.create_database("health").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("unused"))
        .arg("--database-url")
        .arg(&url);
    let node = BelfryProcess::start(launch).await.expect("node starts");

    assert_eq!(
        answers(&node, "/health/ready", 200).await,
        json!({ "status": "ready" })
    );

    server.stop_immediate().unwrap();
    let down = answers(&node, "/health/ready", 503).await;
    assert_eq!(down["status"], "not_ready", "{down}");
    assert_eq!(
        down["reason"], "store_unavailable",
        "the outage, not the partitions reloading because of it: {down}"
    );
    let text = down.to_string();
    for internal in ["postgres", "127.0.0.1", "5432", "connection"] {
        assert!(
            !text.to_lowercase().contains(internal),
            "{internal} leaked: {text}"
        );
    }
    // The process still serves HTTP.
    let (live, _) = get_json(&node.url("/health/live")).await;
    assert_eq!(live, 200);

    server.start().unwrap();
    assert_eq!(
        answers(&node, "/health/ready", 200).await,
        json!({ "status": "ready" })
    );
}
