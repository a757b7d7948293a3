//! A PostgreSQL crash and restart (`pg_ctl stop -m immediate`, start):
//! while it is down every call fails with `Unavailable` (the API's 503,
//! never a false success); afterwards the same store works again by itself
//! and the wake-up subscription says it must resync.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod support;

use std::sync::Arc;

use belfry_postgres::{PostgresStore, Wakeup, WakeupKind};
use belfry_store::cluster::{Coordinator, NodeId, NodeInfo};
use belfry_store::{Store, StoreError};
use belfry_testkit::PgServer;
use support::{DEADLINE, eventually, key, options, params, upsert};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_unavailable_while_the_database_is_down_and_work_after() {
    // A private server: stopping the shared one would break other tests.
    let server = Arc::new(
        tokio::task::spawn_blocking(PgServer::launch)
            .await
            .unwrap()
            .unwrap(),
    );
    let url = server.create_database("restart").await.unwrap();
    let store = PostgresStore::connect(options(url, 4)).await.unwrap();
    let mut wakeups = store.subscribe_wakeups();
    let first = tokio::time::timeout(DEADLINE, wakeups.recv())
        .await
        .unwrap();
    assert_eq!(first, Some(Wakeup::Resync));

    let before = key("before");
    store
        .apply(params(0, vec![upsert(&before, 5_000, "v1")]))
        .await
        .unwrap();

    let stopping = server.clone();
    tokio::task::spawn_blocking(move || stopping.stop_immediate())
        .await
        .unwrap()
        .unwrap();

    let during = key("during");
    let node = NodeInfo {
        id: NodeId("n1".into()),
        address: "127.0.0.1:1".into(),
    };
    // Every kind of call, twice: the first may still hold a pooled
    // connection that has not noticed the crash, the second must open one.
    for _ in 0..2 {
        let applied = store
            .apply(params(1, vec![upsert(&during, 6_000, "d1")]))
            .await;
        assert!(
            matches!(applied, Err(StoreError::Unavailable(_))),
            "{applied:?}"
        );
        let read = store.get_event(&before).await;
        assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");
        let heartbeat = store
            .heartbeat(&node, std::time::Duration::from_secs(5))
            .await;
        assert!(
            matches!(heartbeat, Err(StoreError::Unavailable(_))),
            "{heartbeat:?}"
        );
    }

    let starting = server.clone();
    tokio::task::spawn_blocking(move || starting.start())
        .await
        .unwrap()
        .unwrap();

    // The pool reconnects on its own: the same store works again.
    eventually("apply to succeed after the restart", || async {
        store
            .apply(params(2, vec![upsert(&during, 6_000, "d1")]))
            .await
            .ok()
    })
    .await;
    assert_eq!(
        store
            .get_event(&before)
            .await
            .unwrap()
            .unwrap()
            .version
            .as_str(),
        "v1"
    );
    assert!(store.get_event(&during).await.unwrap().is_some());
    store
        .heartbeat(&node, std::time::Duration::from_secs(5))
        .await
        .unwrap();

    // The listener reconnected: it announces a resync (notifications may
    // have been missed), then delivers new ones again.
    loop {
        let message = tokio::time::timeout(DEADLINE, wakeups.recv())
            .await
            .unwrap()
            .unwrap();
        if message == Wakeup::Resync {
            break;
        }
    }
    let after = key("after");
    store
        .apply(params(3, vec![upsert(&after, 7_000, "a1")]))
        .await
        .unwrap();
    loop {
        let message = tokio::time::timeout(DEADLINE, wakeups.recv())
            .await
            .unwrap()
            .unwrap();
        // `during` (created after the restart) may be announced first.
        if let Wakeup::Timer { key, kind, .. } = message
            && key == after
        {
            assert_eq!(kind, WakeupKind::Arm);
            break;
        }
    }
}
