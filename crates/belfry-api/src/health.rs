//! `GET /health/live` and `GET /health/ready`, for load balancers and
//! orchestrators. Both are public (no key, any `Host`, like `/ping`) and
//! answer only a status and, when not ready, a stable reason: nothing about
//! tenants, events, partitions or the store's errors.
//!
//! - live: the process serves HTTP (this handler ran);
//! - ready: every partition this node owns has read its first window page
//!   ([`belfry_engine::partitions::Partitions::loaded`]), the store
//!   answers a cheap read within [`STORE_PROBE_TIMEOUT`] and does not know
//!   itself unable to write ([`belfry_store::Store::write_blocked`]).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use belfry_core::{MonoTime, TenantName};
use serde::Serialize;

use crate::ApiState;

/// A store that takes longer than this to answer a point read is not fit
/// to serve requests (and a probe must answer before its caller gives up).
pub const STORE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one store probe's result is reused: a public route must not
/// let anyone turn requests into database reads one for one.
const STORE_PROBE_REUSE: Duration = Duration::from_secs(1);

/// A tenant name no one registers (it would still be harmless): the probe
/// is a point read of it.
const PROBE_TENANT: &str = "belfry.health-probe";

/// The answer of both routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct HealthStatus {
    /// `live`, `ready` or `not_ready`.
    #[schema(example = "ready")]
    pub status: &'static str,
    /// Why the node is not ready: `partitions_loading` (owned partitions
    /// are still reading their first window page), `store_unavailable`
    /// (the store did not answer a read in time) or `store_not_writable`
    /// (the store answers reads but knows it cannot write: the database
    /// is read-only or its commits hang, see `message`). Absent when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "store_unavailable")]
    pub reason: Option<&'static str>,
    /// A sentence for people; absent when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub message: Option<&'static str>,
}

/// The last store probe, shared by the readiness requests of one router.
#[derive(Debug, Default)]
pub(crate) struct StoreProbe {
    /// When the last probe finished and whether the store answered. The
    /// async lock also makes concurrent requests share one probe.
    last: tokio::sync::Mutex<Option<(MonoTime, bool)>>,
}

impl StoreProbe {
    /// Whether the store answered a probe read: the last result if it is
    /// recent, unless `fresh` asks for a new probe.
    async fn store_answers(&self, state: &ApiState, fresh: bool) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, answered)) = *last
            && !fresh
            && state.engine.clock().monotonic().since(at) < STORE_PROBE_REUSE
        {
            return answered;
        }
        let answered = probe_store(state).await;
        *last = Some((state.engine.clock().monotonic(), answered));
        answered
    }
}

async fn probe_store(state: &ApiState) -> bool {
    let Ok(probe) = TenantName::new(PROBE_TENANT) else {
        return false;
    };
    let store = state.engine.store();
    match tokio::time::timeout(STORE_PROBE_TIMEOUT, store.get_tenant(&probe)).await {
        Ok(Ok(_)) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "readiness: the store failed a probe read");
            false
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = STORE_PROBE_TIMEOUT.as_millis() as u64,
                "readiness: the store did not answer a probe read in time"
            );
            false
        }
    }
}

/// What `ready` keeps between probes.
pub(crate) fn probe() -> Extension<Arc<StoreProbe>> {
    Extension(Arc::new(StoreProbe::default()))
}

/// Liveness: the process serves HTTP.
#[utoipa::path(
    get,
    path = "/health/live",
    tag = "health",
    security(()),
    operation_id = "health_live",
    responses((status = 200, description = "The process serves HTTP", body = HealthStatus,
               example = json!({"status": "live"})))
)]
pub(crate) async fn live() -> Json<HealthStatus> {
    Json(HealthStatus {
        status: "live",
        reason: None,
        message: None,
    })
}

/// Readiness: owned partitions loaded and the store answering.
#[utoipa::path(
    get,
    path = "/health/ready",
    tag = "health",
    operation_id = "health_ready",
    security(()),
    responses(
        (status = 200, description = "Owned partitions are loaded and the store answers",
         body = HealthStatus, example = json!({"status": "ready"})),
        (status = 503, description = "Not ready; `reason` says why", body = HealthStatus,
         example = json!({"status": "not_ready", "reason": "store_unavailable",
                          "message": "the store does not answer"})),
    )
)]
pub(crate) async fn ready(
    State(state): State<ApiState>,
    Extension(probe): Extension<Arc<StoreProbe>>,
) -> Response {
    let not_ready = |reason, message| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(HealthStatus {
                status: "not_ready",
                reason: Some(reason),
                message: Some(message),
            }),
        )
            .into_response()
    };
    // The store first: during an outage partitions also reload (and fail),
    // and the cause an operator needs to see is the store. What it knows
    // against writes comes before a probe: reads may still work where
    // writes cannot (a standby, a primary whose commits wait for a standby
    // that left), and a probe read may wait for a connection such writes
    // hold. Partitions not loaded ask it afresh: a reused "answered" may
    // predate the outage that keeps them from loading.
    if let Some(why) = state.engine.store().write_blocked() {
        return not_ready("store_not_writable", why);
    }
    let loaded = state.engine.partitions().loaded().all();
    if !probe.store_answers(&state, !loaded).await {
        return not_ready("store_unavailable", "the store does not answer");
    }
    if !loaded {
        return not_ready(
            "partitions_loading",
            "owned partitions are still loading their due events",
        );
    }
    Json(HealthStatus {
        status: "ready",
        reason: None,
        message: None,
    })
    .into_response()
}
