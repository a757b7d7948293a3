//! Cluster mode: pull workers' requests reaching a node that cannot answer
//! them alone (`docs/pull.md`, "In a cluster").
//!
//! - **A call on a lease** is answered by the node owning the partition of
//!   the lease's event. Another node forwards it there (the same path and
//!   body), signed for the worker's principal ([`crate::peer`]: the
//!   worker's key stays on the node it reached), and answers with the
//!   owner's answer. A forwarded request (its signature checked by the
//!   authentication layer) is never forwarded again: it is answered from
//!   this node's own state. When no owner can be asked (none
//!   is live or known yet, or it did not answer: it may have recorded the
//!   call and died before answering), a complete, fail or release is
//!   answered from the store's record of exactly that lease if it shows
//!   the call's outcome, as the owner would have ([`owner_unreachable`]);
//!   otherwise, and for a heartbeat, `503 node_unavailable`: whether the
//!   call took effect is not known, and repeating it is safe.
//! - **A claim** takes this node's own ready entries first, then asks the
//!   nodes that announced ready entries of the tenant (a claim for the rest
//!   with `wait_ms` 0, signed for the worker's principal), and merges the
//!   leases. With nothing found it parks here until its wait ends, an
//!   entry comes due here, or another node announces the tenant (then it
//!   looks there).
//!
//! A node that refuses this node's signature (`forward_refused`: the
//! nodes hold different cluster secrets, or their clocks disagree) counts
//! as not answering; the worker never sees that code.
//!
//! Forwards are bounded ([`MAX_FORWARDS`] at once over the node) and
//! pooled (one HTTP client per process, which never uses a proxy: nodes
//! call each other directly). Answers never name another node's address.

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use belfry_core::TenantName;
use belfry_core::pull::{ClaimRequest, LeaseCall, LeaseId, Reply};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::ApiState;
use crate::auth::Principal;
use crate::cluster::PartitionOwner;
use crate::error::{ApiError, Code, V1Error};
use crate::peer::FORWARDED;
use crate::v1::replies::{answer, lease_view, pull_error};

/// Forwards in flight at once from this node; more wait for a place.
const MAX_FORWARDS: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A forwarded request never long-polls; the owner answers after one
/// store write (or a few queued on the same lease).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // Err means another provider is already installed: fine, use it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .tls_backend_rustls()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FORWARD_TIMEOUT)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(MAX_FORWARDS)
            .redirect(reqwest::redirect::Policy::none())
            // `HTTP_PROXY` and friends are for calls leaving the cluster.
            .no_proxy()
            .build()
            .unwrap_or_else(|error| {
                // Only a broken TLS setup fails here; forwards then fail
                // (503) instead of the node refusing to start.
                tracing::error!(%error, "cannot build the client for forwarding to other nodes");
                reqwest::Client::new()
            })
    })
}

fn permits() -> &'static Semaphore {
    static PERMITS: Semaphore = Semaphore::const_new(MAX_FORWARDS);
    &PERMITS
}

/// Whether another node forwarded this request (the authentication
/// layer admitted its signature).
pub(crate) fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(&FORWARDED)
}

/// No owner of the lease could be asked, and the store shows no outcome
/// of the call: it may not have reached the owner, or the owner may have
/// it in hand (or have recorded it and died before answering).
pub(crate) fn node_unavailable() -> V1Error {
    V1Error(ApiError::new(
        Code::NodeUnavailable,
        "the node holding this lease cannot be reached right now; whether this call took effect \
         is not known; repeating it is safe and answers as the first call would have",
    ))
}

/// No node owning the lease's partition can be asked right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoOwner;

/// What the store recorded of `call` on exactly `lease`, when no owner
/// could be asked: `Some` when the lease was resolved as the call asks
/// (its owner recorded it, perhaps just before it went away), answered as
/// the owner would have; `None` when that is not known (nothing of the
/// kind recorded, a heartbeat, or the store unreadable).
pub(crate) async fn recorded(state: &ApiState, lease: &LeaseId, call: &LeaseCall) -> Option<Reply> {
    match state.engine.pull().recorded_outcome(lease, call).await {
        Ok(recorded) => recorded,
        Err(error) => {
            tracing::warn!(%error, "reading the record of a lease whose owner cannot be asked failed");
            None
        }
    }
}

/// The answer to `call` on `lease` when no owner could be asked: the
/// store's record ([`recorded`]), else `503 node_unavailable`.
pub(crate) async fn owner_unreachable(
    state: &ApiState,
    lease: &LeaseId,
    call: &LeaseCall,
) -> Result<Response, V1Error> {
    match recorded(state, lease, call).await {
        Some(reply) => answer(reply),
        None => Err(node_unavailable()),
    }
}

/// Why a forward got no answer (logged, never answered).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error("this node has not joined the cluster")]
    NotJoined,
    #[error("the OS random source failed while signing")]
    Signing,
    #[error("the node's advertised address does not make a URL")]
    BadUrl,
    #[error(
        "the node refused this node's signature: do the nodes share the cluster secret, \
         and do their clocks agree?"
    )]
    SignatureRefused,
    /// Without its URL: the log names the node, not its address or the
    /// lease.
    #[error("{0}")]
    Http(reqwest::Error),
}

impl From<reqwest::Error> for ForwardError {
    fn from(error: reqwest::Error) -> Self {
        ForwardError::Http(error.without_url())
    }
}

/// POSTs `body` to `path` on node `to` at `url`, signed as a forward of
/// `principal`'s request.
pub(crate) async fn post(
    state: &ApiState,
    principal: &Principal,
    to: &str,
    url: &str,
    path: &str,
    body: bytes::Bytes,
) -> Result<(StatusCode, bytes::Bytes), ForwardError> {
    let peers = state.cluster.peers().ok_or(ForwardError::NotJoined)?;
    let url = reqwest::Url::parse(&format!("{url}{path}")).map_err(|_| ForwardError::BadUrl)?;
    // The target as sent: the URL parser may have escaped characters.
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    };
    // Signed once a place is free: waiting may take a while.
    let _permit = permits().acquire().await;
    let signed = peers
        .sign(
            &Method::POST,
            &target,
            to,
            state.engine.now().as_millis(),
            principal,
            &body,
        )
        .map_err(|_| ForwardError::Signing)?;
    let mut request = client()
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body);
    for (name, value) in signed {
        request = request.header(name, value);
    }
    let response = request.send().await?;
    let status = StatusCode::from_u16(response.status().as_u16())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = response.bytes().await?;
    if status == StatusCode::FORBIDDEN {
        let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
        if answer["error"]["code"] == Code::ForwardRefused.as_str() {
            return Err(ForwardError::SignatureRefused);
        }
    }
    Ok((status, body))
}

/// Where a call on `lease` must go: `None` to answer it here.
///
/// # Errors
/// [`NoOwner`] when the lease may be live on a node this one cannot name
/// right now (no live owner, or this node's view is older than the
/// lease).
pub(crate) fn lease_owner(
    state: &ApiState,
    headers: &HeaderMap,
    lease: &LeaseId,
) -> Result<Option<PartitionOwner>, NoOwner> {
    let Some(me) = state.engine.pull().cluster_node() else {
        return Ok(None);
    };
    if is_forwarded(headers) {
        return Ok(None);
    }
    let partition = state.engine.store().partitions().partition_of(lease.key());
    if state
        .engine
        .partitions()
        .owned_epoch(partition)
        .is_some_and(|epoch| epoch >= lease.epoch())
    {
        return Ok(None);
    }
    match state.cluster.owner_of(partition) {
        // Being handed to or from this node: this node's answer stands.
        Some(owner) if owner.node == me.0 => Ok(None),
        // A later epoch voided the lease: answered here (`lease_lost`,
        // or a repeat's recorded outcome).
        Some(owner) if owner.epoch > lease.epoch() => Ok(None),
        Some(owner) if owner.epoch == lease.epoch() => Ok(Some(owner)),
        _ => Err(NoOwner),
    }
}

/// Forwards `call` on `lease` (`body`: its raw body) to its owner and
/// answers what it answered; with no answer, [`owner_unreachable`].
pub(crate) async fn lease_call(
    state: &ApiState,
    principal: &Principal,
    owner: &PartitionOwner,
    lease: &LeaseId,
    call: &LeaseCall,
    path: &str,
    body: bytes::Bytes,
) -> Result<Response, V1Error> {
    match post(state, principal, &owner.node, &owner.url, path, body).await {
        Ok((status, body)) => Ok((
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response()),
        Err(error) => {
            tracing::warn!(%error, node = %owner.node, "forwarding a lease call failed");
            owner_unreachable(state, lease, call).await
        }
    }
}

/// Why a batch item forwarded to its owner was not completed there.
#[derive(Debug)]
pub(crate) enum NotCompleted {
    /// The owner's own error, as `(code, message)`.
    Refused(String, String),
    /// No answer (or not one of the API's): the outcome is not known.
    Unanswered,
}

/// Completes one lease of a batch completion on its owner (`result`: the
/// validated JSON text).
pub(crate) async fn complete_on(
    state: &ApiState,
    principal: &Principal,
    owner: &PartitionOwner,
    lease_text: &str,
    result: Option<&str>,
) -> Result<(), NotCompleted> {
    let path = format!("/v1/leases/{lease_text}/complete");
    let body = match result {
        Some(result) => format!(r#"{{"result":{result}}}"#),
        None => "{}".to_owned(),
    };
    match post(
        state,
        principal,
        &owner.node,
        &owner.url,
        &path,
        body.into(),
    )
    .await
    {
        Ok((StatusCode::OK, _)) => Ok(()),
        Ok((_, body)) => {
            let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
            let error = &answer["error"];
            match (error["code"].as_str(), error["message"].as_str()) {
                (Some(code), Some(message)) => {
                    Err(NotCompleted::Refused(code.to_owned(), message.to_owned()))
                }
                _ => Err(NotCompleted::Unanswered),
            }
        }
        Err(error) => {
            tracing::warn!(%error, node = %owner.node, "forwarding a lease completion failed");
            Err(NotCompleted::Unanswered)
        }
    }
}

/// What a claim got: its leases as answered to the worker, or an error.
fn leases_of(reply: Reply) -> Result<Vec<Value>, V1Error> {
    match reply {
        Reply::Leases(leases) => leases
            .iter()
            .map(|lease| {
                serde_json::to_value(lease_view(lease)).map_err(|error| {
                    tracing::error!(%error, "a lease could not be put in an answer");
                    V1Error(ApiError::internal())
                })
            })
            .collect(),
        Reply::Error(error) => Err(pull_error(error)),
        other => {
            tracing::error!(
                ?other,
                "a claim was answered with something else than leases"
            );
            Err(V1Error(ApiError::internal()))
        }
    }
}

/// Asks `node` for up to `want` leases of `tenant` at once; `None` when
/// it could not be asked.
async fn claim_on(
    state: &ApiState,
    principal: &Principal,
    node: &str,
    tenant: &TenantName,
    request: &ClaimRequest,
    want: usize,
) -> Option<Vec<Value>> {
    let url = state.cluster.url_of(node)?;
    let path = format!(
        "/v1/tenants/{}/leases",
        percent_encoding::utf8_percent_encode(tenant.as_str(), percent_encoding::NON_ALPHANUMERIC)
    );
    let mut body = json!({
        "worker_id": request.worker.as_str(),
        "max_events": want,
        "lease_ms": u64::try_from(request.lease.as_millis()).unwrap_or(u64::MAX),
        "wait_ms": 0,
    });
    if let Some(queues) = &request.queues {
        body["queues"] = queues.iter().map(|queue| queue.as_str()).collect();
    }
    match post(state, principal, node, &url, &path, body.to_string().into()).await {
        Ok((StatusCode::OK, body)) => {
            let mut answer: Value = serde_json::from_slice(&body).ok()?;
            match answer.get_mut("leases").map(Value::take) {
                Some(Value::Array(leases)) => Some(leases),
                _ => Some(Vec::new()),
            }
        }
        Ok((status, _)) => {
            tracing::debug!(%status, node, "a claim forwarded to another node was refused");
            Some(Vec::new())
        }
        Err(error) => {
            tracing::warn!(%error, node, "forwarding a claim failed");
            None
        }
    }
}

/// Fills `leases` up to the claim's `max_events` from the nodes that
/// announced ready entries of `tenant`.
async fn claim_elsewhere(
    state: &ApiState,
    principal: &Principal,
    tenant: &TenantName,
    request: &ClaimRequest,
    leases: &mut Vec<Value>,
) {
    let max = request.max_events as usize;
    for node in state.engine.pull().nodes_with_ready(tenant) {
        let want = max.saturating_sub(leases.len());
        if want == 0 {
            return;
        }
        match claim_on(state, principal, &node, tenant, request, want).await {
            Some(got) => {
                if got.len() < want {
                    state.engine.pull().node_drained(tenant, &node);
                }
                leases.extend(got);
            }
            None => state.engine.pull().node_unreachable(&node),
        }
    }
}

/// A claim's answer with leases of several nodes, each as its node
/// answered it (`leases::LeaseList`'s shape).
#[derive(serde::Serialize)]
struct Leases {
    leases: Vec<Value>,
}

fn leases_answer(leases: Vec<Value>) -> Response {
    axum::Json(Leases { leases }).into_response()
}

/// A claim on a cluster node: see the module documentation. `None` when
/// this node answers it alone (a single node, or a forwarded claim).
pub(crate) async fn claim(
    state: &ApiState,
    headers: &HeaderMap,
    principal: &Principal,
    tenant: &TenantName,
    request: &ClaimRequest,
) -> Option<Result<Response, V1Error>> {
    state.engine.pull().cluster_node()?;
    if is_forwarded(headers) {
        return None;
    }
    Some(claim_in_cluster(state, principal, tenant, request).await)
}

async fn claim_in_cluster(
    state: &ApiState,
    principal: &Principal,
    tenant: &TenantName,
    request: &ClaimRequest,
) -> Result<Response, V1Error> {
    let engine = &state.engine;
    let clock = engine.clock();
    let deadline = clock.monotonic().plus(request.wait);
    let at_once = ClaimRequest {
        wait: Duration::ZERO,
        ..request.clone()
    };
    // Before looking elsewhere: an announcement meanwhile is not missed.
    let mut watch = engine.pull().watch_elsewhere(tenant);
    let mut leases = leases_of(engine.pull().claim(tenant.clone(), at_once).await)?;
    loop {
        claim_elsewhere(state, principal, tenant, request, &mut leases).await;
        let remaining = deadline.since(clock.monotonic());
        if !leases.is_empty() || remaining.is_zero() {
            return Ok(leases_answer(leases));
        }
        // Parked here until the wait ends, an entry comes due here, or
        // another node announces the tenant.
        let parked = ClaimRequest {
            wait: remaining,
            ..request.clone()
        };
        let reply = engine
            .pull()
            .claim_until(tenant.clone(), parked, watch.changed())
            .await;
        leases = leases_of(reply)?;
        if !leases.is_empty() || clock.monotonic() >= deadline {
            return Ok(leases_answer(leases));
        }
        watch = engine.pull().watch_elsewhere(tenant);
    }
}
