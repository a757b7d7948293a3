//! Kafka ingestion: event requests consumed from topics and stored through
//! the same validation and write path as the HTTP API
//! (`belfry_api::ingest`), with offsets committed only after the write is
//! durable.
//!
//! # Layout
//! - [`config`]: `[kafka.ingest]` ([`IngestOptions`]) and its validation;
//! - `records`: a batch of records → one answer per record through the
//!   shared write path; the answer and dead-letter records;
//! - [`consumer`]: the consumer task ([`Ingest`]): poll a batch, store it,
//!   produce answers and dead letters, store offsets; pause while the
//!   store fails; rebalances.
//!
//! # Guarantees
//! At-least-once: a record's offset is committed only after the record is
//! stored (fsynced) or dead-lettered (acknowledged by Kafka). A crash
//! re-reads the records after the last commit; applying them again stores
//! the same event (same instant: same version, a delivered event is not
//! delivered again), so re-reading does not make an event fire twice. See
//! `docs/kafka.md` for keys, ordering, the trust model and the limits.
//!
//! Edges depend on the engine, never the reverse: this crate uses
//! `belfry-api` (validation), `belfry-engine` (the write path) and
//! `rdkafka`; nothing depends on it but the `belfry` binary (feature
//! `kafka`).

pub mod config;
pub mod consumer;
mod records;

pub use config::{Format, IngestOptions};
pub use consumer::{Ingest, IngestError, IngestStats};
pub use records::header;
