//! Command-line interface: one subcommand per scenario.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Measures a Belfry node through its BigBen HTTP API: durable ingest rate,
/// delivery rate, lateness (arrival − scheduled instant), early and missing
/// deliveries, duplicates, the node's peak RSS and CPU time.
///
/// By default it starts its own node (the `belfry` binary next to this one,
/// on a fresh temp data dir) and its own webhook receiver on loopback.
#[derive(Debug, Parser)]
#[command(name = "belfry-bench", version)]
pub struct Cli {
    #[command(subcommand)]
    pub scenario: Scenario,
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Highest durable ingest rate: events far in the future, nothing is
    /// delivered during the measurement. `--batch 1000` for batches,
    /// `--batch 1 --concurrency 64` for one event per request.
    Ingest(IngestArgs),
    /// `--rate` events/s coming due for `--duration`: all are scheduled
    /// ahead (spread uniformly), then delivery rate and lateness are measured
    /// as they come due.
    Steady(SteadyArgs),
    /// `--rate` events/s coming due for `--duration`, measured as `steady`
    /// does, while a second client ingests new events at `--ingest-rate`
    /// (in batches, due after the run so none fires during it) from the end
    /// of the scheduling until the last due instant: lateness under ingest,
    /// and the ingest rate achieved beside the firing.
    Mixed(MixedArgs),
    /// `--count` events due at the same instant.
    Burst(BurstArgs),
    /// `--count` events far in the future (100-byte payloads): data dir size,
    /// node RSS, then kill -9 and restart-to-serving time.
    Backlog(BacklogArgs),
    /// Only the receiver, for an external peer scheduler: prints the same
    /// lateness statistics for deliveries it sends.
    Receive(ReceiveArgs),
    /// `--nodes` `belfry serve --database-url ...` processes on one
    /// PostgreSQL database (a throwaway server, or `--database-url`): ingest
    /// spread round-robin over the nodes, delivery rate and lateness, and
    /// with `--kill-leader-after-ms` a kill -9 of the Master mid-delivery.
    Cluster(ClusterArgs),
    /// `--hung-tenants` tenants whose webhook accepts the connection and
    /// never answers (`timeout_ms` asked: `--hung-timeout-ms`; the node caps
    /// it at `http.max_tenant_timeout_ms`), `--hung-events` events each, all
    /// due at one instant, next to a healthy tenant receiving
    /// `--healthy-rate` events/s for `--duration` from that instant: the
    /// healthy tenant's lateness, early and missing, the node's peak RSS
    /// and CPU, and the connections the hung endpoint held.
    Hung(HungArgs),
    /// `--readers` clients listing `--reader-events` events of
    /// `--reader-payload-bytes` each (`GET /v1/tenants/{t}/events?limit=1000`)
    /// and reading every answer at `--read-bytes-per-s`, again and again,
    /// next to a healthy tenant receiving `--healthy-rate` events/s for
    /// `--duration`: the healthy tenant's lateness, the node's peak RSS,
    /// the answers read and refused.
    Readers(ReadersArgs),
    /// `--count` recurring schedules created with `PUT
    /// /v1/tenants/{tenant}/schedules/{id}` (Quartz `"{i % 60} * * * * ?"`:
    /// every minute, spread over the seconds of the minute), then their
    /// occurrences for `--duration`: delivery rate, lateness, early,
    /// missing and duplicate occurrences.
    Schedules(SchedulesArgs),
    /// Kafka in and out, with the broker in its own process (the
    /// `belfry-kafka-mock` next to this binary, or `--bootstrap`):
    /// `ingest` from a topic, `burst` and `steady` delivery to a
    /// `MESSAGING` tenant's topic, read back by a consumer here.
    Kafka(KafkaArgs),
    /// Workers of a pull tenant (`{"type": "pull"}`) claiming leases over
    /// HTTP (`POST /v1/tenants/{t}/leases`) and completing each: `lateness`
    /// (workers long-polling while events come due: `leased_at` − due, and
    /// as the worker saw it) and `throughput` (a backlog of due events:
    /// claim-and-complete events/s, the node's CPU per event).
    Pull(PullArgs),
}

/// Which node to measure and how to start it.
#[derive(Debug, Args, Clone)]
pub struct NodeArgs {
    /// Measure an already running node instead of starting one
    /// (e.g. http://127.0.0.1:8080).
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// With --target: the node's pid, to read its RSS and CPU time from /proc.
    #[arg(long, value_name = "PID", requires = "target")]
    pub node_pid: Option<u32>,
    /// The belfry binary to start [default: `belfry` next to this binary].
    #[arg(long, value_name = "PATH")]
    pub belfry_bin: Option<PathBuf>,
    /// An environment variable for the started node, e.g.
    /// `--node-env BELFRY_ENGINE__MAX_IN_FLIGHT=2048` (repeatable).
    #[arg(long = "node-env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub node_env: Vec<(String, String)>,
    /// An extra argument after `belfry serve ...` (repeatable).
    #[arg(long = "node-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
    /// Where the started node's temp data dir is created [default: the
    /// system temp dir]. It is deleted at the end.
    #[arg(long, value_name = "DIR")]
    pub data_parent: Option<PathBuf>,
    /// Tenant to register and schedule for [default: bench-<unix ms>].
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start the node on PostgreSQL (`belfry serve --database-url`): a fresh
    /// database is created on this server (`postgres://user@host:port/db`)
    /// for the run and dropped at the end; the run starts once the node
    /// owns every partition, and PostgreSQL's CPU is reported.
    #[arg(long, value_name = "URL", conflicts_with = "target")]
    pub database_url: Option<String>,
    /// Start the node with a generated admin API key
    /// (`auth.bootstrap_admin_key`) and send it with every request, to
    /// measure what authentication costs (the node runs keyless otherwise).
    #[arg(long)]
    pub with_api_key: bool,
}

/// How the events are sent.
#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// Events per `POST /events/schedule` request.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Requests in flight at once (each on its own keep-alive connection).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Payload size in bytes (a JSON string of that many characters).
    #[arg(long)]
    pub payload_bytes: Option<usize>,
    /// Delivery policies in use: the tenant gets delivery defaults
    /// (`max_attempts`, `backoff`, `max_age_ms` through `PUT
    /// /v1/tenants/{t}`) and every event its own, sent through `POST
    /// /v1/tenants/{t}/events` instead of BigBen's route.
    #[arg(long)]
    pub policy: bool,
}

/// Output and runtime of the tool itself.
#[derive(Debug, Args, Clone)]
pub struct OutputArgs {
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the report into this directory: `report.json`, and
    /// `report.html` with plots (lateness histogram, delivery rate and
    /// lateness over time; also as `.svg` files).
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Tokio worker threads of the generator + receiver (they share the
    /// machine with the node).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Events to schedule.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: usize,
    /// Due instants spread uniformly over this many milliseconds, starting a
    /// day from now.
    #[arg(long, default_value_t = 3_600_000)]
    pub spread_ms: u64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Events coming due at a steady rate (`steady`, `mixed`, `kafka steady`).
#[derive(Debug, Args, Clone)]
pub struct SteadyRate {
    /// Events per second coming due.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// How long events keep coming due: `30s`, `500ms`, `2m` or seconds.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time from the start of scheduling to the first due instant
    /// [default: 5 s + 50 µs per event, room for ingest at 20k events/s].
    #[arg(long)]
    pub lead_ms: Option<u64>,
    /// How long after the last due instant to wait for deliveries.
    #[arg(long, default_value_t = 60_000)]
    pub grace_ms: u64,
}

#[derive(Debug, Args)]
pub struct SteadyArgs {
    #[command(flatten)]
    pub steady: SteadyRate,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct MixedArgs {
    /// The events whose lateness is measured.
    #[command(flatten)]
    pub steady: SteadyRate,
    /// New events per second ingested while the others fire.
    #[arg(long, default_value_t = 20_000)]
    pub ingest_rate: u64,
    /// Events per request of the ingest stream.
    #[arg(long, default_value_t = 1_000)]
    pub ingest_batch: usize,
    /// Requests of the ingest stream in flight at most.
    #[arg(long, default_value_t = 4)]
    pub ingest_concurrency: usize,
    /// The ingested events are due this long after the last firing instant
    /// (one per ms from then on): outside the timer window, none fires
    /// during the run.
    #[arg(long, default_value_t = 600_000)]
    pub ingest_due_after_ms: u64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct HungArgs {
    /// Tenants whose webhook never answers.
    #[arg(long, default_value_t = 1)]
    pub hung_tenants: usize,
    /// Events of each hung tenant, all due at one instant.
    #[arg(long, default_value_t = 10_000_000)]
    pub hung_events: usize,
    /// The hung tenants' `timeout_ms` (the node caps it at
    /// `http.max_tenant_timeout_ms`, 30 s by default).
    #[arg(long, default_value_t = 3_600_000)]
    pub hung_timeout_ms: u64,
    /// Events per second of the healthy tenant, due from the hung events'
    /// instant on.
    #[arg(long, default_value_t = 200)]
    pub healthy_rate: u64,
    /// How long the healthy tenant's events keep coming due.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time from the start of scheduling to the hung events' instant
    /// [default: 10 s + 20 µs per event, room for ingest at 50k events/s].
    #[arg(long)]
    pub lead_ms: Option<u64>,
    /// How long after the healthy tenant's last due instant to wait for its
    /// deliveries.
    #[arg(long, default_value_t = 30_000)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ReadersArgs {
    /// Clients listing at once.
    #[arg(long, default_value_t = 50)]
    pub readers: usize,
    /// Events of the listed tenant (never due during the run).
    #[arg(long, default_value_t = 1_000)]
    pub reader_events: usize,
    /// Payload of each listed event (the node's default limit: 256 KiB).
    #[arg(long, default_value_t = 256 * 1024)]
    pub reader_payload_bytes: usize,
    /// How fast each client reads its answer.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub read_bytes_per_s: u64,
    /// Events per second of the healthy tenant.
    #[arg(long, default_value_t = 200)]
    pub healthy_rate: u64,
    /// How long the healthy tenant's events keep coming due (and the
    /// clients keep listing).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time from scheduling the healthy tenant's events to the first.
    #[arg(long, default_value_t = 5_000)]
    pub lead_ms: u64,
    /// How long after the healthy tenant's last due instant to wait for its
    /// deliveries.
    #[arg(long, default_value_t = 30_000)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct BurstArgs {
    /// Events due at the same instant.
    #[arg(long, default_value_t = 100_000)]
    pub count: usize,
    /// Time from the start of scheduling to the instant
    /// [default: 5 s + 50 µs per event].
    #[arg(long)]
    pub lead_ms: Option<u64>,
    /// How long after the instant to wait for deliveries.
    #[arg(long, default_value_t = 60_000)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct BacklogArgs {
    /// Pending events to hold.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: usize,
    /// Due instants spread uniformly over this many milliseconds, starting a
    /// day from now.
    #[arg(long, default_value_t = 3_600_000)]
    pub spread_ms: u64,
    /// Skip the kill -9 + restart measurement.
    #[arg(long)]
    pub no_restart: bool,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// Loopback port to listen on (`0`: any free port, printed on stderr).
    #[arg(long, default_value_t = 9090)]
    pub port: u16,
    /// Deliveries expected; the report is printed once they all arrived.
    #[arg(long)]
    pub expect: usize,
    /// Give up waiting after this long (the missing ones are reported).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Nodes to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub nodes: u16,
    /// Events to schedule.
    #[arg(long, default_value_t = 100_000)]
    pub count: usize,
    /// Due instants spread uniformly over this many milliseconds (0: all at
    /// one instant).
    #[arg(long, default_value_t = 10_000)]
    pub spread_ms: u64,
    /// Time from the start of scheduling to the first due instant
    /// [default: 5 s + 100 µs per event, room for ingest at 10k events/s].
    #[arg(long)]
    pub lead_ms: Option<u64>,
    /// How long after the last due instant to wait for deliveries.
    #[arg(long, default_value_t = 60_000)]
    pub grace_ms: u64,
    /// Partitions of the cluster's store (the nodes' `--partitions`): the
    /// run starts once all of them are owned.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub partitions: u16,
    /// Measure ingest only: the events are due a day from now and nothing
    /// is delivered.
    #[arg(long, conflicts_with_all = ["kill_leader_after_ms", "kill_follower_after_ms"])]
    pub ingest_only: bool,
    /// kill -9 the Master this many ms after the first event is due, and
    /// report the failover (longest gap in arrivals, worst lateness,
    /// duplicates).
    #[arg(long, value_name = "MS")]
    pub kill_leader_after_ms: Option<u64>,
    /// Like `--kill-leader-after-ms`, but kill -9 a node that is not the
    /// Master (the first such in start order).
    #[arg(long, value_name = "MS", conflicts_with = "kill_leader_after_ms")]
    pub kill_follower_after_ms: Option<u64>,
    /// A PostgreSQL server to use (`postgres://user@host:port/db`); a fresh
    /// database is created on it for the run and dropped afterwards
    /// [default: a throwaway server started for the run, with fsync=off].
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// The belfry binary to start [default: `belfry` next to this binary].
    #[arg(long, value_name = "PATH")]
    pub belfry_bin: Option<PathBuf>,
    /// An environment variable for every node (repeatable).
    #[arg(long = "node-env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub node_env: Vec<(String, String)>,
    /// An extra argument after `belfry serve ...` for every node (repeatable).
    #[arg(long = "node-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
    /// Tenant to register and schedule for [default: bench-<unix ms>].
    #[arg(long)]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// Schedules to create.
    #[arg(long, default_value_t = 10_000)]
    pub count: usize,
    /// How long occurrences are measured once every schedule exists:
    /// `120s`, `2m` or seconds.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub duration: Duration,
    /// `PUT` requests in flight while creating the schedules.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Every schedule fires every second (Quartz `"* * * * * ?"`) instead
    /// of once a minute: many occurrences from few schedules, for short
    /// runs.
    #[arg(long)]
    pub every_second: bool,
    /// How long after the measured span to wait for its occurrences.
    #[arg(long, default_value_t = 30_000)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct KafkaArgs {
    #[command(subcommand)]
    pub mode: KafkaMode,
}

impl KafkaArgs {
    pub fn output(&self) -> &OutputArgs {
        match &self.mode {
            KafkaMode::Ingest(args) => &args.output,
            KafkaMode::Burst(args) => &args.output,
            KafkaMode::Steady(args) => &args.output,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum KafkaMode {
    /// `--count` BigBen `EventRequest` records (due a day from now) are
    /// produced to the ingest topic while the node is down; the node then
    /// starts with `[kafka.ingest]` reading that topic and answering on a
    /// response topic: the rate at which the answers arrive is the durable
    /// ingest rate.
    Ingest(KafkaIngestArgs),
    /// `--count` events due at the same instant for a `MESSAGING` tenant,
    /// scheduled over HTTP, delivered to its topic and consumed here:
    /// delivery rate, lateness at the consumer, early, missing, duplicates.
    Burst(KafkaBurstArgs),
    /// `--rate` events/s coming due for `--duration` for a `MESSAGING`
    /// tenant, measured as `burst` does.
    Steady(KafkaSteadyArgs),
}

/// The broker and the topics.
#[derive(Debug, Args, Clone)]
pub struct KafkaCommonArgs {
    /// A running broker's `bootstrap.servers` instead of starting
    /// `belfry-kafka-mock` (topics are created there if missing).
    #[arg(long, value_name = "HOST:PORT,...")]
    pub bootstrap: Option<String>,
    /// Partitions of every topic the bench creates [default: 64 for
    /// `ingest`, 16 for `burst` and `steady`]. The mock broker keeps only
    /// the newest 5 MiB of each partition: records produced ahead of the
    /// node must fit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: Option<u32>,
    /// A producer setting of the tenant's sink (`MESSAGING` props) or of
    /// the node's answer producer, e.g. `--kafka-prop linger.ms=10`
    /// (repeatable).
    #[arg(long = "kafka-prop", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub kafka_props: Vec<(String, String)>,
}

#[derive(Debug, Args)]
pub struct KafkaIngestArgs {
    /// Records to produce and ingest.
    #[arg(long, default_value_t = 1_000_000)]
    pub count: usize,
    /// Most records the node stores in one durable batch
    /// (`kafka.ingest.max_batch`).
    #[arg(long, default_value_t = 2_000)]
    pub max_batch: usize,
    /// Payload size in bytes (a JSON string of that many characters).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Give up waiting for answers after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub kafka: KafkaCommonArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct KafkaBurstArgs {
    /// Events due at the same instant.
    #[arg(long, default_value_t = 200_000)]
    pub count: usize,
    /// Time from the start of scheduling to the instant
    /// [default: 5 s + 50 µs per event].
    #[arg(long)]
    pub lead_ms: Option<u64>,
    /// How long after the instant to wait for deliveries.
    #[arg(long, default_value_t = 60_000)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub kafka: KafkaCommonArgs,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct KafkaSteadyArgs {
    #[command(flatten)]
    pub steady: SteadyRate,
    #[command(flatten)]
    pub kafka: KafkaCommonArgs,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    #[command(subcommand)]
    pub mode: PullMode,
}

impl PullArgs {
    pub fn output(&self) -> &OutputArgs {
        match &self.mode {
            PullMode::Lateness(args) => &args.common.output,
            PullMode::Throughput(args) => &args.common.output,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum PullMode {
    /// `--rate` events/s coming due for `--duration` while the workers
    /// long-poll: lateness from due to leased (the node's `leased_at` −
    /// `due_at`, and the claim's answer at the worker − the instant).
    /// Target: p99 <= 10 ms on one node.
    Lateness(PullLatenessArgs),
    /// `--count` events due at one instant; the workers start claiming
    /// then: claim-and-complete events/s and the node's CPU per event.
    /// Target: >= 20,000 events/s on one node.
    Throughput(PullThroughputArgs),
}

/// The workers, and the node they work for.
#[derive(Debug, Args, Clone)]
pub struct PullCommonArgs {
    /// Workers, each with one claim at a time.
    #[arg(long, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub workers: usize,
    /// `max_events` of each claim (1–100).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_events: u32,
    /// `wait_ms` of each claim: how long it long-polls (0–30,000).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(0..=30_000))]
    pub wait_ms: u64,
    /// Complete a claim's leases in one `POST
    /// /v1/tenants/{t}/leases/complete` instead of one `POST
    /// /v1/leases/{id}/complete` per lease.
    #[arg(long)]
    pub batch_complete: bool,
    /// Start this many `belfry serve --database-url` nodes on one
    /// PostgreSQL database (a throwaway server, or `--database-url`'s)
    /// instead of one node: the events are scheduled round-robin over
    /// the nodes, and worker `i` claims and completes on node `i mod N`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16), conflicts_with = "target")]
    pub nodes: u16,
    /// `lease_ms` of each claim (1,000–43,200,000).
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1_000..=900_000))]
    pub lease_ms: u64,
    /// Time from the start of scheduling to the first due instant
    /// [default: 5 s + 50 µs per event].
    #[arg(long)]
    pub lead_ms: Option<u64>,
    /// How long after the last due instant to wait for every event to be
    /// completed.
    #[arg(long, default_value_t = 60_000)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct PullLatenessArgs {
    /// Events per second coming due.
    #[arg(long, default_value_t = 1_000)]
    pub rate: u64,
    /// How long events keep coming due: `20s`, `500ms`, `2m` or seconds.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub duration: Duration,
    #[command(flatten)]
    pub common: PullCommonArgs,
}

#[derive(Debug, Args)]
pub struct PullThroughputArgs {
    /// Events due at one instant (the backlog).
    #[arg(long, default_value_t = 100_000)]
    pub count: usize,
    #[command(flatten)]
    pub common: PullCommonArgs,
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// `30s`, `500ms`, `2m`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit_ms) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000)
    } else {
        (text, 1_000)
    };
    let value: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("expected a duration like 30s, 500ms or 2m, got {text:?}"))?;
    Ok(Duration::from_millis(value.saturating_mul(unit_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn node_env_needs_a_key() {
        assert_eq!(
            parse_key_value("A=b=c"),
            Ok(("A".to_string(), "b=c".to_string()))
        );
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("novalue").is_err());
    }

    #[test]
    fn pull_arguments_parse_with_defaults_and_limits() {
        let cli = Cli::try_parse_from([
            "belfry-bench",
            "pull",
            "lateness",
            "--rate",
            "500",
            "--duration",
            "2s",
            "--workers",
            "3",
            "--nodes",
            "3",
        ])
        .unwrap();
        let Scenario::Pull(PullArgs {
            mode: PullMode::Lateness(args),
        }) = cli.scenario
        else {
            panic!("not pull lateness");
        };
        assert_eq!(args.rate, 500);
        assert_eq!(args.duration, Duration::from_secs(2));
        assert_eq!(args.common.workers, 3);
        assert_eq!(args.common.nodes, 3);
        assert_eq!(args.common.max_events, 100);
        assert_eq!(args.common.wait_ms, 5_000);

        let cli = Cli::try_parse_from([
            "belfry-bench",
            "pull",
            "throughput",
            "--count",
            "1000",
            "--max-events",
            "10",
            "--batch-complete",
            "--json",
        ])
        .unwrap();
        let Scenario::Pull(PullArgs {
            mode: PullMode::Throughput(args),
        }) = cli.scenario
        else {
            panic!("not pull throughput");
        };
        assert_eq!(args.count, 1000);
        assert_eq!(args.common.max_events, 10);
        assert!(args.common.batch_complete);
        assert!(args.common.output.json);

        // The API's limits are refused before any node starts.
        for bad in [
            ["--max-events", "101"],
            ["--wait-ms", "30001"],
            ["--lease-ms", "999"],
            ["--workers", "0"],
            ["--nodes", "17"],
        ] {
            let mut argv = vec!["belfry-bench", "pull", "throughput"];
            argv.extend(bad);
            assert!(Cli::try_parse_from(&argv).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
