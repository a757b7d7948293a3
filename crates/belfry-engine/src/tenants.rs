//! A short-lived cache of tenant configs, so a burst of deliveries does not
//! read the same tenant from the store thousands of times.
//!
//! Entries expire after [`TTL`] so that a change made through another node
//! (cluster mode) is seen within seconds; changes through this node
//! invalidate at once.
#![allow(clippy::disallowed_methods)] // clock reads move to the injected Clock

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use belfry_core::{TenantConfig, TenantName};
use belfry_store::{SharedStore, StoreResult};

const TTL: Duration = Duration::from_secs(5);

/// When an entry was read, and what the store said (`None`: no such tenant).
type Entry = (Instant, Option<Arc<TenantConfig>>);

#[derive(Debug, Default)]
pub struct TenantCache {
    entries: Mutex<HashMap<TenantName, Entry>>,
}

impl TenantCache {
    /// The tenant's config, from the cache or the store.
    ///
    /// # Errors
    /// Store failures.
    pub async fn get(
        &self,
        store: &SharedStore,
        name: &TenantName,
    ) -> StoreResult<Option<Arc<TenantConfig>>> {
        if let Some((at, config)) = self.lock().get(name)
            && at.elapsed() < TTL
        {
            return Ok(config.clone());
        }
        let config = store.get_tenant(name).await?.map(Arc::new);
        self.lock()
            .insert(name.clone(), (Instant::now(), config.clone()));
        Ok(config)
    }

    pub fn invalidate(&self, name: &TenantName) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantName, Entry>> {
        // A poisoned cache only means a panic elsewhere mid-insert; the map
        // itself is still valid, so keep using it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}
