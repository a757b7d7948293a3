//! Errors at the HTTP edge and their two renderings.
//!
//! Every failure is an [`ApiError`]: a status, a stable code and a message
//! that is safe to show to a client. Handlers of the native API return it
//! wrapped in [`V1Error`] (`{"error": {"code", "message"}}`); BigBen's routes
//! wrap it in [`BigBenError`] (`{"message"}`), as BigBen's clients expect.
//! Internal details (store errors, panics) go to the log, never to the body.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belfry_store::StoreError;
use serde_json::json;

/// Stable machine-readable error codes of the native API.
pub mod code {
    pub const INVALID_JSON: &str = "invalid_json";
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const INVALID_NAME: &str = "invalid_name";
    pub const INVALID_TIME: &str = "invalid_time";
    pub const INVALID_QUERY: &str = "invalid_query";
    pub const INVALID_CURSOR: &str = "invalid_cursor";
    pub const INVALID_SINK: &str = "invalid_sink";
    pub const UNSUPPORTED_SINK: &str = "unsupported_sink";
    pub const BATCH_TOO_LARGE: &str = "batch_too_large";
    pub const BODY_TOO_LARGE: &str = "body_too_large";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
    pub const TENANT_NOT_FOUND: &str = "tenant_not_found";
    pub const EVENT_NOT_FOUND: &str = "event_not_found";
    pub const SCHEDULE_NOT_FOUND: &str = "schedule_not_found";
    pub const BULK_ACTION_NOT_FOUND: &str = "bulk_action_not_found";
    pub const INVALID_CRON: &str = "invalid_cron";
    pub const INVALID_SCHEDULE: &str = "invalid_schedule";
    pub const NOT_FOUND: &str = "not_found";
    pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";
    pub const ALREADY_FINISHED: &str = "already_finished";
    pub const NOT_REDRIVABLE: &str = "not_redrivable";
    /// Deleting an event that is still scheduled or retrying (409):
    /// cancel it first.
    pub const EVENT_PENDING: &str = "event_pending";
    /// A tenant that still holds events or schedules cannot be removed.
    pub const TENANT_NOT_EMPTY: &str = "tenant_not_empty";
    pub const NOT_IMPLEMENTED: &str = "not_implemented";
    pub const STORE_UNAVAILABLE: &str = "store_unavailable";
    /// Cluster mode: the node holding a lease's partition cannot be
    /// reached right now (or is not known yet), and the store shows no
    /// outcome of the call: whether it took effect is not known; repeating
    /// it is safe.
    pub const NODE_UNAVAILABLE: &str = "node_unavailable";
    /// No key, or a malformed, unknown, revoked or expired one (401).
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// The key may not do this: a `read` key writing, a tenant key on an
    /// admin route (403).
    pub const FORBIDDEN: &str = "forbidden";
    /// A request marked as forwarded by another node whose signature does
    /// not hold: missing, malformed, for another node, stale, replayed or
    /// forged (403).
    pub const FORWARD_REFUSED: &str = "forward_refused";
    /// Keyless (open mode or `auth.mode = "none"`): the `Host` header is
    /// neither a loopback name nor in `auth.allowed_hosts` (403).
    pub const HOST_NOT_ALLOWED: &str = "host_not_allowed";
    /// Open mode: the request came through a proxy (it carries
    /// `Forwarded`, `X-Forwarded-*`, `X-Real-IP` or `Via`, or is HTTP/1.0),
    /// so it may come from anywhere (403).
    pub const PROXIED_REQUEST_REFUSED: &str = "proxied_request_refused";
    /// A key this node does not know yet, while its budget for reading
    /// unknown keys is spent (503, `Retry-After`).
    pub const KEY_LOOKUPS_BUSY: &str = "key_lookups_busy";
    /// A keyless bodiless write from a browser (403).
    pub const BROWSER_WRITE_REFUSED: &str = "browser_write_refused";
    /// The key is over `auth.rate_limit_per_key` (429, `Retry-After`).
    pub const RATE_LIMITED: &str = "rate_limited";
    pub const KEY_NOT_FOUND: &str = "key_not_found";
    pub const INTERNAL: &str = "internal";
    /// A per-tenant quota (pending events, schedules) would be passed.
    pub const QUOTA_EXCEEDED: &str = "quota_exceeded";
    /// An event's payload is larger than `limits.max_payload_bytes`.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// The node holds `api.max_answer_bytes_in_flight` of large answers
    /// already (503, `Retry-After`).
    pub const ANSWERS_BUSY: &str = "answers_busy";
    /// The tenant has `limits.max_bulk_actions_per_tenant` running (429).
    pub const TOO_MANY_BULK_ACTIONS: &str = "too_many_bulk_actions";
}

/// A failure to answer with: status, stable code, client-safe message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, code, message)
    }

    /// Maps a store failure and logs it: `Unavailable` is a 503 the client
    /// may retry; anything else is a 500 whose details only reach the log.
    pub fn from_store(error: &StoreError) -> Self {
        match error {
            StoreError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "store unavailable");
            }
            other => tracing::error!(error = %other, "store failure"),
        }
        ApiError::for_store(error)
    }

    /// [`ApiError::from_store`] without the log line, for answering many
    /// items of one logged failure. A write that failed is never said to
    /// have changed nothing: its commit may have happened with only the
    /// confirmation lost, so the message says "may or may not".
    pub fn for_store(error: &StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                code::STORE_UNAVAILABLE,
                "the store is unavailable; a change requested may or may not have been made, \
                 retry later",
            ),
            // Answered per item where the caller can; as a whole, the
            // failure that made it partial.
            StoreError::Partial(partial) => partial
                .first_error()
                .map_or_else(ApiError::internal, ApiError::for_store),
            StoreError::Fenced { .. } | StoreError::Internal(_) => ApiError::internal(),
        }
    }

    /// The generic 500; say what happened in the log before calling this.
    pub fn internal() -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            code::INTERNAL,
            "internal error; see the server log",
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ApiError::from_store(&error)
    }
}

/// An [`ApiError`] rendered in the native API's envelope:
/// `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug)]
pub struct V1Error(pub ApiError);

impl From<ApiError> for V1Error {
    fn from(error: ApiError) -> Self {
        V1Error(error)
    }
}

impl From<StoreError> for V1Error {
    fn from(error: StoreError) -> Self {
        V1Error(ApiError::from_store(&error))
    }
}

impl IntoResponse for V1Error {
    fn into_response(self) -> Response {
        let ApiError {
            status,
            code,
            message,
        } = self.0;
        let body = json!({ "error": { "code": code, "message": message } });
        (status, Json(body)).into_response()
    }
}

/// An [`ApiError`] rendered as BigBen does: `{"message": "..."}`.
#[derive(Debug)]
pub struct BigBenError(pub ApiError);

impl From<ApiError> for BigBenError {
    fn from(error: ApiError) -> Self {
        BigBenError(error)
    }
}

impl From<StoreError> for BigBenError {
    fn from(error: StoreError) -> Self {
        BigBenError(ApiError::from_store(&error))
    }
}

impl IntoResponse for BigBenError {
    fn into_response(self) -> Response {
        (self.0.status, Json(json!({ "message": self.0.message }))).into_response()
    }
}
