//! Conversions between rows and domain values, and the column arrays that
//! batched writes pass to `unnest`.

use belfry_core::event::{Attempt, DeliveryOption, EventRecord, EventSettings, EventStatus};
use belfry_core::{
    Backoff, DueCursor, EventId, EventKey, EventVersion, PartitionId, QueueName, TenantName,
    Timestamp, Verdict,
};
use tokio_postgres::Row;

use crate::error::{StoreError, corrupt};

/// The columns of `events`, in the order [`record_from_row`] reads them.
pub(crate) const EVENT_COLUMNS: &str = "tenant, id, partition, version, event_time, payload, \
     delivery, status, next_fire_at, attempts, last_error, triggered_at, created_at, \
     updated_at, finished_at, queue, max_attempts, backoff, attempt_timeout_ms, expire_at, \
     max_age_ms, debounce_since";

/// [`EVENT_COLUMNS`] qualified with the alias `e`, for joins.
pub(crate) const EVENT_COLUMNS_E: &str = "e.tenant, e.id, e.partition, e.version, e.event_time, \
     e.payload, e.delivery, e.status, e.next_fire_at, e.attempts, e.last_error, e.triggered_at, \
     e.created_at, e.updated_at, e.finished_at, e.queue, e.max_attempts, e.backoff, \
     e.attempt_timeout_ms, e.expire_at, e.max_age_ms, e.debounce_since";

pub(crate) fn delivery_to_str(delivery: DeliveryOption) -> &'static str {
    match delivery {
        DeliveryOption::FullEvent => "FULL_EVENT",
        DeliveryOption::PayloadOnly => "PAYLOAD_ONLY",
    }
}

fn delivery_from_str(text: &str) -> Result<DeliveryOption, StoreError> {
    match text {
        "FULL_EVENT" => Ok(DeliveryOption::FullEvent),
        "PAYLOAD_ONLY" => Ok(DeliveryOption::PayloadOnly),
        other => Err(corrupt(format_args!("delivery option {other:?}"))),
    }
}

pub(crate) fn verdict_to_str(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Delivered => "delivered",
        Verdict::Retry => "retry",
        Verdict::Permanent => "permanent",
    }
}

fn verdict_from_str(text: &str) -> Result<Verdict, StoreError> {
    match text {
        "delivered" => Ok(Verdict::Delivered),
        "retry" => Ok(Verdict::Retry),
        "permanent" => Ok(Verdict::Permanent),
        other => Err(corrupt(format_args!("verdict {other:?}"))),
    }
}

pub(crate) fn key_from_parts(tenant: String, id: String) -> Result<EventKey, StoreError> {
    let tenant = TenantName::new(tenant).map_err(corrupt)?;
    let id = EventId::from_stored(id).map_err(corrupt)?;
    Ok(EventKey::new(tenant, id))
}

pub(crate) fn partition_from_i32(value: i32) -> Result<PartitionId, StoreError> {
    u16::try_from(value)
        .map(PartitionId)
        .map_err(|_| corrupt(format_args!("partition {value}")))
}

fn u32_from_i64(value: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| corrupt(format_args!("{what} {value}")))
}

fn timestamp(value: Option<i64>) -> Option<Timestamp> {
    value.map(Timestamp::from_millis)
}

/// A `json` value as its text: the driver reads `json` into a type only
/// with a feature this crate does not enable, and the text is all that is
/// needed (`EXPLAIN (FORMAT JSON)`).
pub(crate) struct JsonText(pub(crate) String);

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        // The binary form of `json` is its text.
        Ok(JsonText(std::str::from_utf8(raw)?.to_owned()))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::JSON
    }
}

/// Reads a row selected with [`EVENT_COLUMNS`].
pub(crate) fn record_from_row(row: &Row) -> Result<EventRecord, StoreError> {
    let status: String = row.get(7);
    Ok(EventRecord {
        key: key_from_parts(row.get(0), row.get(1))?,
        partition: partition_from_i32(row.get(2))?,
        version: EventVersion::from_string(row.get(3)),
        event_time: Timestamp::from_millis(row.get(4)),
        payload: row.get(5),
        delivery: delivery_from_str(row.get(6))?,
        status: EventStatus::parse(&status)
            .ok_or_else(|| corrupt(format_args!("status {status:?}")))?,
        next_fire_at: timestamp(row.get(8)),
        attempts: u32_from_i64(row.get(9), "attempt count")?,
        last_error: row.get(10),
        triggered_at: timestamp(row.get(11)),
        created_at: Timestamp::from_millis(row.get(12)),
        updated_at: Timestamp::from_millis(row.get(13)),
        finished_at: timestamp(row.get(14)),
        debounce_since: timestamp(row.get(21)),
        settings: settings_from_row(row)?,
    })
}

/// Reads the `queue, max_attempts, backoff, attempt_timeout_ms,
/// expire_at, max_age_ms` columns (15–20).
fn settings_from_row(row: &Row) -> Result<EventSettings, StoreError> {
    let queue: String = row.get(15);
    let max_attempts: Option<i32> = row.get(16);
    let backoff: Option<String> = row.get(17);
    let millis = |index: usize, what: &str| -> Result<Option<u64>, StoreError> {
        let value: Option<i64> = row.get(index);
        value
            .map(|ms| u64::try_from(ms).map_err(|_| corrupt(format_args!("{what} {ms}"))))
            .transpose()
    };
    Ok(EventSettings {
        queue: (queue != QueueName::default_queue().as_str())
            .then(|| QueueName::new(queue))
            .transpose()
            .map_err(corrupt)?,
        max_attempts: max_attempts
            .map(|max| u32::try_from(max).map_err(|_| corrupt(format_args!("max_attempts {max}"))))
            .transpose()?,
        backoff: backoff
            .map(|text| serde_json::from_str::<Backoff>(&text).map_err(corrupt))
            .transpose()?,
        attempt_timeout_ms: millis(18, "attempt_timeout_ms")?,
        expire_at: timestamp(row.get(19)),
        max_age_ms: millis(20, "max_age_ms")?,
    })
}

/// Reads `next_fire_at, tenant, id`.
pub(crate) fn cursor_from_row(row: &Row) -> Result<DueCursor, StoreError> {
    Ok(DueCursor {
        due: Timestamp::from_millis(row.get(0)),
        key: key_from_parts(row.get(1), row.get(2))?,
    })
}

/// Reads `version, number, started_at, duration_ms, verdict, http_status,
/// error`.
pub(crate) fn attempt_from_row(row: &Row) -> Result<Attempt, StoreError> {
    let http_status: Option<i32> = row.get(5);
    let duration_ms: i64 = row.get(3);
    Ok(Attempt {
        version: EventVersion::from_string(row.get(0)),
        number: u32_from_i64(row.get(1), "attempt number")?,
        started_at: Timestamp::from_millis(row.get(2)),
        duration_ms: u64::try_from(duration_ms)
            .map_err(|_| corrupt(format_args!("duration {duration_ms}")))?,
        verdict: verdict_from_str(row.get(4))?,
        http_status: http_status
            .map(|s| u16::try_from(s).map_err(|_| corrupt(format_args!("http status {s}"))))
            .transpose()?,
        error: row.get(6),
    })
}

/// Event records as one array per column, for `unnest`.
#[derive(Debug, Default)]
pub(crate) struct EventColumns {
    pub tenant: Vec<String>,
    pub id: Vec<String>,
    pub partition: Vec<i32>,
    pub version: Vec<String>,
    pub event_time: Vec<i64>,
    pub payload: Vec<Option<String>>,
    pub delivery: Vec<&'static str>,
    pub status: Vec<&'static str>,
    pub next_fire_at: Vec<Option<i64>>,
    pub attempts: Vec<i64>,
    pub last_error: Vec<Option<String>>,
    pub triggered_at: Vec<Option<i64>>,
    pub created_at: Vec<i64>,
    pub updated_at: Vec<i64>,
    pub finished_at: Vec<Option<i64>>,
    pub queue: Vec<String>,
    pub max_attempts: Vec<Option<i32>>,
    pub backoff: Vec<Option<String>>,
    pub attempt_timeout_ms: Vec<Option<i64>>,
    pub expire_at: Vec<Option<i64>>,
    pub max_age_ms: Vec<Option<i64>>,
    pub debounce_since: Vec<Option<i64>>,
}

impl EventColumns {
    pub fn push(&mut self, record: &EventRecord) {
        self.tenant.push(record.key.tenant.as_str().to_owned());
        self.id.push(record.key.id.as_str().to_owned());
        self.partition.push(i32::from(record.partition.0));
        self.version.push(record.version.as_str().to_owned());
        self.event_time.push(record.event_time.as_millis());
        self.payload.push(record.payload.clone());
        self.delivery.push(delivery_to_str(record.delivery));
        self.status.push(record.status.as_str());
        self.next_fire_at
            .push(record.next_fire_at.map(Timestamp::as_millis));
        self.attempts.push(i64::from(record.attempts));
        self.last_error.push(record.last_error.clone());
        self.triggered_at
            .push(record.triggered_at.map(Timestamp::as_millis));
        self.created_at.push(record.created_at.as_millis());
        self.updated_at.push(record.updated_at.as_millis());
        self.finished_at
            .push(record.finished_at.map(Timestamp::as_millis));
        self.queue.push(record.settings.queue().as_str().to_owned());
        self.max_attempts.push(
            record
                .settings
                .max_attempts
                .map(|max| i32::try_from(max).unwrap_or(i32::MAX)),
        );
        // A `Backoff` is numbers only: its JSON cannot fail.
        self.backoff.push(
            record
                .settings
                .backoff
                .and_then(|backoff| serde_json::to_string(&backoff).ok()),
        );
        let millis = |ms: Option<u64>| ms.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX));
        let settings = &record.settings;
        self.attempt_timeout_ms
            .push(millis(settings.attempt_timeout_ms));
        self.expire_at
            .push(settings.expire_at.map(Timestamp::as_millis));
        self.max_age_ms.push(millis(settings.max_age_ms));
        self.debounce_since
            .push(record.debounce_since.map(Timestamp::as_millis));
    }

    pub fn is_empty(&self) -> bool {
        self.tenant.is_empty()
    }

    /// The parameters in [`EVENT_COLUMNS`] order.
    pub fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 22] {
        [
            &self.tenant,
            &self.id,
            &self.partition,
            &self.version,
            &self.event_time,
            &self.payload,
            &self.delivery,
            &self.status,
            &self.next_fire_at,
            &self.attempts,
            &self.last_error,
            &self.triggered_at,
            &self.created_at,
            &self.updated_at,
            &self.finished_at,
            &self.queue,
            &self.max_attempts,
            &self.backoff,
            &self.attempt_timeout_ms,
            &self.expire_at,
            &self.max_age_ms,
            &self.debounce_since,
        ]
    }
}

/// `unnest(...) AS u(<EVENT_COLUMNS>)` over the 22 parameters of
/// [`EventColumns::params`].
pub(crate) const UNNEST_EVENTS: &str = "unnest($1::text[], $2::text[], $3::int4[], $4::text[], \
     $5::int8[], $6::text[], $7::text[], $8::text[], $9::int8[], $10::int8[], $11::text[], \
     $12::int8[], $13::int8[], $14::int8[], $15::int8[], $16::text[], $17::int4[], $18::text[], \
     $19::int8[], $20::int8[], $21::int8[], $22::int8[]) \
     AS u(tenant, id, partition, version, event_time, payload, delivery, status, next_fire_at, \
     attempts, last_error, triggered_at, created_at, updated_at, finished_at, queue, \
     max_attempts, backoff, attempt_timeout_ms, expire_at, max_age_ms, debounce_since)";

/// History entries as one array per column, for `unnest`.
#[derive(Debug, Default)]
pub(crate) struct AttemptColumns {
    pub tenant: Vec<String>,
    pub id: Vec<String>,
    pub version: Vec<String>,
    pub number: Vec<i64>,
    pub started_at: Vec<i64>,
    pub duration_ms: Vec<i64>,
    pub verdict: Vec<&'static str>,
    pub http_status: Vec<Option<i32>>,
    pub error: Vec<Option<String>>,
}

impl AttemptColumns {
    pub fn push(&mut self, key: &EventKey, attempt: &Attempt) {
        self.tenant.push(key.tenant.as_str().to_owned());
        self.id.push(key.id.as_str().to_owned());
        self.version.push(attempt.version.as_str().to_owned());
        self.number.push(i64::from(attempt.number));
        self.started_at.push(attempt.started_at.as_millis());
        self.duration_ms
            .push(i64::try_from(attempt.duration_ms).unwrap_or(i64::MAX));
        self.verdict.push(verdict_to_str(attempt.verdict));
        self.http_status.push(attempt.http_status.map(i32::from));
        self.error.push(attempt.error.clone());
    }

    pub fn is_empty(&self) -> bool {
        self.tenant.is_empty()
    }

    pub fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 9] {
        [
            &self.tenant,
            &self.id,
            &self.version,
            &self.number,
            &self.started_at,
            &self.duration_ms,
            &self.verdict,
            &self.http_status,
            &self.error,
        ]
    }
}
