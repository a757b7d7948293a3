//! Quota refusals at the HTTP edge (the quotas themselves live in
//! `belfry_engine::quotas`).

use axum::http::StatusCode;
use belfry_engine::quotas::{QuotaError, QuotaExceeded};

use crate::error::{ApiError, code};

/// `429 quota_exceeded` for counts (retrying later may succeed once events
/// fire or schedules are deleted), `413 payload_too_large` for a payload,
/// `429 rate_limited` for dry runs, `429 too_many_bulk_actions`; a failed
/// count is the store's failure.
pub(crate) fn quota_error(error: QuotaError) -> ApiError {
    match error {
        QuotaError::Exceeded(exceeded) => exceeded_error(&exceeded),
        QuotaError::Store(store) => ApiError::from_store(&store),
    }
}

pub(crate) fn exceeded_error(exceeded: &QuotaExceeded) -> ApiError {
    match exceeded {
        QuotaExceeded::PayloadTooLarge { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::PAYLOAD_TOO_LARGE,
            exceeded.to_string(),
        ),
        QuotaExceeded::PendingEvents { .. } | QuotaExceeded::Schedules { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            code::QUOTA_EXCEEDED,
            exceeded.to_string(),
        ),
        QuotaExceeded::DryRuns { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            code::RATE_LIMITED,
            exceeded.to_string(),
        ),
        QuotaExceeded::BulkActions { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            code::TOO_MANY_BULK_ACTIONS,
            exceeded.to_string(),
        ),
    }
}
