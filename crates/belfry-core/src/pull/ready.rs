//! Ready entries of the pull queue: per tenant, per named queue, in due
//! order inside a queue and in turn across a tenant's queues.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::event::EventRecord;
use crate::ids::{QueueName, TenantName};
use crate::partition::PartitionId;
use crate::timer::DueCursor;

use crate::policy::DeliveryPolicy;

/// A fired entry of a pull tenant, handed over by its partition's runtime
/// once it read the record and claimed its version with the partition
/// core. It stays outstanding in that core until an [`Action::Finish`](super::Action::Finish).
#[derive(Debug, Clone, PartialEq)]
pub struct ReadyEntry {
    pub entry: DueCursor,
    pub partition: PartitionId,
    /// The partition's fencing epoch: leases are granted under it.
    pub epoch: u64,
    /// Pending, with `next_fire_at == entry.due`.
    pub record: EventRecord,
    pub queue: QueueName,
    pub policy: DeliveryPolicy,
}

/// One tenant's ready entries.
#[derive(Debug, Default)]
struct TenantQueues {
    /// Entries by queue, in due order. Only looked up; the order of
    /// serving comes from `turn`.
    queues: HashMap<QueueName, BTreeMap<DueCursor, ReadyEntry>>,
    /// The non-empty queues, the next to serve first.
    turn: VecDeque<QueueName>,
    len: usize,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct ReadyQueues {
    tenants: HashMap<TenantName, TenantQueues>,
    len: usize,
}

impl ReadyQueues {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn len_of(&self, tenant: &TenantName) -> usize {
        self.tenants.get(tenant).map_or(0, |t| t.len)
    }

    /// Tenants with ready entries.
    pub(super) fn tenants(&self) -> impl Iterator<Item = &TenantName> {
        self.tenants.keys()
    }

    /// Entries of `tenant` in `queue`.
    pub(super) fn len_in(&self, tenant: &TenantName, queue: &QueueName) -> usize {
        self.tenants
            .get(tenant)
            .and_then(|t| t.queues.get(queue))
            .map_or(0, BTreeMap::len)
    }

    /// Whether `tenant` has an entry in one of `only` (any queue: `None`).
    pub(super) fn has_for(&self, tenant: &TenantName, only: Option<&BTreeSet<QueueName>>) -> bool {
        match (self.tenants.get(tenant), only) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(queues), Some(only)) => only.iter().any(|q| queues.queues.contains_key(q)),
        }
    }

    pub(super) fn contains(&self, entry: &ReadyEntry) -> bool {
        self.tenants
            .get(&entry.entry.key.tenant)
            .and_then(|t| t.queues.get(&entry.queue))
            .is_some_and(|q| q.contains_key(&entry.entry))
    }

    /// Adds `entry` at its due position; a new queue joins the end of its
    /// tenant's turn. The caller checks [`Self::contains`] first.
    pub(super) fn insert(&mut self, entry: ReadyEntry) {
        let tenant = self
            .tenants
            .entry(entry.entry.key.tenant.clone())
            .or_default();
        let queue = tenant.queues.entry(entry.queue.clone()).or_default();
        if queue.is_empty() {
            tenant.turn.push_back(entry.queue.clone());
        }
        if queue.insert(entry.entry.clone(), entry).is_none() {
            tenant.len += 1;
            self.len += 1;
        }
    }

    pub(super) fn remove(
        &mut self,
        tenant: &TenantName,
        queue: &QueueName,
        cursor: &DueCursor,
    ) -> Option<ReadyEntry> {
        let queues = self.tenants.get_mut(tenant)?;
        let entries = queues.queues.get_mut(queue)?;
        let removed = entries.remove(cursor)?;
        if entries.is_empty() {
            queues.queues.remove(queue);
            queues.turn.retain(|q| q != queue);
        }
        queues.len -= 1;
        self.len -= 1;
        if queues.len == 0 {
            self.tenants.remove(tenant);
        }
        Some(removed)
    }

    /// Takes up to `n` of `tenant`'s entries from the queues in `only`
    /// (all: `None`): the earliest of each queue in turn, so one busy
    /// queue cannot starve the others. A queue served goes to the end of
    /// its tenant's turn. Stops before the entry whose payload would take
    /// the payloads taken past `max_bytes`, unless none is taken yet.
    pub(super) fn take(
        &mut self,
        tenant: &TenantName,
        n: usize,
        only: Option<&BTreeSet<QueueName>>,
        max_bytes: usize,
    ) -> Vec<ReadyEntry> {
        let mut taken = Vec::new();
        let mut bytes = 0usize;
        while taken.len() < n {
            let Some(queues) = self.tenants.get_mut(tenant) else {
                break;
            };
            let Some(next) = queues
                .turn
                .iter()
                .position(|q| only.is_none_or(|only| only.contains(q)))
            else {
                break;
            };
            let Some(queue) = queues.turn.remove(next) else {
                break;
            };
            let Some(entries) = queues.queues.get_mut(&queue) else {
                continue;
            };
            let size = entries
                .first_key_value()
                .map_or(0, |(_, e)| payload_bytes(e));
            if !taken.is_empty() && bytes.saturating_add(size) > max_bytes {
                // Its place in the turn is kept for the next claim.
                queues.turn.insert(next, queue);
                break;
            }
            bytes = bytes.saturating_add(size);
            if let Some((_, entry)) = entries.pop_first() {
                queues.len -= 1;
                self.len -= 1;
                taken.push(entry);
            }
            if entries.is_empty() {
                queues.queues.remove(&queue);
            } else {
                queues.turn.push_back(queue);
            }
            if queues.len == 0 {
                self.tenants.remove(tenant);
            }
        }
        taken
    }

    /// Removes every entry of `partition`, in due order.
    pub(super) fn remove_partition(&mut self, partition: PartitionId) -> Vec<ReadyEntry> {
        let mut doomed: Vec<(TenantName, QueueName, DueCursor)> = Vec::new();
        for (tenant, queues) in &self.tenants {
            for (queue, entries) in &queues.queues {
                for entry in entries.values().filter(|e| e.partition == partition) {
                    doomed.push((tenant.clone(), queue.clone(), entry.entry.clone()));
                }
            }
        }
        doomed.sort_by(|a, b| a.2.cmp(&b.2));
        doomed
            .into_iter()
            .filter_map(|(tenant, queue, cursor)| self.remove(&tenant, &queue, &cursor))
            .collect()
    }
}

fn payload_bytes(entry: &ReadyEntry) -> usize {
    entry.record.payload.as_ref().map_or(0, String::len)
}
