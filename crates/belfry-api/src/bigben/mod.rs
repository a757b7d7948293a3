//! BigBen's HTTP API at its original paths (Walmart BigBen's documented API, which `docs/api.md`
//! restates, with where Belfry deliberately differs).
//!
//! - `schedule`: `POST /events/schedule`, per-item validation and outcomes;
//! - `lookup`: `GET /events/find`, `POST /events/dryrun`;
//! - `tenants`: `POST /events/tenant/register`, `GET /events/tenants`;
//! - `cron`: `POST /cron`, `GET /cron/{tenant}/{id}`, `DELETE
//!   /cron/{tenant}/{id}/{type}` over recurring schedules;
//! - this file: `/ping` and `/events/cluster`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::ApiState;

pub(crate) mod cron;
pub(crate) mod lookup;
pub(crate) mod schedule;
pub(crate) mod tenants;

#[utoipa::path(
    get,
    path = "/ping",
    tag = "bigben",
    operation_id = "ping",
    summary = "Liveness as BigBen had it",
    security(()),
    responses(
        (status = 200, description = "Serving", body = StatusOk)
    )
)]
pub(crate) async fn ping() -> Json<StatusOk> {
    Json(StatusOk::OK)
}

/// `{"status": "OK"}`: `/ping`, and a deleted cron.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatusOk {
    #[schema(example = "OK")]
    status: &'static str,
}

impl StatusOk {
    pub(crate) const OK: StatusOk = StatusOk { status: "OK" };
}

/// BigBen's "not found" of `find` and `dryrun`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"status": "not found"}))]
pub(crate) struct BigBenNotFound {
    status: &'static str,
}

/// Node address → `"Master"` / `"Slave"`.
#[utoipa::path(
    get,
    path = "/events/cluster",
    tag = "bigben",
    operation_id = "bigben_cluster",
    summary = "Node address to Master/Slave (admin)",
    responses(
        (status = 200, description = "Node address to role", body = BTreeMap<String, String>),
        crate::openapi::schema::BigBenGateErrors
    )
)]
pub(crate) async fn cluster(State(state): State<ApiState>) -> Json<BTreeMap<String, &'static str>> {
    Json(
        state
            .cluster
            .members()
            .into_iter()
            .map(|member| (member.address, member.role.as_str()))
            .collect(),
    )
}

/// BigBen's 404 body for `find` and `dryrun`.
pub(crate) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(BigBenNotFound {
            status: "not found",
        }),
    )
        .into_response()
}
