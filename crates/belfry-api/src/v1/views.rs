//! The JSON shapes the native API answers with, shared by several
//! routes. Each is also its OpenAPI schema (`ToSchema`); the shapes of
//! one route live next to its handler.

use belfry_core::breaker::CircuitView;
use belfry_core::retry::BackoffError;
use belfry_core::{
    Attempt, Backoff, DeliveryOption, EventRecord, NotifyTarget, PreviousDelivery, RetryPolicy,
    SinkConfig, TenantConfig, TenantPause, Timestamp, Verdict,
};
use belfry_engine::EngineHandle;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::answers::Listing;
use crate::extract::whole::Whole;

/// `delivery` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", expecting = "full_event or payload_only")]
pub(crate) enum Delivery {
    /// The whole event as JSON (BigBen's `FULL_EVENT`).
    #[default]
    FullEvent,
    /// Only the payload string.
    PayloadOnly,
}

impl From<Delivery> for DeliveryOption {
    fn from(value: Delivery) -> Self {
        match value {
            Delivery::FullEvent => DeliveryOption::FullEvent,
            Delivery::PayloadOnly => DeliveryOption::PayloadOnly,
        }
    }
}

impl From<DeliveryOption> for Delivery {
    fn from(value: DeliveryOption) -> Self {
        match value {
            DeliveryOption::FullEvent => Delivery::FullEvent,
            DeliveryOption::PayloadOnly => Delivery::PayloadOnly,
        }
    }
}

/// A tenant as answers show it: write-only secrets masked.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TenantView<'a> {
    pub name: &'a str,
    /// The sink as registered; write-only values answer as `****`.
    #[schema(value_type = Object)]
    pub sink: SinkConfig,
    /// Only in the answer of the registration that created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub signing_secret: Option<String>,
    /// Whether its deliveries are paused; left out for a tenant never
    /// paused since it was registered.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pause: Option<PauseView<'a>>,
    /// Where its notices go (`{"url": ...}` or `{"kafka_topic": ...}`);
    /// left out when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    pub notify: Option<&'a NotifyTarget>,
    /// Its endpoint's circuit breaker on the node answering; left out for
    /// pull and built-in sinks (and when the breaker is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub circuit: Option<CircuitBody>,
}

/// A tenant endpoint's circuit breaker, as the node answering judges it
/// (`docs/api.md`, circuit breaker): each node keeps its own.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CircuitBody {
    /// `closed` (deliveries go out), `open` (due events wait for the next
    /// probe) or `half_open` (one probe delivery is out).
    #[schema(pattern = "^(closed|open|half_open)$")]
    pub state: &'static str,
    /// When it entered its state (RFC 3339); null: closed since the node
    /// started or the sink last changed.
    pub since: Option<String>,
    /// Transient failures in a row while closed; at
    /// `engine.circuit_breaker.failure_threshold` it opens.
    pub consecutive_failures: u32,
    /// While open: when the next probe may go out (RFC 3339).
    pub next_probe_at: Option<String>,
}

impl From<CircuitView> for CircuitBody {
    fn from(view: CircuitView) -> Self {
        CircuitBody {
            state: view.state.as_str(),
            since: rfc3339(view.since),
            consecutive_failures: view.consecutive_failures,
            next_probe_at: rfc3339(view.next_probe_at),
        }
    }
}

/// A tenant's pause state (`POST /v1/tenants/{tenant}/pause`, `…/resume`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PauseView<'a> {
    /// Paused: its due events stay pending, its workers claim nothing.
    pub paused: bool,
    /// Why it was paused (kept after a resume, until the next pause).
    pub reason: Option<&'a str>,
    /// When it was paused, or resumed (RFC 3339).
    pub since: String,
}

impl<'a> From<&'a TenantPause> for PauseView<'a> {
    fn from(pause: &'a TenantPause) -> Self {
        PauseView {
            paused: pause.paused,
            reason: pause.reason.as_deref(),
            since: pause.since.to_rfc3339(),
        }
    }
}

impl<'a> TenantView<'a> {
    /// The tenant with its pause state.
    pub fn of(tenant: &'a TenantConfig, pause: Option<&'a TenantPause>) -> Self {
        TenantView {
            name: tenant.name.as_str(),
            sink: crate::auth::mask::sink(&tenant.sink),
            signing_secret: None,
            pause: pause.map(PauseView::from),
            notify: tenant.notify.as_ref(),
            circuit: None,
        }
    }

    /// With its circuit as `engine` judges it.
    pub fn with_circuit(mut self, tenant: &TenantConfig, engine: &EngineHandle) -> Self {
        self.circuit = engine.circuits().view(tenant).map(CircuitBody::from);
        self
    }
}

fn rfc3339(at: Option<Timestamp>) -> Option<String> {
    at.map(Timestamp::to_rfc3339)
}

/// An event's status view. It borrows the record's strings (a payload may
/// be 256 KiB): serialized straight from the record, never copied.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventView<'a> {
    pub tenant: &'a str,
    pub id: &'a str,
    /// The current version: the idempotency key its deliveries carry.
    pub version: &'a str,
    pub deliver_at: String,
    /// `scheduled`, `retrying`, `delivered`, `failed`, `missed`,
    /// `cancelled` or `expired`.
    pub status: &'static str,
    pub attempts: u32,
    pub last_error: Option<&'a str>,
    pub next_attempt_at: Option<String>,
    pub triggered_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub finished_at: Option<String>,
    pub payload: Option<&'a str>,
    pub delivery: Delivery,
    /// The event's own attempt settings (and a pull tenant's event's
    /// queue), shown when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub queue: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BackoffBody>, nullable = false)]
    pub backoff: Option<Backoff>,
    /// The event's own delivery policy, shown when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub attempt_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    pub expire_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub max_age_ms: Option<u64>,
    /// While a debounced series is pending: when its first write was
    /// accepted (`deliver_at` is at most `max_wait_ms` after it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    pub debounce_since: Option<String>,
    /// Only in the answer to a cancel or to a `PUT` that moved the event:
    /// how far the delivery of the version it replaced had gone, recorded
    /// attempts and attempts in flight (`docs/api.md`, "Conditional
    /// edits").
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub previous_delivery: Option<PreviousDeliveryView>,
}

/// How far the delivery of a cancelled or moved version had gone.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PreviousDeliveryView {
    /// Pending, no attempt recorded or in flight: it will never be sent.
    NotStarted,
    /// Pending, with an attempt recorded (`retrying`) or in flight: it may
    /// have reached the receiver.
    Started,
    /// It had ended: `delivered`, `failed`, `missed` or `expired`.
    Finished,
    /// No attempt recorded, and the node firing the event's partition
    /// could not be asked in time whether one is in flight (a cluster
    /// only): treat it as possibly started.
    Unknown,
}

impl From<PreviousDelivery> for PreviousDeliveryView {
    fn from(previous: PreviousDelivery) -> Self {
        match previous {
            PreviousDelivery::NotStarted => PreviousDeliveryView::NotStarted,
            PreviousDelivery::Started => PreviousDeliveryView::Started,
            PreviousDelivery::Finished => PreviousDeliveryView::Finished,
            PreviousDelivery::Unknown => PreviousDeliveryView::Unknown,
        }
    }
}

/// A page of a tenant's events.
pub(crate) struct EventList;

impl Listing for EventList {
    const KEY: &'static str = "events";
    type Item<'a> = EventView<'a>;
}
crate::openapi::schema::list_page!(EventList, "A page of events");

impl<'a> From<&'a EventRecord> for EventView<'a> {
    fn from(record: &'a EventRecord) -> Self {
        EventView {
            tenant: record.key.tenant.as_str(),
            id: record.key.id.as_str(),
            version: record.version.as_str(),
            deliver_at: record.event_time.to_rfc3339(),
            status: record.status.as_str(),
            attempts: record.attempts,
            last_error: record.last_error.as_deref(),
            next_attempt_at: rfc3339(record.next_fire_at),
            triggered_at: rfc3339(record.triggered_at),
            created_at: record.created_at.to_rfc3339(),
            updated_at: record.updated_at.to_rfc3339(),
            finished_at: rfc3339(record.finished_at),
            payload: record.payload.as_deref(),
            delivery: record.delivery.into(),
            queue: record.settings.queue.as_ref().map(|q| q.as_str()),
            max_attempts: record.settings.max_attempts,
            backoff: record.settings.backoff,
            attempt_timeout_ms: record.settings.attempt_timeout_ms,
            expire_at: record.settings.expire_at.map(Timestamp::to_rfc3339),
            max_age_ms: record.settings.max_age_ms,
            debounce_since: record
                .debounce_since
                .filter(|_| record.status.is_pending())
                .map(Timestamp::to_rfc3339),
            previous_delivery: None,
        }
    }
}

/// One entry of an event's delivery history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AttemptView {
    /// 1 for the first attempt of a version; 0 for an attempt that ended
    /// after its version was replaced (history only).
    pub number: u32,
    pub version: String,
    pub started_at: String,
    pub duration_ms: u64,
    /// `delivered`, `retry` or `permanent`.
    #[schema(value_type = String)]
    pub outcome: Verdict,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

impl From<&Attempt> for AttemptView {
    fn from(attempt: &Attempt) -> Self {
        AttemptView {
            number: attempt.number,
            version: attempt.version.as_str().to_string(),
            started_at: attempt.started_at.to_rfc3339(),
            duration_ms: attempt.duration_ms,
            outcome: attempt.verdict,
            http_status: attempt.http_status,
            error: attempt.error.clone(),
        }
    }
}

/// A pull event's back-off: the first retry after `initial_delay_ms`,
/// each further one `multiplier` times longer, at most `max_delay_ms`.
/// Omitted fields: 1,000 ms, 2, 3,600,000 ms (at least `initial_delay_ms`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a backoff object")]
#[schema(as = Backoff)]
pub(crate) struct BackoffBody {
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86400000)]
    initial_delay_ms: Option<Whole<u64>>,
    #[schema(minimum = 1, maximum = 100)]
    multiplier: Option<f64>,
    /// At least `initial_delay_ms`.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 86400000)]
    max_delay_ms: Option<Whole<u64>>,
}

impl BackoffBody {
    /// The back-off it gives, omitted fields taking the node's defaults.
    ///
    /// # Errors
    /// A field out of its range; the message names it
    /// (`backoff.multiplier`, …).
    pub(crate) fn into_backoff(self) -> Result<Backoff, BackoffError> {
        let defaults = RetryPolicy::default();
        let initial = self
            .initial_delay_ms
            .map_or(defaults.initial_delay.as_millis() as u64, Whole::get);
        let max = self.max_delay_ms.map_or(
            (defaults.max_delay.as_millis() as u64).max(initial),
            Whole::get,
        );
        Backoff::new(initial, self.multiplier.unwrap_or(defaults.multiplier), max)
    }
}
