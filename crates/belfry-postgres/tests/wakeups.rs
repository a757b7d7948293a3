//! LISTEN/NOTIFY wake-ups: client changes of near-term events reach every
//! subscriber at commit; far-away events and owners' own writes do not.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod support;

use belfry_core::event::{AttemptReport, EventCommand};
use belfry_core::{EventKey, EventVersion, PartitionCount, Timestamp, Verdict};
use belfry_postgres::{PostgresStore, Wakeup, WakeupKind};
use belfry_store::{KeyedCommand, Store};
use belfry_testkit::PgServer;
use support::{DEADLINE, fenced, fresh_store, key, options, params, upsert};
use tokio::sync::mpsc::Receiver;

/// `now` of every apply; the horizon is 60 s.
const NOW: i64 = 1_000_000;

async fn next(wakeups: &mut Receiver<Wakeup>) -> Wakeup {
    tokio::time::timeout(DEADLINE, wakeups.recv())
        .await
        .expect("a wake-up within the deadline")
        .expect("the subscription stays open")
}

fn timer(key: &EventKey, due: i64, kind: WakeupKind) -> Wakeup {
    Wakeup::Timer {
        partition: PartitionCount::new(4).unwrap().partition_of(key),
        key: key.clone(),
        due: Timestamp::from_millis(due),
        kind,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_changes_are_announced_and_far_ones_are_not() {
    let store = fresh_store(4).await;
    let mut wakeups = store.subscribe_wakeups();
    assert_eq!(
        next(&mut wakeups).await,
        Wakeup::Resync,
        "a subscription starts with a resync"
    );

    // Notifications come in commit order: once the near one arrives, an
    // announcement of the far one (committed first) would have come before.
    let far = key("far");
    let near = key("near");
    store
        .apply(params(NOW, vec![upsert(&far, NOW + 3_600_000, "f1")]))
        .await
        .unwrap();
    store
        .apply(params(NOW, vec![upsert(&near, NOW + 5_000, "n1")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&near, NOW + 5_000, WakeupKind::Arm)
    );

    // Moving the far event close announces only its arrival in the window.
    store
        .apply(params(NOW, vec![upsert(&far, NOW + 2_000, "f2")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&far, NOW + 2_000, WakeupKind::Arm)
    );

    // A cancel takes it out again.
    store
        .apply(params(
            NOW,
            vec![KeyedCommand {
                key: near.clone(),
                command: EventCommand::Cancel,
                fence: None,
            }],
        ))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&near, NOW + 5_000, WakeupKind::Disarm)
    );

    // The owner's own outcome (fenced) is not announced; the marker after
    // it is the next thing to arrive.
    let retry = KeyedCommand {
        key: far.clone(),
        command: EventCommand::RecordAttempt {
            version: EventVersion::from_string("f2".into()),
            number: 1,
            report: AttemptReport {
                started_at: Timestamp::from_millis(NOW + 2_000),
                duration_ms: 1,
                verdict: Verdict::Retry,
                http_status: Some(503),
                error: None,
                steer: None,
            },
            tenant: Default::default(),
        },
        fence: None,
    };
    let partition = PartitionCount::new(4).unwrap().partition_of(&far).0;
    store
        .apply(params(NOW + 2_001, vec![fenced(retry, partition, 0)]))
        .await
        .unwrap();
    let marker = key("marker");
    store
        .apply(params(NOW, vec![upsert(&marker, NOW + 1, "m")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&marker, NOW + 1, WakeupKind::Arm)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_spans_several_notifications_and_all_arrive() {
    let store = fresh_store(4).await;
    let mut wakeups = store.subscribe_wakeups();
    assert_eq!(next(&mut wakeups).await, Wakeup::Resync);
    // Long ids: 500 entries need dozens of 8 kB notifications.
    let keys: Vec<EventKey> = (0..500)
        .map(|i| key(&format!("{}-{i}", "x".repeat(200))))
        .collect();
    let commands = keys.iter().map(|k| upsert(k, NOW + 10_000, "v")).collect();
    store.apply(params(NOW, commands)).await.unwrap();
    let mut seen = std::collections::HashSet::new();
    while seen.len() < keys.len() {
        match next(&mut wakeups).await {
            Wakeup::Timer {
                key,
                kind: WakeupKind::Arm,
                ..
            } => {
                seen.insert(key);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(keys.iter().all(|k| seen.contains(k)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscriber_hears_every_change() {
    let url = PgServer::shared().fresh_database().await;
    let store = PostgresStore::connect(options(url.clone(), 4))
        .await
        .unwrap();
    let other_node = PostgresStore::connect(options(url, 4)).await.unwrap();
    let mut here = store.subscribe_wakeups();
    let mut there = other_node.subscribe_wakeups();
    assert_eq!(next(&mut here).await, Wakeup::Resync);
    assert_eq!(next(&mut there).await, Wakeup::Resync);
    let k = key("shared");
    other_node
        .apply(params(NOW, vec![upsert(&k, NOW + 100, "v")]))
        .await
        .unwrap();
    let expected = timer(&k, NOW + 100, WakeupKind::Arm);
    assert_eq!(next(&mut here).await, expected);
    assert_eq!(next(&mut there).await, expected);
    // Dropping a subscription leaves the others working.
    drop(there);
    store
        .apply(params(NOW, vec![upsert(&k, NOW + 200, "w")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut here).await,
        timer(&k, NOW + 100, WakeupKind::Disarm)
    );
    assert_eq!(next(&mut here).await, timer(&k, NOW + 200, WakeupKind::Arm));
}

/// The horizon is measured on the writer's clock, the owner's window on its
/// own. An owner whose clock reads `NOW` has paged in everything due up to
/// `NOW + 60 s` and learns of a later change inside that range only from a
/// wake-up. A writer whose clock lags by 3 s (within the 5 s margin) must
/// still announce an event at that far edge; without the margin it did not,
/// and the event waited for a repair page instead of firing on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_writer_announces_events_at_the_edge_of_the_owners_window() {
    let store = fresh_store(4).await;
    let mut wakeups = store.subscribe_wakeups();
    assert_eq!(next(&mut wakeups).await, Wakeup::Resync);
    let (window, lag) = (60_000, 3_000);
    let owner_edge = NOW + window;

    let edge = key("edge");
    store
        .apply(params(NOW - lag, vec![upsert(&edge, owner_edge, "e1")]))
        .await
        .unwrap();
    // Commit order: had the edge event not been announced, the marker's
    // wake-up would come first.
    let marker = key("marker");
    store
        .apply(params(NOW, vec![upsert(&marker, NOW + 1, "m")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&edge, owner_edge, WakeupKind::Arm),
        "the edge of the owner's window is announced despite the lag"
    );
    assert_eq!(
        next(&mut wakeups).await,
        timer(&marker, NOW + 1, WakeupKind::Arm)
    );

    // Moving it away from the edge, by the lagging writer, takes it out.
    store
        .apply(params(
            NOW - lag,
            vec![upsert(&edge, NOW + 3_600_000, "e2")],
        ))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&edge, owner_edge, WakeupKind::Disarm)
    );

    // The horizon is inclusive: `now + window + margin` itself is announced.
    let last = key("last");
    store
        .apply(params(NOW, vec![upsert(&last, NOW + window + 5_000, "l")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&last, NOW + window + 5_000, WakeupKind::Arm)
    );
}

/// Beyond the margin nothing is announced (a lag that large is left to the
/// owner's repair pages); announcing every change would serialize every
/// client commit (see the `wakeups` module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_lagging_beyond_the_margin_announces_nothing_past_its_horizon() {
    let store = fresh_store(4).await;
    let mut wakeups = store.subscribe_wakeups();
    assert_eq!(next(&mut wakeups).await, Wakeup::Resync);
    let far = key("far");
    // Lags by 6 s: its horizon ends 1 s before the owner's window does.
    store
        .apply(params(NOW - 6_000, vec![upsert(&far, NOW + 60_000, "f")]))
        .await
        .unwrap();
    let marker = key("marker");
    store
        .apply(params(NOW, vec![upsert(&marker, NOW + 1, "m")]))
        .await
        .unwrap();
    assert_eq!(
        next(&mut wakeups).await,
        timer(&marker, NOW + 1, WakeupKind::Arm)
    );
}
