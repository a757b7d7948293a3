//! `/v1/tenants/{tenant}/events`: schedule, read, cancel, redrive, delete,
//! list and inspect events.
//!
//! Writes (`PUT`, batch `POST`) need the tenant to be registered; reads and
//! cancels do not, because events outlive a tenant's registration.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use belfry_core::auth::AuditAction;
use belfry_core::tenant::{MAX_AGE_MS, MAX_ATTEMPTS};
use belfry_core::{
    CommandOutcome, Debounce, DeliveryOption, EventCommand, EventId, EventKey, EventRecord,
    EventSettings, EventStatus, EventVersion, Precondition, QueueName, SinkConfig, TenantConfig,
    Timestamp,
};
use belfry_store::{KeyedCommand, ListEventsParams};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::ApiState;
use crate::answers::{AnswerBudget, Page};
use crate::auth::Principal;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::whole::Whole;
use crate::extract::{V1Json, V1Path, deserialize_naming_field, query_pairs};
use crate::openapi::schema::V1ErrorDetail;
use crate::pipeline::{Admitted, Checked, Outcome, Pipeline, QuotaMode, Tenants};
use crate::v1::views::{AttemptView, BackoffBody, Delivery, EventList, EventView};
use crate::v1::{event_id, event_key, tenant_name, tenant_not_found};

/// The path of the tenant's events (list, batch).
const EVENTS: &str = "/v1/tenants/{tenant}/events";
/// The path of one event (put, get, cancel).
const EVENT: &str = "/v1/tenants/{tenant}/events/{id}";

/// Most history entries answered for one event; retries are bounded by the
/// retry policy's backlog limit, so real histories stay far below this.
const MAX_ATTEMPTS_LISTED: usize = 10_000;

/// Body of `PUT /v1/tenants/{tenant}/events/{id}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "an event object")]
#[schema(example = json!({"deliver_at": "2030-01-31T04:00:30Z", "payload": "{\"orderId\":42}"}))]
pub(crate) struct PutEvent {
    /// RFC 3339 with an offset or `Z`. Exactly one of `deliver_at`,
    /// `delay_ms` and `debounce`.
    #[schema(format = DateTime)]
    deliver_at: Option<String>,
    /// Due this long (ms) after the node accepts the write.
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 31622400000_u64)]
    delay_ms: Option<Whole<u64>>,
    /// Due `delay_ms` after the node accepts the write, but never more
    /// than `max_wait_ms` after the first write of its pending series.
    debounce: Option<DebounceBody>,
    payload: Option<String>,
    /// Default `full_event`; `payload_only` needs `payload`.
    delivery: Option<Delivery>,
    /// Pull tenants: the named queue workers claim it from (default
    /// `default`); ignored for push tenants.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    queue: Option<String>,
    /// Attempts before the event fails (else its tenant's, else: pull 20,
    /// push until the node's backlog limit).
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    max_attempts: Option<Whole<u32>>,
    /// The back-off between attempts (else its tenant's, else the node's).
    backoff: Option<BackoffBody>,
    /// How long one attempt may take, in ms (else its HTTP tenant's
    /// `timeout_ms`, else the node's; within the node's cap).
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    attempt_timeout_ms: Option<Whole<u64>>,
    /// No attempt starts at or after this instant: the event ends
    /// `expired` (RFC 3339).
    #[schema(format = DateTime)]
    expire_at: Option<String>,
    /// No attempt starts this long (ms) or longer after `deliver_at`
    /// (else its tenant's `max_age_ms`): the event ends `expired`.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 31622400000_u64)]
    max_age_ms: Option<Whole<u64>>,
}

/// One item of a batch: the same as [`PutEvent`] plus its id.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "an event object")]
pub(crate) struct BatchItem {
    /// 1 to 500 bytes, no control characters.
    #[schema(
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    id: String,
    #[schema(format = DateTime)]
    deliver_at: Option<String>,
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 31622400000_u64)]
    delay_ms: Option<Whole<u64>>,
    debounce: Option<DebounceBody>,
    payload: Option<String>,
    delivery: Option<Delivery>,
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    queue: Option<String>,
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    max_attempts: Option<Whole<u32>>,
    backoff: Option<BackoffBody>,
    /// How long one attempt may take, in ms (else its HTTP tenant's
    /// `timeout_ms`, else the node's; within the node's cap).
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    attempt_timeout_ms: Option<Whole<u64>>,
    /// No attempt starts at or after this instant: the event ends
    /// `expired` (RFC 3339).
    #[schema(format = DateTime)]
    expire_at: Option<String>,
    /// No attempt starts this long (ms) or longer after `deliver_at`
    /// (else its tenant's `max_age_ms`): the event ends `expired`.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 31622400000_u64)]
    max_age_ms: Option<Whole<u64>>,
}

/// A debounced write: each one moves the event to `delay_ms` after it,
/// but never past `max_wait_ms` after the first write of the event's
/// pending series (`docs/api.md`, "Relative instants and debounce").
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "an object with delay_ms and max_wait_ms"
)]
pub(crate) struct DebounceBody {
    #[schema(value_type = u64, minimum = 0, maximum = 31622400000_u64)]
    delay_ms: Whole<u64>,
    /// At least `delay_ms`.
    #[schema(value_type = u64, minimum = 0, maximum = 31622400000_u64)]
    max_wait_ms: Whole<u64>,
}

/// The longest `delay_ms` or `max_wait_ms`: 366 days, as `max_age_ms`.
const MAX_DELAY_MS: u64 = MAX_AGE_MS;

/// When an event is due, as a write says it: exactly one of these.
#[derive(Debug, Default)]
pub(crate) struct When {
    pub deliver_at: Option<String>,
    pub delay_ms: Option<u64>,
    pub debounce: Option<DebounceBody>,
}

/// [`When`], checked.
enum Due {
    At(Timestamp),
    Debounced(Debounce),
}

impl When {
    /// Checks it; `now` is when the node accepts the write.
    fn due(self, now: Timestamp) -> Result<Due, ApiError> {
        let invalid = |message: String| ApiError::new(Code::InvalidRequest, message);
        let bounded = |field: &str, ms: u64| {
            if ms > MAX_DELAY_MS {
                Err(invalid(format!(
                    "{field} must be between 0 and {MAX_DELAY_MS} (366 days)"
                )))
            } else {
                Ok(ms)
            }
        };
        match (self.deliver_at, self.delay_ms, self.debounce) {
            (Some(text), None, None) => {
                Timestamp::parse_rfc3339(&text).map(Due::At).ok_or_else(|| {
                    ApiError::new(
                        Code::InvalidTime,
                        format!(
                            "deliver_at {text:?} is not an RFC 3339 instant with an offset \
                             (e.g. 2030-01-31T04:00:30Z)"
                        ),
                    )
                })
            }
            (None, Some(ms), None) => Ok(Due::At(
                now.plus(Duration::from_millis(bounded("delay_ms", ms)?)),
            )),
            (None, None, Some(body)) => {
                let delay_ms = bounded("debounce.delay_ms", body.delay_ms.get())?;
                let max_wait_ms = bounded("debounce.max_wait_ms", body.max_wait_ms.get())?;
                if max_wait_ms < delay_ms {
                    return Err(invalid(
                        "debounce.max_wait_ms must be at least debounce.delay_ms".into(),
                    ));
                }
                Ok(Due::Debounced(Debounce {
                    delay_ms,
                    max_wait_ms,
                }))
            }
            (None, None, None) => Err(invalid(
                "deliver_at is required (or delay_ms, or debounce)".into(),
            )),
            _ => Err(invalid(
                "deliver_at, delay_ms and debounce exclude each other: give one".into(),
            )),
        }
    }
}

/// An event's own settings as a request carries them: its delivery policy
/// (attempt cap, back-off, attempt timeout, expiry) and, for pull tenants'
/// workers (`docs/pull.md`), its named queue.
#[derive(Debug, Default)]
pub(crate) struct SettingsFields {
    pub queue: Option<String>,
    pub max_attempts: Option<u32>,
    pub backoff: Option<BackoffBody>,
    pub attempt_timeout_ms: Option<u64>,
    pub expire_at: Option<String>,
    pub max_age_ms: Option<u64>,
}

/// The longest attempt timeout an event may ask for: an hour (the node's
/// `sinks.http.max_tenant_timeout` caps it further).
const MAX_ATTEMPT_TIMEOUT_MS: u64 = 3_600_000;

impl SettingsFields {
    /// Validates them; an error names the field.
    pub(crate) fn settings(self) -> Result<EventSettings, ApiError> {
        let invalid = |message: String| ApiError::new(Code::InvalidRequest, message);
        let queue = self
            .queue
            .map(|name| QueueName::new(name).map_err(|e| invalid(format!("queue is invalid: {e}"))))
            .transpose()?
            // Stored as no queue: the same event either way.
            .filter(|queue| *queue != QueueName::default_queue());
        if let Some(max) = self.max_attempts
            && !(1..=MAX_ATTEMPTS).contains(&max)
        {
            return Err(invalid(format!(
                "max_attempts must be between 1 and {MAX_ATTEMPTS}"
            )));
        }
        let backoff = self
            .backoff
            .map(|body| body.into_backoff().map_err(|e| invalid(e.to_string())))
            .transpose()?;
        if let Some(ms) = self.attempt_timeout_ms
            && !(1..=MAX_ATTEMPT_TIMEOUT_MS).contains(&ms)
        {
            return Err(invalid(format!(
                "attempt_timeout_ms must be between 1 and {MAX_ATTEMPT_TIMEOUT_MS}"
            )));
        }
        if let Some(ms) = self.max_age_ms
            && !(1..=MAX_AGE_MS).contains(&ms)
        {
            return Err(invalid(format!(
                "max_age_ms must be between 1 and {MAX_AGE_MS} (366 days)"
            )));
        }
        let expire_at = self
            .expire_at
            .map(|text| {
                Timestamp::parse_rfc3339(&text).ok_or_else(|| {
                    ApiError::new(
                        Code::InvalidTime,
                        format!(
                            "expire_at {text:?} is not an RFC 3339 instant with an offset \
                             (e.g. 2030-01-31T04:00:30Z)"
                        ),
                    )
                })
            })
            .transpose()?;
        Ok(EventSettings {
            queue,
            max_attempts: self.max_attempts,
            backoff,
            attempt_timeout_ms: self.attempt_timeout_ms,
            expire_at,
            max_age_ms: self.max_age_ms,
        })
    }
}

/// Refuses settings naming a queue that `tenant`, a pull tenant with
/// declared queues, does not declare (`400 invalid_request` naming
/// `queue`). Push tenants ignore the settings.
///
/// # Errors
/// The queue is not declared.
pub(crate) fn admit_queue(tenant: &TenantConfig, pull: &EventSettings) -> Result<(), ApiError> {
    match &tenant.sink {
        SinkConfig::Pull(target) => target
            .check_queues("queue", pull.queue.iter())
            .map_err(|e| ApiError::new(Code::InvalidRequest, e.to_string())),
        _ => Ok(()),
    }
}

/// [`admit_queue`] for the settings an upsert carries.
///
/// # Errors
/// The queue is not declared.
pub(crate) fn admit_command(tenant: &TenantConfig, command: &EventCommand) -> Result<(), ApiError> {
    match command.unconditional() {
        EventCommand::Upsert { settings, .. } | EventCommand::DebouncedUpsert { settings, .. } => {
            admit_queue(tenant, settings)
        }
        _ => Ok(()),
    }
}

/// Body of `POST /v1/tenants/{tenant}/events`. Items are parsed one by one
/// so that one malformed item does not sink the others.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "an object with an events array")]
pub(crate) struct Batch {
    /// Items shaped like `BatchItem`, at most `api.max_batch` (default
    /// 10,000). Each is validated on its own: one that is malformed (even
    /// not an object) is answered `rejected` in `results`, and the others
    /// are stored.
    #[schema(value_type = Vec<Value>, max_items = 10000)]
    pub(crate) events: Vec<Value>,
}

/// What became of one item of a batch.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BatchOutcome {
    Created,
    Updated,
    /// Invalid; nothing stored.
    Rejected,
    /// The store failed it.
    Error,
}

/// One item's answer, in the request's order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchResult<'a> {
    /// `null` when the item had no string `id`.
    pub id: Option<&'a str>,
    pub outcome: BatchOutcome,
    /// The stored version (`created`, `updated`).
    pub version: Option<&'a str>,
    /// Why (`rejected`, `error`).
    pub error: Option<V1ErrorDetail>,
}

/// The answer to a batch.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchAnswer<'a> {
    pub results: Vec<BatchResult<'a>>,
    pub rejected: usize,
    pub failed: usize,
}

/// An event's delivery history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Attempts {
    pub attempts: Vec<AttemptView>,
}

fn event_not_found(key: &EventKey) -> V1Error {
    V1Error(ApiError::new(
        Code::EventNotFound,
        format!("no event {:?} for tenant {:?}", key.id, key.tenant),
    ))
}

/// Builds the upsert of one event, validating its fields; `now` is when
/// the node accepts it.
pub(crate) fn upsert(
    when: When,
    now: Timestamp,
    payload: Option<String>,
    delivery: Option<Delivery>,
    settings: SettingsFields,
) -> Result<EventCommand, ApiError> {
    let due = when.due(now)?;
    let delivery: DeliveryOption = delivery.unwrap_or_default().into();
    if delivery == DeliveryOption::PayloadOnly && payload.is_none() {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "payload is required when delivery is payload_only",
        ));
    }
    let settings = settings.settings()?;
    let new_version = EventVersion::generate();
    Ok(match due {
        Due::At(event_time) => EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            settings,
            new_version,
        },
        Due::Debounced(debounce) => EventCommand::DebouncedUpsert {
            debounce,
            payload,
            delivery,
            settings,
            new_version,
        },
    })
}

/// Applies one command and returns its result; an empty answer from the
/// store is a bug, logged and answered as a 500.
async fn apply_one(
    state: &ApiState,
    key: EventKey,
    command: EventCommand,
) -> Result<belfry_store::Applied, V1Error> {
    let commands = vec![KeyedCommand {
        key,
        command,
        fence: None,
    }];
    state
        .engine
        .quotas()
        .check(&commands)
        .await
        .map_err(crate::quota::quota_error)?;
    let applied = state.engine.apply(commands).await?;
    applied.into_iter().next().ok_or_else(|| {
        tracing::error!("store applied one command but returned no result");
        V1Error(ApiError::internal())
    })
}

fn record_view(applied: &belfry_store::Applied) -> Result<EventView<'_>, V1Error> {
    let mut view = applied.record.as_ref().map(EventView::from).ok_or_else(|| {
        tracing::error!(key = ?applied.key, outcome = ?applied.outcome, "applied command left no record");
        V1Error(ApiError::internal())
    })?;
    view.previous_delivery = applied.replaced.as_ref().map(|r| r.delivery.into());
    Ok(view)
}

/// The request's `If-Match`: `*` (the event exists), or entity tags, one
/// of which must be the event's version as `ETag` answers it (quotes
/// optional; a list, or several headers); `None` without one. A weak tag
/// (`W/"…"`) never matches (If-Match compares strongly), nor does anything
/// that is no tag: the write is then refused, never applied.
fn if_match(headers: &HeaderMap) -> Option<Precondition> {
    let mut values = headers.get_all(header::IF_MATCH).iter().peekable();
    values.peek()?;
    let mut versions = Vec::new();
    for value in values {
        for tag in String::from_utf8_lossy(value.as_bytes()).split(',') {
            let tag = tag.trim();
            if tag == "*" {
                return Some(Precondition::Exists);
            }
            if tag.is_empty() || tag.starts_with("W/") {
                continue;
            }
            let tag = tag
                .strip_prefix('"')
                .and_then(|t| t.strip_suffix('"'))
                .unwrap_or(tag);
            versions.push(EventVersion::from_string(tag.to_string()));
        }
    }
    Some(Precondition::Versions(versions))
}

/// `command`, applied only if `precondition` holds (when there is one).
fn conditional(precondition: Option<Precondition>, command: EventCommand) -> EventCommand {
    match precondition {
        Some(precondition) => EventCommand::IfMatch {
            precondition,
            command: Box::new(command),
        },
        None => command,
    }
}

/// The `412` of an `If-Match` that did not hold.
fn precondition_failed(key: &EventKey, current: Option<&EventVersion>) -> V1Error {
    let message = match current {
        Some(version) => format!(
            "If-Match does not match: the event's version is {:?}; nothing changed",
            version.as_str()
        ),
        None => format!(
            "If-Match does not match: no event {:?} for tenant {:?}; nothing changed",
            key.id, key.tenant
        ),
    };
    V1Error(ApiError::new(Code::PreconditionFailed, message))
}

/// The `ETag` of an event: its version, quoted.
fn etag(record: &EventRecord) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("\"{}\"", record.version.as_str())).ok()
}

/// `view` as JSON with `status` and, when known, the record's `ETag`.
fn with_etag(status: StatusCode, record: Option<&EventRecord>, view: EventView<'_>) -> Response {
    let mut response = (status, Json(view)).into_response();
    if let Some(value) = record.and_then(etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// Schedules (201) or updates (200) one event.
#[utoipa::path(
    put,
    path = EVENT,
    tag = "events",
    operation_id = "put_event",
    summary = "Schedule (201) or update (200) one event",
    params(
        crate::openapi::schema::TenantPath,
        crate::openapi::schema::EventIdPath,
        crate::openapi::schema::IfMatchHeader
    ),
    request_body(content = PutEvent, content_type = "application/json"),
    responses(
        (status = 201, description = "Scheduled", body = EventView,
            headers(("ETag" = String, description = "The event's version, quoted"))),
        (status = 200, description = "Updated (moved when deliver_at changed; then with \
            `previous_delivery`)", body = EventView,
            headers(("ETag" = String, description = "The event's version, quoted"))),
        (status = 412, description = "If-Match does not match the event's version (or the \
            event does not exist): nothing changed", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn put(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path((tenant, id)): V1Path<(String, String)>,
    headers: HeaderMap,
    V1Json(body): V1Json<PutEvent>,
) -> Result<Response, V1Error> {
    let key = event_key(tenant, id)?;
    let precondition = if_match(&headers);
    let settings = SettingsFields {
        queue: body.queue,
        max_attempts: body.max_attempts.map(Whole::get),
        backoff: body.backoff,
        attempt_timeout_ms: body.attempt_timeout_ms.map(Whole::get),
        expire_at: body.expire_at,
        max_age_ms: body.max_age_ms.map(Whole::get),
    };
    let when = When {
        deliver_at: body.deliver_at,
        delay_ms: body.delay_ms.map(Whole::get),
        debounce: body.debounce,
    };
    let command = conditional(
        precondition,
        upsert(
            when,
            state.engine.now(),
            body.payload,
            body.delivery,
            settings,
        )?,
    );
    let mut pipeline = Pipeline::new(&state.engine, &Admitted);
    let checked = admit_write(&mut pipeline.tenants, (), key.clone(), command).await;
    pipeline.push(checked);
    let written = pipeline
        .write(QuotaMode::WholeRequest)
        .await
        .map_err(crate::quota::quota_error)?;
    match written.outcomes.into_iter().next() {
        Some(Outcome::Applied { mut applied, .. }) => {
            let status = match &applied.outcome {
                CommandOutcome::Created => StatusCode::CREATED,
                CommandOutcome::PreconditionFailed { current } => {
                    return Err(precondition_failed(&key, current.as_ref()));
                }
                _ => StatusCode::OK,
            };
            super::previous::settle(&state, &principal, &mut applied).await;
            let view = record_view(&applied)?;
            Ok(with_etag(status, applied.record.as_ref(), view))
        }
        Some(Outcome::Rejected { error, .. }) => Err(V1Error(error)),
        Some(Outcome::StoreFailed { error, .. }) => Err(error.into()),
        Some(Outcome::Unchanged(())) | None => {
            tracing::error!("the write pipeline left an event write without a result");
            Err(V1Error(ApiError::internal()))
        }
    }
}

/// Checks that `key`'s tenant is registered and admits `command`'s
/// settings (`404`, `400` otherwise): the last checks of a `/v1` write.
async fn admit_write<E>(
    tenants: &mut Tenants<'_>,
    echo: E,
    key: EventKey,
    command: EventCommand,
) -> Checked<E> {
    let admitted = match tenants.registered(&key.tenant).await {
        Ok(Some(config)) => admit_command(config, &command),
        Ok(None) => Err(tenant_not_found(&key.tenant).0),
        Err(error) => return Checked::StoreFailed { echo, error },
    };
    match admitted {
        Ok(()) => Checked::Write {
            echo,
            command: Box::new(KeyedCommand {
                key,
                command,
                fence: None,
            }),
        },
        Err(error) => Checked::Rejected { echo, error },
    }
}

#[utoipa::path(
    get,
    path = EVENT,
    tag = "events",
    operation_id = "get_event",
    summary = "An event's status",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::EventIdPath),
    responses(
        (status = 200, description = "The event", body = EventView,
            headers(("ETag" = String, description = "The event's version, quoted: \
                `If-Match` takes it"))),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let key = event_key(tenant, id)?;
    match state.engine.store().get_event(&key).await? {
        Some(record) => Ok(with_etag(
            StatusCode::OK,
            Some(&record),
            EventView::from(&record),
        )),
        None => Err(event_not_found(&key)),
    }
}

/// Cancels a pending event: 200 with its view (and `previous_delivery`),
/// 404 if unknown (or already cancelled), 409 if it already finished, 412
/// if `If-Match` does not hold.
#[utoipa::path(
    delete,
    path = EVENT,
    tag = "events",
    operation_id = "cancel_event",
    summary = "Cancel a pending event",
    params(
        crate::openapi::schema::TenantPath,
        crate::openapi::schema::EventIdPath,
        crate::openapi::schema::IfMatchHeader
    ),
    responses(
        (status = 200, description = "Cancelled, with `previous_delivery`", body = EventView),
        (status = 409, description = "Already finished", body = crate::openapi::schema::V1Error),
        (status = 412, description = "If-Match does not match the event's version (or the \
            event does not exist): nothing changed", body = crate::openapi::schema::V1Error),
        (status = 415, description = "Not JSON", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path((tenant, id)): V1Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, V1Error> {
    let key = event_key(tenant, id)?;
    let command = conditional(if_match(&headers), EventCommand::Cancel);
    let mut applied = apply_one(&state, key.clone(), command).await?;
    match &applied.outcome {
        CommandOutcome::Cancelled => {
            super::previous::settle(&state, &principal, &mut applied).await;
            Ok(Json(record_view(&applied)?).into_response())
        }
        CommandOutcome::PreconditionFailed { current } => {
            Err(precondition_failed(&key, current.as_ref()))
        }
        CommandOutcome::AlreadyFinished(status) => Err(V1Error(ApiError::new(
            Code::AlreadyFinished,
            format!(
                "the event already finished with status {}; POST .../delete removes it",
                status.as_str()
            ),
        ))),
        _ => Err(event_not_found(&key)),
    }
}

/// Sends a dead event again (`POST .../events/{id}/redrive`): a `failed`
/// or `missed` event becomes pending, due now, as a new version with a new
/// attempt series. 200 with its view; 409 `not_redrivable` for any other
/// status; 404 if unknown. Recorded in the audit log with who did it.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/events/{id}/redrive",
    tag = "events",
    operation_id = "redrive_event",
    summary = "Send a failed or missed event again, now, as a new version",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::EventIdPath),
    responses(
        (status = 200, description = "Pending again, due now", body = EventView),
        (status = 409, description = "Not failed or missed", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1EventActionErrors
    )
)]
pub(crate) async fn redrive(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let key = event_key(tenant, id)?;
    let command = EventCommand::Redrive {
        new_version: EventVersion::generate(),
    };
    let applied = apply_one(&state, key.clone(), command).await?;
    match applied.outcome {
        CommandOutcome::Redriven => {
            audit_event(&state, &principal, AuditAction::EventRedriven, &key).await;
            Ok(Json(record_view(&applied)?).into_response())
        }
        CommandOutcome::NotRedrivable(status) => Err(V1Error(ApiError::new(
            Code::NotRedrivable,
            format!(
                "only failed or missed events can be redriven; this one is {}",
                status.as_str()
            ),
        ))),
        _ => Err(event_not_found(&key)),
    }
}

/// Records `action` on `key` in the audit log, with who did it.
async fn audit_event(state: &ApiState, principal: &Principal, action: AuditAction, key: &EventKey) {
    let target = Some(key.id.as_str().to_string());
    crate::auth::routes::audit(state, principal, action, Some(&key.tenant), target).await;
}

/// Deletes a finished event (`POST .../events/{id}/delete`) with its
/// attempt history, as the retention sweep would: 204. 409
/// `event_pending` while it is scheduled or retrying (cancel it first);
/// 404 if unknown. The id can then be scheduled again as a new event.
/// Recorded in the audit log with who did it.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/events/{id}/delete",
    tag = "events",
    operation_id = "delete_event",
    summary = "Delete a finished event and its history",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::EventIdPath),
    responses(
        (status = 204, description = "Deleted"),
        (status = 409, description = "Still pending: cancel it first", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1EventActionErrors
    )
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let key = event_key(tenant, id)?;
    let store = state.engine.store();
    if store.delete_finished(std::slice::from_ref(&key)).await? == [true] {
        audit_event(&state, &principal, AuditAction::EventDeleted, &key).await;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // Not deleted: say why (it may have changed since; either answer was
    // true at some instant during the request).
    match store.get_event(&key).await? {
        Some(record) if record.status.is_pending() => Err(V1Error(ApiError::new(
            Code::EventPending,
            format!(
                "the event is still {}; cancel it first (DELETE on the event)",
                record.status.as_str()
            ),
        ))),
        _ => Err(event_not_found(&key)),
    }
}

/// Schedules many events of one tenant. Invalid items are rejected one by
/// one; the valid ones are applied in one durable batch. When the store
/// fails only part of the batch (the embedded store commits it in
/// independent parts), the stored items are answered as such and the others
/// as `error`; when it fails all of it, the request fails as a whole.
#[utoipa::path(
    post,
    path = EVENTS,
    tag = "events",
    operation_id = "schedule_events",
    summary = "Schedule many events; each item answered on its own",
    params(crate::openapi::schema::TenantPath),
    request_body(content = Batch, content_type = "application/json"),
    responses(
        (status = 200, description = "Per-item results in input order", body = BatchAnswer),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn batch(
    State(state): State<ApiState>,
    V1Path(tenant): V1Path<String>,
    V1Json(body): V1Json<Batch>,
) -> Result<Response, V1Error> {
    let tenant = tenant_name(tenant)?;
    if body.events.len() > state.options.max_batch {
        return Err(V1Error(ApiError::new(
            Code::BatchTooLarge,
            format!(
                "too many events in one request: {} (at most {})",
                body.events.len(),
                state.options.max_batch
            ),
        )));
    }
    let mut pipeline = Pipeline::new(&state.engine, &Admitted);
    // Refused as a whole when unknown, before any item.
    if pipeline.tenants.registered(&tenant).await?.is_none() {
        return Err(tenant_not_found(&tenant));
    }
    // The batch's acceptance: the instant its delays count from.
    let now = state.engine.now();
    for value in body.events {
        // Echoed on the item's answer when it is readable.
        let id_text = value.get("id").and_then(Value::as_str).map(str::to_string);
        let parsed = deserialize_naming_field::<BatchItem, _>(value)
            .map_err(|e| ApiError::new(Code::InvalidRequest, e))
            .and_then(|item| {
                let id = event_id(item.id)?;
                let settings = SettingsFields {
                    queue: item.queue,
                    max_attempts: item.max_attempts.map(Whole::get),
                    backoff: item.backoff,
                    attempt_timeout_ms: item.attempt_timeout_ms.map(Whole::get),
                    expire_at: item.expire_at,
                    max_age_ms: item.max_age_ms.map(Whole::get),
                };
                let when = When {
                    deliver_at: item.deliver_at,
                    delay_ms: item.delay_ms.map(Whole::get),
                    debounce: item.debounce,
                };
                let command = upsert(when, now, item.payload, item.delivery, settings)?;
                Ok((id, command))
            });
        let checked = match parsed {
            Ok((id, command)) => {
                let key = EventKey::new(tenant.clone(), id);
                admit_write(&mut pipeline.tenants, id_text, key, command).await
            }
            Err(error) => Checked::Rejected {
                echo: id_text,
                error,
            },
        };
        pipeline.push(checked);
    }
    let written = pipeline
        .write(QuotaMode::WholeRequest)
        .await
        .map_err(crate::quota::quota_error)?;
    match &written.store_failure {
        // Nothing was stored: the request fails as a whole.
        Some(failure) if !failure.per_command => return Err(failure.error.clone().into()),
        // Logged once here, not once per failed item.
        Some(failure) => {
            tracing::error!(error = %failure.error, "part of a batch failed in the store");
        }
        None => {}
    }

    let mut rejected = 0usize;
    let mut failed = 0usize;
    fn refused<'a>(
        id: &'a Option<String>,
        outcome: BatchOutcome,
        error: &ApiError,
    ) -> BatchResult<'a> {
        BatchResult {
            id: id.as_deref(),
            outcome,
            version: None,
            error: Some(V1ErrorDetail {
                code: error.code.as_str().to_string(),
                message: error.message.clone(),
            }),
        }
    }
    let results: Vec<BatchResult<'_>> = written
        .outcomes
        .iter()
        .map(|outcome| match outcome {
            Outcome::Applied { applied, .. } => BatchResult {
                id: Some(applied.key.id.as_str()),
                outcome: match applied.outcome {
                    CommandOutcome::Created => BatchOutcome::Created,
                    _ => BatchOutcome::Updated,
                },
                version: applied.record.as_ref().map(|r| r.version.as_str()),
                error: None,
            },
            Outcome::StoreFailed { echo: id, error } => {
                failed += 1;
                refused(id, BatchOutcome::Error, &ApiError::for_store(error))
            }
            Outcome::Unchanged(id) => {
                failed += 1;
                tracing::error!("the write pipeline left a batch item without a result");
                refused(id, BatchOutcome::Error, &ApiError::internal())
            }
            Outcome::Rejected { echo: id, error } => {
                rejected += 1;
                refused(id, BatchOutcome::Rejected, error)
            }
        })
        .collect();
    let answer = BatchAnswer {
        results,
        rejected,
        failed,
    };
    Ok(Json(answer).into_response())
}

/// Query of the event list.
struct ListQuery {
    status: Option<EventStatus>,
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    limit: usize,
    after: Option<ListCursor>,
}

impl ListQuery {
    /// Any filter orders the list by `(deliver_at, id)`; without one it is
    /// by id (see [`belfry_store::ListEventsParams`]).
    fn time_ordered(&self) -> bool {
        self.status.is_some() || self.from.is_some() || self.to.is_some()
    }
}

/// Where the previous page ended: its last id, and in a filtered (time
/// ordered) list its last instant too.
#[derive(Debug, PartialEq, Eq)]
struct ListCursor {
    at: Option<Timestamp>,
    id: EventId,
}

/// A `status` of the listing's filter (and of a bulk action's); refused
/// with `code`.
pub(crate) fn parse_status(value: &str, code: Code) -> Result<EventStatus, ApiError> {
    EventStatus::parse(value).ok_or_else(|| {
        ApiError::new(
            code,
            format!(
                "unknown status {value:?}; expected scheduled, retrying, delivered, failed, \
                 missed, cancelled or expired"
            ),
        )
    })
}

/// A `from` or `to` of the listing's filter (and of a bulk action's).
pub(crate) fn parse_instant(name: &str, value: &str) -> Result<Timestamp, ApiError> {
    Timestamp::parse_rfc3339(value).ok_or_else(|| {
        ApiError::new(
            Code::InvalidTime,
            format!("{name} {value:?} is not an RFC 3339 instant with an offset"),
        )
    })
}

/// The `limit` of a listing: 1 to `api.max_list_limit`.
pub(crate) fn parse_limit(value: &str, state: &ApiState) -> Result<usize, ApiError> {
    let max = state.options.max_list_limit;
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::new(
                Code::InvalidQuery,
                format!("limit must be a whole number from 1 to {max}"),
            )
        })
}

fn parse_list_query(uri: &Uri, state: &ApiState) -> Result<ListQuery, ApiError> {
    let invalid = |message: String| ApiError::new(Code::InvalidQuery, message);
    let mut query = ListQuery {
        status: None,
        from: None,
        to: None,
        limit: state.options.default_list_limit,
        after: None,
    };
    for (name, value) in query_pairs(uri)? {
        match name.as_str() {
            "status" => query.status = Some(parse_status(&value, Code::InvalidQuery)?),
            "from" => query.from = Some(parse_instant("from", &value)?),
            "to" => query.to = Some(parse_instant("to", &value)?),
            "limit" => query.limit = parse_limit(&value, state)?,
            "cursor" => {
                query.after = Some(decode_list_cursor(&value).ok_or_else(|| {
                    ApiError::new(Code::InvalidCursor, "cursor is not one this server issued")
                })?);
            }
            other => {
                return Err(invalid(format!(
                    "unknown query parameter {other:?}; expected status, from, to, limit or cursor"
                )));
            }
        }
    }
    Ok(query)
}

/// Lists a tenant's events: `{"events": [...], "next_cursor": ...}`, by id,
/// or by `(deliver_at, id)` when filtered (`status`, `from`, `to`).
///
/// Every page is answered from a store index and holds `limit` events, or
/// fewer when their views would pass `api.max_answer_bytes` (at least
/// one), whenever more exist; `next_cursor` is `null` exactly on the last
/// page.
/// Schedules' control events are the engine's, never listed: the store
/// leaves them out of filtered listings, and an unfiltered (id-ordered)
/// listing starts after them (their ids sort before every client id).
#[utoipa::path(
    get,
    path = EVENTS,
    tag = "events",
    operation_id = "list_events",
    summary = "A page of a tenant's events",
    params(crate::openapi::schema::TenantPath, ("status" = Option<String>, Query, pattern = "^(scheduled|retrying|delivered|failed|missed|cancelled|expired)$", description = "scheduled, retrying, delivered, failed, missed, cancelled or expired"), ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339, inclusive bound of deliver_at"), ("to" = Option<String>, Query, format = DateTime, description = "RFC 3339, exclusive bound of deliver_at"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1 to `api.max_list_limit` (default 1,000); default `api.default_list_limit` (100)"), ("cursor" = Option<String>, Query, pattern = "^(?:t[0-9a-fA-F]{16})?(?:[2-6][0-9a-fA-F]|7[0-9a-eA-E]){1,500}$", description = "next_cursor of the previous page (a cursor only this server issues: any other is refused)")),
    responses(
        (status = 200, description = "A page", body = EventList),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    Extension(budget): Extension<AnswerBudget>,
    V1Path(tenant): V1Path<String>,
    uri: Uri,
) -> Result<Response, V1Error> {
    let tenant = tenant_name(tenant)?;
    let query = parse_list_query(&uri, &state)?;
    let limit = query.limit;
    let time_ordered = query.time_ordered();
    let (from, after) = match query.after {
        // Continue at the last page's instant: the place holds even if
        // that event has been purged since.
        Some(ListCursor { at: Some(at), id }) if time_ordered => {
            (Some(query.from.map_or(at, |from| from.max(at))), Some(id))
        }
        // An id cursor (of an unfiltered list, or issued before filtered
        // lists were ordered by time): the store finds the place from that
        // event's instant.
        Some(ListCursor { id, .. }) => (query.from, Some(id)),
        None => (query.from, None),
    };
    let after = if !time_ordered {
        Some(
            after
                .filter(|id| !id.is_internal())
                .unwrap_or_else(after_internal_ids),
        )
    } else {
        after
    };
    let reservation = match budget.reserve().await {
        Ok(reservation) => reservation,
        Err(busy) => return Ok(busy),
    };
    let mut page = Page::<EventList>::new(budget.per_answer()).up_to(limit);
    let mut last: Option<(Timestamp, EventId)> = None;
    let mut position = (from, after);
    let store = state.engine.store();
    let more = page
        .fill(
            &mut position,
            |(from, after), read| {
                let params = ListEventsParams {
                    tenant: tenant.clone(),
                    status: query.status,
                    from,
                    to: query.to,
                    after,
                    limit: read,
                };
                async move { Ok(store.list_events(params).await?) }
            },
            |page, record, position| {
                // A guard only: no listing returns control events.
                if !record.key.id.is_internal() {
                    if !page.push(&EventView::from(record))? {
                        return Ok(false);
                    }
                    last = Some((record.event_time, record.key.id.clone()));
                }
                let from = if time_ordered {
                    Some(
                        query
                            .from
                            .map_or(record.event_time, |f| f.max(record.event_time)),
                    )
                } else {
                    query.from
                };
                *position = (from, Some(record.key.id.clone()));
                Ok(true)
            },
        )
        .await?;
    let next_cursor = match &last {
        Some((at, id)) if more && time_ordered => Some(encode_time_cursor(*at, id)),
        Some((_, id)) if more => Some(encode_cursor(id)),
        _ => None,
    };
    Ok(reservation.answer(page.finish(next_cursor.as_deref())))
}

/// An event's delivery history, oldest first.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}/events/{id}/attempts",
    tag = "events",
    operation_id = "list_attempts",
    summary = "An event's delivery history, oldest first",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::EventIdPath),
    responses(
        (status = 200, description = "The attempts", body = Attempts),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn attempts(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let key = event_key(tenant, id)?;
    let store = state.engine.store();
    if store.get_event(&key).await?.is_none() {
        return Err(event_not_found(&key));
    }
    let history = store.attempts(&key, MAX_ATTEMPTS_LISTED).await?;
    let attempts = history.iter().map(AttemptView::from).collect();
    Ok(Json(Attempts { attempts }).into_response())
}

/// Cursors are the last id of a page, hex-encoded: opaque to clients, safe
/// in a query string without further escaping.
pub(crate) fn encode_cursor(id: &EventId) -> String {
    id.as_str().bytes().map(|b| format!("{b:02x}")).collect()
}

/// A cursor of a filtered list: `t`, the instant (16 hex digits of its
/// milliseconds as two's complement), then the id as in [`encode_cursor`].
/// `t` is no hex digit, so the two kinds never mix up.
fn encode_time_cursor(at: Timestamp, id: &EventId) -> String {
    format!("t{:016x}{}", at.as_millis() as u64, encode_cursor(id))
}

fn decode_list_cursor(text: &str) -> Option<ListCursor> {
    match text.strip_prefix('t') {
        Some(rest) => {
            let millis = u64::from_str_radix(rest.get(..16)?, 16).ok()? as i64;
            Some(ListCursor {
                at: Some(Timestamp::from_millis(millis)),
                id: decode_cursor(rest.get(16..)?)?,
            })
        }
        None => Some(ListCursor {
            at: None,
            id: decode_cursor(text)?,
        }),
    }
}

/// An exclusive `after` that sorts after every engine-internal id and
/// before every client id: the internal mark followed by more of the
/// largest character than any id has bytes.
fn after_internal_ids() -> EventId {
    EventId::internal_cursor(&char::MAX.to_string().repeat(EventId::MAX_LEN / 4 + 1))
}

pub(crate) fn decode_cursor(text: &str) -> Option<EventId> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect();
    EventId::new(String::from_utf8(bytes?).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_junk() {
        let id = EventId::new("a/b c é").unwrap();
        assert_eq!(decode_cursor(&encode_cursor(&id)), Some(id));
        assert_eq!(decode_cursor("zz"), None);
        assert_eq!(decode_cursor("abc"), None);
        assert_eq!(decode_cursor(""), None);
        assert_eq!(decode_cursor("é1"), None);
    }

    #[test]
    fn time_cursors_round_trip_and_id_cursors_still_decode() {
        let id = EventId::new("a/b c é").unwrap();
        for millis in [0, 1_700_000_000_123, -5, i64::MIN, i64::MAX] {
            let at = Timestamp::from_millis(millis);
            assert_eq!(
                decode_list_cursor(&encode_time_cursor(at, &id)),
                Some(ListCursor {
                    at: Some(at),
                    id: id.clone()
                })
            );
        }
        assert_eq!(
            decode_list_cursor(&encode_cursor(&id)),
            Some(ListCursor {
                at: None,
                id: id.clone()
            })
        );
        assert_eq!(decode_list_cursor("t00"), None);
        assert_eq!(decode_list_cursor("t0000000000000000"), None);
        assert_eq!(decode_list_cursor("tzz00000000000000aa"), None);
        assert_eq!(decode_list_cursor("zz"), None);
    }

    #[test]
    fn unfiltered_lists_start_after_every_internal_id() {
        let start = after_internal_ids();
        let longest_rest = char::MAX.to_string().repeat(124) + "\u{FFFF}";
        for rest in ["schedule/x", "\u{10FFFF}", longest_rest.as_str()] {
            assert!(EventId::internal(rest).unwrap() < start, "{rest:?}");
        }
        for client in [" ", "a", "\u{10FFFF}"] {
            assert!(start < EventId::new(client).unwrap(), "{client:?}");
        }
    }
}
