//! The node under test: one the bench started (a real `belfry serve` on a
//! fresh temp data dir) or one already running at `--target`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use belfry_testkit::{BelfryLaunch, BelfryProcess};
use tempfile::TempDir;

use crate::cli::NodeArgs;
use crate::stats::ProcessSample;

pub enum Node {
    Started {
        process: BelfryProcess,
        /// Deleted when the node is dropped.
        _data: TempDir,
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
        for arg in &args.node_args {
            launch = launch.arg(arg);
        }
        for (key, value) in &args.node_env {
            launch = launch.env(key, value);
        }
        let process = BelfryProcess::start(launch)
            .await
            .with_context(|| format!("start {}", binary.display()))?;
        Ok(Node::Started {
            process,
            _data: data,
        })
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
        let config = serde_json::json!({"tenant": tenant, "type": "HTTP", "props": {"url": url}});
        let response = client
            .post(self.url("/events/tenant/register"))
            .json(&config)
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

/// `belfry` next to this executable (both live in `target/<profile>/`).
pub(crate) fn default_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locate belfry-bench's own executable")?;
    let dir = me
        .parent()
        .context("belfry-bench's executable has no parent directory")?;
    Ok(dir.join(format!("belfry{}", std::env::consts::EXE_SUFFIX)))
}
