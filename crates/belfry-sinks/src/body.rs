//! What a receiver gets: BigBen's `EventResponse` and the delivery body.
//!
//! [`EventResponse`] is BigBen's wire shape (camelCase, null fields present
//! as `null`). The API crate reuses it for its BigBen responses; the sinks
//! use it for `FULL_EVENT` deliveries via [`render_delivery_body`].

use belfry_core::{DeliveryOption, EventRecord, EventStatus, Timestamp};
use serde::{Deserialize, Serialize};

/// BigBen's `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Mode {
    #[default]
    #[serde(rename = "UPSERT")]
    Upsert,
    #[serde(rename = "REMOVE")]
    Remove,
}

/// BigBen's `eventStatus`, as answers and deliveries use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BigBenStatus {
    /// Schedule: stored as a new event.
    Accepted,
    /// Schedule: an existing event changed.
    Updated,
    /// Schedule with `REMOVE`: deleted.
    Deleted,
    /// Schedule: invalid item (`error.code` 400).
    Rejected,
    /// Schedule: storage failed (`error.code` 500); find: the event failed.
    Error,
    /// Schedule: already due, fired at once; every delivered body.
    Triggered,
    /// Find: waiting for its instant (or retrying).
    UnProcessed,
    /// Find: delivered.
    Processed,
}

impl BigBenStatus {
    /// The status `find` reports for a stored event. `None` for a cancelled
    /// event, which BigBen would have deleted (so `find` answers 404).
    pub fn of_stored(status: EventStatus) -> Option<Self> {
        match status {
            EventStatus::Scheduled | EventStatus::Retrying => Some(BigBenStatus::UnProcessed),
            EventStatus::Delivered => Some(BigBenStatus::Processed),
            EventStatus::Failed | EventStatus::Missed | EventStatus::Expired => {
                Some(BigBenStatus::Error)
            }
            EventStatus::Cancelled => None,
        }
    }
}

/// BigBen's per-item error: `{"code": 400, "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventError {
    pub code: u16,
    pub message: String,
}

/// BigBen's `EventResponse`: an `EventRequest` plus `eventId`,
/// `triggeredAt`, `eventStatus` and `error`.
///
/// Every field is optional because BigBen echoes whatever the client sent,
/// including items rejected for missing fields; `None` is written as `null`
/// (never omitted), and missing fields read back as `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EventResponse {
    pub id: Option<String>,
    /// RFC 3339 in UTC when Belfry renders it; echoed as sent for rejects.
    pub event_time: Option<String>,
    pub tenant: Option<String>,
    pub payload: Option<String>,
    pub mode: Option<Mode>,
    /// `FULL_EVENT` or `PAYLOAD_ONLY`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub delivery_option: Option<DeliveryOption>,
    /// The server's id of this version of the event.
    pub event_id: Option<String>,
    pub triggered_at: Option<String>,
    pub event_status: Option<BigBenStatus>,
    pub error: Option<EventError>,
}

impl EventResponse {
    /// The stored event as BigBen shows it: `mode` `UPSERT`, `eventId` the
    /// current version, `triggeredAt` when the first attempt of this version
    /// started. No status or error: callers add what their answer needs.
    pub fn from_record(record: &EventRecord) -> Self {
        EventResponse {
            id: Some(record.key.id.as_str().to_string()),
            event_time: Some(record.event_time.to_rfc3339()),
            tenant: Some(record.key.tenant.as_str().to_string()),
            payload: record.payload.clone(),
            mode: Some(Mode::Upsert),
            delivery_option: Some(record.delivery),
            event_id: Some(record.version.as_str().to_string()),
            triggered_at: record.triggered_at.map(Timestamp::to_rfc3339),
            event_status: None,
            error: None,
        }
    }

    pub fn with_status(mut self, status: BigBenStatus) -> Self {
        self.event_status = Some(status);
        self
    }

    pub fn with_error(mut self, code: u16, message: impl Into<String>) -> Self {
        self.error = Some(EventError {
            code,
            message: message.into(),
        });
        self
    }

    pub fn with_triggered_at(mut self, at: Timestamp) -> Self {
        self.triggered_at = Some(at.to_rfc3339());
        self
    }
}

/// The body of one delivery of `record`, started at `triggered_at`.
///
/// `FULL_EVENT`: the compact JSON [`EventResponse`] with `eventStatus`
/// `TRIGGERED` and `triggeredAt`. `PAYLOAD_ONLY`: the payload string's bytes
/// as they are (empty if there is none; the API refuses that combination).
pub fn render_delivery_body(record: &EventRecord, triggered_at: Timestamp) -> Vec<u8> {
    match record.delivery {
        DeliveryOption::PayloadOnly => record.payload.clone().unwrap_or_default().into_bytes(),
        DeliveryOption::FullEvent => {
            let response = EventResponse::from_record(record)
                .with_status(BigBenStatus::Triggered)
                .with_triggered_at(triggered_at);
            // Cannot fail: only strings, options and unit enums, no maps
            // with non-string keys.
            serde_json::to_vec(&response).expect("EventResponse always serializes")
        }
    }
}

#[cfg(test)]
mod tests {
    use belfry_core::{EventId, EventKey, TenantName};

    use super::*;

    fn record(delivery: DeliveryOption) -> EventRecord {
        let at = Timestamp::parse_rfc3339("2030-01-31T09:30:30.250+05:30").unwrap();
        let key = EventKey::new(
            TenantName::new("TenantB/ProgramB/EnvC").unwrap(),
            EventId::new("order-42").unwrap(),
        );
        let payload = Some("{\"orderId\":42}".into());
        crate::scheduled_event(key, at, payload, delivery)
    }

    #[test]
    fn full_event_body_is_bigben_shaped() {
        let fired = Timestamp::parse_rfc3339("2030-01-31T04:00:31Z").unwrap();
        let body = render_delivery_body(&record(DeliveryOption::FullEvent), fired);
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "id": "order-42",
                "eventTime": "2030-01-31T04:00:30.25Z",
                "tenant": "TenantB/ProgramB/EnvC",
                "payload": "{\"orderId\":42}",
                "mode": "UPSERT",
                "deliveryOption": "FULL_EVENT",
                "eventId": "v-1",
                "triggeredAt": "2030-01-31T04:00:31Z",
                "eventStatus": "TRIGGERED",
                "error": null,
            })
        );
        // Compact: no whitespace outside strings.
        assert!(!String::from_utf8(body).unwrap().contains(": "));
    }

    #[test]
    fn payload_only_body_is_the_raw_payload() {
        let body = render_delivery_body(
            &record(DeliveryOption::PayloadOnly),
            Timestamp::from_millis(0),
        );
        assert_eq!(body, b"{\"orderId\":42}");
    }

    #[test]
    fn nulls_are_written_and_missing_fields_read_as_none() {
        let rejected = EventResponse {
            id: Some("x".into()),
            ..EventResponse::default()
        }
        .with_status(BigBenStatus::Rejected)
        .with_error(400, "tenant not present");
        let text = serde_json::to_string(&rejected).unwrap();
        assert!(text.contains("\"tenant\":null"), "{text}");
        assert!(text.contains("\"eventStatus\":\"REJECTED\""), "{text}");
        assert!(text.contains("\"error\":{\"code\":400,\"message\":\"tenant not present\"}"));
        let back: EventResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(back, rejected);
        let sparse: EventResponse = serde_json::from_str(r#"{"id":"a"}"#).unwrap();
        assert_eq!(sparse.tenant, None);
        assert_eq!(
            serde_json::to_value(BigBenStatus::UnProcessed).unwrap(),
            "UN_PROCESSED"
        );
    }
}
