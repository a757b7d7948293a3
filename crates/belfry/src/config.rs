//! Node configuration: defaults → TOML file → `BELFRY_*` environment →
//! command-line flags.
//!
//! Every section is an option struct that owns its keys, defaults, doc
//! comments (the user reference: [`crate::reference`] renders the README's
//! table from them) and checks; [`Config::validate`] delegates to them.

use std::net::SocketAddr;
use std::path::PathBuf;

use belfry_api::{ApiOptions, AuthMode, AuthOptions};
use belfry_core::config::{ConfigKeys, Problems};
use belfry_core::pull::PullConfig;
use belfry_engine::EngineOptions;
use belfry_engine::membership::MembershipOptions;
use belfry_engine::quotas::LimitsOptions;
use belfry_sinks::egress::EgressOptions;
use belfry_sinks::http::HttpSinkOptions;
use belfry_sinks::kafka::KafkaSinkOptions;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::cli::ServeArgs;
use crate::listener::ServerOptions;
use crate::tls::TlsOptions;

#[derive(Debug, Clone, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP API.
    pub listen: SocketAddr,
    /// Directory of the embedded store (created mode 0700; an existing one
    /// open to other users is set to 0700, with a warning).
    pub data_dir: PathBuf,
    /// Partitions of a *new* store (an existing one keeps its own).
    pub partitions: u16,
    /// `text` (coloured only on a terminal and without `NO_COLOR`) or
    /// `json`; the level is set with `RUST_LOG` (default `info`, storage
    /// engine at `warn`).
    pub log_format: String,
    /// Run as a cluster node on this PostgreSQL database instead of the
    /// embedded store; TLS by libpq's `sslmode` (`disable`, `prefer`
    /// (default), `require`, `verify-ca`, `verify-full`) and `sslrootcert`
    /// (a PEM CA file, or `system`) in its query (`docs/operations.md`,
    /// "Database TLS").
    pub database_url: Option<String>,
    /// `HOST:PORT` other nodes and clients use for this node.
    #[config(default = "the listen address")]
    pub advertise: Option<String>,
    /// PostgreSQL connections per node for events, leases, tenants and
    /// keys; the cluster coordinator keeps three of its own beside them, so
    /// a busy data path never delays a lease renewal, plus a presence
    /// session and the LISTEN connection.
    pub database_pool_size: usize,
    /// Cluster mode: how far the nodes' clocks may disagree. A change made
    /// through any node is announced to the partition's owner when the
    /// event is due within `engine.window_ms` plus this margin (on the
    /// writer's clock), so a writer whose clock lags the owner's by up to
    /// this still reaches the far edge of the owner's window. `0`: the
    /// clocks agree exactly.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "clock_skew_margin_ms"
    )]
    pub clock_skew_margin: std::time::Duration,
    /// Membership and lease timing (cluster mode).
    #[config(section)]
    pub cluster: MembershipOptions,
    /// HTTP API limits and BigBen knobs.
    #[config(section)]
    pub api: ApiOptions,
    /// Firing, concurrency, retries, retention.
    #[config(section)]
    pub engine: EngineOptions,
    /// Webhook client.
    #[config(section)]
    pub http: HttpSinkOptions,
    /// The API listener: timeouts for slow clients, the connection cap.
    #[config(section)]
    pub server: ServerOptions,
    /// Which addresses webhooks may reach.
    #[config(section)]
    pub egress: EgressOptions,
    /// Delivery sinks besides the webhook client: `sinks.kafka` (producers
    /// for Kafka tenants).
    #[config(section)]
    pub sinks: SinksConfig,
    /// TLS for the API (on when `tls.cert_file` is set).
    #[config(section)]
    pub tls: TlsOptions,
    /// Per-tenant limits: quotas, and single tenants' delivery limits.
    #[config(section)]
    pub limits: LimitsOptions,
    /// The pull queue's bounds (`docs/pull.md`).
    #[config(section)]
    pub pull: PullConfig,
    /// Kafka: `[kafka.ingest]` consumes event requests from topics.
    #[cfg(feature = "kafka")]
    #[config(section)]
    pub kafka: KafkaConfig,
    /// API keys, open mode, the Host allow-list and the per-key rate limit
    /// (`docs/security.md`).
    #[config(section)]
    pub auth: AuthOptions,
}

/// `[kafka]`.
#[cfg(feature = "kafka")]
#[derive(Debug, Clone, Default, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Present: read event requests from Kafka topics; keys and defaults in
    /// [`docs/kafka.md`](docs/kafka.md#configuration).
    #[config(default = "off", toml_only)]
    pub ingest: Option<belfry_kafka_ingest::IngestOptions>,
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
            // `belfry_postgres::DEFAULT_CLOCK_SKEW_MARGIN`.
            clock_skew_margin: std::time::Duration::from_secs(5),
            cluster: MembershipOptions::default(),
            api: ApiOptions::default(),
            engine: EngineOptions::default(),
            http: HttpSinkOptions::default(),
            server: ServerOptions::default(),
            egress: EgressOptions::default(),
            sinks: SinksConfig::default(),
            tls: TlsOptions::default(),
            limits: LimitsOptions::default(),
            pull: PullConfig::default(),
            #[cfg(feature = "kafka")]
            kafka: KafkaConfig::default(),
            auth: AuthOptions::default(),
        }
    }
}

/// The `sinks` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct SinksConfig {
    /// Producers of Kafka deliveries (`MESSAGING` tenants).
    #[config(section)]
    pub kafka: KafkaSinkOptions,
}

/// Environment variables `BELFRY_*` set keys; `__` separates nested keys
/// (`BELFRY_ENGINE__RETRY__MAX_DELAY_MS`).
pub(crate) const ENV_PREFIX: &str = "BELFRY_";
pub(crate) const ENV_SPLIT: &str = "__";

/// The keys `belfry serve` flags set ([`FlagOverrides`]), for the reference.
pub(crate) const FLAGS: &[(&str, &str)] = &[
    ("listen", "--listen"),
    ("data_dir", "--data-dir"),
    ("partitions", "--partitions"),
    ("log_format", "--log-format"),
    ("database_url", "--database-url"),
    ("advertise", "--advertise"),
    ("tls.cert_file", "--tls-cert"),
    ("tls.key_file", "--tls-key"),
    ("tls.client_ca_file", "--tls-client-ca"),
    ("auth.mode", "--insecure-no-auth"),
];

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
    #[serde(skip_serializing_if = "Option::is_none")]
    auth: Option<AuthFlags>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<TlsFlags>,
}

/// `--tls-cert`, `--tls-key`, `--tls-client-ca`: only those given, so the
/// rest of `[tls]` keeps what the file or environment set.
#[derive(Debug, Serialize)]
struct TlsFlags {
    #[serde(skip_serializing_if = "Option::is_none")]
    cert_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_ca_file: Option<PathBuf>,
}

impl TlsFlags {
    fn of(args: &ServeArgs) -> Option<TlsFlags> {
        let flags = TlsFlags {
            cert_file: args.tls_cert.clone(),
            key_file: args.tls_key.clone(),
            client_ca_file: args.tls_client_ca.clone(),
        };
        let any =
            flags.cert_file.is_some() || flags.key_file.is_some() || flags.client_ca_file.is_some();
        any.then_some(flags)
    }
}

/// `--insecure-no-auth`.
#[derive(Debug, Serialize)]
struct AuthFlags {
    mode: AuthMode,
}

impl Config {
    /// # Errors
    /// An unreadable file, an unknown key (also in a nested section such as
    /// `engine.retry`, and in `BELFRY_*` variables), a value of the wrong
    /// type, or a value [`Config::validate`] refuses, each naming the key
    /// and where it came from.
    ///
    /// One adjustment is made rather than refused: when
    /// `engine.max_in_flight` is lowered below the *default* per-tenant
    /// limit and `engine.max_in_flight_per_tenant` was not given, the
    /// per-tenant limit follows it down. Given explicitly above
    /// `engine.max_in_flight`, it is refused.
    pub fn load(args: &ServeArgs) -> Result<Config, String> {
        // Everything the user gave (file, environment, flags), without the
        // defaults, to tell an explicit setting from a default one.
        let mut given = Figment::new();
        if let Some(path) = &args.config {
            if !path.exists() {
                return Err(format!("config file {} does not exist", path.display()));
            }
            given = given.merge(Toml::file(path));
        }
        given = given
            .merge(
                Env::prefixed(ENV_PREFIX)
                    .ignore(&["CONFIG"])
                    // `BELFRY_TEST_*` belongs to the test suite (e.g.
                    // BELFRY_TEST_DATABASE_URL); every other BELFRY_* must be
                    // a known key, so a typo is an error, not a silent no-op.
                    .filter(|key| !key.as_str().to_ascii_lowercase().starts_with("test_"))
                    .split(ENV_SPLIT),
            )
            .merge(Serialized::defaults(FlagOverrides {
                listen: args.listen,
                data_dir: args.data_dir.clone(),
                partitions: args.partitions,
                log_format: args.log_format.clone(),
                database_url: args.database_url.clone(),
                advertise: args.advertise.clone(),
                auth: args.insecure_no_auth.then_some(AuthFlags {
                    mode: AuthMode::None,
                }),
                tls: TlsFlags::of(args),
            }));
        let figment = Figment::from(Serialized::defaults(Config::default())).merge(given.clone());
        let mut config: Config = figment.extract().map_err(describe_errors)?;
        let engine = &mut config.engine;
        if !given.contains("engine.max_in_flight_per_tenant") {
            engine.max_in_flight_per_tenant =
                engine.max_in_flight_per_tenant.min(engine.max_in_flight);
        }
        config.validate()?;
        Ok(config)
    }

    /// The engine's options: `[engine]` with the `[limits]` and `[pull]`
    /// sections it enforces.
    pub fn engine_options(&self) -> EngineOptions {
        EngineOptions {
            limits: self.limits.clone(),
            pull: self.pull.clone(),
            ..self.engine.clone()
        }
    }

    /// Refuses values a node cannot run with: zero intervals, periods,
    /// timeouts, windows and limits where zero means nothing (a zero
    /// `engine.purge_interval_ms` would panic a background task, a zero
    /// in-flight limit stall every delivery), and contradictory
    /// combinations. Each section checks its own keys; zero stays valid
    /// where a key's doc comment says what it means. Every problem is
    /// reported, each naming its key.
    ///
    /// # Errors
    /// The problems found, separated by `; `.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Problems::default();
        problems.at_least_one("partitions", self.partitions);
        problems.at_least_one("database_pool_size", self.database_pool_size);
        if !matches!(self.log_format.as_str(), "text" | "json") {
            problems.push(format!(
                "log_format must be \"text\" or \"json\", not {:?}",
                self.log_format
            ));
        }
        problems.section("cluster", |p| self.cluster.validate(p));
        problems.section("api", |p| self.api.validate(p));
        problems.section("engine", |p| self.engine.validate(p));
        problems.section("http", |p| self.http.validate(p));
        problems.section("server", |p| self.server.validate(p));
        problems.section("sinks.kafka", |p| self.sinks.kafka.validate(p));
        problems.section("tls", |p| self.tls.validate(p));
        problems.section("limits", |p| self.limits.validate(p));
        problems.section("pull", |p| self.pull.validate(p));
        #[cfg(feature = "kafka")]
        if let Some(ingest) = &self.kafka.ingest {
            problems.section("kafka.ingest", |p| ingest.validate(p));
        }
        problems.section("auth", |p| self.auth.validate(p));
        problems.finish().map_err(|error| error.to_string())
    }
}

/// Figment's errors, one per problem, each naming the dotted config key and
/// where the value came from (the file, or the environment variable).
fn describe_errors(errors: figment::Error) -> String {
    errors
        .into_iter()
        .map(|error| describe_error(&error))
        .collect::<Vec<_>>()
        .join("; ")
}

fn describe_error(error: &figment::Error) -> String {
    use figment::error::{Actual, Kind};

    let key = error.path.join(".");
    let origin = origin(error);
    match &error.kind {
        Kind::UnknownField(_, known) => {
            let section = match error.path.split_last() {
                Some((_, parents)) if !parents.is_empty() => parents.join("."),
                _ => "the top level".to_string(),
            };
            format!(
                "unknown key {key}{origin} (the keys of {section} are: {})",
                known.join(", ")
            )
        }
        Kind::InvalidValue(Actual::Signed(n), _) | Kind::InvalidType(Actual::Signed(n), _)
            if *n < 0 =>
        {
            format!("{key} must not be negative, not {n}{origin}")
        }
        Kind::InvalidType(Actual::Float(x), expected)
            if matches!(
                expected.as_str(),
                "u8" | "u16" | "u32" | "u64" | "u128" | "usize"
            ) =>
        {
            format!("{key} must be a whole number, not {x}{origin}")
        }
        other if key.is_empty() => format!("{other}{origin}"),
        other => format!("{key}: {other}{origin}"),
    }
}

/// ` in FILE` or ` in environment variable NAME`, when known.
fn origin(error: &figment::Error) -> String {
    let Some(metadata) = &error.metadata else {
        return String::new();
    };
    if let Some(source) = &metadata.source {
        return format!(" in {source}");
    }
    if metadata.name.contains("environment variable") && !error.path.is_empty() {
        // Figment's own rendering joins the keys with `.` and drops the
        // prefix; the variable's real name uses `ENV_SPLIT`.
        let keys: Vec<String> = error.path.iter().map(|k| k.to_ascii_uppercase()).collect();
        return format!(
            " in environment variable {ENV_PREFIX}{}",
            keys.join(ENV_SPLIT)
        );
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(config: Option<PathBuf>) -> ServeArgs {
        ServeArgs {
            listen: None,
            data_dir: None,
            config,
            partitions: None,
            database_url: None,
            advertise: None,
            log_format: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            insecure_no_auth: false,
        }
    }

    /// Loads a config from `toml` written to a temporary file.
    fn load_toml(toml: &str) -> Result<Config, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("belfry.toml");
        std::fs::write(&path, toml).unwrap();
        Config::load(&args(Some(path)))
    }

    fn load_error(toml: &str) -> String {
        match load_toml(toml) {
            Ok(_) => panic!("accepted:\n{toml}"),
            Err(error) => error,
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Config::default().validate(), Ok(()));
        let config = load_toml("").unwrap();
        assert_eq!(config.engine.max_in_flight_per_tenant, 256);
    }

    #[test]
    fn unknown_keys_in_every_section_are_refused_naming_the_key() {
        for (toml, key, known) in [
            ("typo = 1", "typo", "listen"),
            ("[engine]\nwindow_mss = 5", "engine.window_mss", "window_ms"),
            (
                "[engine.retry]\nfast_retry = 5",
                "engine.retry.fast_retry",
                "fast_retries",
            ),
            ("[cluster]\ntick = 5", "cluster.tick", "tick_ms"),
            ("[api]\nmax_batches = 5", "api.max_batches", "max_batch"),
            ("[http]\ntimeout = 5", "http.timeout", "request_timeout_ms"),
            (
                "[auth]\nmodes = \"none\"",
                "auth.modes",
                "bootstrap_admin_key",
            ),
        ] {
            let error = load_error(toml);
            assert!(
                error.starts_with(&format!("unknown key {key} in ")),
                "{toml:?}: {error}"
            );
            assert!(error.contains("belfry.toml"), "names the file: {error}");
            assert!(error.contains(known), "lists the known keys: {error}");
        }
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn kafka_ingest_is_read_checked_and_refuses_unknown_keys() {
        let config = load_toml(
            "[kafka.ingest]\nbootstrap_servers = \"127.0.0.1:9092\"\ntopics = [\"requests\"]\n\
             dead_letter_topic = \"requests-dlq\"\nresponse_topic = \"responses\"\n\
             format = \"bigben\"\ncommit_interval_ms = 250\nallowed_tenants = [\"*\"]\n\
             [kafka.ingest.consumer]\n\"session.timeout.ms\" = \"6000\"\n",
        )
        .unwrap();
        let ingest = config.kafka.ingest.unwrap();
        assert_eq!(ingest.commit_interval.as_millis(), 250);
        assert_eq!(ingest.consumer["session.timeout.ms"], "6000");
        assert!(load_toml("").unwrap().kafka.ingest.is_none());

        let error = load_error("[kafka.ingest]\ntopic = \"requests\"\n");
        assert!(
            error.starts_with("unknown key kafka.ingest.topic in "),
            "{error}"
        );
        let error = load_error(
            "[kafka.ingest]\nbootstrap_servers = \"b:9092\"\ntopics = [\"requests\"]\n\
             commit_interval_ms = 0\nallowed_tenants = [\"*\"]\n",
        );
        assert!(
            error.contains("kafka.ingest.dead_letter_topic is required"),
            "{error}"
        );
        assert!(
            error.contains("kafka.ingest.commit_interval_ms must be at least 1, not 0"),
            "{error}"
        );
        let error = load_error("[kafka.ingest]\nbatch_linger_ms = \"5s\"\n");
        assert!(error.contains("kafka.ingest.batch_linger_ms"), "{error}");
    }

    #[test]
    fn every_zero_interval_timeout_window_and_limit_is_refused_naming_its_key() {
        for (section, field) in [
            ("", "partitions"),
            ("", "database_pool_size"),
            ("cluster", "lease_ttl_ms"),
            ("cluster", "tick_ms"),
            ("cluster", "presence_interval_ms"),
            ("api", "max_body_bytes"),
            ("api", "max_batch"),
            ("api", "default_list_limit"),
            ("api", "max_list_limit"),
            ("api", "max_answer_bytes"),
            ("api", "max_answer_bytes_in_flight"),
            ("engine", "window_ms"),
            ("engine", "max_events_in_memory"),
            ("engine", "max_in_flight"),
            ("engine", "max_in_flight_per_tenant"),
            ("engine", "purge_interval_ms"),
            ("engine.retry", "initial_delay_ms"),
            ("engine.retry", "max_delay_ms"),
            ("http", "connect_timeout_ms"),
            ("http", "request_timeout_ms"),
            ("http", "max_tenant_timeout_ms"),
            ("http", "pool_idle_timeout_ms"),
            ("server", "header_read_timeout_ms"),
            ("server", "body_read_timeout_ms"),
            ("server", "request_timeout_ms"),
            ("server", "max_connections"),
            ("server", "write_timeout_ms"),
            ("limits", "count_refresh_ms"),
        ] {
            let (toml, key) = if section.is_empty() {
                (format!("{field} = 0"), field.to_string())
            } else {
                (
                    format!("[{section}]\n{field} = 0"),
                    format!("{section}.{field}"),
                )
            };
            let error = load_error(&toml);
            assert!(
                error.contains(&format!("{key} must be at least 1, not 0")),
                "{toml:?}: {error}"
            );
        }
    }

    #[test]
    fn zero_is_accepted_where_it_means_something() {
        let config = load_toml(
            "[cluster]\nsafety_margin_ms = 0\n\
             [api]\nlapse_offset_ms = 0\n\
             [engine]\nlookback_ms = 0\nrecord_linger_ms = 0\nshutdown_grace_ms = 0\n\
             history_retention_ms = 0\nschedule_lead_ms = 0\nschedule_max_missed_recorded = 0\n\
             [engine.retry]\nfast_retries = 0\nbacklog_limit_ms = 0\n\
             [http]\npool_max_idle_per_host = 0\n\
             [limits]\nmax_pending_events_per_tenant = 0\nmax_schedules_per_tenant = 0\n\
             max_payload_bytes = 0\nmax_dry_runs_per_second = 0\n\
             max_schedule_occurrences_per_minute = 0\nmax_bulk_actions_per_tenant = 0\n",
        )
        .unwrap();
        assert_eq!(config.engine_options().limits, LimitsOptions::unlimited());
        let limited = load_toml(
            "[limits.tenants.\"acme/billing\"]\nmax_deliveries_per_second = 50\n\
             max_concurrent_deliveries = 4",
        )
        .unwrap();
        let limits = &limited.engine_options().limits.tenants["acme/billing"];
        assert_eq!(limits.max_deliveries_per_second, Some(50));
        assert_eq!(limits.max_concurrent_deliveries, Some(4));
        assert!(config.engine.shutdown_grace.is_zero());
        assert!(config.engine.retry.backlog_limit.is_zero());
        load_toml("[engine]\nschedule_misfire_threshold_ms = 0").unwrap();
    }

    #[test]
    fn contradictory_values_are_refused() {
        for (toml, expected) in [
            (
                "[engine.retry]\ninitial_delay_ms = 5000\nmax_delay_ms = 1000",
                "engine.retry.max_delay_ms (1000) must not be less than \
                 engine.retry.initial_delay_ms (5000)",
            ),
            (
                "[engine.retry]\nmultiplier = 0.5",
                "engine.retry.multiplier must be a finite number of at least 1.0, not 0.5",
            ),
            (
                "[engine.retry]\nmultiplier = -2.0",
                "engine.retry.multiplier must be a finite number of at least 1.0, not -2",
            ),
            (
                "[engine.retry]\nmultiplier = nan",
                "engine.retry.multiplier must be a finite number of at least 1.0, not NaN",
            ),
            (
                "[engine.retry]\nmultiplier = inf",
                "engine.retry.multiplier must be a finite number of at least 1.0, not inf",
            ),
            (
                "[engine]\nmax_in_flight = 10\nmax_in_flight_per_tenant = 20",
                "engine.max_in_flight_per_tenant (20) must not exceed engine.max_in_flight (10)",
            ),
            (
                "[engine]\nmax_in_flight = 100\nmax_in_flight_per_tenant = 256",
                "engine.max_in_flight_per_tenant (256) must not exceed engine.max_in_flight (100)",
            ),
            (
                "[api]\ndefault_list_limit = 500\nmax_list_limit = 100",
                "api.default_list_limit (500) must not exceed api.max_list_limit (100)",
            ),
            (
                "[cluster]\nlease_ttl_ms = 2000\ntick_ms = 1000\nsafety_margin_ms = 1000",
                "cluster.lease_ttl_ms (2000) must exceed cluster.safety_margin_ms (1000) + \
                 cluster.tick_ms (1000)",
            ),
            (
                "[engine]\nschedule_lead_ms = 0\nschedule_misfire_threshold_ms = 0",
                "engine.schedule_lead_ms and engine.schedule_misfire_threshold_ms must not \
                 both be 0",
            ),
            (
                "[limits.tenants.\"acme/billing\"]\nmax_deliveries_per_second = 0",
                "limits.tenants.\"acme/billing\".max_deliveries_per_second must be at least 1, \
                 not 0",
            ),
            (
                "[limits.tenants.\"\"]\nmax_concurrent_deliveries = 5",
                "limits.tenants: \"\" is not a valid tenant name",
            ),
            (
                "[tls]\ncert_file = \"cert.pem\"",
                "tls.cert_file is set but tls.key_file is not",
            ),
            (
                "[tls]\nkey_file = \"key.pem\"\nclient_ca_file = \"ca.pem\"",
                "tls.key_file is set but tls.cert_file is not; tls.client_ca_file needs \
                 tls.cert_file and tls.key_file",
            ),
            (
                "[tls]\nclient_auth = \"sometimes\"",
                "tls.client_auth: unknown variant: found `sometimes`",
            ),
            (
                "log_format = \"xml\"",
                "log_format must be \"text\" or \"json\", not \"xml\"",
            ),
            (
                "[auth]\nbootstrap_admin_key = \"bfy_short\"",
                "auth.bootstrap_admin_key is not a valid key: an API key starts with \"bfy_\"",
            ),
            (
                "[auth]\nallowed_hosts = [\"http://evil.example/\"]",
                "auth.allowed_hosts: \"http://evil.example/\" is not a host name",
            ),
            ("[auth]\nmode = \"off\"", "auth.mode: unknown variant"),
        ] {
            let error = load_error(toml);
            assert!(error.contains(expected), "{toml:?}: {error}");
        }
    }

    #[test]
    fn a_lowered_max_in_flight_takes_the_default_per_tenant_limit_along() {
        let config = load_toml("[engine]\nmax_in_flight = 64").unwrap();
        assert_eq!(config.engine.max_in_flight, 64);
        assert_eq!(config.engine.max_in_flight_per_tenant, 64);
        let config =
            load_toml("[engine]\nmax_in_flight = 64\nmax_in_flight_per_tenant = 8").unwrap();
        assert_eq!(config.engine.max_in_flight_per_tenant, 8);
        let config = load_toml("[engine]\nmax_in_flight = 4096").unwrap();
        assert_eq!(config.engine.max_in_flight_per_tenant, 256);
    }

    #[test]
    fn negative_and_fractional_numbers_get_a_clear_message() {
        let error = load_error("[engine]\npurge_interval_ms = -5");
        assert!(
            error.starts_with("engine.purge_interval_ms must not be negative, not -5 in "),
            "{error}"
        );
        let error = load_error("[engine]\nmax_in_flight = -1");
        assert!(
            error.starts_with("engine.max_in_flight must not be negative, not -1 in "),
            "{error}"
        );
        let error = load_error("partitions = -3");
        assert!(
            error.starts_with("partitions must not be negative, not -3 in "),
            "{error}"
        );
        let error = load_error("[http]\nconnect_timeout_ms = 1.5");
        assert!(
            error.starts_with("http.connect_timeout_ms must be a whole number, not 1.5 in "),
            "{error}"
        );
        let error = load_error("[engine]\nwindow_ms = \"soon\"");
        assert!(
            error.starts_with("engine.window_ms: invalid type"),
            "{error}"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let error = load_error("[engine]\npurge_interval_ms = 0\n[cluster]\ntick_ms = 0");
        assert!(
            error.contains("cluster.tick_ms must be at least 1"),
            "{error}"
        );
        assert!(
            error.contains("engine.purge_interval_ms must be at least 1"),
            "{error}"
        );
    }

    #[test]
    fn flags_are_validated_too() {
        let mut flags = args(None);
        flags.partitions = Some(0);
        assert_eq!(
            Config::load(&flags).unwrap_err(),
            "partitions must be at least 1, not 0"
        );
        let mut flags = args(None);
        flags.log_format = Some("yaml".to_string());
        assert!(Config::load(&flags).unwrap_err().contains("log_format"));
    }

    #[test]
    fn tls_flags_set_their_keys_and_leave_the_rest_of_the_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("belfry.toml");
        std::fs::write(
            &path,
            "[tls]\ncert_file = \"file.pem\"\nclient_auth = \"optional\"\nreload_interval_ms = 250\n",
        )
        .unwrap();
        let mut flags = args(Some(path));
        flags.tls_cert = Some(PathBuf::from("flag.pem"));
        flags.tls_key = Some(PathBuf::from("flag-key.pem"));
        flags.tls_client_ca = Some(PathBuf::from("clients.pem"));
        let tls = Config::load(&flags).unwrap().tls;
        assert_eq!(tls.cert_file, Some(PathBuf::from("flag.pem")), "flags win");
        assert_eq!(tls.key_file, Some(PathBuf::from("flag-key.pem")));
        assert_eq!(tls.client_ca_file, Some(PathBuf::from("clients.pem")));
        assert_eq!(tls.client_auth, crate::tls::ClientAuth::Optional);
        assert_eq!(tls.reload_interval.as_millis(), 250);

        let mut flags = args(None);
        flags.tls_cert = Some(PathBuf::from("cert.pem"));
        assert_eq!(
            Config::load(&flags).unwrap_err(),
            "tls.cert_file is set but tls.key_file is not"
        );
    }

    #[test]
    fn validate_checks_a_config_built_in_code() {
        let mut config = Config::default();
        config.engine.purge_interval = std::time::Duration::ZERO;
        config.cluster.tick = std::time::Duration::ZERO;
        config.engine.retry.multiplier = f64::NAN;
        let error = config.validate().unwrap_err();
        assert_eq!(error.matches("; ").count(), 2, "{error}");
        // In code, a per-tenant limit above the global one is not adjusted.
        let mut config = Config::default();
        config.engine.max_in_flight = 10;
        assert!(
            config
                .validate()
                .unwrap_err()
                .contains("max_in_flight_per_tenant")
        );
    }

    #[test]
    fn a_missing_config_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let error = Config::load(&args(Some(dir.path().join("nope.toml")))).unwrap_err();
        assert!(error.contains("does not exist"), "{error}");
    }
}
