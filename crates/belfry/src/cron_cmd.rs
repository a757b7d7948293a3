//! `belfry cron …`: inspect recurring-schedule expressions offline.
//!
//! `belfry cron next 'EXPR' --type unix|quartz|spring|cron4j|every --tz ZONE
//! --from RFC3339 --count N` prints the next N occurrences strictly after
//! `--from` (default: now), one RFC 3339 UTC instant per line. Bad input
//! prints one line on stderr and exits with status 2.

use std::process::ExitCode;

use belfry_clock::SystemClock;
use belfry_core::{Clock, CronKind, CronSpec, Timestamp};
use clap::{Args, Subcommand};

/// Most occurrences one call prints; enough for any preview.
const MAX_COUNT: usize = 10_000;

#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// Print the next occurrences of an expression, one RFC 3339 UTC instant
    /// per line, strictly after --from.
    Next(NextArgs),
}

#[derive(Debug, Args)]
pub struct NextArgs {
    /// The expression, e.g. '30 2 * * *', '*/5 * * * * ?', '@daily',
    /// '@every 90s'
    #[arg(value_name = "EXPR")]
    pub expression: String,

    /// Syntax: unix (5 fields), quartz (6-7 fields with seconds), spring,
    /// cron4j, every (@every <duration>)
    #[arg(long = "type", value_name = "TYPE", default_value = "unix")]
    pub kind: String,

    /// IANA time zone the expression's local times are read in
    #[arg(long = "tz", value_name = "ZONE", default_value = "UTC")]
    pub time_zone: String,

    /// Print occurrences strictly after this instant (RFC 3339 with an
    /// offset or Z) [default: now]
    #[arg(long, value_name = "RFC3339")]
    pub from: Option<String>,

    /// How many occurrences to print (1-10000)
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub count: usize,
}

pub fn run(command: CronCommand) -> ExitCode {
    let result = match command {
        CronCommand::Next(args) => next(&args),
    };
    match result {
        Ok(lines) => {
            println!("{}", lines.join("\n"));
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("belfry cron: {message}");
            ExitCode::from(2)
        }
    }
}

/// The lines to print, or the one-line error.
fn next(args: &NextArgs) -> Result<Vec<String>, String> {
    if !(1..=MAX_COUNT).contains(&args.count) {
        return Err(format!("--count must be between 1 and {MAX_COUNT}"));
    }
    let kind: CronKind = args.kind.parse().map_err(|e| format!("{e}"))?;
    let from = match &args.from {
        Some(text) => Timestamp::parse_rfc3339(text).ok_or_else(|| {
            format!("--from '{text}' is not an RFC 3339 instant with an offset, e.g. 2027-03-28T00:00:00Z")
        })?,
        None => SystemClock.now(),
    };
    let spec = CronSpec::parse(&args.expression, kind, Some(&args.time_zone))
        .map_err(|e| e.to_string())?;
    let lines: Vec<String> = spec
        .occurrences_after(from)
        .take(args.count)
        .map(Timestamp::to_rfc3339)
        .collect();
    if lines.is_empty() {
        return Err(format!(
            "'{}' has no occurrence after {}",
            spec.expression(),
            from.to_rfc3339()
        ));
    }
    Ok(lines)
}
