//! The whole store conformance suite on PostgreSQL: a fresh database per
//! case on the test binary's shared throwaway server.

use std::sync::Arc;
use std::time::Duration;

use belfry_core::PartitionCount;
use belfry_postgres::{PostgresOptions, PostgresStore};
use belfry_store::conformance::StoreUnderTest;
use belfry_testkit::PgServer;

async fn postgres_factory(partitions: PartitionCount) -> StoreUnderTest {
    let url = PgServer::shared().fresh_database().await;
    let store = PostgresStore::connect(PostgresOptions {
        url,
        partitions,
        pool_size: 8,
        notify_horizon: Duration::from_secs(60),
        clock_skew_margin: belfry_postgres::DEFAULT_CLOCK_SKEW_MARGIN,
    })
    .await
    .expect("connect to the test database");
    StoreUnderTest::new(Arc::new(store), ())
}

belfry_store::store_conformance_tests!(postgres_factory);
