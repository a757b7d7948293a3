//! A tenant's live schedule definitions, read from their control events:
//! what the schedules component lists and the quotas count (below both).

use belfry_core::schedule::{self, Schedule, ScheduleId, ScheduleStatus, control_event_id};
use belfry_core::{EventId, EventRecord, EventStatus, TenantName};
use belfry_store::{ListEventsParams, SharedStore, StoreResult};

/// Page size when scanning a tenant's control events.
pub(crate) const SCAN_PAGE: usize = 1_000;

/// A live definition, with the reason its control event ended abnormally
/// (expired as unusable), if it did.
pub(crate) struct Found {
    pub(crate) schedule: Schedule,
    pub(crate) error: Option<String>,
}

/// `tenant`'s live schedules by id, after `after` (exclusive), at most
/// `limit`.
pub(crate) async fn live_schedules(
    store: &SharedStore,
    tenant: &TenantName,
    after: Option<&ScheduleId>,
    limit: usize,
) -> StoreResult<Vec<Found>> {
    let mut cursor = match after {
        Some(id) => control_event_id(id),
        None => EventId::internal_cursor(schedule::CONTROL_PREFIX),
    };
    let mut found = Vec::new();
    loop {
        let page = events_after(store, tenant, cursor.clone(), SCAN_PAGE).await?;
        let full = page.len() == SCAN_PAGE;
        for record in page {
            if schedule::schedule_of_control(&record.key.id).is_none() {
                return Ok(found);
            }
            cursor = record.key.id.clone();
            let error = control_error(&record);
            if let Some(schedule) = record
                .payload
                .as_deref()
                .and_then(|p| Schedule::from_json(p).ok())
                .and_then(live)
            {
                found.push(Found { schedule, error });
                if found.len() >= limit {
                    return Ok(found);
                }
            }
        }
        if !full {
            return Ok(found);
        }
    }
}

/// `tenant`'s events after `after` (exclusive), at most `limit`.
pub(crate) async fn events_after(
    store: &SharedStore,
    tenant: &TenantName,
    after: EventId,
    limit: usize,
) -> StoreResult<Vec<EventRecord>> {
    store
        .list_events(ListEventsParams {
            tenant: tenant.clone(),
            status: None,
            from: None,
            to: None,
            after: Some(after),
            limit,
        })
        .await
}

/// `None` for a deleted definition.
pub(crate) fn live(schedule: Schedule) -> Option<Schedule> {
    (schedule.status != ScheduleStatus::Deleted).then_some(schedule)
}

/// The reason a control event ended abnormally (expired as unusable).
pub(crate) fn control_error(record: &EventRecord) -> Option<String> {
    (record.status == EventStatus::Missed)
        .then(|| record.last_error.clone())
        .flatten()
}
