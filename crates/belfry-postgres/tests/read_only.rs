//! A server that turns read-only under the store's connections (what a
//! demoted primary, or one an operator made read-only, looks like): writes
//! answer `Unavailable` (503, never a false success), the store says why it
//! cannot write, every connection is dropped (so each reconnects through
//! the URL), the LISTEN connection reconnects (a `Resync`), and once the
//! server takes writes again the heartbeat clears it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod support;

use std::sync::Arc;

use belfry_postgres::{PostgresStore, Wakeup};
use belfry_store::cluster::{Coordinator, NodeId, NodeInfo};
use belfry_store::{Store, StoreError};
use belfry_testkit::PgServer;
use support::{DEADLINE, key, options, params, upsert};

async fn set_read_only(admin_url: &str, on: bool) {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    // Two calls: several statements in one run as a transaction block,
    // where ALTER SYSTEM is refused.
    client
        .batch_execute(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {}",
            if on { "on" } else { "off" }
        ))
        .await
        .unwrap();
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_blocks_writes_with_a_reason_until_the_heartbeat_writes_again() {
    // A private server: its settings change here.
    let server = Arc::new(
        tokio::task::spawn_blocking(PgServer::launch)
            .await
            .unwrap()
            .unwrap(),
    );
    let url = server.create_database("read_only").await.unwrap();
    let admin_url = server.url("postgres");
    let store = PostgresStore::connect(options(url, 4)).await.unwrap();
    let mut wakeups = store.subscribe_wakeups();
    let first = tokio::time::timeout(DEADLINE, wakeups.recv())
        .await
        .unwrap();
    assert_eq!(first, Some(Wakeup::Resync));
    let node = NodeInfo {
        id: NodeId("n1".into()),
        address: "127.0.0.1:1".into(),
    };
    store
        .heartbeat(&node, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(store.write_blocked(), None);

    set_read_only(&admin_url, true).await;
    // The reload reaches the sessions at their next command.
    let event = key("e1");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let refused = loop {
        let applied = store
            .apply(params(0, vec![upsert(&event, 5_000, "v1")]))
            .await;
        match applied {
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(message)) if message.contains("25006")),
        "a write on a read-only server must be Unavailable (503): {refused:?}"
    );
    let why = store
        .write_blocked()
        .expect("the store knows it cannot write");
    assert!(why.contains("read-only"), "{why}");
    // Reads still work: readiness must not rely on them alone.
    store.get_event(&event).await.unwrap();
    // The LISTEN connection was dropped and reopened.
    let resynced = tokio::time::timeout(DEADLINE, async {
        loop {
            if wakeups.recv().await == Some(Wakeup::Resync) {
                return;
            }
        }
    })
    .await;
    assert!(resynced.is_ok(), "the listener never reconnected");

    set_read_only(&admin_url, false).await;
    // The heartbeat is the proof that writes work again.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while store
        .heartbeat(&node, std::time::Duration::from_secs(5))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the heartbeat never wrote again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(store.write_blocked(), None);
    store
        .apply(params(1, vec![upsert(&event, 5_000, "v1")]))
        .await
        .unwrap();
}
