//! Shared setup: the real router over a real embedded store (in a temp dir)
//! and a real engine, driven with `tower::ServiceExt::oneshot`.

#![allow(dead_code)] // Each test binary uses a different part of this.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use belfry_api::{ApiOptions, ApiState, Auth, AuthOptions, SingleNode};
use belfry_clock::SystemClock;
use belfry_core::{EventId, EventKey, EventRecord, PartitionCount, TenantName};
use belfry_engine::{Engine, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::interpose::{Fault, Interposed, Interposer, StoreCall};
use belfry_store::{
    EmbeddedOptions, EmbeddedStore, ListEventsParams, SharedStore, StoreError, StoreResult,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tempfile::TempDir;
use tower::ServiceExt;

/// Generous deadline for anything that waits on a delivery.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Harness {
    pub app: Router,
    pub state: ApiState,
    pub engine: Option<Engine>,
    /// The real store, read directly by assertions (never faulty).
    pub store: SharedStore,
    /// The same store, for its test failpoints (a writer shard's commits
    /// failing: partly applied batches).
    pub embedded: Arc<EmbeddedStore>,
    /// Injects failures into what the API sees of the store.
    pub faults: Arc<Faults>,
    /// The store as the engine sees it: through `faults`.
    pub faulty: SharedStore,
    _dir: TempDir,
}

/// Which store calls fail, and how. Off by default.
#[derive(Debug, Default)]
pub struct Faults {
    fault: Mutex<Option<(FaultScope, StoreError)>>,
    /// How many calls were failed so far.
    injected: std::sync::atomic::AtomicU64,
    /// `change_leases` calls made, and the changes they carried.
    lease_batches: std::sync::atomic::AtomicU64,
    batched_changes: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultScope {
    /// Only writes of events (`apply`).
    Apply,
    /// Every call the API makes (tenant and event reads and writes).
    ClientCalls,
    /// Only the engine's due-index page reads: partitions cannot load
    /// their windows.
    DuePages,
    /// Both: the whole store is down (the API's calls and the partitions'
    /// loading alike).
    Everything,
    /// Only the pull queue's lease writes (grants and changes): what the
    /// queue answers without the store still answers.
    LeaseWrites,
    /// Only the listing of API keys: an open node cannot tell whether
    /// keys exist.
    KeyReads,
    /// Only reads of a stored lease (`get_lease`): the record that answers
    /// a repeated call the queue no longer remembers.
    LeaseReads,
}

impl Faults {
    pub fn set(&self, scope: FaultScope, error: StoreError) {
        *self.fault.lock().unwrap() = Some((scope, error));
    }

    pub fn clear(&self) {
        *self.fault.lock().unwrap() = None;
    }

    /// How many calls were failed so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `(calls, changes)` of `change_leases` so far.
    pub fn lease_batches(&self) -> (u64, u64) {
        (
            self.lease_batches.load(Ordering::SeqCst),
            self.batched_changes.load(Ordering::SeqCst),
        )
    }

    fn check(&self, call: FaultScope) -> StoreResult<()> {
        let result = match &*self.fault.lock().unwrap() {
            Some((FaultScope::ClientCalls, error))
                if !matches!(
                    call,
                    FaultScope::DuePages
                        | FaultScope::LeaseWrites
                        | FaultScope::KeyReads
                        | FaultScope::LeaseReads
                ) =>
            {
                Err(error.clone())
            }
            Some((FaultScope::Everything, error)) => Err(error.clone()),
            Some((scope, error)) if *scope == call => Err(error.clone()),
            _ => Ok(()),
        };
        if result.is_err() {
            self.injected
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }
}

/// The real embedded store behind this fault switch: every call goes to
/// it unless a fault is set for that call. The engine's own calls (purges,
/// stats, fenced outcomes) are never failed, and its due pages only by
/// [`FaultScope::DuePages`].
impl Interposer for Faults {
    fn before(&self, call: StoreCall<'_>) -> Fault {
        let result = match call {
            // Outcomes recorded by the engine carry a fence; only client
            // commands (no fence) are failed.
            StoreCall::Apply(params) if params.commands.iter().all(|c| c.fence.is_none()) => {
                self.check(FaultScope::Apply)
            }
            StoreCall::DuePage => self.check(FaultScope::DuePages),
            StoreCall::ChangeLeases(params) => {
                let counted = self.check(FaultScope::LeaseWrites);
                let changes = params.changes.len() as u64;
                self.lease_batches.fetch_add(1, Ordering::SeqCst);
                self.batched_changes.fetch_add(changes, Ordering::SeqCst);
                counted
            }
            StoreCall::RecordLeases | StoreCall::ChangeLease => self.check(FaultScope::LeaseWrites),
            StoreCall::ListApiKeys => self.check(FaultScope::KeyReads),
            StoreCall::GetLease => self.check(FaultScope::LeaseReads),
            StoreCall::PutTenant
            | StoreCall::GetTenant
            | StoreCall::ListTenants
            | StoreCall::DeleteTenant
            | StoreCall::GetEvent
            | StoreCall::GetEvents
            | StoreCall::ListEvents
            | StoreCall::CountEvents
            | StoreCall::Attempts
            | StoreCall::DeleteFinished => self.check(FaultScope::ClientCalls),
            _ => Ok(()),
        };
        result.into()
    }
}

/// An answer: status and body (JSON, `Null` when empty, a string when not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
    pub content_type: Option<String>,
    pub headers: axum::http::HeaderMap,
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::with_options(ApiOptions::default()).await
    }

    pub async fn with_options(options: ApiOptions) -> Harness {
        // A short grace: at shutdown the engine waits up to this long for
        // its background tasks, and tests need not wait out the default.
        let engine_options = EngineOptions {
            shutdown_grace: Duration::from_millis(500),
            ..EngineOptions::default()
        };
        Harness::with_engine_options(options, engine_options).await
    }

    pub async fn with_engine_options(
        options: ApiOptions,
        engine_options: EngineOptions,
    ) -> Harness {
        Harness::build(options, engine_options, None).await
    }

    /// A harness whose store fails as `fault` says from before the engine
    /// starts (e.g. partitions that cannot load their first window page).
    pub async fn with_fault_from_start(scope: FaultScope, error: StoreError) -> Harness {
        let engine_options = EngineOptions {
            shutdown_grace: Duration::from_millis(500),
            ..EngineOptions::default()
        };
        Harness::build(ApiOptions::default(), engine_options, Some((scope, error))).await
    }

    async fn build(
        options: ApiOptions,
        engine_options: EngineOptions,
        fault: Option<(FaultScope, StoreError)>,
    ) -> Harness {
        belfry_testkit::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.path().join("data"),
            partitions: PartitionCount::new(4).unwrap(),
            writers: None,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap();
        let embedded = Arc::new(store);
        let store: SharedStore = embedded.clone();
        let faults = Arc::new(Faults::default());
        if let Some((scope, error)) = fault {
            faults.set(scope, error);
        }
        let faulty: SharedStore = Arc::new(Interposed::new(store.clone(), faults.clone()));
        let sinks = Sinks::new(Default::default()).unwrap();
        let engine = Engine::start(engine_options, faulty.clone(), sinks, Arc::new(SystemClock));
        let state = ApiState {
            engine: engine.handle(),
            options,
            cluster: Arc::new(SingleNode {
                address: "127.0.0.1:8080".into(),
            }),
            // Loopback and no keys: open, as the quick start.
            auth: Arc::new(Auth::new(
                AuthOptions::default(),
                store.clone(),
                "127.0.0.1:8080".parse().unwrap(),
                Arc::new(SystemClock),
            )),
            metrics: belfry_metrics::install().ok(),
        };
        Harness {
            app: belfry_api::router(state.clone()),
            state,
            engine: Some(engine),
            store,
            embedded,
            faults,
            faulty,
            _dir: dir,
        }
    }

    /// Stops the engine cleanly. The router and state hold engine handles,
    /// which the engine waits for: they go first.
    pub async fn shutdown(self) {
        let Harness {
            app,
            state,
            engine,
            store,
            embedded,
            faults: _,
            faulty,
            _dir,
        } = self;
        drop(faulty);
        drop(app);
        drop(state);
        drop(store);
        drop(embedded);
        if let Some(engine) = engine {
            engine.shutdown().await;
        }
    }

    /// Sends a request with a raw body and an optional content type.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> Answer {
        self.raw_as(None, method, path, content_type, body).await
    }

    /// [`Harness::raw`] with an API key (`Authorization: Bearer`).
    pub async fn raw_as(
        &self,
        key: Option<&str>,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Body>,
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        send_to(&self.app, request.body(body.into()).unwrap()).await
    }

    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Answer {
        self.send_as(None, method, path, body).await
    }

    /// [`Harness::send`] with an API key (`Authorization: Bearer`).
    pub async fn send_as(
        &self,
        key: Option<&str>,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Answer {
        match body {
            Some(body) => {
                self.raw_as(
                    key,
                    method,
                    path,
                    Some("application/json"),
                    serde_json::to_vec(body).unwrap(),
                )
                .await
            }
            None => self.raw_as(key, method, path, None, Body::empty()).await,
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.send(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Answer {
        self.send(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(Method::DELETE, path, None).await
    }

    /// Registers `tenant` through BigBen's API with an HTTP sink.
    pub async fn register_http(&self, tenant: &str, url: &str) {
        let answer = self
            .post(
                "/events/tenant/register",
                &json!({ "tenant": tenant, "type": "HTTP", "props": { "url": url } }),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }

    /// Registers `tenant` with the built-in `log` processor.
    pub async fn register_log(&self, tenant: &str) {
        let answer = self
            .post(
                "/events/tenant/register",
                &json!({ "tenant": tenant, "type": "CUSTOM_CLASS",
                         "props": { "eventProcessorClass": "log" } }),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    }

    pub async fn event(&self, tenant: &str, id: &str) -> Option<EventRecord> {
        let key = EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap());
        self.store.get_event(&key).await.unwrap()
    }

    /// Everything stored: every tenant, and the events of every tenant and
    /// of `extra` tenants. Compared before and after a bad request.
    pub async fn snapshot(&self, extra: &[&str]) -> Value {
        let tenants = self.store.list_tenants().await.unwrap();
        let mut names: Vec<String> = tenants.iter().map(|t| t.name.to_string()).collect();
        names.extend(extra.iter().map(|s| s.to_string()));
        names.sort();
        names.dedup();
        let mut events = Vec::new();
        for name in names {
            let records = self
                .store
                .list_events(ListEventsParams {
                    tenant: TenantName::new(name).unwrap(),
                    status: None,
                    from: None,
                    to: None,
                    after: None,
                    limit: 100_000,
                })
                .await
                .unwrap();
            events.extend(records);
        }
        json!({
            "tenants": serde_json::to_value(&tenants).unwrap(),
            "events": serde_json::to_value(&events).unwrap(),
        })
    }

    /// Polls `find` until `eventStatus` is `status`; returns the last body.
    pub async fn wait_for_find_status(&self, tenant: &str, id: &str, status: &str) -> Value {
        let path = format!("/events/find?tenant={}&id={}", encode(tenant), encode(id));
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let answer = self.get(&path).await;
            if answer.body["eventStatus"] == status {
                return answer.body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{tenant}/{id} never reached {status}: last {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Percent-encodes one path segment or query value (everything but
/// unreserved characters, so `/` becomes `%2F`).
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant far in the future, so scheduled events stay pending.
pub const FUTURE: &str = "2099-01-31T04:00:30Z";

/// An RFC 3339 instant `offset_ms` from now (negative: in the past).
/// Polls `condition` until it holds, or fails with `what` at the deadline.
pub async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn from_now(offset_ms: i64) -> String {
    use belfry_core::Clock;
    belfry_core::Timestamp::from_millis(SystemClock.now().as_millis() + offset_ms).to_rfc3339()
}

/// Sends `request` to `app` (any node's router) and reads its answer.
pub async fn send_to(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Answer {
        status,
        body,
        content_type,
        headers,
    }
}
