//! The result of one scenario: JSON for machines, a table for people.

use serde::Serialize;

use crate::deliveries::DeliveryReport;
use crate::load::{IngestReport, PacedReport};
use crate::stats::{CpuSplit, Percentiles, ProcessSample};

/// Sections a scenario does not measure stay `None` (`..Report::default()`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub scenario: &'static str,
    /// The settings of the run, as given or defaulted.
    pub params: serde_json::Value,
    pub ingest: Option<IngestReport>,
    pub delivery: Option<DeliveryReport>,
    pub node: Option<NodeReport>,
    pub backlog: Option<BacklogReport>,
    /// The `cluster` scenario: nodes, PostgreSQL, the machine, failover.
    pub cluster: Option<ClusterReport>,
    /// The `mixed` scenario: the ingest stream beside the firing.
    pub mixed: Option<MixedReport>,
    /// The `hung` scenario: the hung tenants and the node's memory.
    pub hung: Option<HungReport>,
    /// The `readers` scenario: slow clients of large listings.
    pub readers: Option<crate::readers::ReadersReport>,
    /// The `kafka` scenarios: the broker, the topics and what only Kafka
    /// shows (answers, dead letters, record timestamps).
    pub kafka: Option<crate::kafka::KafkaReport>,
    /// The `pull` scenarios: the workers, their lateness and rate.
    pub pull: Option<crate::pull::PullReport>,
    /// A node started with `--database-url`: PostgreSQL's CPU over the
    /// same interval as `node.cpu_during_run` (its backends of the run's
    /// database and its WAL writer, checkpointer and background writer).
    pub postgres_cpu: Option<CpuSplit>,
    /// `/proc/loadavg` (1, 5, 15 min) when the scenario started and ended:
    /// the machine is shared with other work.
    pub load_average_before: Option<[f64; 3]>,
    pub load_average_after: Option<[f64; 3]>,
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
    /// Seconds the node's threads waited for a CPU over the same interval
    /// (see [`ProcessSample::run_queue_wait_s`]).
    pub run_queue_wait_s: f64,
}

impl NodeReport {
    pub fn between(before: &ProcessSample, after: &ProcessSample) -> Self {
        NodeReport {
            peak_rss_bytes: after.peak_rss_bytes,
            rss_bytes: after.rss_bytes,
            cpu_during_run: after.cpu_since(before),
            run_queue_wait_s: after.run_queue_wait_s - before.run_queue_wait_s,
        }
    }

    /// [`NodeReport::between`] when both samples could be read.
    pub fn over(before: Option<ProcessSample>, after: Option<ProcessSample>) -> Option<Self> {
        before.zip(after).map(|(b, a)| Self::between(&b, &a))
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

/// The `mixed` scenario's ingest stream, beside the firing measured in
/// `delivery`.
#[derive(Debug, Clone, Serialize)]
pub struct MixedReport {
    /// The whole stream: from the end of the scheduling to the last due
    /// instant.
    pub stream: PacedReport,
    /// Events of the stream acknowledged between the first and the last
    /// due instant, and that as a rate.
    pub acknowledged_while_firing: u64,
    pub events_per_s_while_firing: f64,
    /// The node's CPU between the first and the last due instant
    /// (deliveries and the stream's ingest together).
    pub node_cpu_while_firing: Option<CpuSplit>,
    /// Seconds the node's threads waited for a CPU over that span.
    pub node_run_queue_wait_while_firing_s: Option<f64>,
    pub postgres_cpu_while_firing: Option<CpuSplit>,
}

/// The `hung` scenario beyond the healthy tenant's deliveries.
#[derive(Debug, Clone, Serialize)]
pub struct HungReport {
    pub hung_tenants: usize,
    pub events_per_hung_tenant: usize,
    /// The `timeout_ms` the hung tenants asked for.
    pub hung_timeout_ms: u64,
    /// Wall-clock ms of the hung events' instant.
    pub hung_due_at_ms: i64,
    pub healthy_rate: u64,
    /// The healthy tenant's events (scheduled before the hung ones).
    pub healthy_ingest: IngestReport,
    /// The node's CPU from the hung events' instant to the end.
    pub node_cpu_while_due: Option<CpuSplit>,
    /// Seconds the node's threads waited for a CPU over that span.
    pub node_run_queue_wait_while_due_s: Option<f64>,
    /// The node's largest `VmRSS` seen from the hung events' instant to the
    /// end (read every 500 ms).
    pub node_rss_max_while_due_bytes: Option<u64>,
    /// What the hung endpoint saw: connections accepted, those that sent a
    /// request (each holds one: no answer ever comes), the most open at
    /// once, still open at the end, bytes received.
    pub connections_accepted: u64,
    pub connections_with_request: u64,
    pub connections_open_max: u64,
    pub connections_open_at_end: u64,
    pub bytes_received: u64,
}

/// What the `cluster` scenario measured beyond ingest and delivery.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    pub nodes: usize,
    /// `"launched (fsync=off)"` or `"external"` (`--database-url`).
    pub database: String,
    /// From the first node's start until every node showed all members, one
    /// Master and every partition owned.
    pub settle_ms: f64,
    /// `/proc/loadavg` (1, 5, 15 min) before the run and at its end.
    pub load_average_before: Option<[f64; 3]>,
    pub load_average_after: Option<[f64; 3]>,
    /// Every node's CPU while the events were scheduled / while they were
    /// delivered (a killed node counts up to its kill).
    pub node_cpu_ingest: CpuSplit,
    pub node_cpu_delivery: CpuSplit,
    /// Node CPU per acknowledged event while scheduling, in µs.
    pub node_cpu_per_event_ingest_us: f64,
    /// Node CPU per delivered event while delivering, in µs.
    pub node_cpu_per_event_delivery_us: Option<f64>,
    /// PostgreSQL's CPU over the same phases: the backends of the run's
    /// database plus the server's WAL writer, checkpointer and background
    /// writer (sampled every 500 ms; shared with other databases on an
    /// external server).
    pub postgres_cpu_ingest: Option<CpuSplit>,
    pub postgres_cpu_delivery: Option<CpuSplit>,
    /// Share of the whole machine's CPU that was busy (all processes, other
    /// users' included), per phase, in percent.
    pub machine_busy_ingest_percent: Option<f64>,
    pub machine_busy_delivery_percent: Option<f64>,
    pub per_node: Vec<ClusterNodeReport>,
    pub failover: Option<FailoverReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterNodeReport {
    pub address: String,
    pub partitions_at_start: usize,
    pub peak_rss_bytes: Option<u64>,
    pub cpu: CpuSplit,
    pub killed: bool,
}

/// A kill -9 of a node while events came due.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub killed_address: String,
    /// The killed node was the Master.
    pub killed_leader: bool,
    /// The kill, in ms after the first due instant.
    pub killed_after_first_due_ms: i64,
    /// Partitions the killed node owned (they had to move).
    pub partitions_moved: usize,
    /// Until a survivor was shown as Master (`/events/cluster`).
    pub new_master_after_ms: Option<f64>,
    /// Until the survivors showed N − 1 members, one Master and every
    /// partition owned by a survivor (`/v1/cluster`).
    pub partitions_owned_after_ms: Option<f64>,
    /// The longest gap between two consecutive arrivals (any event) while
    /// events came due.
    pub longest_gap_ms: i64,
    /// The same over the events of the moved partitions: the time those
    /// partitions were silent.
    pub longest_gap_moved_ms: i64,
    /// From the kill to the first arrival of an event of a moved partition.
    pub first_moved_delivery_after_kill_ms: Option<i64>,
    /// Worst lateness of any event / of an event of a moved partition.
    pub worst_lateness_ms: Option<i64>,
    pub worst_lateness_moved_ms: Option<i64>,
    /// Events whose first delivery came more than 1 s after their instant.
    pub late_over_1s: usize,
    /// Lateness of the moved partitions' events that were due after the
    /// kill.
    pub lateness_moved_after_kill_ms: Option<Percentiles>,
    /// Deliveries beyond the first (all events / moved partitions).
    pub duplicates: usize,
    pub duplicates_moved: usize,
}

const MIB: f64 = 1024.0 * 1024.0;

impl Report {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![("scenario".into(), self.scenario.into())];
        // The schedules scenario creates schedules and receives occurrences.
        let (written, delivered) = if self.scenario == "schedules" {
            ("schedules", "occurrences")
        } else {
            ("events", "events")
        };
        if let Some(ingest) = &self.ingest {
            rows.push((
                "ingest".into(),
                format!(
                    "{} {written} in {} requests (batch {}, {} in flight)",
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
                    "{:.0} {written}/s, {:.0} requests/s over {:.2} s",
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
                    "{:.0} {delivered}/s over {:.2} s (first to last arrival)",
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
        if let Some(cluster) = &self.cluster {
            cluster_rows(cluster, &mut rows);
        }
        if let Some(mixed) = &self.mixed {
            mixed_rows(mixed, &mut rows);
        }
        if let Some(hung) = &self.hung {
            hung_rows(hung, &mut rows);
        }
        if let Some(readers) = &self.readers {
            readers_rows(readers, &mut rows);
        }
        if let Some(kafka) = &self.kafka {
            kafka.rows(&mut rows);
        }
        if let Some(node) = &self.node {
            rows.push((
                "node".into(),
                format!(
                    "peak RSS {:.1} MiB, RSS {:.1} MiB, CPU {:.2} s user + {:.2} s system, {:.2} s waiting for a CPU",
                    node.peak_rss_bytes as f64 / MIB,
                    node.rss_bytes as f64 / MIB,
                    node.cpu_during_run.user_s,
                    node.cpu_during_run.system_s,
                    node.run_queue_wait_s
                ),
            ));
        }
        if let Some(pg) = self.postgres_cpu {
            rows.push(("PostgreSQL".into(), format!("CPU {}", cpu(pg))));
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
        if self.load_average_before.is_some() || self.load_average_after.is_some() {
            rows.push((
                "load average".into(),
                format!(
                    "before {}, after {}",
                    load(self.load_average_before),
                    load(self.load_average_after)
                ),
            ));
        }
        if let Some(pull) = &self.pull {
            crate::pull::rows(pull, &mut rows);
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

fn cpu(split: CpuSplit) -> String {
    format!(
        "{:.2} s user + {:.2} s system",
        split.user_s, split.system_s
    )
}

fn load(average: Option<[f64; 3]>) -> String {
    average.map_or("-".to_string(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"))
}

fn mixed_rows(mixed: &MixedReport, rows: &mut Vec<(String, String)>) {
    let ingest = &mixed.stream.ingest;
    rows.push((
        "ingest stream".into(),
        format!(
            "{:.0} events/s offered: {} acknowledged of {} sent ({} failed requests), {:.0} events/s over {:.2} s",
            mixed.stream.offered_events_per_s,
            ingest.acknowledged_events,
            ingest.events,
            ingest.failed_requests,
            ingest.events_per_s,
            ingest.seconds
        ),
    ));
    rows.push((
        "  while firing".into(),
        format!(
            "{} acknowledged, {:.0} events/s; generator lag max {:.0} ms",
            mixed.acknowledged_while_firing,
            mixed.events_per_s_while_firing,
            mixed.stream.max_lag_ms
        ),
    ));
    if let Some(latency) = ingest.latency_ms {
        rows.push(("  request latency ms".into(), percentiles(latency)));
    }
    if let Some(error) = &ingest.first_error {
        rows.push(("  first error".into(), error.clone()));
    }
    if let Some(split) = mixed.node_cpu_while_firing {
        rows.push((
            "  node CPU while firing".into(),
            format!(
                "{}, {:.2} s waiting for a CPU",
                cpu(split),
                mixed.node_run_queue_wait_while_firing_s.unwrap_or(0.0)
            ),
        ));
    }
    if let Some(split) = mixed.postgres_cpu_while_firing {
        rows.push(("  PostgreSQL CPU firing".into(), cpu(split)));
    }
}

fn readers_rows(readers: &crate::readers::ReadersReport, rows: &mut Vec<(String, String)>) {
    let mib = |bytes: u64| format!("{} MiB", bytes >> 20);
    rows.push((
        "slow readers".into(),
        format!(
            "{} clients listing {} events of {} bytes at {}/s each",
            readers.readers,
            readers.reader_events,
            readers.reader_payload_bytes,
            mib(readers.read_bytes_per_s),
        ),
    ));
    rows.push((
        "  answers".into(),
        format!(
            "{} read whole, {} busy (503), {} other; {} read",
            readers.answers_complete,
            readers.answers_busy,
            readers.answers_other,
            mib(readers.bytes_read)
        ),
    ));
    if let (Some(start), Some(max)) = (
        readers.node_rss_at_start_bytes,
        readers.node_rss_max_while_reading_bytes,
    ) {
        rows.push((
            "  node RSS".into(),
            format!(
                "{} at start, {} at most while reading",
                mib(start),
                mib(max)
            ),
        ));
    }
}

fn hung_rows(hung: &HungReport, rows: &mut Vec<(String, String)>) {
    rows.push((
        "hung tenants".into(),
        format!(
            "{} × {} events due at one instant, timeout_ms {} asked",
            hung.hung_tenants, hung.events_per_hung_tenant, hung.hung_timeout_ms
        ),
    ));
    rows.push((
        "  hung endpoint".into(),
        format!(
            "{} connections ({} with a request), at most {} open, {} open at the end, {} bytes",
            hung.connections_accepted,
            hung.connections_with_request,
            hung.connections_open_max,
            hung.connections_open_at_end,
            hung.bytes_received
        ),
    ));
    rows.push((
        "healthy tenant".into(),
        format!(
            "{} events/s; {} acknowledged ({} not)",
            hung.healthy_rate,
            hung.healthy_ingest.acknowledged_events,
            hung.healthy_ingest.unacknowledged_events
        ),
    ));
    if let Some(split) = hung.node_cpu_while_due {
        rows.push((
            "  node CPU while due".into(),
            format!(
                "{}, {:.2} s waiting for a CPU",
                cpu(split),
                hung.node_run_queue_wait_while_due_s.unwrap_or(0.0)
            ),
        ));
    }
    if let Some(rss) = hung.node_rss_max_while_due_bytes {
        rows.push((
            "  node RSS while due".into(),
            format!("max {:.1} MiB", rss as f64 / MIB),
        ));
    }
}

fn cluster_rows(cluster: &ClusterReport, rows: &mut Vec<(String, String)>) {
    rows.push((
        "cluster".into(),
        format!(
            "{} nodes on a {} PostgreSQL, settled in {:.0} ms",
            cluster.nodes, cluster.database, cluster.settle_ms
        ),
    ));
    rows.push((
        "  load average".into(),
        format!(
            "before {}, after {}",
            load(cluster.load_average_before),
            load(cluster.load_average_after)
        ),
    ));
    rows.push((
        "  nodes CPU ingest".into(),
        format!(
            "{} ({:.1} µs/event)",
            cpu(cluster.node_cpu_ingest),
            cluster.node_cpu_per_event_ingest_us
        ),
    ));
    if let Some(per_event) = cluster.node_cpu_per_event_delivery_us {
        rows.push((
            "  nodes CPU delivery".into(),
            format!(
                "{} ({per_event:.1} µs/event)",
                cpu(cluster.node_cpu_delivery)
            ),
        ));
    }
    if let Some(pg) = cluster.postgres_cpu_ingest {
        rows.push(("  PostgreSQL CPU ingest".into(), cpu(pg)));
    }
    if let Some(pg) = cluster.postgres_cpu_delivery {
        rows.push(("  PostgreSQL CPU delivery".into(), cpu(pg)));
    }
    let busy = |b: Option<f64>| b.map_or("-".to_string(), |b| format!("{b:.0} %"));
    rows.push((
        "  machine busy".into(),
        format!(
            "ingest {}, delivery {}",
            busy(cluster.machine_busy_ingest_percent),
            busy(cluster.machine_busy_delivery_percent)
        ),
    ));
    for node in &cluster.per_node {
        rows.push((
            format!("  node {}", node.address),
            format!(
                "{} partitions, CPU {}, peak RSS {}{}",
                node.partitions_at_start,
                cpu(node.cpu),
                node.peak_rss_bytes
                    .map_or("-".to_string(), |b| format!("{:.1} MiB", b as f64 / MIB)),
                if node.killed { ", KILLED" } else { "" }
            ),
        ));
    }
    if let Some(failover) = &cluster.failover {
        let ms = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.0} ms"));
        let ms_i = |v: Option<i64>| v.map_or("-".to_string(), |v| format!("{v} ms"));
        rows.push((
            "failover".into(),
            format!(
                "kill -9 of {} {} at first due + {} ms ({} partitions moved)",
                if failover.killed_leader {
                    "the Master"
                } else {
                    "a non-Master node"
                },
                failover.killed_address,
                failover.killed_after_first_due_ms,
                failover.partitions_moved
            ),
        ));
        rows.push((
            "  new Master after".into(),
            ms(failover.new_master_after_ms),
        ));
        rows.push((
            "  partitions owned after".into(),
            ms(failover.partitions_owned_after_ms),
        ));
        rows.push((
            "  first moved delivery".into(),
            format!(
                "{} after the kill",
                ms_i(failover.first_moved_delivery_after_kill_ms)
            ),
        ));
        rows.push((
            "  longest arrival gap".into(),
            format!(
                "{} ms (all events), {} ms (moved partitions)",
                failover.longest_gap_ms, failover.longest_gap_moved_ms
            ),
        ));
        rows.push((
            "  worst lateness".into(),
            format!(
                "{} (all), {} (moved partitions)",
                ms_i(failover.worst_lateness_ms),
                ms_i(failover.worst_lateness_moved_ms)
            ),
        ));
        rows.push((
            "  more than 1 s late".into(),
            failover.late_over_1s.to_string(),
        ));
        if let Some(lateness) = failover.lateness_moved_after_kill_ms {
            rows.push(("  moved, due after kill".into(), percentiles(lateness)));
        }
        rows.push((
            "  duplicates".into(),
            format!(
                "{} (all), {} (moved partitions)",
                failover.duplicates, failover.duplicates_moved
            ),
        ));
    }
}

pub(crate) fn percentiles(p: Percentiles) -> String {
    format!(
        "p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        p.p50, p.p90, p.p99, p.p999, p.max
    )
}
