//! Belfry's metrics, defined once: every metric the node exports is a
//! [`Metric`] in [`ALL`] (name, kind, unit in the name, help, labels), and
//! recorded only through the typed functions below, so a name or a label
//! set cannot drift between the places that record it.
//!
//! Recording goes through the `metrics` facade: without an installed
//! recorder (tests, tools) every call is a no-op. [`install`] installs the
//! Prometheus recorder once per process and returns the [`Exporter`] that
//! renders `GET /metrics`.
//!
//! Cardinality is bounded by construction: no label carries an event id,
//! and a tenant name only in `belfry_tenant_paused` and
//! `belfry_tenant_circuit_open`, whose series are each capped at
//! [`MAX_PAUSED_SERIES`]; labels are closed sets (channel,
//! outcome, attempt, result, store) or bounded by configuration
//! (partition numbers, the API's route templates and status codes).
//!
//! Every metric, what it means and the alerts worth setting:
//! `docs/operations.md`.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// What a metric is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Counter,
    Gauge,
    /// With these bucket upper bounds.
    Histogram(&'static [f64]),
}

/// One exported metric.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

/// 1 ms to 60 s: firing lateness is judged in milliseconds, and an event
/// a minute late is already an incident.
const LATENESS_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// A webhook or a broker answers in milliseconds to tens of seconds (the
/// tenant timeout caps it at 30 s by default).
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// A group commit is one fsync (≈ 2 ms) plus the batch's CPU.
const COMMIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0];
const REQUEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// A claim is answered at once, or long-polls up to its `wait_ms` (30 s
/// at most).
const CLAIM_WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
];

pub const FIRE_LATENESS: Metric = Metric {
    name: "belfry_fire_lateness_seconds",
    kind: Kind::Histogram(LATENESS_BUCKETS),
    unit: Some(Unit::Seconds),
    help: "How late an attempt started after the instant it was due (never negative: Belfry never fires early). attempt=first: the event's instant; attempt=retry: the retry's planned time.",
    labels: &["attempt"],
};
pub const DELIVERIES: Metric = Metric {
    name: "belfry_deliveries_total",
    kind: Kind::Counter,
    unit: None,
    help: "Delivery attempts by channel (http, kafka, log) and outcome (delivered, retry, permanent).",
    labels: &["channel", "outcome"],
};
pub const DELIVERY_DURATION: Metric = Metric {
    name: "belfry_delivery_duration_seconds",
    kind: Kind::Histogram(DURATION_BUCKETS),
    unit: Some(Unit::Seconds),
    help: "From the start of an attempt to the receiver's (or broker's) answer.",
    labels: &["channel"],
};
pub const EVENTS_ENDED: Metric = Metric {
    name: "belfry_events_ended_total",
    kind: Kind::Counter,
    unit: None,
    help: "Event versions that reached a terminal state through the fire path: delivered, failed (dead: a permanent refusal or retries exhausted), missed (due longer than the look-back ago while the node was down).",
    labels: &["status"],
};
pub const NOTICES_RAISED: Metric = Metric {
    name: "belfry_notices_raised_total",
    kind: Kind::Counter,
    unit: None,
    help: "Notices written for delivery to tenants' notice targets, by kind (event_failed, event_expired, event_missed, paused, resumed, circuit_opened, circuit_closed, schedule_missed).",
    labels: &["kind"],
};
pub const NOTICES_DROPPED: Metric = Metric {
    name: "belfry_notices_dropped_total",
    kind: Kind::Counter,
    unit: None,
    help: "Notices dropped because their tenant's notice slots (or its queue on this node) were full, by kind.",
    labels: &["kind"],
};
pub const CRON_OCCURRENCES: Metric = Metric {
    name: "belfry_cron_occurrences_total",
    kind: Kind::Counter,
    unit: None,
    help: "Occurrences of recurring schedules as planned: fired (scheduled for delivery), missed or skipped (by the schedule's misfire policy), over_budget (not created: the tenant's schedules used their occurrence budget).",
    labels: &["result"],
};
pub const PARTITIONS_OWNED: Metric = Metric {
    name: "belfry_partitions_owned",
    kind: Kind::Gauge,
    unit: None,
    help: "Partitions this node owns (may fire).",
    labels: &[],
};
pub const PARTITION_EPOCH: Metric = Metric {
    name: "belfry_partition_epoch",
    kind: Kind::Gauge,
    unit: None,
    help: "The fencing epoch under which this node owns each partition (-1: owned here before, not any more).",
    labels: &["partition"],
};
pub const LEASE_LOSSES: Metric = Metric {
    name: "belfry_partition_lease_losses_total",
    kind: Kind::Counter,
    unit: None,
    help: "Partitions this node stopped owning other than by its own hand-over: moved away by the leader (a node joined) or its lease ran out (a pause, an overloaded node, a network partition).",
    labels: &[],
};
pub const FENCED_WRITES: Metric = Metric {
    name: "belfry_fenced_writes_rejected_total",
    kind: Kind::Counter,
    unit: None,
    help: "Writes the store refused because this node's epoch for the partition was stale (another node owns it now).",
    labels: &[],
};
pub const WINDOW_REPAIRS: Metric = Metric {
    name: "belfry_window_repairs_total",
    kind: Kind::Counter,
    unit: None,
    help: "Due entries a repair page found missing from a partition's window and armed (a lost wake-up; should stay near 0). Counted over the partitions owned now.",
    labels: &[],
};
pub const IN_FLIGHT: Metric = Metric {
    name: "belfry_deliveries_in_flight",
    kind: Kind::Gauge,
    unit: None,
    help: "Deliveries holding a delivery slot now.",
    labels: &[],
};
pub const OUTSTANDING: Metric = Metric {
    name: "belfry_fired_outstanding",
    kind: Kind::Gauge,
    unit: None,
    help: "Fired entries not finished yet: queued for a slot, being delivered, or waiting for their outcome to be stored.",
    labels: &[],
};
pub const WINDOW_HELD: Metric = Metric {
    name: "belfry_window_entries",
    kind: Kind::Gauge,
    unit: None,
    help: "Entries held in memory by the owned partitions' windows (near-future events, outstanding entries, retry timers).",
    labels: &[],
};
pub const WINDOW_CAPACITY: Metric = Metric {
    name: "belfry_window_capacity",
    kind: Kind::Gauge,
    unit: None,
    help: "The most entries the owned partitions may hold in memory (engine.max_events_in_memory).",
    labels: &[],
};
pub const OVERDUE: Metric = Metric {
    name: "belfry_overdue_events",
    kind: Kind::Gauge,
    unit: None,
    help: "Entries in the owned partitions' windows whose instant passed and that are not fired yet (waiting for a slot, a blocked tenant, a rate limit).",
    labels: &[],
};
pub const OLDEST_OVERDUE_AGE: Metric = Metric {
    name: "belfry_oldest_overdue_age_seconds",
    kind: Kind::Gauge,
    unit: Some(Unit::Seconds),
    help: "How long ago the oldest overdue entry of the owned partitions was due (0 when none is).",
    labels: &[],
};
pub const API_REQUESTS: Metric = Metric {
    name: "belfry_http_requests_total",
    kind: Kind::Counter,
    unit: None,
    help: "API requests by route template, method and status code.",
    labels: &["route", "method", "status"],
};
pub const API_DURATION: Metric = Metric {
    name: "belfry_http_request_duration_seconds",
    kind: Kind::Histogram(REQUEST_BUCKETS),
    unit: Some(Unit::Seconds),
    help: "API request duration by route template.",
    labels: &["route"],
};
pub const STORE_COMMIT: Metric = Metric {
    name: "belfry_store_commit_duration_seconds",
    kind: Kind::Histogram(COMMIT_BUCKETS),
    unit: Some(Unit::Seconds),
    help: "One durable group commit of the store (write and fsync), by store (embedded, postgres).",
    labels: &["store"],
};
pub const STORE_BATCH: Metric = Metric {
    name: "belfry_store_commit_batch_commands",
    kind: Kind::Histogram(BATCH_BUCKETS),
    unit: None,
    help: "Commands written by one group commit, by store.",
    labels: &["store"],
};
pub const KAFKA_INGESTED: Metric = Metric {
    name: "belfry_kafka_ingest_records_total",
    kind: Kind::Counter,
    unit: None,
    help: "Records of the ingest topics by outcome: stored (durably, answered) or dead_lettered.",
    labels: &["outcome"],
};
pub const KAFKA_LAG: Metric = Metric {
    name: "belfry_kafka_ingest_lag_records",
    kind: Kind::Gauge,
    unit: None,
    help: "Records of the ingest topics' partitions assigned to this node not consumed yet (librdkafka's consumer lag, summed; refreshed every 5 s).",
    labels: &[],
};
pub const PULL_READY: Metric = Metric {
    name: "belfry_pull_ready_entries",
    kind: Kind::Gauge,
    unit: None,
    help: "Due entries of pull tenants held by this node's pull queue, waiting for a claim or being granted (node bound: pull.max_ready).",
    labels: &[],
};
pub const PULL_LEASES: Metric = Metric {
    name: "belfry_pull_leases_held",
    kind: Kind::Gauge,
    unit: None,
    help: "Leases this node holds: active, being recorded, cancelled until their expiry (node bound: pull.max_leases).",
    labels: &[],
};
pub const PULL_PARKED: Metric = Metric {
    name: "belfry_pull_claims_parked",
    kind: Kind::Gauge,
    unit: None,
    help: "Workers' claims parked on this node: long-polling or being granted (node bound: pull.max_waiters).",
    labels: &[],
};
pub const PULL_GRANTS: Metric = Metric {
    name: "belfry_pull_grants_total",
    kind: Kind::Counter,
    unit: None,
    help: "Leases granted and recorded by this node's pull queue.",
    labels: &[],
};
pub const PULL_LEASE_ENDS: Metric = Metric {
    name: "belfry_pull_lease_ends_total",
    kind: Kind::Counter,
    unit: None,
    help: "Leases ended and recorded, by outcome: completed (delivered), failed (reported by the worker; retried or dead), released (no attempt counted), expired (no heartbeat in time: a failed attempt).",
    labels: &["outcome"],
};
pub const PULL_REFUSED: Metric = Metric {
    name: "belfry_pull_refused_total",
    kind: Kind::Counter,
    unit: None,
    help: "Due entries the pull queue refused because its ready bounds were reached; they stay in the store and fire again after a pause.",
    labels: &[],
};
pub const PULL_ERRORS: Metric = Metric {
    name: "belfry_pull_errors_total",
    kind: Kind::Counter,
    unit: None,
    help: "Workers' claims and lease calls answered with an error, by code: lease_lost (expired, ended, superseded or moved), too_many_waiters, too_many_calls, too_many_leases (the tenant holds its share of the node's leases), store_unavailable.",
    labels: &["code"],
};
pub const QUOTA_COUNTS: Metric = Metric {
    name: "belfry_quota_counts_total",
    kind: Kind::Counter,
    unit: None,
    help: "Counts of a tenant's pending events or schedules read from the store for its quota, by kind (pending_events, schedules); one at a time per tenant and kind, concurrent requests share it.",
    labels: &["kind"],
};
pub const PULL_CLAIM_WAIT: Metric = Metric {
    name: "belfry_pull_claim_wait_seconds",
    kind: Kind::Histogram(CLAIM_WAIT_BUCKETS),
    unit: Some(Unit::Seconds),
    help: "From a claim's arrival to its answer, by result: leases (at least one granted) or empty (its wait ended with nothing due).",
    labels: &["result"],
};
pub const PULL_LEASE_LATENESS: Metric = Metric {
    name: "belfry_pull_lease_lateness_seconds",
    kind: Kind::Histogram(LATENESS_BUCKETS),
    unit: Some(Unit::Seconds),
    help: "How late a lease was granted after its entry was due (leased_at - due_at; never negative). attempt=first: attempt 1 (the event's instant, or the end of a release's delay); attempt=retry: a later attempt (its back-off).",
    labels: &["attempt"],
};
pub const AUTH_KEY_READS: Metric = Metric {
    name: "belfry_auth_key_reads_total",
    kind: Kind::Counter,
    unit: None,
    help: "API keys read from the store by hash to authenticate a request, by result: found, unknown (no such key, or revoked) or failed (the store answered an error).",
    labels: &["result"],
};
pub const AUTH_LOOKUPS_SHED: Metric = Metric {
    name: "belfry_auth_key_lookups_shed_total",
    kind: Kind::Counter,
    unit: None,
    help: "Requests with a key this node did not know, answered 503 without a store read because the node's budget for such reads (auth.unknown_key_reads_per_second) was spent.",
    labels: &[],
};

pub const TENANTS_PAUSED: Metric = Metric {
    name: "belfry_tenants_paused",
    kind: Kind::Gauge,
    unit: None,
    help: "Tenants whose deliveries are paused (all of them, whichever node paused them: read from the store at scrape).",
    labels: &[],
};
pub const TENANT_PAUSED: Metric = Metric {
    name: "belfry_tenant_paused",
    kind: Kind::Gauge,
    unit: None,
    help: "1 while the tenant's deliveries are paused, 0 once resumed. Only the first 100 tenants paused while this process runs get a series; belfry_tenants_paused counts them all.",
    labels: &["tenant"],
};
pub const CIRCUITS_OPEN: Metric = Metric {
    name: "belfry_circuits_open",
    kind: Kind::Gauge,
    unit: None,
    help: "Tenant endpoints whose circuit is open or half-open on this node (each node judges the endpoints it delivers to): their due events wait instead of spending attempts.",
    labels: &[],
};
pub const CIRCUIT_TRANSITIONS: Metric = Metric {
    name: "belfry_circuit_transitions_total",
    kind: Kind::Counter,
    unit: None,
    help: "Circuit changes on this node, by the state entered: open (failures in a row, or a failed probe), half_open (a probe goes out), closed (the probe was answered).",
    labels: &["state"],
};
pub const TENANT_CIRCUIT_OPEN: Metric = Metric {
    name: "belfry_tenant_circuit_open",
    kind: Kind::Gauge,
    unit: None,
    help: "1 while the tenant's circuit is open or half-open on this node, 0 once closed. Only the first 100 tenants whose circuit opened while this process runs get a series; belfry_circuits_open counts them all.",
    labels: &["tenant"],
};

/// Every metric, for descriptions and `docs/operations.md`.
pub const ALL: &[Metric] = &[
    FIRE_LATENESS,
    DELIVERIES,
    DELIVERY_DURATION,
    EVENTS_ENDED,
    NOTICES_RAISED,
    NOTICES_DROPPED,
    CRON_OCCURRENCES,
    PARTITIONS_OWNED,
    PARTITION_EPOCH,
    LEASE_LOSSES,
    FENCED_WRITES,
    WINDOW_REPAIRS,
    IN_FLIGHT,
    OUTSTANDING,
    WINDOW_HELD,
    WINDOW_CAPACITY,
    OVERDUE,
    OLDEST_OVERDUE_AGE,
    API_REQUESTS,
    API_DURATION,
    STORE_COMMIT,
    STORE_BATCH,
    KAFKA_INGESTED,
    KAFKA_LAG,
    PULL_READY,
    PULL_LEASES,
    PULL_PARKED,
    PULL_GRANTS,
    PULL_LEASE_ENDS,
    PULL_REFUSED,
    PULL_ERRORS,
    QUOTA_COUNTS,
    PULL_CLAIM_WAIT,
    PULL_LEASE_LATENESS,
    AUTH_KEY_READS,
    AUTH_LOOKUPS_SHED,
    TENANTS_PAUSED,
    TENANT_PAUSED,
    CIRCUITS_OPEN,
    CIRCUIT_TRANSITIONS,
    TENANT_CIRCUIT_OPEN,
];

/// Renders the Prometheus text of this process's metrics.
#[derive(Debug, Clone)]
pub struct Exporter {
    handle: PrometheusHandle,
}

impl Exporter {
    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Folds the histogram samples recorded since the last call into their
    /// buckets. Call every few seconds: the exporter keeps raw samples
    /// until then, so this is what bounds its memory.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }
}

/// How often [`Exporter::run_upkeep`] should run.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder for this process (once; later calls
/// return the same exporter) and describes every metric.
///
/// # Errors
/// When another recorder was installed first.
pub fn install() -> Result<Exporter, String> {
    static INSTALLED: OnceLock<Result<Exporter, String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let mut builder = PrometheusBuilder::new();
            for metric in ALL {
                if let Kind::Histogram(buckets) = metric.kind {
                    builder = builder
                        .set_buckets_for_metric(Matcher::Full(metric.name.to_string()), buckets)
                        .map_err(|e| e.to_string())?;
                }
            }
            let handle = builder.install_recorder().map_err(|e| e.to_string())?;
            for metric in ALL {
                let name = metric.name;
                match (metric.kind, metric.unit) {
                    (Kind::Counter, _) => describe_counter!(name, metric.help),
                    (Kind::Gauge, Some(unit)) => describe_gauge!(name, unit, metric.help),
                    (Kind::Gauge, None) => describe_gauge!(name, metric.help),
                    (Kind::Histogram(_), Some(unit)) => {
                        describe_histogram!(name, unit, metric.help)
                    }
                    (Kind::Histogram(_), None) => describe_histogram!(name, metric.help),
                }
            }
            Ok(Exporter { handle })
        })
        .clone()
}

/// The channel a delivery went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Http,
    Kafka,
    Log,
    /// A lease of a pull tenant's event, ended by its worker.
    Pull,
}

impl Channel {
    fn label(self) -> &'static str {
        match self {
            Channel::Http => "http",
            Channel::Kafka => "kafka",
            Channel::Log => "log",
            Channel::Pull => "pull",
        }
    }
}

/// How an attempt ended (Belfry's one retry classification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    Retry,
    Permanent,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Retry => "retry",
            Outcome::Permanent => "permanent",
        }
    }
}

/// An attempt started `lateness` after it was due.
pub fn attempt_started(first_attempt: bool, lateness: Duration) {
    let attempt = if first_attempt { "first" } else { "retry" };
    histogram!(FIRE_LATENESS.name, "attempt" => attempt).record(lateness.as_secs_f64());
}

/// An attempt through `channel` ended with `outcome` after `duration`.
pub fn attempt_ended(channel: Channel, outcome: Outcome, duration: Duration) {
    counter!(DELIVERIES.name, "channel" => channel.label(), "outcome" => outcome.label())
        .increment(1);
    histogram!(DELIVERY_DURATION.name, "channel" => channel.label()).record(duration.as_secs_f64());
}

/// A terminal state the fire path recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Delivered,
    Failed,
    Missed,
    Expired,
}

/// `count` event versions reached `ended`.
pub fn events_ended(ended: Ended, count: u64) {
    let status = match ended {
        Ended::Delivered => "delivered",
        Ended::Failed => "failed",
        Ended::Missed => "missed",
        Ended::Expired => "expired",
    };
    add_labelled(EVENTS_ENDED.name, ("status", status), count);
}

/// A notice of `kind` (`belfry_core::notice::NoticeKind::as_str`) was
/// written for delivery.
pub fn notice_raised(kind: &'static str) {
    add_labelled(NOTICES_RAISED.name, ("kind", kind), 1);
}

/// A notice of `kind` was dropped: its tenant's slots or queue were full.
pub fn notice_dropped(kind: &'static str) {
    add_labelled(NOTICES_DROPPED.name, ("kind", kind), 1);
}

/// Adds `count` to the counter `name` with one label; a zero count
/// creates no series.
fn add_labelled(name: &'static str, label: (&'static str, &'static str), count: u64) {
    if count > 0 {
        counter!(name, label.0 => label.1).increment(count);
    }
}

/// What became of a schedule's occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occurrence {
    Fired,
    Missed,
    Skipped,
    /// Not created: past its tenant's occurrence budget.
    OverBudget,
}

pub fn cron_occurrences(result: Occurrence, count: u64) {
    let result = match result {
        Occurrence::Fired => "fired",
        Occurrence::Missed => "missed",
        Occurrence::Skipped => "skipped",
        Occurrence::OverBudget => "over_budget",
    };
    add_labelled(CRON_OCCURRENCES.name, ("result", result), count);
}

pub fn lease_lost() {
    counter!(LEASE_LOSSES.name).increment(1);
}

pub fn fenced_write_rejected() {
    counter!(FENCED_WRITES.name).increment(1);
}

/// One API request, by its route template (`/v1/tenants/{tenant}`, never
/// the concrete path) or `"unmatched"`.
pub fn api_request(route: &str, method: &str, status: u16, duration: Duration) {
    counter!(
        API_REQUESTS.name,
        "route" => route.to_string(),
        "method" => method.to_string(),
        "status" => status.to_string()
    )
    .increment(1);
    histogram!(API_DURATION.name, "route" => route.to_string()).record(duration.as_secs_f64());
}

/// How a store read of an API key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRead {
    Found,
    Unknown,
    Failed,
}

/// One store read of an API key by hash.
pub fn auth_key_read(result: KeyRead) {
    let result = match result {
        KeyRead::Found => "found",
        KeyRead::Unknown => "unknown",
        KeyRead::Failed => "failed",
    };
    counter!(AUTH_KEY_READS.name, "result" => result).increment(1);
}

/// A lookup of an unknown key refused without a store read.
pub fn auth_lookup_shed() {
    counter!(AUTH_LOOKUPS_SHED.name).increment(1);
}

/// The store a commit went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Embedded,
    Postgres,
}

/// One durable group commit of `commands` commands that took `duration`.
pub fn store_commit(store: Store, commands: usize, duration: Duration) {
    let store = match store {
        Store::Embedded => "embedded",
        Store::Postgres => "postgres",
    };
    histogram!(STORE_COMMIT.name, "store" => store).record(duration.as_secs_f64());
    histogram!(STORE_BATCH.name, "store" => store).record(commands as f64);
}

pub fn kafka_records(stored: u64, dead_lettered: u64) {
    if stored > 0 {
        counter!(KAFKA_INGESTED.name, "outcome" => "stored").increment(stored);
    }
    if dead_lettered > 0 {
        counter!(KAFKA_INGESTED.name, "outcome" => "dead_lettered").increment(dead_lettered);
    }
}

pub fn kafka_lag(records: i64) {
    gauge!(KAFKA_LAG.name).set(records.max(0) as f64);
}

/// A granted lease whose entry was due `lateness` before `leased_at`;
/// `first_attempt`: attempt 1.
pub fn lease_granted(first_attempt: bool, lateness: Duration) {
    let attempt = if first_attempt { "first" } else { "retry" };
    histogram!(PULL_LEASE_LATENESS.name, "attempt" => attempt).record(lateness.as_secs_f64());
}

/// A claim answered after `waited`; `granted`: with at least one lease.
pub fn claim_answered(granted: bool, waited: Duration) {
    let result = if granted { "leases" } else { "empty" };
    histogram!(PULL_CLAIM_WAIT.name, "result" => result).record(waited.as_secs_f64());
}

/// A worker's claim or lease call answered with the error `code` (the
/// pull queue's closed set of codes, `PullError::code`).
pub fn pull_error(code: &'static str) {
    counter!(PULL_ERRORS.name, "code" => code).increment(1);
}

/// A quota count of `kind` (`pending_events`, `schedules`) read the
/// store.
pub fn quota_count(kind: &'static str) {
    counter!(QUOTA_COUNTS.name, "kind" => kind).increment(1);
}

/// The pull queue's state and counters, read when `/metrics` is scraped.
#[derive(Debug, Clone, Default)]
pub struct PullState {
    /// Ready entries plus entries being granted.
    pub ready: usize,
    pub leases: usize,
    pub parked_claims: usize,
    pub granted: u64,
    pub completed: u64,
    pub failed: u64,
    pub released: u64,
    pub expired: u64,
    pub refused: u64,
}

/// The node's state, read when `/metrics` is scraped.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    /// `(partition, epoch)` of every partition owned here.
    pub partitions: Vec<(u16, u64)>,
    pub in_flight: usize,
    pub outstanding: usize,
    pub window_entries: usize,
    pub window_capacity: usize,
    pub window_repairs: u64,
    pub overdue: usize,
    pub oldest_overdue_age: Duration,
    pub pull: PullState,
}

/// Sets the gauges read from the node's state. A partition owned before
/// (`previously_owned`) and not any more reads `-1` in
/// `belfry_partition_epoch`: the exporter cannot forget a series, and no
/// real epoch is negative.
pub fn set_node_state(state: &NodeState, previously_owned: &[u16]) {
    gauge!(PARTITIONS_OWNED.name).set(state.partitions.len() as f64);
    for partition in previously_owned {
        if !state.partitions.iter().any(|(p, _)| p == partition) {
            gauge!(PARTITION_EPOCH.name, "partition" => partition.to_string()).set(-1.0);
        }
    }
    for (partition, epoch) in &state.partitions {
        gauge!(PARTITION_EPOCH.name, "partition" => partition.to_string()).set(*epoch as f64);
    }
    gauge!(IN_FLIGHT.name).set(state.in_flight as f64);
    gauge!(OUTSTANDING.name).set(state.outstanding as f64);
    gauge!(WINDOW_HELD.name).set(state.window_entries as f64);
    gauge!(WINDOW_CAPACITY.name).set(state.window_capacity as f64);
    counter!(WINDOW_REPAIRS.name).absolute(state.window_repairs);
    gauge!(OVERDUE.name).set(state.overdue as f64);
    gauge!(OLDEST_OVERDUE_AGE.name).set(state.oldest_overdue_age.as_secs_f64());
    set_pull_state(&state.pull);
}

/// Most tenants that get a `belfry_tenant_paused` series in one process
/// (and, apart, a `belfry_tenant_circuit_open` series): the exporter
/// cannot forget a series, so a tenant resumed (or closed) keeps its
/// series (at 0), and the label set stays bounded.
pub const MAX_PAUSED_SERIES: usize = 100;

/// Sets the paused tenants' gauges from the names of every paused tenant
/// (in name order). Those seen paused before and not any more read 0.
pub fn set_paused_tenants(paused: &[&str]) {
    static SERIES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    gauge!(TENANTS_PAUSED.name).set(paused.len() as f64);
    // Poison means a panic mid-update; the set is still usable.
    let mut series = SERIES.lock().unwrap_or_else(|e| e.into_inner());
    for tenant in series.iter() {
        if !paused.contains(&tenant.as_str()) {
            gauge!(TENANT_PAUSED.name, "tenant" => tenant.clone()).set(0.0);
        }
    }
    for tenant in paused {
        if series.contains(*tenant) || series.len() < MAX_PAUSED_SERIES {
            series.insert((*tenant).to_string());
            gauge!(TENANT_PAUSED.name, "tenant" => (*tenant).to_string()).set(1.0);
        }
    }
}

/// A tenant's circuit entered `state` (`open`, `half_open`, `closed`);
/// `not_closed`: circuits open or half-open on this node now. The tenant's
/// series is capped like `belfry_tenant_paused`'s.
pub fn circuit_changed(tenant: &str, state: &'static str, not_closed: usize) {
    static SERIES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    counter!(CIRCUIT_TRANSITIONS.name, "state" => state).increment(1);
    gauge!(CIRCUITS_OPEN.name).set(not_closed as f64);
    let open = state != "closed";
    // Poison means a panic mid-update; the set is still usable.
    let mut series = SERIES.lock().unwrap_or_else(|e| e.into_inner());
    if series.contains(tenant) || (open && series.len() < MAX_PAUSED_SERIES) {
        series.insert(tenant.to_string());
        gauge!(TENANT_CIRCUIT_OPEN.name, "tenant" => tenant.to_string()).set(if open {
            1.0
        } else {
            0.0
        });
    }
}

/// Sets `belfry_circuits_open` (at each scrape, so it reads 0 before any
/// circuit changed).
pub fn set_circuits_open(not_closed: usize) {
    gauge!(CIRCUITS_OPEN.name).set(not_closed as f64);
}

fn set_pull_state(pull: &PullState) {
    gauge!(PULL_READY.name).set(pull.ready as f64);
    gauge!(PULL_LEASES.name).set(pull.leases as f64);
    gauge!(PULL_PARKED.name).set(pull.parked_claims as f64);
    counter!(PULL_GRANTS.name).absolute(pull.granted);
    counter!(PULL_REFUSED.name).absolute(pull.refused);
    for (outcome, count) in [
        ("completed", pull.completed),
        ("failed", pull.failed),
        ("released", pull.released),
        ("expired", pull.expired),
    ] {
        counter!(PULL_LEASE_ENDS.name, "outcome" => outcome).absolute(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_follow_prometheus_conventions() {
        let mut names: Vec<&str> = ALL.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a metric is listed twice");
        for metric in ALL {
            assert!(metric.name.starts_with("belfry_"), "{}", metric.name);
            assert!(
                metric
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                metric.name
            );
            match metric.kind {
                Kind::Counter => assert!(metric.name.ends_with("_total"), "{}", metric.name),
                Kind::Histogram(buckets) => {
                    assert!(buckets.windows(2).all(|w| w[0] < w[1]), "{}", metric.name);
                }
                Kind::Gauge => {}
            }
            if metric.unit == Some(Unit::Seconds) {
                assert!(metric.name.ends_with("_seconds"), "{}", metric.name);
            }
        }
    }

    #[test]
    fn the_exporter_renders_what_was_recorded_with_buckets() {
        let exporter = install().unwrap();
        attempt_started(true, Duration::from_millis(3));
        attempt_ended(Channel::Http, Outcome::Delivered, Duration::from_millis(7));
        events_ended(Ended::Failed, 2);
        lease_granted(true, Duration::from_millis(4));
        claim_answered(false, Duration::from_millis(700));
        pull_error("lease_lost");
        set_node_state(
            &NodeState {
                partitions: vec![(3, 7)],
                pull: PullState {
                    ready: 5,
                    completed: 9,
                    ..PullState::default()
                },
                ..NodeState::default()
            },
            &[],
        );
        exporter.run_upkeep();
        let text = exporter.render();
        assert!(
            text.contains(r#"belfry_fire_lateness_seconds_bucket{attempt="first",le="0.005"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"belfry_deliveries_total{channel="http",outcome="delivered"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"belfry_events_ended_total{status="failed"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"belfry_partition_epoch{partition="3"} 7"#),
            "{text}"
        );
        assert!(text.contains("# HELP belfry_deliveries_total"), "{text}");
        for line in [
            r#"belfry_pull_lease_lateness_seconds_bucket{attempt="first",le="0.005"} 1"#,
            r#"belfry_pull_claim_wait_seconds_bucket{result="empty",le="1"} 1"#,
            r#"belfry_pull_errors_total{code="lease_lost"} 1"#,
            r#"belfry_pull_lease_ends_total{outcome="completed"} 9"#,
            "belfry_pull_ready_entries 5",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // The same exporter on a second install.
        assert!(install().is_ok());
    }
}
