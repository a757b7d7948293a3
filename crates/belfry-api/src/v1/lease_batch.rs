//! `POST /v1/tenants/{tenant}/leases/complete`: a worker completes up to
//! 100 leases of its tenant in one request (`docs/pull.md`).
//!
//! Each item goes through the same path as `POST
//! /v1/leases/{lease_id}/complete` (the pull queue, a fenced store write
//! per lease); the items are sent together, so the store's group commit
//! records them in one batch. Each item is answered on its own, in
//! order: `{"lease_id", "state": "delivered"}` or `{"lease_id", "error":
//! {"code", "message"}}` (`lease_lost` for a lease of another tenant, as
//! for one never issued). A body out of the limits is `400` and changes
//! nothing. In a cluster, an item whose lease another node holds is
//! completed there (`forward::complete_on`), as a single call would be;
//! when no owner can be asked, the item is answered from the store's
//! record of its lease (`delivered` if it shows the lease completed),
//! else `node_unavailable`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use belfry_core::pull::{CompleteBody, LeaseCall, LeaseId, PullError, Reply};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::error::V1Error;
use crate::extract::{V1Json, V1Path};
use crate::v1::forward;
use crate::v1::invalid_request;
use crate::v1::tenant_name;

/// Most leases one request completes (a claim's most events).
pub const MAX_BATCH_COMPLETES: usize = belfry_core::pull::limits::MAX_EVENTS_PER_CLAIM as usize;

/// Body of `POST /v1/tenants/{tenant}/leases/complete`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CompleteLeases)]
#[schema(example = json!({"leases": [{"lease_id": "AAAB…", "result": {"rows": 3}}, {"lease_id": "AAAC…"}]}))]
pub(crate) struct CompleteBatchBody {
    /// 1 to 100 leases of the path's tenant.
    #[schema(min_items = 1, max_items = 100)]
    leases: Vec<CompleteBatchItem>,
}

/// One lease to complete.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CompleteLeaseItem)]
struct CompleteBatchItem {
    lease_id: String,
    /// Any JSON, its text up to 64 KiB.
    #[serde(default)]
    #[schema(value_type = Object)]
    result: Option<Value>,
}

/// The error of one item.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = CompleteLeaseError)]
pub(crate) struct ItemError {
    /// `lease_lost`, `too_many_calls`, `store_unavailable` or
    /// `node_unavailable`.
    code: String,
    message: String,
}

/// One lease's outcome: `state` (`delivered`) or `error`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = CompleteLeaseOutcome)]
pub(crate) enum ItemAnswer {
    Delivered {
        lease_id: String,
        /// `delivered`.
        state: &'static str,
    },
    Refused {
        lease_id: String,
        error: ItemError,
    },
}

/// Each lease's outcome, in the request's order.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = CompleteLeasesAnswer)]
pub(crate) struct BatchAnswer {
    results: Vec<ItemAnswer>,
}

/// One item's outcome, as answered.
fn item_answer(lease_id: &str, reply: Reply) -> ItemAnswer {
    match reply {
        Reply::Completed => item_delivered(lease_id),
        Reply::Error(error) => item_error(lease_id, error),
        // A complete is answered `Completed` or an error.
        _ => item_error(lease_id, PullError::Unavailable),
    }
}

fn item_delivered(lease_id: &str) -> ItemAnswer {
    ItemAnswer::Delivered {
        lease_id: lease_id.to_string(),
        state: "delivered",
    }
}

fn item_error(lease_id: &str, error: PullError) -> ItemAnswer {
    item_error_as(lease_id, error.code(), &error.to_string())
}

fn item_error_as(lease_id: &str, code: &str, message: &str) -> ItemAnswer {
    ItemAnswer::Refused {
        lease_id: lease_id.to_string(),
        error: ItemError {
            code: code.to_string(),
            message: message.to_string(),
        },
    }
}

/// Completes several leases of one tenant; one answer per lease, in order.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant}/leases/complete",
    tag = "leases",
    operation_id = "complete_leases",
    summary = "Complete up to 100 leases of a tenant at once; each lease answered on its own",
    params(crate::openapi::schema::TenantPath),
    request_body(content = CompleteBatchBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Each lease's outcome, in order", body = BatchAnswer),
        (status = 400, description = "Bad input (no lease, more than 100, a malformed lease id, a result too large); nothing was changed", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1TenantWriteErrors
    )
)]
pub(crate) async fn complete_batch(
    State(state): State<ApiState>,
    principal: Principal,
    headers: HeaderMap,
    V1Path(tenant): V1Path<String>,
    V1Json(body): V1Json<CompleteBatchBody>,
) -> Result<Response, V1Error> {
    let tenant = tenant_name(tenant)?;
    if body.leases.is_empty() || body.leases.len() > MAX_BATCH_COMPLETES {
        return Err(invalid_request(format!(
            "leases must hold 1 to {MAX_BATCH_COMPLETES} items"
        )));
    }
    // Every item is validated before any is sent: a bad body changes
    // nothing.
    let mut calls = Vec::with_capacity(body.leases.len());
    for (index, item) in body.leases.into_iter().enumerate() {
        let lease = LeaseId::parse(&item.lease_id)
            .map_err(|e| invalid_request(format!("leases[{index}].lease_id: {e}")))?;
        let result = CompleteBody {
            result: item.result,
        }
        .validate()
        .map_err(|e| invalid_request(format!("leases[{index}].{e}")))?;
        calls.push((item.lease_id, lease, result));
    }
    let answers = futures::future::join_all(calls.into_iter().map(|(text, lease, result)| {
        let state = &state;
        let headers = &headers;
        let principal = &principal;
        let tenant = &tenant;
        async move {
            // The route admitted the key for the path's tenant only: a
            // lease of another tenant is as unknown as one never issued.
            if lease.tenant() != tenant {
                belfry_metrics::pull_error(PullError::LeaseLost.code());
                return item_error(&text, PullError::LeaseLost);
            }
            let owner = match forward::lease_owner(state, headers, &lease) {
                Ok(None) => {
                    let reply = state
                        .engine
                        .pull()
                        .call(lease, LeaseCall::Complete { result })
                        .await;
                    return item_answer(&text, reply);
                }
                Ok(Some(owner)) => Some(owner),
                Err(forward::NoOwner) => None,
            };
            if let Some(owner) = owner {
                match forward::complete_on(state, principal, &owner, &text, result.as_deref()).await
                {
                    Ok(()) => return item_delivered(&text),
                    Err(forward::NotCompleted::Refused(code, message)) => {
                        return item_error_as(&text, &code, &message);
                    }
                    Err(forward::NotCompleted::Unanswered) => {}
                }
            }
            // No owner could be asked: the store's record answers, if it
            // shows the lease completed.
            let call = LeaseCall::Complete { result };
            match forward::recorded(state, &lease, &call).await {
                Some(reply) => item_answer(&text, reply),
                None => {
                    let V1Error(error) = forward::node_unavailable();
                    item_error_as(&text, error.code.as_str(), &error.message)
                }
            }
        }
    }))
    .await;
    Ok(Json(BatchAnswer { results: answers }).into_response())
}
