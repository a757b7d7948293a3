//! Quota refusals at the HTTP edge (the quotas themselves live in
//! `belfry_engine::quotas`).

use belfry_engine::quotas::{QuotaError, QuotaExceeded};

use crate::error::{ApiError, Code};

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
        QuotaExceeded::PayloadTooLarge { .. } => {
            ApiError::new(Code::PayloadTooLarge, exceeded.to_string())
        }
        QuotaExceeded::PendingEvents { .. }
        | QuotaExceeded::Schedules { .. }
        | QuotaExceeded::ScheduleOccurrences { .. } => {
            ApiError::new(Code::QuotaExceeded, exceeded.to_string())
        }
        QuotaExceeded::DryRuns { .. } | QuotaExceeded::DeliveryRate { .. } => {
            ApiError::new(Code::RateLimited, exceeded.to_string())
        }
        QuotaExceeded::BulkActions { .. } => {
            ApiError::new(Code::TooManyBulkActions, exceeded.to_string())
        }
    }
}
