//! Belfry's HTTP API: BigBen's routes, unchanged, and the native `/v1` API.
//!
//! [`router`] builds one axum `Router` over an [`ApiState`]. Writes go
//! through the engine handle ([`belfry_engine::EngineHandle::apply`]: stored
//! durably, then the owning partition is woken); reads go straight to the
//! store.
//!
//! # Layout
//! - `routing`: the route table, each handler with who may call it; the
//!   router ([`router`]), the authorization rules and the OpenAPI document
//!   ([`openapi_document`], served at `GET /openapi.json`) are built from
//!   it; the 404, 405 and panic answers;
//! - [`options`]: [`ApiOptions`], the limits and BigBen's lapse offset;
//! - [`answers`]: the byte budgets of large answers (per answer and node
//!   wide);
//! - [`cluster`]: [`ClusterView`], what `/events/cluster` reports, and
//!   `GET /v1/cluster`;
//! - [`error`]: [`error::Code`] (each with one status and one stable
//!   code), [`error::ApiError`] and its two renderings (BigBen's
//!   `{"message"}`, `/v1`'s `{"error": {"code", "message"}}`);
//! - [`extract`]: body, path and query extractors whose rejections are ours
//!   (axum's defaults answer plain text);
//! - [`health`]: `/health/live` and `/health/ready`;
//! - [`openapi`]: the OpenAPI document's info, tags, body shapes, security
//!   scheme and links (its paths come from the route table);
//! - `pipeline`: the one write path of event writes (checked items →
//!   quotas → one durable batch through the engine → one outcome per item)
//!   that BigBen's and `/v1`'s write routes and [`ingest`] share;
//! - [`ingest`]: the same validation and write path without HTTP, for the
//!   Kafka consumer;
//! - `bigben`: `/ping`, `/events/...`, `/cron` (see `docs/api.md` for the
//!   decisions where Belfry differs from BigBen);
//! - `v1`: tenants and events under `/v1`;
//! - `metrics`: `GET /metrics` and the per-request counters;
//! - `console`: the web console at `/ui`, its files embedded;
//! - [`peer`]: calls between the nodes of a cluster, signed with the
//!   cluster's shared secret ([`peer::PeerAuth`]);
//! - `gate`: the two layers every request passes: authentication (the
//!   [`auth::Principal`], or a signed forward from a peer) and authorization
//!   (the route's rule);
//! - [`auth`]: API keys, the [`auth::Principal`] of each request, tenant
//!   isolation (the rules the route table gives each route), masking of
//!   write-only secrets, the audit log and the per-key rate limit (see
//!   `docs/security.md`).
//!
//! Handler modules never import `routing`; `routing` imports them.
//!
//! # Contract
//! Bad input gets a 4xx and changes nothing; a 5xx only comes from the store
//! or a bug, and its body never carries internal details (they are logged).

use std::sync::Arc;

use belfry_engine::EngineHandle;

pub mod answers;
pub mod auth;
mod bigben;
pub mod bodies;
pub mod cluster;
mod console;
pub mod error;
pub mod extract;
mod gate;
pub mod health;
pub mod ingest;
mod metrics;
pub mod openapi;
pub mod options;
pub mod peer;
mod pipeline;
mod quota;
mod routing;
mod v1;

pub use auth::{Auth, AuthMode, AuthOptions, Principal};
pub use cluster::{
    ClusterMember, ClusterStatus, ClusterView, LeaderStatus, NodeView, PartitionOwner,
    PartitionView, Role, SingleNode,
};
pub use options::ApiOptions;
pub use peer::PeerAuth;
pub use routing::{openapi_document, router};

/// Everything a request handler needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The write path (`apply`, `dry_run`) and, via `store()`, the read path.
    pub engine: EngineHandle,
    pub options: ApiOptions,
    pub cluster: Arc<dyn ClusterView>,
    /// Keys, open mode, rate limits ([`auth::Auth`]).
    pub auth: Arc<Auth>,
    /// Renders `GET /metrics`; `None`: the route answers 404 (tests and
    /// tools that install no recorder).
    pub metrics: Option<belfry_metrics::Exporter>,
}
