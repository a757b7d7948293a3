//! [`KafkaSink`]: builds each delivery's record and waits for the broker's
//! acknowledgement.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use belfry_core::tenant::{KafkaKey, KafkaTarget};
use belfry_core::{SinkConfig, Verdict};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer as _};

use super::config::KafkaSinkOptions;
use super::producers::{Producer, Producers, Settings, check_servers};
use super::retry::classify;
use super::settings::{self, IGNORED, Server};
use super::{
    HEADER_ATTEMPT, HEADER_EPOCH, HEADER_EVENT_ID, HEADER_IDEMPOTENCY_KEY, HEADER_SCHEDULED_AT,
    HEADER_TENANT,
};
use crate::body::render_delivery_body;
use crate::egress::{EgressOptions, EgressPolicy};
use crate::prepared::PreparedTargets;
use crate::signing::{
    HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, HEADER_WEBHOOK_TIMESTAMP, unix_seconds,
};
use crate::{Delivery, DeliveryResult, Sink};

/// How much longer than `message.timeout.ms` a delivery waits for
/// librdkafka's answer before giving up on it (librdkafka answers every
/// record by then; this only guards against it never answering).
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// How long one idempotent-mode attempt waits for the broker's
/// acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The producer's `message.timeout.ms`: librdkafka answers by then
    /// (plus [`ANSWER_GRACE`]).
    Producer(Duration),
    /// The event's shorter `attempt_timeout_ms`. The attempt is a retry
    /// once it passes, but librdkafka keeps the record queued until its
    /// own timeout, so it may still land: a duplicate with the same
    /// version and attempt headers, as at-least-once allows.
    Event(Duration),
}

impl Wait {
    fn for_event(attempt_timeout_ms: Option<u64>, producer: Duration) -> Wait {
        match attempt_timeout_ms.map(Duration::from_millis) {
            Some(limit) if limit < producer => Wait::Event(limit),
            _ => Wait::Producer(producer),
        }
    }

    /// The timeout itself, without the grace.
    fn own(self) -> Duration {
        match self {
            Wait::Producer(timeout) | Wait::Event(timeout) => timeout,
        }
    }

    fn limit(self) -> Duration {
        match self {
            Wait::Producer(timeout) => timeout + ANSWER_GRACE,
            Wait::Event(limit) => limit,
        }
    }

    /// The attempt's error when no answer came within [`Wait::limit`].
    fn unanswered(self) -> String {
        match self {
            Wait::Producer(_) => format!("kafka: no answer within {} ms", self.limit().as_millis()),
            Wait::Event(limit) => format!(
                "kafka: not acknowledged within the attempt timeout ({} ms)",
                limit.as_millis()
            ),
        }
    }
}

/// The longest the advertised brokers' check waits for the cluster's
/// metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// Delivers to `SinkConfig::Kafka` tenants.
#[derive(Debug)]
pub struct KafkaSink {
    options: KafkaSinkOptions,
    egress: Arc<EgressPolicy>,
    producers: Producers,
    /// Held while a producer is opened, so that the deliveries that find
    /// none at once (a burst of due events) open one, not one each.
    opening: tokio::sync::Mutex<()>,
    /// Each tenant's target, prepared once per config.
    prepared: PreparedTargets<KafkaTarget, Route>,
}

/// The producer settings (the shared producer's key), the bootstrap
/// servers and the produce limit of a prepared target.
#[derive(Debug)]
struct Route {
    settings: Arc<Settings>,
    servers: Vec<Server>,
    timeout: Duration,
    /// Fenced mode: the start of every transactional id of this target
    /// (`<cluster_id>-<hash of the tenant's settings>`).
    transactional_prefix: String,
    /// Fenced mode: the settings of each Belfry partition's producer
    /// (`settings` plus its `transactional.id`), made on first use.
    per_partition: Mutex<HashMap<u16, Arc<Settings>>>,
}

impl Route {
    /// The settings of the transactional producer of `partition`.
    fn for_partition(&self, partition: u16) -> Arc<Settings> {
        let mut cache = self.per_partition.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(cache.entry(partition).or_insert_with(|| {
            let mut settings = (*self.settings).clone();
            settings.insert(
                "transactional.id".into(),
                format!("{}-p{partition}", self.transactional_prefix),
            );
            settings.insert(
                "transaction.timeout.ms".into(),
                self.timeout.as_millis().max(1_000).to_string(),
            );
            Arc::new(settings)
        }))
    }
}

/// A short stable digest of a tenant's settings (the same on every node),
/// for transactional ids: producers with different settings must not share
/// one.
fn settings_digest(props: &std::collections::BTreeMap<String, String>) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for (name, value) in props {
        if IGNORED.contains(&name.as_str()) {
            continue;
        }
        context.update(name.as_bytes());
        context.update(b"=");
        context.update(value.as_bytes());
        context.update(b"\n");
    }
    context
        .finish()
        .as_ref()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl KafkaSink {
    pub fn new(options: KafkaSinkOptions, egress: EgressOptions) -> Self {
        Self::with_policy(
            options,
            Arc::new(EgressPolicy::new(egress)),
            Arc::new(belfry_clock::SystemClock),
        )
    }

    pub(crate) fn with_policy(
        options: KafkaSinkOptions,
        egress: Arc<EgressPolicy>,
        clock: Arc<dyn belfry_core::Clock>,
    ) -> Self {
        KafkaSink {
            producers: Producers::new(options.max_producers, clock),
            opening: tokio::sync::Mutex::new(()),
            options,
            egress,
            prepared: PreparedTargets::default(),
        }
    }

    pub fn options(&self) -> &KafkaSinkOptions {
        &self.options
    }

    /// How many producers are open (bounded by `max_producers`).
    pub fn open_producers(&self) -> usize {
        self.producers.len()
    }

    /// The complete producer settings for `target`: Belfry's defaults, the
    /// tenant's settings over them, then what Belfry always enforces
    /// (idempotence, `acks=all`, the node's queue bounds, the capped
    /// timeout).
    fn route(&self, target: &KafkaTarget) -> Result<Route, String> {
        // Checked at registration; a config stored by an older version (or
        // written straight into the store) is checked again here.
        settings::validate(&target.props).map_err(|e| e.to_string())?;
        let servers = settings::servers_of(&target.props)
            .map(settings::parse_servers)
            .transpose()?
            .unwrap_or_default();
        let tenant_timeout = ["message.timeout.ms", "delivery.timeout.ms"]
            .iter()
            .find_map(|name| target.props.get(*name))
            .and_then(|ms| ms.trim().parse::<u64>().ok());
        let timeout = self.options.message_timeout_for(tenant_timeout);
        let mut all = Settings::new();
        all.insert(
            "linger.ms".into(),
            self.options.linger.as_millis().to_string(),
        );
        all.insert("client.id".into(), "belfry".into());
        for (name, value) in &target.props {
            if IGNORED.contains(&name.as_str())
                || name == "delivery.timeout.ms"
                || name == "metadata.broker.list"
            {
                continue;
            }
            all.insert(name.clone(), value.clone());
        }
        if let Some(servers) = settings::servers_of(&target.props) {
            all.insert("bootstrap.servers".into(), servers.to_string());
        }
        for (name, value) in [
            ("enable.idempotence", "true".to_string()),
            ("acks", "all".to_string()),
            (
                "queue.buffering.max.messages",
                self.options.queue_max_messages.max(1).to_string(),
            ),
            (
                "queue.buffering.max.kbytes",
                self.options.queue_max_kbytes.max(1).to_string(),
            ),
            ("message.timeout.ms", timeout.as_millis().to_string()),
        ] {
            all.insert(name.into(), value);
        }
        all.remove("request.required.acks");
        // librdkafka refuses a linger at or above the message timeout.
        let limit = timeout.as_millis().saturating_sub(1).to_string();
        for name in ["linger.ms", "queue.buffering.max.ms"] {
            if let Some(linger) = all.get_mut(name)
                && linger
                    .parse::<u128>()
                    .is_ok_and(|ms| ms >= timeout.as_millis())
            {
                linger.clone_from(&limit);
            }
        }
        Ok(Route {
            settings: Arc::new(all),
            servers,
            timeout,
            transactional_prefix: format!(
                "{}-{}",
                self.options.cluster_id,
                settings_digest(&target.props)
            ),
            per_partition: Mutex::default(),
        })
    }

    /// The producer for `route`, opened (after the egress check of its
    /// bootstrap servers) when none is.
    async fn producer(
        &self,
        settings: &Arc<Settings>,
        servers: &[Server],
    ) -> Result<Arc<Producer>, DeliveryResult> {
        if let Some(producer) = self.producers.get(settings) {
            return Ok(producer);
        }
        let _opening = self.opening.lock().await;
        if let Some(producer) = self.producers.get(settings) {
            return Ok(producer);
        }
        match check_servers(&self.egress, servers).await {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => {
                return Err(DeliveryResult::failed(
                    Verdict::Permanent,
                    None,
                    refusal.to_string(),
                ));
            }
            Err(reason) => return Err(DeliveryResult::failed(Verdict::Retry, None, reason)),
        }
        self.producers.open(Arc::clone(settings)).map_err(|error| {
            DeliveryResult::failed(classify(&error), None, describe_open_error(&error))
        })
    }
}

/// Runs a blocking producer call (the transaction calls wait for the
/// coordinator) off the async threads.
async fn blocking(
    producer: &Arc<Producer>,
    call: impl FnOnce(
        &rdkafka::producer::FutureProducer<super::producers::Context>,
    ) -> Result<(), KafkaError>
    + Send
    + 'static,
) -> Result<(), KafkaError> {
    let producer = Arc::clone(producer);
    tokio::task::spawn_blocking(move || call(&producer.inner))
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

/// Why a producer could not be opened, without the refused value (it may
/// be a password).
fn describe_open_error(error: &KafkaError) -> String {
    match error {
        KafkaError::ClientConfig(_, description, key, _) => {
            format!("kafka: invalid producer setting {key}: {description}")
        }
        other => format!("kafka: cannot open a producer: {other}"),
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn deliver(&self, delivery: Delivery<'_>) -> DeliveryResult {
        let SinkConfig::Kafka(target) = &delivery.tenant.sink else {
            return DeliveryResult::failed(
                Verdict::Permanent,
                None,
                "tenant is not configured for Kafka delivery",
            );
        };
        let prepared = self
            .prepared
            .get(delivery.tenant, target, |target| self.route(target));
        let (route, signer) = match prepared.usable() {
            Ok(usable) => usable,
            Err(result) => return result,
        };
        // Fenced mode needs a partition to act for: a dry run (no epoch)
        // goes out through the idempotent producer.
        let transactional = target.transactional && delivery.epoch.is_some();
        let settings = if transactional {
            route.for_partition(delivery.event.partition.0)
        } else {
            Arc::clone(&route.settings)
        };
        let producer = match self.producer(&settings, &route.servers).await {
            Ok(producer) => producer,
            Err(result) => return result,
        };
        // An event's shorter attempt timeout bounds the whole attempt.
        let wait = Wait::for_event(delivery.event.settings.attempt_timeout_ms, route.timeout);
        match producer
            .check_brokers(
                &target.topic,
                METADATA_TIMEOUT.min(wait.own()),
                &self.egress,
            )
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => {
                return DeliveryResult::failed(
                    Verdict::Permanent,
                    None,
                    format!("{refusal} (a broker the cluster advertises)"),
                );
            }
            Err(reason) => return DeliveryResult::failed(Verdict::Retry, None, reason),
        }

        let event = delivery.event;
        let body = render_delivery_body(event, delivery.triggered_at);
        let attempt = delivery.attempt.to_string();
        let scheduled_at = event.event_time.to_rfc3339();
        let version = event.version.as_str();
        let epoch = delivery.epoch.map(|epoch| epoch.to_string());
        let mut headers = OwnedHeaders::new_with_capacity(9);
        for (name, value) in [
            (HEADER_EVENT_ID, event.key.id.as_str()),
            (HEADER_TENANT, event.key.tenant.as_str()),
            (HEADER_SCHEDULED_AT, scheduled_at.as_str()),
            (HEADER_ATTEMPT, attempt.as_str()),
            (HEADER_IDEMPOTENCY_KEY, version),
        ] {
            headers = headers.insert(Header {
                key: name,
                value: Some(value),
            });
        }
        if let Some(epoch) = &epoch {
            headers = headers.insert(Header {
                key: HEADER_EPOCH,
                value: Some(epoch.as_str()),
            });
        }
        if let Some(signer) = signer {
            let timestamp = unix_seconds(delivery.triggered_at).to_string();
            let signature = signer.signature(version, &timestamp, &body, delivery.triggered_at);
            for (name, value) in [
                (HEADER_WEBHOOK_ID, version),
                (HEADER_WEBHOOK_TIMESTAMP, timestamp.as_str()),
                (HEADER_WEBHOOK_SIGNATURE, signature.as_str()),
            ] {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
        }
        let tenant_key;
        let key: Option<&str> = match target.key {
            KafkaKey::EventId => Some(event.key.id.as_str()),
            KafkaKey::TenantEventId => {
                tenant_key = format!("{}/{}", event.key.tenant.as_str(), event.key.id.as_str());
                Some(&tenant_key)
            }
            KafkaKey::None => None,
        };
        let mut record = FutureRecord::<str, [u8]>::to(&target.topic)
            .payload(&body)
            .headers(headers)
            .timestamp(delivery.triggered_at.as_millis());
        if let Some(key) = key {
            record = record.key(key);
        }
        if transactional {
            return self
                .send_in_transaction(&producer, record, route.timeout)
                .await;
        }
        self.send(&producer, record, wait).await
    }
}

impl KafkaSink {
    /// Produces `record` and waits for the acknowledgement.
    async fn send(
        &self,
        producer: &Arc<Producer>,
        record: FutureRecord<'_, str, [u8]>,
        wait: Wait,
    ) -> DeliveryResult {
        let answer = match producer.inner.send_result(record) {
            Ok(answer) => answer,
            Err((error, _)) => return self.failed(producer, &error),
        };
        match tokio::time::timeout(wait.limit(), answer).await {
            Ok(Ok(Ok(_acknowledged))) => DeliveryResult::delivered(None),
            Ok(Ok(Err((error, _)))) => self.failed(producer, &error),
            Ok(Err(_canceled)) => DeliveryResult::failed(
                Verdict::Retry,
                None,
                "kafka: the producer closed before the broker answered",
            ),
            Err(_) => DeliveryResult::failed(Verdict::Retry, None, wait.unanswered()),
        }
    }

    /// Fenced mode: `record` in a transaction of its own, committed before
    /// the attempt counts as delivered. One transaction at a time per
    /// producer (per Belfry partition). A producer another node fenced (it
    /// took the partition over with the same transactional id) cannot
    /// commit: the attempt is a retry here, and the record is never visible
    /// to `read_committed` consumers.
    async fn send_in_transaction(
        &self,
        producer: &Arc<Producer>,
        record: FutureRecord<'_, str, [u8]>,
        timeout: Duration,
    ) -> DeliveryResult {
        let mut initialized = producer.transactions.lock().await;
        if !*initialized {
            if let Err(error) = blocking(producer, move |p| p.init_transactions(timeout)).await {
                return self.failed(producer, &error);
            }
            *initialized = true;
        }
        if let Err(error) = blocking(producer, |p| p.begin_transaction()).await {
            return self.failed(producer, &error);
        }
        let sent = self.send(producer, record, Wait::Producer(timeout)).await;
        if sent.verdict != Verdict::Delivered {
            self.abort(producer, timeout).await;
            return sent;
        }
        match blocking(producer, move |p| p.commit_transaction(timeout)).await {
            Ok(()) => sent,
            Err(error) => {
                let result = self.failed(producer, &error);
                self.abort(producer, timeout).await;
                result
            }
        }
    }

    /// Aborts the open transaction, if the producer can still do so (a
    /// fenced or failed one is discarded instead).
    async fn abort(&self, producer: &Arc<Producer>, timeout: Duration) {
        if producer.inner.client().fatal_error().is_some() {
            self.producers.discard(producer);
            return;
        }
        if let Err(error) = blocking(producer, move |p| p.abort_transaction(timeout)).await {
            tracing::debug!(%error, "kafka: aborting a transaction failed; reopening the producer");
            self.producers.discard(producer);
        }
    }

    /// The result of an attempt that failed with `error`; a producer in a
    /// fatal state is discarded so the next attempt opens a new one.
    fn failed(&self, producer: &Arc<Producer>, error: &KafkaError) -> DeliveryResult {
        let mut reason = format!("kafka: {error}");
        if let Some((code, message)) = producer.inner.client().fatal_error() {
            reason = format!("kafka: producer failed fatally ({code:?}: {message}); reopening it");
            self.producers.discard(producer);
            return DeliveryResult::failed(Verdict::Retry, None, reason);
        }
        if matches!(
            error,
            KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
        ) {
            reason.push_str(" (the producer's queue is full; sinks.kafka.queue_max_messages)");
        }
        DeliveryResult::failed(classify(error), None, reason)
    }
}
