//! Belfry's native API under `/v1`: JSON in and out, one error envelope
//! `{"error": {"code", "message"}}` with stable codes (see [`crate::error::Code`]).
//!
//! Tenant names and event ids may contain `/`; in paths each is one
//! percent-encoded segment (`/` as `%2F`). The router matches on the raw
//! path, so `%2F` never splits a segment, and the extractor decodes it.
//!
//! - `tenants`: `/v1/tenants[/{tenant}]`;
//! - `signing`: `/v1/tenants/{tenant}/signing-secrets/rotate`;
//! - `pause`: `/v1/tenants/{tenant}/pause|resume` (a tenant's deliveries);
//! - `events`: `/v1/tenants/{tenant}/events[/{id}[/attempts]]`;
//! - `schedules`: `/v1/tenants/{tenant}/schedules[/{id}[/pause|/resume|/occurrences]]`
//!   and `/v1/cron/preview`;
//! - `bulk`: `/v1/bulk-actions[/{id}[/cancel]]`;
//! - `leases`: pull workers' `/v1/tenants/{tenant}/leases` and
//!   `/v1/leases/{lease_id}/heartbeat|complete|fail|release`;
//! - `forward`: cluster mode, pull workers' calls and claims reaching
//!   the nodes that hold their leases and entries;
//! - `previous`: whether a cancelled or moved version's delivery had
//!   started, asking the partition's owner (and its peer route);
//! - `replies`: the pull queue's replies as answers (leases, states,
//!   errors);
//! - `lease_batch`: `/v1/tenants/{tenant}/leases/complete`, up to 100
//!   completions in one request;
//! - `views`: the JSON shapes several routes share (an event, a tenant, a
//!   back-off), each also its OpenAPI schema.

use belfry_core::{EventId, EventKey, TenantName};

use crate::error::{ApiError, Code, V1Error};

pub(crate) mod bulk;
pub(crate) mod events;
pub(crate) mod forward;
pub(crate) mod lease_batch;
pub(crate) mod leases;
pub(crate) mod pause;
pub(crate) mod previous;
pub(crate) mod replies;
pub(crate) mod schedules;
pub(crate) mod signing;
pub(crate) mod tenants;
pub(crate) mod views;

/// A `400 invalid_request` with this message (bad input in a body or path).
pub(crate) fn invalid_request(message: impl Into<String>) -> V1Error {
    V1Error(ApiError::new(Code::InvalidRequest, message))
}

/// Validates a tenant name taken from the path.
pub(crate) fn tenant_name(text: String) -> Result<TenantName, V1Error> {
    TenantName::new(text).map_err(|e| V1Error(ApiError::new(Code::InvalidName, e.to_string())))
}

/// Validates an event id taken from the path or a batch item.
pub(crate) fn event_id(text: String) -> Result<EventId, ApiError> {
    EventId::new(text).map_err(|e| ApiError::new(Code::InvalidName, e.to_string()))
}

/// The checked tenant and id of an event's path.
pub(crate) fn event_key(tenant: String, id: String) -> Result<EventKey, V1Error> {
    Ok(EventKey::new(tenant_name(tenant)?, event_id(id)?))
}

pub(crate) fn tenant_not_found(name: &TenantName) -> V1Error {
    V1Error(ApiError::tenant_not_found(name.as_str()))
}
