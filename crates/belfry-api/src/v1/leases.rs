//! The lease API of pull workers (`docs/pull.md`): claim a pull tenant's
//! due events, then heartbeat, complete, fail or release each lease.
//!
//! Bodies are validated by `belfry_core::pull::limits`; the engine's pull
//! queue answers. A dropped request (a long-poll whose worker went away)
//! abandons its claim: the engine's waiting future is dropped with it. In
//! a cluster, calls on leases other nodes hold are forwarded there, and
//! claims reach other nodes' ready entries too (see [`super::forward`]).

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use belfry_core::SinkConfig;
use belfry_core::pull::limits::ErrorBody;
use belfry_core::pull::{
    ClaimBody, CompleteBody, FailBody, HeartbeatBody, LeaseCall, LeaseId, PullError, ReleaseBody,
    Reply,
};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::ApiState;
use crate::answers::AnswerBudget;
use crate::auth::Principal;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::whole::Whole;
use crate::extract::{V1Json, V1JsonBytes, V1Path};
use crate::v1::forward;
use crate::v1::invalid_request;
use crate::v1::replies::{HeartbeatAnswer, LeaseList, LeaseState, answer, lease_view, pull_error};
use crate::v1::{tenant_name, tenant_not_found};

/// Body of `POST /v1/tenants/{tenant}/leases`: `ClaimBody`'s fields,
/// with the limits its `validate` checks.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker_id": "w-7", "max_events": 10, "lease_ms": 30000, "wait_ms": 20000}))]
pub(crate) struct ClaimLeases {
    /// 1 to 128 bytes, no control characters.
    #[schema(value_type = String, required = true, min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$")]
    worker_id: Option<String>,
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 100)]
    max_events: Option<Whole<u64>>,
    #[schema(value_type = Option<u64>, minimum = 1000, maximum = 900000)]
    lease_ms: Option<Whole<u64>>,
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 30000)]
    wait_ms: Option<Whole<u64>>,
    /// Only events of these named queues (1 to 32 names); omitted: all of
    /// the tenant's queues, in turn.
    #[schema(min_items = 1, max_items = 32)]
    queues: Option<Vec<String>>,
}

impl From<ClaimLeases> for ClaimBody {
    fn from(body: ClaimLeases) -> Self {
        ClaimBody {
            worker_id: body.worker_id,
            max_events: body.max_events.map(Whole::get),
            lease_ms: body.lease_ms.map(Whole::get),
            wait_ms: body.wait_ms.map(Whole::get),
            queues: body.queues,
        }
    }
}

/// Body of a heartbeat (`{}`: the lease's own length).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeartbeatLease {
    #[schema(value_type = Option<u64>, minimum = 1000, maximum = 900000)]
    extend_ms: Option<Whole<u64>>,
}

impl From<HeartbeatLease> for HeartbeatBody {
    fn from(body: HeartbeatLease) -> Self {
        HeartbeatBody {
            extend_ms: body.extend_ms.map(Whole::get),
        }
    }
}

/// Body of a completion.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteLease {
    /// Any JSON, its text up to 64 KiB.
    #[schema(value_type = Object)]
    result: Option<Value>,
}

impl From<CompleteLease> for CompleteBody {
    fn from(body: CompleteLease) -> Self {
        CompleteBody {
            result: body.result,
        }
    }
}

/// The worker's account of a failure.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LeaseErrorBody)]
pub(crate) struct LeaseError {
    /// 1 to 64 letters, digits, `_`, `-`, `.`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    code: String,
    /// Up to 4096 bytes.
    #[serde(default)]
    #[schema(max_length = 4096)]
    message: String,
}

/// Body of a failure.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailLease {
    error: LeaseError,
    /// Not with `permanent: true`.
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 86400000)]
    retry_after_ms: Option<Whole<u64>>,
    #[serde(default)]
    permanent: bool,
}

impl From<FailLease> for FailBody {
    fn from(body: FailLease) -> Self {
        FailBody {
            error: ErrorBody {
                code: body.error.code,
                message: body.error.message,
            },
            retry_after_ms: body.retry_after_ms.map(Whole::get),
            permanent: body.permanent,
        }
    }
}

/// Body of a release.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseLease {
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 86400000)]
    delay_ms: Option<Whole<u64>>,
}

impl From<ReleaseLease> for ReleaseBody {
    fn from(body: ReleaseLease) -> Self {
        ReleaseBody {
            delay_ms: body.delay_ms.map(Whole::get),
        }
    }
}

/// Claims up to `max_events` due events of a pull tenant.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/leases",
    tag = "leases",
    operation_id = "claim_leases",
    summary = "Claim due events of a pull tenant (long-polls up to wait_ms)",
    params(crate::openapi::schema::TenantPath),
    request_body(content = ClaimLeases, content_type = "application/json"),
    responses(
        (status = 200, description = "The leases granted (perhaps none)", body = LeaseList),
        (status = 400, description = "Bad input, or not a pull tenant", body = crate::openapi::schema::V1Error),
        (status = 401, description = "No valid key", body = crate::openapi::schema::V1Error),
        (status = 403, description = "The key may not do this", body = crate::openapi::schema::V1Error),
        (status = 409, description = "tenant_paused: the tenant's deliveries are paused", body = crate::openapi::schema::V1Error),
        (status = 429, description = "Too many claims waiting, the tenant holds its share of the node's leases (`too_many_leases`), or rate limit", body = crate::openapi::schema::V1Error),
        (status = 500, description = "Internal error (details only in the log)", body = crate::openapi::schema::V1Error),
        (status = 503, description = "Store unavailable; retry", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1TenantBodyErrors
    )
)]
pub(crate) async fn claim(
    State(state): State<ApiState>,
    Extension(budget): Extension<AnswerBudget>,
    principal: Principal,
    headers: HeaderMap,
    V1Path(tenant): V1Path<String>,
    V1Json(body): V1Json<ClaimLeases>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let mut request = ClaimBody::from(body)
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
    if state.engine.tenants().is_paused(&name).await? {
        return Err(V1Error(ApiError::new(
            Code::TenantPaused,
            format!("tenant {name} is paused: its workers claim nothing until it is resumed"),
        )));
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
    ($name:ident, $call:literal, $summary:literal, $body:ty, $core:ty, $answer:ty, |$validated:ident| $make:expr) => {
        #[utoipa::path(
            post,
            path = concat!("/v1/leases/{lease_id}/", $call),
            tag = "leases",
            operation_id = concat!($call, "_lease"),
            summary = $summary,
            params(("lease_id" = String, Path, description = "The lease id a claim answered")),
            request_body(content = $body, content_type = "application/json"),
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
            let $validated = <$core>::from(body)
                .validate()
                .map_err(|e| invalid_request(e.to_string()))?;
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
    HeartbeatLease,
    HeartbeatBody,
    HeartbeatAnswer,
    |extend| LeaseCall::Heartbeat { extend }
);
lease_route!(
    complete,
    "complete",
    "End a lease: the event is delivered (a repeat answers the same)",
    CompleteLease,
    CompleteBody,
    LeaseState,
    |result| LeaseCall::Complete { result }
);
lease_route!(
    fail,
    "fail",
    "End a lease with a failed attempt: retried after its back-off, or failed",
    FailLease,
    FailBody,
    LeaseState,
    |request| LeaseCall::Fail(request)
);
lease_route!(
    release,
    "release",
    "Give the event back without counting an attempt",
    ReleaseLease,
    ReleaseBody,
    LeaseState,
    |delay| LeaseCall::Release { delay }
);
