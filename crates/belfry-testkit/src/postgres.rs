//! A throwaway PostgreSQL server for tests.
//!
//! [`PgServer::shared`] starts one server per test binary (the first caller
//! pays for its start, ≈ 0.3 s once the template exists); every test then takes a fresh database from it
//! with [`PgServer::fresh_database`] (≈ 0.2 s), so suites stay fast and
//! cases never see each other's rows. [`PgServer::launch`] starts a private
//! server for tests that stop and restart it ([`PgServer::stop_immediate`],
//! [`PgServer::start`]).
//!
//! # How the server runs
//! - Binaries come from `pg_config --bindir`, else `/usr/lib/postgresql/*/bin`.
//!   When they are missing the error says to run `scripts/test.sh`, which
//!   installs them.
//! - PostgreSQL refuses to run as root. As root, `initdb`, `postgres` and
//!   `pg_ctl` run as the `postgres` user: the switch is done by
//!   [`std::os::unix::process::CommandExt::uid`] (what `runuser -u postgres`
//!   does), so the postmaster is our direct child and its pid is known.
//! - `postgres -D DIR/data -k DIR -p PORT -c listen_addresses=127.0.0.1
//!   -c fsync=off`: loopback only; no fsync because test data need not
//!   survive a machine crash.
//! - `initdb` runs once per machine into a template cluster in the temp
//!   directory; every launch copies it (much cheaper when each test runs
//!   in its own process, as under nextest).
//! - The postmaster gets a parent-death signal (fast shutdown), so a test
//!   binary that exits (statics are never dropped) or crashes leaves no
//!   server behind. Directories of servers whose test process is gone are
//!   swept at the next launch.
//! - With `BELFRY_TEST_DATABASE_URL` set, [`PgServer::shared`] uses that
//!   existing server instead of starting one (databases are created on it).
//!
//! # TLS
//! [`PgServer::launch_tls`] starts a server with `ssl = on`, a certificate
//! for `localhost` and 127.0.0.1 signed by a test CA made here (rcgen), and
//! a `pg_hba.conf` that accepts TCP connections over TLS only (`hostssl`):
//! a plain connection is refused. Its [`PgServer::url`]s ask for
//! `sslmode=verify-full` with `sslrootcert` naming the CA file
//! ([`PgServer::ca_file`]). With `BELFRY_TEST_PG_TLS=1`,
//! [`PgServer::shared`] starts such a server, so every suite that uses the
//! shared server (cluster, pull, store conformance) runs over TLS. The
//! harness itself creates databases over the server's Unix socket.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Environment variable naming an existing server to use instead of a
/// throwaway one (`postgres://user@host:port/db`).
pub const DATABASE_URL_ENV: &str = "BELFRY_TEST_DATABASE_URL";

/// Environment variable: `1` makes [`PgServer::shared`] a TLS-only server
/// reached with `sslmode=verify-full` ([`PgServer::launch_tls`]).
pub const PG_TLS_ENV: &str = "BELFRY_TEST_PG_TLS";

/// How long `initdb`, a start or a stop may take. Generous: a loaded 2-core
/// machine runs several test binaries at once.
pub const SERVER_DEADLINE: Duration = Duration::from_secs(60);

/// Prefix of the temporary directories of launched servers.
const DIR_PREFIX: &str = "belfry-pg-";

/// Prefix of the initialized cluster that launches copy (one per set of
/// binaries); not matched by the sweep, which wants a pid after
/// [`DIR_PREFIX`].
/// Bump the version when `initdb`'s arguments change.
const TEMPLATE_PREFIX: &str = "belfry-pg-template-v2-";

/// Prefix of the databases made by [`PgServer::fresh_database`], followed
/// by the test process id.
const DATABASE_PREFIX: &str = "belfry_test_";

/// Why a test server could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "PostgreSQL binaries not found (no `pg_config` on PATH, nothing in \
         /usr/lib/postgresql/*/bin): run scripts/test.sh, which installs them, \
         or set {DATABASE_URL_ENV} to an existing server"
    )]
    BinariesMissing,
    #[error("running as root, but there is no `postgres` user to run the server as")]
    NoPostgresUser,
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("PostgreSQL did not accept connections within {deadline:?}\n{log}")]
    NotReady { deadline: Duration, log: String },
    #[error("database request failed: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("this server was given by {DATABASE_URL_ENV}; it cannot be stopped or started")]
    External,
}

/// A PostgreSQL server for tests: launched here, or an existing one.
#[derive(Debug)]
pub struct PgServer {
    /// `postgres://postgres@127.0.0.1:PORT` without a database, or the
    /// external URL with its database part cut off.
    base_url: String,
    /// A database that exists, to connect to for `CREATE DATABASE`.
    admin_database: String,
    /// Connection options of an external URL (`?sslmode=...`), or empty.
    query: String,
    /// `None` for an external server.
    local: Option<LocalServer>,
}

#[derive(Debug)]
struct LocalServer {
    bindir: PathBuf,
    /// Parent of `data/`, socket directory and log file.
    root: PathBuf,
    port: u16,
    /// `Some((uid, gid))` when running as root.
    run_as: Option<(u32, u32)>,
    /// Whether the server speaks TLS only (its files are in `root`).
    tls: bool,
    postmaster: Mutex<Option<Child>>,
    /// Spawns postmasters from one long-lived thread: the parent-death
    /// signal fires when the *thread* that forked exits, and test threads
    /// end with their test.
    spawner: Mutex<mpsc::Sender<SpawnRequest>>,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

impl PgServer {
    /// The server shared by every test of this binary: the one named by
    /// `BELFRY_TEST_DATABASE_URL`, else a throwaway one started on first use.
    ///
    /// # Panics
    /// When no server can be provided; the message says why and what to do.
    pub fn shared() -> &'static PgServer {
        static SHARED: OnceLock<Result<PgServer, String>> = OnceLock::new();
        let server = SHARED.get_or_init(|| {
            let tls = std::env::var(PG_TLS_ENV).is_ok_and(|v| v.trim() == "1");
            let result = match std::env::var(DATABASE_URL_ENV) {
                Ok(url) if !url.trim().is_empty() => Ok(PgServer::external(url.trim())),
                _ if tls => PgServer::launch_tls(),
                _ => PgServer::launch(),
            };
            result.map_err(|e| e.to_string())
        });
        match server {
            Ok(server) => server,
            Err(message) => panic!("no PostgreSQL server for tests: {message}"),
        }
    }

    /// Uses an existing server; databases are created on it.
    pub fn external(url: &str) -> PgServer {
        let (base_url, admin_database, query) = split_url(url);
        PgServer {
            base_url,
            admin_database,
            query,
            local: None,
        }
    }

    /// Starts a private server in a new temporary directory, waiting until
    /// it accepts connections. Killed (and its directory removed) on drop.
    ///
    /// # Errors
    /// Missing binaries, `initdb` failure, or a server that does not start.
    pub fn launch() -> Result<PgServer, PgError> {
        PgServer::launch_with(false)
    }

    /// As [`PgServer::launch`], for a server that accepts TCP connections
    /// over TLS only (see the module docs); its URLs use
    /// `sslmode=verify-full`.
    ///
    /// # Errors
    /// As [`PgServer::launch`], or the certificates cannot be written.
    pub fn launch_tls() -> Result<PgServer, PgError> {
        PgServer::launch_with(true)
    }

    fn launch_with(tls: bool) -> Result<PgServer, PgError> {
        let bindir = find_bindir().ok_or(PgError::BinariesMissing)?;
        let run_as = if running_as_root() {
            Some(postgres_user().ok_or(PgError::NoPostgresUser)?)
        } else {
            None
        };
        sweep_abandoned_dirs();
        let root = new_root_dir()?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).map_err(|source| {
                PgError::Io {
                    path: root.clone(),
                    source,
                }
            })?;
        }
        let (spawner, requests) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("pg-spawner".into())
            .spawn(move || {
                for (mut command, reply) in requests {
                    let _ = reply.send(command.spawn());
                }
            })
            .map_err(|source| PgError::Io {
                path: root.clone(),
                source,
            })?;
        let port = crate::free_port();
        // Built before the server runs, so that a failed start still
        // cleans up through `Drop`.
        let query = if tls {
            format!(
                "?sslmode=verify-full&sslrootcert={}",
                url_encode(&root.join(CA_FILE).to_string_lossy())
            )
        } else {
            String::new()
        };
        let server = PgServer {
            base_url: format!("postgres://postgres@127.0.0.1:{port}"),
            admin_database: "postgres".into(),
            query,
            local: Some(LocalServer {
                bindir,
                root,
                port,
                run_as,
                tls,
                postmaster: Mutex::new(None),
                spawner: Mutex::new(spawner),
            }),
        };
        let local = server.local()?;
        local.prepare_data_dir()?;
        if tls {
            local.prepare_tls()?;
        }
        local.start()?;
        Ok(server)
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}{}", self.base_url, self.query)
    }

    /// The test CA's certificate (PEM) of a [`PgServer::launch_tls`]
    /// server.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.local
            .as_ref()
            .filter(|local| local.tls)
            .map(|local| local.root.join(CA_FILE))
    }

    /// A connection for creating and dropping databases: over the Unix
    /// socket for a launched server (which may refuse plain TCP), else to
    /// the URL.
    async fn admin_client(
        &self,
    ) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), PgError> {
        let (client, connection) = match &self.local {
            Some(local) => {
                tokio_postgres::Config::new()
                    .host_path(&local.root)
                    .port(local.port)
                    .user("postgres")
                    .dbname(&self.admin_database)
                    .connect(tokio_postgres::NoTls)
                    .await?
            }
            None => {
                tokio_postgres::connect(&self.url(&self.admin_database), tokio_postgres::NoTls)
                    .await?
            }
        };
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((client, driver))
    }

    /// Creates database `name` and returns its URL.
    ///
    /// # Errors
    /// The server refused (bad name, already exists, server down).
    pub async fn create_database(&self, name: &str) -> Result<String, PgError> {
        let (client, driver) = self.admin_client().await?;
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        let result = client
            .batch_execute(&format!("CREATE DATABASE {quoted}"))
            .await;
        drop(client);
        let _ = driver.await;
        result?;
        Ok(self.url(name))
    }

    /// Creates a database with a name unique to this process and returns
    /// its URL.
    ///
    /// # Panics
    /// When the database cannot be created (a test cannot go on).
    pub async fn fresh_database(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        if self.local.is_none() {
            self.sweep_abandoned_databases().await;
        }
        let name = format!(
            "{DATABASE_PREFIX}{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.create_database(&name)
            .await
            .unwrap_or_else(|e| panic!("create test database {name}: {e}"))
    }

    /// On an external server, drops (once per process) the test databases
    /// of earlier runs whose process is gone. A database still in use (a
    /// run on another machine) cannot be dropped without FORCE, so it stays.
    async fn sweep_abandoned_databases(&self) {
        static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        SWEPT
            .get_or_init(|| async {
                let Ok((client, driver)) = self.admin_client().await else {
                    return;
                };
                let names: Vec<String> = client
                    .query(
                        "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
                        &[&DATABASE_PREFIX],
                    )
                    .await
                    .map(|rows| rows.iter().map(|row| row.get(0)).collect())
                    .unwrap_or_default();
                for name in names {
                    let pid = name
                        .strip_prefix(DATABASE_PREFIX)
                        .and_then(|rest| rest.split('_').next())
                        .and_then(|pid| pid.parse::<u32>().ok());
                    let abandoned =
                        pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                    if abandoned {
                        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
                        let _ = client
                            .batch_execute(&format!("DROP DATABASE IF EXISTS {quoted}"))
                            .await;
                    }
                }
                drop(client);
                let _ = driver.await;
            })
            .await;
    }

    /// The port of a launched server (`None` for an external one).
    pub fn port(&self) -> Option<u16> {
        self.local.as_ref().map(|local| local.port)
    }

    /// `pg_ctl stop -m immediate`: the server dies without a checkpoint, as
    /// in a crash, and connections break at once.
    ///
    /// # Errors
    /// An external server, or `pg_ctl` failing.
    pub fn stop_immediate(&self) -> Result<(), PgError> {
        self.local()?.stop_immediate()
    }

    /// Starts the server again on the same directory and port (after
    /// [`PgServer::stop_immediate`]); waits until it accepts connections.
    ///
    /// # Errors
    /// An external server, or one that does not come up.
    pub fn start(&self) -> Result<(), PgError> {
        self.local()?.start()
    }

    fn local(&self) -> Result<&LocalServer, PgError> {
        self.local.as_ref().ok_or(PgError::External)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(local) = &self.local {
            local.shut_down();
            let _ = std::fs::remove_dir_all(&local.root);
        }
    }
}

impl LocalServer {
    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    /// A command for one of the server binaries, as the `postgres` user
    /// when we are root, run from the server's directory (the caller's
    /// directory may not be readable by that user).
    fn command(&self, binary: &str) -> Command {
        let mut command = Command::new(self.bindir.join(binary));
        command.current_dir(&self.root).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Fills `data/` with a copy of an initialized cluster. `initdb` runs
    /// once per machine into a template directory (under an exclusive file
    /// lock, so concurrent test processes wait for the first); each server
    /// then copies it, which is much cheaper than `initdb` when every test
    /// runs in its own process (nextest).
    fn prepare_data_dir(&self) -> Result<(), PgError> {
        let tag: String = self
            .bindir
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let template = std::env::temp_dir().join(format!("{TEMPLATE_PREFIX}{tag}"));
        let io_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PgError::Io { path, source }
        };
        let lock_path = template.with_extension("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        lock.lock().map_err(io_error(&lock_path))?;
        let ready = template.join("ready");
        if !ready.exists() {
            let _ = std::fs::remove_dir_all(&template);
            std::fs::create_dir_all(&template).map_err(io_error(&template))?;
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&template, Some(uid), Some(gid))
                    .map_err(io_error(&template))?;
            }
            self.initdb(&template.join("data"))?;
            File::create(&ready).map_err(io_error(&ready))?;
        }
        // `cp -a` keeps the owner (postgres) and the 0700 mode the server
        // insists on.
        let output = Command::new("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(self.data_dir())
            .output()
            .map_err(io_error(Path::new("cp")))?;
        drop(lock);
        if !output.status.success() {
            return Err(PgError::Command {
                what: "copy the template cluster".into(),
                detail: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        Ok(())
    }

    /// Creates a cluster in `data_dir` with a linguistic (ICU `en-US`)
    /// default collation when the build supports it: code that forgets
    /// `COLLATE "C"` then orders differently from Rust and tests catch it.
    /// Falls back to the plain C locale.
    fn initdb(&self, data_dir: &Path) -> Result<(), PgError> {
        let icu = [
            "--locale=C.UTF-8",
            "--locale-provider=icu",
            "--icu-locale=en-US",
        ];
        match self.run_initdb(data_dir, &icu) {
            Ok(()) => Ok(()),
            Err(_) => {
                let _ = std::fs::remove_dir_all(data_dir);
                self.run_initdb(data_dir, &[])
            }
        }
    }

    fn run_initdb(&self, data_dir: &Path, locale: &[&str]) -> Result<(), PgError> {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(data_dir)
            .args(["-U", "postgres", "--auth=trust", "-N", "-E", "UTF8"])
            // 1 MiB WAL segments instead of 16: less to copy per launch.
            .arg("--wal-segsize=1")
            .args(locale)
            .output()
            .map_err(|source| PgError::Io {
                path: self.bindir.join("initdb"),
                source,
            })?;
        if !output.status.success() {
            return Err(PgError::Command {
                what: "initdb".into(),
                detail: format!(
                    "{}\n{}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        Ok(())
    }

    fn start(&self) -> Result<(), PgError> {
        let log_path = self.log_path();
        let io_error = |source| PgError::Io {
            path: log_path.clone(),
            source,
        };
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_error)?;
        let log_err = log.try_clone().map_err(io_error)?;
        let mut command = self.command("postgres");
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-k")
            .arg(&self.root)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off"])
            .args(["-c", "max_connections=200"])
            .args(if self.tls {
                &[
                    "-c",
                    "ssl=on",
                    "-c",
                    "ssl_cert_file=../server.crt",
                    "-c",
                    "ssl_key_file=../server.key",
                ][..]
            } else {
                &[]
            })
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        set_parent_death_signal(&mut command);
        let (reply, answer) = mpsc::channel();
        self.spawner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .send((command, reply))
            .map_err(|_| PgError::Command {
                what: "spawn postgres".into(),
                detail: "the spawner thread is gone".into(),
            })?;
        let child = answer
            .recv()
            .map_err(|_| PgError::Command {
                what: "spawn postgres".into(),
                detail: "the spawner thread is gone".into(),
            })?
            .map_err(|source| PgError::Io {
                path: self.bindir.join("postgres"),
                source,
            })?;
        *self.postmaster.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_ready()
    }

    /// Makes the test CA and the server's certificate and key (beside
    /// `data/`), and lets TCP clients in over TLS only.
    fn prepare_tls(&self) -> Result<(), PgError> {
        let (ca, certificate, key) = test_certificates().map_err(|e| PgError::Command {
            what: "make the test certificates".into(),
            detail: e.to_string(),
        })?;
        let hba = "# Written by the test harness: TLS only over TCP.\n\
                   local all all trust\n\
                   hostssl all all 127.0.0.1/32 trust\n\
                   hostssl all all ::1/128 trust\n";
        for (path, contents, mode) in [
            (self.root.join(CA_FILE), ca, 0o644),
            (self.root.join("server.crt"), certificate, 0o644),
            // The server refuses a key others may read.
            (self.root.join("server.key"), key, 0o600),
            (self.data_dir().join("pg_hba.conf"), hba.to_string(), 0o600),
        ] {
            let io_error = |source| PgError::Io {
                path: path.clone(),
                source,
            };
            std::fs::write(&path, contents).map_err(io_error)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(io_error)?;
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(io_error)?;
            }
        }
        Ok(())
    }

    fn wait_ready(&self) -> Result<(), PgError> {
        let deadline = Instant::now() + SERVER_DEADLINE;
        loop {
            let ready = Command::new(self.bindir.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-d", "postgres"])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return Ok(());
            }
            let exited = self
                .postmaster
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
            if exited || Instant::now() > deadline {
                return Err(PgError::NotReady {
                    deadline: SERVER_DEADLINE,
                    log: std::fs::read_to_string(self.log_path()).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop_immediate(&self) -> Result<(), PgError> {
        let output = self
            .command("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data_dir())
            .output()
            .map_err(|source| PgError::Io {
                path: self.bindir.join("pg_ctl"),
                source,
            })?;
        if !output.status.success() {
            return Err(PgError::Command {
                what: "pg_ctl stop -m immediate".into(),
                detail: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        // Reap the postmaster so a later start owns a fresh child.
        if let Some(mut child) = self
            .postmaster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = child.wait();
        }
        Ok(())
    }

    /// Fast shutdown (SIGINT: disconnect clients, exit cleanly, free shared
    /// memory), then SIGKILL if it hangs.
    fn shut_down(&self) {
        let Some(mut child) = self
            .postmaster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        signal(child.id(), libc::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[allow(unsafe_code)]
pub(crate) fn set_parent_death_signal(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the async-signal-safe prctl(2) system call. It runs after the
    // uid switch, which would otherwise clear the setting.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[allow(unsafe_code)]
pub(crate) fn signal(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) touches no memory of ours; `pid` is our own child,
    // not yet reaped, so it cannot name an unrelated process.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// `pg_config --bindir`, else the newest `/usr/lib/postgresql/*/bin`; only
/// a directory that holds `initdb` counts.
pub(crate) fn find_bindir() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let mut candidates: Vec<PathBuf> = from_pg_config.into_iter().collect();
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .collect();
    // Newest first: version directories are numbers ("15", "16").
    versions.sort_by_key(|path| {
        std::cmp::Reverse(
            path.parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    candidates.extend(versions);
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
}

/// The owner of `/proc/self` is our effective uid; no unsafe call needed.
pub(crate) fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// `(uid, gid)` of the `postgres` user, from `/etc/passwd`.
pub(crate) fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
            _ => None,
        }
    })
}

fn new_root_dir() -> Result<PathBuf, PgError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let root = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|source| PgError::Io {
        path: root.clone(),
        source,
    })?;
    Ok(root)
}

/// Removes directories of servers whose test process no longer exists (a
/// shared server's directory outlives its process: statics never drop).
fn sweep_abandoned_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The file name of a TLS server's test CA, in its directory.
const CA_FILE: &str = "ca.pem";

/// `(CA certificate, server certificate, server key)`, PEM: a fresh test
/// CA and a certificate it signs for `localhost` and 127.0.0.1.
fn test_certificates() -> Result<(String, String, String), rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "belfry test database CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "belfry test database");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let certificate = params.signed_by(&key, &issuer)?;
    Ok((issuer.pem(), certificate.pem(), key.serialize_pem()))
}

/// Percent-encodes a URL parameter's value.
fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Splits `postgres://user@host:port/db?opts` into the part before the
/// database, the database (`postgres` when none is named) and the options
/// (`?opts`, or empty), so other databases on the same server can be named.
fn split_url(url: &str) -> (String, String, String) {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let (before_query, query) = match url[authority_start..].find('?') {
        Some(offset) => url.split_at(authority_start + offset),
        None => (url, ""),
    };
    let (base, database) = match before_query[authority_start..].find('/') {
        Some(offset) => {
            let (base, path) = before_query.split_at(authority_start + offset);
            (base, path.trim_start_matches('/'))
        }
        None => (before_query, ""),
    };
    let database = if database.is_empty() {
        "postgres"
    } else {
        database
    };
    (base.to_string(), database.to_string(), query.to_string())
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn urls_split_before_the_database() {
        let split = |url| {
            let (base, database, query) = split_url(url);
            (base, database, query)
        };
        assert_eq!(
            split("postgres://u@h:5432/db?sslmode=disable"),
            (
                "postgres://u@h:5432".into(),
                "db".into(),
                "?sslmode=disable".into()
            )
        );
        assert_eq!(
            split("postgres://u@h:5432"),
            (
                "postgres://u@h:5432".into(),
                "postgres".into(),
                String::new()
            )
        );
        assert_eq!(
            split("postgres://u@h?x=1"),
            ("postgres://u@h".into(), "postgres".into(), "?x=1".into())
        );
    }
}
