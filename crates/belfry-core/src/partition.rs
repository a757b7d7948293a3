//! Partitioning of `(tenant, id)` onto a fixed number of partitions.
//!
//! The hash is FNV-1a 64 over a length-prefixed encoding of the key. It is
//! written out here, not taken from `std`, because the mapping is persisted:
//! it must never change between builds, platforms or Rust versions.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::EventKey;

/// One partition: the unit of ownership and of firing.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PartitionId(pub u16);

impl fmt::Debug for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How many partitions a store has; fixed when the store is created.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PartitionCount(u16);

impl PartitionCount {
    pub const DEFAULT: PartitionCount = PartitionCount(64);

    /// `None` for zero.
    pub fn new(count: u16) -> Option<Self> {
        (count > 0).then_some(PartitionCount(count))
    }

    pub fn get(self) -> u16 {
        self.0
    }

    /// Every partition id, in order.
    pub fn all(self) -> impl Iterator<Item = PartitionId> {
        (0..self.0).map(PartitionId)
    }

    /// The partition that owns `key`.
    pub fn partition_of(self, key: &EventKey) -> PartitionId {
        let hash = fnv1a(&[key.tenant.as_str().as_bytes(), key.id.as_str().as_bytes()]);
        PartitionId((hash % u64::from(self.0)) as u16)
    }
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for part in parts {
        // Length prefix: ("ab","c") and ("a","bc") must not collide by construction.
        for byte in (part.len() as u32).to_be_bytes().iter().chain(part.iter()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    hash
}

/// Partitions as sorted ranges, `0-5, 9, 12-13` (`none` when empty): one
/// readable log line for a node's whole share instead of a line each.
pub fn partition_ranges(ids: impl IntoIterator<Item = PartitionId>) -> String {
    let mut ids: Vec<u16> = ids.into_iter().map(|p| p.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut ranges: Vec<String> = Vec::new();
    let mut rest = ids.into_iter().peekable();
    while let Some(first) = rest.next() {
        let mut last = first;
        while rest
            .next_if(|&next| Some(next) == last.checked_add(1))
            .is_some()
        {
            last += 1;
        }
        ranges.push(if first == last {
            first.to_string()
        } else {
            format!("{first}-{last}")
        });
    }
    if ranges.is_empty() {
        "none".to_string()
    } else {
        ranges.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ranges_join_runs() {
        let ids = |v: &[u16]| v.iter().map(|&p| PartitionId(p)).collect::<Vec<_>>();
        assert_eq!(partition_ranges(ids(&[])), "none");
        assert_eq!(partition_ranges(ids(&[7])), "7");
        assert_eq!(partition_ranges((0..64).map(PartitionId)), "0-63");
        assert_eq!(
            partition_ranges(ids(&[13, 0, 1, 2, 9, 12, 2, 5, 4, 3])),
            "0-5, 9, 12-13"
        );
        assert_eq!(
            partition_ranges(ids(&[u16::MAX - 1, u16::MAX])),
            "65534-65535"
        );
    }
    use crate::ids::{EventId, TenantName};

    fn key(t: &str, i: &str) -> EventKey {
        EventKey::new(TenantName::new(t).unwrap(), EventId::new(i).unwrap())
    }

    #[test]
    fn mapping_is_stable() {
        // Persisted data depends on these exact values (checked against an
        // independent implementation): changing them is a breaking storage
        // change.
        assert_eq!(fnv1a(&[b"t", b"e1"]), 0x5709_a257_17cd_b6be);
        let count = PartitionCount::DEFAULT;
        assert_eq!(count.partition_of(&key("t", "e1")), PartitionId(62));
        assert_eq!(
            count.partition_of(&key("TenantB/ProgramB/EnvC", "order-42")),
            PartitionId(37)
        );
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }

    #[test]
    fn spreads_keys_evenly() {
        let count = PartitionCount::new(16).unwrap();
        let mut buckets = [0u32; 16];
        for i in 0..16_000 {
            buckets[count.partition_of(&key("tenant", &format!("event-{i}"))).0 as usize] += 1;
        }
        for b in buckets {
            assert!((700..1300).contains(&b), "uneven spread: {buckets:?}");
        }
    }
}
