//! The due order shared by the store's due index and the partition core.
//!
//! Entries are ordered by `(due, key)`: ties fire in key order,
//! deterministically. Loaders page the store with an exclusive cursor in
//! this order. The bounded in-memory window that holds them is
//! [`crate::fire::FairWindow`], driven by [`crate::fire::PartitionCore`].

use serde::{Deserialize, Serialize};

use crate::ids::EventKey;
use crate::time::Timestamp;

/// A position in the due order `(due, key)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DueCursor {
    pub due: Timestamp,
    pub key: EventKey,
}
