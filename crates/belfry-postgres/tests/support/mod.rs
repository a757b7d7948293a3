//! Helpers shared by this crate's test binaries.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::time::{Duration, Instant};

use belfry_core::event::{DeliveryOption, EventCommand};
use belfry_core::{
    EventId, EventKey, EventVersion, PartitionCount, PartitionId, RetryPolicy, TenantName,
    Timestamp,
};
use belfry_postgres::{PostgresOptions, PostgresStore};
use belfry_store::{ApplyParams, Fence, KeyedCommand};
use belfry_testkit::PgServer;

/// Generous: a loaded 2-core machine runs several test binaries at once.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn options(url: String, partitions: u16) -> PostgresOptions {
    PostgresOptions {
        url,
        partitions: PartitionCount::new(partitions).unwrap(),
        pool_size: 4,
        notify_horizon: Duration::from_secs(60),
        clock_skew_margin: belfry_postgres::DEFAULT_CLOCK_SKEW_MARGIN,
        clock: std::sync::Arc::new(belfry_clock::SystemClock),
    }
}

/// A store on a fresh database of the binary's shared server.
pub async fn fresh_store(partitions: u16) -> PostgresStore {
    let url = PgServer::shared().fresh_database().await;
    PostgresStore::connect(options(url, partitions))
        .await
        .unwrap()
}

pub fn key(id: &str) -> EventKey {
    EventKey::new(TenantName::new("t").unwrap(), EventId::new(id).unwrap())
}

/// A key of tenant `t` that lands in `partition`.
pub fn key_in(partitions: u16, partition: u16, prefix: &str) -> EventKey {
    let count = PartitionCount::new(partitions).unwrap();
    (0..)
        .map(|i| key(&format!("{prefix}-{i}")))
        .find(|k| count.partition_of(k) == PartitionId(partition))
        .unwrap()
}

pub fn upsert(key: &EventKey, at: i64, version: &str) -> KeyedCommand {
    KeyedCommand {
        key: key.clone(),
        command: EventCommand::Upsert {
            event_time: Timestamp::from_millis(at),
            payload: Some("p".into()),
            delivery: DeliveryOption::PayloadOnly,
            new_version: EventVersion::from_string(version.into()),
            settings: Default::default(),
        },
        fence: None,
    }
}

pub fn fenced(mut command: KeyedCommand, partition: u16, epoch: u64) -> KeyedCommand {
    command.fence = Some(Fence {
        partition: PartitionId(partition),
        epoch,
    });
    command
}

pub fn params(now: i64, commands: Vec<KeyedCommand>) -> ApplyParams {
    ApplyParams {
        commands,
        now: Timestamp::from_millis(now),
        retry: RetryPolicy::default(),
    }
}

/// Polls `check` until it returns `Some`, or panics after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
