//! Who gets a delivery slot next: one FIFO queue per tenant, tenants in
//! turn, a global and a per-tenant limit, and a reserve that hung tenants
//! cannot drain.
//!
//! # The reserve
//! The last `reserved` free slots go only to tenants below their share of
//! the reserve (`reserved / active tenants`, at least one). A tenant whose
//! webhook hangs therefore takes at most its per-tenant limit of the shared
//! slots plus a share of the reserve, and a healthy tenant — one with little
//! in flight — still finds a slot at once. Ten tenants hanging with the
//! defaults (1,024 slots, 256 per tenant, 256 reserved) hold at most 768 +
//! 10 × 23 slots; the eleventh tenant still gets 23 at once.
//!
//! The queues are bounded by the partitions: every queued job is an
//! outstanding entry of some [`super::PartitionCore`], which caps them.

use std::collections::{HashMap, VecDeque};

use crate::ids::TenantName;

/// The limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPolicy {
    /// Deliveries in flight at once, over all tenants.
    pub global: usize,
    /// Deliveries in flight at once for one tenant.
    pub per_tenant: usize,
    /// Free slots kept for tenants below their share of them.
    pub reserved: usize,
}

impl SlotPolicy {
    /// `global` and `per_tenant` as configured; a quarter of the slots
    /// reserved.
    pub fn new(global: usize, per_tenant: usize) -> Self {
        let global = global.max(1);
        SlotPolicy {
            global,
            per_tenant: per_tenant.clamp(1, global),
            reserved: global / 4,
        }
    }
}

#[derive(Debug)]
struct TenantQueue<J> {
    in_flight: usize,
    waiting: VecDeque<J>,
    /// Whether the tenant is in `ready`.
    is_ready: bool,
}

impl<J> Default for TenantQueue<J> {
    fn default() -> Self {
        TenantQueue {
            in_flight: 0,
            waiting: VecDeque::new(),
            is_ready: false,
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct DeliverySlots<J> {
    policy: SlotPolicy,
    tenants: HashMap<TenantName, TenantQueue<J>>,
    /// Tenants with waiting jobs and a free tenant slot, in turn order.
    ready: VecDeque<TenantName>,
    in_flight: usize,
    queued: usize,
}

impl<J> DeliverySlots<J> {
    pub fn new(policy: SlotPolicy) -> Self {
        DeliverySlots {
            policy,
            tenants: HashMap::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            queued: 0,
        }
    }

    pub fn policy(&self) -> SlotPolicy {
        self.policy
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Jobs waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Deliveries in flight for `tenant`.
    pub fn in_flight_of(&self, tenant: &TenantName) -> usize {
        self.tenants.get(tenant).map_or(0, |q| q.in_flight)
    }

    /// Queues a job; call [`DeliverySlots::start_ready`] after.
    pub fn submit(&mut self, tenant: TenantName, job: J) {
        let queue = self.tenants.entry(tenant.clone()).or_default();
        queue.waiting.push_back(job);
        self.queued += 1;
        if !queue.is_ready && queue.in_flight < self.policy.per_tenant {
            queue.is_ready = true;
            self.ready.push_back(tenant);
        }
    }

    /// A delivery of `tenant` finished; call [`DeliverySlots::start_ready`]
    /// after.
    pub fn finish(&mut self, tenant: &TenantName) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return;
        };
        queue.in_flight = queue.in_flight.saturating_sub(1);
        if !queue.is_ready && !queue.waiting.is_empty() {
            queue.is_ready = true;
            self.ready.push_back(tenant.clone());
        } else if queue.waiting.is_empty() && queue.in_flight == 0 && !queue.is_ready {
            self.tenants.remove(tenant);
        }
    }

    /// Drops every queued job (shutdown); returns them.
    pub fn clear_queued(&mut self) -> Vec<J> {
        self.ready.clear();
        self.queued = 0;
        let mut dropped = Vec::new();
        self.tenants.retain(|_, queue| {
            dropped.extend(queue.waiting.drain(..));
            queue.is_ready = false;
            queue.in_flight > 0
        });
        dropped
    }

    /// Whether a tenant with `in_flight` deliveries may start one more.
    fn may_start(&self, in_flight: usize) -> bool {
        let free = self.policy.global.saturating_sub(self.in_flight);
        if free == 0 || in_flight >= self.policy.per_tenant {
            return false;
        }
        if free > self.policy.reserved {
            return true;
        }
        let active = self.tenants.len().max(1);
        let share = (self.policy.reserved / active).max(1);
        in_flight < share
    }

    /// Takes jobs from ready tenants, in turn, while slots are free.
    pub fn start_ready(&mut self) -> Vec<(TenantName, J)> {
        let mut starting = Vec::new();
        loop {
            let mut started_any = false;
            for _ in 0..self.ready.len() {
                if self.in_flight >= self.policy.global {
                    return starting;
                }
                let Some(tenant) = self.ready.pop_front() else {
                    break;
                };
                let Some(in_flight) = self.tenants.get(&tenant).map(|q| q.in_flight) else {
                    continue;
                };
                if !self.may_start(in_flight) {
                    // Held back by the reserve: keeps its turn for later.
                    self.ready.push_back(tenant);
                    continue;
                }
                let Some(queue) = self.tenants.get_mut(&tenant) else {
                    continue;
                };
                let Some(job) = queue.waiting.pop_front() else {
                    queue.is_ready = false;
                    continue;
                };
                queue.in_flight += 1;
                self.in_flight += 1;
                self.queued -= 1;
                started_any = true;
                if !queue.waiting.is_empty() && queue.in_flight < self.policy.per_tenant {
                    self.ready.push_back(tenant.clone());
                } else {
                    queue.is_ready = false;
                }
                starting.push((tenant, job));
            }
            if !started_any {
                return starting;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TenantName {
        TenantName::new(name).unwrap()
    }

    #[test]
    fn tenants_take_turns_within_the_limits() {
        let mut slots = DeliverySlots::new(SlotPolicy {
            global: 4,
            per_tenant: 3,
            reserved: 0,
        });
        for i in 0..5 {
            slots.submit(t("a"), ("a", i));
        }
        slots.submit(t("b"), ("b", 0));
        let started: Vec<_> = slots.start_ready().into_iter().map(|(_, j)| j).collect();
        assert_eq!(started, [("a", 0), ("b", 0), ("a", 1), ("a", 2)]);
        assert_eq!(slots.in_flight_of(&t("a")), 3);
        slots.finish(&t("b"));
        // a is at its per-tenant limit: nothing starts.
        assert!(slots.start_ready().is_empty());
        slots.finish(&t("a"));
        assert_eq!(slots.start_ready().len(), 1);
        assert_eq!(slots.queued(), 1);
    }

    #[test]
    fn hung_tenants_cannot_take_the_reserve() {
        let policy = SlotPolicy::new(1_024, 256);
        let mut slots = DeliverySlots::new(policy);
        // Ten tenants whose deliveries never finish, each with a backlog.
        for h in 0..10 {
            for i in 0..1_000 {
                slots.submit(t(&format!("hung{h}")), i);
            }
        }
        let hung = slots.start_ready().len();
        assert!(hung < 1_024, "hung tenants took every slot");
        // A healthy tenant arriving later starts at once, several in parallel.
        for i in 0..20 {
            slots.submit(t("healthy"), i);
        }
        let started = slots.start_ready();
        assert!(
            started.len() >= 20,
            "healthy tenant got {} slots",
            started.len()
        );
        assert!(started.iter().all(|(tenant, _)| *tenant == t("healthy")));
    }

    #[test]
    fn clearing_drops_queued_jobs_but_keeps_in_flight_counts() {
        let mut slots = DeliverySlots::new(SlotPolicy::new(1, 1));
        slots.submit(t("a"), 1);
        slots.submit(t("a"), 2);
        assert_eq!(slots.start_ready().len(), 1);
        assert_eq!(slots.clear_queued(), vec![2]);
        assert_eq!(slots.in_flight(), 1);
        slots.finish(&t("a"));
        assert_eq!(slots.in_flight(), 0);
    }
}
