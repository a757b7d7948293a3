//! BigBen's `/cron` routes over Belfry's recurring schedules.
//!
//! - `POST /cron`: create or replace a schedule from BigBen's `Cron`
//!   (`tenant`, `id`, `expression`, `type`), answering `{"cron", "description"}`.
//!   Belfry's extensions are optional fields: `timeZone`, `payload`,
//!   `deliveryOption`, `startAt`, `endAt`, `maxOccurrences`, `misfire`
//!   (`{"policy": "fire_once" | "fire_all" | "skip", "cap"}`),
//!   `catchUpWindowMs`. `type` defaults to `UNIX`.
//! - `GET /cron/{tenant}/{id}[?describe=true]`: an array of zero or one
//!   `{"cron", "description"?}` (BigBen could hold one cron per type; Belfry
//!   holds one schedule per id).
//! - `DELETE /cron/{tenant}/{id}/{type}`: deletes it when `type` is its
//!   type or `*`; `404` when there is no such cron.
//!
//! Tenant names with `/` are one percent-encoded path segment (`%2F`).

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use belfry_core::schedule::DEFAULT_CATCH_UP_WINDOW;
use belfry_core::{CronKind, DeliveryOption, MisfirePolicy, TenantName, Timestamp};
use belfry_engine::schedules::{ScheduleOpError, ScheduleState};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, BigBenError, Code};
use crate::extract::whole::Whole;
use crate::extract::{BigBenJson, query_pairs, query_value};
use crate::v1::schedules::{
    Definition, Misfire, cron_error, op_error, require_tenant, schedule_id,
};

/// BigBen's `Cron`, plus Belfry's optional extensions. Every field is
/// optional so that a missing one gets BigBen-style message.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", expecting = "a Cron object")]
#[schema(example = json!({"tenant": "shop/orders", "id": "every-5s", "expression": "*/5 * * * * ?", "type": "QUARTZ"}))]
pub(crate) struct CronRequest {
    /// Required: a registered tenant.
    #[schema(required = true)]
    tenant: Option<String>,
    /// Required.
    #[schema(required = true)]
    id: Option<String>,
    /// Required.
    #[schema(required = true)]
    expression: Option<String>,
    /// `UNIX` (default), `QUARTZ`, `SPRING`, `CRON4J`, `EVERY`, in any case.
    #[serde(rename = "type")]
    kind: Option<String>,
    time_zone: Option<String>,
    payload: Option<String>,
    /// `FULL_EVENT` (default) or `PAYLOAD_ONLY`.
    #[schema(value_type = Option<String>)]
    delivery_option: Option<DeliveryOption>,
    start_at: Option<String>,
    end_at: Option<String>,
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 18446744073709551615.0)]
    max_occurrences: Option<Whole<u64>>,
    misfire: Option<Misfire>,
    #[schema(value_type = Option<u64>, maximum = 18446744073709551615.0)]
    catch_up_window_ms: Option<Whole<u64>>,
}

/// A cron as BigBen's routes show it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CronView {
    tenant: String,
    id: String,
    expression: String,
    #[serde(rename = "type")]
    kind: String,
    time_zone: String,
    payload: Option<String>,
    /// `FULL_EVENT` or `PAYLOAD_ONLY`.
    #[schema(value_type = String)]
    delivery_option: DeliveryOption,
    start_at: Option<String>,
    end_at: Option<String>,
    max_occurrences: Option<u64>,
    misfire: Misfire,
    status: &'static str,
    next_occurrence: Option<String>,
    created_at: String,
    updated_at: String,
}

impl From<&ScheduleState> for CronView {
    fn from(state: &ScheduleState) -> Self {
        let s = &state.schedule;
        CronView {
            tenant: state.tenant.as_str().to_string(),
            id: s.id.as_str().to_string(),
            expression: s.expression.clone(),
            kind: s.kind.clone(),
            time_zone: s.time_zone.clone(),
            payload: s.payload.clone(),
            delivery_option: s.delivery,
            start_at: s.start_at.map(Timestamp::to_rfc3339),
            end_at: s.end_at.map(Timestamp::to_rfc3339),
            max_occurrences: s.max_occurrences,
            misfire: s.misfire.into(),
            status: s.status.as_str(),
            next_occurrence: state.next_occurrence.map(Timestamp::to_rfc3339),
            created_at: s.created_at.to_rfc3339(),
            updated_at: s.updated_at.to_rfc3339(),
        }
    }
}

/// A cron with its description.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CronAnswer {
    cron: CronView,
    /// In words; `null` if it cannot be described. Always in the
    /// answer of `POST /cron`; in `GET`'s with `describe=true` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, required = false)]
    description: Option<Option<String>>,
}

fn description(state: &ScheduleState) -> Option<String> {
    state.schedule.spec().ok().map(|spec| spec.describe())
}

fn required(value: Option<String>, name: &str) -> Result<String, BigBenError> {
    value.filter(|v| !v.trim().is_empty()).ok_or_else(|| {
        BigBenError(ApiError::new(
            Code::InvalidRequest,
            format!("{name} not present"),
        ))
    })
}

#[utoipa::path(
    post,
    path = "/cron",
    tag = "bigben",
    operation_id = "bigben_create_cron",
    summary = "Create or replace a recurring schedule (BigBen Cron)",
    request_body(content = CronRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The cron and its description", body = CronAnswer),
        (status = 404, description = "Not found", body = crate::openapi::schema::BigBenError),
        crate::openapi::schema::BigBenWriteErrors,
        crate::openapi::schema::BigBenBodyErrors
    )
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    principal: Principal,
    BigBenJson(request): BigBenJson<CronRequest>,
) -> Result<Response, BigBenError> {
    let tenant_text = required(request.tenant, "tenant")?;
    let id = schedule_id(required(request.id, "id")?)?;
    let expression = required(request.expression, "expression")?;
    let tenant = TenantName::new(tenant_text)
        .map_err(|e| ApiError::new(Code::InvalidName, e.to_string()))?;
    let delivery = request.delivery_option.unwrap_or_default();
    let schedule = Definition {
        expression,
        kind: request.kind,
        time_zone: request.time_zone,
        payload: request.payload,
        delivery,
        start_at: request.start_at,
        end_at: request.end_at,
        max_occurrences: request.max_occurrences.map(Whole::get),
        misfire: request.misfire.map_or(MisfirePolicy::FireOnce, Into::into),
        catch_up_window: request
            .catch_up_window_ms
            .map_or(DEFAULT_CATCH_UP_WINDOW, |ms| {
                Duration::from_millis(ms.get())
            }),
        // BigBen's cron requests have no such fields.
        settings: Default::default(),
    }
    .into_schedule(id)?;
    schedule
        .validate()
        .map_err(|e| op_error(ScheduleOpError::Invalid(e)))?;
    // Another tenant than the key's own is unknown, like an unregistered one.
    if !principal.may_write(&tenant) || !require_tenant(&state, &tenant).await? {
        return Err(BigBenError(ApiError::new(
            Code::UnknownTenant,
            format!("tenant not registered / unknown tenant: {tenant}"),
        )));
    }
    let (_, saved) = state
        .engine
        .schedules()
        .put(&tenant, schedule)
        .await
        .map_err(op_error)?;
    let answer = CronAnswer {
        cron: CronView::from(&saved),
        description: Some(description(&saved)),
    };
    Ok(Json(answer).into_response())
}

/// Path segments, percent-decoded; a malformed path is a 400 in BigBen's
/// envelope.
fn segments<T>(path: Result<Path<T>, PathRejection>) -> Result<T, BigBenError> {
    path.map(|Path(value)| value).map_err(|rejection| {
        tracing::debug!(%rejection, "cron path rejected");
        BigBenError(ApiError::new(
            Code::InvalidName,
            "a path segment is not valid percent-encoded UTF-8",
        ))
    })
}

#[utoipa::path(
    get,
    path = "/cron/{tenant}/{id}",
    tag = "bigben",
    operation_id = "bigben_get_cron",
    summary = "A cron (zero or one)",
    params(crate::openapi::schema::CronPath, ("describe" = Option<bool>, Query, description = "add a description")),
    responses(
        (status = 200, description = "Zero or one cron", body = Vec<CronAnswer>),
        (status = 400, description = "Bad input", body = crate::openapi::schema::BigBenError),
        crate::openapi::schema::BigBenErrors
    )
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    path: Result<Path<(String, String)>, PathRejection>,
    uri: Uri,
) -> Result<Response, BigBenError> {
    let (tenant, id) = segments(path)?;
    let pairs = query_pairs(&uri)?;
    let describe = match query_value(&pairs, "describe") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(BigBenError(ApiError::new(
                Code::InvalidQuery,
                format!("describe must be true or false, not {other:?}"),
            )));
        }
    };
    // Names that cannot exist have no cron.
    let (Ok(tenant), Ok(id)) = (TenantName::new(tenant), schedule_id(id)) else {
        return Ok(Json(Vec::<CronAnswer>::new()).into_response());
    };
    let found = state
        .engine
        .schedules()
        .get(&tenant, &id)
        .await
        .map_err(op_error)?;
    let items: Vec<CronAnswer> = found
        .iter()
        .map(|state| CronAnswer {
            cron: CronView::from(state),
            description: describe.then(|| description(state)),
        })
        .collect();
    Ok(Json(items).into_response())
}

#[utoipa::path(
    delete,
    path = "/cron/{tenant}/{id}/{type}",
    tag = "bigben",
    operation_id = "bigben_delete_cron",
    summary = "Delete a cron of a type (or *)",
    params(crate::openapi::schema::CronPath, ("type" = String, Path, pattern = "^(?:\\*|\\s*(?:[Uu][Nn][Ii][Xx]|[Qq][Uu][Aa][Rr][Tt][Zz]|[Ss][Pp][Rr][Ii][Nn][Gg]|[Cc][Rr][Oo][Nn]4[Jj]|[Ee][Vv][Ee][Rr][Yy]|[Ii][Nn][Tt][Ee][Rr][Vv][Aa][Ll])\\s*)$", description = "The cron type (any case) or *")),
    responses(
        (status = 200, description = "Deleted", body = crate::bigben::StatusOk),
        (status = 400, description = "Bad input", body = crate::openapi::schema::BigBenError),
        (status = 404, description = "Not found", body = crate::openapi::schema::BigBenError),
        crate::openapi::schema::BigBenWriteErrors
    )
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Response, BigBenError> {
    let (tenant, id, kind) = segments(path)?;
    let wanted = match kind.as_str() {
        "*" => None,
        other => Some(other.parse::<CronKind>().map_err(cron_error)?),
    };
    let no_cron = || {
        BigBenError(ApiError::new(
            Code::ScheduleNotFound,
            format!("no cron {id:?} of type {kind} for tenant {tenant:?}"),
        ))
    };
    let (Ok(tenant_name), Ok(schedule)) =
        (TenantName::new(tenant.clone()), schedule_id(id.clone()))
    else {
        return Err(no_cron());
    };
    let Some(found) = state
        .engine
        .schedules()
        .get(&tenant_name, &schedule)
        .await
        .map_err(op_error)?
    else {
        return Err(no_cron());
    };
    if wanted.is_some_and(|kind| kind.as_str() != found.schedule.kind) {
        return Err(no_cron());
    }
    match state
        .engine
        .schedules()
        .delete(&tenant_name, &schedule)
        .await
    {
        Ok(_) => Ok(Json(crate::bigben::StatusOk::OK).into_response()),
        Err(ScheduleOpError::NotFound(_)) => Err(no_cron()),
        Err(other) => Err(BigBenError(op_error(other))),
    }
}
