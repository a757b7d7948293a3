//! Pull claims across a cluster, the pure half: when a node announces
//! "tenant T has ready entries that no claim here took", and what a node
//! remembers of the other nodes' announcements (`docs/pull.md`, "In a
//! cluster").
//!
//! A node's [`super::PullQueue`] holds the ready entries of the partitions
//! it owns only. A worker's claim reaching another node is answered from
//! that node's queue first; for the rest, the node asks the nodes that
//! announced ready entries of the claim's tenant (a claim forwarded there,
//! answered at once), and a claim parked there is woken by such an
//! announcement. The runtime sends and receives the announcements; these
//! two types decide what to send and whom to ask.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::ids::TenantName;
use crate::time::Timestamp;

/// How often announcements are made and how long they are believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceConfig {
    /// Announced again this often while the tenant's entries stay
    /// unclaimed (an announcement is a hint and may be lost or ignored).
    pub repeat: Duration,
    /// At most one announcement per tenant this often: a tenant whose
    /// entries are claimed and come again at once is not announced on
    /// every entry.
    pub min_gap: Duration,
    /// An announcement heard is believed this long unless repeated.
    pub believe_for: Duration,
    /// Tenants remembered with nodes that announced them; more are
    /// ignored until some expire.
    pub max_tenants: usize,
    /// Nodes remembered per tenant.
    pub max_nodes_per_tenant: usize,
}

impl Default for AnnounceConfig {
    fn default() -> Self {
        AnnounceConfig {
            repeat: Duration::from_secs(1),
            min_gap: Duration::from_millis(10),
            believe_for: Duration::from_millis(2_500),
            max_tenants: 10_000,
            max_nodes_per_tenant: 64,
        }
    }
}

/// When to announce a tenant's unclaimed ready entries.
#[derive(Debug)]
struct Announced {
    at: Timestamp,
    /// Unclaimed at every evaluation since `at`: repeated after
    /// `repeat`; otherwise (claimed out, then ready again) after `min_gap`.
    unclaimed_since: bool,
}

/// Decides which tenants this node announces: at once when a tenant's
/// ready entries find no claim here, then again every `repeat` while they
/// stay unclaimed, never more often than `min_gap`. Holds one small entry
/// per tenant with ready entries (bounded by the queue's ready bound),
/// plus those claimed out within the last `min_gap`.
#[derive(Debug)]
pub struct Announcer {
    config: AnnounceConfig,
    tenants: HashMap<TenantName, Announced>,
}

impl Announcer {
    pub fn new(config: AnnounceConfig) -> Self {
        Announcer {
            config,
            tenants: HashMap::new(),
        }
    }

    /// `unclaimed`: every tenant with ready entries here and no claim
    /// waiting here, at `now`. Returns the tenants to announce now.
    pub fn due(&mut self, unclaimed: &[TenantName], now: Timestamp) -> Vec<TenantName> {
        let current: HashSet<&TenantName> = unclaimed.iter().collect();
        let min_gap = self.config.min_gap;
        self.tenants.retain(|tenant, announced| {
            if current.contains(tenant) {
                return true;
            }
            announced.unclaimed_since = false;
            now < announced.at.plus(min_gap)
        });
        let mut due = Vec::new();
        for tenant in unclaimed {
            let next = self.tenants.get(tenant).map(|a| self.next_of(a));
            if next.is_none_or(|at| at <= now) {
                self.tenants.insert(
                    tenant.clone(),
                    Announced {
                        at: now,
                        unclaimed_since: true,
                    },
                );
                due.push(tenant.clone());
            }
        }
        due
    }

    fn next_of(&self, announced: &Announced) -> Timestamp {
        if announced.unclaimed_since {
            announced.at.plus(self.config.repeat)
        } else {
            announced.at.plus(self.config.min_gap)
        }
    }

    /// When [`Self::due`] may announce something without a change: the
    /// next repeat, or the end of a gap.
    pub fn next_wake(&self) -> Option<Timestamp> {
        self.tenants.values().map(|a| self.next_of(a)).min()
    }
}

/// The other nodes that announced ready entries per tenant, each believed
/// until `believe_for` after its last announcement. Bounded by
/// `max_tenants` × `max_nodes_per_tenant`.
#[derive(Debug)]
pub struct ReadyElsewhere {
    config: AnnounceConfig,
    /// Per tenant: node and until when it is believed, latest first.
    tenants: HashMap<TenantName, Vec<(String, Timestamp)>>,
}

impl ReadyElsewhere {
    pub fn new(config: AnnounceConfig) -> Self {
        ReadyElsewhere {
            config,
            tenants: HashMap::new(),
        }
    }

    /// `node` announced ready entries of `tenants` at `now`. Returns the
    /// tenants recorded (an announcement that does not fit is dropped: it
    /// is repeated while it holds).
    pub fn heard(&mut self, node: &str, tenants: &[TenantName], now: Timestamp) -> Vec<TenantName> {
        let until = now.plus(self.config.believe_for);
        let mut recorded = Vec::new();
        for tenant in tenants {
            if !self.tenants.contains_key(tenant) && self.tenants.len() >= self.config.max_tenants {
                self.tenants.retain(|_, nodes| {
                    nodes.retain(|(_, until)| *until > now);
                    !nodes.is_empty()
                });
                if self.tenants.len() >= self.config.max_tenants {
                    continue;
                }
            }
            let nodes = self.tenants.entry(tenant.clone()).or_default();
            nodes.retain(|(n, until)| n != node && *until > now);
            if nodes.len() >= self.config.max_nodes_per_tenant {
                continue;
            }
            nodes.insert(0, (node.to_string(), until));
            recorded.push(tenant.clone());
        }
        recorded
    }

    /// The nodes believed to hold ready entries of `tenant` at `now`,
    /// the latest announcement first.
    pub fn nodes(&mut self, tenant: &TenantName, now: Timestamp) -> Vec<String> {
        let Some(nodes) = self.tenants.get_mut(tenant) else {
            return Vec::new();
        };
        nodes.retain(|(_, until)| *until > now);
        let found = nodes.iter().map(|(n, _)| n.clone()).collect();
        if nodes.is_empty() {
            self.tenants.remove(tenant);
        }
        found
    }

    /// A claim on `node` got fewer entries of `tenant` than it asked for:
    /// it has none left, until it announces again.
    pub fn drained(&mut self, tenant: &TenantName, node: &str) {
        if let Some(nodes) = self.tenants.get_mut(tenant) {
            nodes.retain(|(n, _)| n != node);
            if nodes.is_empty() {
                self.tenants.remove(tenant);
            }
        }
    }

    /// `node` could not be reached: forget it for every tenant.
    pub fn forget_node(&mut self, node: &str) {
        self.tenants.retain(|_, nodes| {
            nodes.retain(|(n, _)| n != node);
            !nodes.is_empty()
        });
    }

    /// Tenants remembered (for tests and metrics).
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantName {
        TenantName::new(name).unwrap()
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_tenant_is_announced_at_once_then_every_repeat_while_unclaimed() {
        let mut announcer = Announcer::new(AnnounceConfig::default());
        let t = [tenant("t")];
        assert_eq!(announcer.due(&t, at(0)), t.to_vec());
        assert!(announcer.due(&t, at(500)).is_empty());
        assert_eq!(announcer.next_wake(), Some(at(1_000)));
        assert_eq!(announcer.due(&t, at(1_000)), t.to_vec());
        assert!(announcer.due(&[], at(1_001)).is_empty());
        assert_eq!(announcer.next_wake(), Some(at(1_010)), "the gap");
        assert!(announcer.due(&[], at(1_010)).is_empty());
        assert_eq!(announcer.next_wake(), None, "forgotten once claimed out");
    }

    #[test]
    fn a_tenant_claimed_out_and_ready_again_waits_only_the_gap() {
        let mut announcer = Announcer::new(AnnounceConfig::default());
        let t = [tenant("t")];
        assert_eq!(announcer.due(&t, at(0)), t.to_vec());
        // Claimed out, then ready again within the gap: not yet.
        assert!(announcer.due(&[], at(3)).is_empty());
        assert!(announcer.due(&t, at(5)).is_empty());
        assert_eq!(announcer.next_wake(), Some(at(10)));
        assert_eq!(announcer.due(&t, at(10)), t.to_vec());
        // Claimed out long enough: at once.
        assert!(announcer.due(&[], at(30)).is_empty());
        assert_eq!(announcer.due(&t, at(31)), t.to_vec());
    }

    #[test]
    fn announcements_are_believed_for_a_while_latest_first() {
        let mut elsewhere = ReadyElsewhere::new(AnnounceConfig::default());
        let t = tenant("t");
        elsewhere.heard("a", std::slice::from_ref(&t), at(0));
        elsewhere.heard("b", std::slice::from_ref(&t), at(100));
        assert_eq!(elsewhere.nodes(&t, at(200)), ["b", "a"]);
        assert_eq!(elsewhere.nodes(&t, at(2_550)), ["b"], "a's expired");
        elsewhere.drained(&t, "b");
        assert!(elsewhere.nodes(&t, at(2_560)).is_empty());
        assert!(elsewhere.is_empty());
        assert!(elsewhere.nodes(&tenant("other"), at(0)).is_empty());
    }

    #[test]
    fn an_unreachable_node_is_forgotten_everywhere() {
        let mut elsewhere = ReadyElsewhere::new(AnnounceConfig::default());
        let (t, u) = (tenant("t"), tenant("u"));
        elsewhere.heard("a", &[t.clone(), u.clone()], at(0));
        elsewhere.heard("b", std::slice::from_ref(&u), at(0));
        elsewhere.forget_node("a");
        assert!(elsewhere.nodes(&t, at(1)).is_empty());
        assert_eq!(elsewhere.nodes(&u, at(1)), ["b"]);
    }

    #[test]
    fn memory_is_bounded() {
        let config = AnnounceConfig {
            max_tenants: 2,
            max_nodes_per_tenant: 1,
            ..AnnounceConfig::default()
        };
        let mut elsewhere = ReadyElsewhere::new(config);
        let tenants = [tenant("a"), tenant("b"), tenant("c")];
        let recorded = elsewhere.heard("n1", &tenants, at(0));
        assert_eq!(recorded.len(), 2);
        assert_eq!(elsewhere.len(), 2);
        assert!(elsewhere.heard("n2", &tenants[..1], at(1)).is_empty());
        // Once the first announcements expired, room again.
        assert_eq!(elsewhere.heard("n2", &tenants[2..], at(3_000)).len(), 1);
        assert_eq!(elsewhere.len(), 1);
    }
}
