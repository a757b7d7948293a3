//! The node under test: one the bench started (a real `belfry serve` on a
//! fresh temp data dir, or with `--database-url` on a fresh PostgreSQL
//! database) or one already running at `--target`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use belfry_testkit::{BelfryLaunch, BelfryProcess};
use tempfile::TempDir;

use crate::cli::NodeArgs;
use crate::database::{Database, PostgresCpu};
use crate::stats::{CpuSplit, ProcessSample, RssPeak};

/// How long a node on PostgreSQL may take to own every partition.
const OWNED_DEADLINE: Duration = Duration::from_secs(90);

pub enum Node {
    Started {
        process: BelfryProcess,
        /// Deleted when the node is dropped.
        _data: TempDir,
        /// `--database-url`: the node's fresh database (dropped by
        /// [`Node::close`]) and PostgreSQL's CPU.
        postgres: Option<Box<(Database, Option<PostgresCpu>)>>,
    },
    Running {
        base_url: String,
        pid: Option<u32>,
    },
}

impl Node {
    /// Starts a node or connects to `--target` (checking it answers `/ping`).
    ///
    /// # Errors
    /// When the binary is missing, the node does not become ready, or the
    /// target does not answer.
    pub async fn open(args: &NodeArgs, client: &reqwest::Client) -> anyhow::Result<Node> {
        if let Some(target) = &args.target {
            let base_url = target.trim_end_matches('/').to_string();
            let ping = client
                .get(format!("{base_url}/ping"))
                .send()
                .await
                .with_context(|| format!("{base_url}/ping does not answer"))?;
            if !ping.status().is_success() {
                bail!("{base_url}/ping answered {}", ping.status());
            }
            return Ok(Node::Running {
                base_url,
                pid: args.node_pid,
            });
        }
        let binary = match &args.belfry_bin {
            Some(path) => path.clone(),
            None => default_binary()?,
        };
        if !binary.is_file() {
            bail!(
                "no belfry binary at {} (build it with `cargo build --release -p belfry`, or pass --belfry-bin)",
                binary.display()
            );
        }
        let parent = args.data_parent.clone().unwrap_or_else(std::env::temp_dir);
        let data = tempfile::Builder::new()
            .prefix("belfry-bench-")
            .tempdir_in(&parent)
            .with_context(|| format!("create a data dir under {}", parent.display()))?;
        let mut launch = BelfryLaunch::new(&binary, data.path().join("data"));
        let database = match &args.database_url {
            Some(url) => Some(Database::create(Some(url)).await?),
            None => None,
        };
        if let Some(database) = &database {
            launch = launch.arg("--database-url").arg(&database.url);
        }
        for arg in &args.node_args {
            launch = launch.arg(arg);
        }
        for (key, value) in &args.node_env {
            launch = launch.env(key, value);
        }
        if let Some(key) = crate::load::API_KEY.get() {
            launch = launch.env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", key);
        }
        let process = match BelfryProcess::start(launch).await {
            Ok(process) => process,
            Err(error) => {
                if let Some(database) = &database {
                    database.drop_external().await;
                }
                return Err(error).with_context(|| format!("start {}", binary.display()));
            }
        };
        let postgres = match database {
            Some(database) => {
                let partitions = partitions_arg(&args.node_args);
                if let Err(error) = wait_owned(client, &process.base_url(), partitions).await {
                    database.drop_external().await;
                    return Err(error.context(process.logs_tail(20)));
                }
                let cpu = PostgresCpu::start(&database.url).await;
                Some(Box::new((database, cpu)))
            }
            None => None,
        };
        Ok(Node::Started {
            process,
            _data: data,
            postgres,
        })
    }

    /// Stops a started node and drops its PostgreSQL database, if any.
    pub async fn close(self) {
        if let Node::Started {
            mut process,
            postgres,
            ..
        } = self
        {
            process.kill_9();
            if let Some(postgres) = postgres {
                let (database, cpu) = *postgres;
                drop(cpu);
                database.drop_external().await;
            }
        }
    }

    /// PostgreSQL's CPU so far (its backends of the node's database and its
    /// writers), for a node started with `--database-url`.
    pub async fn postgres_cpu(&self) -> Option<CpuSplit> {
        match self {
            Node::Started {
                postgres: Some(postgres),
                ..
            } => Some(postgres.1.as_ref()?.total().await),
            _ => None,
        }
    }

    pub fn base_url(&self) -> String {
        match self {
            Node::Started { process, .. } => process.base_url(),
            Node::Running { base_url, .. } => base_url.clone(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    pub fn pid(&self) -> Option<u32> {
        match self {
            Node::Started { process, .. } => process.pid(),
            Node::Running { pid, .. } => *pid,
        }
    }

    /// The node's data dir, when the bench started it.
    pub fn data_dir(&self) -> Option<&Path> {
        match self {
            Node::Started { process, .. } => Some(process.data_dir()),
            Node::Running { .. } => None,
        }
    }

    pub fn sample(&self) -> Option<ProcessSample> {
        ProcessSample::read(self.pid()?)
    }

    /// The node now, and its RSS peak from now on, read `every` so often.
    pub fn watch_rss(&self, every: Duration) -> (Option<ProcessSample>, RssPeak) {
        let now = self.sample();
        let peak = RssPeak::start(self.pid(), now.map_or(0, |s| s.rss_bytes), every);
        (now, peak)
    }

    /// kill -9, start again on the same data dir, and time from the start
    /// of the new process until `/ping` answers (polled every 50 ms by the
    /// harness). `None` for a node the bench did not start.
    ///
    /// # Errors
    /// When the restarted node does not become ready.
    pub async fn kill_9_and_restart(&mut self) -> anyhow::Result<Option<Duration>> {
        let Node::Started { process, .. } = self else {
            return Ok(None);
        };
        process.kill_9();
        let started = Instant::now();
        process.restart().await.context("restart after kill -9")?;
        Ok(Some(started.elapsed()))
    }

    /// The last log lines of a started node (empty for a target).
    pub fn logs_tail(&self) -> String {
        match self {
            Node::Started { process, .. } => process.logs_tail(20),
            Node::Running { .. } => String::new(),
        }
    }

    /// Registers `tenant` with an HTTP sink to `url` (BigBen's
    /// `POST /events/tenant/register`).
    ///
    /// # Errors
    /// When the node does not answer 200.
    pub async fn register_tenant(
        &self,
        client: &reqwest::Client,
        tenant: &str,
        url: &str,
    ) -> anyhow::Result<()> {
        self.register_tenant_props(client, tenant, serde_json::json!({"url": url}))
            .await
    }

    /// Registers `tenant` with an HTTP sink of the given BigBen `props`
    /// (`url`, optionally `timeout_ms`).
    ///
    /// # Errors
    /// When the node does not answer 200.
    pub async fn register_tenant_props(
        &self,
        client: &reqwest::Client,
        tenant: &str,
        props: serde_json::Value,
    ) -> anyhow::Result<()> {
        let config = serde_json::json!({"tenant": tenant, "type": "HTTP", "props": props});
        self.register_tenant_config(client, &config).await
    }

    /// Gives `tenant` (an HTTP tenant of `url`) delivery defaults through
    /// `PUT /v1/tenants/{t}`: what `--policy` runs resolve at every fire.
    ///
    /// # Errors
    /// When the node does not answer 200.
    pub async fn set_delivery_defaults(
        &self,
        client: &reqwest::Client,
        tenant: &str,
        url: &str,
    ) -> anyhow::Result<()> {
        let path = format!("/v1/tenants/{}", tenant.replace('/', "%2F"));
        let body = serde_json::json!({ "sink": {
            "type": "http", "url": url, "max_attempts": 20,
            "backoff": { "initial_delay_ms": 1000, "multiplier": 2.0, "max_delay_ms": 60000 },
            "max_age_ms": 3_600_000,
        } });
        let response = client
            .put(self.url(&path))
            .json(&body)
            .send()
            .await
            .context("PUT /v1/tenants/{t}")?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("setting {tenant}'s delivery defaults answered {status}: {body}");
        }
        Ok(())
    }

    /// Registers a tenant with BigBen's whole registration body (`tenant`,
    /// `type`, `props`), e.g. a `MESSAGING` tenant.
    ///
    /// # Errors
    /// When the node does not answer 200.
    pub async fn register_tenant_config(
        &self,
        client: &reqwest::Client,
        config: &serde_json::Value,
    ) -> anyhow::Result<()> {
        let tenant = config["tenant"].as_str().unwrap_or_default();
        let response = client
            .post(self.url("/events/tenant/register"))
            .json(config)
            .send()
            .await
            .context("POST /events/tenant/register")?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("registering tenant {tenant} answered {status}: {body}");
        }
        Ok(())
    }
}

/// The value of `--partitions N` among the node's extra arguments, else
/// the node's default (64).
pub(crate) fn partitions_arg(args: &[String]) -> usize {
    let mut value = None;
    for (i, arg) in args.iter().enumerate() {
        if arg == "--partitions" {
            value = args.get(i + 1).map(String::as_str);
        } else if let Some(v) = arg.strip_prefix("--partitions=") {
            value = Some(v);
        }
    }
    value.and_then(|v| v.parse().ok()).unwrap_or(64)
}

/// Polls `/v1/cluster` until the node owns `partitions` partitions (a node
/// on PostgreSQL acquires its leases after it answers `/ping`).
async fn wait_owned(
    client: &reqwest::Client,
    base_url: &str,
    partitions: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + OWNED_DEADLINE;
    loop {
        let owned = crate::cluster::get_json(client, &format!("{base_url}/v1/cluster"))
            .await
            .and_then(|view| {
                let nodes = view["nodes"].as_array()?.clone();
                Some(
                    nodes
                        .iter()
                        .filter_map(|n| n["partitions"].as_array().map(Vec::len))
                        .sum::<usize>(),
                )
            })
            .unwrap_or(0);
        if owned >= partitions {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the node owned {owned} of {partitions} partitions after {OWNED_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `belfry` next to this executable (both live in `target/<profile>/`).
pub(crate) fn default_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locate belfry-bench's own executable")?;
    let dir = me
        .parent()
        .context("belfry-bench's executable has no parent directory")?;
    Ok(dir.join(format!("belfry{}", std::env::consts::EXE_SUFFIX)))
}
