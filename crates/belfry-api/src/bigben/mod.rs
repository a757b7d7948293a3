//! BigBen's HTTP API at its original paths (see `/work/shared/bigben-api.md`
//! and `docs/api.md` for where Belfry deliberately differs).
//!
//! - `schedule`: `POST /events/schedule`, per-item validation and outcomes;
//! - `lookup`: `GET /events/find`, `POST /events/dryrun`;
//! - `tenants`: `POST /events/tenant/register`, `GET /events/tenants`;
//! - this file: the routes, `/ping`, `/events/cluster` and the `/cron`
//!   placeholders.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::ApiState;
use crate::error::{ApiError, BigBenError, code};

mod lookup;
mod schedule;
mod tenants;

pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/ping", get(ping))
        .route("/events/cluster", get(cluster))
        .route("/events/tenant/register", post(tenants::register))
        .route("/events/tenants", get(tenants::list))
        .route("/events/schedule", post(schedule::schedule))
        .route("/events/find", get(lookup::find))
        .route("/events/dryrun", post(lookup::dry_run))
        .route("/cron", post(cron_not_supported))
        .route(
            "/cron/{*rest}",
            get(cron_not_supported).delete(cron_not_supported),
        )
}

async fn ping() -> Json<serde_json::Value> {
    Json(json!({ "status": "OK" }))
}

/// Node address → `"Master"` / `"Slave"`.
async fn cluster(State(state): State<ApiState>) -> Json<BTreeMap<String, &'static str>> {
    Json(
        state
            .cluster
            .members()
            .into_iter()
            .map(|member| (member.address, member.role.as_str()))
            .collect(),
    )
}

/// Cron schedules arrive with a later issue; until then the routes exist
/// and say so, instead of a bare 404.
async fn cron_not_supported() -> Response {
    BigBenError(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        code::NOT_IMPLEMENTED,
        "cron schedules are not supported yet",
    ))
    .into_response()
}

/// BigBen's 404 body for `find` and `dryrun`.
fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "status": "not found" })),
    )
        .into_response()
}
