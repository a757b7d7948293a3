//! When a cluster node counts as crashed before its leases run out.
//!
//! Each node holds a *presence session*: a database session it keeps for
//! its whole life, holding a lock named after it. A process that dies (kill
//! -9, out of memory, a panic that aborts) loses its sessions at once, so
//! its lock vanishes within milliseconds; a process that is merely slow or
//! frozen keeps it (the server still holds the connection). Every node looks
//! at all the locks every `presence_interval` and feeds what it saw to a
//! [`CrashWatch`], which decides, purely on those sightings and the clock
//! value it is given, which nodes count as crashed:
//!
//! - a node is judged by its lock only once it was **seen holding it**: a
//!   node that never took one (it is still starting, or runs a version
//!   without presence sessions) is left to the heartbeat TTL;
//! - its lock must have been **absent in every look for at least `grace`**,
//!   so a live node whose session broke (a network blip, a proxy or a
//!   restarted database) has that long to take it again;
//! - and its **heartbeat must be at least `grace` old**, so a node that
//!   still writes its heartbeat is never judged crashed, whatever its lock;
//! - a look that failed ([`CrashWatch::lost_sight`]) restarts every
//!   absence: after an outage of the watcher's own connection, all nodes
//!   get a full `grace` to take their locks again.
//!
//! The runtime (`belfry_engine::membership`) acts on the verdict: it ends
//! the crashed node's leases in the store, with the epoch bump that fences
//! anything it might still write.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::time::MonoTime;

/// One node as one look at the presence locks showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sighting<'a> {
    pub node: &'a str,
    /// Its presence lock is held.
    pub present: bool,
    /// Time since its last heartbeat, by the database's clock.
    pub heartbeat_age: Duration,
}

/// What the watch remembers of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Holding its lock in the last look.
    Present,
    /// Without its lock in every look since `since`.
    Absent { since: MonoTime },
}

/// The crash decision over successive looks (see the module docs).
#[derive(Debug, Clone)]
pub struct CrashWatch {
    grace: Duration,
    nodes: BTreeMap<String, Seen>,
}

impl CrashWatch {
    pub fn new(grace: Duration) -> Self {
        CrashWatch {
            grace,
            nodes: BTreeMap::new(),
        }
    }

    /// Takes one look, made at `now`, at every registered node; returns the
    /// nodes that count as crashed, in id order. A crashed node is returned
    /// again by every look until it is no longer registered. Nodes missing
    /// from `sightings` are forgotten.
    pub fn observe(&mut self, now: MonoTime, sightings: &[Sighting<'_>]) -> Vec<String> {
        self.nodes
            .retain(|node, _| sightings.iter().any(|s| s.node == node));
        let mut crashed = Vec::new();
        for sighting in sightings {
            if sighting.present {
                self.nodes.insert(sighting.node.to_string(), Seen::Present);
                continue;
            }
            // Never seen holding a lock: only the heartbeat TTL judges it.
            let Some(seen) = self.nodes.get_mut(sighting.node) else {
                continue;
            };
            let since = match *seen {
                Seen::Present => {
                    *seen = Seen::Absent { since: now };
                    now
                }
                Seen::Absent { since } => since,
            };
            if now.since(since) >= self.grace && sighting.heartbeat_age >= self.grace {
                crashed.push(sighting.node.to_string());
            }
        }
        crashed.sort();
        crashed
    }

    /// A look failed (the watcher could not reach the database): absences
    /// seen so far prove nothing any more, every node starts over.
    pub fn lost_sight(&mut self) {
        for seen in self.nodes.values_mut() {
            *seen = Seen::Present;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_millis(500);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn seen(node: &str, present: bool, heartbeat_ms: u64) -> Sighting<'_> {
        Sighting {
            node,
            present,
            heartbeat_age: ms(heartbeat_ms),
        }
    }

    #[test]
    fn a_node_whose_lock_stays_gone_for_the_grace_is_crashed() {
        let t0 = MonoTime::ZERO;
        let mut watch = CrashWatch::new(GRACE);
        assert!(watch.observe(t0, &[seen("a", true, 100)]).is_empty());
        assert!(
            watch
                .observe(t0.plus(ms(200)), &[seen("a", false, 300)])
                .is_empty()
        );
        assert!(
            watch
                .observe(t0.plus(ms(400)), &[seen("a", false, 500)])
                .is_empty()
        );
        // 500 ms absent, heartbeat 700 ms old.
        assert_eq!(
            watch.observe(t0.plus(ms(700)), &[seen("a", false, 800)]),
            ["a"]
        );
        // Reported again until it is gone from the sightings.
        assert_eq!(
            watch.observe(t0.plus(ms(900)), &[seen("a", false, 1000)]),
            ["a"]
        );
        assert!(watch.observe(t0.plus(ms(1100)), &[]).is_empty());
    }

    #[test]
    fn a_node_that_takes_its_lock_again_within_the_grace_is_alive() {
        let t0 = MonoTime::ZERO;
        let mut watch = CrashWatch::new(GRACE);
        watch.observe(t0, &[seen("a", true, 0)]);
        watch.observe(t0.plus(ms(200)), &[seen("a", false, 900)]);
        watch.observe(t0.plus(ms(400)), &[seen("a", true, 900)]);
        // Absent again: the grace counts from here, not from 200 ms.
        assert!(
            watch
                .observe(t0.plus(ms(800)), &[seen("a", false, 950)])
                .is_empty()
        );
        assert!(
            watch
                .observe(t0.plus(ms(1200)), &[seen("a", false, 950)])
                .is_empty()
        );
        assert_eq!(
            watch.observe(t0.plus(ms(1300)), &[seen("a", false, 950)]),
            ["a"]
        );
    }

    #[test]
    fn a_node_that_still_heartbeats_is_alive_without_its_lock() {
        let t0 = MonoTime::ZERO;
        let mut watch = CrashWatch::new(GRACE);
        watch.observe(t0, &[seen("a", true, 0)]);
        watch.observe(t0.plus(ms(100)), &[seen("a", false, 100)]);
        // Its lock is gone for 2 s, but it heartbeat 400 ms ago.
        assert!(
            watch
                .observe(t0.plus(ms(2_100)), &[seen("a", false, 400)])
                .is_empty()
        );
        assert_eq!(
            watch.observe(t0.plus(ms(2_300)), &[seen("a", false, 600)]),
            ["a"]
        );
    }

    #[test]
    fn a_node_never_seen_with_its_lock_is_left_to_the_heartbeat_ttl() {
        let t0 = MonoTime::ZERO;
        let mut watch = CrashWatch::new(GRACE);
        for step in 0..20 {
            let sightings = [seen("old", false, 4_000 + step * 100)];
            assert!(
                watch
                    .observe(t0.plus(ms(step * 200)), &sightings)
                    .is_empty()
            );
        }
    }

    #[test]
    fn a_failed_look_gives_every_node_a_full_grace_again() {
        let t0 = MonoTime::ZERO;
        let mut watch = CrashWatch::new(GRACE);
        watch.observe(t0, &[seen("a", true, 0), seen("b", true, 0)]);
        watch.observe(
            t0.plus(ms(200)),
            &[seen("a", false, 600), seen("b", true, 0)],
        );
        watch.lost_sight();
        // 3 s later (the watcher's connection was down): both absent.
        let both = [seen("a", false, 3_000), seen("b", false, 3_000)];
        assert!(watch.observe(t0.plus(ms(3_200)), &both).is_empty());
        assert!(watch.observe(t0.plus(ms(3_600)), &both).is_empty());
        assert_eq!(watch.observe(t0.plus(ms(3_700)), &both), ["a", "b"]);
    }

    #[test]
    fn nodes_are_judged_each_on_their_own() {
        let t0 = MonoTime::ZERO;
        let mut watch = CrashWatch::new(GRACE);
        watch.observe(t0, &[seen("a", true, 0), seen("b", true, 0)]);
        watch.observe(
            t0.plus(ms(200)),
            &[seen("b", false, 700), seen("a", true, 100)],
        );
        let crashed = watch.observe(
            t0.plus(ms(700)),
            &[seen("a", true, 600), seen("b", false, 1_200)],
        );
        assert_eq!(crashed, ["b"]);
    }
}
