//! Cross-node wake-ups over LISTEN/NOTIFY.
//!
//! Any node accepts any API call, but only a partition's owner holds its
//! timers. When a client request creates, moves or cancels an event due up
//! to `now + notify_horizon + clock_skew_margin` (the owner's in-memory
//! window plus a margin for clock skew, see below), the store calls
//! `pg_notify` in the same transaction, so the notification is sent exactly
//! when the change commits. Owners' own writes (fenced commands: attempt
//! outcomes, expiry) are not announced: the owner already applied their
//! effects to its window.
//!
//! # Horizon and clock skew
//! The horizon is measured on the writer's clock, the window on the
//! owner's: the owner pages in every event due up to its own
//! `now + window` and learns of later changes inside that range only from
//! wake-ups. A writer whose clock lags the owner's by `s` would, without a
//! margin, announce nothing due in the last `s` of the owner's window, and
//! the owner's loader is already past it: the event would wait for a
//! repair page (`belfry_core::fire`) instead of firing on time. The margin
//! ([`crate::PostgresOptions::clock_skew_margin`], default
//! [`crate::DEFAULT_CLOCK_SKEW_MARGIN`] = 5 s) covers any lag up to it.
//! Announcing too much is safe: the owner keeps an offer only where its
//! window's cursor covers it, so a writer whose clock runs ahead costs a
//! few extra notifications, nothing more. A lag beyond the margin is left
//! to the repair pages.
//!
//! Why not announce every change whatever its instant: PostgreSQL
//! serializes the commits of transactions that NOTIFY (one lock, held from
//! pre-commit until after the commit's WAL flush: `PreCommit_Notify` in its
//! `async.c`), so each announcing commit waits for the previous one's
//! fsync, while other commits share fsyncs (group commit). Measured with
//! `examples/pg_ingest.rs` on the 2-core machine (PostgreSQL 15, fsync on,
//! load average 7–9 from concurrent builds), one event per call: from 16
//! callers 1,380–1,510 events/s not announced vs 670–755 announced; from
//! 64 callers 1,930–2,090 vs 610–730 (the announced ones do not scale with
//! callers); 10 events per call from 64 callers, 10,400 vs 7,500. Every
//! client write would pay that, and every node would decode every change
//! of the cluster; the margin costs only the changes due within 5 s past
//! the window.
//!
//! # Payload
//! One notification carries several effects, one per line (`\n`), each
//! `KIND \t PARTITION \t DUE_MS \t TENANT \t ID` with KIND `A` (arm) or `D`
//! (disarm). Names cannot contain control characters (validated at the
//! edge), so tabs and newlines are safe separators. A notification stays
//! under [`MAX_PAYLOAD`] bytes (PostgreSQL's limit is 8000).
//!
//! # Subscription
//! [`listen`] keeps a dedicated connection (not from the pool) and re-opens
//! it after any error with a capped backoff, and when the store finds that
//! its connections lead to a server that takes no writes (the primary
//! moved: `crate::primary`). Every time LISTEN is
//! (re-)established the stream yields [`Wakeup::Resync`] first: anything
//! before it may have been missed, so the engine reloads its windows.
//!
//! The same connection also listens on the coordinator's channel
//! ([`belfry_store::cluster::CHANGE_CHANNEL`]): a partition revoked,
//! released or granted, a node joined or left. Those yield
//! [`Wakeup::Cluster`], on which a node runs its membership round at once,
//! and on [`belfry_store::cluster::PULL_READY_CHANNEL`]: another node holds
//! ready entries of pull tenants that no claim there took
//! ([`Wakeup::PullReady`]; payload: the node id, then one tenant per line),
//! and on [`belfry_store::cluster::TENANT_CHANNEL`]: a tenant's config,
//! pause or existence changed ([`Wakeup::TenantChanged`]; payload: its
//! name), announced by the tenant write's own transaction.

use std::time::Duration;

use belfry_core::{EventKey, PartitionId, TenantName, Timestamp};
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_postgres::AsyncMessage;

use crate::rows::{key_from_parts, partition_from_i32};

/// The notification channel.
pub const CHANNEL: &str = "belfry_wakeups";

/// Largest payload we send; PostgreSQL refuses 8000 bytes and more.
pub(crate) const MAX_PAYLOAD: usize = 7_900;

/// What a wake-up asks of the partition owner's timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeupKind {
    /// Put `(due, key)` into the window if it covers it.
    Arm,
    /// Take `(due, key)` out of the window.
    Disarm,
}

/// One message of [`crate::PostgresStore::subscribe_wakeups`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// A committed change of a near-term event.
    Timer {
        partition: PartitionId,
        key: EventKey,
        due: Timestamp,
        kind: WakeupKind,
    },
    /// The subscription was (re-)established: notifications may have been
    /// missed before this point, reload the windows from the store.
    Resync,
    /// The cluster changed (partition map, membership or leader lease):
    /// run a membership round now rather than at the next tick.
    Cluster,
    /// `node` holds ready entries of these pull tenants that no claim on
    /// it took ([`belfry_store::cluster::PULL_READY_CHANNEL`]).
    PullReady {
        node: String,
        tenants: Vec<TenantName>,
    },
    /// The tenant's config, pause or existence changed
    /// ([`belfry_store::cluster::TENANT_CHANNEL`]).
    TenantChanged(TenantName),
}

/// The payloads announcing `tenants` for `node`: the node id, then one
/// tenant per line, each under [`MAX_PAYLOAD`] bytes (a tenant name is far
/// shorter).
pub(crate) fn pull_ready_payloads(node: &str, tenants: &[TenantName]) -> Vec<String> {
    let mut payloads = Vec::new();
    let mut current = node.to_string();
    for tenant in tenants {
        if current.len() + 1 + tenant.as_str().len() > MAX_PAYLOAD && current.len() > node.len() {
            payloads.push(std::mem::replace(&mut current, node.to_string()));
        }
        current.push('\n');
        current.push_str(tenant.as_str());
    }
    if current.len() > node.len() {
        payloads.push(current);
    }
    payloads
}

/// Decodes a [`pull_ready_payloads`] payload; `None` if malformed.
fn decode_pull_ready(payload: &str) -> Option<Wakeup> {
    let mut lines = payload.lines();
    let node = lines.next().filter(|n| !n.is_empty())?.to_string();
    let tenants = lines
        .map(|line| TenantName::new(line).ok())
        .collect::<Option<Vec<_>>>()?;
    Some(Wakeup::PullReady { node, tenants })
}

/// Packs timer effects into as few payloads as fit.
#[derive(Debug, Default)]
pub(crate) struct PayloadBuilder {
    done: Vec<String>,
    current: String,
}

impl PayloadBuilder {
    pub fn push(
        &mut self,
        partition: PartitionId,
        key: &EventKey,
        due: Timestamp,
        kind: WakeupKind,
    ) {
        let line = format!(
            "{}\t{}\t{}\t{}\t{}",
            match kind {
                WakeupKind::Arm => 'A',
                WakeupKind::Disarm => 'D',
            },
            partition.0,
            due.as_millis(),
            key.tenant.as_str(),
            key.id.as_str()
        );
        if !self.current.is_empty() && self.current.len() + 1 + line.len() > MAX_PAYLOAD {
            self.done.push(std::mem::take(&mut self.current));
        }
        if !self.current.is_empty() {
            self.current.push('\n');
        }
        self.current.push_str(&line);
    }

    pub fn finish(mut self) -> Vec<String> {
        if !self.current.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

/// Decodes one notification payload; malformed lines are skipped (logged).
pub(crate) fn decode(payload: &str) -> Vec<Wakeup> {
    payload
        .lines()
        .filter_map(|line| {
            let decoded = decode_line(line);
            if decoded.is_none() {
                tracing::warn!(line, "ignoring a malformed wake-up");
            }
            decoded
        })
        .collect()
}

fn decode_line(line: &str) -> Option<Wakeup> {
    let mut fields = line.splitn(5, '\t');
    let kind = match fields.next()? {
        "A" => WakeupKind::Arm,
        "D" => WakeupKind::Disarm,
        _ => return None,
    };
    let partition = partition_from_i32(fields.next()?.parse().ok()?).ok()?;
    let due = Timestamp::from_millis(fields.next()?.parse().ok()?);
    let tenant = fields.next()?.to_owned();
    let id = fields.next()?.to_owned();
    Some(Wakeup::Timer {
        partition,
        key: key_from_parts(tenant, id).ok()?,
        due,
        kind,
    })
}

/// Backoff between reconnect attempts of the listener.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Runs the LISTEN connection until `out` is closed (see the module docs).
/// A change of `losses` (the store's connections led to a server that
/// takes no writes) makes it reconnect too: it may listen on a server that
/// is no longer the primary, where no change commits any more.
pub(crate) async fn listen(
    config: tokio_postgres::Config,
    tls: crate::tls::MakeTls,
    out: mpsc::Sender<Wakeup>,
    mut losses: watch::Receiver<u64>,
    clock: std::sync::Arc<dyn belfry_core::Clock>,
) {
    let mut backoff = RECONNECT_MIN;
    while !out.is_closed() {
        losses.mark_unchanged();
        let outcome = tokio::select! {
            outcome = listen_once(&config, &tls, &out, &mut backoff) => outcome,
            _ = losses.changed() => Err(ListenError::PrimaryLost),
        };
        match outcome {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(%error, "wake-up listener lost its connection; reconnecting");
            }
        }
        tokio::select! {
            () = clock.sleep(backoff) => {}
            () = out.closed() => return,
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// One connection's life. `Ok` only when the subscriber went away.
async fn listen_once(
    config: &tokio_postgres::Config,
    tls: &crate::tls::MakeTls,
    out: &mpsc::Sender<Wakeup>,
    backoff: &mut Duration,
) -> Result<(), ListenError> {
    let (client, mut connection) = config.connect(tls.clone()).await?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen_sql = format!(
        "LISTEN {CHANNEL}; LISTEN {}; LISTEN {}; LISTEN {}",
        belfry_store::cluster::CHANGE_CHANNEL,
        belfry_store::cluster::PULL_READY_CHANNEL,
        belfry_store::cluster::TENANT_CHANNEL
    );
    let listen = client.batch_execute(&listen_sql);
    tokio::pin!(listen);
    // The connection must be polled for LISTEN to complete; nothing can
    // arrive before it does.
    loop {
        tokio::select! {
            result = &mut listen => {
                result?;
                break;
            }
            message = messages.next() => match message {
                Some(Err(error)) => return Err(error.into()),
                Some(Ok(_)) => {}
                None => return Err(ListenError::Closed),
            }
        }
    }
    *backoff = RECONNECT_MIN;
    if out.send(Wakeup::Resync).await.is_err() {
        return Ok(());
    }
    while let Some(message) = messages.next().await {
        match message? {
            AsyncMessage::Notification(note) => {
                let wakeups = match note.channel() {
                    CHANNEL => decode(note.payload()),
                    belfry_store::cluster::CHANGE_CHANNEL => vec![Wakeup::Cluster],
                    belfry_store::cluster::PULL_READY_CHANNEL => {
                        match decode_pull_ready(note.payload()) {
                            Some(wakeup) => vec![wakeup],
                            None => {
                                tracing::warn!("ignoring a malformed pull announcement");
                                Vec::new()
                            }
                        }
                    }
                    belfry_store::cluster::TENANT_CHANNEL => {
                        match TenantName::new(note.payload()) {
                            Ok(tenant) => vec![Wakeup::TenantChanged(tenant)],
                            Err(_) => {
                                tracing::warn!("ignoring a malformed tenant announcement");
                                Vec::new()
                            }
                        }
                    }
                    _ => Vec::new(),
                };
                for wakeup in wakeups {
                    if out.send(wakeup).await.is_err() {
                        return Ok(());
                    }
                }
            }
            AsyncMessage::Notice(notice) => {
                tracing::debug!(
                    message = notice.message(),
                    "notice on the wake-up connection"
                );
            }
            _ => {}
        }
    }
    // `client` lives until here (the pinned LISTEN borrows it), so our side
    // never closes the connection while we listen.
    Err(ListenError::Closed)
}

/// Why a LISTEN connection ended.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error("the server closed the connection")]
    Closed,
    #[error("the store's connections led to a server that takes no writes")]
    PrimaryLost,
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_core::{EventId, TenantName};

    fn key(tenant: &str, id: &str) -> EventKey {
        EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap())
    }

    #[test]
    fn payloads_round_trip_and_stay_small() {
        let mut builder = PayloadBuilder::default();
        let long_id = "é".repeat(240);
        for i in 0..100 {
            builder.push(
                PartitionId(i),
                &key("t/x y", &format!("{long_id}{i}")),
                Timestamp::from_millis(1_000 + i64::from(i)),
                if i % 2 == 0 {
                    WakeupKind::Arm
                } else {
                    WakeupKind::Disarm
                },
            );
        }
        let payloads = builder.finish();
        assert!(
            payloads.len() > 1,
            "100 long entries need several notifications"
        );
        assert!(payloads.iter().all(|p| p.len() < MAX_PAYLOAD));
        let decoded: Vec<Wakeup> = payloads.iter().flat_map(|p| decode(p)).collect();
        assert_eq!(decoded.len(), 100);
        assert_eq!(
            decoded[3],
            Wakeup::Timer {
                partition: PartitionId(3),
                key: key("t/x y", &format!("{long_id}3")),
                due: Timestamp::from_millis(1_003),
                kind: WakeupKind::Disarm,
            }
        );
    }

    #[test]
    fn pull_announcements_round_trip_in_payloads_that_fit() {
        let tenants: Vec<TenantName> = (0..2_000)
            .map(|i| TenantName::new(format!("tenant-{i}")).unwrap())
            .collect();
        let payloads = pull_ready_payloads("node-1", &tenants);
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD));
        let mut decoded = Vec::new();
        for payload in &payloads {
            match decode_pull_ready(payload) {
                Some(Wakeup::PullReady { node, tenants }) => {
                    assert_eq!(node, "node-1");
                    decoded.extend(tenants);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(decoded, tenants);
        assert!(pull_ready_payloads("node-1", &[]).is_empty());
        assert!(decode_pull_ready("").is_none());
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let decoded = decode("X\t1\t2\tt\te\nA\t1\tnope\tt\te\nA\t1\t5\tt\te");
        assert_eq!(decoded.len(), 1);
    }
}
