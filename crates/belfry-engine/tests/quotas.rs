//! Per-tenant quotas through the engine handle, on the real embedded store,
//! with a manual clock (so the estimates' ages are exact); per-tenant
//! delivery limits with the system clock and a real webhook receiver.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::time::Duration;

use belfry_clock::SystemClock;
use belfry_core::event::{DeliveryOption, EventCommand};
use belfry_core::schedule::{
    DEFAULT_CATCH_UP_WINDOW, MisfirePolicy, Progress, Schedule, ScheduleId, ScheduleStatus,
};
use belfry_core::tenant::HttpTarget;
use belfry_core::{
    Clock, EventId, EventKey, EventVersion, ManualClock, PartitionCount, SinkConfig, TenantConfig,
    TenantName, Timestamp,
};
use belfry_engine::quotas::{LimitsOptions, QuotaError, QuotaExceeded, TenantLimits};
use belfry_engine::schedules::ScheduleOpError;
use belfry_engine::{Engine, EngineHandle, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::{EmbeddedOptions, EmbeddedStore, KeyedCommand, SharedStore};
use belfry_testkit::{Receiver, Response, Rule};

const FAR: i64 = 4_000_000_000_000;

struct Node {
    engine: Option<Engine>,
    handle: EngineHandle,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

impl Node {
    /// With the manual clock.
    fn start(quotas: LimitsOptions) -> Node {
        Node::start_with(quotas, true)
    }

    /// With the manual clock, or the system clock (deliveries need real
    /// time to pass).
    fn start_with(quotas: LimitsOptions, manual_clock: bool) -> Node {
        belfry_testkit::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let store: SharedStore = Arc::new(
            EmbeddedStore::open(EmbeddedOptions {
                data_dir: dir.path().to_path_buf(),
                partitions: PartitionCount::new(4).unwrap(),
                writers: None,
                clock: std::sync::Arc::new(belfry_clock::SystemClock),
            })
            .unwrap(),
        );
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let options = EngineOptions {
            limits: quotas,
            ..EngineOptions::default()
        };
        let sinks = Sinks::new(Default::default()).unwrap();
        let engine_clock: Arc<dyn Clock> = if manual_clock {
            clock.clone()
        } else {
            Arc::new(SystemClock)
        };
        let engine = Engine::start(options, store, sinks, engine_clock);
        let handle = engine.handle();
        Node {
            engine: Some(engine),
            handle,
            clock,
            _dir: dir,
        }
    }

    /// Checks, then applies (as the API does).
    async fn write(&self, commands: Vec<KeyedCommand>) -> Result<(), QuotaExceeded> {
        match self.handle.quotas().check(&commands).await {
            Ok(()) => {}
            Err(QuotaError::Exceeded(exceeded)) => return Err(exceeded),
            Err(QuotaError::Store(error)) => panic!("store: {error}"),
        }
        self.handle.apply(commands).await.unwrap();
        Ok(())
    }

    async fn stop(mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown().await;
        }
    }
}

fn tenant(name: &str) -> TenantName {
    TenantName::new(name).unwrap()
}

fn key(tenant_name: &str, id: &str) -> EventKey {
    EventKey::new(tenant(tenant_name), EventId::new(id).unwrap())
}

fn upsert(tenant_name: &str, id: &str, at: i64, payload: &str) -> KeyedCommand {
    KeyedCommand {
        key: key(tenant_name, id),
        command: EventCommand::Upsert {
            event_time: Timestamp::from_millis(at),
            payload: Some(payload.to_string()),
            delivery: DeliveryOption::FullEvent,
            new_version: EventVersion::generate(),
            settings: Default::default(),
        },
        fence: None,
    }
}

fn cancel(tenant_name: &str, id: &str) -> KeyedCommand {
    KeyedCommand {
        key: key(tenant_name, id),
        command: EventCommand::Cancel,
        fence: None,
    }
}

fn quotas(pending: u64, schedules: u64, payload: usize) -> LimitsOptions {
    LimitsOptions {
        max_pending_events_per_tenant: pending,
        max_schedules_per_tenant: schedules,
        max_payload_bytes: payload,
        count_refresh: Duration::from_secs(10),
        tenants: Default::default(),
        ..LimitsOptions::unlimited()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_events_are_capped_per_tenant_and_updates_do_not_count() {
    let node = Node::start(quotas(5, 0, 0));
    let batch = (0..4)
        .map(|i| upsert("a", &format!("e{i}"), FAR, "p"))
        .collect();
    node.write(batch).await.unwrap();
    // A request that would pass the quota is refused whole.
    let two = vec![upsert("a", "e4", FAR, "p"), upsert("a", "e5", FAR, "p")];
    assert_eq!(
        node.write(two).await.unwrap_err(),
        QuotaExceeded::PendingEvents {
            tenant: tenant("a"),
            limit: 5
        }
    );
    assert!(
        node.handle
            .store()
            .get_event(&key("a", "e4"))
            .await
            .unwrap()
            .is_none()
    );
    node.write(vec![upsert("a", "e4", FAR, "p")]).await.unwrap();
    let refused = node.write(vec![upsert("a", "e5", FAR, "p")]).await;
    assert!(refused.is_err(), "the sixth is refused");
    // Moving an event that is already pending is not a new one.
    node.write(vec![upsert("a", "e0", FAR + 1, "moved")])
        .await
        .unwrap();
    // Other tenants have their own quota.
    node.write(vec![upsert("b", "e0", FAR, "p")]).await.unwrap();
    // A cancel frees a place at once (this node saw it).
    node.write(vec![cancel("a", "e1")]).await.unwrap();
    node.write(vec![upsert("a", "e5", FAR, "p")]).await.unwrap();
    assert!(node.write(vec![upsert("a", "e6", FAR, "p")]).await.is_err());
    // Re-creating the cancelled event is a new pending one: refused too.
    assert!(node.write(vec![upsert("a", "e1", FAR, "p")]).await.is_err());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn places_freed_behind_the_estimates_back_are_found_by_a_recount() {
    let node = Node::start(quotas(3, 0, 0));
    let batch = (0..3)
        .map(|i| upsert("a", &format!("e{i}"), FAR, "p"))
        .collect();
    node.write(batch).await.unwrap();
    assert!(node.write(vec![upsert("a", "e3", FAR, "p")]).await.is_err());
    // Finished without this handle seeing it (as deliveries and other
    // nodes' writes are): straight through the store.
    node.handle
        .store()
        .apply(belfry_store::ApplyParams {
            commands: vec![cancel("a", "e0")],
            now: node.handle.now(),
            retry: Default::default(),
        })
        .await
        .unwrap();
    // Within a second of the last count the estimate stands...
    assert!(node.write(vec![upsert("a", "e3", FAR, "p")]).await.is_err());
    // ...after it, a refusal is checked against a new count.
    node.clock.advance(Duration::from_secs(2));
    node.write(vec![upsert("a", "e3", FAR, "p")]).await.unwrap();
    assert!(node.write(vec![upsert("a", "e4", FAR, "p")]).await.is_err());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_payload_is_refused_and_no_limit_means_none() {
    let node = Node::start(quotas(0, 0, 10));
    node.write(vec![upsert("a", "small", FAR, "0123456789")])
        .await
        .unwrap();
    let refused = node
        .write(vec![
            upsert("a", "ok", FAR, "x"),
            upsert("a", "big", FAR, "0123456789A"),
        ])
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        QuotaExceeded::PayloadTooLarge {
            size: 11,
            limit: 10
        }
    );
    assert!(
        node.handle
            .store()
            .get_event(&key("a", "ok"))
            .await
            .unwrap()
            .is_none()
    );
    // No pending limit: many events pass.
    let batch = (0..200)
        .map(|i| upsert("a", &format!("n{i}"), FAR, "p"))
        .collect();
    node.write(batch).await.unwrap();
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_capped_per_tenant() {
    let node = Node::start(quotas(0, 2, 0));
    let a = tenant("a");
    let schedule = |id: &str| {
        let now = Timestamp::from_millis(0);
        Schedule {
            id: ScheduleId::new(id).unwrap(),
            expression: "@every 1h".into(),
            kind: "EVERY".into(),
            time_zone: "UTC".into(),
            payload: Some("p".into()),
            delivery: DeliveryOption::PayloadOnly,
            start_at: None,
            end_at: None,
            max_occurrences: None,
            misfire: MisfirePolicy::FireOnce,
            catch_up_window: DEFAULT_CATCH_UP_WINDOW,
            status: ScheduleStatus::Active,
            created_at: now,
            updated_at: now,
            progress: Progress::starting_after(now),
            settings: Default::default(),
        }
    };
    node.handle
        .schedules()
        .put(&a, schedule("s1"))
        .await
        .unwrap();
    node.handle
        .schedules()
        .put(&a, schedule("s2"))
        .await
        .unwrap();
    match node.handle.schedules().put(&a, schedule("s3")).await {
        Err(ScheduleOpError::Quota(QuotaExceeded::Schedules { limit: 2, .. })) => {}
        other => panic!("{other:?}"),
    }
    // Replacing an existing one is not a new one.
    node.handle
        .schedules()
        .put(&a, schedule("s2"))
        .await
        .unwrap();
    node.handle
        .schedules()
        .put(&tenant("b"), schedule("s3"))
        .await
        .unwrap();
    node.handle
        .schedules()
        .delete(&a, &schedule("s1").id)
        .await
        .unwrap();
    node.handle
        .schedules()
        .put(&a, schedule("s3"))
        .await
        .unwrap();
    node.stop().await;
}

async fn register(node: &Node, name: &str, receiver: &Receiver) {
    node.handle
        .tenants()
        .put(TenantConfig {
            name: tenant(name),
            sink: SinkConfig::Http(HttpTarget {
                url: receiver.url(&format!("/{name}")),
                headers: Default::default(),
                timeout_ms: Some(5_000),
                delivery: Default::default(),
            }),
            signing: None,
            notify: None,
        })
        .await
        .unwrap();
}

/// Arrival times (ms) of the deliveries to `/{name}`, sorted.
fn arrivals(receiver: &Receiver, name: &str) -> Vec<i64> {
    let path = format!("/{name}");
    let mut times: Vec<i64> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| r.arrived_at_ms)
        .collect();
    times.sort_unstable();
    times
}

fn delivery_limits(
    name: &str,
    per_second: Option<u32>,
    concurrent: Option<usize>,
) -> LimitsOptions {
    let mut options = quotas(0, 0, 0);
    options.tenants.insert(
        name.to_string(),
        TenantLimits {
            max_deliveries_per_second: per_second,
            max_concurrent_deliveries: concurrent,
            ..TenantLimits::default()
        },
    );
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_delivery_rate_spaces_its_deliveries_and_drops_none() {
    let receiver = Receiver::start().await;
    let node = Node::start_with(delivery_limits("slow", Some(5), None), false);
    register(&node, "slow", &receiver).await;
    register(&node, "free", &receiver).await;
    let now = node.handle.now().as_millis();
    let mut commands = Vec::new();
    for i in 0..12 {
        commands.push(upsert("slow", &format!("s{i}"), now, "p"));
        commands.push(upsert("free", &format!("f{i}"), now, "p"));
    }
    node.handle.apply(commands).await.unwrap();
    receiver
        .wait_for_count(24, Duration::from_secs(60))
        .await
        .unwrap();
    let slow = arrivals(&receiver, "slow");
    let free = arrivals(&receiver, "free");
    assert_eq!(slow.len(), 12, "none dropped");
    assert_eq!(free.len(), 12);
    // A burst of one second's worth (5), then one every 200 ms: the last
    // of the 7 others comes at least ~1.4 s after the first.
    let span = slow[11] - slow[0];
    assert!(span >= 1_200, "12 deliveries at 5/s took only {span} ms");
    // The other tenant was not held back by it.
    assert!(
        free[11] < slow[11],
        "the unlimited tenant finished after the limited one"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_concurrency_limit_holds_its_deliveries_one_at_a_time() {
    let receiver = Receiver::start().await;
    receiver.push_rule(Rule::always(
        Response::status(200).with_delay(Duration::from_millis(300)),
    ));
    let node = Node::start_with(delivery_limits("one", None, Some(1)), false);
    register(&node, "one", &receiver).await;
    let now = node.handle.now().as_millis();
    let commands = (0..4)
        .map(|i| upsert("one", &format!("e{i}"), now, "p"))
        .collect();
    node.handle.apply(commands).await.unwrap();
    receiver
        .wait_for_count(4, Duration::from_secs(60))
        .await
        .unwrap();
    let times = arrivals(&receiver, "one");
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= 250,
            "a delivery started before the previous one was answered: {times:?}"
        );
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_quota_replaces_the_node_wide_one() {
    let mut options = quotas(3, 1, 0);
    options.tenants.insert(
        "small".into(),
        TenantLimits {
            max_pending_events: Some(1),
            ..TenantLimits::default()
        },
    );
    options.tenants.insert(
        "big".into(),
        TenantLimits {
            max_pending_events: Some(5),
            max_schedules: Some(0),
            ..TenantLimits::default()
        },
    );
    let node = Node::start(options);
    node.write(vec![upsert("small", "e0", FAR, "p")])
        .await
        .unwrap();
    assert!(
        node.write(vec![upsert("small", "e1", FAR, "p")])
            .await
            .is_err()
    );
    let five = (0..5)
        .map(|i| upsert("big", &format!("e{i}"), FAR, "p"))
        .collect();
    node.write(five).await.unwrap();
    assert!(
        node.write(vec![upsert("big", "e5", FAR, "p")])
            .await
            .is_err()
    );
    // Everyone else: the node-wide quota.
    let three = (0..3)
        .map(|i| upsert("other", &format!("e{i}"), FAR, "p"))
        .collect();
    node.write(three).await.unwrap();
    assert!(
        node.write(vec![upsert("other", "e3", FAR, "p")])
            .await
            .is_err()
    );
    node.stop().await;
}
