//! The Kafka sink (BigBen's `MESSAGING`): each delivery is one record on
//! the tenant's topic.
//!
//! # Layout
//! - [`config`]: [`KafkaSinkOptions`], the node's producer settings
//!   (`sinks.kafka`);
//! - [`settings`]: the allow-list a tenant's producer settings are checked
//!   against at registration, and how `bootstrap.servers` reads;
//! - `sink.rs` (feature `kafka`): [`KafkaSink`], builds each record (key,
//!   value, headers, signature) and waits for the broker's acknowledgement;
//! - `producers.rs` (feature `kafka`): the node's shared, bounded set of
//!   producers, one per distinct (servers, settings);
//! - `retry.rs` (feature `kafka`): the one classification of Kafka errors
//!   into a [`belfry_core::Verdict`];
//! - `tests.rs`: real records through a Kafka-protocol broker (the testkit's
//!   `KafkaBroker`).
//!
//! # The record
//! Topic: the tenant's `topic`. Key: the client's event id (BigBen's
//! choice; `/v1` tenants may pick `tenant_event_id` or `none`). Value: the
//! same body as a webhook ([`crate::body::render_delivery_body`]).
//! Timestamp: when the attempt started. Headers, values as UTF-8 bytes:
//! [`HEADER_EVENT_ID`], [`HEADER_TENANT`], [`HEADER_SCHEDULED_AT`],
//! [`HEADER_ATTEMPT`], [`HEADER_IDEMPOTENCY_KEY`], [`HEADER_EPOCH`] (not
//! on a dry run), and for a tenant with signing secrets the Standard
//! Webhooks headers ([`crate::signing`]), signed exactly as a webhook is.
//!
//! # Guarantees
//! Producers are idempotent with `acks=all`: a delivery is `delivered`
//! once every in-sync replica has the record, and librdkafka's own resends
//! within one attempt never duplicate it. A new attempt (after a timeout
//! whose record did reach the broker) can: at-least-once, the idempotency
//! key tells the copies apart.

pub mod config;
#[cfg(feature = "kafka")]
mod producers;
#[cfg(feature = "kafka")]
pub mod retry;
pub mod settings;
#[cfg(feature = "kafka")]
mod sink;
#[cfg(all(test, feature = "kafka"))]
mod tests;

pub use config::KafkaSinkOptions;
#[cfg(feature = "kafka")]
pub use sink::KafkaSink;

pub use crate::http::{
    HEADER_ATTEMPT, HEADER_EVENT_ID, HEADER_IDEMPOTENCY_KEY, HEADER_SCHEDULED_AT, HEADER_TENANT,
};

/// The fencing epoch under which the delivering node owned the event's
/// partition (decimal). A consumer that sees a lower epoch after a higher
/// one for the same partition's events is reading a deposed owner's late
/// record.
pub const HEADER_EPOCH: &str = "x-belfry-epoch";
