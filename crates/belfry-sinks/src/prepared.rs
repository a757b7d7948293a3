//! Each tenant's sink target, prepared once per config (shared by the
//! sinks that parse or resolve a target before sending to it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use belfry_core::{SigningSecrets, TenantConfig, TenantName, Verdict};

use crate::DeliveryResult;
use crate::signing::Signer;

/// A tenant's target, read once.
#[derive(Debug)]
pub(crate) struct Prepared<T, R> {
    /// What it was built from; a changed config rebuilds it.
    source: T,
    signing_source: Option<SigningSecrets>,
    /// Err: why nothing can be sent (a permanent failure).
    route: Result<R, String>,
    /// Err: a stored secret that cannot be decoded (a permanent failure:
    /// an unsigned delivery would be refused by a verifying receiver).
    signer: Result<Option<Signer>, String>,
}

impl<T, R> Prepared<T, R> {
    /// The route and signer, or the permanent failure of a config that
    /// cannot be delivered to (nothing is tried).
    pub(crate) fn usable(&self) -> Result<(&R, Option<&Signer>), DeliveryResult> {
        let unusable =
            |reason: &String| DeliveryResult::failed(Verdict::Permanent, None, reason.clone());
        let route = self.route.as_ref().map_err(unusable)?;
        let signer = self.signer.as_ref().map_err(unusable)?;
        Ok((route, signer.as_ref()))
    }
}

/// The prepared target per tenant.
#[derive(Debug)]
pub(crate) struct PreparedTargets<T, R>(Mutex<HashMap<TenantName, Arc<Prepared<T, R>>>>);

impl<T, R> Default for PreparedTargets<T, R> {
    fn default() -> Self {
        PreparedTargets(Mutex::default())
    }
}

impl<T: Clone + PartialEq, R> PreparedTargets<T, R> {
    /// `tenant`'s prepared `target`, made with `route` unless the cached
    /// one was made from the same target and signing secrets.
    pub(crate) fn get(
        &self,
        tenant: &TenantConfig,
        target: &T,
        route: impl FnOnce(&T) -> Result<R, String>,
    ) -> Arc<Prepared<T, R>> {
        let signing = tenant.signing.as_ref();
        // Poison means a panic mid-insert elsewhere; the map is still valid.
        let mut cache = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match cache.get(&tenant.name) {
            Some(entry) if entry.source == *target && entry.signing_source.as_ref() == signing => {
                Arc::clone(entry)
            }
            _ => {
                let entry = Arc::new(Prepared {
                    source: target.clone(),
                    signing_source: signing.cloned(),
                    route: route(target),
                    signer: signing
                        .map(Signer::new)
                        .transpose()
                        .map_err(|e| e.to_string()),
                });
                cache.insert(tenant.name.clone(), Arc::clone(&entry));
                entry
            }
        }
    }
}
