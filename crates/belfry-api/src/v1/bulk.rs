//! `/v1/bulk-actions`: one action (cancel, redrive, delete, pause, resume) over
//! every event or schedule of one tenant that a filter matches, as a
//! resource that runs in the background (`belfry_engine::bulk`).
//!
//! Who may do what (the route table in `routing.rs` and the
//! handlers): a tenant's `write` key creates and cancels its own tenant's
//! actions, `read` keys read them, admins everything; another tenant's
//! action answers as one that does not exist (404). Creation and
//! cancellation are audited once per action, never per item.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use belfry_core::auth::AuditAction;
use belfry_core::bulk::{BulkAction, BulkActionId, BulkFilter, BulkKind, BulkTarget, StatusFilter};
use belfry_core::{ScheduleStatus, Timestamp};
use belfry_engine::bulk::CancelBulkError;
use belfry_store::ListBulkActionsParams;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::{V1Json, V1Path, query_pairs};
use crate::v1::events::{parse_instant, parse_status};
use crate::v1::invalid_request;
use crate::v1::{tenant_name, tenant_not_found};

/// The path of the bulk actions (create, list).
const BULK_ACTIONS: &str = "/v1/bulk-actions";

/// Body of `POST /v1/bulk-actions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a bulk action object")]
#[schema(example = json!({"action": "redrive", "filter": {"tenant": "shop/orders", "status": "failed"}}))]
pub(crate) struct CreateBulkAction {
    #[schema(value_type = BulkActionKind)]
    action: String,
    filter: FilterBody,
}

/// Which items of one tenant a bulk action acts on.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a filter object")]
#[schema(as = BulkFilterBody)]
struct FilterBody {
    /// Required: a bulk action acts on one tenant (1 to 200 bytes, no
    /// control characters).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    tenant: String,
    /// Events: `scheduled`, `retrying` (cancel), `failed`, `missed`
    /// (redrive) or `delivered`, `failed`, `missed`, `cancelled` (delete,
    /// which requires one). Schedules: `active` (pause) or `paused`
    /// (resume).
    status: Option<String>,
    /// Events only: RFC 3339, inclusive bound of deliver_at.
    #[schema(format = DateTime)]
    from: Option<String>,
    /// Events only: RFC 3339, exclusive bound of deliver_at.
    #[schema(format = DateTime)]
    to: Option<String>,
}

/// What a bulk action does: `cancel`, `redrive` and `delete` act on
/// events, `pause` and `resume` on schedules.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BulkActionKind {
    Cancel,
    Redrive,
    Delete,
    Pause,
    Resume,
}

impl From<BulkKind> for BulkActionKind {
    fn from(kind: BulkKind) -> Self {
        match kind {
            BulkKind::Cancel => BulkActionKind::Cancel,
            BulkKind::Redrive => BulkActionKind::Redrive,
            BulkKind::Delete => BulkActionKind::Delete,
            BulkKind::Pause => BulkActionKind::Pause,
            BulkKind::Resume => BulkActionKind::Resume,
        }
    }
}

/// The filter as given (absent fields were not given).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BulkFilterView<'a> {
    tenant: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    to: Option<String>,
}

/// A bulk action and its progress: `matched` grows as pages are read;
/// each matched item is `succeeded`, `skipped` (its state no longer
/// allowed the action) or `failed` (its write failed).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BulkActionView<'a> {
    id: &'a str,
    action: BulkActionKind,
    filter: BulkFilterView<'a>,
    /// `running`, `completed`, `cancelled` or `failed`.
    state: &'static str,
    matched: u64,
    succeeded: u64,
    skipped: u64,
    failed: u64,
    /// The id of the key that created it; `null` in open mode.
    created_by: Option<&'a str>,
    created_at: String,
    updated_at: String,
    finished_at: Option<String>,
    /// Why it failed (state `failed`).
    error: Option<&'a str>,
}

/// A page of bulk actions, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BulkActionList<'a> {
    bulk_actions: Vec<BulkActionView<'a>>,
    /// Pass as `cursor` for the next page; `null` on the last.
    next_cursor: Option<String>,
}

fn not_found(id: &str) -> V1Error {
    V1Error(ApiError::new(
        Code::BulkActionNotFound,
        format!("no bulk action {id:?}"),
    ))
}

/// The filter of a request, checked against its action.
fn parse_filter(kind: BulkKind, body: FilterBody) -> Result<BulkFilter, V1Error> {
    let tenant = tenant_name(body.tenant)?;
    let status = match (kind.target(), body.status) {
        (_, None) => None,
        (BulkTarget::Events, Some(text)) => Some(StatusFilter::Event(parse_status(
            &text,
            Code::InvalidRequest,
        )?)),
        (BulkTarget::Schedules, Some(text)) => Some(StatusFilter::Schedule(
            ScheduleStatus::parse(&text)
                .filter(|status| *status != ScheduleStatus::Deleted)
                .ok_or_else(|| {
                    invalid_request(format!(
                        "unknown status {text:?}; expected active, paused or completed"
                    ))
                })?,
        )),
    };
    let instant = |name: &str, value: Option<String>| {
        value.map(|text| parse_instant(name, &text)).transpose()
    };
    let filter = BulkFilter {
        tenant,
        status,
        from: instant("from", body.from)?,
        to: instant("to", body.to)?,
    };
    filter
        .validate(kind)
        .map_err(|e| invalid_request(e.to_string()))?;
    Ok(filter)
}

/// The answer's view of an action (`docs/api.md`): the filter as given,
/// the progress, who created it and when.
fn view(action: &BulkAction) -> BulkActionView<'_> {
    BulkActionView {
        id: action.id.as_str(),
        action: action.kind.into(),
        filter: BulkFilterView {
            tenant: action.tenant().as_str(),
            status: action.filter.status.map(StatusFilter::as_str),
            from: action.filter.from.map(Timestamp::to_rfc3339),
            to: action.filter.to.map(Timestamp::to_rfc3339),
        },
        state: action.state.as_str(),
        matched: action.progress.matched,
        succeeded: action.progress.succeeded,
        skipped: action.progress.skipped,
        failed: action.progress.failed,
        created_by: action.created_by.as_deref(),
        created_at: action.created_at.to_rfc3339(),
        updated_at: action.updated_at.to_rfc3339(),
        finished_at: action.finished_at.map(Timestamp::to_rfc3339),
        error: action.error.as_deref(),
    }
}

/// The action `id` if the principal may see it; otherwise, like an
/// unknown one, 404.
async fn visible(state: &ApiState, principal: &Principal, id: &str) -> Result<BulkAction, V1Error> {
    let parsed = BulkActionId::parse(id).ok_or_else(|| not_found(id))?;
    match state.engine.store().get_bulk_action(&parsed).await? {
        Some(action) if principal.sees(action.tenant()) => Ok(action),
        _ => Err(not_found(id)),
    }
}

/// `POST /v1/bulk-actions`: 202 with the action's view and its
/// `Location`; it runs in the background.
#[utoipa::path(
    post,
    path = BULK_ACTIONS,
    tag = "bulk-actions",
    operation_id = "create_bulk_action",
    summary = "Start a bulk action over a tenant's events or schedules",
    request_body(content = CreateBulkAction, content_type = "application/json"),
    responses(
        (status = 202, description = "Started; follow it at Location", body = BulkActionView,
            headers(("Location" = String, description = "/v1/bulk-actions/{id}"))),
        (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1TenantWriteErrors
    )
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    principal: Principal,
    V1Json(body): V1Json<CreateBulkAction>,
) -> Result<Response, V1Error> {
    let kind = BulkKind::parse(&body.action).map_err(|e| invalid_request(e.to_string()))?;
    let filter = parse_filter(kind, body.filter)?;
    // Writers only (the route table); here, their own tenant only.
    if !principal.sees(&filter.tenant) {
        return Err(tenant_not_found(&filter.tenant));
    }
    let now = state.engine.now();
    let id = BulkActionId::generate(now).map_err(|error| {
        tracing::error!(%error, "cannot generate a bulk action id");
        V1Error(ApiError::internal())
    })?;
    let action = BulkAction::new(
        id,
        kind,
        filter,
        principal.key.as_ref().map(|k| k.to_string()),
        now,
    );
    let created = state
        .engine
        .bulk()
        .create(action.clone())
        .await
        .map_err(crate::quota::quota_error)?;
    if !created {
        // 60 random bits collided within one millisecond.
        tracing::error!(id = %action.id, "a new bulk action's id already exists");
        return Err(V1Error(ApiError::internal()));
    }
    tracing::info!(id = %action.id, action = kind.as_str(), tenant = %action.tenant().as_str(), "bulk action created");
    crate::auth::routes::audit(
        &state,
        &principal,
        AuditAction::BulkActionCreated,
        Some(action.tenant()),
        Some(action.id.to_string()),
    )
    .await;
    let mut response = (StatusCode::ACCEPTED, Json(view(&action))).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/bulk-actions/{}", action.id)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// `GET /v1/bulk-actions[?tenant=T][&limit=N][&cursor=C]`: newest first.
/// A tenant key lists its own tenant's (with or without `tenant`).
#[utoipa::path(
    get,
    path = BULK_ACTIONS,
    tag = "bulk-actions",
    operation_id = "list_bulk_actions",
    summary = "Bulk actions, newest first",
    params(("tenant" = Option<String>, Query, min_length = 1, max_length = 200, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$", description = "Only this tenant's (a tenant key: its own, the default)"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1 to `api.max_list_limit` (default 1,000); default `api.default_list_limit` (100)"), ("cursor" = Option<String>, Query, pattern = "^bulk_[0-9a-f]{12}[0-9A-Za-z]{10}$", description = "next_cursor of the previous page (a cursor only this server issues: any other is refused)")),
    responses(
        (status = 200, description = "A page", body = BulkActionList),
        (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
        (status = 404, description = "Unknown tenant", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::BulkReadErrors
    )
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    principal: Principal,
    uri: Uri,
) -> Result<Response, V1Error> {
    let invalid_query = |message: String| V1Error(ApiError::new(Code::InvalidQuery, message));
    let mut tenant = None;
    let mut limit = state.options.default_list_limit;
    let mut before = None;
    for (name, value) in query_pairs(&uri)? {
        match name.as_str() {
            "tenant" => tenant = Some(tenant_name(value)?),
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=state.options.max_list_limit).contains(n))
                    .ok_or_else(|| {
                        invalid_query(format!(
                            "limit must be a whole number from 1 to {}",
                            state.options.max_list_limit
                        ))
                    })?;
            }
            "cursor" => {
                before = Some(BulkActionId::parse(&value).ok_or_else(|| {
                    V1Error(ApiError::new(
                        Code::InvalidCursor,
                        "cursor is not one this server issued",
                    ))
                })?);
            }
            other => {
                return Err(invalid_query(format!(
                    "unknown query parameter {other:?}; expected tenant, limit or cursor"
                )));
            }
        }
    }
    // A tenant key sees its own tenant only (another one was answered 404
    // by the route table already).
    let tenant = match (tenant, principal.tenant()) {
        (Some(asked), Some(own)) if asked != *own => return Err(tenant_not_found(&asked)),
        (None, Some(own)) => Some(own.clone()),
        (asked, _) => asked,
    };
    // One more than asked tells whether another page exists.
    let mut actions = state
        .engine
        .store()
        .list_bulk_actions(ListBulkActionsParams {
            tenant,
            before,
            limit: limit + 1,
        })
        .await?;
    let more = actions.len() > limit;
    actions.truncate(limit);
    let next_cursor = actions
        .last()
        .filter(|_| more)
        .map(|last| last.id.to_string());
    let answer = BulkActionList {
        bulk_actions: actions.iter().map(view).collect(),
        next_cursor,
    };
    Ok(Json(answer).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/bulk-actions/{id}",
    tag = "bulk-actions",
    operation_id = "get_bulk_action",
    summary = "A bulk action and its progress",
    params(crate::openapi::schema::BulkActionPath),
    responses(
        (status = 200, description = "The action", body = BulkActionView),
        (status = 404, description = "Unknown bulk action", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::BulkReadErrors
    )
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(id): V1Path<String>,
) -> Result<Response, V1Error> {
    let action = visible(&state, &principal, &id).await?;
    Ok(Json(view(&action)).into_response())
}

/// Stops a running action after the page in progress (whose items stay
/// handled and counted): 200 with its view; 409 if it already finished.
#[utoipa::path(
    post,
    path = "/v1/bulk-actions/{id}/cancel",
    tag = "bulk-actions",
    operation_id = "cancel_bulk_action",
    summary = "Stop a running bulk action",
    params(crate::openapi::schema::BulkActionPath),
    responses(
        (status = 200, description = "Cancelled", body = BulkActionView),
        (status = 404, description = "Unknown bulk action", body = crate::openapi::schema::V1Error),
        (status = 409, description = "Already finished", body = crate::openapi::schema::V1Error),
        (status = 415, description = "Not JSON", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1Errors
    )
)]
pub(crate) async fn cancel(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(id): V1Path<String>,
) -> Result<Response, V1Error> {
    let action = visible(&state, &principal, &id).await?;
    match state.engine.bulk().cancel(&action.id).await {
        Ok(cancelled) => {
            tracing::info!(id = %cancelled.id, "bulk action cancelled");
            crate::auth::routes::audit(
                &state,
                &principal,
                AuditAction::BulkActionCancelled,
                Some(cancelled.tenant()),
                Some(cancelled.id.to_string()),
            )
            .await;
            Ok(Json(view(&cancelled)).into_response())
        }
        Err(CancelBulkError::Finished(finished)) => Err(V1Error(ApiError::new(
            Code::AlreadyFinished,
            format!(
                "the bulk action already finished ({})",
                finished.state.as_str()
            ),
        ))),
        Err(CancelBulkError::NotFound(_)) => Err(not_found(&id)),
        Err(CancelBulkError::Store(error)) => Err(error.into()),
    }
}
