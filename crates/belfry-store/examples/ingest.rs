//! Measures the embedded store's durable write throughput.
//!
//! ```text
//! cargo run --release -p belfry-store --example ingest -- \
//!     --events 1000000 --batch 1000 --callers 4 [--partitions 64] [--writers N] [--dir PATH]
//! ```
//!
//! Phase 1 creates `--events` events in `apply` calls of `--batch` commands
//! from `--callers` concurrent tasks (as the HTTP API would); phase 2
//! records a delivered attempt for each (what firing does). Every `apply`
//! is durable (fsynced) when it returns, so the rates are durable rates.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use belfry_core::event::{AttemptReport, DeliveryOption, EventCommand};
use belfry_core::{
    EventId, EventKey, EventVersion, PartitionCount, RetryPolicy, TenantName, Timestamp, Verdict,
};
use belfry_store::{ApplyParams, EmbeddedOptions, EmbeddedStore, KeyedCommand, SharedStore};

struct Args {
    events: u64,
    batch: u64,
    callers: u64,
    partitions: u16,
    /// Writer shards; `None`: the store's default.
    writers: Option<std::num::NonZeroUsize>,
    dir: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        events: 1_000_000,
        batch: 1_000,
        callers: 4,
        partitions: 64,
        writers: None,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--events" => args.events = number()?,
            "--batch" => args.batch = number()?.max(1),
            "--callers" => args.callers = number()?.max(1),
            "--partitions" => {
                args.partitions = u16::try_from(number()?).map_err(|e| format!("{flag}: {e}"))?
            }
            "--writers" => {
                args.writers = std::num::NonZeroUsize::new(
                    usize::try_from(number()?).map_err(|e| format!("{flag}: {e}"))?,
                )
            }
            "--dir" => args.dir = Some(value.into()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

/// Base instant of the generated events: far enough ahead that none is due.
const BASE: i64 = 4_000_000_000_000;

fn event_key(tenant: &TenantName, i: u64) -> EventKey {
    // Ids in a scattered order, as independent clients would send them.
    let scrambled = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16;
    EventKey::new(
        tenant.clone(),
        EventId::new(format!("order-{scrambled:012x}-{i}")).expect("generated ids are valid"),
    )
}

fn event_time(i: u64) -> Timestamp {
    // Spread over an hour, in no particular order.
    Timestamp::from_millis(BASE + ((i * 7_919) % 3_600_000) as i64)
}

/// CPU seconds used so far by the whole process and by the store's writer
/// threads (all shards together) (Linux `/proc`; zeros elsewhere). CPU per event is a steadier
/// measure than wall time on a shared machine.
fn cpu_seconds() -> (f64, f64) {
    fn ticks(stat: &str) -> Option<f64> {
        // Fields after the parenthesised command name; utime and stime are
        // the 14th and 15th fields of the whole line.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((utime + stime) / 100.0)
    }
    let process = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| ticks(&s))
        .unwrap_or(0.0);
    let mut writer = 0.0;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.starts_with("belfry-store-wr") {
                writer += std::fs::read_to_string(task.path().join("stat"))
                    .ok()
                    .and_then(|s| ticks(&s))
                    .unwrap_or(0.0);
            }
        }
    }
    (process, writer)
}

/// Runs `callers` tasks that claim batches of indexes until `events` are
/// done; `make` turns an index into a command. Returns events per second.
async fn run_phase(
    store: &SharedStore,
    args: &Args,
    make: fn(&TenantName, u64) -> KeyedCommand,
) -> f64 {
    let next = Arc::new(AtomicU64::new(0));
    let tenant = TenantName::new("bench/tenant").expect("valid tenant");
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.callers {
        let (store, next, tenant) = (store.clone(), next.clone(), tenant.clone());
        let (events, batch) = (args.events, args.batch);
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(batch, Ordering::Relaxed);
                if start >= events {
                    break;
                }
                let commands = (start..(start + batch).min(events))
                    .map(|i| make(&tenant, i))
                    .collect();
                store
                    .apply(ApplyParams {
                        commands,
                        now: Timestamp::from_millis(BASE),
                        retry: RetryPolicy::default(),
                    })
                    .await
                    .expect("apply");
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller task");
    }
    let rate = args.events as f64 / started.elapsed().as_secs_f64();
    let (process, writer) = cpu_seconds();
    let per_event = |cpu: f64| cpu * 1e6 / args.events as f64;
    println!(
        "  cpu per event: process {:.1} us, writer threads {:.1} us",
        per_event(process - cpu_before.0),
        per_event(writer - cpu_before.1)
    );
    rate
}

fn create(tenant: &TenantName, i: u64) -> KeyedCommand {
    KeyedCommand {
        key: event_key(tenant, i),
        command: EventCommand::Upsert {
            event_time: event_time(i),
            payload: Some(format!("{{\"order\":{i},\"action\":\"remind\"}}")),
            delivery: DeliveryOption::FullEvent,
            new_version: EventVersion::from_string(format!("{i:032x}")),
            settings: Default::default(),
        },
        fence: None,
    }
}

fn deliver(tenant: &TenantName, i: u64) -> KeyedCommand {
    KeyedCommand {
        key: event_key(tenant, i),
        command: EventCommand::RecordAttempt {
            version: EventVersion::from_string(format!("{i:032x}")),
            number: 1,
            report: AttemptReport {
                started_at: event_time(i),
                duration_ms: 2,
                verdict: Verdict::Delivered,
                http_status: Some(200),
                error: None,
                steer: None,
            },
            tenant: Default::default(),
        },
        fence: Some(belfry_store::Fence {
            partition: belfry_core::PartitionId(0),
            epoch: 1,
        }),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("ingest: {message}");
            std::process::exit(2);
        }
    };
    let temp = tempfile::tempdir().expect("temporary directory");
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    let store: SharedStore = Arc::new(
        EmbeddedStore::open(EmbeddedOptions {
            data_dir: dir.clone(),
            partitions: PartitionCount::new(args.partitions).expect("--partitions > 0"),
            writers: args.writers,
            clock: std::sync::Arc::new(belfry_clock::SystemClock),
        })
        .expect("open the store"),
    );
    println!(
        "events={} batch={} callers={} partitions={} dir={}",
        args.events,
        args.batch,
        args.callers,
        args.partitions,
        dir.display()
    );
    let created = run_phase(&store, &args, create).await;
    println!("create (durable apply):        {created:>10.0} events/s");
    let delivered = run_phase(&store, &args, deliver).await;
    println!("deliver (RecordAttempt):       {delivered:>10.0} events/s");
    let disk = store.stats().await.expect("stats").disk_bytes.unwrap_or(0);
    println!("disk: {:.1} MiB", disk as f64 / (1024.0 * 1024.0));
}
