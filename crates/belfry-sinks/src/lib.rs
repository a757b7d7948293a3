//! Delivery sinks: where a fired event goes.
//!
//! Every sink implements [`Sink`] and classifies each attempt into one
//! [`Verdict`] (delivered, retry, permanent); the engine owns retries and
//! history. One folder per sink, same file names:
//! - [`http`]: `POST` to the tenant's webhook;
//! - [`log`]: the built-in `log` processor (BigBen's `CUSTOM_CLASS`), writes
//!   the delivery to the node's log.
//!
//! [`body`] renders what a receiver gets (BigBen's `FULL_EVENT` /
//! `PAYLOAD_ONLY`), shared by every sink; [`signing`] signs it (Standard
//! Webhooks); [`egress`] decides which addresses a delivery may reach.

use std::sync::Arc;

use async_trait::async_trait;
use belfry_core::{EventRecord, SinkConfig, TenantConfig, Timestamp, Verdict};

pub mod body;
pub mod egress;
pub mod http;
pub mod log;
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
}

/// How an attempt ended, as a sink sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryResult {
    pub verdict: Verdict,
    pub http_status: Option<u16>,
    /// Why it failed (for the history and the event's `last_error`).
    pub error: Option<String>,
}

impl DeliveryResult {
    pub fn delivered(http_status: Option<u16>) -> Self {
        DeliveryResult {
            verdict: Verdict::Delivered,
            http_status,
            error: None,
        }
    }

    pub fn failed(verdict: Verdict, http_status: Option<u16>, error: impl Into<String>) -> Self {
        DeliveryResult {
            verdict,
            http_status,
            error: Some(error.into()),
        }
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
    pub log: Arc<log::LogSink>,
}

/// Names of the built-in processors (BigBen's `CUSTOM_CLASS`).
pub const BUILTIN_PROCESSORS: &[&str] = &[log::PROCESSOR_NAME];

impl Sinks {
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(options: http::HttpSinkOptions) -> Result<Self, http::HttpSinkError> {
        Self::with_egress(options, egress::EgressOptions::default())
    }

    /// [`Sinks::new`] with the node's egress policy.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn with_egress(
        options: http::HttpSinkOptions,
        egress: egress::EgressOptions,
    ) -> Result<Self, http::HttpSinkError> {
        Ok(Sinks {
            http: Arc::new(http::HttpSink::with_egress(options, egress)?),
            log: Arc::new(log::LogSink),
        })
    }

    /// Whether this node can deliver to `config`; the message is for the
    /// client when it cannot.
    ///
    /// # Errors
    /// An unknown built-in processor, or a channel this build lacks.
    pub fn check_supported(config: &SinkConfig) -> Result<(), String> {
        match config {
            SinkConfig::Http(_) => Ok(()),
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
            SinkConfig::Kafka(_) => Err(
                "MESSAGING (Kafka) delivery is not available in this build of Belfry".to_string(),
            ),
        }
    }

    /// Delivers through the sink the tenant's config names.
    pub async fn deliver(&self, delivery: Delivery<'_>) -> DeliveryResult {
        match &delivery.tenant.sink {
            SinkConfig::Http(_) => self.http.deliver(delivery).await,
            SinkConfig::Builtin(_) => self.log.deliver(delivery).await,
            SinkConfig::Kafka(_) => DeliveryResult::failed(
                Verdict::Permanent,
                None,
                "MESSAGING (Kafka) delivery is not available in this build of Belfry",
            ),
        }
    }
}
