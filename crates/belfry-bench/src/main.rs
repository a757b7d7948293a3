//! `belfry-bench`: measures a Belfry node through its BigBen HTTP API.
//!
//! # Layout
//! - [`cli`]: the subcommands (`ingest`, `steady`, `mixed`, `burst`,
//!   `backlog`, `receive`, `cluster`, `hung`, `schedules`, `kafka`, `pull`) and
//!   their options;
//! - [`scenarios`]: what each one does, start to end;
//! - [`mixed`]: the `mixed` scenario: a steady firing rate measured while
//!   a second client ingests at a steady rate;
//! - [`hung`]: the `hung` scenario: tenants whose webhook never answers,
//!   millions of their events due, and a healthy tenant's lateness;
//! - [`cluster`]: the `cluster` scenario: N nodes on one PostgreSQL
//!   database, ingest over every node, a kill -9 of the Master;
//! - [`schedules`]: the `schedules` scenario: N recurring schedules
//!   created over `/v1`, their occurrences measured like events;
//! - [`kafka`]: the `kafka` scenarios: ingestion from a topic, delivery
//!   to a `MESSAGING` tenant's topic, with the broker in its own process;
//! - [`pull`]: the `pull` scenarios: workers of a pull tenant claiming
//!   and completing leases (`lateness` while events come due,
//!   `throughput` on a backlog);
//! - [`failover`]: what a kill -9 of the Master did to the deliveries;
//! - [`node`]: the node under test (started from the `belfry` binary, on
//!   the embedded store or `--database-url`, or `--target`), tenant
//!   registration, kill -9 + restart;
//! - [`database`]: a fresh PostgreSQL database per run, PostgreSQL's CPU;
//! - [`workload`]: event ids `e<n>`, due instants, pre-serialized bodies;
//! - [`load`]: the generator (N requests in flight on keep-alive
//!   connections) and the progress line;
//! - [`deliveries`]: the receiver's records checked against the workload
//!   (lateness, early, missing, duplicates);
//! - [`stats`]: percentiles, `/proc` RSS and CPU, data dir size;
//! - [`report`]: JSON and the table;
//! - [`plots`]: `--report DIR`: the JSON beside an HTML page with SVG
//!   plots (lateness histogram, rate and lateness over time).
//!
//! The webhook receiver is `belfry_testkit::Receiver` in lean mode: it keeps
//! only the arrival time (wall clock, ms) and the `X-Belfry-*` headers.
#![allow(
    clippy::disallowed_methods,
    reason = "the benchmark measures real time"
)]

mod cli;
mod cluster;
mod database;
mod deliveries;
mod failover;
mod hung;
mod kafka;
mod load;
mod mixed;
mod node;
mod plots;
mod pull;
mod readers;
mod report;
mod scenarios;
mod schedules;
mod stats;
mod workload;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, OutputArgs, Scenario};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let output = match &cli.scenario {
        Scenario::Ingest(args) => args.output.clone(),
        Scenario::Steady(args) => args.output.clone(),
        Scenario::Mixed(args) => args.output.clone(),
        Scenario::Hung(args) => args.output.clone(),
        Scenario::Readers(args) => args.output.clone(),
        Scenario::Burst(args) => args.output.clone(),
        Scenario::Backlog(args) => args.output.clone(),
        Scenario::Receive(args) => args.output.clone(),
        Scenario::Cluster(args) => args.output.clone(),
        Scenario::Schedules(args) => args.output.clone(),
        Scenario::Kafka(args) => args.output().clone(),
        Scenario::Pull(args) => args.output().clone(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(output.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("belfry-bench: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let load_before = stats::load_average();
    let result = runtime.block_on(async {
        match cli.scenario {
            Scenario::Ingest(args) => scenarios::ingest(args).await,
            Scenario::Steady(args) => scenarios::steady(args).await,
            Scenario::Mixed(args) => mixed::run(args).await,
            Scenario::Hung(args) => hung::run(args).await,
            Scenario::Readers(args) => readers::run(args).await,
            Scenario::Burst(args) => scenarios::burst(args).await,
            Scenario::Backlog(args) => scenarios::backlog(args).await,
            Scenario::Receive(args) => scenarios::receive(args).await,
            Scenario::Cluster(args) => cluster::run(args).await,
            Scenario::Schedules(args) => schedules::run(args).await,
            Scenario::Kafka(args) => kafka::run(args).await,
            Scenario::Pull(args) => pull::run(args).await,
        }
    });
    match result {
        Ok(mut report) => {
            report.load_average_before = load_before;
            report.load_average_after = stats::load_average();
            print(&report, &output)
        }
        Err(error) => {
            eprintln!("belfry-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn print(report: &report::Report, output: &OutputArgs) -> ExitCode {
    if let Some(dir) = &output.report {
        let written = serde_json::to_string_pretty(report)
            .map_err(anyhow::Error::from)
            .and_then(|json| plots::write(dir, &json, &report.table()));
        match written {
            Ok(()) => eprintln!(
                "belfry-bench: report written to {}",
                dir.join("report.html").display()
            ),
            Err(error) => {
                eprintln!("belfry-bench: cannot write the report: {error:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    if output.json {
        match serde_json::to_string_pretty(report) {
            Ok(text) => println!("{text}"),
            Err(error) => {
                eprintln!("belfry-bench: cannot render the report: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", report.table());
    }
    ExitCode::SUCCESS
}
