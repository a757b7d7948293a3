//! The pull queue's replies as answers, for the calls this node serves and
//! for those forwarded to it.

use axum::Json;
use axum::response::{IntoResponse, Response};
use belfry_core::pull::{GrantedLease, PullError, Reply};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, V1Error};
use crate::v1::views::EventView;

pub(crate) fn pull_error(error: PullError) -> V1Error {
    V1Error(ApiError::new(error.into(), error.to_string()))
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One lease as a claim answers it. Serialized straight from this struct
/// (not through a `Value` tree): a busy claim loop answers thousands a
/// second.
#[derive(Serialize, ToSchema)]
pub(crate) struct LeaseView<'a> {
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

pub(crate) fn lease_view(lease: &GrantedLease) -> LeaseView<'_> {
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

/// The leases a claim granted.
#[derive(Serialize, ToSchema)]
pub(crate) struct LeaseList<'a> {
    pub(crate) leases: Vec<LeaseView<'a>>,
}

/// The answer to a heartbeat.
#[derive(Serialize, ToSchema)]
pub(crate) struct HeartbeatAnswer {
    lease_expires_at: String,
    /// The event was cancelled: stop working on it.
    cancel_requested: bool,
}

/// Where the event stands after a lease ended.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case", tag = "state")]
pub(crate) enum LeaseState {
    Delivered,
    /// Due again at `next_attempt_at`.
    Scheduled {
        next_attempt_at: String,
    },
    Failed,
}

/// The answer to a reply of the pull queue.
pub(crate) fn answer(reply: Reply) -> Result<Response, V1Error> {
    let state = match reply {
        Reply::Leases(leases) => {
            let list = LeaseList {
                leases: leases.iter().map(lease_view).collect(),
            };
            return Ok(Json(list).into_response());
        }
        Reply::Heartbeat {
            expires_at,
            cancel_requested,
        } => {
            let answer = HeartbeatAnswer {
                lease_expires_at: expires_at.to_rfc3339(),
                cancel_requested,
            };
            return Ok(Json(answer).into_response());
        }
        Reply::Completed => LeaseState::Delivered,
        Reply::Failed {
            next_attempt_at: Some(at),
        } => LeaseState::Scheduled {
            next_attempt_at: at.to_rfc3339(),
        },
        Reply::Failed {
            next_attempt_at: None,
        } => LeaseState::Failed,
        Reply::Released { next_attempt_at } => LeaseState::Scheduled {
            next_attempt_at: next_attempt_at.to_rfc3339(),
        },
        Reply::Error(error) => return Err(pull_error(error)),
    };
    Ok(Json(state).into_response())
}
