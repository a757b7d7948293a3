//! The bulk action runner against the real embedded store: a claim that
//! lapsed (its runner died) is taken over and the work resumes after the
//! saved cursor; a clean shutdown gives the claim up and the next start
//! finishes the action.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::time::Duration;

use belfry_clock::SystemClock;
use belfry_core::bulk::{
    BulkAction, BulkActionId, BulkClaim, BulkCursor, BulkFilter, BulkKind, BulkProgress, BulkState,
    StatusFilter,
};
use belfry_core::event::{DeliveryOption, EventCommand};
use belfry_core::{
    Clock, EventId, EventKey, EventStatus, EventVersion, ManualClock, PartitionCount, TenantName,
    Timestamp,
};
use belfry_engine::{Engine, EngineHandle, EngineOptions};
use belfry_sinks::Sinks;
use belfry_store::{
    ApplyParams, CountEventsParams, EmbeddedOptions, EmbeddedStore, KeyedCommand, SharedStore,
};

const DEADLINE: Duration = Duration::from_secs(30);

fn open_store(dir: &std::path::Path) -> SharedStore {
    Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.to_path_buf(),
            partitions: PartitionCount::new(4).unwrap(),
            writers: None,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .unwrap(),
    )
}

fn tenant() -> TenantName {
    TenantName::new("acme").unwrap()
}

fn id(i: usize) -> String {
    format!("e{i:04}")
}

/// `n` events of `acme`, far in the future; the first `cancelled` of them
/// cancelled.
async fn events(store: &SharedStore, n: usize, cancelled: usize) {
    let command = |i: usize, command| KeyedCommand {
        key: EventKey::new(tenant(), EventId::new(id(i)).unwrap()),
        command,
        fence: None,
    };
    let mut commands: Vec<_> = (0..n)
        .map(|i| {
            command(
                i,
                EventCommand::Upsert {
                    event_time: Timestamp::from_millis(4_000_000_000_000 + i as i64),
                    payload: None,
                    delivery: DeliveryOption::FullEvent,
                    new_version: EventVersion::generate(),
                    settings: Default::default(),
                },
            )
        })
        .collect();
    commands.extend((0..cancelled).map(|i| command(i, EventCommand::Cancel)));
    store
        .apply(ApplyParams {
            commands,
            now: SystemClock.now(),
            retry: Default::default(),
        })
        .await
        .unwrap();
}

async fn count(store: &SharedStore, status: EventStatus) -> u64 {
    store
        .count_events(CountEventsParams {
            tenant: tenant(),
            status,
            at_most: 1_000_000,
        })
        .await
        .unwrap()
}

/// Polls the stored action until `done` says so.
async fn wait_for(
    handle: &EngineHandle,
    id: &BulkActionId,
    what: &str,
    done: impl Fn(&BulkAction) -> bool,
) -> BulkAction {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let action = handle.store().get_bulk_action(id).await.unwrap().unwrap();
        if done(&action) {
            return action;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {what}: {action:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn cancel_all(status: Option<EventStatus>, now: Timestamp) -> BulkAction {
    BulkAction::new(
        BulkActionId::generate(now).unwrap(),
        BulkKind::Cancel,
        BulkFilter {
            tenant: tenant(),
            status: status.map(StatusFilter::Event),
            from: None,
            to: None,
        },
        Some("key_test".into()),
        now,
    )
}

/// A runner died after handling the first 100 events (its progress and
/// cursor are saved, its claim runs until `start + 15 s`). Once the claim
/// lapsed on another node's clock, that node takes the action over and
/// continues after the cursor: the 100 are not listed again (the filter
/// has no status, so they would have been, as skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_claim_is_taken_over_and_resumes_after_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    events(&store, 300, 100).await;
    let start = Timestamp::from_millis(1_700_000_000_000);
    let clock = Arc::new(ManualClock::new(start));
    // Created a second earlier than the marker below: listed before it.
    let mut abandoned = cancel_all(None, start.minus(Duration::from_secs(1)));
    abandoned.progress = BulkProgress {
        matched: 100,
        succeeded: 100,
        skipped: 0,
        failed: 0,
    };
    abandoned.cursor = Some(BulkCursor {
        at: Some(Timestamp::from_millis(4_000_000_000_000 + 99)),
        id: id(99),
    });
    abandoned.claim = Some(BulkClaim {
        runner: "runner_dead".into(),
        until: start.plus(Duration::from_secs(15)),
    });
    assert!(store.create_bulk_action(abandoned.clone()).await.unwrap());

    let options = EngineOptions {
        bulk_page_size: 64,
        shutdown_grace: Duration::from_millis(500),
        ..EngineOptions::default()
    };
    let sinks = Sinks::new(Default::default()).unwrap();
    let engine = Engine::start_unowned(options, store.clone(), sinks, clock.clone());
    let handle = engine.handle();
    // A newer action with nothing to do: once it completed, the runner has
    // looked at the abandoned one (listed before it) and left it alone.
    let marker = BulkAction {
        filter: BulkFilter {
            tenant: TenantName::new("nobody").unwrap(),
            ..abandoned.filter.clone()
        },
        ..cancel_all(None, start)
    };
    assert!(handle.bulk().create(marker.clone()).await.unwrap());
    wait_for(&handle, &marker.id, "completed", |a| {
        a.state == BulkState::Completed
    })
    .await;
    let untouched = store.get_bulk_action(&abandoned.id).await.unwrap().unwrap();
    assert_eq!(
        untouched, abandoned,
        "claimed by another runner until it lapses"
    );

    clock.advance(Duration::from_secs(16));
    handle.bulk().poke();
    let done = wait_for(&handle, &abandoned.id, "completed", |a| {
        a.state == BulkState::Completed
    })
    .await;
    assert_eq!(
        done.progress,
        BulkProgress {
            matched: 300,
            succeeded: 300,
            skipped: 0,
            failed: 0
        }
    );
    assert_eq!(done.claim, None);
    assert_eq!(done.finished_at, Some(clock.now()));
    assert_eq!(count(&store, EventStatus::Cancelled).await, 300);
    engine.shutdown().await;
}

/// A clean shutdown stops a running action between pages and gives its
/// claim up; the next start resumes it at once and finishes it, every
/// event handled exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_gives_the_claim_up_and_the_next_start_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    events(&store, 1_000, 0).await;
    let options = EngineOptions {
        bulk_page_size: 50,
        // 20 pages take at least 4 s: the shutdown lands half way.
        bulk_page_pause: Duration::from_millis(200),
        shutdown_grace: Duration::from_millis(500),
        ..EngineOptions::default()
    };
    let start = |options: EngineOptions| {
        Engine::start(
            options,
            store.clone(),
            Sinks::new(Default::default()).unwrap(),
            Arc::new(SystemClock),
        )
    };
    let engine = start(options.clone());
    let handle = engine.handle();
    let action = cancel_all(Some(EventStatus::Scheduled), handle.now());
    assert!(handle.bulk().create(action.clone()).await.unwrap());
    wait_for(&handle, &action.id, "a first page", |a| {
        a.progress.matched > 0
    })
    .await;
    engine.shutdown().await;

    let paused = store.get_bulk_action(&action.id).await.unwrap().unwrap();
    assert_eq!(paused.state, BulkState::Running);
    assert_eq!(paused.claim, None, "given up at the shutdown");
    assert!(paused.progress.matched < 1_000, "{paused:?}");
    assert!(paused.progress.is_balanced());
    assert_eq!(
        count(&store, EventStatus::Cancelled).await,
        paused.progress.succeeded
    );

    let engine = start(EngineOptions {
        bulk_page_pause: Duration::ZERO,
        ..options
    });
    let handle = engine.handle();
    let done = wait_for(&handle, &action.id, "completed", |a| {
        a.state == BulkState::Completed
    })
    .await;
    assert_eq!(done.progress.matched, 1_000, "{done:?}");
    assert_eq!(done.progress.succeeded, 1_000, "{done:?}");
    assert_eq!(count(&store, EventStatus::Cancelled).await, 1_000);
    assert_eq!(count(&store, EventStatus::Scheduled).await, 0);
    engine.shutdown().await;
}
