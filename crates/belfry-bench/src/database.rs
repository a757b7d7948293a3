//! The PostgreSQL database of a run (`--database-url`, or a throwaway
//! server) and PostgreSQL's CPU, for the `cluster` scenario and for one
//! node started with `--database-url` by the other scenarios.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use belfry_testkit::PgServer;

use crate::stats::{CpuSplit, ProcessSample};
use crate::workload::now_ms;

/// How often PostgreSQL's processes are read.
const PG_CPU_POLL: Duration = Duration::from_millis(500);

/// The run's database and, for a launched server, the server itself.
pub(crate) struct Database {
    /// Kept so a launched server lives as long as the run.
    _server: PgServer,
    pub(crate) url: String,
    name: String,
    /// `--database-url`: the database is dropped at the end.
    external_admin_url: Option<String>,
}

impl Database {
    pub(crate) async fn create(external: Option<&str>) -> anyhow::Result<Database> {
        let server = match external {
            Some(url) => PgServer::external(url),
            None => tokio::task::spawn_blocking(PgServer::launch)
                .await
                .context("the PostgreSQL launcher panicked")?
                .context("launch a throwaway PostgreSQL")?,
        };
        let name = format!("belfry_bench_{}", now_ms());
        let url = server
            .create_database(&name)
            .await
            .with_context(|| format!("create database {name}"))?;
        Ok(Database {
            _server: server,
            url,
            name,
            external_admin_url: external.map(str::to_string),
        })
    }

    pub(crate) fn describe(&self) -> &'static str {
        if self.external_admin_url.is_some() {
            "external"
        } else {
            "launched (fsync=off)"
        }
    }

    /// Drops the run's database on an external server (a launched server
    /// is deleted whole). Best effort: the report matters more.
    pub(crate) async fn drop_external(&self) {
        let Some(admin) = &self.external_admin_url else {
            return;
        };
        let Ok((client, connection)) = tokio_postgres::connect(admin, tokio_postgres::NoTls).await
        else {
            eprintln!("belfry-bench: could not drop database {}", self.name);
            return;
        };
        let driver = tokio::spawn(connection);
        if let Err(error) = client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .await
        {
            eprintln!(
                "belfry-bench: could not drop database {}: {error}",
                self.name
            );
        }
        drop(client);
        let _ = driver.await;
    }
}

/// PostgreSQL's CPU: the backends of the run's database plus the server's
/// own writers, polled in the background so short-lived backends count.
pub(crate) struct PostgresCpu {
    client: Arc<tokio_postgres::Client>,
    state: Arc<Mutex<PgCpuState>>,
    poller: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct PgCpuState {
    last: HashMap<i32, ProcessSample>,
    accumulated: CpuSplit,
}

const PG_PIDS: &str = "SELECT pid FROM pg_stat_activity \
     WHERE (datname = current_database() AND pid <> pg_backend_pid()) \
        OR backend_type IN ('walwriter', 'checkpointer', 'background writer')";

impl PostgresCpu {
    /// `None` when the database cannot be queried or its processes are not
    /// readable (`/proc` of another machine).
    pub(crate) async fn start(url: &str) -> Option<PostgresCpu> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .ok()?;
        tokio::spawn(connection);
        let client = Arc::new(client);
        let state = Arc::new(Mutex::new(PgCpuState::default()));
        // The first reading sets the baseline of the processes already there.
        let pids = Self::pids(&client).await?;
        {
            let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
            for pid in pids {
                if let Some(sample) = read_pid(pid) {
                    guard.last.insert(pid, sample);
                }
            }
            if guard.last.is_empty() {
                return None;
            }
        }
        let (poll_client, poll_state) = (Arc::clone(&client), Arc::clone(&state));
        let poller = tokio::spawn(async move {
            loop {
                tokio::time::sleep(PG_CPU_POLL).await;
                Self::poll(&poll_client, &poll_state).await;
            }
        });
        Some(PostgresCpu {
            client,
            state,
            poller,
        })
    }

    async fn poll(client: &tokio_postgres::Client, state: &Mutex<PgCpuState>) {
        let Some(pids) = Self::pids(client).await else {
            return;
        };
        let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
        for pid in pids {
            let Some(now) = read_pid(pid) else { continue };
            // A process first seen now started during the run: all of its
            // CPU counts.
            let before = guard.last.insert(pid, now).unwrap_or_default();
            guard.accumulated = guard.accumulated + now.cpu_since(&before);
        }
    }

    async fn pids(client: &tokio_postgres::Client) -> Option<Vec<i32>> {
        let rows = client.query(PG_PIDS, &[]).await.ok()?;
        Some(rows.iter().map(|row| row.get::<_, i32>(0)).collect())
    }

    /// CPU so far, read now (a phase boundary).
    pub(crate) async fn total(&self) -> CpuSplit {
        Self::poll(&self.client, &self.state).await;
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .accumulated
    }
}

impl Drop for PostgresCpu {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

fn read_pid(pid: i32) -> Option<ProcessSample> {
    ProcessSample::read(u32::try_from(pid).ok()?)
}

pub(crate) fn minus(after: CpuSplit, before: CpuSplit) -> CpuSplit {
    CpuSplit {
        user_s: after.user_s - before.user_s,
        system_s: after.system_s - before.system_s,
    }
}
