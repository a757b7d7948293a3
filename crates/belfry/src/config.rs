//! Node configuration: defaults → TOML file → `BELFRY_*` environment →
//! command-line flags. Every field's doc comment is the user reference (the
//! README's configuration table mirrors it).

use std::net::SocketAddr;
use std::path::PathBuf;

use belfry_api::ApiOptions;
use belfry_engine::EngineOptions;
use belfry_engine::membership::MembershipOptions;
use belfry_sinks::http::HttpSinkOptions;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::cli::ServeArgs;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP API.
    pub listen: SocketAddr,
    /// Directory of the embedded store.
    pub data_dir: PathBuf,
    /// Partitions of a new store (an existing store keeps its own).
    pub partitions: u16,
    /// "text" or "json".
    pub log_format: String,
    /// PostgreSQL URL: run as a cluster node on it instead of the embedded
    /// store.
    pub database_url: Option<String>,
    /// HOST:PORT other nodes and clients use for this node (default: the
    /// listen address).
    pub advertise: Option<String>,
    /// Connections to PostgreSQL per node.
    pub database_pool_size: usize,
    /// Membership and lease timing (cluster mode).
    pub cluster: MembershipOptions,
    /// HTTP API limits and BigBen knobs.
    pub api: ApiOptions,
    /// Firing, concurrency, retries, retention.
    pub engine: EngineOptions,
    /// Webhook client.
    pub http: HttpSinkOptions,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("./belfry-data"),
            partitions: 64,
            log_format: "text".to_string(),
            database_url: None,
            advertise: None,
            database_pool_size: 16,
            cluster: MembershipOptions::default(),
            api: ApiOptions::default(),
            engine: EngineOptions::default(),
            http: HttpSinkOptions::default(),
        }
    }
}

/// The flags that were given, as a partial config layered last.
#[derive(Debug, Default, Serialize)]
struct FlagOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    database_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise: Option<String>,
}

impl Config {
    /// # Errors
    /// An unreadable file, an unknown key, or a value of the wrong type, with
    /// where it came from.
    pub fn load(args: &ServeArgs) -> Result<Config, String> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = &args.config {
            if !path.exists() {
                return Err(format!("config file {} does not exist", path.display()));
            }
            figment = figment.merge(Toml::file(path));
        }
        figment = figment
            .merge(
                Env::prefixed("BELFRY_")
                    .ignore(&["CONFIG"])
                    // `BELFRY_TEST_*` belongs to the test suite (e.g.
                    // BELFRY_TEST_DATABASE_URL); every other BELFRY_* must be
                    // a known key, so a typo is an error, not a silent no-op.
                    .filter(|key| !key.as_str().to_ascii_lowercase().starts_with("test_"))
                    .split("__"),
            )
            .merge(Serialized::defaults(FlagOverrides {
                listen: args.listen,
                data_dir: args.data_dir.clone(),
                partitions: args.partitions,
                log_format: args.log_format.clone(),
                database_url: args.database_url.clone(),
                advertise: args.advertise.clone(),
            }));
        let config: Config = figment.extract().map_err(|e| e.to_string())?;
        if config.partitions == 0 {
            return Err("partitions must be at least 1".to_string());
        }
        let cluster = &config.cluster;
        if cluster.lease_ttl <= cluster.safety_margin + cluster.tick {
            return Err("cluster.lease_ttl_ms must exceed safety_margin_ms + tick_ms".to_string());
        }
        if !matches!(config.log_format.as_str(), "text" | "json") {
            return Err(format!(
                "log_format must be \"text\" or \"json\", not {:?}",
                config.log_format
            ));
        }
        Ok(config)
    }
}
