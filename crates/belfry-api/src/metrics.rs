//! `GET /metrics` (Prometheus text; admin keys, as it shows the whole node)
//! and the per-request counters every route records.

use std::sync::Mutex;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiState;
use crate::error::{ApiError, Code, V1Error};

/// The partitions the last scrape saw owned here, so one that moved away
/// reads -1 instead of its old epoch.
static LAST_OWNED: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// `GET /metrics`: the node's gauges are read now, then everything is
/// rendered.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "cluster",
    operation_id = "metrics",
    summary = "Prometheus metrics of this node (admin); see docs/operations.md",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
        (status = 404, description = "Metrics are not enabled on this node", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1GateErrors
    )
)]
pub(crate) async fn scrape(State(state): State<ApiState>) -> Response {
    let Some(exporter) = &state.metrics else {
        return V1Error(ApiError::new(
            Code::NotFound,
            "metrics are not enabled on this node",
        ))
        .into_response();
    };
    // Every node shows every paused tenant: a pause is cluster-wide. A
    // store that cannot answer leaves the last values.
    match state.engine.store().list_tenant_pauses().await {
        Ok(pauses) => {
            let paused: Vec<&str> = pauses
                .iter()
                .filter(|(_, pause)| pause.paused)
                .map(|(name, _)| name.as_str())
                .collect();
            belfry_metrics::set_paused_tenants(&paused);
        }
        Err(error) => tracing::warn!(%error, "reading the paused tenants for /metrics failed"),
    }
    belfry_metrics::set_circuits_open(state.engine.circuits().not_closed());
    let node = state.engine.metrics_state();
    {
        // Poison means a panic mid-update; the list is still usable.
        let mut last = LAST_OWNED.lock().unwrap_or_else(|e| e.into_inner());
        belfry_metrics::set_node_state(&node, &last);
        last.clear();
        last.extend(node.partitions.iter().map(|(p, _)| *p));
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        exporter.render(),
    )
        .into_response()
}

/// Counts every request by its route template (never the concrete path:
/// tenant names and ids stay out of the labels), method and status.
pub(crate) async fn record_request(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    // Standard methods only: a client's invented ones must not mint series.
    let method = match *request.method() {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    };
    let clock = state.engine.clock();
    let started = clock.monotonic();
    let response = next.run(request).await;
    belfry_metrics::api_request(
        &route,
        method,
        response.status().as_u16(),
        clock.monotonic().since(started),
    );
    response
}
