//! `belfry`: the scheduler's one binary.
//!
//! - `belfry serve`: runs a node (see [`serve`]);
//! - configuration: [`config`] (defaults → TOML file → `BELFRY_*` env → flags).

mod cli;
mod cluster;
mod config;
mod cron_cmd;
mod keys_cmd;
mod listener;
mod serve;
mod tls;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the system allocator: deliveries allocate several
/// small buffers each, and malloc/free was a fifth of the delivery profile.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Command::Serve(args) => match config::Config::load(&args) {
            Ok(config) => serve::run(config),
            Err(error) => {
                eprintln!("belfry: invalid configuration: {error}");
                ExitCode::from(2)
            }
        },
        cli::Command::Cron(command) => cron_cmd::run(command),
        cli::Command::Keys(command) => keys_cmd::run(command),
    }
}
