//! The circuit breakers of this node's tenant endpoints: the runtime of
//! [`belfry_core::breaker::Breakers`], which decides everything. A
//! delivery asks for admission right before it sends (an open circuit
//! holds it: no attempt, nothing recorded, and its partition holds the
//! tenant's lane until the probe time) and reports its verdict after.
//!
//! Every transition goes through one place, [`transitioned`]: it logs,
//! counts, wakes the tenant's lanes when the circuit closes, and tells the
//! listener set with [`Circuits::on_transition`] (failure notices).
//!
//! The state is this node's own: each node judges the endpoints it
//! delivers to, and a restart starts every circuit closed.

use std::sync::{Arc, Mutex, MutexGuard};

use belfry_core::breaker::{Admission, Breakers, CircuitState, CircuitView, Pass, Transition};
use belfry_core::fire::Input;
use belfry_core::notice::Notice;
use belfry_core::{TenantConfig, TenantName, Timestamp, Verdict};

use crate::Shared;

/// A circuit's change, as the listener hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitNotice {
    pub tenant: TenantName,
    pub transition: Transition,
}

/// Called once per transition of any circuit on this node, on the
/// delivery's task: it must not block.
pub type CircuitListener = Arc<dyn Fn(&CircuitNotice) + Send + Sync>;

/// The node's circuits and their listener.
pub(crate) struct CircuitRuntime {
    breakers: Mutex<Breakers>,
    listener: Mutex<Option<CircuitListener>>,
}

impl std::fmt::Debug for CircuitRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitRuntime")
            .field("breakers", &self.breakers)
            .finish_non_exhaustive()
    }
}

impl CircuitRuntime {
    pub(crate) fn new(policy: belfry_core::breaker::BreakerPolicy) -> Self {
        CircuitRuntime {
            breakers: Mutex::new(Breakers::new(policy)),
            listener: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Breakers> {
        // Poison means a panic while held; `Breakers` changes each circuit
        // in one assignment, so it stays valid.
        self.breakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn listener(&self) -> Option<CircuitListener> {
        self.listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Whether a delivery of `tenant` may start now.
pub(crate) fn admit(shared: &Arc<Shared>, tenant: &TenantConfig, now: Timestamp) -> Admission {
    let (admission, transition) = shared
        .circuits
        .lock()
        .admit(&tenant.name, &tenant.sink, now);
    if let Some(transition) = transition {
        transitioned(shared, &tenant.name, transition);
    }
    admission
}

/// Records the verdict of a delivery admitted with `pass`; answers the
/// attempt's error with what the circuit did appended (the attempt that
/// opened it, a probe's).
pub(crate) fn record(
    shared: &Arc<Shared>,
    tenant: &TenantName,
    pass: Pass,
    verdict: Verdict,
    error: Option<String>,
) -> Option<String> {
    let now = shared.env.clock.now();
    let recorded = shared.circuits.lock().record(tenant, pass, verdict, now);
    let error = recorded.annotate(error);
    if let Some(transition) = recorded.transition {
        transitioned(shared, tenant, transition);
    }
    error
}

/// A probe admitted with `pass` was dropped unsent.
pub(crate) fn abandon(shared: &Arc<Shared>, tenant: &TenantName, pass: Pass) {
    let now = shared.env.clock.now();
    shared.circuits.lock().abandon(tenant, pass, now);
}

/// The one place a transition is acted on.
fn transitioned(shared: &Arc<Shared>, tenant: &TenantName, transition: Transition) {
    let state = transition.to.as_str();
    let not_closed = shared.circuits.lock().not_closed();
    belfry_metrics::circuit_changed(tenant.as_str(), state, not_closed);
    match transition.to {
        CircuitState::Open => {
            tracing::warn!(%tenant, reason = %transition.reason, "the tenant's circuit opened: its due events wait");
        }
        CircuitState::HalfOpen => {
            tracing::info!(%tenant, "the tenant's circuit is half-open: one probe delivery goes out");
        }
        CircuitState::Closed => {
            tracing::info!(%tenant, reason = %transition.reason, "the tenant's circuit closed: deliveries resume");
            // Held lanes fire at once, not at their next recheck.
            shared.owned.broadcast(
                || Input::CircuitClosed(tenant.clone()),
                shared.env.clock.now(),
            );
        }
    }
    if transition.is_noticed() {
        let notice = match transition.to {
            CircuitState::Closed => Notice::CircuitClosed { at: transition.at },
            _ => Notice::CircuitOpened {
                reason: Some(transition.reason.clone()),
                at: transition.at,
            },
        };
        crate::notices::raise(shared, tenant, notice);
    }
    if let Some(listener) = shared.circuits.listener() {
        listener(&CircuitNotice {
            tenant: tenant.clone(),
            transition,
        });
    }
}

/// The circuits sub-handle ([`crate::EngineHandle::circuits`]).
#[derive(Debug, Clone, Copy)]
pub struct Circuits<'a> {
    pub(crate) shared: &'a Arc<Shared>,
}

impl Circuits<'_> {
    /// The tenant's circuit on this node; `None` for a sink without one
    /// (pull, built-in) or with the breaker off.
    pub fn view(&self, tenant: &TenantConfig) -> Option<CircuitView> {
        self.shared.circuits.lock().view(&tenant.name, &tenant.sink)
    }

    /// Circuits open or half-open on this node.
    pub fn not_closed(&self) -> usize {
        self.shared.circuits.lock().not_closed()
    }

    /// Sets the one listener told of every transition (replacing any
    /// earlier one).
    pub fn on_transition(&self, listener: CircuitListener) {
        *self
            .shared
            .circuits
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(listener);
    }

    /// Forgets the tenant's circuit (the tenant was removed).
    pub(crate) fn forget(&self, tenant: &TenantName) {
        let now = self.shared.env.clock.now();
        let transition = self.shared.circuits.lock().forget(tenant, now);
        if let Some(transition) = transition {
            transitioned(self.shared, tenant, transition);
        }
    }

    /// The tenant's config was replaced through this node: a circuit of
    /// another sink starts over closed now (elsewhere, at the node's next
    /// delivery of the tenant).
    pub(crate) fn reconfigured(&self, tenant: &TenantConfig) {
        let now = self.shared.env.clock.now();
        let transition = self
            .shared
            .circuits
            .lock()
            .reconfigured(&tenant.name, &tenant.sink, now);
        if let Some(transition) = transition {
            transitioned(self.shared, &tenant.name, transition);
        }
    }
}
