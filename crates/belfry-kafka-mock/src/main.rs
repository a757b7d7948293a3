//! `belfry-kafka-mock`: librdkafka's mock cluster hosted in its own process,
//! so that `belfry` processes and independent clients (for example Python's
//! `confluent-kafka`) connect to it over TCP as to any Kafka broker. It
//! speaks the real protocol: idempotent and transactional producers,
//! consumer groups with offset commits.
//!
//! Usage: `belfry-kafka-mock [--brokers N] [--topic NAME:PARTITIONS]...`
//!
//! On start it prints one line, `bootstrap.servers=HOST:PORT,...`, then
//! reads commands from stdin, one per line, and answers each with `ok` or
//! `error: <why>`:
//! - `create-topic NAME PARTITIONS`
//! - `broker-down ID` / `broker-up ID` (IDs start at 1): the broker closes
//!   its connections and refuses new ones until it is brought back up;
//! - `rtt ID MILLIS`: delays every answer of that broker.
//!
//! It exits when stdin closes, so a test that dies takes its broker with it.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use rdkafka::mocking::MockCluster;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("belfry-kafka-mock: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut brokers = 1;
    let mut topics = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--brokers" => {
                brokers = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--brokers needs a positive number")?;
            }
            "--topic" => {
                let spec = args.next().ok_or("--topic needs NAME:PARTITIONS")?;
                let (name, partitions) = spec
                    .split_once(':')
                    .and_then(|(name, n)| Some((name.to_string(), n.parse::<i32>().ok()?)))
                    .ok_or("--topic needs NAME:PARTITIONS")?;
                topics.push((name, partitions));
            }
            "-h" | "--help" => {
                println!("usage: belfry-kafka-mock [--brokers N] [--topic NAME:PARTITIONS]...");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }

    let cluster = MockCluster::new(brokers).map_err(|e| format!("cannot start: {e}"))?;
    for (name, partitions) in &topics {
        cluster
            .create_topic(name, *partitions, 1)
            .map_err(|e| format!("cannot create topic {name}: {e}"))?;
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "bootstrap.servers={}", cluster.bootstrap_servers())
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("stdout: {e}"))?;

    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let answer = match command(&cluster, &line) {
            Ok(()) => "ok".to_string(),
            Err(why) => format!("error: {why}"),
        };
        if writeln!(stdout, "{answer}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
    Ok(())
}

fn command<C: rdkafka::ClientContext>(
    cluster: &MockCluster<'_, C>,
    line: &str,
) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| -> Result<i32, String> {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("{line:?}: argument {i} must be a number"))
    };
    match words.first().copied() {
        Some("create-topic") => {
            let name = words.get(1).ok_or("create-topic NAME PARTITIONS")?;
            cluster
                .create_topic(name, number(2)?, 1)
                .map_err(|e| e.to_string())
        }
        Some("broker-down") => cluster.broker_down(number(1)?).map_err(|e| e.to_string()),
        Some("broker-up") => cluster.broker_up(number(1)?).map_err(|e| e.to_string()),
        Some("rtt") => {
            let millis = u64::try_from(number(2)?).map_err(|_| "MILLIS must be ≥ 0")?;
            cluster
                .broker_round_trip_time(number(1)?, Duration::from_millis(millis))
                .map_err(|e| e.to_string())
        }
        _ => Err(format!("unknown command {line:?}")),
    }
}
