//! Belfry's HTTP API: BigBen's routes, unchanged, and the native `/v1` API.
//!
//! [`router`] builds one axum `Router` over an [`ApiState`]. Writes go
//! through the engine handle ([`belfry_engine::EngineHandle::apply`]: stored
//! durably, then the owning partition is woken); reads go straight to the
//! store.
//!
//! # Layout
//! - [`options`]: [`ApiOptions`], the limits and BigBen's lapse offset;
//! - [`answers`]: the byte budgets of large answers (per answer and node
//!   wide);
//! - [`cluster`]: [`ClusterView`], what `/events/cluster` reports;
//! - [`error`]: [`error::ApiError`] and its two renderings (BigBen's
//!   `{"message"}`, `/v1`'s `{"error": {"code", "message"}}`);
//! - [`extract`]: body, path and query extractors whose rejections are ours
//!   (axum's defaults answer plain text);
//! - [`health`]: `/health/live` and `/health/ready`;
//! - [`openapi`]: `GET /openapi.json`, generated from the handlers;
//! - [`ingest`]: the same validation and write path without HTTP, for the
//!   Kafka consumer;
//! - `bigben`: `/ping`, `/events/...`, `/cron` (see `docs/api.md` for the
//!   decisions where Belfry differs from BigBen);
//! - `v1`: tenants and events under `/v1`;
//! - `metrics`: `GET /metrics` and the per-request counters;
//! - `console`: the web console at `/ui`, its files embedded;
//! - [`peer`]: calls between the nodes of a cluster, signed with the
//!   cluster's shared secret ([`peer::PeerAuth`]);
//! - [`auth`]: API keys, the [`auth::Principal`] of each request, tenant
//!   isolation (the route table), masking of write-only secrets, the audit
//!   log and the per-key rate limit (see `docs/security.md`).
//!
//! # Contract
//! Bad input gets a 4xx and changes nothing; a 5xx only comes from the store
//! or a bug, and its body never carries internal details (they are logged).

use std::sync::Arc;

use axum::Router;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use belfry_engine::EngineHandle;
use tower_http::catch_panic::CatchPanicLayer;

pub mod answers;
pub mod auth;
mod bigben;
pub mod bodies;
pub mod cluster;
mod console;
pub mod error;
pub mod extract;
pub mod health;
pub mod ingest;
mod metrics;
pub mod openapi;
pub mod options;
pub mod peer;
mod quota;
mod v1;

pub use auth::{Auth, AuthMode, AuthOptions, Principal};
pub use cluster::{
    ClusterMember, ClusterStatus, ClusterView, LeaderStatus, NodeView, PartitionOwner,
    PartitionView, Role, SingleNode,
};
pub use options::ApiOptions;
pub use peer::PeerAuth;

use crate::error::{ApiError, BigBenError, V1Error, code};

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

/// The whole HTTP API: BigBen's routes at their original paths and the
/// native API under `/v1`, behind authentication (every request) and
/// authorization (every route; see [`auth`]).
pub fn router(state: ApiState) -> Router {
    use axum::middleware::from_fn_with_state;
    use axum::routing::{delete, get};
    Router::new()
        .merge(bigben::routes())
        .merge(v1::routes())
        .merge(health::routes())
        .merge(openapi::routes())
        .merge(console::routes())
        .route("/v1/cluster", get(cluster_status))
        .route(
            "/v1/keys",
            get(auth::routes::list).post(auth::routes::create),
        )
        .route("/v1/keys/{id}", delete(auth::routes::revoke))
        .route("/v1/audit", get(auth::routes::audit_log))
        .route("/v1/whoami", get(auth::routes::whoami))
        .route("/metrics", get(metrics::scrape))
        .route_layer(from_fn_with_state(
            state.clone(),
            auth::middleware::authorize,
        ))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(
            state.clone(),
            auth::middleware::authenticate,
        ))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(from_fn_with_state(state.clone(), metrics::record_request))
        .layer(axum::Extension(answers::AnswerBudget::new(&state.options)))
        .with_state(state)
}

/// `GET /v1/cluster`.
#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "cluster",
    operation_id = "cluster_status",
    summary = "What this node last saw of the cluster (admin)",
    responses(
        (status = 200, description = "Leader, nodes and their partitions", body = crate::openapi::schema::ClusterStatus),
        (status = 401, description = "No valid key", body = crate::openapi::schema::V1Error),
        (status = 403, description = "The key may not do this", body = crate::openapi::schema::V1Error),
        (status = 429, description = "Rate limit or quota", body = crate::openapi::schema::V1Error)
    )
)]
async fn cluster_status(
    axum::extract::State(state): axum::extract::State<ApiState>,
) -> axum::Json<ClusterStatus> {
    let status = state.cluster.status().unwrap_or_else(|| {
        let me = state.cluster.members().into_iter().next();
        let address = me.map(|m| m.address).unwrap_or_default();
        ClusterStatus {
            mode: "single",
            leader: Some(LeaderStatus {
                node: address.clone(),
                address: Some(address.clone()),
                term: 0,
            }),
            nodes: vec![NodeView {
                id: address.clone(),
                address,
                role: Role::Master,
                heartbeat_age_ms: None,
                partitions: state
                    .engine
                    .partitions()
                    .owned()
                    .into_iter()
                    .map(|(p, epoch)| PartitionView {
                        partition: p.0,
                        epoch,
                        moving_to: None,
                    })
                    .collect(),
            }],
            unowned: Vec::new(),
        }
    });
    axum::Json(status)
}

fn is_v1(uri: &Uri) -> bool {
    let path = uri.path();
    path == "/v1" || path.starts_with("/v1/")
}

/// Renders `error` in the envelope of the route family `uri` belongs to.
fn family_error(uri: &Uri, error: ApiError) -> Response {
    if is_v1(uri) {
        V1Error(error).into_response()
    } else {
        BigBenError(error).into_response()
    }
}

async fn unknown_route(method: Method, uri: Uri) -> Response {
    family_error(
        &uri,
        ApiError::not_found(
            code::NOT_FOUND,
            format!("no route for {method} {}", uri.path()),
        ),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    family_error(
        &uri,
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            code::METHOD_NOT_ALLOWED,
            format!("method {method} is not allowed on {}", uri.path()),
        ),
    )
}

/// A panicking handler is a bug: log it, answer a generic 500 that reads
/// as an error in both envelopes (the path is not known here).
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("non-string panic payload");
    tracing::error!(panic = detail, "request handler panicked");
    let error = ApiError::internal();
    let body = serde_json::json!({
        "message": error.message,
        "error": { "code": error.code, "message": error.message },
    });
    (error.status, axum::Json(body)).into_response()
}
