//! Belfry's native API under `/v1`: JSON in and out, one error envelope
//! `{"error": {"code", "message"}}` with stable codes (see [`crate::error::code`]).
//!
//! Tenant names and event ids may contain `/`; in paths each is one
//! percent-encoded segment (`/` as `%2F`). The router matches on the raw
//! path, so `%2F` never splits a segment, and the extractor decodes it.
//!
//! - `tenants`: `/v1/tenants[/{tenant}]`;
//! - `signing`: `/v1/tenants/{tenant}/signing-secrets/rotate`;
//! - `events`: `/v1/tenants/{tenant}/events[/{id}[/attempts]]`;
//! - `schedules`: `/v1/tenants/{tenant}/schedules[/{id}[/pause|/resume|/occurrences]]`
//!   and `/v1/cron/preview`;
//! - `bulk`: `/v1/bulk-actions[/{id}[/cancel]]`;
//! - `leases`: pull workers' `/v1/tenants/{tenant}/leases` and
//!   `/v1/leases/{lease_id}/heartbeat|complete|fail|release`;
//! - `forward`: cluster mode, pull workers' calls and claims reaching
//!   the nodes that hold their leases and entries;
//! - `lease_batch`: `/v1/tenants/{tenant}/leases/complete`, up to 100
//!   completions in one request;
//! - `views`: the JSON shapes several routes share (an event, a tenant, a
//!   back-off), each also its OpenAPI schema.

use axum::Router;
use axum::routing::{get, post};

use crate::ApiState;
use crate::error::{ApiError, V1Error, code};

pub(crate) mod bulk;
pub(crate) mod events;
pub(crate) mod forward;
pub(crate) mod lease_batch;
pub(crate) mod leases;
pub(crate) mod schedules;
pub(crate) mod signing;
pub(crate) mod tenants;
pub(crate) mod views;

/// A `400 invalid_request` with this message (bad input in a body or path).
pub(crate) fn invalid_request(message: impl Into<String>) -> V1Error {
    V1Error(ApiError::bad_request(code::INVALID_REQUEST, message))
}

pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/tenants", get(tenants::list))
        .route(
            "/v1/tenants/{tenant}",
            get(tenants::get).put(tenants::put).delete(tenants::delete),
        )
        .route(
            "/v1/tenants/{tenant}/signing-secrets/rotate",
            post(signing::rotate),
        )
        .route(
            "/v1/tenants/{tenant}/events",
            get(events::list).post(events::batch),
        )
        .route(
            "/v1/tenants/{tenant}/events/{id}",
            get(events::get).put(events::put).delete(events::cancel),
        )
        .route(
            "/v1/tenants/{tenant}/events/{id}/attempts",
            get(events::attempts),
        )
        .route(
            "/v1/tenants/{tenant}/events/{id}/redrive",
            post(events::redrive),
        )
        .route(
            "/v1/tenants/{tenant}/events/{id}/delete",
            post(events::delete),
        )
        .route("/v1/tenants/{tenant}/schedules", get(schedules::list))
        .route(
            "/v1/tenants/{tenant}/schedules/{id}",
            get(schedules::get)
                .put(schedules::put)
                .delete(schedules::delete),
        )
        .route(
            "/v1/tenants/{tenant}/schedules/{id}/pause",
            post(schedules::pause),
        )
        .route(
            "/v1/tenants/{tenant}/schedules/{id}/resume",
            post(schedules::resume),
        )
        .route(
            "/v1/tenants/{tenant}/schedules/{id}/occurrences",
            get(schedules::occurrences),
        )
        .route("/v1/cron/preview", get(schedules::preview))
        .route("/v1/bulk-actions", get(bulk::list).post(bulk::create))
        .route("/v1/bulk-actions/{id}", get(bulk::get))
        .route("/v1/bulk-actions/{id}/cancel", post(bulk::cancel))
        .route("/v1/tenants/{tenant}/leases", post(leases::claim))
        .route(
            "/v1/tenants/{tenant}/leases/complete",
            post(lease_batch::complete_batch),
        )
        .route("/v1/leases/{lease_id}/heartbeat", post(leases::heartbeat))
        .route("/v1/leases/{lease_id}/complete", post(leases::complete))
        .route("/v1/leases/{lease_id}/fail", post(leases::fail))
        .route("/v1/leases/{lease_id}/release", post(leases::release))
}
