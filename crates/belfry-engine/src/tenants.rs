//! Tenant configs: their writes (store, then cache) and a short-lived
//! cache, so a burst of deliveries does not read the same tenant from the
//! store thousands of times.
//!
//! Entries expire after [`TTL`] so that a change made through another node
//! (cluster mode) is seen within seconds; writes through this node
//! ([`Tenants::put`], [`Tenants::delete`]) refresh the cache at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_core::{Clock, MonoTime, TenantConfig, TenantName};
use belfry_store::{SharedStore, StoreResult};

const TTL: Duration = Duration::from_secs(5);

/// When an entry was read, and what the store said (`None`: no such tenant).
type Entry = (MonoTime, Option<Arc<TenantConfig>>);

/// The node's tenant configs (see the module documentation).
#[derive(Debug)]
pub struct Tenants {
    store: SharedStore,
    entries: Mutex<HashMap<TenantName, Entry>>,
    clock: Arc<dyn Clock>,
}

impl Tenants {
    pub(crate) fn new(store: SharedStore, clock: Arc<dyn Clock>) -> Self {
        Tenants {
            store,
            entries: Mutex::default(),
            clock,
        }
    }

    /// The tenant's config, from the cache or the store.
    ///
    /// # Errors
    /// Store failures.
    pub async fn get(&self, name: &TenantName) -> StoreResult<Option<Arc<TenantConfig>>> {
        if let Some((at, config)) = self.lock().get(name)
            && self.clock.monotonic().since(*at) < TTL
        {
            return Ok(config.clone());
        }
        let config = self.store.get_tenant(name).await?.map(Arc::new);
        self.lock()
            .insert(name.clone(), (self.clock.monotonic(), config.clone()));
        Ok(config)
    }

    /// Registers or replaces a tenant; this node's deliveries use it at
    /// once.
    ///
    /// # Errors
    /// Store failures (the cache is refreshed all the same: the write may
    /// have been made).
    pub async fn put(&self, config: TenantConfig) -> StoreResult<()> {
        let name = config.name.clone();
        let stored = self.store.put_tenant(config).await;
        self.forget(&name);
        stored
    }

    /// Removes a tenant; `false` if there was none.
    ///
    /// # Errors
    /// Store failures (the cache is refreshed all the same).
    pub async fn delete(&self, name: &TenantName) -> StoreResult<bool> {
        let deleted = self.store.delete_tenant(name).await;
        self.forget(name);
        deleted
    }

    /// Forgets the cached config of `name` (changed behind this node's
    /// back, e.g. by a test writing the store directly).
    pub fn forget(&self, name: &TenantName) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantName, Entry>> {
        // A poisoned cache only means a panic elsewhere mid-insert; the map
        // itself is still valid, so keep using it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}
