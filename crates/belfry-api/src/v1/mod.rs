//! Belfry's native API under `/v1`: JSON in and out, one error envelope
//! `{"error": {"code", "message"}}` with stable codes (see [`crate::error::code`]).
//!
//! Tenant names and event ids may contain `/`; in paths each is one
//! percent-encoded segment (`/` as `%2F`). The router matches on the raw
//! path, so `%2F` never splits a segment, and the extractor decodes it.
//!
//! - `tenants`: `/v1/tenants[/{tenant}]`;
//! - `events`: `/v1/tenants/{tenant}/events[/{id}[/attempts]]`;
//! - `views`: the JSON shapes answered.

use axum::Router;
use axum::routing::get;

use crate::ApiState;

mod events;
mod tenants;
mod views;

pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/tenants", get(tenants::list))
        .route(
            "/v1/tenants/{tenant}",
            get(tenants::get).put(tenants::put).delete(tenants::delete),
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
}
