//! What authentication costs per request: the same read
//! (`GET /v1/tenants/acme/events/e1`) through the whole router, open (no
//! key stored) and with a tenant key (the key cache warm, as in steady
//! state), on one thread. Prints the best of several rounds per variant.
//!
//! `cargo run --release -p belfry-api --example auth_cost`
//!
//! Wall-clock numbers on a shared machine are noisy; for instruction counts
//! run one variant at two request counts under callgrind and divide the
//! difference (setup cancels out):
//! `AUTH_COST_ONLY=key AUTH_COST_REQUESTS=2000 valgrind --tool=callgrind
//! target/release/examples/auth_cost` (and `=open`, and `=12000`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use belfry_api::{ApiOptions, ApiState, Auth, AuthOptions, SingleNode};
use belfry_clock::SystemClock;
use belfry_core::auth::{ApiKey, KeySecret, Role};
use belfry_core::{Clock, PartitionCount, TenantName};
use belfry_engine::{Engine, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::{EmbeddedOptions, EmbeddedStore, SharedStore};
use tower::ServiceExt;

const REQUESTS: u32 = 20_000;
const ROUNDS: usize = 5;

fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    belfry_testkit::install_crypto_provider();
    let dir = tempfile::tempdir().expect("temp dir");
    let open_store: SharedStore = Arc::new(
        EmbeddedStore::open(EmbeddedOptions::new(
            dir.path().join("open"),
            PartitionCount::new(4).expect("4"),
        ))
        .expect("store"),
    );
    let keyed_store: SharedStore = Arc::new(
        EmbeddedStore::open(EmbeddedOptions::new(
            dir.path().join("keyed"),
            PartitionCount::new(4).expect("4"),
        ))
        .expect("store"),
    );
    let secret = KeySecret::generate().expect("secret");
    let key = ApiKey::new(
        &secret,
        Some(TenantName::new("acme").expect("name")),
        Role::Read,
        SystemClock.now(),
        None,
    )
    .expect("key");
    keyed_store.put_api_key(key).await.expect("store the key");

    let requests = env_number("AUTH_COST_REQUESTS", REQUESTS);
    let rounds = env_number("AUTH_COST_ROUNDS", ROUNDS as u32) as usize;
    let only = std::env::var("AUTH_COST_ONLY").unwrap_or_default();
    let mut results = Vec::new();
    for (name, store, bearer) in [
        ("open (no key)", open_store, None),
        ("tenant key", keyed_store, Some(secret.expose().to_string())),
    ] {
        let variant = if bearer.is_some() { "key" } else { "open" };
        if !only.is_empty() && only != variant {
            continue;
        }
        let engine = Engine::start(
            EngineOptions::default(),
            store.clone(),
            Sinks::new(Default::default()).expect("sinks"),
            Arc::new(SystemClock),
        );
        let state = ApiState {
            engine: engine.handle(),
            options: ApiOptions::default(),
            cluster: Arc::new(SingleNode {
                address: "127.0.0.1:8080".into(),
            }),
            auth: Arc::new(Auth::new(
                AuthOptions::default(),
                store,
                "127.0.0.1:8080".parse().expect("addr"),
                Arc::new(SystemClock),
            )),
            metrics: None,
        };
        let app = belfry_api::router(state);
        let request = || {
            let mut builder = Request::get("/v1/tenants/acme/events/e1");
            if let Some(secret) = &bearer {
                builder = builder.header("authorization", format!("Bearer {secret}"));
            }
            builder.body(Body::empty()).expect("request")
        };
        // Warm up (the key cache, the open-mode check).
        for _ in 0..1_000 {
            let answer = app.clone().oneshot(request()).await.expect("answer");
            assert_eq!(answer.status(), 404, "{name}");
        }
        let mut best = Duration::MAX;
        for _ in 0..rounds {
            let started = Instant::now();
            for _ in 0..requests {
                let _ = app.clone().oneshot(request()).await.expect("answer");
            }
            best = best.min(started.elapsed());
        }
        let per_request = best / requests;
        println!("{name:>14}: {per_request:?} per request (best of {rounds} × {requests})");
        results.push(per_request);
        drop(app);
        engine.shutdown().await;
    }
    if let [open, keyed] = results[..] {
        println!(
            "authentication adds {:?} per request",
            keyed.saturating_sub(open)
        );
    }
}
