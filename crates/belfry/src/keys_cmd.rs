//! `belfry keys …`: API keys straight in the store, without a running node
//! (the first admin key of a deployment, or a lost one).
//!
//! - `belfry keys create --role R [--tenant T] [--expires-at RFC3339]`
//!   prints `{"id", "secret", "tenant", "role", "expires_at",
//!   "created_at"}` (the same as `POST /v1/keys`): the only time the secret
//!   is shown;
//! - `belfry keys list` prints `{"keys": [...]}` (no secrets);
//! - `belfry keys revoke ID`.
//!
//! The store is the data directory (`--data-dir`, `BELFRY_DATA_DIR`; a node
//! must not be running on it: the directory is locked) or the cluster's
//! PostgreSQL (`--database-url`, `BELFRY_DATABASE_URL`; nodes see a change
//! within `auth.key_cache_ttl_ms`). Every change is in the audit log, by
//! `cli`. Bad input prints one line on stderr and exits with status 2; a
//! store that cannot be opened, 1.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use belfry_clock::SystemClock;
use belfry_core::auth::{ApiKey, AuditAction, AuditEntry, KeyId, KeySecret, Role};
use belfry_core::{Clock, PartitionCount, TenantName, Timestamp};
use belfry_store::{EmbeddedOptions, EmbeddedStore, SharedStore, StoreError};
use clap::{Args, Subcommand};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key and print it with its secret (shown only this once).
    Create(CreateArgs),
    /// List the keys (never their secrets).
    List(StoreArgs),
    /// Revoke (delete) a key by id.
    Revoke(RevokeArgs),
}

/// Where the keys are stored.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Directory of the embedded store (the node must be stopped)
    #[arg(
        long,
        value_name = "DIR",
        env = "BELFRY_DATA_DIR",
        default_value = "./belfry-data"
    )]
    pub data_dir: PathBuf,

    /// The cluster's PostgreSQL, instead of a data directory
    #[arg(long, value_name = "URL", env = "BELFRY_DATABASE_URL")]
    pub database_url: Option<String>,

    /// Partitions, used only if this command creates the store
    #[arg(
        long,
        value_name = "N",
        env = "BELFRY_PARTITIONS",
        default_value_t = 64
    )]
    pub partitions: u16,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// read, write, worker or admin
    #[arg(long, value_name = "ROLE")]
    pub role: String,

    /// The tenant the key belongs to (every role but admin needs one)
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,

    /// When the key stops working (RFC 3339 with an offset or Z)
    #[arg(long, value_name = "INSTANT")]
    pub expires_at: Option<String>,

    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The key's id (key_...)
    #[arg(value_name = "ID")]
    pub id: String,

    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs a `keys` subcommand.
pub fn run(command: KeysCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("belfry: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("belfry: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Store(message)) => {
            eprintln!("belfry: {message}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    /// Bad input: exit 2.
    Usage(String),
    /// The store: exit 1.
    Store(String),
}

fn store_failure(error: impl std::fmt::Display) -> Failure {
    Failure::Store(error.to_string())
}

async fn execute(command: KeysCommand) -> Result<(), Failure> {
    let now = SystemClock.now();
    match command {
        KeysCommand::Create(args) => {
            let role = Role::parse(&args.role).map_err(|e| Failure::Usage(e.to_string()))?;
            let tenant = args
                .tenant
                .map(TenantName::new)
                .transpose()
                .map_err(|e| Failure::Usage(format!("--tenant: {e}")))?;
            let expires_at = match args.expires_at {
                None => None,
                Some(text) => {
                    let at = Timestamp::parse_rfc3339(&text).ok_or_else(|| {
                        Failure::Usage(format!(
                            "--expires-at {text:?} is not an RFC 3339 instant with an offset"
                        ))
                    })?;
                    if at <= now {
                        return Err(Failure::Usage("--expires-at is not in the future".into()));
                    }
                    Some(at)
                }
            };
            let secret = KeySecret::generate().map_err(store_failure)?;
            let key = ApiKey::new(&secret, tenant, role, now, expires_at)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            let store = open(&args.store).await?;
            if !store
                .put_api_key(key.clone())
                .await
                .map_err(store_failure)?
            {
                return Err(Failure::Store(
                    "a key with this secret exists already".into(),
                ));
            }
            audit(&store, now, AuditAction::KeyCreated, &key).await?;
            let answer = json!({
                "id": key.id.as_str(),
                "secret": secret.expose(),
                "tenant": key.tenant.as_ref().map(TenantName::as_str),
                "role": key.role,
                "expires_at": key.expires_at.map(Timestamp::to_rfc3339),
                "created_at": key.created_at.to_rfc3339(),
            });
            println!("{answer}");
            eprintln!("belfry: store the secret now: it is not shown again");
            Ok(())
        }
        KeysCommand::List(args) => {
            let store = open(&args).await?;
            let keys = store.list_api_keys().await.map_err(store_failure)?;
            let views: Vec<_> = keys
                .iter()
                .map(|key| {
                    json!({
                        "id": key.id.as_str(),
                        "tenant": key.tenant.as_ref().map(TenantName::as_str),
                        "role": key.role,
                        "expires_at": key.expires_at.map(Timestamp::to_rfc3339),
                        "created_at": key.created_at.to_rfc3339(),
                        "last_used_at": key.last_used_at.map(Timestamp::to_rfc3339),
                    })
                })
                .collect();
            println!("{}", json!({ "keys": views }));
            Ok(())
        }
        KeysCommand::Revoke(args) => {
            let id = KeyId::parse(&args.id)
                .ok_or_else(|| Failure::Usage(format!("{:?} is not a key id", args.id)))?;
            let store = open(&args.store).await?;
            let Some(removed) = store.delete_api_key(&id).await.map_err(store_failure)? else {
                return Err(Failure::Store(format!("no key {id}")));
            };
            audit(&store, now, AuditAction::KeyRevoked, &removed).await?;
            println!("revoked {id}");
            Ok(())
        }
    }
}

async fn audit(
    store: &SharedStore,
    now: Timestamp,
    action: AuditAction,
    key: &ApiKey,
) -> Result<(), Failure> {
    let entry = AuditEntry::new(
        now,
        "cli",
        action,
        key.tenant.clone(),
        Some(key.id.to_string()),
    )
    .map_err(store_failure)?;
    store.append_audit(entry).await.map_err(store_failure)
}

async fn open(args: &StoreArgs) -> Result<SharedStore, Failure> {
    let partitions = PartitionCount::new(args.partitions)
        .ok_or_else(|| Failure::Usage("--partitions must be at least 1".into()))?;
    match &args.database_url {
        #[cfg(feature = "postgres")]
        Some(url) => {
            let store = belfry_postgres::PostgresStore::connect(belfry_postgres::PostgresOptions {
                url: url.clone(),
                partitions,
                pool_size: 1,
                notify_horizon: std::time::Duration::ZERO,
                clock_skew_margin: belfry_postgres::DEFAULT_CLOCK_SKEW_MARGIN,
                clock: Arc::new(SystemClock),
            })
            .await
            .map_err(|e| Failure::Store(format!("cannot connect to PostgreSQL: {e}")))?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err(Failure::Usage(
            "this build of belfry has no PostgreSQL support (cargo feature `postgres`)".into(),
        )),
        None => {
            let store = EmbeddedStore::open(EmbeddedOptions::new(&args.data_dir, partitions))
                .map_err(|e| match e {
                    StoreError::Unavailable(in_use) => {
                        Failure::Store(format!("{in_use} (or manage keys through its API)"))
                    }
                    e => Failure::Store(format!(
                        "cannot open the store in {}: {e}",
                        args.data_dir.display()
                    )),
                })?;
            Ok(Arc::new(store))
        }
    }
}
