//! The consumer task: poll a batch, store it durably, produce its answers
//! and dead letters, then store its offsets (committed in the background).
//!
//! # Contract
//! - An offset is stored only after every record below it is on disk (the
//!   engine acknowledges a batch after its fsync) or, if it can never be
//!   stored, in the dead-letter topic (acknowledged by Kafka with
//!   `acks=all`). librdkafka commits stored offsets in the background
//!   every `commit_interval_ms`, and this task when partitions are
//!   revoked and at shutdown. (Committing after every batch was tried:
//!   commits that reach the broker during a rebalance are refused, and
//!   librdkafka answers a refusal by rejoining, which can keep the group
//!   rebalancing.)
//! - One batch at a time, records in their order: the records of one
//!   partition are applied in offset order, so a `REMOVE` keyed like its
//!   `UPSERT` never overtakes it.
//! - The store failing pauses every assigned partition; the batch is tried
//!   again (with backoff) until it is stored; nothing is stored or
//!   committed meanwhile. The consumer keeps polling while paused, so it
//!   stays in its group and serves rebalances.
//! - A revoked partition's records that are not stored yet are dropped
//!   here (its next owner reads them again from the committed offset), and
//!   its offsets are committed before it goes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use belfry_api::ingest::{TenantAllowList, Verdict};
use belfry_engine::EngineHandle;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::IngestOptions;
use crate::records::{Output, Reader, source};

/// The longest wait between two tries of a failed batch.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Counters for logs, tests and metrics.
#[derive(Debug, Default)]
pub struct IngestStats {
    /// Records taken from the topics (a record read again counts again).
    pub consumed: AtomicU64,
    /// Records stored (or answered without a change).
    pub stored: AtomicU64,
    /// Records sent to the dead-letter topic.
    pub dead_lettered: AtomicU64,
    /// Batches the store (or the producer) failed; each is tried again.
    pub failed_tries: AtomicU64,
    /// Whether consumption is paused right now (the store is failing).
    pub paused: AtomicBool,
}

/// Why ingestion could not start.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{0}")]
    Config(String),
    #[error("Kafka client: {0}")]
    Kafka(#[from] KafkaError),
}

/// Running ingestion. Call [`Ingest::shutdown`] to stop it cleanly.
#[derive(Debug)]
pub struct Ingest {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    stats: Arc<IngestStats>,
}

impl Ingest {
    /// Joins the consumer group and starts consuming. `lapse_offset_ms` is
    /// `api.lapse_offset_ms` (BigBen's past-due threshold). Must be called
    /// inside a tokio runtime.
    ///
    /// # Errors
    /// Invalid options, or a Kafka client that cannot be created.
    pub fn start(
        options: IngestOptions,
        engine: EngineHandle,
        lapse_offset_ms: u64,
    ) -> Result<Ingest, IngestError> {
        let problems = options.problems();
        if !problems.is_empty() {
            return Err(IngestError::Config(problems.join("; ")));
        }
        let scope = TenantAllowList::new(&options.allowed_tenants).map_err(IngestError::Config)?;
        let context = IngestContext::default();
        let consumer: StreamConsumer<IngestContext> =
            consumer_config(&options).create_with_context(context)?;
        let topics: Vec<&str> = options.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let producer: FutureProducer = producer_config(&options).create()?;
        let (stop, stopped) = watch::channel(false);
        let stats = Arc::new(IngestStats::default());
        let worker = Worker {
            reader: Reader {
                format: options.format,
                lapse_offset_ms,
                scope,
            },
            options,
            consumer,
            producer,
            engine,
            stats: stats.clone(),
            stopped,
            carry: Vec::new(),
            paused: false,
        };
        tracing::info!(
            topics = ?worker.options.topics,
            group = %worker.options.group_id,
            format = ?worker.options.format,
            "kafka ingestion started"
        );
        let task = tokio::spawn(worker.run());
        Ok(Ingest { task, stop, stats })
    }

    pub fn stats(&self) -> Arc<IngestStats> {
        self.stats.clone()
    }

    /// Finishes the batch in hand (unless the store is failing: then it is
    /// left for the next owner), commits the stored offsets and leaves the
    /// group.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        tracing::info!("kafka ingestion stopped");
    }
}

fn consumer_config(options: &IngestOptions) -> ClientConfig {
    let mut config = ClientConfig::new();
    // Defaults a user may change.
    config
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("client.id", "belfry-ingest")
        // For the consumer-lag gauge of `/metrics`.
        .set("statistics.interval.ms", "5000");
    for (key, value) in &options.consumer {
        config.set(key, value);
    }
    // What the guarantees rest on (see `RESERVED_CONSUMER`).
    config
        .set("bootstrap.servers", &options.bootstrap_servers)
        .set("group.id", &options.group_id)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set(
            "auto.commit.interval.ms",
            options.commit_interval.as_millis().to_string(),
        )
        .set("enable.partition.eof", "false");
    config
}

fn producer_config(options: &IngestOptions) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .set("client.id", "belfry-ingest-answers");
    for (key, value) in &options.producer {
        config.set(key, value);
    }
    config
        .set("bootstrap.servers", &options.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all");
    config
}

/// Remembers revoked partitions for the worker, and commits the stored
/// offsets (all of them durable) before partitions go.
#[derive(Debug, Default)]
struct IngestContext {
    revoked: Mutex<Vec<(String, i32)>>,
}

impl ClientContext for IngestContext {
    /// librdkafka's statistics (every `statistics.interval.ms`): the
    /// consumer lag of the partitions assigned here, summed.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|topic| topic.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag >= 0)
            .map(|p| p.consumer_lag)
            .sum();
        belfry_metrics::kafka_lag(lag);
    }
}

impl ConsumerContext for IngestContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(partitions) = rebalance else {
            return;
        };
        // With `enable.auto.commit`, librdkafka commits the stored offsets
        // (all of them durable) itself before the partitions go. An
        // explicit commit here is refused by a broker in the middle of the
        // rebalance, and librdkafka answers that by rejoining the group:
        // rebalances without end.
        let _ = consumer;
        let mut revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
        revoked.extend(
            partitions
                .elements()
                .iter()
                .map(|e| (e.topic().to_string(), e.partition())),
        );
        tracing::info!(partitions = partitions.count(), "kafka partitions revoked");
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            tracing::info!(partitions = partitions.count(), "kafka partitions assigned");
        }
    }
}

struct Worker {
    options: IngestOptions,
    reader: Reader,
    consumer: StreamConsumer<IngestContext>,
    producer: FutureProducer,
    engine: EngineHandle,
    stats: Arc<IngestStats>,
    stopped: watch::Receiver<bool>,
    /// Records received while a batch was in hand: the next batch.
    carry: Vec<OwnedMessage>,
    paused: bool,
}

impl Worker {
    async fn run(mut self) {
        loop {
            let Some(batch) = self.collect().await else {
                break;
            };
            if !batch.is_empty() && !self.ingest(batch).await {
                break;
            }
        }
        // Everything stored so far is durable: commit it before leaving.
        match self.consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(%error, "final offset commit failed"),
        }
        self.consumer.unsubscribe();
        let _ = self.producer_flush().await;
    }

    fn stopping(&self) -> bool {
        *self.stopped.borrow()
    }

    /// The next batch: what was carried over, or at least one record, plus
    /// whatever arrives within `batch_linger` (up to `max_batch`). `None`:
    /// stop.
    async fn collect(&mut self) -> Option<Vec<OwnedMessage>> {
        let mut batch = std::mem::take(&mut self.carry);
        if batch.is_empty() {
            let mut stopped = self.stopped.clone();
            let received = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => return None,
                received = self.consumer.recv() => received.map(|m| m.detach()),
            };
            self.receive(received, &mut batch, &mut HashSet::new())
                .await;
        }
        let clock = self.engine.clock().clone();
        let deadline = clock.monotonic().plus(self.options.batch_linger);
        while batch.len() < self.options.max_batch && !self.stopping() {
            // A record ready at the deadline still joins the batch.
            let received = tokio::select! {
                biased;
                received = self.consumer.recv() => received.map(|m| m.detach()),
                () = clock.sleep_until(deadline) => break,
            };
            self.receive(received, &mut batch, &mut HashSet::new())
                .await;
        }
        self.drop_revoked(&mut batch, &mut HashSet::new());
        Some(batch)
    }

    /// Takes in what one `recv` returned. Rebalances run inside `recv`, so
    /// the records held from before it that belong to revoked partitions
    /// are dropped first (their next owner reads them again); the record
    /// just received comes after the rebalance and is kept.
    async fn receive(
        &mut self,
        received: Result<OwnedMessage, KafkaError>,
        batch: &mut Vec<OwnedMessage>,
        lost: &mut HashSet<(String, i32)>,
    ) {
        self.drop_revoked(batch, lost);
        match received {
            Ok(message) => {
                self.stats.consumed.fetch_add(1, Ordering::Relaxed);
                batch.push(message);
            }
            Err(error) => {
                tracing::warn!(%error, "kafka consumer error");
                self.engine.clock().sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Drops the records of partitions revoked since the last call from
    /// `held` and the carried records, and adds those partitions to `lost`.
    /// Called after every `recv`, including one that timed out or was
    /// cancelled: a rebalance may have run inside it all the same.
    fn drop_revoked(&mut self, held: &mut Vec<OwnedMessage>, lost: &mut HashSet<(String, i32)>) {
        let revoked: HashSet<(String, i32)> = std::mem::take(
            &mut *self
                .consumer
                .context()
                .revoked
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .into_iter()
        .collect();
        if !revoked.is_empty() {
            held.retain(|m| !revoked.contains(&source(m)));
            self.carry.retain(|m| !revoked.contains(&source(m)));
            lost.extend(revoked);
        }
    }

    /// Stores `batch`, produces its answers and dead letters, stores its
    /// offsets. `false`: stopped while the batch could not be finished
    /// (nothing of it is committed).
    async fn ingest(&mut self, batch: Vec<OwnedMessage>) -> bool {
        // Partitions revoked while this batch was in hand.
        let mut lost: HashSet<(String, i32)> = HashSet::new();
        let mut pending = batch;
        let mut done: Vec<OwnedMessage> = Vec::with_capacity(pending.len());
        let mut outputs: Vec<Output> = Vec::new();
        let mut backoff = self.options.retry_backoff;
        loop {
            let answers = self.reader.answer(&self.engine, &pending).await;
            let mut retry = Vec::new();
            for (message, answer) in pending.into_iter().zip(answers) {
                match answer.verdict {
                    Verdict::StoreFailed => retry.push(message),
                    Verdict::Done => {
                        self.stats.stored.fetch_add(1, Ordering::Relaxed);
                        if let Some(topic) = &self.options.response_topic {
                            outputs.push(Output::response(topic, &message, answer.response));
                        }
                        done.push(message);
                    }
                    Verdict::Rejected { code, message: why } => {
                        tracing::debug!(%code, reason = %why, topic = message.topic(), partition = message.partition(), offset = message.offset(), "record dead-lettered");
                        outputs.push(Output::dead_letter(
                            &self.options.dead_letter_topic,
                            &message,
                            &code,
                            &why,
                        ));
                        if let Some(topic) = &self.options.response_topic {
                            outputs.push(Output::response(topic, &message, answer.response));
                        }
                        done.push(message);
                    }
                }
            }
            if retry.is_empty() {
                break;
            }
            tracing::warn!(
                records = retry.len(),
                backoff_ms = backoff.as_millis() as u64,
                "the store failed: consumption paused, the batch will be tried again"
            );
            if !self.wait(backoff, &mut retry, &mut lost).await {
                return false;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            pending = retry;
            if pending.is_empty() {
                break;
            }
        }

        // Answers and dead letters are acknowledged before any offset is
        // stored: a dead letter is never lost with its record.
        let mut backoff = self.options.retry_backoff;
        loop {
            outputs.retain(|o| !lost.contains(&o.source));
            let dead = outputs
                .iter()
                .filter(|o| o.topic == self.options.dead_letter_topic)
                .count() as u64;
            let failed = self.produce(std::mem::take(&mut outputs)).await;
            if failed.is_empty() {
                self.stats.dead_lettered.fetch_add(dead, Ordering::Relaxed);
                belfry_metrics::kafka_records((done.len() as u64).saturating_sub(dead), dead);
                break;
            }
            tracing::warn!(
                records = failed.len(),
                "producing answers or dead letters failed: consumption paused, trying again"
            );
            outputs = failed;
            if !self.wait(backoff, &mut Vec::new(), &mut lost).await {
                return false;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }

        self.store_offsets(&done, &lost);
        self.resume();
        true
    }

    /// Stores the next offset of each partition of `done` that is still
    /// ours; `true` if any was stored.
    fn store_offsets(&self, done: &[OwnedMessage], lost: &HashSet<(String, i32)>) -> bool {
        let mut next: HashMap<(String, i32), i64> = HashMap::new();
        for message in done {
            let source = source(message);
            if lost.contains(&source) {
                continue;
            }
            let offset = next.entry(source).or_insert(0);
            *offset = (*offset).max(message.offset() + 1);
        }
        if next.is_empty() {
            return false;
        }
        let mut list = TopicPartitionList::with_capacity(next.len());
        for ((topic, partition), offset) in &next {
            if let Err(error) =
                list.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            {
                tracing::error!(%error, "cannot build the offset list");
                return false;
            }
        }
        if let Err(error) = self.consumer.store_offsets(&list) {
            // A partition revoked meanwhile: its next owner re-reads the
            // records (stored already; storing them again changes nothing).
            tracing::warn!(%error, "storing offsets failed");
            return false;
        }
        true
    }

    /// Produces `outputs`; returns those Kafka did not acknowledge.
    async fn produce(&self, outputs: Vec<Output>) -> Vec<Output> {
        if outputs.is_empty() {
            return outputs;
        }
        let results = futures::future::join_all(outputs.iter().map(|output| {
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&output.topic);
            if let Some(key) = &output.key {
                record = record.key(key.as_slice());
            }
            if let Some(payload) = &output.payload {
                record = record.payload(payload.as_slice());
            }
            if let Some(headers) = &output.headers {
                record = record.headers(headers.clone());
            }
            self.producer
                .send(record, Timeout::After(Duration::from_secs(5)))
        }))
        .await;
        let mut failed = Vec::new();
        let mut first_error = None;
        for (output, result) in outputs.into_iter().zip(results) {
            if let Err((error, _)) = result {
                first_error.get_or_insert(error);
                failed.push(output);
            }
        }
        if let Some(error) = first_error {
            tracing::warn!(%error, failed = failed.len(), "producing to kafka failed");
        }
        failed
    }

    async fn producer_flush(&self) -> Result<(), KafkaError> {
        use rdkafka::producer::Producer;
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5)))
            .await
            .unwrap_or(Ok(()))
    }

    /// Pauses every assigned partition and waits `duration`, polling all the
    /// while (group membership, rebalances). Records that still arrive are
    /// carried to the next batch; records of `held` whose partition is
    /// revoked meanwhile are dropped. `false`: stop was requested.
    async fn wait(
        &mut self,
        duration: Duration,
        held: &mut Vec<OwnedMessage>,
        lost: &mut HashSet<(String, i32)>,
    ) -> bool {
        self.stats.failed_tries.fetch_add(1, Ordering::Relaxed);
        self.pause();
        let clock = self.engine.clock().clone();
        let deadline = clock.monotonic().plus(duration);
        loop {
            if self.stopping() {
                return false;
            }
            let mut stopped = self.stopped.clone();
            let received = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => return false,
                () = clock.sleep_until(deadline) => break,
                received = self.consumer.recv() => received.map(|m| m.detach()),
            };
            let mut carried = std::mem::take(&mut self.carry);
            self.receive(received, &mut carried, lost).await;
            self.carry.extend(carried);
            held.retain(|m| !lost.contains(&source(m)));
            // Partitions assigned meanwhile are paused too.
            self.pause();
        }
        // The last `recv` may have been cut short by the deadline after a
        // rebalance ran inside it.
        self.drop_revoked(held, lost);
        true
    }

    fn pause(&mut self) {
        match self.consumer.assignment() {
            Ok(assignment) => {
                if let Err(error) = self.consumer.pause(&assignment) {
                    tracing::warn!(%error, "cannot pause consumption");
                }
            }
            Err(error) => tracing::warn!(%error, "cannot read the assignment"),
        }
        if !self.paused {
            self.paused = true;
            self.stats.paused.store(true, Ordering::Relaxed);
        }
    }

    fn resume(&mut self) {
        if !self.paused {
            return;
        }
        match self.consumer.assignment() {
            Ok(assignment) => {
                if let Err(error) = self.consumer.resume(&assignment) {
                    tracing::warn!(%error, "cannot resume consumption");
                }
            }
            Err(error) => tracing::warn!(%error, "cannot read the assignment"),
        }
        self.paused = false;
        self.stats.paused.store(false, Ordering::Relaxed);
        tracing::info!("consumption resumed");
    }
}
