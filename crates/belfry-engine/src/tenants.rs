//! Tenants: their configs and pause states, their writes (store, then
//! cache, then the owned partitions) and a short-lived cache, so a burst of
//! deliveries does not read the same tenant from the store thousands of
//! times.
//!
//! Entries expire after [`TTL`] so that a change made through another node
//! (cluster mode) is seen within seconds; writes through this node refresh
//! the cache at once. A pause or resume through this node also reaches
//! every partition it owns at once (`Input::Paused`, `Input::Resumed`); the
//! owners elsewhere see it within [`TTL`] (a pause: their next delivery of
//! the tenant is held) or within [`TTL`] plus the partition core's
//! `hold_recheck` (a resume: a held lane's recheck finds it). A pause or
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

/// When an entry was read, and what the store said (`None`: no such tenant).
type Entry = (MonoTime, Option<Tenant>);

/// The node's cache of tenants (see the module documentation).
#[derive(Debug)]
pub(crate) struct TenantCache {
    store: SharedStore,
    entries: Mutex<HashMap<TenantName, Entry>>,
    clock: Arc<dyn Clock>,
}

impl TenantCache {
    pub(crate) fn new(store: SharedStore, clock: Arc<dyn Clock>) -> Self {
        TenantCache {
            store,
            entries: Mutex::default(),
            clock,
        }
    }

    /// The tenant, from the cache or the store.
    pub(crate) async fn get(&self, name: &TenantName) -> StoreResult<Option<Tenant>> {
        if let Some((at, tenant)) = self.lock().get(name)
            && self.clock.monotonic().since(*at) < TTL
        {
            return Ok(tenant.clone());
        }
        let tenant = match self.store.get_tenant(name).await? {
            Some(config) => Some(Tenant {
                config: Arc::new(config),
                pause: self.store.get_tenant_pause(name).await?,
            }),
            None => None,
        };
        self.lock()
            .insert(name.clone(), (self.clock.monotonic(), tenant.clone()));
        Ok(tenant)
    }

    /// The tenant as cached, if read less than [`TTL`] ago (`Some(None)`:
    /// no such tenant); `None` when the cache cannot tell without a read.
    pub(crate) fn cached(&self, name: &TenantName) -> Option<Option<Tenant>> {
        let entries = self.lock();
        let (at, tenant) = entries.get(name)?;
        (self.clock.monotonic().since(*at) < TTL).then(|| tenant.clone())
    }

    fn forget(&self, name: &TenantName) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantName, Entry>> {
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
