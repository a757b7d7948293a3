//! `/v1/keys` and `/v1/audit`, and [`audit`], which the routes that change
//! tenants call.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use belfry_core::auth::{ApiKey, AuditAction, AuditEntry, KeyId, KeySecret, Role};
use belfry_core::{TenantName, Timestamp};
use belfry_store::AuditPageParams;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Principal, Scope};
use crate::ApiState;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::{V1Json, V1Path, query_pairs, query_value};

/// The path of the keys (create, list).
const KEYS: &str = "/v1/keys";

/// Appends to the audit log. The change it records is done already, so a
/// failure is logged, not answered.
pub(crate) async fn audit(
    state: &ApiState,
    principal: &Principal,
    action: AuditAction,
    tenant: Option<&TenantName>,
    target: Option<String>,
) {
    let entry = match AuditEntry::new(
        state.engine.now(),
        principal.actor(),
        action,
        tenant.cloned(),
        target,
    ) {
        Ok(entry) => entry,
        Err(error) => {
            tracing::error!(%error, action = action.as_str(), "audit entry not written");
            return;
        }
    };
    if let Err(error) = state.engine.store().append_audit(entry).await {
        tracing::error!(%error, action = action.as_str(), "audit entry not written");
    }
}

/// Body of `POST /v1/keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a key object")]
#[schema(example = json!({"tenant": "acme/orders", "role": "write"}))]
pub(crate) struct CreateKey {
    /// Absent (or `null`) exactly for `admin`; 1 to 200 bytes, no control
    /// characters.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    tenant: Option<String>,
    #[schema(value_type = KeyRole)]
    role: String,
    /// RFC 3339, in the future.
    #[serde(default)]
    #[schema(format = DateTime)]
    expires_at: Option<String>,
}

/// What a key may do: `read`, `write`, `worker` (pull workers) or `admin`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum KeyRole {
    Read,
    Write,
    Worker,
    Admin,
}

impl From<Role> for KeyRole {
    fn from(role: Role) -> Self {
        match role {
            Role::Read => KeyRole::Read,
            Role::Write => KeyRole::Write,
            Role::Worker => KeyRole::Worker,
            Role::Admin => KeyRole::Admin,
        }
    }
}

/// The creation answer: the only time the secret is shown.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CreatedKey<'a> {
    id: String,
    /// `bfy_…`.
    secret: &'a str,
    tenant: Option<String>,
    role: KeyRole,
    expires_at: Option<String>,
    created_at: String,
}

/// The keys a listing shows.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyList {
    keys: Vec<KeyView>,
}

/// `GET /v1/whoami`: the key a request carries.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"key_id": "key_4f2a", "role": "read", "tenant": "acme/orders", "can_write": false, "open": false}))]
pub(crate) struct Whoami<'a> {
    /// `null` without a key (open mode, or none sent).
    key_id: Option<String>,
    /// Open mode: `admin`; `null` when no key was sent and keys are
    /// required.
    role: Option<KeyRole>,
    /// A tenant key's tenant; `null` for admins.
    tenant: Option<&'a str>,
    /// Whether the key may change data.
    can_write: bool,
    /// Whether the node runs without keys (everyone is admin).
    open: bool,
}

/// One entry of the audit log.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditEntryView<'a> {
    id: &'a str,
    at: String,
    /// A key id, or `open`, `cli`, `bootstrap`.
    actor: &'a str,
    #[schema(value_type = String)]
    action: AuditAction,
    tenant: Option<&'a str>,
    target: Option<&'a str>,
}

/// A page of the audit log, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditPage<'a> {
    entries: Vec<AuditEntryView<'a>>,
    /// Pass as `after` for the next page; `null` on the last.
    next: Option<String>,
}

/// A key as listings show it (never the secret, nor its hash).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyView {
    id: String,
    tenant: Option<String>,
    #[schema(value_type = KeyRole)]
    role: Role,
    expires_at: Option<String>,
    created_at: String,
    last_used_at: Option<String>,
}

impl From<&ApiKey> for KeyView {
    fn from(key: &ApiKey) -> Self {
        KeyView {
            id: key.id.to_string(),
            tenant: key.tenant.as_ref().map(|t| t.as_str().to_string()),
            role: key.role,
            expires_at: key.expires_at.map(Timestamp::to_rfc3339),
            created_at: key.created_at.to_rfc3339(),
            last_used_at: key.last_used_at.map(Timestamp::to_rfc3339),
        }
    }
}

/// `POST /v1/keys` (admin): 201 with the secret, the only time it is shown.
#[utoipa::path(
    post,
    path = KEYS,
    tag = "keys",
    operation_id = "create_key",
    summary = "Create an API key (admin)",
    request_body(content = CreateKey, content_type = "application/json"),
    responses(
        (status = 201, description = "The key and its secret, shown once", body = CreatedKey),
        (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
        (status = 413, description = "Body or payload too large", body = crate::openapi::schema::V1Error),
        (status = 415, description = "Not JSON", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1Errors
    )
)]
pub(crate) async fn create(
    State(state): State<ApiState>,
    principal: Principal,
    V1Json(body): V1Json<CreateKey>,
) -> Result<Response, V1Error> {
    let invalid = |message: String| V1Error(ApiError::new(Code::InvalidRequest, message));
    let role = Role::parse(&body.role).map_err(|e| invalid(e.to_string()))?;
    let tenant = body
        .tenant
        .map(TenantName::new)
        .transpose()
        .map_err(|e| V1Error(ApiError::new(Code::InvalidName, e.to_string())))?;
    let now = state.engine.now();
    let expires_at = match body.expires_at {
        None => None,
        Some(text) => {
            let at = Timestamp::parse_rfc3339(&text).ok_or_else(|| {
                V1Error(ApiError::new(
                    Code::InvalidTime,
                    "expires_at is not an RFC 3339 instant with an offset (e.g. 2030-01-31T04:00:30Z)",
                ))
            })?;
            if at <= now {
                return Err(V1Error(ApiError::new(
                    Code::InvalidTime,
                    "expires_at is not in the future",
                )));
            }
            Some(at)
        }
    };
    let secret = KeySecret::generate().map_err(|error| {
        tracing::error!(%error, "cannot generate a key");
        V1Error(ApiError::internal())
    })?;
    let key =
        ApiKey::new(&secret, tenant, role, now, expires_at).map_err(|e| invalid(e.to_string()))?;
    if !state.engine.store().put_api_key(key.clone()).await? {
        // 178 random bits collided: practically impossible.
        tracing::error!("a new key's hash already exists");
        return Err(V1Error(ApiError::internal()));
    }
    state.auth.key_created(key.clone());
    tracing::info!(key = %key.id, role = %key.role, tenant = ?key.tenant.as_ref().map(TenantName::as_str), "API key created");
    audit(
        &state,
        &principal,
        AuditAction::KeyCreated,
        key.tenant.as_ref(),
        Some(key.id.to_string()),
    )
    .await;
    let view = KeyView::from(&key);
    let created = CreatedKey {
        id: view.id,
        secret: secret.expose(),
        tenant: view.tenant,
        role: view.role.into(),
        expires_at: view.expires_at,
        created_at: view.created_at,
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// `GET /v1/keys`: every key for admins, a tenant's own keys for its keys.
#[utoipa::path(
    get,
    path = KEYS,
    tag = "keys",
    operation_id = "list_keys",
    summary = "API keys (a tenant key: its own tenant's)",
    responses(
        (status = 200, description = "The keys", body = KeyList),
        crate::openapi::schema::V1KeyErrors
    )
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    principal: Principal,
) -> Result<Response, V1Error> {
    let keys = state.engine.store().list_api_keys().await?;
    let keys = keys
        .iter()
        .filter(|key| principal.is_admin() || key.tenant.as_ref() == principal.tenant())
        .map(KeyView::from)
        .collect();
    Ok(Json(KeyList { keys }).into_response())
}

/// `DELETE /v1/keys/{id}` (admin): revokes at once on this node (within
/// `auth.key_cache_ttl_ms` on the others).
#[utoipa::path(
    delete,
    path = "/v1/keys/{id}",
    tag = "keys",
    operation_id = "revoke_key",
    summary = "Revoke an API key (admin)",
    params(("id" = String, Path, description = "Key id, key_...")),
    responses(
        (status = 204, description = "Revoked"),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn revoke(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(id): V1Path<String>,
) -> Result<Response, V1Error> {
    let not_found = || V1Error(ApiError::new(Code::KeyNotFound, format!("no key {id:?}")));
    let key_id = KeyId::parse(&id).ok_or_else(not_found)?;
    let removed = state
        .engine
        .store()
        .delete_api_key(&key_id)
        .await?
        .ok_or_else(not_found)?;
    state.auth.key_revoked(&removed);
    tracing::info!(key = %removed.id, "API key revoked");
    audit(
        &state,
        &principal,
        AuditAction::KeyRevoked,
        removed.tenant.as_ref(),
        Some(removed.id.to_string()),
    )
    .await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/whoami`: the key the request carries, its role and tenant, so
/// a client (the console) can show them and offer only what the key may
/// do. Answers without a key too: then only whether the node runs open
/// (an anonymous request anywhere else tells as much by its 401).
#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "keys",
    operation_id = "whoami",
    summary = "The key this request carries: its id, role and tenant",
    responses(
        (status = 200, description = "The key (or none)", body = Whoami),
        (status = 401, description = "A key was sent and it is not valid", body = crate::openapi::schema::V1Error),
        (status = 403, description = "This Host is not allowed while the node runs open", body = crate::openapi::schema::V1Error),
        (status = 429, description = "Rate limit or quota", body = crate::openapi::schema::V1Error),
        (status = 500, description = "Internal error (details only in the log)", body = crate::openapi::schema::V1Error),
        (status = 503, description = "Store unavailable; retry", body = crate::openapi::schema::V1Error)
    )
)]
pub(crate) async fn whoami(principal: Option<axum::Extension<Principal>>) -> Response {
    let Some(axum::Extension(principal)) = principal else {
        let nobody = Whoami {
            key_id: None,
            role: None,
            tenant: None,
            can_write: false,
            open: false,
        };
        return Json(nobody).into_response();
    };
    let role = match &principal.scope {
        Scope::Open | Scope::Admin => Role::Admin,
        Scope::Tenant { role, .. } => *role,
    };
    let answer = Whoami {
        key_id: principal.key.as_ref().map(ToString::to_string),
        role: Some(role.into()),
        tenant: principal.tenant().map(TenantName::as_str),
        can_write: principal.can_write(),
        open: principal.scope == Scope::Open,
    };
    Json(answer).into_response()
}

/// Default and largest page of `GET /v1/audit`.
const AUDIT_PAGE: usize = 100;
const AUDIT_PAGE_MAX: usize = 1_000;

/// `GET /v1/audit[?after=CURSOR][&limit=N]` (admin): oldest first; `next`
/// is the cursor of the following page (`null` on the last).
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "keys",
    operation_id = "audit_log",
    summary = "The audit log, oldest first (admin)",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "1 to 1000; default 100"), ("after" = Option<String>, Query, pattern = "^[+-]?[0-9]{1,18}\\.[A-Za-z0-9]+$", description = "next of the previous page")),
    responses(
        (status = 200, description = "A page", body = AuditPage),
        (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1Errors
    )
)]
pub(crate) async fn audit_log(
    State(state): State<ApiState>,
    uri: Uri,
) -> Result<Response, V1Error> {
    let pairs = query_pairs(&uri)?;
    let limit = match query_value(&pairs, "limit") {
        None => AUDIT_PAGE,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=AUDIT_PAGE_MAX).contains(n))
            .ok_or_else(|| {
                V1Error(ApiError::new(
                    Code::InvalidQuery,
                    format!("limit must be a whole number from 1 to {AUDIT_PAGE_MAX}"),
                ))
            })?,
    };
    let after = match query_value(&pairs, "after") {
        None => None,
        Some(cursor) => Some(parse_cursor(cursor).ok_or_else(|| {
            V1Error(ApiError::new(
                Code::InvalidCursor,
                "after is not a cursor this API answered",
            ))
        })?),
    };
    let entries = state
        .engine
        .store()
        .list_audit(AuditPageParams { after, limit })
        .await?;
    let next = (entries.len() == limit)
        .then(|| {
            entries
                .last()
                .map(|e| format!("{}.{}", e.at.as_millis(), e.id))
        })
        .flatten();
    let entries = entries
        .iter()
        .map(|e| AuditEntryView {
            id: &e.id,
            at: e.at.to_rfc3339(),
            actor: &e.actor,
            action: e.action,
            tenant: e.tenant.as_ref().map(TenantName::as_str),
            target: e.target.as_deref(),
        })
        .collect();
    Ok(Json(AuditPage { entries, next }).into_response())
}

fn parse_cursor(text: &str) -> Option<(Timestamp, String)> {
    let (at, id) = text.split_once('.')?;
    let at = at.parse::<i64>().ok()?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| (Timestamp::from_millis(at), id.to_string()))
}
