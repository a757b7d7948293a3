//! The JSON shapes of the API as OpenAPI schemas. Answers are built with
//! `serde_json::json!` or from core types in several handlers, so their
//! shapes are written down here once; `crates/belfry/tests/openapi_contract.rs`
//! (schemathesis) checks every answer against them.

#![allow(dead_code)] // Read by the schema derive only.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::ToSchema;

/// `/v1`'s error envelope.
#[derive(ToSchema)]
#[schema(example = json!({"error": {"code": "tenant_not_found", "message": "tenant \"acme\" is not registered"}}))]
pub struct V1Error {
    pub error: V1ErrorDetail,
}

#[derive(ToSchema)]
pub struct V1ErrorDetail {
    /// Stable machine-readable code (`docs/api.md` lists them).
    pub code: String,
    /// For people; never internal details.
    pub message: String,
}

/// The answers every authenticated `/v1` route may give besides its own:
/// no valid key, a key that may not do this, a rate limit or quota, an
/// internal error and an unavailable store, each with [`V1Error`]. Listed
/// once here and named last in each route's `responses(...)`.
pub struct V1Errors;

impl utoipa::IntoResponses for V1Errors {
    fn responses() -> BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        [
            ("401", "No valid key"),
            ("403", "The key may not do this"),
            ("429", "Rate limit or quota"),
            ("500", "Internal error (details only in the log)"),
            (
                "503",
                "Store unavailable, or a key this node has not seen yet while its reads of \
                 unknown keys are at their budget; retry (Retry-After)",
            ),
        ]
        .into_iter()
        .map(|(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("V1Error")))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), response.into())
        })
        .collect()
    }
}

/// BigBen's error envelope.
#[derive(ToSchema)]
#[schema(example = json!({"message": "tenant must not be null"}))]
pub struct BigBenError {
    pub message: String,
}

/// BigBen's "not found" of `find` and `dryrun`.
#[derive(ToSchema)]
#[schema(example = json!({"status": "not found"}))]
pub struct BigBenNotFound {
    pub status: String,
}

/// `GET /ping`.
#[derive(ToSchema)]
pub struct Ping {
    #[schema(example = "OK")]
    pub status: String,
}

// ---- /v1 events ----

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum Delivery {
    FullEvent,
    PayloadOnly,
}

/// Body of `PUT /v1/tenants/{tenant}/events/{id}`.
#[derive(ToSchema)]
#[schema(example = json!({"deliver_at": "2030-01-31T04:00:30Z", "payload": "{\"orderId\":42}"}))]
pub struct PutEvent {
    /// RFC 3339 with an offset or `Z`.
    pub deliver_at: String,
    pub payload: Option<String>,
    /// Default `full_event`; `payload_only` needs `payload`.
    pub delivery: Option<Delivery>,
    /// Pull tenants: the named queue workers claim it from (default
    /// `default`); ignored for push tenants.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    pub queue: Option<String>,
    /// Pull tenants: attempts before the event fails (else the tenant's).
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<u32>,
    /// Pull tenants: the back-off between attempts (else the node's).
    pub backoff: Option<Backoff>,
}

/// One item of a batch.
#[derive(ToSchema)]
pub struct BatchItem {
    pub id: String,
    pub deliver_at: String,
    pub payload: Option<String>,
    pub delivery: Option<Delivery>,
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    pub queue: Option<String>,
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<u32>,
    pub backoff: Option<Backoff>,
}

/// A pull event's back-off: the first retry after `initial_delay_ms`,
/// each further one `multiplier` times longer, at most `max_delay_ms`.
/// Omitted fields: 1,000 ms, 2, 3,600,000 ms (at least `initial_delay_ms`).
#[derive(ToSchema)]
pub struct Backoff {
    #[schema(minimum = 1, maximum = 86400000)]
    pub initial_delay_ms: Option<u64>,
    #[schema(minimum = 1, maximum = 100)]
    pub multiplier: Option<f64>,
    #[schema(minimum = 1, maximum = 86400000)]
    pub max_delay_ms: Option<u64>,
}

/// Body of `POST /v1/tenants/{tenant}/events`.
#[derive(ToSchema)]
pub struct Batch {
    /// Items shaped like `BatchItem`. Each is validated on its own: one that
    /// is malformed (even not an object) is answered `rejected` in
    /// `results`, and the others are stored.
    pub events: Vec<Value>,
}

/// An event's status view.
#[derive(ToSchema)]
pub struct EventView {
    pub tenant: String,
    pub id: String,
    /// The idempotency key its deliveries carry.
    pub version: String,
    pub deliver_at: String,
    /// `scheduled`, `retrying`, `delivered`, `failed`, `missed`, `cancelled`.
    pub status: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<String>,
    pub triggered_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub finished_at: Option<String>,
    pub payload: Option<String>,
    pub delivery: Delivery,
    /// Set on the event (pull tenants); absent: `default`.
    pub queue: Option<String>,
    /// Set on the event (pull tenants); absent: the tenant's.
    pub max_attempts: Option<u32>,
    /// Set on the event (pull tenants); absent: the node's.
    pub backoff: Option<Backoff>,
}

#[derive(ToSchema)]
pub struct EventList {
    pub events: Vec<EventView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct BatchResult {
    pub id: Option<String>,
    /// `created`, `updated`, `rejected` or `error`.
    pub outcome: String,
    pub version: Option<String>,
    pub error: Option<V1ErrorDetail>,
}

#[derive(ToSchema)]
pub struct BatchAnswer {
    pub results: Vec<BatchResult>,
    pub rejected: u64,
    pub failed: u64,
}

#[derive(ToSchema)]
pub struct AttemptView {
    pub number: u32,
    pub version: String,
    pub started_at: String,
    pub duration_ms: u64,
    /// `delivered`, `retry` or `permanent`.
    pub outcome: String,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

#[derive(ToSchema)]
pub struct Attempts {
    pub attempts: Vec<AttemptView>,
}

// ---- /v1 tenants ----

/// Body of `PUT /v1/tenants/{tenant}`.
#[derive(ToSchema)]
#[schema(example = json!({"sink": {"type": "http", "url": "http://127.0.0.1:9000/hook"}}))]
pub struct PutTenant {
    /// `{"type": "http", "url", "headers"?, "timeout_ms"?}`,
    /// `{"type": "builtin", "processor": "log"}` or
    /// `{"type": "kafka", "topic", "props", "key"?, "transactional"?}` or
    /// `{"type": "pull", "max_attempts"?, "backoff"?, "queues"?}`.
    pub sink: Sink,
}

/// A sink (see `docs/api.md`); write-only values answer as `****`.
#[derive(ToSchema)]
pub struct Sink {
    /// `http`, `builtin`, `kafka` or `pull`.
    #[schema(rename = "type")]
    pub kind: String,
    pub url: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    #[schema(maximum = 18446744073709551615.0)]
    pub timeout_ms: Option<u64>,
    pub processor: Option<String>,
    pub topic: Option<String>,
    pub props: Option<BTreeMap<String, String>>,
    pub key: Option<String>,
    pub transactional: Option<bool>,
    /// `pull` only: attempts after which an event fails (default 20);
    /// an event's own `max_attempts` comes first.
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<u32>,
    /// `pull` only: the back-off of events that set none (default: the
    /// node's retry policy); read as each attempt comes due.
    pub backoff: Option<Backoff>,
    /// `pull` only: the queues its events, schedules and claims may name
    /// (1 to 32 names of 1–64 letters, digits, `_`, `.`, `-`; no repeats),
    /// besides `default`, which is always allowed; omitted: any queue name.
    #[schema(min_items = 1, max_items = 32)]
    pub queues: Option<Vec<String>>,
}

#[derive(ToSchema)]
pub struct TenantView {
    pub name: String,
    #[schema(value_type = Object)]
    pub sink: Value,
    /// Only in the answer of the registration that created it.
    #[schema(nullable = false)]
    pub signing_secret: Option<String>,
}

#[derive(ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantView>,
}

/// Body of the rotation (`{}`: a day of overlap).
#[derive(ToSchema)]
pub struct Rotate {
    /// 0 to 2592000; 0 retires the old secret at once.
    #[schema(minimum = 0, maximum = 2592000)]
    pub grace_period_secs: Option<u64>,
}

#[derive(ToSchema)]
pub struct Rotated {
    pub tenant: String,
    pub signing_secret: String,
    pub old_secret_expires_at: Option<String>,
}

// ---- /v1 schedules ----

#[derive(ToSchema)]
pub struct Misfire {
    /// `fire_once`, `fire_all` (with `cap`, 1–1000) or `skip`.
    pub policy: String,
    pub cap: Option<u32>,
}

/// Body of `PUT /v1/tenants/{tenant}/schedules/{id}`.
#[derive(ToSchema)]
#[schema(example = json!({"expression": "30 2 * * *", "time_zone": "Europe/Berlin", "payload": "report"}))]
pub struct PutSchedule {
    pub expression: String,
    /// `unix` (default), `quartz`, `spring`, `cron4j`, `every`.
    #[schema(rename = "type")]
    pub kind: Option<String>,
    pub time_zone: Option<String>,
    pub payload: Option<String>,
    pub delivery: Option<Delivery>,
    pub start_at: Option<String>,
    pub end_at: Option<String>,
    #[schema(maximum = 18446744073709551615.0)]
    pub max_occurrences: Option<u64>,
    pub misfire: Option<Misfire>,
    #[schema(maximum = 18446744073709551615.0)]
    pub catch_up_window_ms: Option<u64>,
    /// Pull tenants: the queue of its occurrences (default `default`).
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    pub queue: Option<String>,
    /// Pull tenants: its occurrences' attempt cap (else the tenant's).
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<u32>,
    /// Pull tenants: its occurrences' back-off (else the node's).
    pub backoff: Option<Backoff>,
}

#[derive(ToSchema)]
pub struct MissedView {
    pub recorded: u64,
    pub summarized: u64,
    pub first_summarized: Option<String>,
    pub last_summarized: Option<String>,
}

#[derive(ToSchema)]
pub struct ScheduleView {
    pub tenant: String,
    pub id: String,
    pub expression: String,
    #[schema(rename = "type")]
    pub kind: String,
    pub time_zone: String,
    pub description: Option<String>,
    /// `active`, `paused`, `completed` (`deleted` in a delete's answer).
    pub status: String,
    pub next_occurrence: Option<String>,
    pub next_occurrence_local: Option<String>,
    pub payload: Option<String>,
    pub delivery: Delivery,
    pub start_at: Option<String>,
    pub end_at: Option<String>,
    #[schema(maximum = 18446744073709551615.0)]
    pub max_occurrences: Option<u64>,
    pub misfire: Misfire,
    pub catch_up_window_ms: u64,
    pub queue: Option<String>,
    pub max_attempts: Option<u32>,
    pub backoff: Option<Backoff>,
    pub occurrences: u64,
    pub last_occurrence: Option<String>,
    pub missed: MissedView,
    pub created_at: String,
    pub updated_at: String,
    pub error: Option<String>,
}

#[derive(ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
    pub next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct OccurrenceView {
    pub id: String,
    pub scheduled_at: String,
    pub status: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub triggered_at: Option<String>,
    pub finished_at: Option<String>,
}

#[derive(ToSchema)]
pub struct OccurrenceList {
    pub occurrences: Vec<OccurrenceView>,
    pub next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub struct PreviewOccurrence {
    pub utc: String,
    pub local: String,
}

#[derive(ToSchema)]
pub struct Preview {
    pub expression: String,
    #[schema(rename = "type")]
    pub kind: String,
    pub time_zone: String,
    pub description: String,
    pub from: String,
    pub occurrences: Vec<PreviewOccurrence>,
}

// ---- /v1 bulk actions ----

/// What a bulk action does: `cancel`, `redrive` and `delete` act on
/// events, `pause` and `resume` on schedules.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum BulkActionKind {
    Cancel,
    Redrive,
    Delete,
    Pause,
    Resume,
}

/// Which items of one tenant a bulk action acts on.
#[derive(ToSchema)]
pub struct BulkFilterBody {
    /// Required: a bulk action acts on one tenant.
    pub tenant: String,
    /// Events: `scheduled`, `retrying` (cancel), `failed`, `missed`
    /// (redrive) or `delivered`, `failed`, `missed`, `cancelled` (delete,
    /// which requires one). Schedules: `active` (pause) or `paused`
    /// (resume).
    pub status: Option<String>,
    /// Events only: RFC 3339, inclusive bound of deliver_at.
    pub from: Option<String>,
    /// Events only: RFC 3339, exclusive bound of deliver_at.
    pub to: Option<String>,
}

/// Body of `POST /v1/bulk-actions`.
#[derive(ToSchema)]
#[schema(example = json!({"action": "redrive", "filter": {"tenant": "shop/orders", "status": "failed"}}))]
pub struct CreateBulkAction {
    pub action: BulkActionKind,
    pub filter: BulkFilterBody,
}

/// The filter as given (absent fields were not given).
#[derive(ToSchema)]
pub struct BulkFilterView {
    pub tenant: String,
    #[schema(nullable = false)]
    pub status: Option<String>,
    #[schema(nullable = false)]
    pub from: Option<String>,
    #[schema(nullable = false)]
    pub to: Option<String>,
}

/// A bulk action and its progress: `matched` grows as pages are read;
/// each matched item is `succeeded`, `skipped` (its state no longer
/// allowed the action) or `failed` (its write failed).
#[derive(ToSchema)]
pub struct BulkActionView {
    pub id: String,
    pub action: BulkActionKind,
    pub filter: BulkFilterView,
    /// `running`, `completed`, `cancelled` or `failed`.
    pub state: String,
    pub matched: u64,
    pub succeeded: u64,
    pub skipped: u64,
    pub failed: u64,
    /// The id of the key that created it; `null` in open mode.
    pub created_by: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub finished_at: Option<String>,
    /// Why it failed (state `failed`).
    pub error: Option<String>,
}

#[derive(ToSchema)]
pub struct BulkActionList {
    /// Newest first.
    pub bulk_actions: Vec<BulkActionView>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

// ---- keys, audit, cluster ----

/// Body of `POST /v1/keys`.
#[derive(ToSchema)]
#[schema(example = json!({"tenant": "acme/orders", "role": "write"}))]
pub struct CreateKey {
    /// Absent (or `null`) exactly for `admin`.
    pub tenant: Option<String>,
    /// `read`, `write`, `worker` or `admin`.
    pub role: String,
    /// RFC 3339, in the future.
    pub expires_at: Option<String>,
}

#[derive(ToSchema)]
pub struct KeyView {
    pub id: String,
    pub tenant: Option<String>,
    pub role: String,
    pub expires_at: Option<String>,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

/// The creation answer: the only time the secret is shown.
#[derive(ToSchema)]
pub struct CreatedKey {
    pub id: String,
    /// `bfy_…`.
    pub secret: String,
    pub tenant: Option<String>,
    pub role: String,
    pub expires_at: Option<String>,
    pub created_at: String,
}

#[derive(ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyView>,
}

#[derive(ToSchema)]
pub struct AuditEntry {
    pub id: String,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub tenant: Option<String>,
    pub target: Option<String>,
}

#[derive(ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    /// Pass as `after` for the next page.
    pub next: Option<String>,
}

/// `GET /v1/whoami`: the key a request carries.
#[derive(ToSchema)]
#[schema(example = json!({"key_id": "key_4f2a", "role": "read", "tenant": "acme/orders", "can_write": false, "open": false}))]
pub struct Whoami {
    /// `null` without a key (open mode, or none sent).
    pub key_id: Option<String>,
    /// `read`, `write`, `worker` or `admin` (open mode: `admin`); `null`
    /// when no key was sent and keys are required.
    pub role: Option<String>,
    /// A tenant key's tenant; `null` for admins.
    pub tenant: Option<String>,
    /// Whether the key may change data.
    pub can_write: bool,
    /// Whether the node runs without keys (everyone is admin).
    pub open: bool,
}

#[derive(ToSchema)]
pub struct PartitionView {
    pub partition: u16,
    pub epoch: u64,
    #[schema(nullable = false)]
    pub moving_to: Option<String>,
}

#[derive(ToSchema)]
pub struct LeaderStatus {
    pub node: String,
    pub address: Option<String>,
    pub term: u64,
}

#[derive(ToSchema)]
pub struct NodeView {
    pub id: String,
    pub address: String,
    /// `Master` or `Slave`.
    pub role: String,
    pub heartbeat_age_ms: Option<u64>,
    pub partitions: Vec<PartitionView>,
}

#[derive(ToSchema)]
pub struct ClusterStatus {
    /// `single` or `cluster`.
    pub mode: String,
    pub leader: Option<LeaderStatus>,
    pub nodes: Vec<NodeView>,
    #[schema(nullable = false)]
    pub unowned: Option<Vec<PartitionView>>,
}

// ---- BigBen ----

/// BigBen's `EventRequest`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[schema(example = json!({"id": "order-42", "tenant": "shop/orders", "eventTime": "2030-01-31T04:00:30Z", "payload": "{}"}))]
pub struct EventRequest {
    pub id: Option<String>,
    /// RFC 3339 (BigBen's ISO instant).
    pub event_time: Option<String>,
    pub tenant: Option<String>,
    pub payload: Option<String>,
    /// `UPSERT` (default) or `REMOVE`.
    pub mode: Option<String>,
    /// `FULL_EVENT` (default) or `PAYLOAD_ONLY`.
    pub delivery_option: Option<String>,
}

#[derive(ToSchema)]
pub struct EventError {
    pub code: u16,
    pub message: String,
}

/// BigBen's `EventResponse`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct EventResponse {
    pub id: Option<String>,
    pub event_time: Option<String>,
    pub tenant: Option<String>,
    pub payload: Option<String>,
    pub mode: Option<String>,
    pub delivery_option: Option<String>,
    pub event_id: Option<String>,
    pub triggered_at: Option<String>,
    /// `ACCEPTED`, `UPDATED`, `DELETED`, `REJECTED`, `ERROR`, `TRIGGERED`,
    /// `UN_PROCESSED`, `PROCESSED`, or `null`.
    pub event_status: Option<String>,
    pub error: Option<EventError>,
}

/// BigBen's `ProcessorConfig` (tenant registration).
#[derive(ToSchema)]
#[schema(example = json!({"tenant": "shop/orders", "type": "HTTP", "props": {"url": "http://127.0.0.1:9000/hook"}}))]
pub struct ProcessorConfig {
    pub tenant: String,
    /// `HTTP`, `MESSAGING` or `CUSTOM_CLASS`.
    #[schema(rename = "type")]
    pub kind: String,
    #[schema(value_type = Object)]
    pub props: Value,
}

/// Tenant → its `ProcessorConfig`, write-only values masked.
#[derive(ToSchema)]
#[schema(value_type = Object)]
pub struct Tenants(pub BTreeMap<String, Value>);

/// BigBen's `Cron` plus Belfry's extensions.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[schema(example = json!({"tenant": "shop/orders", "id": "every-5s", "expression": "*/5 * * * * ?", "type": "QUARTZ"}))]
pub struct CronRequest {
    pub tenant: Option<String>,
    pub id: Option<String>,
    pub expression: Option<String>,
    #[schema(rename = "type")]
    pub kind: Option<String>,
    pub time_zone: Option<String>,
    pub payload: Option<String>,
    pub delivery_option: Option<String>,
    pub start_at: Option<String>,
    pub end_at: Option<String>,
    #[schema(maximum = 18446744073709551615.0)]
    pub max_occurrences: Option<u64>,
    pub misfire: Option<Misfire>,
    #[schema(maximum = 18446744073709551615.0)]
    pub catch_up_window_ms: Option<u64>,
}

/// A cron with its description.
#[derive(ToSchema)]
pub struct CronAnswer {
    #[schema(value_type = Object)]
    pub cron: Value,
    #[schema(nullable = false)]
    pub description: Option<String>,
}

#[derive(ToSchema)]
pub struct StatusOk {
    #[schema(example = "OK")]
    pub status: String,
}

// ---- /v1 leases (pull workers, docs/pull.md) ----

/// Body of `POST /v1/tenants/{tenant}/leases`.
#[derive(ToSchema)]
#[schema(example = json!({"worker_id": "w-7", "max_events": 10, "lease_ms": 30000, "wait_ms": 20000}))]
pub struct ClaimLeases {
    /// 1 to 128 bytes, no control characters.
    pub worker_id: String,
    #[schema(minimum = 1, maximum = 100)]
    pub max_events: Option<u64>,
    #[schema(minimum = 1000, maximum = 900000)]
    pub lease_ms: Option<u64>,
    #[schema(minimum = 0, maximum = 30000)]
    pub wait_ms: Option<u64>,
    /// Only events of these named queues (1 to 32 names); omitted: all of
    /// the tenant's queues, in turn.
    #[schema(min_items = 1, max_items = 32)]
    pub queues: Option<Vec<String>>,
}

#[derive(ToSchema)]
pub struct LeaseView {
    pub lease_id: String,
    pub event: EventView,
    pub queue: String,
    pub attempt: u32,
    pub max_attempts: u32,
    pub due_at: String,
    pub leased_at: String,
    pub lease_expires_at: String,
    pub deadline_at: String,
    pub heartbeat_interval_ms: u64,
}

#[derive(ToSchema)]
pub struct LeaseList {
    pub leases: Vec<LeaseView>,
}

/// Body of a heartbeat (`{}`: the lease's own length).
#[derive(ToSchema)]
pub struct HeartbeatLease {
    #[schema(minimum = 1000, maximum = 900000)]
    pub extend_ms: Option<u64>,
}

#[derive(ToSchema)]
pub struct HeartbeatAnswer {
    pub lease_expires_at: String,
    pub cancel_requested: bool,
}

/// Body of a completion.
#[derive(ToSchema)]
pub struct CompleteLease {
    /// Any JSON, its text up to 64 KiB.
    #[schema(value_type = Object)]
    pub result: Option<Value>,
}

#[derive(ToSchema)]
pub struct LeaseErrorBody {
    /// 1 to 64 letters, digits, `_`, `-`, `.`.
    pub code: String,
    /// Up to 4096 bytes.
    pub message: Option<String>,
}

/// Body of a failure.
#[derive(ToSchema)]
pub struct FailLease {
    pub error: LeaseErrorBody,
    #[schema(minimum = 0, maximum = 86400000)]
    pub retry_after_ms: Option<u64>,
    pub permanent: Option<bool>,
}

/// Body of a release.
#[derive(ToSchema)]
pub struct ReleaseLease {
    #[schema(minimum = 0, maximum = 86400000)]
    pub delay_ms: Option<u64>,
}

/// One lease of `POST /v1/tenants/{tenant}/leases/complete`.
#[derive(ToSchema)]
pub struct CompleteLeaseItem {
    pub lease_id: String,
    /// Any JSON, its text up to 64 KiB.
    #[schema(value_type = Object)]
    pub result: Option<Value>,
}

/// Body of `POST /v1/tenants/{tenant}/leases/complete`.
#[derive(ToSchema)]
#[schema(example = json!({"leases": [{"lease_id": "AAAB…", "result": {"rows": 3}}, {"lease_id": "AAAC…"}]}))]
pub struct CompleteLeases {
    /// 1 to 100 leases of the path's tenant.
    #[schema(min_items = 1, max_items = 100)]
    pub leases: Vec<CompleteLeaseItem>,
}

/// The error of one item.
#[derive(ToSchema)]
pub struct CompleteLeaseError {
    /// `lease_lost`, `too_many_calls` or `store_unavailable`.
    pub code: String,
    pub message: String,
}

/// One lease's outcome: `state` (`delivered`) or `error`.
#[derive(ToSchema)]
pub struct CompleteLeaseOutcome {
    pub lease_id: String,
    #[schema(nullable = false)]
    pub state: Option<String>,
    #[schema(nullable = false)]
    pub error: Option<CompleteLeaseError>,
}

#[derive(ToSchema)]
pub struct CompleteLeasesAnswer {
    /// In the request's order.
    pub results: Vec<CompleteLeaseOutcome>,
}

/// Where the event stands after a lease ended.
#[derive(ToSchema)]
pub struct LeaseState {
    /// `delivered`, `scheduled` or `failed`.
    pub state: String,
    #[schema(nullable = false)]
    pub next_attempt_at: Option<String>,
}
