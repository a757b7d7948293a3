//! Tenants: their configs and pause states, their writes (store, then
//! cache, then the owned partitions) and a short-lived cache, so a burst of
//! deliveries does not read the same tenant from the store thousands of
//! times.
//!
//! Entries expire [`TTL`] after their read began, so that a change made
//! through another node (cluster mode) is seen within [`TTL`] of being
//! stored; writes through this node refresh the cache at once, and a read
//! that began before such a write is not cached (it may have seen the old
//! state). A pause or resume through this node also reaches
//! every partition it owns at once (`Input::Paused`, `Input::Resumed`); the
//! owners elsewhere hear of it from the store's announcement of the write
//! ([`Tenants::changed_elsewhere`], a cluster), and should that be lost,
//! within [`TTL`] (a pause: their next delivery of the tenant is held) or
//! within [`TTL`] plus the partition core's `hold_recheck` (a resume: a
//! held lane's recheck finds it). A pause or
//! resume that changed the stored state raises its notice
//! (`crate::notices`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_core::fire::Input;
use belfry_core::notice::Notice;
use belfry_core::{Clock, MonoTime, TenantConfig, TenantName, TenantPause};
use belfry_store::{SharedStore, StoreResult};

use crate::Shared;

const TTL: Duration = Duration::from_secs(5);

/// A registered tenant as deliveries read it.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub config: Arc<TenantConfig>,
    /// `None`: never paused since it was registered.
    pub pause: Option<TenantPause>,
}

/// When the read of an entry began, and what the store said (`None`: no
/// such tenant).
type Entry = (MonoTime, Option<Tenant>);

/// The cached tenants, and how many times one was forgotten: a read
/// caches its answer only if nothing was forgotten while it ran.
#[derive(Debug, Default)]
struct Entries {
    tenants: HashMap<TenantName, Entry>,
    forgotten: u64,
}

/// The node's cache of tenants (see the module documentation).
#[derive(Debug)]
pub(crate) struct TenantCache {
    store: SharedStore,
    entries: Mutex<Entries>,
    clock: Arc<dyn Clock>,
    /// Held by a pause, a resume or a change heard from another node from
    /// its read of the state to its broadcast: the partitions get them in
    /// the order the store took them. Without it a 410's pause stored
    /// before a resume could broadcast after it, leaving the lanes held
    /// against a resumed tenant until their recheck.
    pause_changes: tokio::sync::Mutex<()>,
}

impl TenantCache {
    pub(crate) fn new(store: SharedStore, clock: Arc<dyn Clock>) -> Self {
        TenantCache {
            store,
            entries: Mutex::default(),
            clock,
            pause_changes: tokio::sync::Mutex::new(()),
        }
    }

    /// The tenant, from the cache or the store.
    pub(crate) async fn get(&self, name: &TenantName) -> StoreResult<Option<Tenant>> {
        // Stamped when the read begins: what it answers is at least that
        // fresh, however long the read takes.
        let (began, forgotten) = {
            let entries = self.lock();
            let now = self.clock.monotonic();
            if let Some((at, tenant)) = entries.tenants.get(name)
                && now.since(*at) < TTL
            {
                return Ok(tenant.clone());
            }
            (now, entries.forgotten)
        };
        let tenant = match self.store.get_tenant(name).await? {
            Some(config) => Some(Tenant {
                config: Arc::new(config),
                pause: self.store.get_tenant_pause(name).await?,
            }),
            None => None,
        };
        let mut entries = self.lock();
        // A write through this node (a pause) since the read began may be
        // one the read missed: caching its answer would hide that write
        // from this node's deliveries for a whole TTL.
        if entries.forgotten == forgotten {
            entries
                .tenants
                .insert(name.clone(), (began, tenant.clone()));
        }
        Ok(tenant)
    }

    /// The tenant as cached, if read less than [`TTL`] ago (`Some(None)`:
    /// no such tenant); `None` when the cache cannot tell without a read.
    pub(crate) fn cached(&self, name: &TenantName) -> Option<Option<Tenant>> {
        let entries = self.lock();
        let (at, tenant) = entries.tenants.get(name)?;
        (self.clock.monotonic().since(*at) < TTL).then(|| tenant.clone())
    }

    fn forget(&self, name: &TenantName) {
        let mut entries = self.lock();
        entries.tenants.remove(name);
        entries.forgotten += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A poisoned cache only means a panic elsewhere mid-insert; the map
        // itself is still valid, so keep using it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The tenants sub-handle ([`crate::EngineHandle::tenants`]).
#[derive(Debug, Clone, Copy)]
pub struct Tenants<'a> {
    pub(crate) shared: &'a Arc<Shared>,
}

impl Tenants<'_> {
    /// The tenant's config, from the cache or the store.
    ///
    /// # Errors
    /// Store failures.
    pub async fn get(&self, name: &TenantName) -> StoreResult<Option<Arc<TenantConfig>>> {
        Ok(self.cache().get(name).await?.map(|tenant| tenant.config))
    }

    /// Registers or replaces a tenant (its pause state stays as it is);
    /// this node's deliveries use it at once.
    ///
    /// # Errors
    /// Store failures (the cache is refreshed all the same: the write may
    /// have been made).
    pub async fn put(&self, config: TenantConfig) -> StoreResult<()> {
        let name = config.name.clone();
        let circuits = crate::circuits::Circuits {
            shared: self.shared,
        };
        circuits.reconfigured(&config);
        let stored = self.store().put_tenant(config).await;
        self.forget(&name);
        stored
    }

    /// Removes a tenant and its pause state; `false` if there was none.
    ///
    /// # Errors
    /// Store failures (the cache is refreshed all the same).
    pub async fn delete(&self, name: &TenantName) -> StoreResult<bool> {
        let deleted = self.store().delete_tenant(name).await;
        self.forget(name);
        crate::circuits::Circuits {
            shared: self.shared,
        }
        .forget(name);
        deleted
    }

    /// Another node changed the tenant (its store announced it): what this
    /// node cached of it goes, and its pause state as stored now reaches
    /// the partitions owned here at once, instead of when the cache
    /// expires (a pause) or a held lane's recheck comes (a resume). A
    /// store failure leaves that to the cache's expiry and the recheck.
    pub async fn changed_elsewhere(&self, name: &TenantName) {
        let _order = self.cache().pause_changes.lock().await;
        self.forget(name);
        let paused = match self.pause_state(name).await {
            Ok(pause) => pause.is_some_and(|pause| pause.paused),
            Err(error) => {
                tracing::warn!(tenant = %name, %error, "reading a tenant another node changed failed");
                return;
            }
        };
        let shared = self.shared;
        let now = shared.env.clock.now();
        if paused {
            shared.owned.broadcast(|| Input::Paused(name.clone()), now);
        } else {
            shared.owned.broadcast(|| Input::Resumed(name.clone()), now);
        }
    }

    /// Forgets the cached tenant `name` (changed behind this node's back,
    /// e.g. by a test writing the store directly).
    pub fn forget(&self, name: &TenantName) {
        self.cache().forget(name);
    }

    /// Whether the tenant is paused, as this node's deliveries see it (the
    /// cache: a pause through another node shows within its TTL).
    ///
    /// # Errors
    /// Store failures.
    pub async fn is_paused(&self, name: &TenantName) -> StoreResult<bool> {
        let tenant = self.cache().get(name).await?;
        Ok(tenant.is_some_and(|tenant| tenant.pause.is_some_and(|pause| pause.paused)))
    }

    /// The tenant's pause state as stored; `None`: never paused (or no
    /// such tenant).
    ///
    /// # Errors
    /// Store failures.
    pub async fn pause_state(&self, name: &TenantName) -> StoreResult<Option<TenantPause>> {
        self.store().get_tenant_pause(name).await
    }

    /// Pauses the tenant's deliveries (and its pull workers' claims):
    /// its due events stay pending, in order, until [`Tenants::resume`].
    /// Idempotent: pausing a paused tenant keeps when it was paused (a new
    /// `reason` replaces the old one). Answers the state after it; `None`:
    /// no such tenant.
    ///
    /// # Errors
    /// Store failures (then the pause may or may not have been stored).
    pub async fn pause(
        &self,
        name: &TenantName,
        reason: Option<String>,
    ) -> StoreResult<Option<TenantPause>> {
        let _order = self.cache().pause_changes.lock().await;
        let current = self.pause_state(name).await?;
        let paused = TenantPause::paused(current.as_ref(), reason, self.shared.env.clock.now());
        let unchanged = current.as_ref() == Some(&paused);
        let stored = unchanged || self.store().put_tenant_pause(name, paused.clone()).await?;
        self.forget(name);
        if !stored {
            return Ok(None);
        }
        let shared = self.shared;
        shared
            .owned
            .broadcast(|| Input::Paused(name.clone()), shared.env.clock.now());
        // A pause's notice names its start, which pausing again keeps: a
        // repeat (or a new reason) raises nothing new.
        if !current.as_ref().is_some_and(|current| current.paused) {
            let notice = Notice::Paused {
                reason: paused.reason.clone(),
                since: paused.since,
            };
            crate::notices::raise(shared, name, notice);
        }
        Ok(Some(paused))
    }

    /// Resumes the tenant's deliveries: what its pause held back goes out
    /// in due order, late by the pause (never expired as missed for it).
    /// Idempotent: resuming a tenant that is not paused changes nothing.
    /// Answers the state after it; `None`: never paused, or no such
    /// tenant.
    ///
    /// # Errors
    /// Store failures (then the resume may or may not have been stored).
    pub async fn resume(&self, name: &TenantName) -> StoreResult<Option<TenantPause>> {
        let _order = self.cache().pause_changes.lock().await;
        let current = self.pause_state(name).await?;
        let now = self.shared.env.clock.now();
        let state = match TenantPause::resumed(current.as_ref(), now) {
            Some(resumed) => {
                let stored = self.store().put_tenant_pause(name, resumed.clone()).await?;
                if stored {
                    let notice = Notice::Resumed {
                        since: resumed.since,
                    };
                    crate::notices::raise(self.shared, name, notice);
                }
                stored.then_some(resumed)
            }
            None => current,
        };
        self.forget(name);
        // Also when nothing was paused here: a lane still held after a
        // resume through another node stops waiting for its recheck.
        let shared = self.shared;
        shared
            .owned
            .broadcast(|| Input::Resumed(name.clone()), shared.env.clock.now());
        Ok(state)
    }

    fn cache(&self) -> &TenantCache {
        &self.shared.tenants
    }

    fn store(&self) -> &SharedStore {
        &self.shared.env.store
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use belfry_core::tenant::HttpTarget;
    use belfry_core::{ManualClock, PartitionCount, SinkConfig, Timestamp};
    use belfry_store::interpose::{Fault, Interposed, Interposer, StoreCall};
    use belfry_store::{EmbeddedOptions, EmbeddedStore};

    use super::*;

    /// How long the slow read's answer is held back (real time): long
    /// enough for the test to store a pause meanwhile.
    const SLOW_ANSWER: Duration = Duration::from_secs(1);

    /// Holds back the answer of the next read of a pause state, once it
    /// read the store: a slow read, overtaken by a pause.
    #[derive(Debug, Default)]
    struct SlowPauseRead {
        armed: AtomicBool,
        read: AtomicBool,
    }

    impl Interposer for SlowPauseRead {
        fn before(&self, call: StoreCall<'_>) -> Fault {
            if matches!(call, StoreCall::GetTenantPause) && self.armed.swap(false, Ordering::SeqCst)
            {
                self.read.store(true, Ordering::SeqCst);
                return Fault::CommitThenStall(SLOW_ANSWER);
            }
            Fault::Pass
        }
    }

    struct Fixture {
        cache: Arc<TenantCache>,
        store: SharedStore,
        clock: Arc<ManualClock>,
        slow: Arc<SlowPauseRead>,
        name: TenantName,
        _dir: tempfile::TempDir,
    }

    async fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let embedded = EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.path().to_path_buf(),
            partitions: PartitionCount::new(1).unwrap(),
            writers: None,
            clock: clock.clone(),
        })
        .unwrap();
        let slow = Arc::new(SlowPauseRead::default());
        let store: SharedStore = Arc::new(Interposed::new(Arc::new(embedded), slow.clone()));
        let name = TenantName::new("acme").unwrap();
        store
            .put_tenant(TenantConfig {
                name: name.clone(),
                sink: SinkConfig::Http(HttpTarget {
                    url: "http://127.0.0.1:9/hook".to_string(),
                    headers: Default::default(),
                    timeout_ms: None,
                    delivery: Default::default(),
                }),
                signing: None,
                notify: None,
            })
            .await
            .unwrap();
        Fixture {
            cache: Arc::new(TenantCache::new(store.clone(), clock.clone())),
            store,
            clock,
            slow,
            name,
            _dir: dir,
        }
    }

    fn is_paused(tenant: &Option<Tenant>) -> bool {
        tenant
            .as_ref()
            .and_then(|tenant| tenant.pause.as_ref())
            .is_some_and(|pause| pause.paused)
    }

    impl Fixture {
        /// Starts a read whose answer is held back, and waits until it has
        /// read the store (a current-thread runtime: the read runs up to
        /// its held answer before this task goes on).
        async fn start_slow_read(&self) -> tokio::task::JoinHandle<StoreResult<Option<Tenant>>> {
            self.slow.armed.store(true, Ordering::SeqCst);
            let cache = self.cache.clone();
            let name = self.name.clone();
            let reading = tokio::spawn(async move { cache.get(&name).await });
            while !self.slow.read.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
            reading
        }

        async fn pause(&self) {
            let paused = TenantPause::paused(None, None, self.clock.now());
            assert!(
                self.store
                    .put_tenant_pause(&self.name, paused)
                    .await
                    .unwrap()
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_read_overtaken_by_a_pause_through_this_node_is_not_cached() {
        let fixture = fixture().await;
        let reading = fixture.start_slow_read().await;
        // The pause as `Tenants::pause` makes it: stored, then forgotten.
        fixture.pause().await;
        fixture.cache.forget(&fixture.name);
        let answered = reading.await.unwrap().unwrap();
        assert!(!is_paused(&answered), "the read began before the pause");

        let next = fixture.cache.get(&fixture.name).await.unwrap();
        assert!(
            is_paused(&next),
            "this node took the pause but its deliveries would not see it"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_pause_through_another_node_is_seen_within_the_ttl_of_being_stored() {
        let fixture = fixture().await;
        let reading = fixture.start_slow_read().await;
        // Another node pauses the tenant just after the read; the read
        // answers 3 s later.
        fixture.pause().await;
        fixture.clock.advance(Duration::from_secs(3));
        let answered = reading.await.unwrap().unwrap();
        assert!(!is_paused(&answered), "the read began before the pause");

        fixture
            .clock
            .advance(TTL - Duration::from_secs(3) + Duration::from_millis(1));
        let next = fixture.cache.get(&fixture.name).await.unwrap();
        assert!(
            is_paused(&next),
            "a pause stored more than the TTL ago is still not seen"
        );
    }
}
