//! The whole store conformance suite on PostgreSQL: a fresh database per
//! case on the test binary's shared throwaway server. Partition epochs move
//! as a hand-over moves them: `epoch + 1` on the partition's row.
//!
//! The store runs on a pool of **one** connection: no call may hold a
//! connection while it asks the pool for another. Such a call waits for
//! itself, and when as many run at once as the pool has connections,
//! every one of them times out (a node's workers repeating lease calls
//! did exactly that). The cases about concurrent calls also run on a pool
//! of eight, so that their transactions really overlap in the database.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::time::Duration;

use belfry_core::PartitionCount;
use belfry_postgres::{PostgresOptions, PostgresStore};
use belfry_store::conformance::StoreUnderTest;
use belfry_testkit::PgServer;

async fn postgres_factory(partitions: PartitionCount) -> StoreUnderTest {
    postgres_store(partitions, 1).await
}

async fn postgres_store(partitions: PartitionCount, pool_size: usize) -> StoreUnderTest {
    let url = PgServer::shared().fresh_database().await;
    let store = PostgresStore::connect(PostgresOptions {
        url: url.clone(),
        partitions,
        pool_size,
        notify_horizon: Duration::from_secs(60),
        clock_skew_margin: belfry_postgres::DEFAULT_CLOCK_SKEW_MARGIN,
        clock: std::sync::Arc::new(belfry_clock::SystemClock),
    })
    .await
    .expect("connect to the test database");
    StoreUnderTest::new(Arc::new(store), ()).with_epoch_mover(Box::new(move |partition| {
        let url = url.clone();
        Box::pin(async move {
            // With the URL's TLS settings (`BELFRY_TEST_PG_TLS=1`).
            let client = belfry_postgres::tls::connect(&url)
                .await
                .expect("connect to the test database");
            let row = client
                .query_one(
                    "UPDATE partitions SET epoch = epoch + 1 WHERE partition = $1 RETURNING epoch",
                    &[&i32::from(partition.0)],
                )
                .await
                .expect("move the epoch");
            u64::try_from(row.get::<_, i64>(0)).expect("a positive epoch")
        })
    }))
}

belfry_store::store_conformance_tests!(postgres_factory);

/// Overlapping transactions that change one event: each builds on the
/// last (a row read unlocked and changed meanwhile is not overwritten).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_changes_of_one_event_all_count_on_eight_connections() {
    belfry_store::conformance::concurrent_changes_of_one_event_all_count(|partitions| {
        postgres_store(partitions, 8)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_applies_all_land_on_eight_connections() {
    belfry_store::conformance::concurrent_applies_all_land(|partitions| {
        postgres_store(partitions, 8)
    })
    .await;
}

/// Creations of one absent key that overlap in the database: the losers'
/// inserts conflict, run again, and find the key taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn if_absent_creates_once_however_many_race_on_eight_connections() {
    belfry_store::conformance::if_absent_creates_once_however_many_race(|partitions| {
        postgres_store(partitions, 8)
    })
    .await;
}
