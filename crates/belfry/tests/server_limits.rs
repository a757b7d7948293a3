//! The listener's limits on a real `belfry serve` process: a connection
//! that sends half a request is closed within the configured timeout while
//! other clients keep being served.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Scheduling slack on a shared, loaded machine.
const MARGIN: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_is_closed_in_time_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(1_000);
    let node = BelfryProcess::start(
        BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data")).env(
            "BELFRY_SERVER__HEADER_READ_TIMEOUT_MS",
            timeout.as_millis().to_string(),
        ),
    )
    .await
    .expect("belfry starts");

    let mut stuck = TcpStream::connect(("127.0.0.1", node.port()))
        .await
        .unwrap();
    stuck
        .write_all(b"POST /events/schedule HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let closed = tokio::spawn(async move {
        let mut answer = Vec::new();
        let _ = stuck.read_to_end(&mut answer).await;
        (started.elapsed(), answer)
    });

    let mut served = 0;
    while !closed.is_finished() {
        let (status, body) = get_json(&node.url("/ping")).await;
        assert_eq!(status, 200, "{body}");
        served += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (elapsed, answer) = closed.await.unwrap();
    assert!(served >= 2, "others were served meanwhile ({served})");
    assert!(
        elapsed >= timeout - Duration::from_millis(100),
        "{elapsed:?}"
    );
    assert!(elapsed <= timeout + MARGIN, "closed after {elapsed:?}");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
}
