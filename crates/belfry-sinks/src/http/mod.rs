//! The HTTP webhook sink: `POST` each delivery to the tenant's URL.
//!
//! # Layout
//! - [`config`]: [`HttpSinkOptions`], the node's client settings;
//! - [`sink`]: [`HttpSink`], builds each attempt's request (headers, body,
//!   signature) and classifies how it went;
//! - [`transport`]: the one seam to the wire, [`Transport`], and its
//!   contract (one call is one attempt; never resend a request written
//!   whole; no redirects; the egress policy on every address);
//! - [`client`]: Belfry's own HTTP/1.1 client for plain `http://` URLs,
//!   with its keep-alive pool in `pool.rs`;
//! - [`reqwest_transport`]: reqwest for `https://` (and proxied http);
//! - [`retry`]: the one classification of responses and errors into a
//!   [`belfry_core::Verdict`];
//! - `tests.rs`: real HTTP against the testkit receiver and hand-written
//!   servers, every test through both transports.
//!
//! # The request
//! `POST <url>` with the tenant's headers, then Belfry's (which win on a
//! clash): `Content-Type: application/json`, [`HEADER_EVENT_ID`],
//! [`HEADER_TENANT`], [`HEADER_SCHEDULED_AT`], [`HEADER_ATTEMPT`] and
//! [`HEADER_IDEMPOTENCY_KEY`], and for a tenant with signing secrets the
//! Standard Webhooks headers ([`crate::signing`]). Id, tenant and key
//! values are percent-encoded UTF-8 (bytes outside printable ASCII, space
//! and `%` as `%XX`): plain ASCII ids arrive unchanged, anything else
//! decodes back exactly. The body is [`crate::body::render_delivery_body`].
//!
//! # The transports
//! Plain `http://` goes through Belfry's own HTTP/1.1 client
//! ([`client::Client`]): the target's request head is rendered once per
//! tenant, each delivery appends its headers and body into one buffer,
//! written with one `write_all` on a keep-alive connection from a pool
//! shared by every tenant (per `host:port`, `pool_max_idle_per_host`,
//! `pool_idle_timeout_ms`), and the response is parsed in place. The reason
//! is CPU per delivery: through reqwest and hyper's connection task a
//! delivery cost a channel hop, two task wake-ups, header-map and URL
//! clones, which made the client the node's largest CPU consumer after the
//! kernel. It does not talk to proxies: when `HTTP_PROXY`/`ALL_PROXY` is
//! set, plain http goes through reqwest as before.
//!
//! `https://` goes through one `reqwest::Client` for every tenant, so
//! keep-alive connections are reused; TLS is rustls with the `ring`
//! provider and the platform's root certificates.
//!
//! Neither follows redirects (a 3xx is a retry), and both connect only to
//! addresses the egress policy ([`crate::egress`]) allows.

pub mod client;
pub mod config;
mod pool;
pub mod reqwest_transport;
pub mod retry;
pub mod sink;
#[cfg(test)]
mod tests;
pub mod transport;

pub use config::HttpSinkOptions;
pub use sink::{HttpSink, HttpSinkError, PlainHttp};
pub use transport::{Outgoing, Response, Transport, TransportError};

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
