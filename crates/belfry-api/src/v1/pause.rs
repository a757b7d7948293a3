//! `/v1/tenants/{tenant}/pause` and `…/resume`: stop and restart a
//! tenant's deliveries (and its pull workers' claims). Both are
//! idempotent and audited; the answer is the tenant's view with its pause
//! state.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use belfry_core::auth::AuditAction;
use belfry_core::tenant::MAX_PAUSE_REASON_LEN;
use belfry_core::{TenantName, TenantPause};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::auth::routes::audit;
use crate::error::V1Error;
use crate::extract::{V1JsonOrEmpty, V1Path};
use crate::v1::views::TenantView;
use crate::v1::{invalid_request, tenant_name, tenant_not_found};

/// Body of a pause (optional: an empty body pauses without a reason).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "an object")]
pub(crate) struct PauseTenant {
    /// Why (shown in the tenant's view and the audit log), up to 1024
    /// bytes. Pausing a paused tenant with a reason replaces it.
    #[schema(max_length = 1024)]
    reason: Option<String>,
}

/// Pauses a tenant's deliveries: its due events stay pending, in order,
/// with no attempt spent; its schedules go on creating occurrences, held
/// like any event; its pull workers' claims answer `409 tenant_paused`.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/pause",
    tag = "tenants",
    operation_id = "pause_tenant",
    summary = "Pause a tenant's deliveries (idempotent)",
    params(crate::openapi::schema::TenantPath),
    request_body(content = Option<PauseTenant>, content_type = "application/json", description = "Optional"),
    responses(
        (status = 200, description = "Paused: the tenant with its pause", body = TenantView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn pause(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(tenant): V1Path<String>,
    V1JsonOrEmpty(body): V1JsonOrEmpty<PauseTenant>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    if body
        .reason
        .as_ref()
        .is_some_and(|reason| reason.len() > MAX_PAUSE_REASON_LEN)
    {
        return Err(invalid_request(format!(
            "reason: at most {MAX_PAUSE_REASON_LEN} bytes"
        )));
    }
    let pause = state
        .engine
        .tenants()
        .pause(&name, body.reason.clone())
        .await?
        .ok_or_else(|| tenant_not_found(&name))?;
    let answer = answer(&state, &name, Some(&pause)).await?;
    tracing::info!(tenant = %name, reason = ?pause.reason, "tenant paused");
    audit(
        &state,
        &principal,
        AuditAction::TenantPaused,
        Some(&name),
        body.reason,
    )
    .await;
    Ok(answer)
}

/// Resumes a tenant's deliveries: what the pause held back goes out in
/// due order, late by the pause.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/resume",
    tag = "tenants",
    operation_id = "resume_tenant",
    summary = "Resume a tenant's deliveries (idempotent)",
    params(crate::openapi::schema::TenantPath),
    responses(
        (status = 200, description = "Resumed (or was not paused): the tenant", body = TenantView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn resume(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(tenant): V1Path<String>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let pause = state.engine.tenants().resume(&name).await?;
    let answer = answer(&state, &name, pause.as_ref()).await?;
    tracing::info!(tenant = %name, "tenant resumed");
    audit(
        &state,
        &principal,
        AuditAction::TenantResumed,
        Some(&name),
        None,
    )
    .await;
    Ok(answer)
}

/// The tenant's view with `pause`; `404` when there is no such tenant.
async fn answer(
    state: &ApiState,
    name: &TenantName,
    pause: Option<&TenantPause>,
) -> Result<Response, V1Error> {
    let Some(tenant) = state.engine.store().get_tenant(name).await? else {
        return Err(tenant_not_found(name));
    };
    let view = TenantView::of(&tenant, pause).with_circuit(&tenant, &state.engine);
    Ok(Json(view).into_response())
}
