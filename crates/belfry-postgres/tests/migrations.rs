//! Schema migrations on a live database: the listing index (migration 3)
//! is built without blocking writes to `events`, by every node at once; the
//! history's unique index (migration 9) keeps one entry per attempt.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod support;

use std::time::Duration;

use belfry_core::PartitionCount;
use belfry_postgres::PostgresStore;
use belfry_postgres::schema::migrate_up_to;
use belfry_store::Store;
use belfry_testkit::PgServer;
use support::{DEADLINE, eventually, options};
use tokio_postgres::Client;

/// The index migration 3 builds.
const INDEX: &str = "events_by_status_time";

async fn connect(url: &str) -> Client {
    belfry_postgres::tls::connect(url).await.unwrap()
}

/// A fresh database migrated up to version 2 only (before the index).
async fn database_at_version_2() -> String {
    let url = PgServer::shared().fresh_database().await;
    let mut client = connect(&url).await;
    migrate_up_to(
        &mut client,
        PartitionCount::new(4).unwrap(),
        2,
        &belfry_clock::SystemClock,
    )
    .await
    .unwrap();
    url
}

const INSERT_EVENT: &str = "INSERT INTO events
     (tenant, id, partition, version, event_time, delivery, status, next_fire_at,
      attempts, created_at, updated_at)
     VALUES ('t', $1, 0, 'v1', 1000, 'PAYLOAD_ONLY', 'scheduled', 1000, 0, 0, 0)";

/// `Some(valid)` if the index exists.
async fn index_state(client: &Client) -> Option<bool> {
    client
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              WHERE c.relname = $1",
            &[&INDEX],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

async fn applied_versions(client: &Client) -> Vec<i32> {
    client
        .query(
            "SELECT version FROM belfry_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_build_does_not_block_writes_and_two_nodes_migrate_at_once() {
    let url = database_at_version_2().await;

    // A: a write in progress, held open for the whole build.
    let mut a = connect(&url).await;
    let a_tx = a.transaction().await.unwrap();
    a_tx.execute(INSERT_EVENT, &[&"held"]).await.unwrap();

    // Two nodes start (and migrate) at once; the build waits for A. The
    // node without the migration lock must not wait for it holding a
    // snapshot: the build would wait for that node and PostgreSQL would
    // abort one of them ("deadlock detected").
    let nodes: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresStore::connect(options(url, 4)).await })
        })
        .collect();
    let observer = connect(&url).await;
    eventually("the index build to wait for the open write", || async {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE pid <> pg_backend_pid()
                    AND query ILIKE '%CREATE INDEX%events_by_status_time%'
                    AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (waiting > 0).then_some(())
    })
    .await;

    // C: another write meanwhile goes through at once. (A plain `CREATE
    // INDEX` queues a ShareLock behind A, and C's write queues behind it.)
    let c = connect(&url).await;
    c.batch_execute("SET statement_timeout = '2s'")
        .await
        .unwrap();
    c.execute(INSERT_EVENT, &[&"during-build"])
        .await
        .expect("a write while the index builds is not blocked");

    // A commits; the build and both nodes' migrations finish.
    a_tx.commit().await.unwrap();
    for node in nodes {
        let store = tokio::time::timeout(DEADLINE, node)
            .await
            .expect("the migration finishes once the open write commits")
            .unwrap()
            .unwrap();
        assert_eq!(store.partitions(), PartitionCount::new(4).unwrap());
    }
    assert_eq!(index_state(&observer).await, Some(true));
    assert_eq!(
        applied_versions(&observer).await,
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
    let events: i64 = observer
        .query_one("SELECT count(*) FROM events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(events, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_index_left_by_a_failed_build_is_rebuilt() {
    let url = database_at_version_2().await;
    let client = connect(&url).await;
    client.execute(INSERT_EVENT, &[&"one"]).await.unwrap();
    client
        .execute(&INSERT_EVENT.replace("'t'", "'u'"), &[&"one"])
        .await
        .unwrap();
    // A concurrent build that fails half-way (duplicate keys) leaves an
    // invalid index of the migration's name behind.
    let failed = client
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX CONCURRENTLY {INDEX} ON events (id)"
        ))
        .await;
    assert!(failed.is_err());
    assert_eq!(index_state(&client).await, Some(false));

    tokio::time::timeout(DEADLINE, PostgresStore::connect(options(url, 4)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(index_state(&client).await, Some(true));
    let definition: String = client
        .query_one("SELECT pg_get_indexdef($1::text::regclass)", &[&INDEX])
        .await
        .unwrap()
        .get(0);
    assert!(
        definition.contains("(tenant, status, event_time, id)")
            && definition.contains("WHERE (id >= ' '")
            && !definition.contains("UNIQUE"),
        "{definition}"
    );
    assert_eq!(
        applied_versions(&client).await,
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_the_build_is_refused() {
    let url = database_at_version_2().await;
    let client = connect(&url).await;
    client
        .execute(
            "INSERT INTO belfry_schema_migrations (version, name) VALUES (99, 'future')",
            &[],
        )
        .await
        .unwrap();
    let refused = PostgresStore::connect(options(url, 4)).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("newer than this build")),
        "{:?}",
        refused.map(|_| ())
    );
    // Nothing was applied, and the lock was released.
    assert_eq!(applied_versions(&client).await, vec![1, 2, 99]);
    let lock_free: bool = client
        // The migration lock: ('belf', 1).
        .query_one("SELECT pg_try_advisory_lock(1650814054, 1)", &[])
        .await
        .unwrap()
        .get(0);
    assert!(lock_free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_from_version_2_keeps_the_partition_count() {
    let url = database_at_version_2().await;
    let store = tokio::time::timeout(
        Duration::from_secs(20),
        PostgresStore::connect(options(url.clone(), 8)),
    )
    .await
    .unwrap()
    .unwrap();
    // Created with 4 partitions at version 2: the count stays.
    assert_eq!(store.partitions(), PartitionCount::new(4).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_before_pull_settings_read_as_the_default_queue() {
    let url = database_at_version_2().await;
    connect(&url)
        .await
        .execute(INSERT_EVENT, &[&"old"])
        .await
        .unwrap();
    let store = tokio::time::timeout(
        Duration::from_secs(20),
        PostgresStore::connect(options(url.clone(), 4)),
    )
    .await
    .unwrap()
    .unwrap();
    let key = belfry_core::EventKey::new(
        belfry_core::TenantName::new("t").unwrap(),
        belfry_core::EventId::new("old").unwrap(),
    );
    let record = store.get_event(&key).await.unwrap().expect("kept");
    assert_eq!(record.settings, belfry_core::EventSettings::default());
    assert_eq!(record.settings.queue().as_str(), "default");
}

/// Migration 9 on a database whose history recorded attempts twice (a
/// retried write, before attempts were recorded once): the first entry of
/// each (version, number) stays, the old stale entries numbered 0 all stay,
/// and the unique index holds from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_recorded_twice_before_migration_9_are_kept_once() {
    let url = PgServer::shared().fresh_database().await;
    let mut client = connect(&url).await;
    migrate_up_to(
        &mut client,
        PartitionCount::new(4).unwrap(),
        8,
        &belfry_clock::SystemClock,
    )
    .await
    .unwrap();
    client.execute(INSERT_EVENT, &[&"e"]).await.unwrap();
    let insert =
        "INSERT INTO attempts (tenant, id, version, number, started_at, duration_ms, verdict)
         VALUES ('t', 'e', $1, $2, $3, 1, 'retry')";
    for (version, number, started_at) in [
        ("v1", 1_i64, 100_i64),
        ("v1", 1, 101),
        ("v1", 2, 200),
        ("v1", 1, 102),
        ("v0", 0, 50),
        ("v0", 0, 51),
    ] {
        client
            .execute(insert, &[&version, &number, &started_at])
            .await
            .unwrap();
    }

    tokio::time::timeout(DEADLINE, PostgresStore::connect(options(url, 4)))
        .await
        .unwrap()
        .unwrap();
    let kept: Vec<(String, i64, i64)> = client
        .query(
            "SELECT version, number, started_at FROM attempts ORDER BY seq",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let expected: Vec<(String, i64, i64)> =
        [("v1", 1, 100), ("v1", 2, 200), ("v0", 0, 50), ("v0", 0, 51)]
            .into_iter()
            .map(|(v, n, at)| (v.to_string(), n, at))
            .collect();
    assert_eq!(kept, expected);
    assert!(
        client
            .execute(insert, &[&"v1", &2_i64, &300_i64])
            .await
            .is_err(),
        "the unique index refuses a second entry of an attempt"
    );
    assert_eq!(
        applied_versions(&client).await,
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
}
