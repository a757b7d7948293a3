//! How the leader spreads partitions over live nodes.
//!
//! Pure and deterministic: the same inputs give the same map on every
//! leader. Each node gets `⌊P/N⌋` or `⌈P/N⌉` partitions; a partition keeps its
//! current owner whenever that owner is live and not over its share, so a
//! join or leave moves only as many partitions as needed.

use std::collections::BTreeMap;

use crate::partition::PartitionId;

/// The owner of every partition, given the live nodes (any order) and the
/// current owners. Returns one entry per partition `0..partition_count`;
/// empty if no node is live.
pub fn balance<'a>(
    partition_count: u16,
    live_nodes: &[&'a str],
    current: &BTreeMap<PartitionId, &str>,
) -> Vec<(PartitionId, &'a str)> {
    let mut nodes: Vec<&'a str> = live_nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    if nodes.is_empty() {
        return Vec::new();
    }
    let total = usize::from(partition_count);
    let base = total / nodes.len();
    let extra = total % nodes.len();
    // The first `extra` nodes (in id order) may hold one more.
    let quota: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, base + usize::from(i < extra)))
        .collect();
    let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (*n, 0)).collect();
    let mut owners: Vec<Option<&'a str>> = vec![None; total];

    // Keep current owners up to their quota.
    for p in 0..partition_count {
        let Some(owner) = current.get(&PartitionId(p)) else {
            continue;
        };
        let Some(node) = nodes.iter().find(|n| **n == *owner) else {
            continue;
        };
        let held = load.get(*node).copied().unwrap_or(0);
        if held < quota[*node] {
            owners[usize::from(p)] = Some(node);
            *load.entry(node).or_default() += 1;
        }
    }
    // Hand the rest to the least-loaded node with room (ties by id).
    for slot in owners.iter_mut().filter(|o| o.is_none()) {
        let pick = nodes
            .iter()
            .filter(|n| load[**n] < quota[**n])
            .min_by_key(|n| (load[**n], **n))
            .copied()
            .unwrap_or(nodes[0]);
        *slot = Some(pick);
        *load.entry(pick).or_default() += 1;
    }
    owners
        .into_iter()
        .enumerate()
        .filter_map(|(p, owner)| Some((PartitionId(p as u16), owner?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(map: &[(PartitionId, &str)]) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (_, n) in map {
            *counts.entry(n.to_string()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn spreads_evenly() {
        let map = balance(64, &["b", "a", "c"], &BTreeMap::new());
        assert_eq!(map.len(), 64);
        let c = counts(&map);
        assert_eq!(c.values().copied().collect::<Vec<_>>(), [22, 21, 21]);
    }

    #[test]
    fn a_join_moves_only_what_it_must() {
        let before = balance(64, &["a", "b"], &BTreeMap::new());
        let current: BTreeMap<PartitionId, &str> = before.iter().copied().collect();
        let after = balance(64, &["a", "b", "c"], &current);
        let moved = before
            .iter()
            .zip(&after)
            .filter(|(x, y)| x.1 != y.1)
            .count();
        assert_eq!(moved, 21, "only the new node's share moves");
        assert!(after.iter().filter(|(_, n)| *n == "c").count() == 21);
    }

    #[test]
    fn a_dead_nodes_partitions_go_to_the_living() {
        let before = balance(8, &["a", "b", "c"], &BTreeMap::new());
        let current: BTreeMap<PartitionId, &str> = before.iter().copied().collect();
        let after = balance(8, &["a", "c"], &current);
        assert!(after.iter().all(|(_, n)| *n != "b"));
        for ((p, old), (_, new)) in before.iter().zip(&after) {
            if *old != "b" {
                assert_eq!(old, new, "partition {p:?} moved needlessly");
            }
        }
        assert_eq!(counts(&after).values().copied().collect::<Vec<_>>(), [4, 4]);
    }

    #[test]
    fn no_live_nodes_means_no_owners() {
        assert!(balance(4, &[], &BTreeMap::new()).is_empty());
    }
}
