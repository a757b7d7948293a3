//! Listings ([`crate::Store::list_events`]) and the index they read.
//!
//! | filters | read from | order |
//! |---|---|---|
//! | none | `events` (`tenant 0x00 id`) | id |
//! | `status` (and maybe `from`/`to`) | `by_status_time` (`tenant 0x00 status event_time id`): one range | `(event_time, id)` |
//! | `from`/`to` only | `by_status_time`: the six statuses' ranges, merged | `(event_time, id)` |
//!
//! One index serves every filter so that a status change (the write every
//! delivery makes) moves one index entry, not one per index.
//!
//! Every page reads O(`limit`) entries: the index entries it returns, one
//! record each, one head per merged status, and the record of `after`.
//! Nothing is skipped by filtering, so a page shorter than `limit` is the
//! end. (fjall still steps over the tombstones of entries removed from a
//! range until compaction drops them: right after a million deliveries,
//! the first page of `status=scheduled` passes a million tombstones.) All
//! reads of one page come from one snapshot, so an index entry and its
//! record always agree (the writer puts both in one batch).
//!
//! Engine-internal events (schedules' control events) are in `events` only:
//! filtered listings never see them.
//!
//! `reads` counts every index entry and record read (for tests).

use std::ops::Bound;

use belfry_core::event::{EventRecord, EventStatus};
use belfry_core::{TenantName, Timestamp};
use fjall::{Iter, Readable, Snapshot};

use super::keys;
use super::writer::{Keyspaces, Listed, internal};
use crate::{ListEventsParams, StoreResult};

/// Answers a listing; `reads` grows by every index entry and record read.
pub fn list(
    ks: &Keyspaces,
    params: &ListEventsParams,
    reads: &mut u64,
) -> StoreResult<Vec<EventRecord>> {
    if params.limit == 0 {
        return Ok(Vec::new());
    }
    let snapshot = ks.db.snapshot();
    let mut reader = Reader {
        ks,
        snapshot: &snapshot,
        reads,
    };
    if params.status.is_none() && params.from.is_none() && params.to.is_none() {
        reader.by_id(params)
    } else {
        reader.by_status_time(params)
    }
}

struct Reader<'a> {
    ks: &'a Keyspaces,
    snapshot: &'a Snapshot,
    reads: &'a mut u64,
}

impl Reader<'_> {
    /// The record under an encoded event key.
    fn record(&mut self, encoded: &[u8]) -> StoreResult<Option<EventRecord>> {
        *self.reads += 1;
        match self
            .snapshot
            .get(&self.ks.events, encoded)
            .map_err(internal)?
        {
            Some(bytes) => Ok(Some(keys::decode_record(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The next key of `iter`, counted.
    fn next_key(&mut self, iter: &mut Iter) -> StoreResult<Option<Vec<u8>>> {
        match iter.next() {
            Some(item) => {
                *self.reads += 1;
                Ok(Some(item.key().map_err(internal)?.to_vec()))
            }
            None => Ok(None),
        }
    }

    /// No filter: the tenant's events in id order, internal ones included.
    fn by_id(&mut self, params: &ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        let prefix = keys::tenant_prefix(&params.tenant);
        let start = match &params.after {
            Some(after) => Bound::Excluded(with_id(prefix.clone(), after.as_str())),
            None => Bound::Included(prefix),
        };
        let end = Bound::Excluded(keys::tenant_prefix_end(&params.tenant));
        let mut found = Vec::new();
        for item in self
            .snapshot
            .range::<Vec<u8>, _>(&self.ks.events, (start, end))
            .take(params.limit)
        {
            *self.reads += 1;
            let (_, value) = item.into_inner().map_err(internal)?;
            found.push(keys::decode_record(&value)?);
        }
        Ok(found)
    }

    /// Any filter: `by_status_time` in `(event_time, id)` order, the
    /// status's range or, without a status, the six ranges merged.
    ///
    /// Position: after `(t, after)`, where `t` is the later of `from` and
    /// the stored instant of the event `after` (if it still exists), so
    /// that a caller may pass either the previous page's last id alone or
    /// also its instant as `from`.
    fn by_status_time(&mut self, params: &ListEventsParams) -> StoreResult<Vec<EventRecord>> {
        let mut position = params.from.unwrap_or(Timestamp::MIN);
        if let Some(after) = &params.after {
            let encoded = with_id(keys::tenant_prefix(&params.tenant), after.as_str());
            if let Some(record) = self.record(&encoded)? {
                position = position.max(record.event_time);
            }
        }
        if params.to.is_some_and(|to| position >= to) {
            return Ok(Vec::new());
        }
        let statuses: &[EventStatus] = match &params.status {
            Some(status) => std::slice::from_ref(status),
            None => &EventStatus::ALL,
        };
        // One range per status, each with its current head (key, iterator).
        let mut heads: Vec<(Vec<u8>, Iter)> = Vec::with_capacity(statuses.len());
        for &status in statuses {
            let range = range_of(&params.tenant, status, position, params);
            let mut iter = self
                .snapshot
                .range::<Vec<u8>, _>(&self.ks.by_status_time, range);
            if let Some(key) = self.next_key(&mut iter)? {
                heads.push((key, iter));
            }
        }
        // Every key shares `tenant 0x00`, then the status byte; after it,
        // `instant ++ id` compares bytewise exactly like `(event_time, id)`.
        let order_from = keys::tenant_prefix(&params.tenant).len() + 1;
        let mut found = Vec::with_capacity(params.limit.min(1_024));
        while found.len() < params.limit {
            let Some(next) = (0..heads.len())
                .min_by(|a, b| heads[*a].0[order_from..].cmp(&heads[*b].0[order_from..]))
            else {
                break;
            };
            let entry = &heads[next].0;
            let (status, at) = keys::decode_listing_entry(entry)?;
            let encoded = keys::event_key_of_listing_entry(entry)?;
            let record = match self.record(&encoded)? {
                Some(record)
                    if Listed::of(&record).is_some_and(|l| {
                        keys::status_byte(l.status) == status && l.event_time == at
                    }) =>
                {
                    record
                }
                _ => {
                    return Err(keys::corrupt(
                        "a listing index entry disagrees with its event",
                    ));
                }
            };
            found.push(record);
            if found.len() == params.limit {
                break;
            }
            match self.next_key(&mut heads[next].1)? {
                Some(key) => heads[next].0 = key,
                None => {
                    heads.swap_remove(next);
                }
            }
        }
        Ok(found)
    }
}

/// [`crate::Store::count_events`]: the tenant's `by_status_time` entries of
/// one status (client events only, like every entry of that index), keys
/// only, stopping at `at_most`.
pub fn count(ks: &Keyspaces, params: &crate::CountEventsParams) -> StoreResult<u64> {
    let snapshot = ks.db.snapshot();
    let start = keys::status_prefix(&params.tenant, params.status);
    let end = keys::status_prefix_end(&params.tenant, params.status);
    let mut count = 0;
    for item in snapshot.range::<Vec<u8>, _>(
        &ks.by_status_time,
        (Bound::Included(start), Bound::Excluded(end)),
    ) {
        if count >= params.at_most {
            break;
        }
        item.key().map_err(internal)?;
        count += 1;
    }
    Ok(count)
}

/// `status`'s range of a listing: after `(position, after)` (from
/// `position` inclusive without `after`), before `to`.
fn range_of(
    tenant: &TenantName,
    status: EventStatus,
    position: Timestamp,
    params: &ListEventsParams,
) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = keys::by_status_time_start(tenant, status, position);
    let start = match &params.after {
        Some(after) => Bound::Excluded(with_id(start, after.as_str())),
        None => Bound::Included(start),
    };
    let end = match params.to {
        Some(to) => Bound::Excluded(keys::by_status_time_start(tenant, status, to)),
        None => Bound::Excluded(keys::status_prefix_end(tenant, status)),
    };
    (start, end)
}

fn with_id(mut prefix: Vec<u8>, id: &str) -> Vec<u8> {
    prefix.extend_from_slice(id.as_bytes());
    prefix
}

/// Builds the listing index from the events: opening a data directory of
/// schema version 2, before any writer starts. Idempotent (entries are
/// keyed by the events, which nothing changes meanwhile), so a run cut
/// short by a crash is simply repeated at the next open. Returns how many
/// events were indexed.
pub fn rebuild(ks: &Keyspaces) -> StoreResult<u64> {
    /// Events per batch: bounds the memory of the rebuild.
    const BATCH_EVENTS: usize = 10_000;
    let mut indexed = 0;
    let mut batch = ks.db.batch();
    let mut in_batch = 0;
    for item in ks.events.iter() {
        let (key, value) = item.into_inner().map_err(internal)?;
        let record = keys::decode_record(&value)?;
        let Some(listed) = Listed::of(&record) else {
            continue;
        };
        batch.insert(&ks.by_status_time, listed.key(&key), []);
        indexed += 1;
        in_batch += 1;
        if in_batch == BATCH_EVENTS {
            batch.commit().map_err(internal)?;
            batch = ks.db.batch();
            in_batch = 0;
        }
    }
    if !batch.is_empty() {
        batch.commit().map_err(internal)?;
    }
    Ok(indexed)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;
    use std::sync::Arc;

    use belfry_core::event::{DeliveryOption, EventCommand};
    use belfry_core::{EventId, EventKey, EventVersion, PartitionCount, RetryPolicy};
    use fjall::{Database, KeyspaceCreateOptions, PersistMode};

    use super::*;
    use crate::{ApplyParams, EmbeddedOptions, EmbeddedStore, KeyedCommand, SharedStore};

    fn open(dir: &std::path::Path) -> SharedStore {
        Arc::new(
            EmbeddedStore::open(EmbeddedOptions {
                data_dir: dir.to_path_buf(),
                partitions: PartitionCount::new(4).unwrap(),
                writers: NonZeroUsize::new(2),
                clock: std::sync::Arc::new(belfry_clock::SystemClock),
            })
            .unwrap(),
        )
    }

    fn upsert(id: EventId, at: i64) -> KeyedCommand {
        KeyedCommand {
            key: EventKey::new(TenantName::new("t").unwrap(), id),
            command: EventCommand::Upsert {
                event_time: Timestamp::from_millis(at),
                payload: None,
                delivery: DeliveryOption::FullEvent,
                new_version: EventVersion::from_string("v".into()),
                settings: Default::default(),
            },
            fence: None,
        }
    }

    fn params(status: Option<EventStatus>, from: Option<i64>) -> ListEventsParams {
        ListEventsParams {
            tenant: TenantName::new("t").unwrap(),
            status,
            from: from.map(Timestamp::from_millis),
            to: None,
            after: None,
            limit: 100,
        }
    }

    fn ids(records: &[EventRecord]) -> Vec<&str> {
        records.iter().map(|r| r.key.id.as_str()).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_schema_2_directory_gets_its_listing_index_built() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path());
            let mut commands: Vec<KeyedCommand> = (0..30)
                .map(|i| upsert(EventId::new(format!("e{i:02}")).unwrap(), 1_000 * (30 - i)))
                .collect();
            commands.push(upsert(EventId::internal("schedule/s").unwrap(), 0));
            store
                .apply(ApplyParams {
                    commands,
                    now: Timestamp::from_millis(0),
                    retry: RetryPolicy::default(),
                })
                .await
                .unwrap();
        }
        // Make it what an older build left: no listing entries, version 2.
        {
            let db = Database::builder(dir.path()).open().unwrap();
            let meta = db.keyspace("meta", KeyspaceCreateOptions::default).unwrap();
            let mut batch = db.batch();
            let index = db
                .keyspace("by_status_time", KeyspaceCreateOptions::default)
                .unwrap();
            assert!(index.iter().next().is_some(), "the writer maintains it");
            for item in index.iter() {
                batch.remove(&index, item.key().unwrap());
            }
            batch.insert(
                &meta,
                keys::META_SCHEMA,
                keys::SCHEMA_VERSION_WITHOUT_LISTING_INDEX.to_be_bytes(),
            );
            batch.commit().unwrap();
            db.persist(PersistMode::SyncAll).unwrap();
        }
        let store = open(dir.path());
        let scheduled = store
            .list_events(params(Some(EventStatus::Scheduled), None))
            .await
            .unwrap();
        let expected: Vec<String> = (0..30).rev().map(|i| format!("e{i:02}")).collect();
        assert_eq!(ids(&scheduled), expected, "client events only, by instant");
        let timed = store.list_events(params(None, Some(28_000))).await.unwrap();
        assert_eq!(ids(&timed), ["e02", "e01", "e00"]);
        drop(store);
        // The version is recorded: the next open builds nothing.
        let db = Database::builder(dir.path()).open().unwrap();
        let meta = db.keyspace("meta", KeyspaceCreateOptions::default).unwrap();
        let schema = meta.get(keys::META_SCHEMA).unwrap().unwrap();
        assert_eq!(schema.as_ref(), keys::SCHEMA_VERSION.to_be_bytes());
    }

    #[test]
    fn listing_keys_point_back_at_their_event_and_sort_by_status_then_time() {
        let key = |tenant: &str, id: &str| {
            keys::event_key(&EventKey::new(
                TenantName::new(tenant).unwrap(),
                EventId::new(id).unwrap(),
            ))
        };
        let tenant = TenantName::new("a/b").unwrap();
        let encoded = key("a/b", "é/1");
        let at = Timestamp::from_millis(-5);
        let entry = keys::by_status_time_key_raw(&encoded, EventStatus::Failed, at);
        assert_eq!(keys::event_key_of_listing_entry(&entry).unwrap(), encoded);
        assert_eq!(
            keys::decode_listing_entry(&entry).unwrap(),
            (keys::status_byte(EventStatus::Failed), at)
        );
        assert!(entry.starts_with(&keys::status_prefix(&tenant, EventStatus::Failed)));
        assert!(entry < keys::status_prefix_end(&tenant, EventStatus::Failed));
        assert!(entry < keys::tenant_prefix_end(&tenant));
        assert!(entry >= keys::by_status_time_start(&tenant, EventStatus::Failed, at));
        let next_instant = Timestamp::from_millis(-4);
        assert!(entry < keys::by_status_time_start(&tenant, EventStatus::Failed, next_instant));
        // Another tenant whose name extends this one's stays outside.
        let neighbour = key("a/bc", "x");
        let neighbour = keys::by_status_time_key_raw(&neighbour, EventStatus::Scheduled, at);
        assert!(neighbour >= keys::tenant_prefix_end(&tenant));
        // Within a status: time order, then id order.
        let later_id = keys::by_status_time_key_raw(&key("a/b", "é/2"), EventStatus::Failed, at);
        assert!(entry < later_id);
        let earlier = Timestamp::from_millis(-6);
        let earlier = keys::by_status_time_key_raw(&key("a/b", "z"), EventStatus::Failed, earlier);
        assert!(earlier < entry);
        assert!(keys::event_key_of_listing_entry(b"t\0\x04").is_err());
        assert!(keys::event_key_of_listing_entry(b"no separator").is_err());
        assert!(keys::decode_listing_entry(b"t\0\x04\0").is_err());
    }
}
