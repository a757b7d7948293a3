//! The lease API of pull workers (`docs/pull.md`): claim a pull tenant's
//! due events, then heartbeat, complete, fail or release each lease.
//!
//! Bodies are validated by `belfry_core::pull::limits`; the engine's pull
//! queue answers. A dropped request (a long-poll whose worker went away)
//! abandons its claim: the engine's waiting future is dropped with it. In
//! a cluster, calls on leases other nodes hold are forwarded there, and
//! claims reach other nodes' ready entries too (see [`super::forward`]).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use belfry_core::SinkConfig;
use belfry_core::pull::{
    ClaimBody, CompleteBody, FailBody, GrantedLease, HeartbeatBody, LeaseCall, LeaseId, PullError,
    ReleaseBody, Reply,
};
use serde_json::json;

use crate::ApiState;
use crate::answers::AnswerBudget;
use crate::auth::Principal;
use crate::error::{ApiError, V1Error};
use crate::extract::{V1Json, V1JsonBytes, V1Path};
use crate::v1::forward;
use crate::v1::invalid_request;
use crate::v1::tenants::{tenant_name, tenant_not_found};
use crate::v1::views::EventView;

pub(super) fn pull_error(error: PullError) -> V1Error {
    let status = match error {
        PullError::LeaseLost => StatusCode::CONFLICT,
        PullError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        PullError::TooManyWaiters | PullError::TooManyCalls | PullError::TooManyLeases => {
            StatusCode::TOO_MANY_REQUESTS
        }
    };
    V1Error(ApiError::new(status, error.code(), error.to_string()))
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One lease as a claim answers it. Serialized straight from this struct
/// (not through a `Value` tree): a busy claim loop answers thousands a
/// second.
#[derive(serde::Serialize)]
pub(super) struct LeaseView<'a> {
    lease_id: String,
    event: EventView<'a>,
    queue: &'a str,
    attempt: u32,
    max_attempts: u32,
    due_at: String,
    leased_at: String,
    lease_expires_at: String,
    deadline_at: String,
    heartbeat_interval_ms: u64,
}

pub(super) fn lease_view(lease: &GrantedLease) -> LeaseView<'_> {
    LeaseView {
        lease_id: lease.lease.to_string(),
        event: EventView::from(&lease.record),
        queue: lease.queue.as_str(),
        attempt: lease.attempt,
        max_attempts: lease.max_attempts,
        due_at: lease.due_at.to_rfc3339(),
        leased_at: lease.leased_at.to_rfc3339(),
        lease_expires_at: lease.expires_at.to_rfc3339(),
        deadline_at: lease.deadline_at.to_rfc3339(),
        heartbeat_interval_ms: millis(lease.heartbeat_interval),
    }
}

/// `{"leases": [...]}`.
#[derive(serde::Serialize)]
struct LeaseList<'a> {
    leases: Vec<LeaseView<'a>>,
}

/// The answer to a reply of the pull queue.
pub(super) fn answer(reply: Reply) -> Result<Response, V1Error> {
    let body = match reply {
        Reply::Leases(leases) => {
            let list = LeaseList {
                leases: leases.iter().map(lease_view).collect(),
            };
            return Ok(Json(list).into_response());
        }
        Reply::Heartbeat {
            expires_at,
            cancel_requested,
        } => json!({
            "lease_expires_at": expires_at.to_rfc3339(),
            "cancel_requested": cancel_requested,
        }),
        Reply::Completed => json!({ "state": "delivered" }),
        Reply::Failed {
            next_attempt_at: Some(at),
        } => json!({ "state": "scheduled", "next_attempt_at": at.to_rfc3339() }),
        Reply::Failed {
            next_attempt_at: None,
        } => json!({ "state": "failed" }),
        Reply::Released { next_attempt_at } => {
            json!({ "state": "scheduled", "next_attempt_at": next_attempt_at.to_rfc3339() })
        }
        Reply::Error(error) => return Err(pull_error(error)),
    };
    Ok(Json(body).into_response())
}

/// Claims up to `max_events` due events of a pull tenant.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/leases",
    tag = "leases",
    operation_id = "claim_leases",
    summary = "Claim due events of a pull tenant (long-polls up to wait_ms)",
    params(("tenant" = String, Path, description = "Tenant name, one percent-encoded segment (`/` as `%2F`)")),
    request_body(content = crate::openapi::schema::ClaimLeases, content_type = "application/json"),
    responses(
        (status = 200, description = "The leases granted (perhaps none)", body = crate::openapi::schema::LeaseList),
        (status = 400, description = "Bad input, or not a pull tenant", body = crate::openapi::schema::V1Error),
        (status = 401, description = "No valid key", body = crate::openapi::schema::V1Error),
        (status = 403, description = "The key may not do this", body = crate::openapi::schema::V1Error),
        (status = 404, description = "Unknown tenant", body = crate::openapi::schema::V1Error),
        (status = 413, description = "Body too large", body = crate::openapi::schema::V1Error),
        (status = 415, description = "Not JSON", body = crate::openapi::schema::V1Error),
        (status = 429, description = "Too many claims waiting, the tenant holds its share of the node's leases (`too_many_leases`), or rate limit", body = crate::openapi::schema::V1Error),
        (status = 500, description = "Internal error (details only in the log)", body = crate::openapi::schema::V1Error),
        (status = 503, description = "Store unavailable; retry", body = crate::openapi::schema::V1Error)
    )
)]
pub(crate) async fn claim(
    State(state): State<ApiState>,
    Extension(budget): Extension<AnswerBudget>,
    principal: Principal,
    headers: HeaderMap,
    V1Path(tenant): V1Path<String>,
    V1Json(body): V1Json<ClaimBody>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let mut request = body
        .validate()
        .map_err(|e| invalid_request(e.to_string()))?;
    // One answer's worth of payloads, however many events that is.
    request.max_bytes = budget.per_answer();
    match state
        .engine
        .store()
        .get_tenant(&name)
        .await?
        .map(|t| t.sink)
    {
        // A claim may name only the queues the tenant declares.
        Some(SinkConfig::Pull(target)) => target
            .check_queues("queues", request.queues.iter().flatten())
            .map_err(|e| invalid_request(e.to_string()))?,
        Some(_) => {
            return Err(invalid_request(format!(
                "tenant {name:?} is not a pull tenant (its sink is not {{\"type\": \"pull\"}})"
            )));
        }
        None => return Err(tenant_not_found(&name)),
    }
    if let Some(answered) = forward::claim(&state, &headers, &principal, &name, &request).await {
        return answered;
    }
    match state.engine.pull().claim(name, request).await {
        Reply::Leases(leases) => {
            let list = LeaseList {
                leases: leases.iter().map(lease_view).collect(),
            };
            let json = serde_json::to_vec(&list).map_err(|error| {
                tracing::error!(%error, "a lease list did not serialize");
                V1Error(ApiError::internal())
            })?;
            Ok(budget.answer_now(json))
        }
        other => answer(other),
    }
}

/// The lease named in the path, if the principal reaches its tenant; a
/// lease of another tenant is as unknown as one never issued.
fn lease_of(principal: &Principal, text: &str) -> Result<LeaseId, V1Error> {
    let lease = LeaseId::parse(text).map_err(|e| invalid_request(format!("lease_id: {e}")))?;
    if !principal.may_pull(lease.tenant()) {
        return Err(pull_error(PullError::LeaseLost));
    }
    Ok(lease)
}

macro_rules! lease_route {
    ($name:ident, $call:literal, $summary:literal, $body:ty, $schema:ty, $answer:ty, |$validated:ident| $make:expr) => {
        #[utoipa::path(
            post,
            path = concat!("/v1/leases/{lease_id}/", $call),
            tag = "leases",
            operation_id = concat!($call, "_lease"),
            summary = $summary,
            params(("lease_id" = String, Path, description = "The lease id a claim answered")),
            request_body(content = $schema, content_type = "application/json"),
            responses(
                (status = 200, description = "Done", body = $answer),
                (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
                (status = 401, description = "No valid key", body = crate::openapi::schema::V1Error),
                (status = 403, description = "The key may not do this", body = crate::openapi::schema::V1Error),
                (status = 409, description = "lease_lost: expired, ended, superseded or moved", body = crate::openapi::schema::V1Error),
                (status = 413, description = "Body too large", body = crate::openapi::schema::V1Error),
                (status = 415, description = "Not JSON", body = crate::openapi::schema::V1Error),
                (status = 429, description = "Too many calls on this lease, or rate limit", body = crate::openapi::schema::V1Error),
                (status = 500, description = "Internal error (details only in the log)", body = crate::openapi::schema::V1Error),
                (status = 503, description = "Store unavailable, or (cluster) the node holding the lease cannot be reached and the store shows no outcome of this call; whether it took effect is not known; repeating it is safe", body = crate::openapi::schema::V1Error)
            )
        )]
        pub(crate) async fn $name(
            State(state): State<ApiState>,
            principal: Principal,
            headers: HeaderMap,
            V1Path(lease): V1Path<String>,
            V1JsonBytes(body, raw): V1JsonBytes<$body>,
        ) -> Result<Response, V1Error> {
            let lease = lease_of(&principal, &lease)?;
            let $validated = body.validate().map_err(|e| invalid_request(e.to_string()))?;
            let call = $make;
            match forward::lease_owner(&state, &headers, &lease) {
                Ok(None) => answer(state.engine.pull().call(lease, call).await),
                Ok(Some(owner)) => {
                    let path = format!(concat!("/v1/leases/{}/", $call), lease);
                    forward::lease_call(&state, &principal, &owner, &lease, &call, &path, raw).await
                }
                Err(forward::NoOwner) => forward::owner_unreachable(&state, &lease, &call).await,
            }
        }
    };
}

lease_route!(
    heartbeat,
    "heartbeat",
    "Extend a lease (never past its deadline); says whether the event was cancelled",
    HeartbeatBody,
    crate::openapi::schema::HeartbeatLease,
    crate::openapi::schema::HeartbeatAnswer,
    |extend| LeaseCall::Heartbeat { extend }
);
lease_route!(
    complete,
    "complete",
    "End a lease: the event is delivered (a repeat answers the same)",
    CompleteBody,
    crate::openapi::schema::CompleteLease,
    crate::openapi::schema::LeaseState,
    |result| LeaseCall::Complete { result }
);
lease_route!(
    fail,
    "fail",
    "End a lease with a failed attempt: retried after its back-off, or failed",
    FailBody,
    crate::openapi::schema::FailLease,
    crate::openapi::schema::LeaseState,
    |request| LeaseCall::Fail(request)
);
lease_route!(
    release,
    "release",
    "Give the event back without counting an attempt",
    ReleaseBody,
    crate::openapi::schema::ReleaseLease,
    crate::openapi::schema::LeaseState,
    |delay| LeaseCall::Release { delay }
);
