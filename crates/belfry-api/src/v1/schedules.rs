//! `/v1/tenants/{tenant}/schedules`: recurring schedules, and
//! `/v1/cron/preview`.
//!
//! A schedule's occurrences are ordinary events of its tenant named
//! `"{schedule}@{instant}"`; `.../occurrences` lists them with their status.
//! The engine does the work ([`belfry_engine::schedules`]); this file
//! validates input and shapes answers. Bad expressions and zones are `400
//! invalid_cron` with the parser's message.

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use belfry_core::schedule::{
    DEFAULT_CATCH_UP_WINDOW, MissedSummary, Progress, ScheduleError, local_time,
};
use belfry_core::{
    CronKind, CronSpec, DeliveryOption, EventId, EventSettings, MisfirePolicy, Schedule,
    ScheduleId, ScheduleStatus, TenantName, Timestamp,
};
use belfry_engine::schedules::{PutOutcome, ScheduleOpError, ScheduleState};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ApiState;
use crate::answers::{AnswerBudget, Listing, Page};
use crate::error::{ApiError, Code, V1Error};
use crate::extract::whole::Whole;
use crate::extract::{V1Json, V1Path, query_pairs};
use crate::v1::events::{
    SettingsFields, admit_queue, decode_cursor, encode_cursor, parse_instant, parse_limit,
};
use crate::v1::views::{BackoffBody, Delivery};
use crate::v1::{tenant_name, tenant_not_found};

/// The path of one schedule (put, get, delete).
const SCHEDULE: &str = "/v1/tenants/{tenant}/schedules/{id}";

/// Most occurrences a preview computes.
const MAX_PREVIEW: usize = 1_000;
/// Occurrences a preview computes when `count` is not given.
const DEFAULT_PREVIEW: usize = 10;

/// The misfire policy on the wire: `{"policy": "fire_once"}`,
/// `{"policy": "fire_all", "cap": 10}`, `{"policy": "skip"}`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(
    rename_all = "snake_case",
    tag = "policy",
    deny_unknown_fields,
    expecting = "a misfire object: {\"policy\": \"fire_once\" | \"fire_all\" | \"skip\"}"
)]
pub(crate) enum Misfire {
    FireOnce,
    FireAll {
        /// Most missed occurrences fired at once.
        #[serde(deserialize_with = "crate::extract::whole::u32")]
        #[schema(minimum = 1, maximum = 1000)]
        cap: u32,
    },
    Skip,
}

impl From<Misfire> for MisfirePolicy {
    fn from(value: Misfire) -> Self {
        match value {
            Misfire::FireOnce => MisfirePolicy::FireOnce,
            Misfire::FireAll { cap } => MisfirePolicy::FireAll { cap },
            Misfire::Skip => MisfirePolicy::Skip,
        }
    }
}

impl From<MisfirePolicy> for Misfire {
    fn from(value: MisfirePolicy) -> Self {
        match value {
            MisfirePolicy::FireOnce => Misfire::FireOnce,
            MisfirePolicy::FireAll { cap } => Misfire::FireAll { cap },
            MisfirePolicy::Skip => Misfire::Skip,
        }
    }
}

/// Body of `PUT /v1/tenants/{tenant}/schedules/{id}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a schedule object")]
#[schema(example = json!({"expression": "30 2 * * *", "time_zone": "Europe/Berlin", "payload": "report"}))]
pub(crate) struct PutSchedule {
    /// A cron expression of `type`, a macro (`@daily`) or `@every 5m`.
    expression: String,
    /// `unix` (default), `quartz`, `spring`, `cron4j` or `every` (alias
    /// `interval`), in any case.
    #[serde(rename = "type")]
    #[schema(
        pattern = "^\\s*(?:[Uu][Nn][Ii][Xx]|[Qq][Uu][Aa][Rr][Tt][Zz]|[Ss][Pp][Rr][Ii][Nn][Gg]|[Cc][Rr][Oo][Nn]4[Jj]|[Ee][Vv][Ee][Rr][Yy]|[Ii][Nn][Tt][Ee][Rr][Vv][Aa][Ll])\\s*$"
    )]
    kind: Option<String>,
    /// An IANA zone (default `UTC`).
    time_zone: Option<String>,
    payload: Option<String>,
    delivery: Option<Delivery>,
    #[schema(format = DateTime)]
    start_at: Option<String>,
    #[schema(format = DateTime)]
    end_at: Option<String>,
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 18446744073709551615.0)]
    max_occurrences: Option<Whole<u64>>,
    misfire: Option<Misfire>,
    #[schema(value_type = Option<u64>, maximum = 18446744073709551615.0)]
    catch_up_window_ms: Option<Whole<u64>>,
    /// Pull tenants: the queue of its occurrences (default `default`).
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    queue: Option<String>,
    /// Its occurrences' attempt cap (else the tenant's, else the node's).
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    max_attempts: Option<Whole<u32>>,
    /// Its occurrences' back-off (else the tenant's, else the node's).
    backoff: Option<BackoffBody>,
    /// How long one attempt of an occurrence may take, in ms (else its
    /// HTTP tenant's `timeout_ms`, else the node's; within the node's cap).
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    attempt_timeout_ms: Option<Whole<u64>>,
    /// No attempt of an occurrence starts this long or longer after the
    /// occurrence's instant (else its tenant's `max_age_ms`): the
    /// occurrence ends `expired`.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 31622400000_u64)]
    max_age_ms: Option<Whole<u64>>,
}

/// Everything a schedule definition is built from, whichever API it came
/// through.
pub(crate) struct Definition {
    pub expression: String,
    pub kind: Option<String>,
    pub time_zone: Option<String>,
    pub payload: Option<String>,
    pub delivery: DeliveryOption,
    pub start_at: Option<String>,
    pub end_at: Option<String>,
    pub max_occurrences: Option<u64>,
    pub misfire: MisfirePolicy,
    pub catch_up_window: Duration,
    /// Its occurrences' delivery settings (and a pull tenant's queue).
    pub settings: EventSettings,
}

impl Definition {
    /// The schedule to hand to the engine (status and progress are set
    /// there).
    ///
    /// # Errors
    /// An unparseable instant or an unknown type (400).
    pub(crate) fn into_schedule(self, id: ScheduleId) -> Result<Schedule, ApiError> {
        let kind: CronKind = self
            .kind
            .as_deref()
            .unwrap_or("UNIX")
            .parse()
            .map_err(cron_error)?;
        let start_at = instant("start_at", self.start_at.as_deref())?;
        let end_at = instant("end_at", self.end_at.as_deref())?;
        let zero = Timestamp::from_millis(0);
        Ok(Schedule {
            id,
            expression: self.expression,
            kind: kind.as_str().to_string(),
            time_zone: self
                .time_zone
                .filter(|zone| !zone.trim().is_empty())
                .unwrap_or_else(|| "UTC".to_string()),
            payload: self.payload,
            delivery: self.delivery,
            start_at,
            end_at,
            max_occurrences: self.max_occurrences,
            misfire: self.misfire,
            catch_up_window: self.catch_up_window,
            status: ScheduleStatus::Active,
            created_at: zero,
            updated_at: zero,
            progress: Progress::starting_after(zero),
            settings: self.settings,
        })
    }
}

fn instant(name: &str, text: Option<&str>) -> Result<Option<Timestamp>, ApiError> {
    text.map(|value| parse_instant(name, value)).transpose()
}

pub(crate) fn cron_error(error: impl std::fmt::Display) -> ApiError {
    ApiError::new(Code::InvalidCron, error.to_string())
}

/// Maps an engine error: invalid definitions are 400, unknown schedules
/// 404, store failures 503/500.
pub(crate) fn op_error(error: ScheduleOpError) -> ApiError {
    match error {
        ScheduleOpError::Invalid(ScheduleError::Cron(cron)) => cron_error(cron),
        ScheduleOpError::Invalid(other) => ApiError::new(Code::InvalidSchedule, other.to_string()),
        ScheduleOpError::NotFound(id) => schedule_not_found(id.as_str()),
        ScheduleOpError::Store(store) => ApiError::from_store(&store),
        ScheduleOpError::Quota(exceeded) => crate::quota::exceeded_error(&exceeded),
    }
}

pub(crate) fn schedule_not_found(id: &str) -> ApiError {
    ApiError::new(Code::ScheduleNotFound, format!("no schedule {id:?}"))
}

pub(crate) fn schedule_id(text: String) -> Result<ScheduleId, ApiError> {
    ScheduleId::new(text).map_err(|e| ApiError::new(Code::InvalidName, e.to_string()))
}

/// The checked tenant and id of a schedule's path.
fn schedule_path(tenant: String, id: String) -> Result<(TenantName, ScheduleId), V1Error> {
    Ok((tenant_name(tenant)?, schedule_id(id)?))
}

/// Missed occurrences beyond the per-firing recording cap.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MissedView {
    /// Stored one by one as occurrences in status `missed`.
    recorded: u64,
    /// Only counted here.
    summarized: u64,
    first_summarized: Option<String>,
    last_summarized: Option<String>,
    /// Not created: the tenant's schedules had used their budget of
    /// occurrences per minute. Only counted here.
    over_budget: u64,
}

impl From<MissedSummary> for MissedView {
    fn from(value: MissedSummary) -> Self {
        MissedView {
            recorded: value.recorded,
            summarized: value.summarized,
            first_summarized: value.first_summarized.map(Timestamp::to_rfc3339),
            last_summarized: value.last_summarized.map(Timestamp::to_rfc3339),
            over_budget: value.over_budget,
        }
    }
}

/// A schedule as `/v1` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ScheduleView {
    pub tenant: String,
    pub id: String,
    pub expression: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub time_zone: String,
    pub description: Option<String>,
    /// `active`, `paused`, `completed` (`deleted` in a delete's answer).
    pub status: &'static str,
    pub next_occurrence: Option<String>,
    pub next_occurrence_local: Option<String>,
    pub payload: Option<String>,
    pub delivery: Delivery,
    pub start_at: Option<String>,
    pub end_at: Option<String>,
    pub max_occurrences: Option<u64>,
    pub misfire: Misfire,
    pub catch_up_window_ms: u64,
    /// Given to its occurrences, shown when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BackoffBody>, nullable = false)]
    pub backoff: Option<belfry_core::Backoff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub attempt_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_age_ms: Option<u64>,
    /// Occurrences handled so far (created or recorded as missed).
    pub occurrences: u64,
    pub last_occurrence: Option<String>,
    pub missed: MissedView,
    pub created_at: String,
    pub updated_at: String,
    /// Why the schedule stopped, if it stopped abnormally.
    pub error: Option<String>,
}

/// A page of a tenant's schedules, by id.
pub(crate) struct ScheduleList;

impl Listing for ScheduleList {
    const KEY: &'static str = "schedules";
    type Item<'a> = ScheduleView;
}
crate::openapi::schema::list_page!(ScheduleList, "A page of schedules");

impl From<&ScheduleState> for ScheduleView {
    fn from(state: &ScheduleState) -> Self {
        let schedule = &state.schedule;
        let spec = schedule.spec().ok();
        ScheduleView {
            tenant: state.tenant.as_str().to_string(),
            id: schedule.id.as_str().to_string(),
            expression: schedule.expression.clone(),
            kind: schedule.kind.clone(),
            time_zone: schedule.time_zone.clone(),
            description: spec.as_ref().map(CronSpec::describe),
            status: schedule.status.as_str(),
            next_occurrence: state.next_occurrence.map(Timestamp::to_rfc3339),
            next_occurrence_local: spec
                .as_ref()
                .zip(state.next_occurrence)
                .map(|(spec, at)| local_time(spec, at)),
            payload: schedule.payload.clone(),
            delivery: schedule.delivery.into(),
            start_at: schedule.start_at.map(Timestamp::to_rfc3339),
            end_at: schedule.end_at.map(Timestamp::to_rfc3339),
            max_occurrences: schedule.max_occurrences,
            misfire: schedule.misfire.into(),
            catch_up_window_ms: u64::try_from(schedule.catch_up_window.as_millis())
                .unwrap_or(u64::MAX),
            queue: schedule
                .settings
                .queue
                .as_ref()
                .map(|q| q.as_str().to_string()),
            max_attempts: schedule.settings.max_attempts,
            backoff: schedule.settings.backoff,
            attempt_timeout_ms: schedule.settings.attempt_timeout_ms,
            max_age_ms: schedule.settings.max_age_ms,
            occurrences: schedule.progress.occurrences,
            last_occurrence: schedule.progress.last_occurrence.map(Timestamp::to_rfc3339),
            missed: schedule.progress.missed.into(),
            created_at: schedule.created_at.to_rfc3339(),
            updated_at: schedule.updated_at.to_rfc3339(),
            error: state.error.clone(),
        }
    }
}

pub(crate) async fn require_tenant(state: &ApiState, name: &TenantName) -> Result<bool, ApiError> {
    Ok(state.engine.store().get_tenant(name).await?.is_some())
}

/// Creates (201) or replaces (200) a schedule; takes effect at once.
#[utoipa::path(
    put,
    path = SCHEDULE,
    tag = "schedules",
    operation_id = "put_schedule",
    summary = "Create (201) or replace (200) a recurring schedule",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::ScheduleIdPath),
    request_body(content = PutSchedule, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = ScheduleView),
        (status = 200, description = "Replaced", body = ScheduleView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn put(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
    V1Json(body): V1Json<PutSchedule>,
) -> Result<Response, V1Error> {
    let (tenant, id) = schedule_path(tenant, id)?;
    let schedule = Definition {
        expression: body.expression,
        kind: body.kind,
        time_zone: body.time_zone,
        payload: body.payload,
        delivery: body.delivery.unwrap_or_default().into(),
        start_at: body.start_at,
        end_at: body.end_at,
        max_occurrences: body.max_occurrences.map(Whole::get),
        misfire: body.misfire.map_or(MisfirePolicy::FireOnce, Into::into),
        catch_up_window: body
            .catch_up_window_ms
            .map_or(DEFAULT_CATCH_UP_WINDOW, |ms| {
                Duration::from_millis(ms.get())
            }),
        settings: SettingsFields {
            queue: body.queue,
            max_attempts: body.max_attempts.map(Whole::get),
            backoff: body.backoff,
            attempt_timeout_ms: body.attempt_timeout_ms.map(Whole::get),
            max_age_ms: body.max_age_ms.map(Whole::get),
            expire_at: None,
        }
        .settings()?,
    }
    .into_schedule(id)?;
    // Validated before the tenant lookup: a bad expression is a 400
    // whatever the tenant.
    schedule
        .validate()
        .map_err(|e| op_error(ScheduleOpError::Invalid(e)))?;
    match state.engine.store().get_tenant(&tenant).await? {
        Some(config) => admit_queue(&config, &schedule.settings)?,
        None => return Err(tenant_not_found(&tenant)),
    }
    let (outcome, saved) = state
        .engine
        .schedules()
        .put(&tenant, schedule)
        .await
        .map_err(op_error)?;
    let status = match outcome {
        PutOutcome::Created => StatusCode::CREATED,
        PutOutcome::Updated => StatusCode::OK,
    };
    Ok((status, Json(ScheduleView::from(&saved))).into_response())
}

#[utoipa::path(
    get,
    path = SCHEDULE,
    tag = "schedules",
    operation_id = "get_schedule",
    summary = "A schedule",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::ScheduleIdPath),
    responses(
        (status = 200, description = "The schedule", body = ScheduleView),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let (tenant, id) = schedule_path(tenant, id)?;
    match state
        .engine
        .schedules()
        .get(&tenant, &id)
        .await
        .map_err(op_error)?
    {
        Some(found) => Ok(Json(ScheduleView::from(&found)).into_response()),
        None => Err(V1Error(schedule_not_found(id.as_str()))),
    }
}

/// Deletes a schedule: 200 with what it was; its occurrence history stays
/// until retention.
#[utoipa::path(
    delete,
    path = SCHEDULE,
    tag = "schedules",
    operation_id = "delete_schedule",
    summary = "Delete a schedule; future occurrences are cancelled",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::ScheduleIdPath),
    responses(
        (status = 200, description = "The schedule as it was (status deleted)", body = ScheduleView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let (tenant, id) = schedule_path(tenant, id)?;
    let before = state
        .engine
        .schedules()
        .delete(&tenant, &id)
        .await
        .map_err(op_error)?;
    let view = ScheduleView::from(&ScheduleState {
        tenant,
        schedule: Schedule {
            status: ScheduleStatus::Deleted,
            ..before
        },
        next_occurrence: None,
        error: None,
    });
    Ok(Json(view).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/schedules/{id}/pause",
    tag = "schedules",
    operation_id = "pause_schedule",
    summary = "Pause a schedule",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::ScheduleIdPath),
    responses(
        (status = 200, description = "Paused", body = ScheduleView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let (tenant, id) = schedule_path(tenant, id)?;
    let paused = state
        .engine
        .schedules()
        .pause(&tenant, &id)
        .await
        .map_err(op_error)?;
    Ok(Json(ScheduleView::from(&paused)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/schedules/{id}/resume",
    tag = "schedules",
    operation_id = "resume_schedule",
    summary = "Resume a schedule from now",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::ScheduleIdPath),
    responses(
        (status = 200, description = "Resumed", body = ScheduleView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn resume(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
) -> Result<Response, V1Error> {
    let (tenant, id) = schedule_path(tenant, id)?;
    let resumed = state
        .engine
        .schedules()
        .resume(&tenant, &id)
        .await
        .map_err(op_error)?;
    Ok(Json(ScheduleView::from(&resumed)).into_response())
}

/// `limit` and `cursor` of a listing.
fn page_query(uri: &Uri, state: &ApiState) -> Result<(usize, Option<EventId>), ApiError> {
    let mut limit = state.options.default_list_limit;
    let mut cursor = None;
    for (name, value) in query_pairs(uri)? {
        match name.as_str() {
            "limit" => limit = parse_limit(&value, state)?,
            "cursor" => {
                cursor = Some(decode_cursor(&value).ok_or_else(|| {
                    ApiError::new(Code::InvalidCursor, "cursor is not one this server issued")
                })?);
            }
            other => {
                return Err(ApiError::new(
                    Code::InvalidQuery,
                    format!("unknown query parameter {other:?}; expected limit or cursor"),
                ));
            }
        }
    }
    Ok((limit, cursor))
}

/// A tenant's schedules by id: `{"schedules": [...], "next_cursor": ...}`.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}/schedules",
    tag = "schedules",
    operation_id = "list_schedules",
    summary = "A page of a tenant's schedules",
    params(crate::openapi::schema::TenantPath, ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1 to `api.max_list_limit` (default 1,000); default `api.default_list_limit` (100)"), ("cursor" = Option<String>, Query, pattern = "^(?:[2-35-6][0-9a-fA-F]|4[1-9a-fA-F]|7[0-9a-eA-E]){1,400}$", description = "next_cursor of the previous page (a cursor only this server issues: any other is refused)")),
    responses(
        (status = 200, description = "A page", body = ScheduleList),
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
    let (limit, cursor) = page_query(&uri, &state)?;
    let mut after = cursor
        .map(|id| ScheduleId::new(id.as_str()))
        .transpose()
        .map_err(|_| ApiError::new(Code::InvalidCursor, "cursor is not one this server issued"))?;
    let reservation = match budget.reserve().await {
        Ok(reservation) => reservation,
        Err(busy) => return Ok(busy),
    };
    // Bounded by bytes like the event listing: read in pages, written
    // item by item.
    let mut page = Page::<ScheduleList>::new(budget.per_answer()).up_to(limit);
    let (schedules, tenant) = (&state.engine.schedules(), &tenant);
    let more = page
        .fill(
            &mut after,
            move |after, read| async move {
                let found = schedules.list(tenant, after.as_ref(), read).await;
                found.map_err(|e| V1Error(op_error(e)))
            },
            |page, schedule, after| {
                if !page.push(&ScheduleView::from(schedule))? {
                    return Ok(false);
                }
                *after = Some(schedule.schedule.id.clone());
                Ok(true)
            },
        )
        .await?;
    let next_cursor = more
        .then_some(after.as_ref())
        .flatten()
        .map(|id| encode_cursor(id.as_event_id()));
    Ok(reservation.answer(page.finish(next_cursor.as_deref())))
}

/// One occurrence in a schedule's history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OccurrenceView<'a> {
    /// The occurrence's event id, also its deliveries' idempotency key.
    id: &'a str,
    scheduled_at: String,
    /// The occurrence event's status.
    status: &'static str,
    attempts: u32,
    last_error: Option<&'a str>,
    triggered_at: Option<String>,
    finished_at: Option<String>,
}

/// A page of a schedule's occurrences, in instant order.
pub(crate) struct OccurrenceList;

impl Listing for OccurrenceList {
    const KEY: &'static str = "occurrences";
    type Item<'a> = OccurrenceView<'a>;
}
crate::openapi::schema::list_page!(OccurrenceList, "A page of a schedule's occurrences");

/// One occurrence of a preview.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PreviewOccurrence {
    utc: String,
    /// The same instant in the zone, with its offset.
    local: String,
}

/// The answer to a preview.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Preview {
    expression: String,
    #[serde(rename = "type")]
    kind: &'static str,
    time_zone: String,
    description: String,
    from: String,
    occurrences: Vec<PreviewOccurrence>,
}

/// A schedule's occurrences in instant order, with their status:
/// `{"occurrences": [...], "next_cursor": ...}`. Answers for deleted
/// schedules too, while their history is kept.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}/schedules/{id}/occurrences",
    tag = "schedules",
    operation_id = "list_occurrences",
    summary = "A schedule's occurrences in instant order",
    params(crate::openapi::schema::TenantPath, crate::openapi::schema::ScheduleIdPath, ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1 to `api.max_list_limit` (default 1,000); default `api.default_list_limit` (100)"), ("cursor" = Option<String>, Query, pattern = "^(?:[2-6][0-9a-fA-F]|7[0-9a-eA-E]){1,500}$", description = "next_cursor of the previous page (a cursor only this server issues: any other is refused)")),
    responses(
        (status = 200, description = "A page", body = OccurrenceList),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn occurrences(
    State(state): State<ApiState>,
    Extension(budget): Extension<AnswerBudget>,
    V1Path((tenant, id)): V1Path<(String, String)>,
    uri: Uri,
) -> Result<Response, V1Error> {
    let (tenant, id) = schedule_path(tenant, id)?;
    let (limit, mut cursor) = page_query(&uri, &state)?;
    let reservation = match budget.reserve().await {
        Ok(reservation) => reservation,
        Err(busy) => return Ok(busy),
    };
    // Occurrences carry the schedule's payload (not shown): read in pages
    // bounded by bytes, like the event listing.
    let mut page = Page::<OccurrenceList>::new(budget.per_answer()).up_to(limit);
    let (schedules, tenant, id) = (&state.engine.schedules(), &tenant, &id);
    let more = page
        .fill(
            &mut cursor,
            move |cursor, read| async move {
                let records = schedules
                    .occurrences(tenant, id, cursor.as_ref(), read)
                    .await
                    .map_err(op_error)?;
                // Nothing read since the first page began: the schedule
                // may not exist.
                if records.is_empty()
                    && cursor.is_none()
                    && schedules.get(tenant, id).await.map_err(op_error)?.is_none()
                {
                    return Err(V1Error(schedule_not_found(id.as_str())));
                }
                Ok(records)
            },
            |page, r, cursor| {
                let view = OccurrenceView {
                    id: r.key.id.as_str(),
                    scheduled_at: r.event_time.to_rfc3339(),
                    status: r.status.as_str(),
                    attempts: r.attempts,
                    last_error: r.last_error.as_deref(),
                    triggered_at: r.triggered_at.map(Timestamp::to_rfc3339),
                    finished_at: r.finished_at.map(Timestamp::to_rfc3339),
                };
                if !page.push(&view)? {
                    return Ok(false);
                }
                *cursor = Some(r.key.id.clone());
                Ok(true)
            },
        )
        .await?;
    let next_cursor = more.then_some(cursor.as_ref()).flatten().map(encode_cursor);
    Ok(reservation.answer(page.finish(next_cursor.as_deref())))
}

/// `GET /v1/cron/preview?expression=&type=&timezone=&from=&count=`: the
/// next `count` occurrences strictly after `from` (default now).
#[utoipa::path(
    get,
    path = "/v1/cron/preview",
    tag = "schedules",
    operation_id = "preview_cron",
    summary = "The next occurrences of a cron expression",
    params(("expression" = String, Query, description = "Cron expression, macro or @every"), ("type" = Option<String>, Query, pattern = "^\\s*(?:[Uu][Nn][Ii][Xx]|[Qq][Uu][Aa][Rr][Tt][Zz]|[Ss][Pp][Rr][Ii][Nn][Gg]|[Cc][Rr][Oo][Nn]4[Jj]|[Ee][Vv][Ee][Rr][Yy]|[Ii][Nn][Tt][Ee][Rr][Vv][Aa][Ll])\\s*$", description = "unix, quartz, spring, cron4j or every (alias interval), in any case"), ("timezone" = Option<String>, Query, description = "IANA zone"), ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339; default now"), ("count" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000; default 10")),
    responses(
        (status = 200, description = "The occurrences", body = Preview),
        (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1KeyErrors
    )
)]
pub(crate) async fn preview(State(state): State<ApiState>, uri: Uri) -> Result<Response, V1Error> {
    let invalid = |message: String| ApiError::new(Code::InvalidQuery, message);
    let mut expression = None;
    let mut kind = None;
    let mut zone = None;
    let mut from = None;
    let mut count = DEFAULT_PREVIEW;
    for (name, value) in query_pairs(&uri)? {
        match name.as_str() {
            "expression" => expression = Some(value),
            "type" => kind = Some(value),
            "timezone" | "time_zone" => zone = Some(value),
            "from" => from = instant("from", Some(&value))?,
            "count" => {
                count = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PREVIEW).contains(n))
                    .ok_or_else(|| {
                        invalid(format!(
                            "count must be a whole number from 1 to {MAX_PREVIEW}"
                        ))
                    })?;
            }
            other => {
                return Err(V1Error(invalid(format!(
                    "unknown query parameter {other:?}; expected expression, type, timezone, \
                     from or count"
                ))));
            }
        }
    }
    let expression =
        expression.ok_or_else(|| invalid("query parameter expression is required".into()))?;
    let kind: CronKind = kind
        .as_deref()
        .unwrap_or("UNIX")
        .parse()
        .map_err(cron_error)?;
    let spec = CronSpec::parse(&expression, kind, zone.as_deref()).map_err(cron_error)?;
    let from = from.unwrap_or_else(|| state.engine.now());
    let occurrences = spec
        .occurrences_after(from)
        .take(count)
        .map(|at| PreviewOccurrence {
            utc: at.to_rfc3339(),
            local: local_time(&spec, at),
        })
        .collect();
    let preview = Preview {
        expression: spec.expression().to_string(),
        kind: spec.kind().as_str(),
        time_zone: spec.time_zone_name().to_string(),
        description: spec.describe(),
        from: from.to_rfc3339(),
        occurrences,
    };
    Ok(Json(preview).into_response())
}
