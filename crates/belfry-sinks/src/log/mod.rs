//! The built-in `log` processor (BigBen's `CUSTOM_CLASS`): writes each
//! delivery to the node's log. Useful for trying Belfry out without a
//! receiver, and as the smallest example of a [`crate::Sink`].
//!
//! # Layout
//! - `sink.rs`: [`LogSink`], the processor itself.

pub mod sink;

pub use sink::{LogSink, PROCESSOR_NAME};
