//! Events with a delivery in progress, from the moment a fired entry is
//! taken up until its outcome is recorded in the store (or dropped).
//!
//! The timer window is a hint and may hold an entry twice in time: a
//! partition's load can page in an event committed just before, and the
//! wake-up sent for the same commit can arrive after the loaded copy was
//! already fired. The dispatcher re-reads the event before delivering, but
//! until the recorder has stored the first outcome the event still looks
//! due. A claim closes that gap: a second copy of a claimed *version* is
//! dropped (the first one's outcome decides what happens next). A new
//! version (the event was moved, or cancelled and re-created, while its
//! previous version was being delivered) is a different claim and fires at
//! its own instant.
//!
//! Claims are also what "every outcome is recorded" waits on: shutdown and
//! a partition hand-over wait until the claims of the partitions concerned
//! are gone, which happens only after their outcomes were stored.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use belfry_core::{EventKey, EventVersion, PartitionId};
use tokio::sync::Notify;

/// What a claim is on: one version of one event.
pub(crate) type ClaimKey = (EventKey, EventVersion);

#[derive(Debug, Default)]
struct ClaimSet {
    claimed: HashMap<ClaimKey, PartitionId>,
    per_partition: HashMap<PartitionId, usize>,
}

/// The set of claimed event versions.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    set: Mutex<ClaimSet>,
    /// Signalled whenever a claim goes.
    released: Notify,
}

impl Claims {
    fn lock(&self) -> MutexGuard<'_, ClaimSet> {
        // Poison only means a panic elsewhere; every update below keeps the
        // map and the counts consistent before anything can panic.
        self.set.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `key` at `version` for `partition`; `None` if a delivery of
    /// that version is already in progress.
    pub(crate) fn claim(
        self: &Arc<Self>,
        partition: PartitionId,
        key: &EventKey,
        version: EventVersion,
    ) -> Option<Claim> {
        let claim_key = (key.clone(), version);
        let mut set = self.lock();
        if set.claimed.contains_key(&claim_key) {
            return None;
        }
        set.claimed.insert(claim_key.clone(), partition);
        *set.per_partition.entry(partition).or_default() += 1;
        Some(Claim {
            claims: self.clone(),
            key: Some(claim_key),
        })
    }

    /// Releases the claims of outcomes that were just recorded (or dropped).
    pub(crate) fn release<'a>(&self, keys: impl IntoIterator<Item = &'a ClaimKey>) {
        let mut set = self.lock();
        for key in keys {
            if let Some(partition) = set.claimed.remove(key) {
                if let Some(count) = set.per_partition.get_mut(&partition) {
                    *count -= 1;
                    if *count == 0 {
                        set.per_partition.remove(&partition);
                    }
                }
            }
        }
        drop(set);
        self.released.notify_waiters();
    }

    /// Claims held for `partitions` (`None`: all partitions).
    pub(crate) fn held(&self, partitions: Option<&[PartitionId]>) -> usize {
        let set = self.lock();
        match partitions {
            None => set.claimed.len(),
            Some(ids) => ids
                .iter()
                .map(|p| set.per_partition.get(p).copied().unwrap_or(0))
                .sum(),
        }
    }

    /// Resolves once no claim is held for `partitions` (`None`: any).
    pub(crate) async fn wait_released(&self, partitions: Option<&[PartitionId]>) {
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.held(partitions) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A claim on one event version; released on drop unless handed to the
/// recorder.
#[derive(Debug)]
pub(crate) struct Claim {
    claims: Arc<Claims>,
    key: Option<ClaimKey>,
}

impl Claim {
    /// The outcome goes to the recorder, which releases the claim once the
    /// outcome is stored.
    pub(crate) fn hand_over(mut self) {
        self.key = None;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.claims.release([&key]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::{EventId, TenantName};

    #[test]
    fn a_claimed_version_cannot_be_claimed_again_until_released() {
        let claims = Arc::new(Claims::default());
        let key = EventKey::new(TenantName::new("t").unwrap(), EventId::new("e").unwrap());
        let (v1, v2) = (EventVersion::generate(), EventVersion::generate());
        let p = PartitionId(3);
        let first = claims.claim(p, &key, v1.clone()).unwrap();
        assert!(claims.claim(p, &key, v1.clone()).is_none());
        // A new version of the same event (moved during the delivery of
        // the first) is not blocked by the first one's claim.
        let other_version = claims.claim(p, &key, v2).unwrap();
        assert_eq!(claims.held(Some(&[p])), 2);
        drop(other_version);
        drop(first);
        let second = claims.claim(p, &key, v1.clone()).unwrap();
        second.hand_over();
        assert!(claims.claim(p, &key, v1.clone()).is_none());
        assert_eq!(claims.held(Some(&[p])), 1);
        assert_eq!(claims.held(Some(&[PartitionId(4)])), 0);
        claims.release([&(key.clone(), v1.clone())]);
        assert_eq!(claims.held(None), 0);
        assert!(claims.claim(p, &key, v1).is_some());
    }
}
