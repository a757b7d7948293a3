//! What answers may take of a real `belfry serve` process's memory: many
//! clients listing large events and reading their answers slowly must not
//! grow the node without bound, and a client that stops reading is cut
//! off after the write timeout.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, get_json, post_json, put_json};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TENANT: &str = "big";
/// The largest payload a node accepts by default (`limits.max_payload_bytes`).
const PAYLOAD_BYTES: usize = 256 * 1024;
/// Events per seeding request: three payloads fit the default 1 MiB body.
const SEED_BATCH: usize = 3;
/// Scheduling slack on a shared, loaded machine.
const MARGIN: Duration = Duration::from_secs(3);

fn events_url(node: &BelfryProcess, query: &str) -> String {
    node.url(&format!("/v1/tenants/{TENANT}/events{query}"))
}

/// Registers the tenant and stores `count` events of the largest payload,
/// due in a day (none fires while the test runs).
async fn seed(node: &BelfryProcess, count: usize) {
    let (status, body) = put_json(
        &node.url(&format!("/v1/tenants/{TENANT}")),
        &json!({"sink": {"type": "http", "url": "http://127.0.0.1:9/hook"}}),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let deliver_at = "2099-01-01T00:00:00Z";
    let payload = "x".repeat(PAYLOAD_BYTES);
    let batches: Vec<Vec<usize>> = (0..count)
        .collect::<Vec<_>>()
        .chunks(SEED_BATCH)
        .map(<[usize]>::to_vec)
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for group in batches.chunks(batches.len().div_ceil(4)) {
        let group = group.to_vec();
        let url = events_url(node, "");
        let payload = payload.clone();
        tasks.spawn(async move {
            for batch in group {
                let events: Vec<Value> = batch
                    .iter()
                    .map(|i| json!({"id": format!("e{i:05}"), "deliver_at": deliver_at, "payload": payload}))
                    .collect();
                let (status, body) = post_json(&url, &json!({ "events": events })).await;
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["rejected"], 0, "{body}");
                assert_eq!(body["failed"], 0, "{body}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// The node's resident set, from `/proc`.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Sends `GET path` on a fresh connection (with a small receive buffer,
/// so that the kernel holds little of an answer) and returns it unread.
async fn request(node: &BelfryProcess, path: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stream = socket
        .connect(([127, 0, 0, 1], node.port()).into())
        .await
        .unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    stream
}

/// Splits a whole HTTP/1.1 answer into its head and its body; a chunked
/// body is decoded.
fn split_answer(raw: &[u8]) -> (String, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let mut body = raw[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let mut decoded = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            if size == 0 {
                break;
            }
            decoded.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest = &rest[line_end + 2 + size + 2..];
        }
        body = decoded;
    }
    (head, body)
}

/// 50 clients list 1,000 events of 256 KiB each (the largest page) at
/// once and read their answers at 1 MiB/s: the node's resident memory
/// stays under 1 GiB the whole time, every client gets a valid page, and
/// paging on walks every event exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_of_large_listings_cannot_take_the_nodes_memory() {
    const CLIENTS: usize = 50;
    const EVENTS: usize = 1_000;
    const BOUND: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let mut node = BelfryProcess::start(BelfryLaunch::new(
        env!("CARGO_BIN_EXE_belfry"),
        dir.path().join("data"),
    ))
    .await
    .expect("belfry starts");
    let pid = node.pid().expect("the node runs");
    seed(&node, EVENTS).await;
    let before = rss_bytes(pid).unwrap();

    let path = format!("/v1/tenants/{TENANT}/events?limit={EVENTS}");
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let mut stream = request(&node, &path).await;
        clients.spawn(async move {
            let mut answer = Vec::new();
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buffer[..n]),
                }
                // About 1 MiB/s: slow next to the node, fast enough to end.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            answer
        });
    }

    // Watched until every client has its answer (each bounded by the
    // write timeout); a node past the bound is stopped at once, before it
    // takes the machine's memory.
    let mut peak = before;
    let watch = async {
        loop {
            let rss = rss_bytes(pid).unwrap_or(0);
            peak = peak.max(rss);
            if rss > BOUND {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut answers = Vec::new();
    let all_read = async {
        while let Some(answer) = clients.join_next().await {
            answers.push(answer.unwrap());
        }
    };
    tokio::select! {
        () = watch => {
            node.kill_9();
            panic!(
                "the node's memory grew from {} MiB past {} MiB while {CLIENTS} clients read",
                before >> 20,
                BOUND >> 20
            );
        }
        () = all_read => {}
    }
    eprintln!(
        "resident memory: {} MiB before, {} MiB at most while {CLIENTS} clients read",
        before >> 20,
        peak >> 20
    );

    for raw in &answers {
        let (head, body) = split_answer(raw);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let page: Value = serde_json::from_slice(&body).expect("a whole JSON page");
        let listed = page["events"].as_array().unwrap().len();
        assert!(listed >= 1, "at least one event per page");
        assert!(
            listed < EVENTS,
            "a page is bounded by its bytes ({listed} events)"
        );
        assert!(page["next_cursor"].is_string(), "more pages follow");
    }

    // Byte-bounded pages still walk every event exactly once, in order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(c) => format!("?limit={EVENTS}&cursor={c}"),
            None => format!("?limit={EVENTS}"),
        };
        let (status, page) = get_json(&events_url(&node, &query)).await;
        assert_eq!(status, 200, "{page}");
        for event in page["events"].as_array().unwrap() {
            assert_eq!(event["payload"].as_str().map(str::len), Some(PAYLOAD_BYTES));
            seen.push(event["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..EVENTS).map(|i| format!("e{i:05}")).collect();
    assert_eq!(seen, expected);
}

/// A client that asks for a large listing and then reads nothing is cut
/// off once the node's writes to it have made no progress for
/// `server.write_timeout_ms`; others are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_after_the_write_timeout() {
    let timeout = Duration::from_millis(1_000);
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(
        BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data")).env(
            "BELFRY_SERVER__WRITE_TIMEOUT_MS",
            timeout.as_millis().to_string(),
        ),
    )
    .await
    .expect("belfry starts");
    seed(&node, 60).await;

    let mut stuck = request(&node, &format!("/v1/tenants/{TENANT}/events?limit=1000")).await;
    let started = Instant::now();
    // The node writes what the socket buffers take, then waits on a client
    // that reads nothing; it must give up on its own.
    let mut served = 0;
    while started.elapsed() < timeout + MARGIN {
        let (status, body) = get_json(&node.url("/ping")).await;
        assert_eq!(status, 200, "{body}");
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served >= 2, "others were served meanwhile ({served})");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(MARGIN, async {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match stuck.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection was closed");
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n");
    let head = String::from_utf8_lossy(&answer[..end.unwrap_or(answer.len())]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("a sized answer");
    let received = answer.len() - end.unwrap() - 4;
    assert!(
        received < length,
        "the answer was cut off ({received} of {length} bytes)"
    );
}

/// With the node's answer budget spent by a client that reads nothing,
/// the next listing waits briefly and is refused with `503 answers_busy`
/// and `Retry-After` (small answers still go out); once the write timeout
/// has cut the stuck client off, listings are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_answer_budget_refuses_listings_until_the_stuck_reader_is_cut_off() {
    let write_timeout = Duration::from_millis(3_000);
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(
        BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
            .env(
                "BELFRY_SERVER__WRITE_TIMEOUT_MS",
                write_timeout.as_millis().to_string(),
            )
            // Room for one answer of the default 4 MiB.
            .env("BELFRY_API__MAX_ANSWER_BYTES_IN_FLIGHT", "4194304"),
    )
    .await
    .expect("belfry starts");
    seed(&node, 30).await;
    let list = events_url(&node, "?limit=1000");

    let mut stuck = request(&node, &format!("/v1/tenants/{TENANT}/events?limit=1000")).await;
    // Its answer has begun: the budget is its own. Then it reads no more.
    let mut first = [0u8; 1024];
    assert!(stuck.read(&mut first).await.unwrap() > 0);
    let started = Instant::now();
    let refused = belfry_testkit::http_client()
        .get(&list)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 503);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "answers_busy", "{body}");
    assert!(started.elapsed() < write_timeout, "{:?}", started.elapsed());
    let (status, one) = get_json(&events_url(&node, "/e00000")).await;
    assert_eq!(status, 200, "{one}");

    // Cut off after the write timeout, the stuck reader's room comes back.
    let answered = loop {
        let (status, page) = get_json(&list).await;
        if status == 200 {
            break page;
        }
        assert_eq!(status, 503, "{page}");
        assert!(
            started.elapsed() < write_timeout + MARGIN + MARGIN,
            "still refused after {:?}",
            started.elapsed()
        );
    };
    assert!(!answered["events"].as_array().unwrap().is_empty());
}
