//! Byte encodings of the embedded store's keys and values.
//!
//! Every key is built so that fjall's bytewise order is the order the store
//! needs:
//! - an event key is `tenant 0x00 id`. Names never contain `0x00` (control
//!   characters are refused by [`belfry_core::ids`]), so the encoding is
//!   prefix-free *and* sorts exactly like [`EventKey`]'s `Ord` (tenant, then
//!   id). The due index depends on that: its order must equal
//!   [`DueCursor`]'s so that the engine's exclusive cursors line up.
//! - instants are big-endian `i64` with the sign bit flipped, so negative
//!   instants sort before positive ones.
//!
//! Values carry a leading format byte so a later layout can be told apart.

use belfry_core::event::{Attempt, EventRecord, EventSettings, EventStatus};
use belfry_core::{
    Backoff, DueCursor, EventId, EventKey, PartitionId, QueueName, TenantName, Timestamp,
};

use crate::{StoreError, StoreResult};

/// Separates the tenant from the id (and the id from what follows it).
const SEPARATOR: u8 = 0x00;
/// Format byte of event, attempt and tenant values.
const VALUE_FORMAT_V1: u8 = 1;
/// Format byte of an event record followed by its pull settings
/// ([`PullSettingsV2`]; postcard, one after the other). A V1 record has
/// the default settings.
const RECORD_FORMAT_V2: u8 = 2;
/// Format byte of an event record followed by its whole [`EventSettings`]
/// (postcard), written when it has a setting V2 cannot hold.
const RECORD_FORMAT_V3: u8 = 3;
/// Format byte of an event record followed by its whole [`EventSettings`]
/// and its `debounce_since` (postcard, one after the other), written while
/// a debounced series is pending.
const RECORD_FORMAT_V4: u8 = 4;

pub const META_PARTITIONS: &[u8] = b"partitions";
pub const META_SCHEMA: &[u8] = b"schema_version";
/// Prefix of the per-writer counters of attempt sequence numbers (see
/// [`attempt_key_raw`] and [`meta_attempt_seq`]).
pub const META_ATTEMPT_SEQ_PREFIX: &[u8] = b"attempt_seq/";
/// 2: the finished index starts with the partition; one attempt counter per
/// writer shard. 3: the listing index (`by_status_time`); a version-2
/// directory gets it built when it is opened.
pub const SCHEMA_VERSION: u32 = 3;
/// The one older layout that [`super::EmbeddedStore::open`] upgrades (by
/// building the listing index from the events).
pub const SCHEMA_VERSION_WITHOUT_LISTING_INDEX: u32 = 2;

/// The meta key holding the highest attempt sequence number handed out by
/// writer shard `shard`.
pub fn meta_attempt_seq(shard: usize) -> Vec<u8> {
    let mut out = META_ATTEMPT_SEQ_PREFIX.to_vec();
    out.extend_from_slice(&(shard as u64).to_be_bytes());
    out
}

pub fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(format!("undecodable stored data: {what}"))
}

/// Order-preserving bytes of an instant.
pub fn instant_bytes(at: Timestamp) -> [u8; 8] {
    ((at.as_millis() as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn instant_from_bytes(bytes: &[u8]) -> StoreResult<Timestamp> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| corrupt("instant length"))?;
    Ok(Timestamp::from_millis(
        (u64::from_be_bytes(array) ^ (1 << 63)) as i64,
    ))
}

/// Appends `tenant 0x00 id` to `out`.
pub fn push_event_key(out: &mut Vec<u8>, key: &EventKey) {
    out.extend_from_slice(key.tenant.as_str().as_bytes());
    out.push(SEPARATOR);
    out.extend_from_slice(key.id.as_str().as_bytes());
}

/// The key of an event in the `events` keyspace.
pub fn event_key(key: &EventKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.tenant.as_str().len() + key.id.as_str().len() + 1);
    push_event_key(&mut out, key);
    out
}

/// The prefix shared by every event of `tenant`.
pub fn tenant_prefix(tenant: &TenantName) -> Vec<u8> {
    let mut out = Vec::with_capacity(tenant.as_str().len() + 1);
    out.extend_from_slice(tenant.as_str().as_bytes());
    out.push(SEPARATOR);
    out
}

/// Sorts after every key that starts with [`tenant_prefix`] (an exclusive
/// upper bound): the separator's successor.
pub fn tenant_prefix_end(tenant: &TenantName) -> Vec<u8> {
    let mut out = tenant_prefix(tenant);
    if let Some(last) = out.last_mut() {
        *last = SEPARATOR + 1;
    }
    out
}

pub fn decode_event_key(bytes: &[u8]) -> StoreResult<EventKey> {
    let split = bytes
        .iter()
        .position(|b| *b == SEPARATOR)
        .ok_or_else(|| corrupt("event key without separator"))?;
    let tenant = std::str::from_utf8(&bytes[..split]).map_err(corrupt)?;
    let id = std::str::from_utf8(&bytes[split + 1..]).map_err(corrupt)?;
    Ok(EventKey::new(
        TenantName::new(tenant).map_err(corrupt)?,
        EventId::from_stored(id.to_string()).map_err(corrupt)?,
    ))
}

/// `partition (u16 BE) ++ instant ++ event key`.
pub fn due_key(partition: PartitionId, at: Timestamp, key: &EventKey) -> Vec<u8> {
    due_key_raw(partition, at, &event_key(key))
}

/// [`due_key`] from an already encoded event key.
pub fn due_key_raw(partition: PartitionId, at: Timestamp, encoded_key: &[u8]) -> Vec<u8> {
    partition_instant_key(partition, at, encoded_key)
}

/// `partition (u16 BE) ++ instant ++ encoded event key`: the layout of
/// the due and the retention index.
fn partition_instant_key(partition: PartitionId, at: Timestamp, encoded_key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + encoded_key.len());
    out.extend_from_slice(&partition.0.to_be_bytes());
    out.extend_from_slice(&instant_bytes(at));
    out.extend_from_slice(encoded_key);
    out
}

/// The smallest due key of `partition` (inclusive).
pub fn due_partition_start(partition: PartitionId) -> Vec<u8> {
    partition.0.to_be_bytes().to_vec()
}

/// Every due key of `partition` at or before `through` sorts at or below
/// this (inclusive bound): encoded names are UTF-8, which never contains the
/// byte `0xff`.
pub fn due_through_last(partition: PartitionId, through: Timestamp) -> Vec<u8> {
    let mut out = partition.0.to_be_bytes().to_vec();
    out.extend_from_slice(&instant_bytes(through));
    out.push(0xff);
    out
}

pub fn decode_due_key(bytes: &[u8]) -> StoreResult<DueCursor> {
    if bytes.len() < 10 {
        return Err(corrupt("due key too short"));
    }
    Ok(DueCursor {
        due: instant_from_bytes(&bytes[2..10])?,
        key: decode_event_key(&bytes[10..])?,
    })
}

/// `partition (u16 BE) ++ instant ++ event key` (already encoded): the
/// retention index. The partition comes first so that each writer shard
/// purges only the partitions it owns.
pub fn finished_key_raw(partition: PartitionId, at: Timestamp, encoded_key: &[u8]) -> Vec<u8> {
    partition_instant_key(partition, at, encoded_key)
}

/// `partition ++ instant`: every finished key of `partition` that sorts
/// below this finished before `at` (an exclusive bound).
pub fn finished_before(partition: PartitionId, at: Timestamp) -> Vec<u8> {
    let mut out = partition.0.to_be_bytes().to_vec();
    out.extend_from_slice(&instant_bytes(at));
    out
}

pub fn decode_finished_key(bytes: &[u8]) -> StoreResult<(Timestamp, EventKey)> {
    if bytes.len() < 10 {
        return Err(corrupt("finished key too short"));
    }
    Ok((
        instant_from_bytes(&bytes[2..10])?,
        decode_event_key(&bytes[10..])?,
    ))
}

/// A status's byte in the listing index. Stored: never renumber.
pub fn status_byte(status: EventStatus) -> u8 {
    match status {
        EventStatus::Scheduled => 1,
        EventStatus::Retrying => 2,
        EventStatus::Delivered => 3,
        EventStatus::Failed => 4,
        EventStatus::Missed => 5,
        EventStatus::Cancelled => 6,
        EventStatus::Expired => 7,
    }
}

/// The bytes between a listing entry's separator and its id.
const LISTING_STATUS_AND_INSTANT: usize = 9;

/// The status and instant of a `by_status_time` entry.
pub fn decode_listing_entry(entry: &[u8]) -> StoreResult<(u8, Timestamp)> {
    let split = tenant_end(entry);
    let status = *entry
        .get(split + 1)
        .ok_or_else(|| corrupt("listing index entry too short"))?;
    let at = entry
        .get(split + 2..split + 1 + LISTING_STATUS_AND_INSTANT)
        .ok_or_else(|| corrupt("listing index entry too short"))?;
    Ok((status, instant_from_bytes(at)?))
}

/// Where the tenant ends in an encoded event key: the separator's index.
fn tenant_end(encoded_key: &[u8]) -> usize {
    encoded_key
        .iter()
        .position(|b| *b == SEPARATOR)
        .unwrap_or(encoded_key.len())
}

/// `tenant 0x00 status`: the prefix of a tenant's `by_status_time` entries
/// of one status.
pub fn status_prefix(tenant: &TenantName, status: EventStatus) -> Vec<u8> {
    let mut out = tenant_prefix(tenant);
    out.push(status_byte(status));
    out
}

/// Sorts after every listing entry of `tenant` with `status` (an exclusive
/// upper bound): the next status byte.
pub fn status_prefix_end(tenant: &TenantName, status: EventStatus) -> Vec<u8> {
    let mut out = tenant_prefix(tenant);
    out.push(status_byte(status) + 1);
    out
}

/// `tenant 0x00 status event_time id` (from an encoded event key): the
/// listing index `by_status_time`, a tenant's events of one status in
/// `(event_time, id)` order.
pub fn by_status_time_key_raw(encoded_key: &[u8], status: EventStatus, at: Timestamp) -> Vec<u8> {
    let split = tenant_end(encoded_key);
    let mut out = Vec::with_capacity(encoded_key.len() + 9);
    out.extend_from_slice(&encoded_key[..split]);
    out.push(SEPARATOR);
    out.push(status_byte(status));
    out.extend_from_slice(&instant_bytes(at));
    out.extend_from_slice(encoded_key.get(split + 1..).unwrap_or_default());
    out
}

/// `tenant 0x00 status event_time`: where a tenant's `by_status_time`
/// entries of `status` at `at` begin.
pub fn by_status_time_start(tenant: &TenantName, status: EventStatus, at: Timestamp) -> Vec<u8> {
    let mut out = status_prefix(tenant, status);
    out.extend_from_slice(&instant_bytes(at));
    out
}

/// The encoded event key (`tenant 0x00 id`) that a `by_status_time` entry
/// points at.
pub fn event_key_of_listing_entry(entry: &[u8]) -> StoreResult<Vec<u8>> {
    let split = tenant_end(entry);
    let id = entry
        .get(split + 1 + LISTING_STATUS_AND_INSTANT..)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| corrupt("listing index entry too short"))?;
    let mut out = Vec::with_capacity(split + 1 + id.len());
    out.extend_from_slice(&entry[..=split]);
    out.extend_from_slice(id);
    Ok(out)
}

/// The prefix of every attempt of `key`: `event key ++ 0x00`.
pub fn attempts_prefix(key: &EventKey) -> Vec<u8> {
    attempts_prefix_raw(&event_key(key))
}

/// [`attempts_prefix`] of an encoded event key.
pub fn attempts_prefix_raw(encoded_key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_key.len() + 1);
    out.extend_from_slice(encoded_key);
    out.push(SEPARATOR);
    out
}

/// `event key ++ 0x00 ++ started_at ++ seq (u64 BE)`: history in start
/// order, ties in recording order; `seq` is unique for the store's life.
pub fn attempt_key_raw(encoded_key: &[u8], started_at: Timestamp, seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_key.len() + 17);
    out.extend_from_slice(encoded_key);
    out.push(SEPARATOR);
    out.extend_from_slice(&instant_bytes(started_at));
    out.extend_from_slice(&seq.to_be_bytes());
    out
}

/// The settings a V2 record holds: those of pull events before the
/// delivery policy's other fields existed.
#[derive(serde::Serialize, serde::Deserialize)]
struct PullSettingsV2 {
    queue: Option<QueueName>,
    max_attempts: Option<u32>,
    backoff: Option<Backoff>,
}

impl PullSettingsV2 {
    /// `settings` in this form, when it holds nothing else.
    fn of(settings: &EventSettings) -> Option<Self> {
        let v2 = PullSettingsV2 {
            queue: settings.queue.clone(),
            max_attempts: settings.max_attempts,
            backoff: settings.backoff,
        };
        (EventSettings::from(&v2) == *settings).then_some(v2)
    }
}

impl From<&PullSettingsV2> for EventSettings {
    fn from(v2: &PullSettingsV2) -> Self {
        EventSettings {
            queue: v2.queue.clone(),
            max_attempts: v2.max_attempts,
            backoff: v2.backoff,
            ..EventSettings::default()
        }
    }
}

/// V4 while a debounced series is pending; else V1 while the settings are
/// the default (most events), V2 while they are a pull event's queue, cap
/// and back-off only (as older builds wrote and read them), V3 otherwise.
pub fn encode_record(record: &EventRecord) -> StoreResult<Vec<u8>> {
    let mut out = encode_postcard(record)?;
    if record.debounce_since.is_some() {
        out[0] = RECORD_FORMAT_V4;
        postcard::to_io(&(&record.settings, record.debounce_since), &mut out)
            .map_err(|e| StoreError::Internal(format!("encoding failed: {e}")))?;
        return Ok(out);
    }
    if record.settings == EventSettings::default() {
        return Ok(out);
    }
    let written = match PullSettingsV2::of(&record.settings) {
        Some(v2) => {
            out[0] = RECORD_FORMAT_V2;
            postcard::to_io(&v2, &mut out).map(drop)
        }
        None => {
            out[0] = RECORD_FORMAT_V3;
            postcard::to_io(&record.settings, &mut out).map(drop)
        }
    };
    written.map_err(|e| StoreError::Internal(format!("encoding failed: {e}")))?;
    Ok(out)
}

pub fn decode_record(bytes: &[u8]) -> StoreResult<EventRecord> {
    match bytes.split_first() {
        Some((&format @ (RECORD_FORMAT_V2 | RECORD_FORMAT_V3), rest)) => {
            let (mut record, tail): (EventRecord, _) =
                postcard::take_from_bytes(rest).map_err(corrupt)?;
            record.settings = if format == RECORD_FORMAT_V2 {
                EventSettings::from(&postcard::from_bytes::<PullSettingsV2>(tail).map_err(corrupt)?)
            } else {
                postcard::from_bytes(tail).map_err(corrupt)?
            };
            Ok(record)
        }
        Some((&RECORD_FORMAT_V4, rest)) => {
            let (mut record, tail): (EventRecord, _) =
                postcard::take_from_bytes(rest).map_err(corrupt)?;
            (record.settings, record.debounce_since) =
                postcard::from_bytes(tail).map_err(corrupt)?;
            Ok(record)
        }
        _ => decode_postcard(bytes),
    }
}

pub fn encode_attempt(attempt: &Attempt) -> StoreResult<Vec<u8>> {
    encode_postcard(attempt)
}

pub fn decode_attempt(bytes: &[u8]) -> StoreResult<Attempt> {
    decode_postcard(bytes)
}

fn encode_postcard<T: serde::Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    let mut out = vec![VALUE_FORMAT_V1];
    postcard::to_io(value, &mut out)
        .map_err(|e| StoreError::Internal(format!("encoding failed: {e}")))?;
    Ok(out)
}

fn decode_postcard<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    match bytes.split_first() {
        Some((&VALUE_FORMAT_V1, rest)) => postcard::from_bytes(rest).map_err(corrupt),
        _ => Err(corrupt("unknown value format")),
    }
}

/// Tenants are JSON: their sink config is an internally tagged enum, which
/// postcard cannot read back. They are few and small.
/// A tenant's stored value (its `TenantConfig` or its `TenantPause`):
/// a format byte and JSON.
pub fn encode_tenant_doc<T: serde::Serialize>(doc: &T) -> StoreResult<Vec<u8>> {
    let mut out = vec![VALUE_FORMAT_V1];
    serde_json::to_writer(&mut out, doc)
        .map_err(|e| StoreError::Internal(format!("encoding failed: {e}")))?;
    Ok(out)
}

pub fn decode_tenant_doc<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    match bytes.split_first() {
        Some((&VALUE_FORMAT_V1, rest)) => serde_json::from_slice(rest).map_err(corrupt),
        _ => Err(corrupt("unknown tenant format")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, id: &str) -> EventKey {
        EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap())
    }

    #[test]
    fn instants_sort_like_numbers() {
        let values = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for pair in values.windows(2) {
            let (a, b) = (
                Timestamp::from_millis(pair[0]),
                Timestamp::from_millis(pair[1]),
            );
            assert!(instant_bytes(a) < instant_bytes(b));
            assert_eq!(instant_from_bytes(&instant_bytes(a)).unwrap(), a);
        }
    }

    #[test]
    fn event_keys_sort_like_event_key_ord_and_round_trip() {
        let mut keys = vec![
            key("a", "z"),
            key("ab", "a"),
            key("a/b", "1"),
            key("a", "a/b"),
            key("ü", "é"),
            key("a", "a"),
            key("a", "aa"),
        ];
        let mut by_bytes = keys.clone();
        by_bytes.sort_by_key(event_key);
        keys.sort();
        assert_eq!(keys, by_bytes);
        for k in &keys {
            assert_eq!(&decode_event_key(&event_key(k)).unwrap(), k);
        }
    }

    #[test]
    fn due_keys_round_trip_and_bound() {
        let k = key("t/x", "é/1");
        let at = Timestamp::from_millis(-42);
        let bytes = due_key(PartitionId(3), at, &k);
        assert_eq!(
            decode_due_key(&bytes).unwrap(),
            DueCursor {
                due: at,
                key: k.clone()
            }
        );
        assert!(bytes <= due_through_last(PartitionId(3), at));
        assert!(bytes >= due_partition_start(PartitionId(3)));
        assert!(bytes > due_through_last(PartitionId(3), Timestamp::from_millis(-43)));
        let max = Timestamp::from_millis(i64::MAX);
        assert!(due_key(PartitionId(3), max, &k) <= due_through_last(PartitionId(3), max));
        assert!(due_through_last(PartitionId(3), max) < due_partition_start(PartitionId(4)));
    }

    #[test]
    fn finished_keys_round_trip_and_stay_in_their_partition() {
        let k = key("t", "e");
        let at = Timestamp::from_millis(1_000);
        let bytes = finished_key_raw(PartitionId(2), at, &event_key(&k));
        assert_eq!(decode_finished_key(&bytes).unwrap(), (at, k));
        let later = Timestamp::from_millis(1_001);
        assert!(bytes < finished_before(PartitionId(2), later));
        assert!(bytes >= finished_before(PartitionId(2), at));
        assert!(bytes >= finished_before(PartitionId(2), Timestamp::from_millis(i64::MIN)));
        let max = Timestamp::from_millis(i64::MAX);
        assert!(bytes < finished_before(PartitionId(3), Timestamp::from_millis(i64::MIN)));
        assert!(finished_key_raw(PartitionId(1), max, &event_key(&key("z", "z"))) < bytes);
    }

    #[test]
    fn records_without_pull_settings_stay_in_format_1() {
        use belfry_core::event::{EventCommand, TransitionContext, transition};
        let k = key("t", "e");
        let make = |settings: EventSettings| {
            let command = EventCommand::Upsert {
                event_time: Timestamp::from_millis(5),
                payload: Some("p".into()),
                delivery: Default::default(),
                settings,
                new_version: belfry_core::EventVersion::from_string("v".into()),
            };
            let ctx = TransitionContext {
                now: Timestamp::from_millis(1),
                partition: PartitionId(0),
                retry: &Default::default(),
            };
            transition(&k, None, command, ctx).next.unwrap()
        };
        let plain = make(EventSettings::default());
        let bytes = encode_record(&plain).unwrap();
        assert_eq!(bytes[0], VALUE_FORMAT_V1, "readable by older builds");
        assert_eq!(decode_record(&bytes).unwrap(), plain);
        let pulled = make(EventSettings {
            queue: Some(belfry_core::QueueName::new("q").unwrap()),
            max_attempts: Some(3),
            ..EventSettings::default()
        });
        let bytes = encode_record(&pulled).unwrap();
        assert_eq!(bytes[0], RECORD_FORMAT_V2);
        assert_eq!(decode_record(&bytes).unwrap(), pulled);
        assert!(decode_record(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn records_with_a_delivery_policy_are_format_3_and_v2_still_reads() {
        use belfry_core::event::{EventCommand, TransitionContext, transition};
        let k = key("t", "e");
        let settings = EventSettings {
            max_attempts: Some(2),
            attempt_timeout_ms: Some(500),
            expire_at: Some(Timestamp::from_millis(9_000)),
            max_age_ms: Some(4_000),
            ..EventSettings::default()
        };
        let command = EventCommand::Upsert {
            event_time: Timestamp::from_millis(5),
            payload: Some("p".into()),
            delivery: Default::default(),
            settings,
            new_version: belfry_core::EventVersion::from_string("v".into()),
        };
        let ctx = TransitionContext {
            now: Timestamp::from_millis(1),
            partition: PartitionId(0),
            retry: &Default::default(),
        };
        let record = transition(&k, None, command, ctx).next.unwrap();
        let bytes = encode_record(&record).unwrap();
        assert_eq!(bytes[0], RECORD_FORMAT_V3);
        assert_eq!(decode_record(&bytes).unwrap(), record);
        assert!(decode_record(&bytes[..bytes.len() - 1]).is_err());

        // A V2 record as an older build wrote it: the record, then the
        // three pull fields.
        let mut pulled = record.clone();
        pulled.settings = EventSettings {
            max_attempts: Some(4),
            ..EventSettings::default()
        };
        let mut v2 = encode_postcard(&pulled).unwrap();
        v2[0] = RECORD_FORMAT_V2;
        postcard::to_io(&(None::<QueueName>, Some(4u32), None::<Backoff>), &mut v2).unwrap();
        assert_eq!(decode_record(&v2).unwrap(), pulled);
        assert_eq!(encode_record(&pulled).unwrap(), v2, "written as before");
    }

    #[test]
    fn records_of_a_debounced_series_are_format_4() {
        use belfry_core::event::{Debounce, EventCommand, TransitionContext, transition};
        let k = key("t", "e");
        let command = EventCommand::DebouncedUpsert {
            debounce: Debounce {
                delay_ms: 500,
                max_wait_ms: 3_000,
            },
            payload: Some("p".into()),
            delivery: Default::default(),
            settings: EventSettings {
                max_attempts: Some(2),
                ..EventSettings::default()
            },
            new_version: belfry_core::EventVersion::from_string("v".into()),
        };
        let ctx = TransitionContext {
            now: Timestamp::from_millis(1),
            partition: PartitionId(0),
            retry: &Default::default(),
        };
        let record = transition(&k, None, command, ctx).next.unwrap();
        assert_eq!(record.debounce_since, Some(Timestamp::from_millis(1)));
        let bytes = encode_record(&record).unwrap();
        assert_eq!(bytes[0], RECORD_FORMAT_V4);
        assert_eq!(decode_record(&bytes).unwrap(), record);
        assert!(decode_record(&bytes[..bytes.len() - 1]).is_err());
        // Once the series is over, the formats older builds read.
        let plain = EventRecord {
            debounce_since: None,
            ..record
        };
        let bytes = encode_record(&plain).unwrap();
        assert_eq!(bytes[0], RECORD_FORMAT_V2);
        assert_eq!(decode_record(&bytes).unwrap(), plain);
    }

    #[test]
    fn garbage_is_an_internal_error() {
        assert!(decode_record(b"").is_err());
        assert!(decode_record(&[9, 1, 2]).is_err());
        assert!(decode_event_key(b"no-separator").is_err());
        assert!(decode_due_key(b"x").is_err());
    }
}
