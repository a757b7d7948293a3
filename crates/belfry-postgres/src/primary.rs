//! Following the primary of a replicated PostgreSQL.
//!
//! A node reaches its database through one URL: libpq's multi-host form
//! (`postgres://u@h1:p1,h2:p2/db?target_session_attrs=read-write`) or a
//! managed service's DNS name that moves with the primary. New connections
//! then reach whichever server takes writes; the connections a node
//! already holds do not move. Two things tell it that they lead to the
//! wrong server:
//! - a write answered SQLSTATE 25006 (`read_only_sql_transaction`): the
//!   server is a standby now, or was made read-only;
//! - a write that does not finish within [`WRITE_TIMEOUT`]: typically a
//!   primary that lost its synchronous standby (promoted away from it) and
//!   whose commits wait for a standby that will never answer. Such a
//!   commit's outcome is unknown: the caller gets
//!   [`StoreError::Unavailable`] (503), never a success.
//!
//! Either way [`Primary::lost`] drops every connection of both pools
//! (idle ones at once, those in use when they come back: a pool hook
//! discards any connection made before the loss; the presence session is
//! opened again at its next look, see `coordinator::presence`) and, when
//! writes were fine until then, tells the LISTEN connection to reconnect
//! (again when they succeed again), so everything reconnects through the
//! URL to the server that takes writes now. Until a write succeeds again the
//! store reports why it cannot write ([`Primary::blocked`]): the node's
//! log says it once per loss and `/health/ready` answers 503
//! `store_not_writable`. "Again" means the cluster heartbeat (a write that
//! always changes a row, once per membership tick) succeeded: any other
//! write may change nothing, and such a commit does not wait for a
//! standby, so it succeeds even where every real commit hangs.
//!
//! While commits hang, writes other than the heartbeat answer
//! `Unavailable` at once instead of each waiting out its timeout (and
//! leaving a session stuck on the server). Nothing here spins: each
//! operation waits for its answer or its timeout, and every caller retries
//! on its own schedule (the coordinator once per tick, the recorder after
//! a pause).
//!
//! Leases and epochs are re-checked on the new primary by the coordinator's
//! next round, as after any error: ownership is whatever the database that
//! takes writes says (`docs/operations.md`, "Database failover", has what a
//! primary that lost its last writes costs).

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use belfry_store::{StoreError, StoreResult};
use tokio::sync::watch;

use crate::error::is_read_only;

/// The longest a write (a transaction, up to its commit) may take before
/// its outcome counts as unknown and the connections are dropped. Far above
/// a healthy commit, even of the recorder's largest batch on a loaded
/// machine; below the lease TTL's multiples that a stall would cost.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a read may take before it answers `Unavailable` (the server
/// is cut off); the connections are dropped too, but writes are not
/// declared blocked.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether an operation writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    /// May write; a transaction that changes nothing commits without
    /// waiting for a standby, so its success proves nothing.
    Write,
    /// The cluster heartbeat, which always changes a row: its success
    /// proves the database takes (and replicates) writes again.
    Heartbeat,
}

/// Why the database takes no writes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// A write was refused with SQLSTATE 25006.
    ReadOnly,
    /// A write did not finish within [`WRITE_TIMEOUT`].
    CommitsHang,
}

impl Blocked {
    pub(crate) fn message(self) -> &'static str {
        match self {
            Blocked::ReadOnly => {
                "the database is read-only (a standby, not the primary); reconnecting until a primary takes writes"
            }
            Blocked::CommitsHang => {
                "commits on the database do not finish (a primary cut off from its synchronous standby?); reconnecting until a primary takes writes"
            }
        }
    }
}

/// What the store knows of its primary; shared by the pools' hooks and
/// the LISTEN connection.
#[derive(Debug)]
pub(crate) struct Primary {
    /// Connections created before this instant are discarded when they
    /// are next taken from a pool.
    cutoff: Mutex<Option<Instant>>,
    /// Since when writes fail, and why; `None` while they succeed.
    blocked: Mutex<Option<(Instant, Blocked)>>,
    /// Bumped when writes stop or start again: the LISTEN connection
    /// reconnects.
    losses: watch::Sender<u64>,
}

impl Primary {
    pub(crate) fn new() -> Primary {
        Primary {
            cutoff: Mutex::new(None),
            blocked: Mutex::new(None),
            losses: watch::channel(0).0,
        }
    }

    /// Whether a connection made at `created` predates the last loss.
    pub(crate) fn is_stale(&self, created: Instant) -> bool {
        self.cutoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|cutoff| created < cutoff)
    }

    /// Changes when the LISTEN connection must reconnect.
    pub(crate) fn losses(&self) -> watch::Receiver<u64> {
        self.losses.subscribe()
    }

    /// Why writes fail now, if they do.
    pub(crate) fn blocked(&self) -> Option<Blocked> {
        self.blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|(_, why)| why)
    }

    /// The connections lead to a server that does not take writes: drop
    /// them all, say why. The listener reconnects only when this is news
    /// (writes were fine, or failed for another reason): while commits
    /// keep hanging, losses come several a second, and each reconnect
    /// makes every owner reload its windows.
    pub(crate) fn lost(&self, why: Blocked, pools: &[&deadpool_postgres::Pool]) {
        let now = pool_now();
        *self.cutoff.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        for pool in pools {
            pool.retain(|_, metrics| metrics.created >= now);
        }
        let mut blocked = self.blocked.lock().unwrap_or_else(|e| e.into_inner());
        match blocked.as_mut() {
            Some((_, was)) if *was == why => return,
            Some((_, was)) => *was = why,
            None => *blocked = Some((now, why)),
        }
        drop(blocked);
        tracing::error!(
            reason = why.message(),
            "the database takes no writes; every connection reconnects to find the primary"
        );
        self.losses.send_modify(|n| *n += 1);
    }

    /// The heartbeat wrote: the database takes writes (again). The
    /// listener reconnects too, in case it still listens where no change
    /// commits any more.
    pub(crate) fn wrote(&self) {
        let Some((since, _)) = self
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        tracing::warn!(
            after_ms = pool_now().saturating_duration_since(since).as_millis() as u64,
            "the database takes writes again"
        );
        self.losses.send_modify(|n| *n += 1);
    }

    /// Runs `operation` within its timeout and learns from its outcome.
    pub(crate) async fn guard<T>(
        &self,
        access: Access,
        pools: &[&deadpool_postgres::Pool],
        operation: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        // While commits hang, every write would wait its whole timeout and
        // leave behind a server session stuck in its commit (the server
        // notices a closed client only when it answers), until the old
        // primary has no connection left to give. Only the heartbeat
        // tries, once per membership tick; the rest answer at once.
        if access == Access::Write && self.blocked() == Some(Blocked::CommitsHang) {
            return Err(StoreError::Unavailable(
                Blocked::CommitsHang.message().to_string(),
            ));
        }
        let limit = match access {
            Access::Read => READ_TIMEOUT,
            Access::Write | Access::Heartbeat => WRITE_TIMEOUT,
        };
        match tokio::time::timeout(limit, operation).await {
            Ok(Ok(value)) => {
                if access == Access::Heartbeat {
                    self.wrote();
                }
                Ok(value)
            }
            Ok(Err(error)) => {
                if is_read_only(&error) {
                    self.lost(Blocked::ReadOnly, pools);
                }
                Err(error)
            }
            Err(_) => {
                match access {
                    Access::Write | Access::Heartbeat => self.lost(Blocked::CommitsHang, pools),
                    // A read that hangs says nothing of commits; its
                    // connection is dropped all the same.
                    Access::Read => {
                        let now = pool_now();
                        *self.cutoff.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
                    }
                }
                Err(StoreError::Unavailable(format!(
                    "the database did not answer within {limit:?}; the outcome is unknown"
                )))
            }
        }
    }
}

/// Now on the connection pool's clock: deadpool stamps connections with
/// `std::time::Instant`s, and a cut-off must compare with those.
#[allow(
    clippy::disallowed_methods,
    reason = "deadpool stamps connections with std Instants; the cut-off must be on that clock"
)]
pub(crate) fn pool_now() -> Instant {
    Instant::now()
}
