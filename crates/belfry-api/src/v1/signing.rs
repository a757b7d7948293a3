//! Webhook signing secrets (Standard Webhooks): generated at registration
//! and shown in that answer only, rotated with an overlap through
//! `POST /v1/tenants/{tenant}/signing-secrets/rotate`.
//!
//! A secret is never in any other answer (`GET` shows none), nor in a log
//! line: [`belfry_core::SigningSecrets`]' `Debug` hides it.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use belfry_core::auth::AuditAction;
use belfry_core::{SigningSecrets, TenantConfig};
use belfry_sinks::signing::generate_secret;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::auth::routes::audit;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::{V1Json, V1Path};
use crate::v1::{tenant_name, tenant_not_found};

/// How long a rotated-out secret keeps signing when the request does not
/// say: a day, time enough to roll the new one out to every receiver.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// The longest overlap a rotation may ask for (30 days).
pub const MAX_GRACE_PERIOD_SECS: u64 = 30 * 24 * 3600;

/// The secrets a registration stores, and the new secret to show when it
/// generated one: a tenant that has secrets keeps them (re-registering,
/// e.g. to move the URL, does not break its receivers' verification); a
/// new tenant, or one registered before signing existed, gets one.
pub(crate) fn for_registration(
    existing: Option<&TenantConfig>,
) -> (SigningSecrets, Option<String>) {
    match existing.and_then(|tenant| tenant.signing.clone()) {
        Some(secrets) => (secrets, None),
        None => {
            let secret = generate_secret();
            (SigningSecrets::new(secret.clone()), Some(secret))
        }
    }
}

/// Body of the rotate request (`{}` for the default overlap).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "an object")]
pub(crate) struct Rotate {
    /// How long the current secret keeps signing next to the new one, in
    /// seconds (0 to 2592000); 0 ends it at once. Default: a day.
    #[serde(default)]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 2592000)]
    grace_period_secs: Option<serde_json::Value>,
}

/// The answer to a rotation.
#[derive(Debug, Serialize, ToSchema)]
struct Rotated {
    tenant: String,
    signing_secret: String,
    /// When the previous secret stops signing (RFC 3339); `null` when there
    /// was none or the grace period is 0.
    old_secret_expires_at: Option<String>,
}

/// `POST /v1/tenants/{tenant}/signing-secrets/rotate`: a new current
/// secret (answered once); the old one keeps signing, as a second
/// signature, for the grace period.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/signing-secrets/rotate",
    tag = "tenants",
    operation_id = "rotate_signing_secret",
    summary = "A new webhook signing secret",
    params(crate::openapi::schema::TenantPath),
    request_body(content = Rotate, content_type = "application/json"),
    responses(
        (status = 200, description = "The new secret, shown once", body = Rotated),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn rotate(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(tenant): V1Path<String>,
    V1Json(body): V1Json<Rotate>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let grace = grace_period(body.grace_period_secs.as_ref())?;
    let store = state.engine.store();
    let mut config = store
        .get_tenant(&name)
        .await?
        .ok_or_else(|| tenant_not_found(&name))?;
    let secret = generate_secret();
    let now = state.engine.now();
    let (secrets, expires_at) = match &config.signing {
        Some(current) if !grace.is_zero() => {
            let expires_at = now.plus(grace);
            (
                current.rotated(secret.clone(), expires_at),
                Some(expires_at),
            )
        }
        _ => (SigningSecrets::new(secret.clone()), None),
    };
    config.signing = Some(secrets);
    state.engine.tenants().put(config).await?;
    tracing::info!(tenant = %name, grace_secs = grace.as_secs(), "signing secret rotated");
    audit(
        &state,
        &principal,
        AuditAction::TenantChanged,
        Some(&name),
        Some("signing_secret_rotated".to_string()),
    )
    .await;
    Ok(Json(Rotated {
        tenant: name.as_str().to_string(),
        signing_secret: secret,
        old_secret_expires_at: expires_at.map(|at| at.to_rfc3339()),
    })
    .into_response())
}

/// The grace period asked for: a whole number of seconds up to
/// [`MAX_GRACE_PERIOD_SECS`].
fn grace_period(value: Option<&serde_json::Value>) -> Result<Duration, V1Error> {
    let invalid = || {
        V1Error(ApiError::new(
            Code::InvalidRequest,
            format!(
                "grace_period_secs must be a whole number of seconds from 0 to \
                 {MAX_GRACE_PERIOD_SECS}"
            ),
        ))
    };
    match value {
        None | Some(serde_json::Value::Null) => Ok(DEFAULT_GRACE_PERIOD),
        Some(value) => crate::extract::whole::u64_of(value)
            .filter(|secs| *secs <= MAX_GRACE_PERIOD_SECS)
            .map(Duration::from_secs)
            .ok_or_else(invalid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn grace_periods() {
        assert_eq!(grace_period(None).unwrap(), DEFAULT_GRACE_PERIOD);
        assert_eq!(
            grace_period(Some(&json!(60))).unwrap(),
            Duration::from_secs(60)
        );
        assert_eq!(grace_period(Some(&json!(0))).unwrap(), Duration::ZERO);
        for bad in [
            json!(-1),
            json!(1.5),
            json!("60"),
            json!(MAX_GRACE_PERIOD_SECS + 1),
        ] {
            let error = grace_period(Some(&bad)).unwrap_err();
            assert!(!error.0.message.contains("u64"), "{error:?}");
        }
    }
}
