//! Delivery sinks: where a fired event goes.
//!
//! Every sink implements [`Sink`] and classifies each attempt into one
//! [`Verdict`] (delivered, retry, permanent); the engine owns retries and
//! history. One folder per sink, same file names:
//! - [`http`]: `POST` to the tenant's webhook;
//! - [`kafka`]: a record on the tenant's Kafka topic (BigBen's
//!   `MESSAGING`; the producer behind the cargo feature `kafka`);
//! - [`log`]: the built-in `log` processor (BigBen's `CUSTOM_CLASS`), writes
//!   the delivery to the node's log.
//!
//! [`body`] renders what a receiver gets (BigBen's `FULL_EVENT` /
//! `PAYLOAD_ONLY`), shared by every sink; [`signing`] signs it (Standard
//! Webhooks); [`egress`] decides which addresses a delivery may reach.

use std::sync::Arc;

use async_trait::async_trait;
use belfry_core::policy::Steer;
use belfry_core::{Clock, EventRecord, SinkConfig, TenantConfig, Timestamp, Verdict};

pub mod body;
pub mod egress;
pub mod http;
pub mod kafka;
pub mod log;
mod prepared;
pub mod signing;

/// One attempt to deliver one event.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub tenant: &'a TenantConfig,
    pub event: &'a EventRecord,
    /// 1 for the first attempt of this version.
    pub attempt: u32,
    /// When this attempt started (BigBen's `triggeredAt`).
    pub triggered_at: Timestamp,
    /// The fencing epoch under which this node owns the event's partition;
    /// `None` for a dry run (no partition acts).
    pub epoch: Option<u64>,
}

/// How an attempt ended, as a sink sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryResult {
    pub verdict: Verdict,
    pub http_status: Option<u16>,
    /// Why it failed (for the history and the event's `last_error`).
    pub error: Option<String>,
    /// What the receiver asked of the next attempts (HTTP `Retry-After`,
    /// `410 Gone`).
    pub steer: Option<Steer>,
}

impl DeliveryResult {
    pub fn delivered(http_status: Option<u16>) -> Self {
        DeliveryResult {
            verdict: Verdict::Delivered,
            http_status,
            error: None,
            steer: None,
        }
    }

    pub fn failed(verdict: Verdict, http_status: Option<u16>, error: impl Into<String>) -> Self {
        DeliveryResult {
            verdict,
            http_status,
            error: Some(error.into()),
            steer: None,
        }
    }

    /// This result, with what the receiver asked of the next attempts.
    #[must_use]
    pub fn steered(self, steer: Option<Steer>) -> Self {
        DeliveryResult { steer, ..self }
    }
}

#[async_trait]
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Makes one attempt. Never panics on the receiver's behaviour; every
    /// failure is a [`DeliveryResult`].
    async fn deliver(&self, delivery: Delivery<'_>) -> DeliveryResult;
}

/// Every sink a node has, picked by the tenant's [`SinkConfig`].
#[derive(Debug, Clone)]
pub struct Sinks {
    pub http: Arc<http::HttpSink>,
    #[cfg(feature = "kafka")]
    pub kafka: Arc<kafka::KafkaSink>,
    pub log: Arc<log::LogSink>,
    /// The node's egress policy, for checks at registration.
    egress: Arc<egress::EgressPolicy>,
}

/// Why a pull tenant's event is not delivered by a sink.
const NOT_PUSHED: &str = "a pull tenant's events are claimed by workers, not pushed";

/// Why this build refuses Kafka tenants.
#[cfg(not(feature = "kafka"))]
const NO_KAFKA: &str = "MESSAGING (Kafka) delivery is not available in this build of Belfry (built without the cargo feature kafka)";

/// Names of the built-in processors (BigBen's `CUSTOM_CLASS`).
pub const BUILTIN_PROCESSORS: &[&str] = &[log::PROCESSOR_NAME];

impl Sinks {
    /// The sinks with the egress policy `internal`, for embedding where the
    /// caller is the operator (tests, examples); a node passes its own
    /// policy ([`Sinks::build`]).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(options: http::HttpSinkOptions) -> Result<Self, http::HttpSinkError> {
        Self::with_egress(options, egress::EgressOptions::internal())
    }

    /// [`Sinks::new`] with the node's egress policy.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn with_egress(
        options: http::HttpSinkOptions,
        egress: egress::EgressOptions,
    ) -> Result<Self, http::HttpSinkError> {
        Self::build(options, egress, kafka::KafkaSinkOptions::default())
    }

    /// [`Sinks::with_egress`] with the node's Kafka producer options
    /// (ignored by a build without the feature `kafka`).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn build(
        options: http::HttpSinkOptions,
        egress: egress::EgressOptions,
        kafka: kafka::KafkaSinkOptions,
    ) -> Result<Self, http::HttpSinkError> {
        Self::build_with_clock(options, egress, kafka, Arc::new(belfry_clock::SystemClock))
    }

    /// [`Sinks::build`] on `clock` (connection idle times, broker checks).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn build_with_clock(
        options: http::HttpSinkOptions,
        egress: egress::EgressOptions,
        kafka: kafka::KafkaSinkOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, http::HttpSinkError> {
        #[cfg(not(feature = "kafka"))]
        let _ = kafka;
        let policy = Arc::new(egress::EgressPolicy::new(egress.clone()));
        Ok(Sinks {
            http: Arc::new(http::HttpSink::with_policy(
                options,
                Arc::clone(&policy),
                http::PlainHttp::Auto,
                Vec::new(),
                clock.clone(),
            )?),
            #[cfg(feature = "kafka")]
            kafka: Arc::new(kafka::KafkaSink::with_policy(
                kafka,
                Arc::clone(&policy),
                clock,
            )),
            log: Arc::new(log::LogSink),
            egress: policy,
        })
    }

    /// The egress policy every sink checks (the node turns its open switch,
    /// [`egress::EgressPolicy::set_open`]).
    pub fn egress(&self) -> &Arc<egress::EgressPolicy> {
        &self.egress
    }

    /// Whether this node can deliver to `config`; the message is for the
    /// client when it cannot.
    ///
    /// # Errors
    /// An unknown built-in processor, or a channel this build lacks.
    pub fn check_supported(config: &SinkConfig) -> Result<(), String> {
        match config {
            SinkConfig::Http(_) | SinkConfig::Pull(_) => Ok(()),
            SinkConfig::Builtin(target)
                if BUILTIN_PROCESSORS.contains(&target.processor.as_str()) =>
            {
                Ok(())
            }
            SinkConfig::Builtin(target) => Err(format!(
                "unknown eventProcessorClass {:?}; built-in processors: {}",
                target.processor,
                BUILTIN_PROCESSORS.join(", ")
            )),
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(_) => Ok(()),
            #[cfg(not(feature = "kafka"))]
            SinkConfig::Kafka(_) => Err(NO_KAFKA.to_string()),
        }
    }

    /// Checks a supported target's settings: a Kafka tenant's producer
    /// settings against the allow-list ([`kafka::settings`]).
    ///
    /// # Errors
    /// The first refused setting, by name.
    pub fn check_settings(config: &SinkConfig) -> Result<(), String> {
        match config {
            SinkConfig::Kafka(target) => {
                kafka::settings::validate(&target.props).map_err(|e| e.to_string())
            }
            SinkConfig::Http(_) | SinkConfig::Builtin(_) | SinkConfig::Pull(_) => Ok(()),
        }
    }

    /// Whether the node's egress policy lets deliveries reach `config`'s
    /// target, as far as registration can tell: a webhook URL's host must
    /// not be an address (or `localhost` name) the policy refuses; a Kafka
    /// tenant's bootstrap servers (addresses, and names that resolve) must
    /// be allowed. Webhook host names are checked at delivery (they may
    /// resolve elsewhere by then), as are the brokers a Kafka cluster
    /// advertises.
    ///
    /// # Errors
    /// The refusal, naming the address (never the URL: it may carry
    /// credentials).
    pub async fn check_egress(&self, config: &SinkConfig) -> Result<(), String> {
        let target = match config {
            SinkConfig::Kafka(target) => target,
            SinkConfig::Http(target) => {
                let url =
                    belfry_core::tenant::validate_url(&target.url).map_err(|e| e.to_string())?;
                return match url.host() {
                    Some(host) => self
                        .egress
                        .check_host(&host)
                        .map_err(|refusal| format!("url host: {refusal}")),
                    None => Ok(()),
                };
            }
            SinkConfig::Builtin(_) | SinkConfig::Pull(_) => return Ok(()),
        };
        let Some(servers) = kafka::settings::servers_of(&target.props) else {
            return Ok(());
        };
        let servers = kafka::settings::parse_servers(servers)?;
        for server in servers {
            if let Ok(ip) = server.host.parse::<std::net::IpAddr>() {
                self.egress
                    .check(ip)
                    .map_err(|refusal| format!("bootstrap server {}: {refusal}", server.host))?;
                continue;
            }
            // A name that does not resolve now is checked again at delivery.
            let lookup = tokio::net::lookup_host((server.host.as_str(), server.port));
            if let Ok(Ok(addresses)) =
                tokio::time::timeout(std::time::Duration::from_secs(2), lookup).await
            {
                for address in addresses {
                    self.egress.check(address.ip()).map_err(|refusal| {
                        format!("bootstrap server {}: {refusal}", server.host)
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Delivers through the sink the tenant's config names.
    pub async fn deliver(&self, delivery: Delivery<'_>) -> DeliveryResult {
        match &delivery.tenant.sink {
            SinkConfig::Http(_) => self.http.deliver(delivery).await,
            SinkConfig::Builtin(_) => self.log.deliver(delivery).await,
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(_) => self.kafka.deliver(delivery).await,
            #[cfg(not(feature = "kafka"))]
            SinkConfig::Kafka(_) => DeliveryResult::failed(Verdict::Permanent, None, NO_KAFKA),
            // The engine hands a pull tenant's events to its pull queue;
            // one that reaches a sink is kept for a later attempt.
            SinkConfig::Pull(_) => DeliveryResult::failed(Verdict::Retry, None, NOT_PUSHED),
        }
    }
}

/// A scheduled event due `at`, as the engine hands it to a sink (the
/// sinks' tests).
#[cfg(test)]
pub(crate) fn scheduled_event(
    key: belfry_core::EventKey,
    at: Timestamp,
    payload: Option<String>,
    delivery: belfry_core::DeliveryOption,
) -> EventRecord {
    EventRecord {
        debounce_since: None,
        key,
        partition: belfry_core::PartitionId(0),
        version: belfry_core::EventVersion::from_string("v-1".into()),
        event_time: at,
        payload,
        delivery,
        status: belfry_core::EventStatus::Scheduled,
        next_fire_at: Some(at),
        attempts: 0,
        last_error: None,
        triggered_at: None,
        created_at: at,
        updated_at: at,
        finished_at: None,
        settings: Default::default(),
    }
}
