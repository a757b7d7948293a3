//! Whether a cancelled or moved version's delivery had started: the
//! `previous_delivery` of a cancel's or a move's answer (`docs/api.md`,
//! "Conditional edits").
//!
//! The store's record shows the attempts recorded; an attempt in flight is
//! known only to the node owning the event's partition. So before a cancel
//! or a move answers `not_started` from the record, that node is asked:
//! this one when it owns the partition, else its owner, by a signed
//! forward (`POST …/events/{id}/delivery-started`, answered only when
//! forwarded). The owner takes the change in before it looks (a delivery
//! that read the record before the change reads it again before it
//! claims), so `not_started` is final: that version is never sent. When no
//! owner answers in time, the answer is `unknown`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use belfry_core::event::PreviousDelivery;
use belfry_core::{EventKey, EventVersion};
use belfry_store::Applied;
use serde::{Deserialize, Serialize};

use crate::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::{V1Json, V1Path};
use crate::v1::forward;

/// How long a cancel or a move waits for the owner's answer before it
/// answers `unknown`: the owner answers from memory.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// The peer route's path.
pub(crate) const PATH: &str = "/v1/tenants/{tenant}/events/{id}/delivery-started";

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Question {
    version: EventVersion,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Answer {
    started: bool,
}

/// Completes `applied`'s `previous_delivery` when the record said
/// `not_started`: whether an attempt of the replaced version is in flight.
pub(crate) async fn settle(state: &ApiState, principal: &Principal, applied: &mut Applied) {
    let Some(replaced) = applied.replaced.as_mut() else {
        return;
    };
    if replaced.delivery != PreviousDelivery::NotStarted {
        return;
    }
    let partitions = state.engine.partitions();
    replaced.delivery = match partitions.delivery_started(&applied.key, &replaced.version) {
        Some(started) => delivery(started),
        // A single node that does not own the partition fires nothing of
        // it (it is starting or stopping).
        None if state.cluster.peers().is_none() => PreviousDelivery::NotStarted,
        None => ask_owner(
            state,
            principal,
            applied.partition,
            &applied.key,
            &replaced.version,
        )
        .await
        .map_or(PreviousDelivery::Unknown, delivery),
    };
}

/// One path segment, percent-encoded (`/` too).
fn segment(text: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC)
}

fn delivery(started: bool) -> PreviousDelivery {
    if started {
        PreviousDelivery::Started
    } else {
        PreviousDelivery::NotStarted
    }
}

/// The owner's answer; `None` if there is no other live owner to ask or it
/// did not answer in time.
async fn ask_owner(
    state: &ApiState,
    principal: &Principal,
    partition: belfry_core::PartitionId,
    key: &EventKey,
    version: &EventVersion,
) -> Option<bool> {
    let owner = state.cluster.owner_of(partition)?;
    let path = format!(
        "/v1/tenants/{}/events/{}/delivery-started",
        segment(key.tenant.as_str()),
        segment(key.id.as_str()),
    );
    let body = serde_json::to_vec(&Question {
        version: version.clone(),
    })
    .ok()?;
    let asked = forward::post(
        state,
        principal,
        &owner.node,
        &owner.url,
        &path,
        body.into(),
    );
    match tokio::time::timeout(ASK_TIMEOUT, asked).await {
        Ok(Ok((StatusCode::OK, body))) => serde_json::from_slice::<Answer>(&body)
            .ok()
            .map(|answer| answer.started),
        Ok(Ok((status, _))) => {
            tracing::warn!(%status, node = %owner.node, "the partition's owner did not say whether a replaced version's delivery started");
            None
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, node = %owner.node, "asking the partition's owner whether a replaced version's delivery started failed");
            None
        }
        Err(_) => {
            tracing::warn!(node = %owner.node, "the partition's owner did not say in time whether a replaced version's delivery started");
            None
        }
    }
}

/// The owner's side: answered only to another node of the cluster (a
/// signed forward); to anyone else the route does not exist.
pub(crate) async fn delivery_started(
    State(state): State<ApiState>,
    V1Path((tenant, id)): V1Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    V1Json(question): V1Json<Question>,
) -> Result<Response, V1Error> {
    if !forward::is_forwarded(&headers) {
        return Err(V1Error(ApiError::new(
            Code::NotFound,
            format!("no route for {method} {}", uri.path()),
        )));
    }
    let key = super::event_key(tenant, id)?;
    match state
        .engine
        .partitions()
        .delivery_started(&key, &question.version)
    {
        Some(started) => Ok(Json(Answer { started }).into_response()),
        None => Err(V1Error(ApiError::new(
            Code::NodeUnavailable,
            "this node does not own the event's partition",
        ))),
    }
}
