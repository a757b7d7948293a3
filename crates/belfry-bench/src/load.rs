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

/// The admin API key of `--with-api-key`: the started node gets it as its
/// bootstrap key, and every client sends it.
pub static API_KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A keep-alive client sized for `concurrency` connections.
///
/// # Errors
/// When the TLS backend cannot be set up.
pub fn client(concurrency: usize) -> anyhow::Result<reqwest::Client> {
    belfry_testkit::install_crypto_provider();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = API_KEY.get() {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))?,
        );
    }
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(concurrency.max(1))
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .redirect(reqwest::redirect::Policy::none())
        .build()?)
}

/// Request `n`'s body and how many events it carries, or `None` past the
/// last request.
type BodyFn = dyn Fn(usize) -> Option<(Bytes, usize)> + Send + Sync;

/// The requests of an ingest: built up front, or made on demand (millions
/// of events whose bodies would not fit in memory at once).
#[derive(Clone)]
pub struct Bodies {
    pub events: usize,
    pub requests: usize,
    get: Arc<BodyFn>,
}

impl Bodies {
    pub fn prebuilt(bodies: Vec<(Bytes, usize)>) -> Self {
        let events = bodies.iter().map(|(_, n)| n).sum();
        let requests = bodies.len();
        let bodies = Arc::new(bodies);
        Bodies {
            events,
            requests,
            get: Arc::new(move |n| bodies.get(n).cloned()),
        }
    }

    /// `requests` requests carrying `events` events in all, request `n`
    /// made by `make(n)` when it is sent.
    pub fn on_demand(
        events: usize,
        requests: usize,
        make: impl Fn(usize) -> (Bytes, usize) + Send + Sync + 'static,
    ) -> Self {
        Bodies {
            events,
            requests,
            get: Arc::new(move |n| (n < requests).then(|| make(n))),
        }
    }

    fn get(&self, n: usize) -> Option<(Bytes, usize)> {
        (self.get)(n)
    }
}

/// Sends every body with `concurrency` requests in flight; request `n`
/// goes to `urls[n % urls.len()]` (round-robin over a cluster's nodes).
pub async fn run(
    client: &reqwest::Client,
    urls: &[String],
    bodies: Bodies,
    batch: usize,
    concurrency: usize,
    label: &str,
) -> IngestReport {
    let events = bodies.events;
    let requests = bodies.requests;
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
        let bodies = bodies.clone();
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
                let outcome = send_one(&client, url, body, count).await;
                latencies_us.push(sent.elapsed().as_micros() as i64);
                match outcome {
                    Ok(acked) => {
                        progress.acknowledged.fetch_add(acked, Ordering::Relaxed);
                        progress
                            .unacknowledged
                            .fetch_add(count as u64 - acked, Ordering::Relaxed);
                    }
                    Err(error) => {
                        progress.failed_requests.fetch_add(1, Ordering::Relaxed);
                        progress
                            .unacknowledged
                            .fetch_add(count as u64, Ordering::Relaxed);
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

/// An ingest stream at a steady rate beside another measurement (the
/// `mixed` scenario): request `n` is sent at `start + n × batch / rate`,
/// with at most `concurrency` in flight; when the node answers slower than
/// that the stream falls behind (reported as its lag) instead of queueing
/// without bound.
pub struct PacedStream {
    acknowledged: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<PacedReport>,
}

/// What a paced stream achieved.
#[derive(Debug, Clone, Serialize)]
pub struct PacedReport {
    pub ingest: IngestReport,
    /// The rate asked for.
    pub offered_events_per_s: f64,
    /// The most a request was sent after its slot (all `concurrency`
    /// requests were still in flight), in ms.
    pub max_lag_ms: f64,
}

/// How a [`PacedStream`] sends: `rate` events/s in requests of `batch`
/// events, at most `concurrency` in flight, the last one before
/// `stop_at_ms` (wall clock).
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    pub rate: u64,
    pub batch: usize,
    pub concurrency: usize,
    pub stop_at_ms: i64,
}

impl PacedStream {
    /// Starts sending now; `make(n)` builds request `n`.
    pub fn start(
        client: reqwest::Client,
        url: String,
        make: impl Fn(usize) -> (Bytes, usize) + Send + Sync + 'static,
        pace: Pace,
    ) -> PacedStream {
        let acknowledged = Arc::new(AtomicU64::new(0));
        let pace = Pace {
            rate: pace.rate.max(1),
            batch: pace.batch.max(1),
            concurrency: pace.concurrency.max(1),
            ..pace
        };
        let task = tokio::spawn(paced(client, url, make, pace, Arc::clone(&acknowledged)));
        PacedStream { acknowledged, task }
    }

    /// Events acknowledged so far.
    pub fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Relaxed)
    }

    /// Waits for the last answers.
    ///
    /// # Errors
    /// When the stream's task panicked.
    pub async fn finish(self) -> anyhow::Result<PacedReport> {
        Ok(self.task.await?)
    }
}

async fn paced(
    client: reqwest::Client,
    url: String,
    make: impl Fn(usize) -> (Bytes, usize) + Send + Sync + 'static,
    pace: Pace,
    acknowledged: Arc<AtomicU64>,
) -> PacedReport {
    let Pace {
        rate,
        batch,
        concurrency,
        stop_at_ms,
    } = pace;
    let started = tokio::time::Instant::now();
    let stop = started
        + Duration::from_millis(u64::try_from(stop_at_ms - crate::workload::now_ms()).unwrap_or(0));
    let slot = Duration::from_secs_f64(batch as f64 / rate as f64);
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let url = Arc::new(url);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut outcomes: Vec<(i64, usize, Result<u64, String>)> = Vec::new();
    let mut max_lag = Duration::ZERO;
    let mut sent_events = 0;
    let mut n: u32 = 0;
    loop {
        let at = started + slot * n;
        if at >= stop {
            break;
        }
        tokio::time::sleep_until(at).await;
        // The semaphore is never closed.
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        max_lag = max_lag.max(tokio::time::Instant::now() - at);
        let (body, count) = make(n as usize);
        sent_events += count;
        let (client, url, acknowledged) =
            (client.clone(), Arc::clone(&url), Arc::clone(&acknowledged));
        in_flight.spawn(async move {
            let sent = Instant::now();
            let outcome = send_one(&client, &url, body, count).await;
            if let Ok(acked) = outcome {
                acknowledged.fetch_add(acked, Ordering::Relaxed);
            }
            drop(permit);
            (sent.elapsed().as_micros() as i64, count, outcome)
        });
        while let Some(done) = in_flight.try_join_next() {
            // A request task only panics on a bug of this tool.
            outcomes.push(done.expect("paced request panicked"));
        }
        n += 1;
    }
    while let Some(done) = in_flight.join_next().await {
        outcomes.push(done.expect("paced request panicked"));
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let mut latencies_us: Vec<i64> = outcomes.iter().map(|(us, _, _)| *us).collect();
    let acked: u64 = outcomes
        .iter()
        .filter_map(|(_, _, o)| o.as_ref().ok())
        .sum();
    let failed = outcomes.iter().filter(|(_, _, o)| o.is_err()).count() as u64;
    let first_error = outcomes
        .iter()
        .find_map(|(_, _, o)| o.as_ref().err().cloned());
    PacedReport {
        ingest: IngestReport {
            events: sent_events,
            requests: outcomes.len(),
            batch,
            concurrency,
            acknowledged_events: acked,
            unacknowledged_events: sent_events as u64 - acked,
            failed_requests: failed,
            first_error,
            seconds: elapsed,
            events_per_s: acked as f64 / elapsed,
            requests_per_s: outcomes.len() as f64 / elapsed,
            latency_ms: Percentiles::of(&mut latencies_us).map(|p| p.scaled(1000.0)),
            finished_at_ms: crate::workload::now_ms(),
        },
        offered_events_per_s: rate as f64,
        max_lag_ms: max_lag.as_secs_f64() * 1000.0,
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
    // A `/v1` batch answers 200 with its counts of refused items.
    if status == 200 && memchr::memmem::find(&answer, b"\"results\"").is_some() {
        return if memchr::memmem::find(&answer, b"\"rejected\":0,\"failed\":0").is_some() {
            Ok(count as u64)
        } else {
            Err(format!(
                "items refused: {}",
                String::from_utf8_lossy(&answer[answer.len().saturating_sub(300)..])
            ))
        };
    }
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
