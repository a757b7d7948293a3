//! `POST /events/schedule`: a JSON array of BigBen `EventRequest`s, one
//! `EventResponse` per item in the same order.
//!
//! Each item is first validated (BigBen's checks, in BigBen's order, with its
//! messages); the valid ones are then applied in one durable batch through
//! the engine. A store failure turns every item it hit into `ERROR` (code
//! 500); when only part of the batch failed (the embedded store commits a
//! batch in independent parts), the items that were stored get their real
//! answer and only the others are `ERROR`. Nothing is claimed stored that
//! was not, and nothing is claimed unchanged that may have been stored.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belfry_core::{
    CommandOutcome, DeliveryOption, EventCommand, EventId, EventKey, EventRecord, EventVersion,
    TenantName, Timestamp,
};
use belfry_engine::EngineHandle;
use belfry_engine::quotas::QuotaError;
use belfry_sinks::body::{BigBenStatus, EventResponse, Mode};
use belfry_store::{KeyedCommand, StoreError};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, BigBenError, Code};
use crate::extract::BigBenJson;
use crate::pipeline::{Checked, Outcome, Pipeline, QuotaMode, Tenants, WriteScope};

/// BigBen's `EventRequest`. Every field is optional so that a missing one
/// becomes a per-item rejection rather than a failed request; unknown
/// fields (e.g. an `eventId` echoed back by a client) are ignored.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", expecting = "an EventRequest object")]
#[schema(example = json!({"id": "order-42", "tenant": "shop/orders", "eventTime": "2030-01-31T04:00:30Z", "payload": "{}"}))]
pub struct EventRequest {
    id: Option<String>,
    /// RFC 3339 (BigBen's ISO instant).
    event_time: Option<String>,
    tenant: Option<String>,
    payload: Option<String>,
    /// `UPSERT` (default) or `REMOVE`.
    #[serde(default, deserialize_with = "mode_field")]
    mode: Option<Mode>,
    /// `FULL_EVENT` (default) or `PAYLOAD_ONLY`.
    #[serde(default, deserialize_with = "delivery_option_field")]
    #[schema(value_type = Option<String>, pattern = "^(FULL_EVENT|PAYLOAD_ONLY)$")]
    delivery_option: Option<DeliveryOption>,
}

/// Reads `mode` with a message that names the accepted values (serde's
/// own would name a Rust type).
fn mode_field<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Mode>, D::Error> {
    named_field(
        deserializer,
        "mode",
        &[("UPSERT", Mode::Upsert), ("REMOVE", Mode::Remove)],
    )
}

fn delivery_option_field<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DeliveryOption>, D::Error> {
    named_field(
        deserializer,
        "deliveryOption",
        &[
            ("FULL_EVENT", DeliveryOption::FullEvent),
            ("PAYLOAD_ONLY", DeliveryOption::PayloadOnly),
        ],
    )
}

/// An optional string field `field` that must be one of `values`' names.
fn named_field<'de, D: Deserializer<'de>, T: Copy>(
    deserializer: D,
    field: &str,
    values: &[(&str, T)],
) -> Result<Option<T>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| {
            let found = values.iter().find(|(name, _)| *name == text);
            found.map(|&(_, value)| value).ok_or_else(|| {
                let names: Vec<&str> = values.iter().map(|(name, _)| *name).collect();
                D::Error::custom(format!(
                    "unknown {field} {text:?}; expected {}",
                    names.join(" or ")
                ))
            })
        })
        .transpose()
}

/// BigBen's validation messages, verbatim.
mod message {
    pub const TENANT_MISSING: &str = "tenant not present";
    pub const EVENT_TIME_MISSING: &str = "event time not present";
    pub const TENANT_UNKNOWN: &str = "tenant not registered / unknown tenant";
    pub const PAYLOAD_MISSING: &str = "payload must not be null for deliveryOption PAYLOAD_ONLY";
    pub const EVENT_TIME_UNPARSEABLE: &str =
        "event time can not be parsed. Must be in ISO 8601 format.";
    /// Not in BigBen (which failed later with a 500): Belfry needs the id.
    pub const ID_MISSING: &str = "id not present";
}

#[utoipa::path(
    post,
    path = "/events/schedule",
    tag = "bigben",
    operation_id = "bigben_schedule",
    summary = "Schedule, update or remove events (BigBen EventRequests)",
    request_body(content = Vec<EventRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Every item answered", body = Vec<EventResponse>),
        (status = 206, description = "Some items REJECTED or ERROR", body = Vec<EventResponse>),
        crate::openapi::schema::BigBenWriteErrors,
        crate::openapi::schema::BigBenBodyErrors
    )
)]
pub(crate) async fn schedule(
    State(state): State<ApiState>,
    principal: Principal,
    BigBenJson(requests): BigBenJson<Vec<EventRequest>>,
) -> Result<Response, BigBenError> {
    if requests.len() > state.options.max_batch {
        return Err(BigBenError(ApiError::new(
            Code::BatchTooLarge,
            format!(
                "too many events in one request: {} (at most {})",
                requests.len(),
                state.options.max_batch
            ),
        )));
    }
    let total = requests.len();
    let scheduled = schedule_items(
        &state.engine,
        state.options.lapse_offset,
        &principal,
        requests,
        QuotaMode::WholeRequest,
    )
    .await
    .map_err(|e| BigBenError(crate::quota::quota_error(e)))?;
    let status = overall_status(&scheduled.responses, scheduled.store_failure.as_ref());
    if let Some(error) = &scheduled.store_failure {
        tracing::error!(%error, items = total, "schedule request hit a store failure");
    }
    Ok((status, Json(scheduled.responses)).into_response())
}

/// The answers to a batch of requests, in their order.
#[derive(Debug)]
pub(crate) struct Scheduled {
    pub(crate) responses: Vec<EventResponse>,
    /// Per response, what refused it (`None`: not refused). BigBen's
    /// answer shows only the status and message; the Kafka consumer
    /// reports the code.
    pub(crate) refusals: Vec<Option<Code>>,
    /// The first store failure, if any item is `ERROR` because of one.
    pub(crate) store_failure: Option<StoreError>,
}

/// What an item's answer needs besides the store's result.
struct Echo {
    response: EventResponse,
    /// Answered `TRIGGERED` (before now + lapse offset).
    lapsed: bool,
}

/// Validates `requests` (BigBen's checks in BigBen's order, then Belfry's)
/// and writes the valid ones through the [`Pipeline`]; answers each item.
/// Shared by `POST /events/schedule` and Kafka ingestion.
///
/// # Errors
/// Only in [`QuotaMode::WholeRequest`]: the request passes a quota, or the
/// quota count failed; nothing was stored.
pub(crate) async fn schedule_items(
    engine: &EngineHandle,
    lapse_offset: Duration,
    scope: &dyn WriteScope,
    requests: Vec<EventRequest>,
    quota_mode: QuotaMode,
) -> Result<Scheduled, QuotaError> {
    let now = engine.now();
    let lapse_limit = now.plus(lapse_offset);
    let mut pipeline = Pipeline::new(engine, scope);
    for request in requests {
        let checked = check_item(request, &mut pipeline.tenants, lapse_limit).await;
        pipeline.push(checked);
    }
    let written = pipeline.write(quota_mode).await?;
    let refusals = written
        .outcomes
        .iter()
        .map(|outcome| match outcome {
            Outcome::Rejected { error, .. } => Some(error.code),
            _ => None,
        })
        .collect();
    let responses = written
        .outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Applied { echo, applied } => answer(
                echo.response,
                &applied.outcome,
                applied.record.as_ref(),
                echo.lapsed,
                now,
            ),
            Outcome::Unchanged(echo) => echo.response,
            Outcome::Rejected { echo, error } => echo
                .response
                .with_status(BigBenStatus::Rejected)
                .with_error(error.status().as_u16(), error.message),
            Outcome::StoreFailed { echo, .. } => store_error_item(echo.response),
        })
        .collect();
    Ok(Scheduled {
        responses,
        refusals,
        store_failure: written.store_failure.map(|failure| failure.error),
    })
}

/// Validates one item: BigBen's checks in BigBen's order, then Belfry's.
async fn check_item(
    request: EventRequest,
    tenants: &mut Tenants<'_>,
    lapse_limit: Timestamp,
) -> Checked<Echo> {
    let mode = request.mode.unwrap_or_default();
    let response = EventResponse {
        id: request.id.clone(),
        event_time: request.event_time.clone(),
        tenant: request.tenant.clone(),
        payload: request.payload.clone(),
        mode: Some(mode),
        delivery_option: Some(request.delivery_option.unwrap_or_default()),
        ..EventResponse::default()
    };
    let echo = |response: EventResponse| Echo {
        response,
        lapsed: false,
    };
    let reject = |response: EventResponse, message: &str| Checked::Rejected {
        echo: echo(response),
        error: ApiError::new(Code::InvalidRequest, message),
    };
    let Some(tenant_text) = request.tenant.as_deref().filter(|t| !t.is_empty()) else {
        return reject(response, message::TENANT_MISSING);
    };

    if mode == Mode::Remove {
        // BigBen validates nothing for REMOVE but (tenant, id); the time is
        // not needed to find the event.
        let Some(id_text) = request.id.as_deref().filter(|id| !id.is_empty()) else {
            return reject(response, message::ID_MISSING);
        };
        return match (TenantName::new(tenant_text), EventId::new(id_text)) {
            // Another tenant's event is, for this key, an unknown one.
            (Ok(tenant), Ok(_)) if !tenants.may_write(&tenant) => {
                Checked::Unchanged(echo(response))
            }
            (Ok(tenant), Ok(id)) => Checked::Write {
                echo: echo(response),
                command: Box::new(KeyedCommand {
                    key: EventKey::new(tenant, id),
                    command: EventCommand::Cancel,
                    fence: None,
                }),
            },
            // A name that cannot be stored names no event: like an unknown id.
            _ => Checked::Unchanged(echo(response)),
        };
    }

    let Some(time_text) = request.event_time.as_deref() else {
        return reject(response, message::EVENT_TIME_MISSING);
    };
    let unknown = |response| Checked::Rejected {
        echo: echo(response),
        error: ApiError::new(
            Code::UnknownTenant,
            format!("{}: {tenant_text}", message::TENANT_UNKNOWN),
        ),
    };
    let Ok(tenant) = TenantName::new(tenant_text) else {
        return unknown(response);
    };
    match tenants.registered(&tenant).await {
        Ok(Some(_)) => {}
        Ok(None) => return unknown(response),
        Err(error) => {
            return Checked::StoreFailed {
                echo: echo(response),
                error,
            };
        }
    }
    let delivery = request.delivery_option.unwrap_or_default();
    if delivery == DeliveryOption::PayloadOnly && request.payload.is_none() {
        return reject(response, message::PAYLOAD_MISSING);
    }
    let Some(event_time) = Timestamp::parse_rfc3339(time_text) else {
        return reject(response, message::EVENT_TIME_UNPARSEABLE);
    };
    let Some(id_text) = request.id.as_deref().filter(|id| !id.is_empty()) else {
        return reject(response, message::ID_MISSING);
    };
    let id = match EventId::new(id_text) {
        Ok(id) => id,
        Err(error) => return reject(response, &error.to_string()),
    };
    let command = KeyedCommand {
        key: EventKey::new(tenant, id),
        command: EventCommand::Upsert {
            event_time,
            payload: request.payload,
            delivery,
            new_version: EventVersion::generate(),
            settings: Default::default(),
        },
        fence: None,
    };
    Checked::Write {
        echo: Echo {
            response,
            lapsed: event_time < lapse_limit,
        },
        command: Box::new(command),
    }
}

/// The answer for an item the store applied.
fn answer(
    response: EventResponse,
    outcome: &CommandOutcome,
    record: Option<&EventRecord>,
    lapsed: bool,
    now: Timestamp,
) -> EventResponse {
    let version = record.map(|r| r.version.as_str().to_string());
    match outcome {
        CommandOutcome::Created | CommandOutcome::Updated { .. } if lapsed => {
            // A client re-sending an already delivered event at the same
            // instant gets the real trigger time: it is not fired again.
            let triggered_at = match (outcome, record.and_then(|r| r.triggered_at)) {
                (CommandOutcome::Updated { moved: false }, Some(at)) => at,
                _ => now,
            };
            EventResponse {
                event_id: version,
                ..response
            }
            .with_status(BigBenStatus::Triggered)
            .with_triggered_at(triggered_at)
        }
        CommandOutcome::Created => EventResponse {
            event_id: version,
            ..response
        }
        .with_status(BigBenStatus::Accepted),
        CommandOutcome::Updated { .. } => EventResponse {
            event_id: version,
            ..response
        }
        .with_status(BigBenStatus::Updated),
        CommandOutcome::Cancelled => EventResponse {
            event_id: version,
            ..response
        }
        .with_status(BigBenStatus::Deleted),
        // BigBen answers a REMOVE of an unknown event with the bare item.
        CommandOutcome::NotFound | CommandOutcome::AlreadyFinished(_) => response,
        other => {
            tracing::error!(?other, "unexpected outcome for a client command");
            store_error_item(response)
        }
    }
}

/// An item the store failed on. It may have been stored all the same (a
/// commit whose confirmation was lost); sending it again is safe.
fn store_error_item(response: EventResponse) -> EventResponse {
    response.with_status(BigBenStatus::Error).with_error(
        500,
        "the event may or may not have been stored; retry later",
    )
}

/// `400` if every item was rejected; `500`/`503` if every item failed in
/// the store; `206` if some items were rejected or failed (BigBen answers
/// 206 for rejections only; a client that reads only the status must not
/// take a partly failed batch for a success); `200` otherwise.
fn overall_status(responses: &[EventResponse], store_failure: Option<&StoreError>) -> StatusCode {
    let count = |status: BigBenStatus| {
        responses
            .iter()
            .filter(|r| r.event_status == Some(status))
            .count()
    };
    let rejected = count(BigBenStatus::Rejected);
    let errored = count(BigBenStatus::Error);
    if !responses.is_empty() && errored == responses.len() {
        return match store_failure {
            Some(StoreError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
    }
    if !responses.is_empty() && rejected == responses.len() {
        StatusCode::BAD_REQUEST
    } else if rejected > 0 || errored > 0 {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    }
}
