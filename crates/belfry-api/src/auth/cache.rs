//! What a node knows of API keys, and what keys it does not know may cost.
//!
//! The key format is public and its checksum is no secret, so anyone can
//! mint well-formed keys; each one this node has not seen would cost a
//! store read. Three rules bound that cost:
//! - **known keys** (read from the store and found) live in their own
//!   bounded table that a flood cannot touch: only a key that exists
//!   enters it, and when full the least recently used one leaves. A
//!   known key is re-read once its entry is older than
//!   `auth.key_cache_ttl_ms` (a revocation elsewhere takes effect within
//!   that), and that re-read is not charged to the budget below;
//! - **unknown hashes** (read and not found) are remembered for the same
//!   time in a separate table, emptied whole when full: forgetting them
//!   costs at most a new read each, under the budget;
//! - **reads for hashes in neither table** take a token from one
//!   node-wide bucket (`auth.unknown_key_reads_per_second`, one second's
//!   worth at once); with none left the request is answered 503 with
//!   `Retry-After` and the store is not touched.
//!
//! Concurrent lookups of one hash share one read (single flight). The
//! read runs as its own task, so a client that hangs up does not leave
//! the others waiting on nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_core::auth::{ApiKey, KeyHash};
use belfry_core::{Clock, MonoTime};
use belfry_metrics::KeyRead;
use belfry_store::{SharedStore, StoreError, StoreResult};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

/// Most known keys held; the least recently used leaves first.
pub const KNOWN_CAPACITY: usize = 10_000;

/// Most unknown hashes remembered; the table is emptied whole when full.
pub const UNKNOWN_CAPACITY: usize = 10_000;

/// What a lookup found.
#[derive(Debug)]
pub(crate) enum Found {
    /// The store has this key (not revoked; it may have expired).
    Key(ApiKey),
    /// No such key, or a revoked one.
    Missing,
    /// Not known here, and the budget for reading unknown keys is spent:
    /// ask again after this long.
    Busy(Duration),
}

struct Known {
    key: ApiKey,
    read_at: MonoTime,
    used_at: MonoTime,
}

type Read = Shared<BoxFuture<'static, StoreResult<Option<ApiKey>>>>;

/// The key tables of one node (see the module docs).
pub(crate) struct KeyCache {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    ttl: Duration,
    known: Mutex<HashMap<KeyHash, Known>>,
    unknown: Mutex<HashMap<KeyHash, MonoTime>>,
    budget: Mutex<Budget>,
    in_flight: Mutex<HashMap<KeyHash, Read>>,
    /// Bumped by every change made through this node: a read that started
    /// before one must not put back what the change removed.
    generation: AtomicU64,
}

impl KeyCache {
    pub(crate) fn new(
        store: SharedStore,
        clock: Arc<dyn Clock>,
        ttl: Duration,
        reads_per_second: u32,
    ) -> KeyCache {
        KeyCache {
            store,
            clock,
            ttl,
            known: Mutex::new(HashMap::new()),
            unknown: Mutex::new(HashMap::new()),
            budget: Mutex::new(Budget::new(reads_per_second)),
            in_flight: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
        }
    }

    /// The key behind `hash`, from the tables or (within the rules of the
    /// module docs) the store.
    ///
    /// # Errors
    /// The store failed to answer.
    pub(crate) async fn find(self: &Arc<Self>, hash: &KeyHash) -> StoreResult<Found> {
        let now = self.clock.monotonic();
        let known = {
            let mut known = lock(&self.known);
            match known.get_mut(hash) {
                Some(entry) if now.since(entry.read_at) < self.ttl => {
                    entry.used_at = now;
                    return Ok(Found::Key(entry.key.clone()));
                }
                Some(_) => true,
                None => false,
            }
        };
        if !known
            && lock(&self.unknown)
                .get(hash)
                .is_some_and(|at| now.since(*at) < self.ttl)
        {
            return Ok(Found::Missing);
        }
        let read = {
            let mut in_flight = lock(&self.in_flight);
            match in_flight.get(hash) {
                Some(read) => read.clone(),
                None => {
                    if !known && let Err(wait) = lock(&self.budget).take(now) {
                        belfry_metrics::auth_lookup_shed();
                        return Ok(Found::Busy(wait));
                    }
                    let read = self.start_read(hash.clone());
                    in_flight.insert(hash.clone(), read.clone());
                    read
                }
            }
        };
        Ok(match read.await? {
            Some(key) => Found::Key(key),
            None => Found::Missing,
        })
    }

    /// Reads `hash` in a task of its own that files the answer and then
    /// leaves the in-flight table.
    fn start_read(self: &Arc<Self>, hash: KeyHash) -> Read {
        let cache = Arc::clone(self);
        let generation = self.generation.load(Ordering::Acquire);
        let task = tokio::spawn(async move {
            let result = cache.store.api_key_by_hash(&hash).await;
            let read_at = cache.clock.monotonic();
            belfry_metrics::auth_key_read(match &result {
                Ok(Some(_)) => KeyRead::Found,
                Ok(None) => KeyRead::Unknown,
                Err(_) => KeyRead::Failed,
            });
            // Filed under the in-flight lock, so a lookup that misses the
            // tables finds this read or its answer, never neither.
            let mut in_flight = lock(&cache.in_flight);
            if cache.generation.load(Ordering::Acquire) == generation {
                match &result {
                    Ok(Some(key)) => cache.remember(key.clone(), read_at),
                    Ok(None) => cache.forget_known(&hash, Some(read_at)),
                    Err(_) => {}
                }
            }
            in_flight.remove(&hash);
            result
        });
        async move {
            task.await.unwrap_or_else(|error| {
                tracing::error!(%error, "an API key read ended abnormally");
                Err(StoreError::Internal(
                    "an API key read ended abnormally".into(),
                ))
            })
        }
        .boxed()
        .shared()
    }

    /// Files a key that exists.
    pub(crate) fn remember(&self, key: ApiKey, read_at: MonoTime) {
        lock(&self.unknown).remove(&key.hash);
        let mut known = lock(&self.known);
        if known.len() >= KNOWN_CAPACITY && !known.contains_key(&key.hash) {
            let oldest = known
                .iter()
                .min_by_key(|(_, entry)| entry.used_at)
                .map(|(hash, _)| hash.clone());
            if let Some(oldest) = oldest {
                known.remove(&oldest);
            }
        }
        known.insert(
            key.hash.clone(),
            Known {
                key,
                read_at,
                used_at: read_at,
            },
        );
    }

    /// Drops `hash` from the known keys; with `unknown_since`, remembers
    /// it as unknown.
    fn forget_known(&self, hash: &KeyHash, unknown_since: Option<MonoTime>) {
        lock(&self.known).remove(hash);
        if let Some(at) = unknown_since {
            let mut unknown = lock(&self.unknown);
            if unknown.len() >= UNKNOWN_CAPACITY {
                unknown.clear();
            }
            unknown.insert(hash.clone(), at);
        }
    }

    /// A key was created through this node: known at once.
    pub(crate) fn created(&self, key: ApiKey) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.remember(key, self.clock.monotonic());
    }

    /// A key was revoked through this node: refused at once.
    pub(crate) fn revoked(&self, hash: &KeyHash) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.forget_known(hash, Some(self.clock.monotonic()));
    }
}

/// The node-wide token bucket for reads of keys not known here.
struct Budget {
    per_second: f64,
    tokens: f64,
    updated: Option<MonoTime>,
}

impl Budget {
    fn new(per_second: u32) -> Budget {
        let per_second = f64::from(per_second.max(1));
        Budget {
            per_second,
            tokens: per_second,
            updated: None,
        }
    }

    /// One token, or how long until the next.
    fn take(&mut self, now: MonoTime) -> Result<(), Duration> {
        // Callers read the clock before the lock: an earlier `now` may
        // arrive after a later one, and must not move the bucket's time
        // back (the interval would be refilled twice).
        let now = self.updated.map_or(now, |updated| updated.max(now));
        if let Some(updated) = self.updated {
            let elapsed = now.since(updated).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.per_second).min(self.per_second);
        }
        self.updated = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.per_second,
            ))
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded maps are caches: a panic elsewhere leaves them usable.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

#[cfg(test)]
mod tests {
    use belfry_core::PartitionCount;
    use belfry_core::auth::{KeySecret, Role};
    use belfry_store::{EmbeddedOptions, EmbeddedStore};

    use super::*;

    fn store(dir: &tempfile::TempDir) -> SharedStore {
        Arc::new(
            EmbeddedStore::open(EmbeddedOptions {
                data_dir: dir.path().join("data"),
                partitions: PartitionCount::new(1).unwrap(),
                writers: None,
                clock: std::sync::Arc::new(belfry_clock::SystemClock),
            })
            .unwrap(),
        )
    }

    /// A clock that stays put: entries never age, spent budgets never
    /// refill.
    fn frozen_clock() -> Arc<dyn Clock> {
        Arc::new(belfry_core::ManualClock::default())
    }

    async fn stored_key(store: &SharedStore) -> (KeySecret, ApiKey) {
        let secret = KeySecret::generate().unwrap();
        let key = ApiKey::new(
            &secret,
            None,
            Role::Admin,
            belfry_core::Timestamp::from_millis(1),
            None,
        )
        .unwrap();
        assert!(store.put_api_key(key.clone()).await.unwrap());
        (secret, key)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unknown_keys_never_push_a_known_one_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let (secret, key) = stored_key(&store).await;
        let cache = Arc::new(KeyCache::new(
            store.clone(),
            frozen_clock(),
            Duration::from_secs(60),
            1_000_000,
        ));
        assert!(matches!(
            cache.find(&secret.hash()).await,
            Ok(Found::Key(_))
        ));
        // Gone from the store behind the cache's back: only a re-read
        // would notice, so a known key answered below was not re-read.
        assert!(store.delete_api_key(&key.id).await.unwrap().is_some());
        for _ in 0..UNKNOWN_CAPACITY + KNOWN_CAPACITY + 10 {
            let made_up = KeySecret::generate().unwrap();
            assert!(matches!(
                cache.find(&made_up.hash()).await,
                Ok(Found::Missing)
            ));
        }
        assert!(matches!(
            cache.find(&secret.hash()).await,
            Ok(Found::Key(_))
        ));
        assert!(lock(&cache.unknown).len() <= UNKNOWN_CAPACITY);
        // Revoked through this node: refused at once.
        cache.revoked(&key.hash);
        assert!(matches!(
            cache.find(&secret.hash()).await,
            Ok(Found::Missing)
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_spent_budget_refuses_unknown_keys_but_not_known_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let (secret, _) = stored_key(&store).await;
        // A TTL of zero: the known key is re-read every time, outside
        // the budget.
        let cache = Arc::new(KeyCache::new(store, frozen_clock(), Duration::ZERO, 1));
        assert!(matches!(
            cache.find(&secret.hash()).await,
            Ok(Found::Key(_))
        ));
        let made_up = KeySecret::generate().unwrap();
        assert!(matches!(
            cache.find(&made_up.hash()).await,
            Ok(Found::Busy(_))
        ));
        for _ in 0..3 {
            assert!(matches!(
                cache.find(&secret.hash()).await,
                Ok(Found::Key(_))
            ));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_lookups_of_one_key_share_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        // One token: a second read of the same hash would be refused.
        let cache = Arc::new(KeyCache::new(
            store,
            frozen_clock(),
            Duration::from_secs(60),
            1,
        ));
        let made_up = KeySecret::generate().unwrap().hash();
        let lookups: Vec<_> = (0..32)
            .map(|_| {
                let (cache, hash) = (cache.clone(), made_up.clone());
                tokio::spawn(async move { cache.find(&hash).await })
            })
            .collect();
        for lookup in lookups {
            assert!(matches!(lookup.await.unwrap(), Ok(Found::Missing)));
        }
    }

    #[test]
    fn the_budget_allows_a_second_at_once_then_the_rate() {
        let mut budget = Budget::new(10);
        let start = MonoTime::ZERO;
        for _ in 0..10 {
            assert!(budget.take(start).is_ok());
        }
        let wait = budget.take(start).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(100));
        let later = start.plus(Duration::from_millis(100));
        assert!(budget.take(later).is_ok());
        assert!(budget.take(later).is_err());
        // A caller that read the clock earlier gets nothing back.
        assert!(budget.take(start).is_err());
        assert!(budget.take(later).is_err());
        // Idle for long: never more than one second's worth.
        let much_later = later.plus(Duration::from_secs(60));
        for _ in 0..10 {
            assert!(budget.take(much_later).is_ok());
        }
        assert!(budget.take(much_later).is_err());
    }
}
