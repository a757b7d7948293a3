//! A highly available PostgreSQL for tests: etcd and two PostgreSQL
//! members managed by Patroni, with a synchronous standby.
//!
//! [`HaCluster::launch`] starts everything on free loopback ports (never
//! 2379, 8008 or 5432: the machine may run its own etcd, Patroni or
//! PostgreSQL) in a new temporary directory, waits for a leader and a
//! synchronous standby, and returns. Faults a test can make:
//! - [`HaCluster::kill_9`]: a member's machine dies (Patroni, its
//!   postmaster and every backend killed with SIGKILL at once); the
//!   standby is promoted once the leader key expires (`ttl` 10 s);
//! - [`HaCluster::switchover`]: a planned `patronictl switchover`; the old
//!   primary stays up and becomes a replica;
//! - [`HaCluster::promote_away`]: Patroni in strict synchronous mode and
//!   paused, the synchronous standby promoted with `pg_ctl promote` behind
//!   the primary's back. The old primary stays read-write and every commit
//!   on it waits for a standby that is gone: a primary that is isolated
//!   and not yet demoted.
//!
//! # How it runs
//! - `etcd`, `patroni` and `patronictl` come from Debian's `etcd-server`,
//!   `etcd-client` and `patroni` packages (`scripts/test.sh` installs
//!   them); PostgreSQL's binaries are found as for [`crate::PgServer`].
//! - As root, Patroni runs as the `postgres` user (PostgreSQL refuses
//!   root). etcd and Patroni get a parent-death signal, so a test process
//!   that dies leaves no cluster behind; Patroni stops its PostgreSQL when
//!   it gets SIGTERM. Patroni starts its postmaster in a new session, so
//!   [`Drop`] also kills postmasters that outlive their Patroni.
//! - Timing as the issue asks: `ttl: 10`, `loop_wait: 1`,
//!   `retry_timeout: 3`, `synchronous_mode: true`; `fsync=off` (test data
//!   need not survive a machine crash; a killed process loses nothing of
//!   what the kernel has).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::postgres::{PgError, find_bindir, postgres_user, running_as_root};

/// How long the cluster may take to bootstrap, or a member to change role.
pub const HA_DEADLINE: Duration = Duration::from_secs(90);

/// Prefix of the temporary directories of launched clusters.
const DIR_PREFIX: &str = "belfry-ha-";

/// A member's role as its Patroni REST API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `GET /primary` answers 200.
    Primary,
    /// `GET /sync` answers 200: the synchronous standby.
    SyncStandby,
    /// Anything else: a replica, starting, stopped, unreachable.
    Other,
}

#[derive(Debug)]
struct Member {
    name: String,
    pg_port: u16,
    api_port: u16,
    config: PathBuf,
    data_dir: PathBuf,
    patroni: Mutex<Option<Child>>,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// etcd plus two Patroni-managed PostgreSQL members. Stopped (and its
/// directory removed) on drop.
#[derive(Debug)]
pub struct HaCluster {
    root: PathBuf,
    bindir: PathBuf,
    run_as: Option<(u32, u32)>,
    etcd: Option<Child>,
    members: Vec<Member>,
    /// Spawns from one long-lived thread: the parent-death signal fires
    /// when the *thread* that forked exits.
    spawner: Mutex<mpsc::Sender<SpawnRequest>>,
}

impl HaCluster {
    /// Starts etcd and two members, waits until one is the primary and the
    /// other its synchronous standby.
    ///
    /// # Errors
    /// Missing binaries, or a cluster that does not come up within
    /// [`HA_DEADLINE`] (the error holds the logs' tails).
    pub fn launch() -> Result<HaCluster, PgError> {
        for tool in ["etcd", "patroni", "patronictl"] {
            if !on_path(tool) {
                return Err(PgError::Command {
                    what: format!("find `{tool}`"),
                    detail: "not on PATH: run scripts/test.sh, which installs the \
                             patroni, etcd-server and etcd-client packages"
                        .into(),
                });
            }
        }
        let bindir = find_bindir().ok_or(PgError::BinariesMissing)?;
        let run_as = if running_as_root() {
            Some(postgres_user().ok_or(PgError::NoPostgresUser)?)
        } else {
            None
        };
        sweep_abandoned_dirs();
        let root = new_root_dir()?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).map_err(io_error(&root))?;
        }
        let (spawner, requests) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("ha-spawner".into())
            .spawn(move || {
                for (mut command, reply) in requests {
                    let _ = reply.send(command.spawn());
                }
            })
            .map_err(io_error(&root))?;
        let mut cluster = HaCluster {
            root,
            bindir,
            run_as,
            etcd: None,
            members: Vec::new(),
            spawner: Mutex::new(spawner),
        };
        let etcd_port = crate::free_port();
        let peer_port = crate::free_port();
        cluster.start_etcd(etcd_port, peer_port)?;
        for index in 0..2 {
            let member = cluster.write_member_config(index, etcd_port)?;
            cluster.members.push(member);
        }
        // The first member bootstraps (initdb) alone; the second then
        // clones it, rather than racing for the initialize key.
        cluster.start_patroni(0)?;
        cluster.wait_for(|c| c.role(0) == Role::Primary, "the first member to lead")?;
        cluster.start_patroni(1)?;
        cluster.wait_for(
            |c| c.role(1) == Role::SyncStandby,
            "the second member to become the synchronous standby",
        )?;
        Ok(cluster)
    }

    /// libpq's multi-host URL of database `name`, with
    /// `target_session_attrs=read-write`: what users of a replicated
    /// PostgreSQL configure.
    pub fn url(&self, name: &str) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{name}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Creates database `name` on the primary; returns [`HaCluster::url`].
    ///
    /// # Errors
    /// No primary answers, or the server refused.
    pub async fn create_database(&self, name: &str) -> Result<String, PgError> {
        let (client, connection) =
            tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let result = client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await;
        drop(client);
        let _ = driver.await;
        result?;
        Ok(self.url(name))
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true: a cluster has its members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `index`'s PostgreSQL port.
    pub fn pg_port(&self, index: usize) -> u16 {
        self.members[index].pg_port
    }

    /// Member `index`'s role, asked of its Patroni (a dead one is
    /// [`Role::Other`]).
    pub fn role(&self, index: usize) -> Role {
        let port = self.members[index].api_port;
        if rest_status(port, "/primary") == Some(200) {
            Role::Primary
        } else if rest_status(port, "/sync") == Some(200) {
            Role::SyncStandby
        } else {
            Role::Other
        }
    }

    /// The member that is primary now, if any.
    pub fn primary(&self) -> Option<usize> {
        (0..self.members.len()).find(|i| self.role(*i) == Role::Primary)
    }

    /// Polls `done` every 100 ms until it holds.
    ///
    /// # Errors
    /// [`HA_DEADLINE`] passed; the error holds the logs' tails.
    pub fn wait_for(
        &self,
        mut done: impl FnMut(&HaCluster) -> bool,
        what: &str,
    ) -> Result<(), PgError> {
        let deadline = Instant::now() + HA_DEADLINE;
        while !done(self) {
            if Instant::now() > deadline {
                return Err(PgError::Command {
                    what: format!("wait for {what}"),
                    detail: self.logs_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The machine of member `index` dies: its Patroni, its postmaster and
    /// every process of that postmaster get SIGKILL, together.
    pub fn kill_9(&self, index: usize) {
        let member = &self.members[index];
        let postmaster = postmaster_pid(&member.data_dir);
        let mut patroni = member.patroni.lock().unwrap_or_else(|p| p.into_inner());
        let mut pids: Vec<u32> = patroni.as_ref().map(Child::id).into_iter().collect();
        if let Some(postmaster) = postmaster {
            pids.push(postmaster);
            pids.extend(children_of(postmaster));
        }
        for pid in &pids {
            kill(*pid, libc::SIGKILL);
        }
        if let Some(mut child) = patroni.take() {
            let _ = child.wait();
        }
    }

    /// `patronictl switchover` to member `candidate`, waiting until it is
    /// the primary.
    ///
    /// # Errors
    /// `patronictl` failed, or the candidate never led.
    pub fn switchover(&self, candidate: usize) -> Result<(), PgError> {
        let leader = self.primary().ok_or_else(|| PgError::Command {
            what: "switchover".into(),
            detail: "no primary to switch over from".into(),
        })?;
        self.patronictl(&[
            "switchover",
            "--leader",
            &self.members[leader].name,
            "--candidate",
            &self.members[candidate].name,
            "--force",
        ])?;
        self.wait_for(
            |c| c.role(candidate) == Role::Primary,
            "the candidate to lead",
        )
    }

    /// Promotes member `standby` behind Patroni's back: the old primary
    /// stays up and read-write, and every commit on it waits for a
    /// synchronous standby that left.
    ///
    /// Patroni is first told `synchronous_mode_strict` (keep requiring a
    /// synchronous standby when none is left; plain `synchronous_mode`
    /// drops the requirement at once, and the old primary would then
    /// acknowledge writes the new one never sees), then paused, so that it
    /// neither demotes the old primary nor rejoins the new one. Strict mode
    /// asks every member for a synchronous standby, the promoted one too:
    /// it is told to need none, as a new primary without standbys would be.
    ///
    /// # Errors
    /// `patronictl` or `pg_ctl promote` failed.
    pub fn promote_away(&self, standby: usize) -> Result<(), PgError> {
        self.patronictl(&[
            "edit-config",
            "--set",
            "synchronous_mode_strict=true",
            "--force",
        ])?;
        // Members read the new setting with the pause, in their next loop.
        self.patronictl(&["pause", "--wait"])?;
        self.pg_ctl(standby, &["promote", "-w"])?;
        let mut psql = self.as_postgres(Command::new(self.bindir.join("psql")));
        psql.args([
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args(["-p", &self.members[standby].pg_port.to_string()])
        .args(["-c", "ALTER SYSTEM SET synchronous_standby_names = ''"])
        .args(["-c", "SELECT pg_reload_conf()"]);
        run(
            psql,
            "psql: the promoted standby needs no synchronous standby",
        )
    }

    /// `pg_ctl stop -m fast` of member `index` (with Patroni paused, it
    /// stays down).
    ///
    /// # Errors
    /// `pg_ctl` failed.
    pub fn stop_postgres(&self, index: usize) -> Result<(), PgError> {
        self.pg_ctl(index, &["stop", "-m", "fast", "-w"])
    }

    fn pg_ctl(&self, index: usize, args: &[&str]) -> Result<(), PgError> {
        let mut command = self.as_postgres(Command::new(self.bindir.join("pg_ctl")));
        command
            .args(args)
            .arg("-D")
            .arg(&self.members[index].data_dir);
        run(command, &format!("pg_ctl {}", args.join(" ")))
    }

    fn patronictl(&self, args: &[&str]) -> Result<(), PgError> {
        let mut command = Command::new("patronictl");
        command.arg("-c").arg(&self.members[0].config).args(args);
        run(command, &format!("patronictl {}", args.join(" ")))
    }

    /// The last `lines` lines of etcd's and each member's log.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut logs = vec![("etcd".to_string(), self.root.join("etcd.log"))];
        for member in &self.members {
            logs.push((
                member.name.clone(),
                self.root.join(format!("{}.log", member.name)),
            ));
        }
        for (name, path) in logs {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            out.push_str(&format!("--- {name} ---\n{}\n", tail.join("\n")));
        }
        out
    }

    fn as_postgres(&self, mut command: Command) -> Command {
        command.current_dir(&self.root).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn spawn(&self, mut command: Command, log: &Path) -> Result<Child, PgError> {
        let file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io_error(log))?;
        let file_err = file.try_clone().map_err(io_error(log))?;
        command.stdin(Stdio::null()).stdout(file).stderr(file_err);
        crate::postgres::set_parent_death_signal(&mut command);
        let (reply, answer) = mpsc::channel();
        let gone = || PgError::Command {
            what: "spawn".into(),
            detail: "the spawner thread is gone".into(),
        };
        self.spawner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send((command, reply))
            .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?.map_err(io_error(log))
    }

    fn start_etcd(&mut self, port: u16, peer_port: u16) -> Result<(), PgError> {
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut command = Command::new("etcd");
        command
            .current_dir(&self.root)
            .args(["--name", "belfry-test"])
            .arg("--data-dir")
            .arg(self.root.join("etcd"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("belfry-test={peer}")]);
        // An etcd run as root writes a data directory the postgres user
        // need not read: only Patroni's HTTP calls reach it.
        let child = self.spawn(command, &self.root.join("etcd.log"))?;
        self.etcd = Some(child);
        Ok(())
    }

    fn write_member_config(&self, index: usize, etcd_port: u16) -> Result<Member, PgError> {
        let name = format!("pg{index}");
        let pg_port = crate::free_port();
        let api_port = crate::free_port();
        let data_dir = self.root.join(format!("{name}-data"));
        let root = self.root.display();
        let config = format!(
            r#"scope: belfry
namespace: /belfry-test/
name: {name}
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: "on"
        max_connections: 200
        fsync: "off"
        wal_keep_size: 256MB
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {data}
  bin_dir: {bindir}
  pgpass: {root}/{name}.pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
  parameters:
    unix_socket_directories: {root}
"#,
            data = data_dir.display(),
            bindir = self.bindir.display(),
        );
        let path = self.root.join(format!("{name}.yml"));
        std::fs::write(&path, config).map_err(io_error(&path))?;
        Ok(Member {
            name,
            pg_port,
            api_port,
            config: path,
            data_dir,
            patroni: Mutex::new(None),
        })
    }

    fn start_patroni(&mut self, index: usize) -> Result<(), PgError> {
        let mut command = self.as_postgres(Command::new("patroni"));
        command.arg(&self.members[index].config);
        let log = self.root.join(format!("{}.log", self.members[index].name));
        let child = self.spawn(command, &log)?;
        *self.members[index]
            .patroni
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        // Patroni stops its PostgreSQL on SIGTERM.
        for member in &self.members {
            if let Some(child) = &*member.patroni.lock().unwrap_or_else(|p| p.into_inner()) {
                kill(child.id(), libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for member in &self.members {
            let taken = member
                .patroni
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(mut child) = taken {
                while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            // A postmaster left by a killed or paused Patroni.
            if let Some(pid) = postmaster_pid(&member.data_dir) {
                let pids: Vec<u32> = std::iter::once(pid).chain(children_of(pid)).collect();
                for pid in pids {
                    kill(pid, libc::SIGKILL);
                }
            }
        }
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> PgError {
    let path = path.to_path_buf();
    move |source| PgError::Io { path, source }
}

fn run(mut command: Command, what: &str) -> Result<(), PgError> {
    let output = command.output().map_err(|e| PgError::Command {
        what: what.to_string(),
        detail: e.to_string(),
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(PgError::Command {
            what: what.to_string(),
            detail: format!(
                "{}\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// The HTTP status of `GET path` on a Patroni REST API, or `None` when it
/// does not answer within a second.
fn rest_status(port: u16, path: &str) -> Option<u16> {
    let timeout = Duration::from_secs(1);
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).ok()?;
    // "HTTP/1.0 200"
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// The postmaster's pid from the first line of `postmaster.pid`.
fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// The processes whose parent is `parent` (a postmaster's backends and
/// auxiliary processes), from `/proc/*/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // The command name is in parentheses and may hold
                    // spaces: fields count from after the last ')'.
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split(' ').nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

#[allow(unsafe_code)]
fn kill(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) touches no memory of ours. `pid` is one of this
    // cluster's processes: a child not yet reaped, or a postmaster (or its
    // child) whose pid was read from our own data directory just now.
    unsafe {
        libc::kill(pid, signal);
    }
}

fn new_root_dir() -> Result<PathBuf, PgError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let root = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(io_error(&root))?;
    Ok(root)
}

/// Removes directories of clusters whose test process no longer exists.
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
