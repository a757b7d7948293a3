//! Pull claims across a cluster, the runtime half; the decisions are
//! `belfry_core::pull::announce`'s (`docs/pull.md`, "In a cluster").
//!
//! - This node announces the pull tenants whose ready entries no claim
//!   here took ([`Announcer`]), through the coordinator (PostgreSQL
//!   `NOTIFY`), from one task poked whenever the queue changed.
//! - It remembers what the other nodes announced ([`ReadyElsewhere`]) and
//!   wakes the claims parked here for those tenants ([`ElsewhereWatch`]).
//!
//! Forwarding a claim or a lease call to another node is HTTP, so it is
//! the API's (`belfry_api`'s lease routes); they ask this module whom to
//! ask and tell it how that went.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use belfry_core::TenantName;
use belfry_core::pull::{AnnounceConfig, Announcer, ClaimRequest, Input, ReadyElsewhere, Reply};
use belfry_store::cluster::{Coordinator, NodeId};
use tokio::sync::{Notify, watch};

use crate::pull::Pull;
use crate::{Shared, pull};

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poison means a panic while held; these maps are hints only.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct PullPeers {
    announcer: Mutex<Announcer>,
    elsewhere: Mutex<ReadyElsewhere>,
    /// Per tenant with a claim parked here: bumped when another node
    /// announces it. An entry lives while a watch holds a receiver, so
    /// the map is bounded by the parked claims (`max_waiters`).
    watchers: Mutex<HashMap<TenantName, watch::Sender<()>>>,
    /// The queue changed: the announcer looks again.
    poke: Notify,
    /// This node, once it joined a cluster: its own announcements are
    /// ignored, and nothing is announced before.
    node: OnceLock<NodeId>,
}

impl Default for PullPeers {
    fn default() -> Self {
        let config = AnnounceConfig::default();
        PullPeers {
            announcer: Mutex::new(Announcer::new(config.clone())),
            elsewhere: Mutex::new(ReadyElsewhere::new(config)),
            watchers: Mutex::new(HashMap::new()),
            poke: Notify::new(),
            node: OnceLock::new(),
        }
    }
}

impl PullPeers {
    /// The pull queue handled an input: its unclaimed tenants may differ.
    pub(crate) fn queue_changed(&self) {
        if self.node.get().is_some() {
            self.poke.notify_one();
        }
    }
}

/// Announces this node's unclaimed pull tenants until the engine stops.
async fn run_announcer(shared: Arc<Shared>, node: NodeId, coordinator: Arc<dyn Coordinator>) {
    let mut stop = shared.env.tasks.stop_receiver();
    let peers = &shared.pull_peers;
    loop {
        if *stop.borrow() {
            break;
        }
        let poked = peers.poke.notified();
        tokio::pin!(poked);
        poked.as_mut().enable();
        let now = shared.env.clock.now();
        let unclaimed = shared.pull.lock().unclaimed_tenants();
        let (due, wake_at) = {
            let mut announcer = locked(&peers.announcer);
            (announcer.due(&unclaimed, now), announcer.next_wake())
        };
        if !due.is_empty()
            && let Err(error) = coordinator.announce_pull_ready(&node, &due).await
        {
            // A hint: repeated while it holds.
            tracing::warn!(%error, "announcing ready pull entries failed");
        }
        let sleep_for = wake_at.map_or(pull::MAX_SLEEP, |at| {
            shared.env.clock.now().until(at).min(pull::MAX_SLEEP)
        });
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            () = &mut poked => {}
            () = crate::tasks::pause(sleep_for) => {}
        }
    }
}

/// Resolves when another node announces ready entries of a tenant (see
/// [`Pull::watch_elsewhere`]).
#[derive(Debug)]
pub struct ElsewhereWatch {
    shared: Arc<Shared>,
    tenant: TenantName,
    receiver: Option<watch::Receiver<()>>,
}

impl ElsewhereWatch {
    /// Waits for the next announcement of the tenant since this watch was
    /// made or last resolved.
    pub async fn changed(&mut self) {
        let changed = match self.receiver.as_mut() {
            Some(receiver) => receiver.changed().await.is_ok(),
            None => false,
        };
        if !changed {
            // The sender went (cannot happen while this holds a receiver).
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for ElsewhereWatch {
    fn drop(&mut self) {
        drop(self.receiver.take());
        let mut watchers = locked(&self.shared.pull_peers.watchers);
        if watchers
            .get(&self.tenant)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            watchers.remove(&self.tenant);
        }
    }
}

impl<'a> Pull<'a> {
    /// Joins the cluster's pull claims as `node`: announces this node's
    /// unclaimed ready pull entries through `coordinator` until the engine
    /// stops. Call once; a second call does nothing.
    pub fn join_cluster(&self, node: NodeId, coordinator: Arc<dyn Coordinator>) {
        if self.shared.pull_peers.node.set(node.clone()).is_ok() {
            self.shared
                .env
                .tasks
                .spawn(run_announcer(self.shared.clone(), node, coordinator));
        }
    }

    /// `node` announced ready entries of `tenants` that no claim on it
    /// took: claims parked here for them look there.
    pub fn ready_elsewhere(&self, node: &str, tenants: &[TenantName]) {
        let peers = &self.shared.pull_peers;
        if peers.node.get().is_some_and(|me| me.0 == node) {
            return;
        }
        let recorded = locked(&peers.elsewhere).heard(node, tenants, self.shared.env.clock.now());
        let watchers = locked(&peers.watchers);
        for tenant in recorded {
            if let Some(sender) = watchers.get(&tenant) {
                sender.send_replace(());
            }
        }
    }

    /// The other nodes believed to hold ready entries of `tenant`, the
    /// latest announcement first.
    pub fn nodes_with_ready(&self, tenant: &TenantName) -> Vec<String> {
        locked(&self.shared.pull_peers.elsewhere).nodes(tenant, self.shared.env.clock.now())
    }

    /// A claim forwarded to `node` got fewer entries of `tenant` than it
    /// asked for: none are left there until it announces again.
    pub fn node_drained(&self, tenant: &TenantName, node: &str) {
        locked(&self.shared.pull_peers.elsewhere).drained(tenant, node);
    }

    /// `node` could not be reached: not asked again until it announces.
    pub fn node_unreachable(&self, node: &str) {
        locked(&self.shared.pull_peers.elsewhere).forget_node(node);
    }

    /// A watch on announcements of `tenant` by other nodes; make it
    /// before looking at [`Self::nodes_with_ready`], so an
    /// announcement in between is not missed.
    pub fn watch_elsewhere(&self, tenant: &TenantName) -> ElsewhereWatch {
        let receiver = locked(&self.shared.pull_peers.watchers)
            .entry(tenant.clone())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        ElsewhereWatch {
            shared: self.shared.clone(),
            tenant: tenant.clone(),
            receiver: Some(receiver),
        }
    }

    /// A claim of this node's own entries that is withdrawn once `until`
    /// resolves (answered at once then: empty, unless its grant was being
    /// recorded). Dropping the future abandons the claim.
    pub async fn claim_until(
        &self,
        tenant: TenantName,
        request: ClaimRequest,
        until: impl Future<Output = ()>,
    ) -> Reply {
        pull::ask_until(
            self.shared,
            |call| Input::Claim {
                call,
                tenant,
                request,
            },
            until,
        )
        .await
    }

    /// This node's id in the cluster, once it joined one.
    pub fn cluster_node(&self) -> Option<&'a NodeId> {
        self.shared.pull_peers.node.get()
    }
}
