//! The `kafka` scenarios: Kafka in and out, with the broker in its own
//! process (`belfry-kafka-mock`, librdkafka's mock cluster, next to this
//! binary; or a running broker named by `--bootstrap`).
//!
//! - `ingest`: `--count` BigBen `EventRequest` records, keyed `tenant/id`
//!   and due a day from now, are produced to the request topic while the
//!   node runs without ingestion; the node is then restarted with
//!   `[kafka.ingest]` reading that topic and answering on a response topic.
//!   An answer is produced only after its request was durably stored, so
//!   the rate at which answers arrive is the durable ingest rate. Every
//!   answer is checked (`ACCEPTED`), and the dead-letter topic must stay
//!   empty.
//! - `burst` / `steady`: a `MESSAGING` tenant whose topic a consumer here
//!   reads from the beginning; events scheduled over HTTP (as `burst` and
//!   `steady` do for webhooks) are checked on arrival at the consumer:
//!   lateness (arrival − scheduled instant, so the broker round trip and
//!   the consumer's fetch are included), early, missing, duplicates, and
//!   the record timestamps (when the node started each attempt).
//!
//! The consumers run on their own threads (`BaseConsumer::poll`), taking
//! the arrival time as each record is handed over.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use belfry_testkit::KafkaBroker;
use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::Serialize;
use serde_json::json;

use crate::cli::{KafkaArgs, KafkaCommonArgs, KafkaIngestArgs, KafkaMode, LoadArgs, NodeArgs};
use crate::deliveries::{Arrival, summarize};
use crate::load::{self, Bodies, clear_progress_line, progress_line};
use crate::node::Node;
use crate::report::{NodeReport, Report, percentiles};
use crate::scenarios::{
    FAR_FUTURE_MS, Load, SETTLE, Shape, ingest_warnings, load_params, merge, own_cpu_since,
    own_sample, scheduled_late, spot_check,
};
use crate::stats::Percentiles;
use crate::workload::{BodyWriter, now_ms, parse_instant_ms};

/// The request topic of `ingest`; answers and dead letters go to topics
/// named after it.
const REQUEST_TOPIC: &str = "bench-requests";
const ANSWER_TOPIC: &str = "bench-requests-answers";
const DEAD_LETTER_TOPIC: &str = "bench-requests-dlq";
/// The `MESSAGING` tenant's topic of `burst` and `steady`.
const DELIVERY_TOPIC: &str = "bench-deliveries";
/// The id of the event that warms the tenant's producer up before the
/// measured events (a producer is made at a tenant's first delivery).
const WARM_UP_ID: &str = "warm-up";
/// What librdkafka's mock broker keeps of a partition (it drops the oldest
/// records beyond that, as retention would).
const MOCK_PARTITION_BYTES: usize = 5 * 1024 * 1024;

/// What only Kafka shows, beside the usual ingest and delivery sections.
#[derive(Debug, Clone, Serialize)]
pub struct KafkaReport {
    /// `"belfry-kafka-mock (own process)"` or `"external"`.
    pub broker: String,
    pub bootstrap_servers: String,
    pub partitions: u32,
    /// `ingest`: the records the bench produced before the node read them.
    pub produced: Option<ProducedReport>,
    /// `ingest`: the node's answers.
    pub answers: Option<AnswersReport>,
    /// `burst` / `steady`: record timestamp (when the node started the
    /// delivering attempt) − scheduled instant, of each event's first
    /// record, in ms. The consumer's arrival is in `delivery`.
    pub record_timestamp_lateness_ms: Option<Percentiles>,
    /// Node CPU per event over the measured span, in µs.
    pub node_cpu_per_event_us: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProducedReport {
    pub records: usize,
    pub seconds: f64,
    pub records_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AnswersReport {
    pub expected: usize,
    /// Answers with `eventStatus` `ACCEPTED` for a request of this run.
    pub accepted: usize,
    /// Any other answer (or one that is not a BigBen `EventResponse`).
    pub other: usize,
    /// Distinct requests answered more than once (a re-read after a
    /// rebalance, say), counted once in `accepted`.
    pub answered_twice: usize,
    pub dead_letters: usize,
    /// From spawning the node with ingestion until its first answer arrived
    /// (process start, consumer group join, first batch).
    pub start_to_first_answer_ms: Option<i64>,
    /// From the first answer's record timestamp to the last's.
    pub first_to_last_answer_s: f64,
    /// Requests answered per second over that span: the ingest rate.
    pub events_per_s: f64,
    /// Requests answered per second from spawning the node.
    pub events_per_s_from_start: f64,
    /// `GET /events/find` of a sample of the requests, after the run.
    pub spot_checked: usize,
    pub spot_found: usize,
}

impl KafkaReport {
    pub(crate) fn rows(&self, rows: &mut Vec<(String, String)>) {
        rows.push((
            "kafka".into(),
            format!(
                "{} at {}, {} partitions per topic",
                self.broker, self.bootstrap_servers, self.partitions
            ),
        ));
        if let Some(produced) = &self.produced {
            rows.push((
                "  produced".into(),
                format!(
                    "{} records in {:.2} s ({:.0}/s) before the node read them",
                    produced.records, produced.seconds, produced.records_per_s
                ),
            ));
        }
        if let Some(answers) = &self.answers {
            rows.push((
                "  answers".into(),
                format!(
                    "{}/{} ACCEPTED, {} other, {} answered twice, {} dead letters",
                    answers.accepted,
                    answers.expected,
                    answers.other,
                    answers.answered_twice,
                    answers.dead_letters
                ),
            ));
            rows.push((
                "  ingest rate".into(),
                format!(
                    "{:.0} events/s over {:.2} s (first to last answer); {:.0}/s from the node's start, first answer after {} ms",
                    answers.events_per_s,
                    answers.first_to_last_answer_s,
                    answers.events_per_s_from_start,
                    answers
                        .start_to_first_answer_ms
                        .map_or("-".to_string(), |ms| ms.to_string())
                ),
            ));
            rows.push((
                "  spot check".into(),
                format!(
                    "{}/{} sampled requests found",
                    answers.spot_found, answers.spot_checked
                ),
            ));
        }
        if let Some(lateness) = self.record_timestamp_lateness_ms {
            rows.push(("  record timestamp − due ms".into(), percentiles(lateness)));
        }
        if let Some(us) = self.node_cpu_per_event_us {
            rows.push(("  node CPU per event".into(), format!("{us:.1} µs")));
        }
    }
}

pub async fn run(args: KafkaArgs) -> anyhow::Result<Report> {
    match args.mode {
        KafkaMode::Ingest(args) => ingest(args).await,
        KafkaMode::Burst(args) => {
            let shape = Shape::burst("kafka-burst", args.count, args.lead_ms, args.grace_ms);
            deliver(shape, &args.kafka, &args.load, &args.node).await
        }
        KafkaMode::Steady(args) => {
            let shape = Shape::steady("kafka-steady", &args.steady);
            deliver(shape, &args.kafka, &args.load, &args.node).await
        }
    }
}

/// The broker of a run: the mock process (stopped when dropped) or an
/// external one.
struct Broker {
    mock: Option<KafkaBroker>,
    bootstrap: String,
}

impl Broker {
    /// Starts `belfry-kafka-mock` with `topics` (or creates them on
    /// `--bootstrap`), each with `--partitions` partitions.
    async fn start(
        args: &KafkaCommonArgs,
        topics: &[&str],
        partitions: u32,
    ) -> anyhow::Result<Broker> {
        if let Some(bootstrap) = &args.bootstrap {
            create_topics(bootstrap, topics, partitions).await?;
            return Ok(Broker {
                mock: None,
                bootstrap: bootstrap.clone(),
            });
        }
        let binary = std::env::var_os(belfry_testkit::kafka::MOCK_BINARY_VAR)
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                crate::node::default_binary()
                    .unwrap_or_default()
                    .with_file_name("belfry-kafka-mock")
            });
        if !binary.is_file() {
            bail!(
                "no belfry-kafka-mock at {} (build it with `cargo build --release -p belfry-kafka-mock`, or pass --bootstrap)",
                binary.display()
            );
        }
        // The testkit's fixture panics when the mock does not start: turn
        // that into an error.
        let owned: Vec<String> = topics.iter().map(|t| (*t).to_string()).collect();
        let mock = tokio::task::spawn_blocking(move || {
            let specs: Vec<(&str, u32)> = owned.iter().map(|t| (t.as_str(), partitions)).collect();
            std::panic::catch_unwind(|| KafkaBroker::start_with(1, &specs))
        })
        .await
        .context("start belfry-kafka-mock")?
        .map_err(|_| anyhow::anyhow!("belfry-kafka-mock did not start (see its output above)"))?;
        Ok(Broker {
            bootstrap: mock.bootstrap_servers().to_string(),
            mock: Some(mock),
        })
    }

    fn describe(&self) -> String {
        if self.mock.is_some() {
            "belfry-kafka-mock (own process)".into()
        } else {
            "external".into()
        }
    }
}

/// Creates `topics` on a running broker; topics that exist are kept.
async fn create_topics(bootstrap: &str, topics: &[&str], partitions: u32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("Kafka admin client")?;
    let partitions = i32::try_from(partitions).context("--partitions")?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => bail!("cannot create topic {topic}: {code}"),
        }
    }
    Ok(())
}

/// Reads every partition of a topic from its beginning on a thread of its
/// own, turning each record into a `T` as it is handed over.
struct TopicReader<T> {
    stop: Arc<AtomicBool>,
    records: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> TopicReader<T> {
    /// `read(record, arrived_ms)` runs on the reader's thread.
    fn start(
        bootstrap: &str,
        topic: &str,
        mut read: impl FnMut(&BorrowedMessage<'_>, i64) -> T + Send + 'static,
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "belfry-bench-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // Records are handed over as soon as they are there: the
            // arrival time is the measurement.
            .set("fetch.wait.max.ms", "2")
            .set("fetch.error.backoff.ms", "10")
            .create()
            .context("Kafka consumer")?;
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("metadata of topic {topic}"))?;
        let partitions = metadata
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len());
        if partitions == 0 {
            bail!("topic {topic} has no partitions");
        }
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            let partition = i32::try_from(partition).context("partition number")?;
            assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(AtomicUsize::new(0));
        let thread = {
            let stop = Arc::clone(&stop);
            let records = Arc::clone(&records);
            let topic = topic.to_string();
            std::thread::Builder::new()
                .name(format!("read {topic}"))
                .spawn(move || {
                    let mut read_so_far = Vec::new();
                    let mut errors_reported = 0;
                    while !stop.load(Ordering::Relaxed) {
                        match consumer.poll(Duration::from_millis(20)) {
                            Some(Ok(message)) => {
                                read_so_far.push(read(&message, now_ms()));
                                records.fetch_add(1, Ordering::Relaxed);
                            }
                            // The first few are worth reading; a broker
                            // that is gone repeats itself.
                            Some(Err(error)) if errors_reported < 5 => {
                                errors_reported += 1;
                                eprintln!("belfry-bench: reading {topic}: {error}");
                            }
                            Some(Err(_)) | None => {}
                        }
                    }
                    read_so_far
                })
                .context("start a reader thread")?
        };
        Ok(TopicReader {
            stop,
            records,
            thread,
        })
    }

    fn records(&self) -> usize {
        self.records.load(Ordering::Relaxed)
    }

    fn finish(self) -> Vec<T> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The text of header `name`, if the record has it.
fn header<'a>(message: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a str> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

/// Waits until `done()` or `deadline_ms` (wall clock), with a progress line.
async fn wait_until(label: &str, deadline_ms: i64, progress: impl Fn() -> (usize, usize)) {
    let mut last_print = now_ms();
    loop {
        let (have, want) = progress();
        let now = now_ms();
        if have >= want || now >= deadline_ms {
            break;
        }
        if now - last_print >= 1000 {
            last_print = now;
            progress_line(&format!(
                "{label}: {have}/{want}, waiting up to {:.0} s more",
                (deadline_ms - now) as f64 / 1000.0
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    clear_progress_line();
}

/// `belfry.toml` of the `ingest` node: empty (no ingestion) until the
/// records are in the topic, then with `[kafka.ingest]`.
fn write_ingest_config(
    path: &Path,
    ingest: Option<(&str, &KafkaIngestArgs)>,
) -> anyhow::Result<()> {
    let text = match ingest {
        None => String::new(),
        Some((bootstrap, args)) => {
            let mut text = format!(
                "[kafka.ingest]\n\
                 bootstrap_servers = {bootstrap:?}\n\
                 topics = [{REQUEST_TOPIC:?}]\n\
                 group_id = \"belfry-bench\"\n\
                 response_topic = {ANSWER_TOPIC:?}\n\
                 dead_letter_topic = {DEAD_LETTER_TOPIC:?}\n\
                 allowed_tenants = [\"*\"]\n\
                 max_batch = {}\n",
                args.max_batch
            );
            if !args.kafka.kafka_props.is_empty() {
                text.push_str("[kafka.ingest.producer]\n");
                for (key, value) in &args.kafka.kafka_props {
                    text.push_str(&format!("{key:?} = {value:?}\n"));
                }
            }
            text
        }
    };
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

/// Produces `count` BigBen requests `e<n>`, keyed `tenant/e<n>`, due a
/// day from now; returns how long it took.
fn produce_requests(
    bootstrap: &str,
    tenant: &str,
    count: usize,
    payload_bytes: usize,
) -> anyhow::Result<Duration> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("Kafka producer")?;
    let writer = BodyWriter::new(tenant, payload_bytes);
    let first_due = now_ms() + FAR_FUTURE_MS;
    let started = std::time::Instant::now();
    for n in 0..count {
        let key = format!("{tenant}/e{n}");
        let value = writer.request("e", n, first_due + (n % 3_600_000) as i64);
        let mut record = BaseRecord::to(REQUEST_TOPIC).key(&key).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
                Err((error, _)) => bail!("producing request e{n}: {error}"),
            }
        }
        if n % 10_000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the requests")?;
    Ok(started.elapsed())
}

/// `n` of the answer to request `e<n>` (BigBen's compact `EventResponse`
/// JSON: `"id":"e<n>"`).
fn answered_index(answer: &[u8]) -> Option<usize> {
    let start = memchr::memmem::find(answer, br#""id":"e"#)? + 7;
    let digits = answer[start..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&answer[start..start + digits])
        .ok()?
        .parse()
        .ok()
}

/// One answer, reduced to what the report needs.
struct Answer {
    index: Option<usize>,
    accepted: bool,
    timestamp_ms: Option<i64>,
    arrived_ms: i64,
}

async fn ingest(args: KafkaIngestArgs) -> anyhow::Result<Report> {
    let partitions = args.kafka.partitions.unwrap_or(64);
    let broker = Broker::start(
        &args.kafka,
        &[REQUEST_TOPIC, ANSWER_TOPIC, DEAD_LETTER_TOPIC],
        partitions,
    )
    .await?;
    let mut warnings = Vec::new();
    // librdkafka's mock keeps the newest 5 MiB of a partition and drops
    // older records: requests produced ahead of the node must fit.
    let request_bytes = BodyWriter::new("t", args.payload_bytes)
        .request("e", args.count, 0)
        .len()
        + 64;
    if broker.mock.is_some()
        && args.count * request_bytes / partitions as usize > MOCK_PARTITION_BYTES * 9 / 10
    {
        bail!(
            "{} records of about {request_bytes} bytes do not fit in {partitions} partitions of the mock broker (5 MiB each, older records are dropped): raise --partitions",
            args.count
        );
    }
    let config_dir = tempfile::tempdir().context("a temp dir for the node's config")?;
    let config = config_dir.path().join("belfry.toml");
    write_ingest_config(&config, None)?;
    let mut node_args: NodeArgs = args.node.clone();
    if node_args.target.is_some() {
        bail!("kafka ingest restarts its node with [kafka.ingest]: --target is not supported");
    }
    node_args.node_args.push("--config".into());
    node_args
        .node_args
        .push(config.to_string_lossy().into_owned());
    let client = load::client(4)?;
    let mut node = Node::open(&node_args, &client).await?;
    let tenant = args
        .node
        .tenant
        .clone()
        .unwrap_or_else(|| format!("bench-{}", now_ms()));
    // Nothing is delivered: the events are due a day from now.
    node.register_tenant(&client, &tenant, "http://127.0.0.1:9/never")
        .await
        .with_context(|| node.logs_tail())?;

    let count = args.count;
    let produce_time = {
        let bootstrap = broker.bootstrap.clone();
        let tenant = tenant.clone();
        let payload_bytes = args.payload_bytes;
        tokio::task::spawn_blocking(move || {
            produce_requests(&bootstrap, &tenant, count, payload_bytes)
        })
        .await
        .context("producer thread")??
    };

    let answers = TopicReader::start(
        &broker.bootstrap,
        ANSWER_TOPIC,
        move |message, arrived_ms| {
            // A million answers: found in the bytes rather than parsed into a
            // `Value`, so the reader takes little of the machine's CPU.
            let payload = message.payload().unwrap_or_default();
            Answer {
                index: answered_index(payload).filter(|n| *n < count),
                accepted: memchr::memmem::find(payload, br#""eventStatus":"ACCEPTED""#).is_some(),
                timestamp_ms: message.timestamp().to_millis(),
                arrived_ms,
            }
        },
    )?;
    let dead_letters = TopicReader::start(&broker.bootstrap, DEAD_LETTER_TOPIC, |_, _| ())?;

    write_ingest_config(&config, Some((&broker.bootstrap, &args)))?;
    let bench_before = own_sample();
    let started_ms = now_ms();
    node.kill_9_and_restart()
        .await
        .with_context(|| node.logs_tail())?;
    let node_before = node.sample();
    let timeout_ms = i64::try_from(args.timeout.as_millis()).unwrap_or(i64::MAX);
    wait_until("kafka ingest answers", started_ms + timeout_ms, || {
        (answers.records() + dead_letters.records(), count)
    })
    .await;
    let node_after = node.sample();
    let bench_cpu = own_cpu_since(bench_before);
    // Late duplicates and dead letters are counted too.
    tokio::time::sleep(SETTLE).await;
    let answers = answers.finish();
    let dead_letters = dead_letters.finish().len();

    let mut seen = vec![false; count];
    let (mut accepted, mut other, mut twice) = (0, 0, 0);
    for answer in &answers {
        match answer.index {
            Some(i) if answer.accepted => {
                if std::mem::replace(&mut seen[i], true) {
                    twice += 1;
                } else {
                    accepted += 1;
                }
            }
            _ => other += 1,
        }
    }
    let first_ts = answers.iter().filter_map(|a| a.timestamp_ms).min();
    let last_ts = answers.iter().filter_map(|a| a.timestamp_ms).max();
    let first_arrival = answers.iter().map(|a| a.arrived_ms).min();
    let last_arrival = answers.iter().map(|a| a.arrived_ms).max();
    let span_s = match (first_ts, last_ts) {
        (Some(a), Some(b)) => ((b - a).max(1)) as f64 / 1000.0,
        _ => 0.0,
    };
    let (spot_found, spot_checked) = spot_check(&client, &node, &tenant, count).await;
    let node_report = NodeReport::over(node_before, node_after);

    if accepted < count {
        warnings.push(format!(
            "only {accepted} of {count} requests were answered ACCEPTED; the node's last lines:\n{}",
            node.logs_tail()
        ));
    }
    if dead_letters > 0 {
        warnings.push(format!("{dead_letters} requests were dead-lettered"));
    }
    if spot_found < spot_checked {
        warnings.push(format!(
            "only {spot_found} of {spot_checked} sampled requests were found"
        ));
    }
    let kafka = KafkaReport {
        broker: broker.describe(),
        bootstrap_servers: broker.bootstrap.clone(),
        partitions,
        produced: Some(ProducedReport {
            records: count,
            seconds: produce_time.as_secs_f64(),
            records_per_s: count as f64 / produce_time.as_secs_f64().max(1e-9),
        }),
        answers: Some(AnswersReport {
            expected: count,
            accepted,
            other,
            answered_twice: twice,
            dead_letters,
            start_to_first_answer_ms: first_arrival.map(|t| t - started_ms),
            first_to_last_answer_s: span_s,
            events_per_s: if span_s > 0.0 {
                accepted as f64 / span_s
            } else {
                0.0
            },
            events_per_s_from_start: last_arrival.map_or(0.0, |t| {
                accepted as f64 / (((t - started_ms).max(1)) as f64 / 1000.0)
            }),
            spot_checked,
            spot_found,
        }),
        record_timestamp_lateness_ms: None,
        node_cpu_per_event_us: node_report
            .as_ref()
            .map(|n| n.cpu_during_run.total_s() * 1e6 / accepted.max(1) as f64),
    };
    let report = Report {
        scenario: "kafka-ingest",
        params: json!({
            "count": count,
            "max_batch": args.max_batch,
            "payload_bytes": args.payload_bytes,
            "partitions": partitions,
            "kafka_props": props_json(&args.kafka),
            "node": node.base_url(),
        }),
        warnings,
        node: node_report,
        kafka: Some(kafka),
        bench_cpu,
        ..Report::default()
    };
    node.close().await;
    drop(broker);
    Ok(report)
}

fn props_json(args: &KafkaCommonArgs) -> serde_json::Value {
    args.kafka_props
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// One record of the tenant's topic.
struct Delivered {
    /// `Some(n)` for event `e<n>` of the workload.
    index: Option<usize>,
    warm_up: bool,
    scheduled_header_ms: Option<i64>,
    timestamp_ms: Option<i64>,
    arrived_ms: i64,
}

async fn deliver(
    shape: Shape,
    kafka: &KafkaCommonArgs,
    load_args: &LoadArgs,
    node_args: &NodeArgs,
) -> anyhow::Result<Report> {
    let load = Load::from(load_args);
    let partitions = kafka.partitions.unwrap_or(16);
    let broker = Broker::start(kafka, &[DELIVERY_TOPIC], partitions).await?;
    let client = load::client(load.concurrency)?;
    let node = Node::open(node_args, &client).await?;
    let tenant = node_args
        .tenant
        .clone()
        .unwrap_or_else(|| format!("bench-{}", now_ms()));
    let mut props = serde_json::Map::new();
    props.insert("topic".into(), DELIVERY_TOPIC.into());
    props.insert("bootstrap.servers".into(), broker.bootstrap.clone().into());
    for (key, value) in &kafka.kafka_props {
        props.insert(key.clone(), value.clone().into());
    }
    node.register_tenant_config(
        &client,
        &json!({"tenant": tenant, "type": "MESSAGING", "props": props}),
    )
    .await
    .with_context(|| node.logs_tail())?;

    let count = shape.count;
    let distinct = Arc::new(AtomicUsize::new(0));
    let reader = {
        let distinct = Arc::clone(&distinct);
        let mut seen = vec![false; count];
        TopicReader::start(
            &broker.bootstrap,
            DELIVERY_TOPIC,
            move |message, arrived_ms| {
                let id = header(message, "x-belfry-event-id");
                let index = id
                    .and_then(|id| id.strip_prefix('e'))
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| *n < count);
                if let Some(i) = index
                    && !std::mem::replace(&mut seen[i], true)
                {
                    distinct.fetch_add(1, Ordering::Relaxed);
                }
                Delivered {
                    index,
                    warm_up: id == Some(WARM_UP_ID),
                    scheduled_header_ms: header(message, "x-belfry-scheduled-at")
                        .and_then(parse_instant_ms),
                    timestamp_ms: message.timestamp().to_millis(),
                    arrived_ms,
                }
            },
        )?
    };
    warm_up(&client, &node, &tenant, &reader).await?;

    let workload = shape.workload(&tenant, load.payload_bytes);
    let first_due = workload.due_ms.iter().copied().min().unwrap_or(0);
    let last_due = workload.due_ms.iter().copied().max().unwrap_or(0);
    let node_before = node.sample();
    let bench_before = own_sample();
    let ingest = load::run(
        &client,
        &[node.url("/events/schedule")],
        Bodies::prebuilt(workload.request_bodies(load.batch)),
        load.batch,
        load.concurrency,
        shape.scenario,
    )
    .await;
    let mut warnings = ingest_warnings(&ingest);
    warnings.extend(scheduled_late(&ingest, first_due));
    let node_at_first_due = {
        crate::mixed::sleep_until_ms(first_due).await;
        node.sample()
    };
    let deadline = last_due.saturating_add(i64::try_from(shape.grace_ms).unwrap_or(i64::MAX));
    wait_until(&format!("{} delivery", shape.scenario), deadline, || {
        (distinct.load(Ordering::Relaxed), count)
    })
    .await;
    let node_after = node.sample();
    let bench_cpu = own_cpu_since(bench_before);
    tokio::time::sleep(SETTLE).await;
    let records = reader.finish();

    let mut seen = vec![false; count];
    let (mut unknown, mut mismatch) = (0, 0);
    let mut arrivals = Vec::with_capacity(records.len());
    let mut stamped = Vec::with_capacity(count);
    for record in &records {
        let Some(index) = record.index else {
            unknown += usize::from(!record.warm_up);
            continue;
        };
        let scheduled_ms = workload.due_ms[index];
        if record.scheduled_header_ms != Some(scheduled_ms) {
            mismatch += 1;
        }
        let first_of_event = !std::mem::replace(&mut seen[index], true);
        if first_of_event && let Some(ts) = record.timestamp_ms {
            stamped.push(ts - scheduled_ms);
        }
        arrivals.push(Arrival {
            arrived_ms: record.arrived_ms,
            scheduled_ms,
            first_of_event,
        });
    }
    let delivery = summarize(&arrivals, count, unknown, mismatch);
    let delivered = delivery.delivered;
    let node_cpu_per_event_us = node_at_first_due
        .zip(node_after)
        .map(|(b, a)| a.cpu_since(&b).total_s() * 1e6 / delivered.max(1) as f64);
    let report = Report {
        scenario: shape.scenario,
        params: merge(
            merge(load_params(load), shape.params),
            json!({"partitions": partitions, "kafka_props": props_json(kafka), "node": node.base_url()}),
        ),
        warnings,
        ingest: Some(ingest),
        delivery: Some(delivery),
        node: NodeReport::over(node_before, node_after),
        kafka: Some(KafkaReport {
            broker: broker.describe(),
            bootstrap_servers: broker.bootstrap.clone(),
            partitions,
            produced: None,
            answers: None,
            record_timestamp_lateness_ms: Percentiles::of(&mut stamped),
            node_cpu_per_event_us,
        }),
        bench_cpu,
        ..Report::default()
    };
    node.close().await;
    drop(broker);
    Ok(report)
}

/// Schedules one event due now and waits for its record, so the tenant's
/// producer exists (connected, idempotent id granted) before the measured
/// events come due.
async fn warm_up(
    client: &reqwest::Client,
    node: &Node,
    tenant: &str,
    reader: &TopicReader<Delivered>,
) -> anyhow::Result<()> {
    let body = json!([{
        "id": WARM_UP_ID,
        "tenant": tenant,
        "eventTime": jiff::Timestamp::now().to_string(),
        "payload": "warm-up",
    }]);
    let response = client
        .post(node.url("/events/schedule"))
        .json(&body)
        .send()
        .await
        .context("schedule the warm-up event")?;
    if !response.status().is_success() {
        bail!(
            "scheduling the warm-up event answered {}",
            response.status()
        );
    }
    wait_until("warm-up", now_ms() + 30_000, || (reader.records(), 1)).await;
    if reader.records() == 0 {
        bail!(
            "the warm-up event did not reach {DELIVERY_TOPIC} within 30 s\n{}",
            node.logs_tail()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_name_their_request() {
        let answer = br#"{"id":"e1234","eventTime":"2030-01-01T00:00:00Z","tenant":"t","eventStatus":"ACCEPTED"}"#;
        assert_eq!(answered_index(answer), Some(1234));
        assert_eq!(answered_index(br#"{"id":"x1"}"#), None);
        assert_eq!(answered_index(br#"{"id":"e"}"#), None);
    }
}
