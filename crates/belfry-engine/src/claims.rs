//! Events with a delivery in progress, from the moment a fired entry is
//! taken up until its outcome is recorded in the store.
//!
//! The timer window is a hint and may hold an entry twice in time: a
//! partition's load can page in an event committed just before, and the
//! wake-up sent for the same commit can arrive after the loaded copy was
//! already fired. The dispatcher re-reads the event before delivering, but
//! until the recorder has stored the first outcome the event still looks
//! due. A claim closes that gap: a second copy of a claimed event is
//! dropped (the first one's outcome decides what happens next).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use belfry_core::EventKey;

/// The set of claimed events.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    keys: Mutex<HashSet<EventKey>>,
}

impl Claims {
    fn lock(&self) -> MutexGuard<'_, HashSet<EventKey>> {
        // Poison only means a panic elsewhere; a set of keys stays valid.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `key`; `None` if a delivery of it is already in progress.
    pub(crate) fn claim(self: &Arc<Self>, key: &EventKey) -> Option<Claim> {
        self.lock().insert(key.clone()).then(|| Claim {
            claims: self.clone(),
            key: Some(key.clone()),
        })
    }

    /// Releases the claims of outcomes that were just recorded (or dropped).
    pub(crate) fn release<'a>(&self, keys: impl IntoIterator<Item = &'a EventKey>) {
        let mut set = self.lock();
        for key in keys {
            set.remove(key);
        }
    }
}

/// A claim on one event; released on drop unless handed to the recorder.
#[derive(Debug)]
pub(crate) struct Claim {
    claims: Arc<Claims>,
    key: Option<EventKey>,
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
    fn a_claimed_key_cannot_be_claimed_again_until_released() {
        let claims = Arc::new(Claims::default());
        let key = EventKey::new(TenantName::new("t").unwrap(), EventId::new("e").unwrap());
        let first = claims.claim(&key).unwrap();
        assert!(claims.claim(&key).is_none());
        drop(first);
        let second = claims.claim(&key).unwrap();
        second.hand_over();
        assert!(claims.claim(&key).is_none());
        claims.release([&key]);
        assert!(claims.claim(&key).is_some());
    }
}
