//! `belfry`: the scheduler's one binary.
//!
//! - `belfry serve`: runs a node (see [`serve`]);
//! - configuration: [`config`] (defaults → TOML file → `BELFRY_*` env → flags);
//!   `belfry config reference` prints every key ([`reference`]);
//! - `belfry events|tenants|schedules|dead|cluster`: a client of a running
//!   node over HTTP (see [`client`]).

mod cli;
mod client;
#[cfg(feature = "postgres")]
mod cluster;
mod config;
mod cron_cmd;
mod keys_cmd;
mod listener;
mod reference;
mod serve;
mod tls;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the system allocator: deliveries allocate several
/// small buffers each, and malloc/free was a fifth of the delivery profile.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    private_file_modes();
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
        cli::Command::Events(args) => client::run(args.connection, async |client| {
            client::events::execute(client, args.command).await
        }),
        cli::Command::Tenants(args) => client::run(args.connection, async |client| {
            client::tenants::execute(client, args.command).await
        }),
        cli::Command::Schedules(args) => client::run(args.connection, async |client| {
            client::schedules::execute(client, args.command).await
        }),
        cli::Command::Dead(args) => client::run(args.connection, async |client| {
            client::events::execute_dead(client, args.command).await
        }),
        cli::Command::Bulk(args) => client::run(args.connection, async |client| {
            client::bulk::execute(client, args.command).await
        }),
        cli::Command::Cluster(args) => client::run(args.connection, client::cluster::execute),
        cli::Command::Config(cli::ConfigCommand::Reference) => {
            print!("{}", reference::node_table());
            ExitCode::SUCCESS
        }
    }
}

/// Turns transparent huge pages off for this process. mimalloc asks for
/// them on its arenas, and the first touch of each 2 MiB page zeroes all
/// of it inside the page fault; the engine frees and re-touches memory in
/// bursts (a hung tenant's window trimmed, batches of records read), so at
/// such an instant most of the node's CPU went to zeroing pages. Measured
/// with a hung tenant's million events due at once: system CPU halved, the
/// healthy tenant's worst lateness 535 → 270 ms (`docs/BENCHMARKS.md`).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory
    // of this process; on failure (an old kernel) nothing changes.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() {}

/// Files and directories this process creates (the data directory's
/// tables and journals, key files written by `belfry keys`) are readable
/// by their owner only: they hold payloads, tenant secrets and key hashes.
#[allow(unsafe_code)]
fn private_file_modes() {
    // SAFETY: umask only swaps the process's creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}
