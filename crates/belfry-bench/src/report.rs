//! The result of one scenario: JSON for machines, a table for people.

use serde::Serialize;

use crate::deliveries::DeliveryReport;
use crate::load::IngestReport;
use crate::stats::{CpuSplit, Percentiles, ProcessSample};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: &'static str,
    /// The settings of the run, as given or defaulted.
    pub params: serde_json::Value,
    pub ingest: Option<IngestReport>,
    pub delivery: Option<DeliveryReport>,
    pub node: Option<NodeReport>,
    pub backlog: Option<BacklogReport>,
    /// CPU this tool (generator + receiver) used over the same interval as
    /// `node.cpu_during_run`: it shares the machine with the node.
    pub bench_cpu: Option<CpuSplit>,
    /// Things that make the numbers less trustworthy (e.g. ingest still
    /// running when events came due).
    pub warnings: Vec<String>,
}

/// The node's resource use.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// `VmHWM` at the end of the run.
    pub peak_rss_bytes: u64,
    /// `VmRSS` at the end of the run.
    pub rss_bytes: u64,
    /// CPU the node used from the start of the scenario to its end.
    pub cpu_during_run: CpuSplit,
}

impl NodeReport {
    pub fn between(before: &ProcessSample, after: &ProcessSample) -> Self {
        NodeReport {
            peak_rss_bytes: after.peak_rss_bytes,
            rss_bytes: after.rss_bytes,
            cpu_during_run: after.cpu_since(before),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BacklogReport {
    pub pending_events: u64,
    /// Sum of file sizes in the data dir (includes preallocated, still
    /// sparse, log space).
    pub data_dir_bytes: u64,
    /// Blocks allocated on disk for them (what `du` reports).
    pub data_dir_allocated_bytes: u64,
    /// Allocated bytes per pending event.
    pub bytes_per_event: f64,
    pub rss_before_restart_bytes: Option<u64>,
    /// From spawning the new process after kill -9 to its first `200` on
    /// `/ping` (50 ms polling resolution).
    pub restart_to_serving_ms: Option<f64>,
    /// `VmRSS` two seconds after the restart.
    pub rss_after_restart_bytes: Option<u64>,
}

const MIB: f64 = 1024.0 * 1024.0;

impl Report {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![("scenario".into(), self.scenario.into())];
        if let Some(ingest) = &self.ingest {
            rows.push((
                "ingest".into(),
                format!(
                    "{} events in {} requests (batch {}, {} in flight)",
                    ingest.events, ingest.requests, ingest.batch, ingest.concurrency
                ),
            ));
            rows.push((
                "  acknowledged".into(),
                format!(
                    "{} ({} not, {} failed requests)",
                    ingest.acknowledged_events,
                    ingest.unacknowledged_events,
                    ingest.failed_requests
                ),
            ));
            rows.push((
                "  rate".into(),
                format!(
                    "{:.0} events/s, {:.0} requests/s over {:.2} s",
                    ingest.events_per_s, ingest.requests_per_s, ingest.seconds
                ),
            ));
            if let Some(latency) = ingest.latency_ms {
                rows.push(("  request latency ms".into(), percentiles(latency)));
            }
            if let Some(error) = &ingest.first_error {
                rows.push(("  first error".into(), error.clone()));
            }
        }
        if let Some(delivery) = &self.delivery {
            rows.push((
                "delivery".into(),
                format!(
                    "{}/{} delivered, {} missing, {} duplicates, {} EARLY, {} unknown",
                    delivery.delivered,
                    delivery.expected,
                    delivery.missing,
                    delivery.duplicates,
                    delivery.early,
                    delivery.unknown
                ),
            ));
            rows.push((
                "  rate".into(),
                format!(
                    "{:.0} events/s over {:.2} s (first to last arrival)",
                    delivery.events_per_s, delivery.span_s
                ),
            ));
            if let Some(lateness) = delivery.lateness_ms {
                rows.push(("  lateness ms".into(), percentiles(lateness)));
            }
            if delivery.scheduled_header_mismatch > 0 {
                rows.push((
                    "  header mismatch".into(),
                    format!(
                        "{} deliveries carried another X-Belfry-Scheduled-At",
                        delivery.scheduled_header_mismatch
                    ),
                ));
            }
        }
        if let Some(backlog) = &self.backlog {
            rows.push((
                "backlog".into(),
                format!(
                    "{} pending: {:.1} MiB of files, {:.1} MiB allocated on disk, {:.0} allocated bytes/event",
                    backlog.pending_events,
                    backlog.data_dir_bytes as f64 / MIB,
                    backlog.data_dir_allocated_bytes as f64 / MIB,
                    backlog.bytes_per_event
                ),
            ));
            if let Some(rss) = backlog.rss_before_restart_bytes {
                rows.push((
                    "  RSS before restart".into(),
                    format!("{:.1} MiB", rss as f64 / MIB),
                ));
            }
            if let Some(ms) = backlog.restart_to_serving_ms {
                rows.push(("  restart to serving".into(), format!("{ms:.0} ms")));
            }
            if let Some(rss) = backlog.rss_after_restart_bytes {
                rows.push((
                    "  RSS after restart".into(),
                    format!("{:.1} MiB", rss as f64 / MIB),
                ));
            }
        }
        if let Some(node) = &self.node {
            rows.push((
                "node".into(),
                format!(
                    "peak RSS {:.1} MiB, RSS {:.1} MiB, CPU {:.2} s user + {:.2} s system",
                    node.peak_rss_bytes as f64 / MIB,
                    node.rss_bytes as f64 / MIB,
                    node.cpu_during_run.user_s,
                    node.cpu_during_run.system_s
                ),
            ));
        }
        if let Some(cpu) = &self.bench_cpu {
            rows.push((
                "bench itself".into(),
                format!(
                    "CPU {:.2} s user + {:.2} s system",
                    cpu.user_s, cpu.system_s
                ),
            ));
        }
        for warning in &self.warnings {
            rows.push(("WARNING".into(), warning.clone()));
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(key, value)| format!("{key:<width$}  {value}\n"))
            .collect()
    }
}

fn percentiles(p: Percentiles) -> String {
    format!(
        "p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        p.p50, p.p90, p.p99, p.p999, p.max
    )
}
