//! The HTTP webhook sink: `POST` each delivery to the tenant's URL.
//!
//! # Layout
//! - [`config`]: [`HttpSinkOptions`], the node's client settings;
//! - [`sink`]: [`HttpSink`], builds the request and runs one attempt;
//! - [`retry`]: the one classification of responses and errors into a
//!   [`belfry_core::Verdict`];
//! - `tests.rs`: real HTTP against the testkit receiver.
//!
//! # The request
//! `POST <url>` with the tenant's headers, then Belfry's (which win on a
//! clash): `Content-Type: application/json`, [`HEADER_EVENT_ID`],
//! [`HEADER_TENANT`], [`HEADER_SCHEDULED_AT`], [`HEADER_ATTEMPT`] and
//! [`HEADER_IDEMPOTENCY_KEY`]. Id, tenant and key values are
//! percent-encoded UTF-8 (bytes outside printable ASCII, space and `%` as
//! `%XX`): plain ASCII ids arrive unchanged, anything else decodes back
//! exactly. The body is [`crate::body::render_delivery_body`].
//!
//! One `reqwest::Client` serves every tenant so keep-alive connections are
//! reused; redirects are not followed (a 3xx is a retry). TLS is rustls
//! with the `ring` provider and the platform's root certificates.

pub mod config;
pub mod retry;
pub mod sink;
#[cfg(test)]
mod tests;

pub use config::HttpSinkOptions;
pub use sink::{HttpSink, HttpSinkError};

/// The client's id of the event.
pub const HEADER_EVENT_ID: &str = "x-belfry-event-id";
/// The tenant's name.
pub const HEADER_TENANT: &str = "x-belfry-tenant";
/// The instant the event was scheduled for (RFC 3339, UTC).
pub const HEADER_SCHEDULED_AT: &str = "x-belfry-scheduled-at";
/// 1 for the first attempt of this version, then 2, 3, ...
pub const HEADER_ATTEMPT: &str = "x-belfry-attempt";
/// The event's version (BigBen's `eventId`): the same for every retry of one
/// version, so a receiver can drop duplicates of an at-least-once delivery.
pub const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";
