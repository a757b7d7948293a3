//! A harness for integration tests of the real `belfry` binary.
//!
//! [`BelfryProcess::start`] runs `belfry serve --listen 127.0.0.1:PORT
//! --data-dir DIR ...`, sends its stdout and stderr to log files in a temp
//! dir, and waits until `GET /ping` answers 200. The child is killed when the
//! handle drops, so a failing test leaves no process behind.

use std::fs::{File, OpenOptions};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tempfile::TempDir;

/// How long a start may take before it counts as failed. Generous: debug
/// builds on a loaded 2-core machine recover large data dirs slowly.
pub const READY_DEADLINE: Duration = Duration::from_secs(60);

/// How long [`BelfryProcess::terminate`] waits after SIGTERM before SIGKILL.
pub const TERMINATE_DEADLINE: Duration = Duration::from_secs(30);

/// Lines of each log shown in error messages.
const TAIL_LINES: usize = 40;

/// What to run.
#[derive(Debug, Clone)]
pub struct BelfryLaunch {
    /// The binary; callers pass `env!("CARGO_BIN_EXE_belfry")`.
    pub binary: PathBuf,
    pub data_dir: PathBuf,
    /// The listen port on 127.0.0.1; a free one when `None`.
    pub port: Option<u16>,
    /// Appended after `serve --listen .. --data-dir ..`.
    pub extra_args: Vec<String>,
    pub extra_env: Vec<(String, String)>,
    /// Whether the node runs with `egress.policy = "internal"` (the
    /// default here): tests deliver to receivers on 127.0.0.1, which the
    /// node's own default refuses once it has keys. Turned off by
    /// [`BelfryLaunch::default_egress`]; an `env` setting wins either way.
    pub internal_egress: bool,
}

impl BelfryLaunch {
    pub fn new(binary: impl Into<PathBuf>, data_dir: impl Into<PathBuf>) -> Self {
        BelfryLaunch {
            binary: binary.into(),
            data_dir: data_dir.into(),
            port: None,
            extra_args: Vec::new(),
            extra_env: Vec::new(),
            internal_egress: true,
        }
    }

    /// Runs the node with its own default egress policy, for tests of
    /// that default.
    pub fn default_egress(mut self) -> Self {
        self.internal_egress = false;
        self
    }

    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_env.push((key.into(), value.into()));
        self
    }
}

/// Why the harness could not bring belfry up.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("cannot prepare the log files in {dir}: {source}")]
    Logs {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot spawn {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("belfry exited during startup with {status}\n{logs}")]
    ExitedEarly { status: ExitStatus, logs: String },
    #[error("belfry did not answer GET /ping with 200 within {deadline:?}\n{logs}")]
    NotReady { deadline: Duration, logs: String },
}

/// A running (or stopped) belfry child process.
#[derive(Debug)]
pub struct BelfryProcess {
    launch: BelfryLaunch,
    port: u16,
    child: Option<Child>,
    /// Holds `stdout.log` and `stderr.log`; every start appends to them.
    log_dir: TempDir,
}

impl BelfryProcess {
    /// Spawns belfry and waits until it answers `GET /ping`.
    ///
    /// # Errors
    /// When it cannot be spawned, exits early, or is not ready within
    /// [`READY_DEADLINE`]; the error carries the tail of its logs.
    pub async fn start(launch: BelfryLaunch) -> Result<Self, HarnessError> {
        let log_dir = tempfile::Builder::new()
            .prefix("belfry-logs-")
            .tempdir()
            .map_err(|source| HarnessError::Logs {
                dir: std::env::temp_dir(),
                source,
            })?;
        let port = launch.port.unwrap_or_else(free_port);
        let mut process = BelfryProcess {
            launch,
            port,
            child: None,
            log_dir,
        };
        process.spawn_and_wait().await?;
        Ok(process)
    }

    async fn spawn_and_wait(&mut self) -> Result<(), HarnessError> {
        let stdout = self.open_log("stdout.log")?;
        let stderr = self.open_log("stderr.log")?;
        let mut command = Command::new(&self.launch.binary);
        if self.launch.internal_egress {
            // Set first: a test's own `env` of the same name wins.
            command.env("BELFRY_EGRESS__POLICY", "internal");
        }
        let child = command
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(&self.launch.data_dir)
            .args(&self.launch.extra_args)
            .envs(self.launch.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                binary: self.launch.binary.clone(),
                source,
            })?;
        self.child = Some(child);
        self.wait_ready().await
    }

    fn open_log(&self, name: &str) -> Result<File, HarnessError> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.path().join(name))
            .map_err(|source| HarnessError::Logs {
                dir: self.log_dir.path().to_path_buf(),
                source,
            })
    }

    async fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let client = crate::http_client();
        let ping = self.url("/ping");
        let deadline = tokio::time::Instant::now() + READY_DEADLINE;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Err(HarnessError::ExitedEarly {
                    status,
                    logs: self.logs_tail(TAIL_LINES),
                });
            }
            let answered = client
                .get(&ping)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 200);
            if answered {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::NotReady {
                    deadline: READY_DEADLINE,
                    logs: self.logs_tail(TAIL_LINES),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The URL of `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.launch.data_dir
    }

    /// The child's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and has not exited (nor been killed
    /// or stopped here).
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_exit_status().is_none()
    }

    /// Kills the process with SIGKILL (no chance to clean up) and reaps it.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` is `kill(pid, SIGKILL)` on Unix. Errors mean it
            // already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks the process to stop with SIGTERM and waits for it; SIGKILL after
    /// [`TERMINATE_DEADLINE`]. Returns its exit status (`None` if it was not
    /// running).
    pub async fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        send_sigterm(child.id());
        let deadline = tokio::time::Instant::now() + TERMINATE_DEADLINE;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                _ => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }

    /// Stops the process if it still runs (SIGTERM), then starts it again on
    /// the same data dir and port.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.terminate().await;
        self.spawn_and_wait().await
    }

    /// The last `lines` lines of stdout and stderr (all starts), for failure
    /// messages.
    pub fn logs_tail(&self, lines: usize) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.log_dir.path().join(name)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        };
        format!(
            "--- belfry stdout (tail) ---\n{}\n--- belfry stderr (tail) ---\n{}\n---",
            tail("stdout.log"),
            tail("stderr.log")
        )
    }

    /// Prints [`Self::logs_tail`] to stderr (shown by the test runner when a
    /// test fails).
    pub fn print_logs(&self) {
        eprintln!("{}", self.logs_tail(TAIL_LINES));
    }
}

impl Drop for BelfryProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        self.kill_9();
    }
}

#[allow(unsafe_code)]
fn send_sigterm(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) touches no memory of ours; `pid` is our own child,
    // not yet reaped, so it cannot name an unrelated process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

/// A loopback port that was free a moment ago (bind to port 0, read it,
/// close). Another process may take it meanwhile; good enough for tests.
///
/// # Panics
/// When no loopback port can be bound at all.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind an ephemeral loopback port")
}
