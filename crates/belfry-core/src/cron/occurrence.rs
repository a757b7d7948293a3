//! Deterministic names for occurrences of a schedule.

use std::fmt;

use crate::ids::{EventId, EventKey, EventVersion, IdError, TenantName};
use crate::time::Timestamp;

/// The identity of one occurrence: `(tenant, schedule id, scheduled
/// instant)`.
///
/// Its text form is `"{schedule_id}@{instant}"`, the instant in RFC 3339 UTC
/// as [`Timestamp::to_rfc3339`] renders it (whole seconds for calendar
/// schedules: `nightly-report@2027-03-28T01:00:00Z`). The same text is the
/// occurrence's event id within its tenant and its delivery's idempotency
/// key ([`EventVersion`]), so every node, every restart and every retry
/// derives the same name for the same firing: storing an occurrence twice is
/// an upsert of one event, and a receiver can drop duplicates by that key.
/// The tenant is not in the text because event ids and deliveries are
/// already scoped by tenant.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OccurrenceId {
    pub tenant: TenantName,
    pub schedule_id: EventId,
    pub scheduled_at: Timestamp,
}

impl OccurrenceId {
    pub fn new(tenant: TenantName, schedule_id: EventId, scheduled_at: Timestamp) -> Self {
        OccurrenceId {
            tenant,
            schedule_id,
            scheduled_at,
        }
    }

    /// The occurrence's event key: `(tenant, "{schedule_id}@{instant}")`.
    ///
    /// # Errors
    /// [`IdError::TooLong`] when the schedule id is so close to
    /// [`EventId::MAX_LEN`] that the suffix does not fit.
    pub fn event_key(&self) -> Result<EventKey, IdError> {
        Ok(EventKey::new(
            self.tenant.clone(),
            EventId::new(self.to_string())?,
        ))
    }

    /// The delivery's idempotency key; equal to the event id's text.
    pub fn event_version(&self) -> EventVersion {
        EventVersion::from_string(self.to_string())
    }
}

impl fmt::Display for OccurrenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.schedule_id, self.scheduled_at.to_rfc3339())
    }
}

impl fmt::Debug for OccurrenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{self}", self.tenant)
    }
}
