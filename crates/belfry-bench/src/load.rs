//! The generator: sends pre-serialized `POST /events/schedule` bodies with a
//! fixed number of requests in flight, and counts what was acknowledged.
//!
//! An event counts as acknowledged only when its request got `200` (every
//! item stored, fsynced by the node before answering) and the answer holds
//! no `ERROR` item; a `206` is parsed to count the stored items exactly.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::stats::Percentiles;

/// What one ingest phase achieved.
#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub events: usize,
    pub requests: usize,
    pub batch: usize,
    pub concurrency: usize,
    pub acknowledged_events: u64,
    pub unacknowledged_events: u64,
    pub failed_requests: u64,
    /// The first failure seen, for the reader.
    pub first_error: Option<String>,
    pub seconds: f64,
    pub events_per_s: f64,
    pub requests_per_s: f64,
    /// Request latency (send → full answer read), in ms.
    pub latency_ms: Option<Percentiles>,
    /// Wall-clock ms when the last answer arrived.
    #[serde(skip)]
    pub finished_at_ms: i64,
}

/// Counters shared by the workers and the progress line.
#[derive(Default)]
struct Progress {
    next_request: AtomicUsize,
    acknowledged: AtomicU64,
    unacknowledged: AtomicU64,
    failed_requests: AtomicU64,
}

/// A keep-alive client sized for `concurrency` connections.
///
/// # Errors
/// When the TLS backend cannot be set up.
pub fn client(concurrency: usize) -> anyhow::Result<reqwest::Client> {
    belfry_testkit::install_crypto_provider();
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency.max(1))
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .redirect(reqwest::redirect::Policy::none())
        .build()?)
}

/// Sends every body with `concurrency` requests in flight; request `n`
/// goes to `urls[n % urls.len()]` (round-robin over a cluster's nodes).
pub async fn run(
    client: &reqwest::Client,
    urls: &[String],
    bodies: Vec<(Bytes, usize)>,
    batch: usize,
    concurrency: usize,
    label: &str,
) -> IngestReport {
    let events: usize = bodies.iter().map(|(_, n)| n).sum();
    let requests = bodies.len();
    let bodies = Arc::new(bodies);
    let progress = Arc::new(Progress::default());
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let started = Instant::now();
    let ticker = tokio::spawn(print_progress(
        Arc::clone(&progress),
        events as u64,
        started,
        label.to_string(),
    ));

    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let client = client.clone();
        let urls = urls.to_vec();
        let bodies = Arc::clone(&bodies);
        let progress = Arc::clone(&progress);
        let first_error = Arc::clone(&first_error);
        workers.spawn(async move {
            let mut latencies_us = Vec::new();
            loop {
                let index = progress.next_request.fetch_add(1, Ordering::Relaxed);
                let Some((body, count)) = bodies.get(index) else {
                    break;
                };
                let url = &urls[index % urls.len().max(1)];
                let sent = Instant::now();
                let outcome = send_one(&client, url, body.clone(), *count).await;
                latencies_us.push(sent.elapsed().as_micros() as i64);
                match outcome {
                    Ok(acked) => {
                        progress.acknowledged.fetch_add(acked, Ordering::Relaxed);
                        progress
                            .unacknowledged
                            .fetch_add(*count as u64 - acked, Ordering::Relaxed);
                    }
                    Err(error) => {
                        progress.failed_requests.fetch_add(1, Ordering::Relaxed);
                        progress
                            .unacknowledged
                            .fetch_add(*count as u64, Ordering::Relaxed);
                        let mut first = first_error
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        first.get_or_insert(error);
                    }
                }
            }
            latencies_us
        });
    }
    let mut latencies_us = Vec::with_capacity(requests);
    while let Some(done) = workers.join_next().await {
        // A worker only panics on a bug of this tool; surface it.
        latencies_us.extend(done.expect("ingest worker panicked"));
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    ticker.abort();
    clear_progress_line();

    let acknowledged = progress.acknowledged.load(Ordering::Relaxed);
    let first_error = first_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    IngestReport {
        events,
        requests,
        batch,
        concurrency,
        acknowledged_events: acknowledged,
        unacknowledged_events: progress.unacknowledged.load(Ordering::Relaxed),
        failed_requests: progress.failed_requests.load(Ordering::Relaxed),
        first_error,
        seconds: elapsed,
        events_per_s: acknowledged as f64 / elapsed,
        requests_per_s: requests as f64 / elapsed,
        latency_ms: Percentiles::of(&mut latencies_us).map(|p| p.scaled(1000.0)),
        finished_at_ms: crate::workload::now_ms(),
    }
}

/// One request; `Ok(events acknowledged)`, or why none was.
async fn send_one(
    client: &reqwest::Client,
    url: &str,
    body: Bytes,
    count: usize,
) -> Result<u64, String> {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = response.status().as_u16();
    let answer = response
        .bytes()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    let has_error_item = memchr::memmem::find(&answer, b"\"ERROR\"").is_some();
    match status {
        200 if !has_error_item => Ok(count as u64),
        200 | 206 => Ok(count_stored(&answer)),
        _ => Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(300)])
        )),
    }
}

/// Items of a schedule answer that were stored (`ACCEPTED` / `UPDATED` /
/// `TRIGGERED`).
fn count_stored(answer: &[u8]) -> u64 {
    let Ok(items) = serde_json::from_slice::<Vec<serde_json::Value>>(answer) else {
        return 0;
    };
    items
        .iter()
        .filter(|item| {
            matches!(
                item["eventStatus"].as_str(),
                Some("ACCEPTED" | "UPDATED" | "TRIGGERED")
            )
        })
        .count() as u64
}

async fn print_progress(progress: Arc<Progress>, total: u64, started: Instant, label: String) {
    let mut interval = tokio::time::interval(Duration::from_secs(1));
    interval.tick().await;
    loop {
        interval.tick().await;
        let acked = progress.acknowledged.load(Ordering::Relaxed);
        let failed = progress.failed_requests.load(Ordering::Relaxed);
        let rate = acked as f64 / started.elapsed().as_secs_f64();
        progress_line(&format!(
            "{label}: {acked}/{total} acknowledged, {rate:.0} events/s, {failed} failed requests"
        ));
    }
}

/// Prints a progress line on stderr: rewritten in place on a terminal, one
/// line each otherwise.
pub fn progress_line(text: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K{text}");
    } else {
        eprintln!("{text}");
    }
}

/// Ends an in-place progress line.
pub fn clear_progress_line() {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_answers_count_only_stored_items() {
        let answer = br#"[{"eventStatus":"ACCEPTED"},{"eventStatus":"ERROR"},{"eventStatus":"REJECTED"},{"eventStatus":"UPDATED"}]"#;
        assert_eq!(count_stored(answer), 2);
        assert_eq!(count_stored(b"not json"), 0);
    }
}
