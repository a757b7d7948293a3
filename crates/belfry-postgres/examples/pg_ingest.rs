//! Ingest throughput of the PostgreSQL store: `callers` concurrent tasks
//! each apply batches of `batch` new events until `events` are stored.
//!
//! ```text
//! cargo run --release -p belfry-postgres --example pg_ingest -- \
//!     postgres://postgres@127.0.0.1:5432/belfry_ingest [events] [batch] [callers] [near]
//! ```
//! With `near`, events fall inside the notify horizon, so every commit also
//! sends wake-ups (PostgreSQL serializes the commits of notifying
//! transactions).
//! The database is created if missing and emptied first. Durable commits
//! (`synchronous_commit = on`): the numbers include the server's fsyncs.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::event::{DeliveryOption, EventCommand};
use belfry_core::{
    EventId, EventKey, EventVersion, PartitionCount, RetryPolicy, TenantName, Timestamp,
};
use belfry_postgres::{PostgresOptions, PostgresStore};
use belfry_store::{ApplyParams, KeyedCommand, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: pg_ingest URL [events] [batch] [callers]")?;
    let events: usize = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let batch: usize = args.next().map_or(Ok(1_000), |a| a.parse())?;
    let callers: usize = args.next().map_or(Ok(8), |a| a.parse())?;
    let near = args.next().as_deref() == Some("near");
    let offset = if near { 10 } else { 3_600 };

    let store = Arc::new(
        PostgresStore::connect(PostgresOptions {
            url: url.clone(),
            partitions: PartitionCount::DEFAULT,
            pool_size: callers,
            notify_horizon: Duration::from_secs(60),
            clock_skew_margin: belfry_postgres::DEFAULT_CLOCK_SKEW_MARGIN,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .await?,
    );
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client.batch_execute("TRUNCATE events, attempts").await?;

    let tenant = TenantName::new("bench")?;
    let now = Timestamp::from_millis(1_700_000_000_000);
    let batches = events.div_ceil(batch);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (store, next, tenant) = (store.clone(), next.clone(), tenant.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if b >= batches {
                    return Ok::<_, belfry_store::StoreError>(());
                }
                let commands = (b * batch..((b + 1) * batch).min(events))
                    .map(|i| KeyedCommand {
                        key: EventKey::new(
                            tenant.clone(),
                            EventId::new(format!("e{i:09}")).expect("valid id"),
                        ),
                        command: EventCommand::Upsert {
                            event_time: now.plus(Duration::from_secs(offset + (i % 40) as u64)),
                            payload: Some(format!("{{\"n\":{i}}}")),
                            delivery: DeliveryOption::PayloadOnly,
                            new_version: EventVersion::generate(),
                            settings: Default::default(),
                        },
                        fence: None,
                    })
                    .collect();
                store
                    .apply(ApplyParams {
                        commands,
                        now,
                        retry: RetryPolicy::default(),
                    })
                    .await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    println!(
        "{events} {} events in batches of {batch} from {callers} callers: {:.2} s, {:.0} events/s",
        if near { "near" } else { "far" },
        elapsed.as_secs_f64(),
        events as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}
