//! `GET /events/find` and `POST /events/dryrun`: one stored event, in
//! BigBen's `EventResponse` shape.
//!
//! Status mapping: `scheduled` → `UN_PROCESSED`; `retrying` → `ERROR` with
//! the last attempt's failure; `delivered` → `PROCESSED`; `failed` and
//! `missed` → `ERROR` with the reason; `cancelled` → 404 (BigBen deleted
//! cancelled events).

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use belfry_core::{EventId, EventKey, EventRecord, EventStatus, TenantName, Verdict};
use belfry_sinks::body::{BigBenStatus, EventResponse};

use crate::ApiState;
use crate::bigben::not_found;
use crate::error::{ApiError, BigBenError, Code};
use crate::extract::{query_pairs, query_value};

/// Attempts read back to find the last failure of an event; an event's
/// history is short (bounded by the retry policy's backlog limit).
const ATTEMPT_SCAN_LIMIT: usize = 10_000;

#[utoipa::path(
    get,
    path = "/events/find",
    tag = "bigben",
    operation_id = "bigben_find",
    summary = "Find an event",
    params(("tenant" = String, Query, min_length = 1, description = "Tenant"), ("id" = String, Query, min_length = 1, description = "Event id (or bucketId)")),
    responses(
        (status = 200, description = "The event", body = EventResponse),
        (status = 404, description = "Unknown or cancelled", body = crate::bigben::BigBenNotFound),
        (status = 400, description = "Bad input", body = crate::openapi::schema::BigBenError),
        crate::openapi::schema::BigBenErrors
    )
)]
pub(crate) async fn find(State(state): State<ApiState>, uri: Uri) -> Result<Response, BigBenError> {
    let Some(key) = key_from_query(&uri)? else {
        return Ok(not_found());
    };
    let Some(record) = live_event(&state, &key).await? else {
        return Ok(not_found());
    };
    Ok(Json(view(&state, &record).await?).into_response())
}

/// Delivers the event to its tenant now, without changing its stored
/// state, and answers what `find` would. If the dry-run delivery failed,
/// `error` says how: the receiver's status, how the failure classifies
/// (`retry` or `permanent`) and how long the attempt took, never what the
/// receiver answered.
#[utoipa::path(
    post,
    path = "/events/dryrun",
    tag = "bigben",
    operation_id = "bigben_dry_run",
    summary = "Deliver an event now without changing it",
    params(("tenant" = String, Query, min_length = 1, description = "Tenant"), ("id" = String, Query, min_length = 1, description = "Event id")),
    responses(
        (status = 200, description = "The event after the delivery", body = EventResponse),
        (status = 404, description = "Unknown or cancelled", body = crate::bigben::BigBenNotFound),
        (status = 400, description = "Bad input", body = crate::openapi::schema::BigBenError),
        (status = 415, description = "Not JSON", body = crate::openapi::schema::BigBenError),
        crate::openapi::schema::BigBenWriteErrors
    )
)]
pub(crate) async fn dry_run(
    State(state): State<ApiState>,
    uri: Uri,
) -> Result<Response, BigBenError> {
    let Some(key) = key_from_query(&uri)? else {
        return Ok(not_found());
    };
    // Checked first so that a cancelled event is not delivered.
    if live_event(&state, &key).await?.is_none() {
        return Ok(not_found());
    }
    // A delivery now, outside the delivery slots: its own rate, and a
    // token of the tenant's delivery rate if it has one.
    state
        .engine
        .quotas()
        .take_dry_run(&key.tenant)
        .map_err(|exceeded| BigBenError(crate::quota::exceeded_error(&exceeded)))?;
    let clock = state.engine.clock().clone();
    let started = clock.monotonic();
    let Some((record, result)) = state.engine.dry_run(&key).await? else {
        return Ok(not_found());
    };
    let took = clock.monotonic().since(started).as_millis();
    let mut response = view(&state, &record).await?;
    if result.verdict != Verdict::Delivered {
        let class = match result.verdict {
            Verdict::Permanent => "permanent",
            _ => "retry",
        };
        response = response.with_error(
            result.http_status.unwrap_or(500),
            format!(
                "dry run delivery failed ({class}, {took} ms): {}",
                result.error.as_deref().unwrap_or("unknown error")
            ),
        );
    }
    Ok(Json(response).into_response())
}

/// The `(tenant, id)` of the query (`id` or BigBen's older `bucketId`).
/// `Ok(None)` for names that cannot exist (too long, control characters).
fn key_from_query(uri: &Uri) -> Result<Option<EventKey>, BigBenError> {
    let pairs = query_pairs(uri).map_err(BigBenError)?;
    let required = |name: &str| {
        let value = match name {
            "id" => query_value(&pairs, "id").or_else(|| query_value(&pairs, "bucketId")),
            other => query_value(&pairs, other),
        };
        value.filter(|v| !v.is_empty()).ok_or_else(|| {
            BigBenError(ApiError::new(
                Code::InvalidQuery,
                format!("query parameter {name} is required"),
            ))
        })
    };
    let id = required("id")?;
    let tenant = required("tenant")?;
    Ok(match (TenantName::new(tenant), EventId::new(id)) {
        (Ok(tenant), Ok(id)) => Some(EventKey::new(tenant, id)),
        _ => None,
    })
}

/// The stored event unless it is unknown or cancelled.
async fn live_event(state: &ApiState, key: &EventKey) -> Result<Option<EventRecord>, BigBenError> {
    let record = state.engine.store().get_event(key).await?;
    Ok(record.filter(|r| r.status != EventStatus::Cancelled))
}

/// The stored event as BigBen's `find` shows it.
async fn view(state: &ApiState, record: &EventRecord) -> Result<EventResponse, BigBenError> {
    let response = EventResponse::from_record(record);
    Ok(match record.status {
        EventStatus::Scheduled | EventStatus::Cancelled => {
            response.with_status(BigBenStatus::UnProcessed)
        }
        EventStatus::Delivered => response.with_status(BigBenStatus::Processed),
        EventStatus::Retrying | EventStatus::Failed => {
            let attempts = state
                .engine
                .store()
                .attempts(&record.key, ATTEMPT_SCAN_LIMIT)
                .await?;
            let last_status = attempts
                .iter()
                .rev()
                .find(|a| a.version == record.version)
                .and_then(|a| a.http_status);
            response.with_status(BigBenStatus::Error).with_error(
                last_status.unwrap_or(500),
                record
                    .last_error
                    .clone()
                    .unwrap_or_else(|| format!("delivery {}", record.status.as_str())),
            )
        }
        EventStatus::Expired => response.with_status(BigBenStatus::Error).with_error(
            500,
            record
                .last_error
                .clone()
                .unwrap_or_else(|| "expired: not delivered by its expiry".to_string()),
        ),
        EventStatus::Missed => response.with_status(BigBenStatus::Error).with_error(
            500,
            record
                .last_error
                .clone()
                .unwrap_or_else(|| "missed: came due while Belfry was down".to_string()),
        ),
    })
}
