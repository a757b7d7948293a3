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

use std::collections::HashMap;
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
use belfry_engine::quotas::{QuotaError, QuotaExceeded};
use belfry_sinks::body::{BigBenStatus, EventResponse, Mode};
use belfry_store::{Applied, KeyedCommand, StoreError};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, BigBenError, code};
use crate::extract::BigBenJson;
use crate::ingest::WriteScope;

/// BigBen's `EventRequest`. Every field is optional so that a missing one
/// becomes a per-item rejection rather than a failed request; unknown
/// fields (e.g. an `eventId` echoed back by a client) are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "an EventRequest object")]
pub struct EventRequest {
    id: Option<String>,
    event_time: Option<String>,
    tenant: Option<String>,
    payload: Option<String>,
    #[serde(default, deserialize_with = "mode_field")]
    mode: Option<Mode>,
    #[serde(default, deserialize_with = "delivery_option_field")]
    delivery_option: Option<DeliveryOption>,
}

/// Reads `mode` with a message that names the accepted values (serde's
/// own would name a Rust type).
fn mode_field<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Mode>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| match text.as_str() {
            "UPSERT" => Ok(Mode::Upsert),
            "REMOVE" => Ok(Mode::Remove),
            other => Err(D::Error::custom(format!(
                "unknown mode {other:?}; expected UPSERT or REMOVE"
            ))),
        })
        .transpose()
}

fn delivery_option_field<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DeliveryOption>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| match text.as_str() {
            "FULL_EVENT" => Ok(DeliveryOption::FullEvent),
            "PAYLOAD_ONLY" => Ok(DeliveryOption::PayloadOnly),
            other => Err(D::Error::custom(format!(
                "unknown deliveryOption {other:?}; expected FULL_EVENT or PAYLOAD_ONLY"
            ))),
        })
        .transpose()
}

pub(crate) const TENANT_UNKNOWN: &str = message::TENANT_UNKNOWN;

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

/// What happens to one item.
enum Plan {
    /// Answered without touching the store (rejected, or a REMOVE of a name
    /// that cannot exist).
    Answered(EventResponse),
    /// Goes into the store batch at `index`.
    Apply {
        response: EventResponse,
        index: usize,
        /// Answered `TRIGGERED` (before now + lapse offset).
        lapsed: bool,
    },
}

#[utoipa::path(
    post,
    path = "/events/schedule",
    tag = "bigben",
    operation_id = "bigben_schedule",
    summary = "Schedule, update or remove events (BigBen EventRequests)",
    request_body(content = Vec<crate::openapi::schema::EventRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Every item answered", body = Vec<crate::openapi::schema::EventResponse>),
        (status = 206, description = "Some items REJECTED or ERROR", body = Vec<crate::openapi::schema::EventResponse>),
        (status = 400, description = "Bad input", body = crate::openapi::schema::BigBenError),
        (status = 401, description = "No valid key", body = crate::openapi::schema::BigBenError),
        (status = 403, description = "The key may not do this", body = crate::openapi::schema::BigBenError),
        (status = 413, description = "Body too large", body = crate::openapi::schema::BigBenError),
        (status = 415, description = "Not JSON", body = crate::openapi::schema::BigBenError),
        (status = 429, description = "Rate limit or quota", body = crate::openapi::schema::BigBenError),
        (status = 500, description = "Internal error (details only in the log)", body = crate::openapi::schema::BigBenError),
        (status = 503, description = "Store unavailable; retry", body = crate::openapi::schema::BigBenError)
    )
)]
pub(crate) async fn schedule(
    State(state): State<ApiState>,
    principal: Principal,
    BigBenJson(requests): BigBenJson<Vec<EventRequest>>,
) -> Result<Response, BigBenError> {
    if requests.len() > state.options.max_batch {
        return Err(BigBenError(ApiError::bad_request(
            code::BATCH_TOO_LARGE,
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
        state.options.lapse_offset_ms,
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

/// How quotas refuse (`[limits]`, see `belfry_engine::quotas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaMode {
    /// HTTP: a request that passes a quota is refused whole (`429`/`413`),
    /// before anything is stored; the client retries it.
    WholeRequest,
    /// Kafka: the records of one poll come from many clients, so only the
    /// items that pass a quota are `REJECTED` (code 429 or 413); the others
    /// are stored.
    PerItem,
}

/// The answers to a batch of requests, in their order.
#[derive(Debug)]
pub(crate) struct Scheduled {
    pub(crate) responses: Vec<EventResponse>,
    /// The first store failure, if any item is `ERROR` because of one.
    pub(crate) store_failure: Option<StoreError>,
}

/// Validates `requests` (BigBen's checks in BigBen's order, then Belfry's),
/// applies the valid ones in one durable batch through the engine, and
/// answers each item. Shared by `POST /events/schedule` and Kafka
/// ingestion.
///
/// # Errors
/// Only in [`QuotaMode::WholeRequest`]: the request passes a quota, or the
/// quota count failed; nothing was stored.
pub(crate) async fn schedule_items(
    engine: &EngineHandle,
    lapse_offset_ms: u64,
    scope: &dyn WriteScope,
    requests: Vec<EventRequest>,
    quota_mode: QuotaMode,
) -> Result<Scheduled, QuotaError> {
    let now = engine.now();
    let lapse_limit = now.plus(Duration::from_millis(lapse_offset_ms));
    let total = requests.len();

    let mut registered = Registered::new(scope);
    let mut commands = Vec::new();
    let mut plans = Vec::with_capacity(total);
    let mut store_failure: Option<StoreError> = None;
    for request in requests {
        let plan = match check_item(request, engine, &mut registered, lapse_limit).await {
            Checked::Valid {
                response,
                command,
                lapsed,
            } => {
                commands.push(command);
                Plan::Apply {
                    response,
                    index: commands.len() - 1,
                    lapsed,
                }
            }
            Checked::Answered(answered) => Plan::Answered(answered),
            Checked::StoreFailed(response, error) => {
                store_failure.get_or_insert(error);
                Plan::Answered(store_error_item(response))
            }
        };
        plans.push(plan);
    }

    // Quotas refuse before anything is stored.
    if store_failure.is_none() && !commands.is_empty() {
        match (engine.quotas().check(&commands).await, quota_mode) {
            (Ok(()), _) => {}
            (Err(error), QuotaMode::WholeRequest) => return Err(error),
            (Err(QuotaError::Store(error)), QuotaMode::PerItem) => {
                store_failure = Some(error);
            }
            (Err(QuotaError::Exceeded(_)), QuotaMode::PerItem) => {
                match refuse_per_item(engine, commands, plans).await {
                    Ok((kept, replanned)) => {
                        commands = kept;
                        plans = replanned;
                    }
                    Err((error, replanned)) => {
                        store_failure = Some(error);
                        commands = Vec::new();
                        plans = replanned;
                    }
                }
            }
        }
    }
    // Per command: what the store did, or `None` if it failed.
    let applied: Vec<Option<Applied>> = match (&store_failure, commands.is_empty()) {
        (None, false) => match engine.apply(commands).await {
            Ok(applied) => applied.into_iter().map(Some).collect(),
            Err(StoreError::Partial(partial)) => {
                store_failure = partial.first_error().cloned();
                partial.results.into_iter().map(Result::ok).collect()
            }
            Err(error) => {
                store_failure = Some(error);
                Vec::new()
            }
        },
        _ => Vec::new(),
    };
    let responses: Vec<EventResponse> = plans
        .into_iter()
        .map(|plan| match plan {
            Plan::Answered(response) => response,
            Plan::Apply {
                response,
                index,
                lapsed,
            } => match applied.get(index).and_then(Option::as_ref) {
                Some(item) => answer(response, &item.outcome, item.record.as_ref(), lapsed, now),
                None => store_error_item(response),
            },
        })
        .collect();
    Ok(Scheduled {
        responses,
        store_failure,
    })
}

/// [`QuotaMode::PerItem`] after the batch as a whole passed a quota: each
/// command is checked on its own; those that pass a quota are answered
/// `REJECTED` and left out. Returns the commands kept and the plans with
/// their new indexes; a failed count fails every item that was to be
/// applied.
async fn refuse_per_item(
    engine: &EngineHandle,
    commands: Vec<KeyedCommand>,
    plans: Vec<Plan>,
) -> Result<(Vec<KeyedCommand>, Vec<Plan>), (StoreError, Vec<Plan>)> {
    let mut refused: Vec<Option<QuotaExceeded>> = Vec::with_capacity(commands.len());
    let mut failure = None;
    for command in &commands {
        match engine.quotas().check(std::slice::from_ref(command)).await {
            Ok(()) => refused.push(None),
            Err(QuotaError::Exceeded(exceeded)) => refused.push(Some(exceeded)),
            Err(QuotaError::Store(error)) => {
                failure = Some(error);
                break;
            }
        }
    }
    if let Some(error) = failure {
        let plans = plans
            .into_iter()
            .map(|plan| match plan {
                Plan::Apply { response, .. } => Plan::Answered(store_error_item(response)),
                answered => answered,
            })
            .collect();
        return Err((error, plans));
    }
    let mut new_index = Vec::with_capacity(commands.len());
    let mut kept = Vec::new();
    for (command, refusal) in commands.into_iter().zip(&refused) {
        new_index.push(refusal.is_none().then_some(kept.len()));
        if refusal.is_none() {
            kept.push(command);
        }
    }
    let plans = plans
        .into_iter()
        .map(|plan| match plan {
            Plan::Apply {
                response,
                index,
                lapsed,
            } => match (new_index[index], &refused[index]) {
                (Some(index), _) => Plan::Apply {
                    response,
                    index,
                    lapsed,
                },
                (None, refusal) => {
                    let error = refusal
                        .as_ref()
                        .map(crate::quota::exceeded_error)
                        .unwrap_or_else(ApiError::internal);
                    Plan::Answered(
                        response
                            .with_status(BigBenStatus::Rejected)
                            .with_error(error.status.as_u16(), error.message),
                    )
                }
            },
            answered => answered,
        })
        .collect();
    Ok((kept, plans))
}

/// The result of validating one item.
enum Checked {
    /// Valid: apply `command`; `lapsed` items are answered `TRIGGERED`.
    Valid {
        response: EventResponse,
        command: KeyedCommand,
        lapsed: bool,
    },
    /// The item's final answer (rejected, or nothing to do).
    Answered(EventResponse),
    /// The store failed while checking the tenant.
    StoreFailed(EventResponse, StoreError),
}

/// Validates one item: BigBen's checks in BigBen's order, then Belfry's.
async fn check_item(
    request: EventRequest,
    engine: &EngineHandle,
    registered: &mut Registered<'_>,
    lapse_limit: Timestamp,
) -> Checked {
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
    let reject = |response: EventResponse, message: &str| {
        Checked::Answered(
            response
                .with_status(BigBenStatus::Rejected)
                .with_error(400, message),
        )
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
            (Ok(tenant), Ok(_)) if !registered.scope.may_write(&tenant) => {
                Checked::Answered(response)
            }
            (Ok(tenant), Ok(id)) => Checked::Valid {
                response,
                command: KeyedCommand {
                    key: EventKey::new(tenant, id),
                    command: EventCommand::Cancel,
                    fence: None,
                },
                lapsed: false,
            },
            // A name that cannot be stored names no event: like an unknown id.
            _ => Checked::Answered(response),
        };
    }

    let Some(time_text) = request.event_time.as_deref() else {
        return reject(response, message::EVENT_TIME_MISSING);
    };
    let tenant = match TenantName::new(tenant_text) {
        Ok(tenant) => tenant,
        Err(_) => {
            return reject(
                response,
                &format!("{}: {tenant_text}", message::TENANT_UNKNOWN),
            );
        }
    };
    match registered.check(engine, &tenant).await {
        Ok(true) => {}
        Ok(false) => {
            return reject(
                response,
                &format!("{}: {tenant_text}", message::TENANT_UNKNOWN),
            );
        }
        Err(error) => return Checked::StoreFailed(response, error),
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
            pull: Default::default(),
        },
        fence: None,
    };
    Checked::Valid {
        response,
        command,
        lapsed: event_time < lapse_limit,
    }
}

/// Which tenants are registered, looked up once per request, for the writer
/// asking: a tenant it may not write is unknown, exactly like an
/// unregistered one.
struct Registered<'a> {
    known: HashMap<TenantName, bool>,
    scope: &'a dyn WriteScope,
}

impl<'a> Registered<'a> {
    fn new(scope: &'a dyn WriteScope) -> Self {
        Registered {
            known: HashMap::new(),
            scope,
        }
    }

    async fn check(
        &mut self,
        engine: &EngineHandle,
        tenant: &TenantName,
    ) -> Result<bool, StoreError> {
        if !self.scope.may_write(tenant) {
            return Ok(false);
        }
        if let Some(known) = self.known.get(tenant) {
            return Ok(*known);
        }
        let known = engine.store().get_tenant(tenant).await?.is_some();
        self.known.insert(tenant.clone(), known);
        Ok(known)
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
