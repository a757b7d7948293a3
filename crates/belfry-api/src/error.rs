//! Errors at the HTTP edge and their two renderings.
//!
//! Every failure is an [`ApiError`]: a status, a stable code and a message
//! that is safe to show to a client. Handlers of the native API return it
//! wrapped in [`V1Error`] (`{"error": {"code", "message"}}`); BigBen's routes
//! wrap it in [`BigBenError`] (`{"message"}`), as BigBen's clients expect.
//! Internal details (store errors, panics) go to the log, never to the body.

use axum::Json;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use belfry_core::pull::PullError;
use belfry_store::StoreError;
use serde_json::json;

/// What went wrong, as the API tells it: each kind has one HTTP status and
/// one stable machine-readable code (the native API's `error.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidJson,
    InvalidRequest,
    InvalidName,
    InvalidTime,
    InvalidQuery,
    InvalidCursor,
    InvalidSink,
    UnsupportedSink,
    BatchTooLarge,
    BodyTooLarge,
    UnsupportedMediaType,
    TenantNotFound,
    /// BigBen's "tenant not registered / unknown tenant": a 400, where
    /// `/v1` answers 404 [`Code::TenantNotFound`].
    UnknownTenant,
    EventNotFound,
    ScheduleNotFound,
    BulkActionNotFound,
    InvalidCron,
    InvalidSchedule,
    NotFound,
    MethodNotAllowed,
    AlreadyFinished,
    NotRedrivable,
    /// `If-Match` names another version than the event's (or the event
    /// does not exist): nothing changed.
    PreconditionFailed,
    /// Deleting an event that is still scheduled or retrying: cancel it
    /// first.
    EventPending,
    /// A tenant that still holds events or schedules cannot be removed.
    TenantNotEmpty,
    /// A paused tenant's workers claim nothing until it is resumed.
    TenantPaused,
    StoreUnavailable,
    /// Cluster mode: the node holding a lease's partition cannot be
    /// reached right now (or is not known yet), and the store shows no
    /// outcome of the call: whether it took effect is not known; repeating
    /// it is safe.
    NodeUnavailable,
    /// No key, or a malformed, unknown, revoked or expired one.
    Unauthorized,
    /// The key may not do this: a `read` key writing, a tenant key on an
    /// admin route.
    Forbidden,
    /// A request marked as forwarded by another node whose signature does
    /// not hold: missing, malformed, for another node, stale, replayed or
    /// forged.
    ForwardRefused,
    /// Keyless (open mode or `auth.mode = "none"`): the `Host` header is
    /// neither a loopback name nor in `auth.allowed_hosts`.
    HostNotAllowed,
    /// Open mode: the request came through a proxy (it carries
    /// `Forwarded`, `X-Forwarded-*`, `X-Real-IP` or `Via`, or is HTTP/1.0),
    /// so it may come from anywhere.
    ProxiedRequestRefused,
    /// A key this node does not know yet, while its budget for reading
    /// unknown keys is spent (`Retry-After`).
    KeyLookupsBusy,
    /// A keyless bodiless write from a browser.
    BrowserWriteRefused,
    /// The key is over `auth.rate_limit_per_key` (`Retry-After`).
    RateLimited,
    KeyNotFound,
    Internal,
    /// A per-tenant quota (pending events, schedules) would be passed.
    QuotaExceeded,
    /// An event's payload is larger than `limits.max_payload_bytes`.
    PayloadTooLarge,
    /// The node holds `api.max_answer_bytes_in_flight` of large answers
    /// already (`Retry-After`).
    AnswersBusy,
    /// The tenant has `limits.max_bulk_actions_per_tenant` running.
    TooManyBulkActions,
    /// Pull workers: the lease expired, was taken back, or is another
    /// tenant's.
    LeaseLost,
    TooManyWaiters,
    TooManyCalls,
    TooManyLeases,
}

impl Code {
    /// The one mapping to HTTP: status and code.
    const fn http(self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            Code::InvalidJson => (S::BAD_REQUEST, "invalid_json"),
            Code::InvalidRequest => (S::BAD_REQUEST, "invalid_request"),
            Code::InvalidName => (S::BAD_REQUEST, "invalid_name"),
            Code::InvalidTime => (S::BAD_REQUEST, "invalid_time"),
            Code::InvalidQuery => (S::BAD_REQUEST, "invalid_query"),
            Code::InvalidCursor => (S::BAD_REQUEST, "invalid_cursor"),
            Code::InvalidSink => (S::BAD_REQUEST, "invalid_sink"),
            Code::UnsupportedSink => (S::BAD_REQUEST, "unsupported_sink"),
            Code::BatchTooLarge => (S::BAD_REQUEST, "batch_too_large"),
            Code::BodyTooLarge => (S::PAYLOAD_TOO_LARGE, "body_too_large"),
            Code::UnsupportedMediaType => (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            Code::TenantNotFound => (S::NOT_FOUND, "tenant_not_found"),
            Code::UnknownTenant => (S::BAD_REQUEST, "unknown_tenant"),
            Code::EventNotFound => (S::NOT_FOUND, "event_not_found"),
            Code::ScheduleNotFound => (S::NOT_FOUND, "schedule_not_found"),
            Code::BulkActionNotFound => (S::NOT_FOUND, "bulk_action_not_found"),
            Code::InvalidCron => (S::BAD_REQUEST, "invalid_cron"),
            Code::InvalidSchedule => (S::BAD_REQUEST, "invalid_schedule"),
            Code::NotFound => (S::NOT_FOUND, "not_found"),
            Code::MethodNotAllowed => (S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Code::AlreadyFinished => (S::CONFLICT, "already_finished"),
            Code::NotRedrivable => (S::CONFLICT, "not_redrivable"),
            Code::PreconditionFailed => (S::PRECONDITION_FAILED, "precondition_failed"),
            Code::EventPending => (S::CONFLICT, "event_pending"),
            Code::TenantNotEmpty => (S::CONFLICT, "tenant_not_empty"),
            Code::TenantPaused => (S::CONFLICT, "tenant_paused"),
            Code::StoreUnavailable => (S::SERVICE_UNAVAILABLE, "store_unavailable"),
            Code::NodeUnavailable => (S::SERVICE_UNAVAILABLE, "node_unavailable"),
            Code::Unauthorized => (S::UNAUTHORIZED, "unauthorized"),
            Code::Forbidden => (S::FORBIDDEN, "forbidden"),
            Code::ForwardRefused => (S::FORBIDDEN, "forward_refused"),
            Code::HostNotAllowed => (S::FORBIDDEN, "host_not_allowed"),
            Code::ProxiedRequestRefused => (S::FORBIDDEN, "proxied_request_refused"),
            Code::KeyLookupsBusy => (S::SERVICE_UNAVAILABLE, "key_lookups_busy"),
            Code::BrowserWriteRefused => (S::FORBIDDEN, "browser_write_refused"),
            Code::RateLimited => (S::TOO_MANY_REQUESTS, "rate_limited"),
            Code::KeyNotFound => (S::NOT_FOUND, "key_not_found"),
            Code::Internal => (S::INTERNAL_SERVER_ERROR, "internal"),
            Code::QuotaExceeded => (S::TOO_MANY_REQUESTS, "quota_exceeded"),
            Code::PayloadTooLarge => (S::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Code::AnswersBusy => (S::SERVICE_UNAVAILABLE, "answers_busy"),
            Code::TooManyBulkActions => (S::TOO_MANY_REQUESTS, "too_many_bulk_actions"),
            Code::LeaseLost => (S::CONFLICT, "lease_lost"),
            Code::TooManyWaiters => (S::TOO_MANY_REQUESTS, "too_many_waiters"),
            Code::TooManyCalls => (S::TOO_MANY_REQUESTS, "too_many_calls"),
            Code::TooManyLeases => (S::TOO_MANY_REQUESTS, "too_many_leases"),
        }
    }

    pub const fn status(self) -> StatusCode {
        self.http().0
    }

    pub const fn as_str(self) -> &'static str {
        self.http().1
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl From<PullError> for Code {
    fn from(error: PullError) -> Self {
        match error {
            PullError::LeaseLost => Code::LeaseLost,
            PullError::Unavailable => Code::StoreUnavailable,
            PullError::TooManyWaiters => Code::TooManyWaiters,
            PullError::TooManyCalls => Code::TooManyCalls,
            PullError::TooManyLeases => Code::TooManyLeases,
        }
    }
}

/// A failure to answer with: its [`Code`] and a client-safe message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {code}: {message}", code.status())]
pub struct ApiError {
    pub code: Code,
    pub message: String,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// `/v1`'s 404 for a tenant that is not registered, or that the key
    /// may not see.
    pub fn tenant_not_found(tenant: &str) -> Self {
        ApiError::new(
            Code::TenantNotFound,
            format!("tenant {tenant:?} is not registered"),
        )
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
                Code::StoreUnavailable,
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
        ApiError::new(Code::Internal, "internal error; see the server log")
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

/// Whatever becomes an [`ApiError`] (a store error, say) becomes this.
impl<E: Into<ApiError>> From<E> for V1Error {
    fn from(error: E) -> Self {
        V1Error(error.into())
    }
}

impl IntoResponse for V1Error {
    fn into_response(self) -> Response {
        let ApiError { code, message } = self.0;
        let body = json!({ "error": { "code": code, "message": message } });
        (code.status(), Json(body)).into_response()
    }
}

/// An [`ApiError`] rendered as BigBen does: `{"message": "..."}`.
#[derive(Debug)]
pub struct BigBenError(pub ApiError);

/// Whatever becomes an [`ApiError`] (a store error, say) becomes this.
impl<E: Into<ApiError>> From<E> for BigBenError {
    fn from(error: E) -> Self {
        BigBenError(error.into())
    }
}

impl IntoResponse for BigBenError {
    fn into_response(self) -> Response {
        (self.0.status(), Json(json!({ "message": self.0.message }))).into_response()
    }
}

/// Renders `error` in the envelope of the route family `uri` belongs to:
/// `/v1`'s under `/v1`, BigBen's elsewhere.
pub(crate) fn family_error(uri: &Uri, error: ApiError) -> Response {
    let path = uri.path();
    if path == "/v1" || path.starts_with("/v1/") {
        V1Error(error).into_response()
    } else {
        BigBenError(error).into_response()
    }
}
