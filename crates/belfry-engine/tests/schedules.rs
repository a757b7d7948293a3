//! Recurring schedules against the real embedded store and a real webhook
//! receiver.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use belfry_clock::SystemClock;
use belfry_core::schedule::{DEFAULT_CATCH_UP_WINDOW, Progress};
use belfry_core::tenant::HttpTarget;
use belfry_core::{
    Clock, DeliveryOption, EventStatus, ManualClock, MisfirePolicy, PartitionCount, Schedule,
    ScheduleId, ScheduleStatus, SinkConfig, TenantConfig, TenantName, Timestamp,
};
use belfry_engine::{Engine, EngineHandle, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::{EmbeddedOptions, EmbeddedStore, SharedStore};
use belfry_testkit::{Receiver, RecordedRequest};

const DEADLINE: Duration = Duration::from_secs(30);

fn start(dir: &Path, clock: Arc<dyn Clock>, options: EngineOptions) -> Engine {
    belfry_testkit::install_crypto_provider();
    let store: SharedStore = Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.to_path_buf(),
            partitions: PartitionCount::new(8).unwrap(),
            writers: None,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap(),
    );
    let sinks = Sinks::new(Default::default()).unwrap();
    Engine::start(options, store, sinks, clock)
}

async fn register(handle: &EngineHandle, receiver: &Receiver) {
    let tenant = tenant();
    handle
        .tenants()
        .put(TenantConfig {
            name: tenant.clone(),
            sink: SinkConfig::Http(HttpTarget {
                url: receiver.url("/hook"),
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

fn tenant() -> TenantName {
    TenantName::new("t").unwrap()
}

fn definition(id: &str, expression: &str, payload: &str) -> Schedule {
    let now = Timestamp::from_millis(0);
    Schedule {
        id: ScheduleId::new(id).unwrap(),
        expression: expression.into(),
        kind: "EVERY".into(),
        time_zone: "UTC".into(),
        payload: Some(payload.into()),
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
}

fn of_schedule<'a>(requests: &'a [RecordedRequest], id: &str) -> Vec<&'a RecordedRequest> {
    let prefix = format!("{id}@");
    requests
        .iter()
        .filter(|r| {
            r.header("x-belfry-event-id")
                .is_some_and(|e| e.starts_with(&prefix))
        })
        .collect()
}

async fn wait_for(receiver: &Receiver, id: &str, count: usize) -> Vec<RecordedRequest> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let all = receiver.requests();
        let seen: Vec<RecordedRequest> = of_schedule(&all, id).into_iter().cloned().collect();
        if seen.len() >= count {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} deliveries of {id}",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each occurrence once, in order, with its id as the idempotency key,
/// never before its instant.
fn assert_once_in_order(requests: &[RecordedRequest]) {
    let ids: Vec<&str> = requests
        .iter()
        .map(|r| r.header("x-belfry-event-id").unwrap())
        .collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "duplicate deliveries: {ids:?}");
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "out of order");
    for request in requests {
        let id = request.header("x-belfry-event-id").unwrap();
        assert_eq!(request.header("idempotency-key"), Some(id));
        let instant = Timestamp::parse_rfc3339(id.split_once('@').unwrap().1).unwrap();
        assert!(
            request.arrived_at_ms >= instant.as_millis(),
            "{id} arrived early"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_delivers_each_occurrence_once_in_order_and_is_managed_live() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), Arc::new(SystemClock), EngineOptions::default());
    let handle = engine.handle();
    let receiver = Receiver::start().await;
    register(&handle, &receiver).await;
    let tenant = tenant();
    let id = ScheduleId::new("tick").unwrap();

    let (_, state) = handle
        .schedules()
        .put(&tenant, definition("tick", "@every 1s", "v1"))
        .await
        .unwrap();
    assert!(state.next_occurrence.is_some());
    let first = wait_for(&receiver, "tick", 3).await;
    assert_once_in_order(&first);
    assert!(first.iter().all(|r| r.body_text() == "v1"));

    // Update: the payload changes from the next occurrences on.
    handle
        .schedules()
        .put(&tenant, definition("tick", "@every 1s", "v2"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !of_schedule(&receiver.requests(), "tick")
        .iter()
        .any(|r| r.body_text() == "v2")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "update never took effect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Pause: nothing more arrives (beyond one already in flight).
    let paused = handle.schedules().pause(&tenant, &id).await.unwrap();
    assert_eq!(paused.schedule.status, ScheduleStatus::Paused);
    assert_eq!(paused.next_occurrence, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_pause = of_schedule(&receiver.requests(), "tick").len();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(of_schedule(&receiver.requests(), "tick").len(), at_pause);
    let shown = handle.schedules().get(&tenant, &id).await.unwrap().unwrap();
    assert_eq!(shown.schedule.status, ScheduleStatus::Paused);

    // Resume: deliveries go on.
    handle.schedules().resume(&tenant, &id).await.unwrap();
    let resumed = wait_for(&receiver, "tick", at_pause + 2).await;
    assert_once_in_order(&resumed);

    // History: every delivered occurrence is there, delivered (its
    // outcome is recorded just after the receiver saw it).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let history = handle
            .schedules()
            .occurrences(&tenant, &id, None, 1_000)
            .await
            .unwrap();
        let delivered: HashSet<String> = history
            .iter()
            .filter(|r| r.status == EventStatus::Delivered)
            .map(|r| r.key.id.as_str().to_string())
            .collect();
        if resumed
            .iter()
            .all(|r| delivered.contains(r.header("x-belfry-event-id").unwrap()))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deliveries missing from the history"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listed = handle.schedules().list(&tenant, None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].schedule.id, id);

    // Delete: it stops and is gone.
    handle.schedules().delete(&tenant, &id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_delete = of_schedule(&receiver.requests(), "tick").len();
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(of_schedule(&receiver.requests(), "tick").len(), at_delete);
    assert!(
        handle
            .schedules()
            .get(&tenant, &id)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        handle
            .schedules()
            .list(&tenant, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_once_in_order(
        &of_schedule(&receiver.requests(), "tick")
            .into_iter()
            .cloned()
            .collect::<Vec<_>>(),
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_and_maximum_complete_a_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), Arc::new(SystemClock), EngineOptions::default());
    let handle = engine.handle();
    let receiver = Receiver::start().await;
    register(&handle, &receiver).await;
    let mut limited = definition("three", "@every 1s", "x");
    limited.max_occurrences = Some(3);
    handle.schedules().put(&tenant(), limited).await.unwrap();
    let seen = wait_for(&receiver, "three", 3).await;
    assert_once_in_order(&seen);
    let id = ScheduleId::new("three").unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let state = handle
            .schedules()
            .get(&tenant(), &id)
            .await
            .unwrap()
            .unwrap();
        if state.schedule.status == ScheduleStatus::Completed {
            assert_eq!(state.next_occurrence, None);
            assert_eq!(state.schedule.progress.occurrences, 3);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(of_schedule(&receiver.requests(), "three").len(), 3);
    engine.shutdown().await;
}

/// Down for ten minutes with a schedule every 2 s: each policy records
/// every occurrence, delivers what it promises, and nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_each_misfire_policy_records_every_occurrence() {
    for (policy, name) in [
        (MisfirePolicy::FireOnce, "once"),
        (MisfirePolicy::FireAll { cap: 5 }, "all"),
        (MisfirePolicy::Skip, "skip"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let receiver = Receiver::start().await;
        let start_at = SystemClock.now();
        let start_at = Timestamp::from_millis(start_at.as_millis() / 10_000 * 10_000);
        let clock = Arc::new(ManualClock::new(start_at));
        let id = ScheduleId::new(name).unwrap();
        let mut schedule = definition(name, "@every 2s", name);
        schedule.misfire = policy;

        // Record every missed occurrence one by one (the default caps them
        // at 100 per firing and counts the rest).
        let options = EngineOptions {
            schedule_max_missed_recorded: 1_000,
            ..EngineOptions::default()
        };
        let engine = start(dir.path(), clock.clone(), options.clone());
        let handle = engine.handle();
        register(&handle, &receiver).await;
        handle.schedules().put(&tenant(), schedule).await.unwrap();
        // The first firing creates what is due within the lead (5 s).
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while handle
            .schedules()
            .occurrences(&tenant(), &id, None, 100)
            .await
            .unwrap()
            .len()
            < 2
        {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        engine.shutdown().await;
        drop(handle);

        let down_until = start_at.plus(Duration::from_secs(600));
        clock.set(down_until);
        let engine = start(dir.path(), clock.clone(), options);
        let handle = engine.handle();
        // Every occurrence up to now + lead exists once planning caught up.
        let expected = 302; // 2 s .. 604 s
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let history = loop {
            let history = handle
                .schedules()
                .occurrences(&tenant(), &id, None, 1_000)
                .await
                .unwrap();
            if history.len() >= expected
                && history
                    .iter()
                    .all(|r| r.status != EventStatus::Scheduled || r.event_time > down_until)
            {
                break history;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: {} occurrences",
                history.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(history.len(), expected, "{name}");
        let late_before = down_until.minus(Duration::from_secs(60)).as_millis();
        let created_before_downtime = start_at.plus(Duration::from_secs(5)).as_millis();
        let delivered_late: Vec<i64> = history
            .iter()
            .filter(|r| r.event_time.as_millis() < late_before)
            .filter(|r| r.event_time.as_millis() > created_before_downtime)
            .filter(|r| r.status == EventStatus::Delivered)
            .map(|r| (r.event_time.as_millis() - start_at.as_millis()) / 1_000)
            .collect();
        let missed = history
            .iter()
            .filter(|r| r.status == EventStatus::Missed)
            .count();
        let (expected_late, expected_missed) = match policy {
            MisfirePolicy::FireOnce => (vec![538], 266),
            MisfirePolicy::FireAll { .. } => (vec![530, 532, 534, 536, 538], 262),
            MisfirePolicy::Skip => (vec![], 267),
        };
        assert_eq!(delivered_late, expected_late, "{name}");
        assert_eq!(missed, expected_missed, "{name}");
        assert!(history.iter().all(|r| r.status != EventStatus::Failed));
        let requests = receiver.requests();
        let deliveries: Vec<RecordedRequest> =
            of_schedule(&requests, name).into_iter().cloned().collect();
        let ids: HashSet<&str> = deliveries
            .iter()
            .map(|r| r.header("x-belfry-event-id").unwrap())
            .collect();
        let mut dup: Vec<(&str, Option<&str>, i64)> = deliveries
            .iter()
            .map(|r| {
                (
                    r.header("x-belfry-event-id").unwrap(),
                    r.header("x-belfry-attempt"),
                    r.arrived_at_ms,
                )
            })
            .collect();
        dup.sort();
        assert_eq!(
            ids.len(),
            deliveries.len(),
            "{name}: a duplicate delivery {dup:?}"
        );
        engine.shutdown().await;
    }
}
