//! Command-line interface.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Belfry: a durable, multi-tenant scheduler. At instant T, to the
/// millisecond and never early, it delivers the payload you gave it to your
/// webhook, retries on failure, and keeps an auditable history. It speaks
/// Walmart BigBen's HTTP API and its own `/v1` API.
#[derive(Debug, Parser)]
#[command(name = "belfry", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node on the embedded durable store in a data directory.
    ///
    /// Settings come, lowest priority first, from built-in defaults, the
    /// TOML file given by --config, BELFRY_* environment variables (nested
    /// keys joined by "__", e.g. BELFRY_ENGINE__WINDOW_MS=30000), and these
    /// flags. See the README's configuration reference for every key.
    Serve(ServeArgs),

    /// Inspect recurring-schedule (cron) expressions offline, e.g.
    /// `belfry cron next '30 2 * * *' --tz Europe/Berlin --count 3`.
    #[command(subcommand)]
    Cron(crate::cron_cmd::CronCommand),

    /// Create, list and revoke API keys in the node's data directory or
    /// database, without a running node (the first admin key:
    /// `belfry keys create --role admin`).
    #[command(subcommand)]
    Keys(crate::keys_cmd::KeysCommand),

    /// Schedule, show, list and cancel events on a running node, and show
    /// their delivery attempts (over HTTP: --url, --key).
    Events(crate::client::events::EventsArgs),

    /// List, show and register tenants (their webhooks) on a running node.
    Tenants(crate::client::tenants::TenantsArgs),

    /// List, show, create, delete, pause and resume recurring schedules on
    /// a running node.
    Schedules(crate::client::schedules::SchedulesArgs),

    /// Failed events (retries given up, or refused permanently): list
    /// them, send one again.
    Dead(crate::client::events::DeadArgs),

    /// Bulk actions: cancel or redrive every event a filter matches, pause
    /// or resume a tenant's schedules; they run on the node (create, get,
    /// list, cancel).
    Bulk(crate::client::bulk::BulkArgs),

    /// Show the cluster as a running node sees it: the leader and its
    /// term, each node and the partitions it owns.
    Cluster(crate::client::cluster::ClusterArgs),

    /// The configuration's reference.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print every configuration key of this build (its flag or
    /// environment variable, default and meaning) as a Markdown table.
    Reference,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTP API [default: 127.0.0.1:8080] [env: BELFRY_LISTEN]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Directory of the embedded store; created if missing
    /// [default: ./belfry-data] [env: BELFRY_DATA_DIR]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// TOML configuration file
    #[arg(long, value_name = "FILE", env = "BELFRY_CONFIG")]
    pub config: Option<PathBuf>,

    /// Number of partitions, used only when the store is created
    /// [default: 64] [env: BELFRY_PARTITIONS]
    #[arg(long, value_name = "N")]
    pub partitions: Option<u16>,

    /// Run as a node of the cluster this PostgreSQL database defines,
    /// instead of on the embedded store [env: BELFRY_DATABASE_URL]
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,

    /// The HTTP address other nodes and clients use to reach this node, as
    /// HOST:PORT [default: the listen address] [env: BELFRY_ADVERTISE]
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,

    /// Log format: "text" or "json" [default: text] [env: BELFRY_LOG_FORMAT].
    /// The level is set with RUST_LOG (default "info").
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// PEM certificate chain of the API, leaf first: the API then speaks
    /// HTTPS only; needs --tls-key. Reloaded when the file changes
    /// [env: BELFRY_TLS__CERT_FILE]
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1)
    /// [env: BELFRY_TLS__KEY_FILE]
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates that sign client certificates: clients must
    /// present one (tls.client_auth = "optional" lets them in without)
    /// [env: BELFRY_TLS__CLIENT_CA_FILE]
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve without authentication (auth.mode = "none"): anyone who can
    /// reach the port may read and change every tenant. Only behind a
    /// trusted network (a BigBen drop-in); without it, a node on a
    /// non-loopback address refuses to start until an API key exists.
    #[arg(long)]
    pub insecure_no_auth: bool,
}
