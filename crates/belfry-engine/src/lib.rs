//! The per-partition engine: it keeps a bounded near-future window of each
//! partition in memory, fires every event at its instant (never before),
//! delivers with bounded concurrency, and records outcomes in batches.
//!
//! # Layout
//! - [`options`]: [`EngineOptions`], the knobs and their defaults;
//! - `partition`: one worker per partition: loader + [`belfry_core::TimerWindow`];
//! - `dispatch`: concurrency limits (global and per tenant), the fire-time
//!   check, the delivery itself;
//! - `recorder`: batches attempt outcomes into the store;
//! - `purge`: the background retention sweep.
//!
//! Components are built `Options → Engine → cheap-clone EngineHandle`.

use std::sync::Arc;

use belfry_core::{Clock, EventKey, EventRecord, Timestamp};
use belfry_sinks::{DeliveryResult, Sinks};
use belfry_store::{Applied, KeyedCommand, SharedStore, StoreResult};

pub mod options;

pub use options::EngineOptions;

/// A running engine. Dropping it without [`Engine::shutdown`] aborts work.
#[derive(Debug)]
pub struct Engine {
    handle: EngineHandle,
}

/// What the API edge uses: apply commands (store, then wake the owning
/// partition), dry-run deliveries, read the clock.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: SharedStore,
    sinks: Sinks,
    clock: Arc<dyn Clock>,
    options: EngineOptions,
}

impl Engine {
    /// Starts every partition worker and background service.
    pub fn start(
        options: EngineOptions,
        store: SharedStore,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Engine {
        Engine {
            handle: EngineHandle {
                inner: Arc::new(Inner {
                    store,
                    sinks,
                    clock,
                    options,
                }),
            },
        }
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Stops firing, lets in-flight deliveries finish (up to the configured
    /// grace), records their outcomes, and returns.
    pub async fn shutdown(self) {}
}

impl EngineHandle {
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub fn options(&self) -> &EngineOptions {
        &self.inner.options
    }

    /// Applies client commands durably (the store fsyncs before this
    /// returns) and wakes the owning partitions for every timer effect.
    ///
    /// # Errors
    /// Store failures; nothing is acknowledged then.
    pub async fn apply(&self, commands: Vec<KeyedCommand>) -> StoreResult<Vec<Applied>> {
        let _ = commands;
        Ok(Vec::new())
    }

    /// Delivers `key` to its tenant now, without changing its stored state
    /// (BigBen's dry run). `Ok(None)` when the event or its tenant is unknown.
    ///
    /// # Errors
    /// Store failures.
    pub async fn dry_run(&self, key: &EventKey) -> StoreResult<Option<(EventRecord, DeliveryResult)>> {
        let _ = key;
        Ok(None)
    }

    /// Forget any cached config of `tenant` (it was registered, replaced or
    /// deleted).
    pub fn tenant_changed(&self, tenant: &belfry_core::TenantName) {
        let _ = tenant;
    }
}
