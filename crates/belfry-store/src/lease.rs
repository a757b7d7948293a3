//! Pull leases in the store: the decisions both backends share.
//!
//! A backend loads, under its lock (the writer shard's group on the
//! embedded store, row locks in one transaction on PostgreSQL), the event
//! and its recorded lease, checks the partition's epoch, asks
//! [`decide_grant`] or [`decide_change`], and writes what they answer in
//! the same batch or transaction. So the rules live here once, and the
//! event moves only through [`transition`].
//!
//! One lease is recorded per event: the latest grant. A cancel or move
//! through `apply` does not touch it; it is void because the event is no
//! longer pending at its version (versions are never reused), which every
//! later decision checks first.
//!
//! A lease that never ended while its owner went away (a restart of the
//! node, a move of the partition) is an *orphan*: a later grant of its
//! attempt answers it instead of being recorded, and the owner that found
//! it records its expiry (an attempt `lease_expired`, like any expiry)
//! under its own epoch once its time has come. So every attempt a worker
//! was given is counted, whatever happened to the node that gave it.

use std::time::Duration;

use belfry_core::event::{
    Attempt, AttemptReport, EventCommand, EventRecord, TransitionContext, transition,
};
use belfry_core::pull::{LeaseChange, LeaseId, LeaseRecord, Resolution};
use belfry_core::{PartitionId, RetryPolicy, Timestamp, Verdict, WorkerId};
use serde::{Deserialize, Serialize};

use crate::{
    ChangeLeaseParams, Fence, LeaseWriteOutcome, StoreError, StoredLease, StoredLeaseState,
};

/// What a change does when it is `Done` and writes something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseWrite {
    pub lease: StoredLease,
    /// The event after a resolve (`None`: unchanged).
    pub record: Option<EventRecord>,
    /// The attempt a resolve adds to the history.
    pub attempt: Option<Attempt>,
}

/// Whether `lease` may be recorded. `current_epoch`: the partition's epoch
/// as the backend read it under its lock (the embedded store, a single
/// owner, passes `fence.epoch`). `Done` with `Some`: write that lease;
/// `Done` with `None`: already recorded (a repeat).
///
/// A lease of the event's current attempt that never ended and is not
/// this one is an orphan, whatever its epoch or expiry: the grant answers
/// it (`Orphaned`), and only its recorded expiry
/// ([`LeaseChange::Expire`]) counts the attempt and frees the version.
pub fn decide_grant(
    fence: Fence,
    current_epoch: u64,
    record: Option<&EventRecord>,
    stored: Option<&StoredLease>,
    grant: &LeaseRecord,
) -> (LeaseWriteOutcome, Option<StoredLease>) {
    let lease = &grant.lease;
    if current_epoch != fence.epoch
        || lease.epoch() != fence.epoch
        || grant.partition != fence.partition
    {
        return (LeaseWriteOutcome::Lost, None);
    }
    let Some(record) = record.filter(|r| pending_at(r, lease)) else {
        return (LeaseWriteOutcome::Cancelled, None);
    };
    if let Some(stored) = stored {
        if stored.record.lease == *lease {
            let outcome = if stored.state == StoredLeaseState::Live {
                LeaseWriteOutcome::Done
            } else {
                LeaseWriteOutcome::Lost
            };
            return (outcome, None);
        }
        if is_orphan(stored, record) {
            let orphan = Box::new(stored.record.clone());
            return (LeaseWriteOutcome::Orphaned(orphan), None);
        }
    }
    if record.attempts.checked_add(1) != Some(lease.attempt()) {
        return (LeaseWriteOutcome::Lost, None);
    }
    (
        LeaseWriteOutcome::Done,
        Some(StoredLease {
            record: grant.clone(),
            state: StoredLeaseState::Live,
        }),
    )
}

/// Whether `stored` holds `record`'s current attempt: not ended, of its
/// pending version, numbered `attempts + 1`. (A lease of another version
/// is void; one of an earlier attempt number was overtaken by an attempt
/// recorded without it.)
fn is_orphan(stored: &StoredLease, record: &EventRecord) -> bool {
    stored.state == StoredLeaseState::Live
        && pending_at(record, &stored.record.lease)
        && record.attempts.checked_add(1) == Some(stored.record.lease.attempt())
}

/// What `params` does to the recorded lease `stored` of the event
/// `record`, on a partition whose epoch is `current_epoch` (see
/// [`decide_grant`]). `Done` with `None`: a repeat, nothing to write.
///
/// Every change names the exact lease and is fenced by the current
/// epoch; only an expiry may name a lease of an earlier epoch (the
/// current owner expires an orphan), and only once its expiry has come.
pub fn decide_change(
    current_epoch: u64,
    record: Option<&EventRecord>,
    stored: Option<&StoredLease>,
    params: &ChangeLeaseParams,
) -> (LeaseWriteOutcome, Option<LeaseWrite>) {
    let lease = &params.lease;
    let fence = params.fence;
    let expiry = matches!(params.change, LeaseChange::Expire { .. });
    let epoch_ok = lease.epoch() == fence.epoch || (expiry && lease.epoch() < fence.epoch);
    let stored = match stored {
        Some(stored)
            if current_epoch == fence.epoch
                && epoch_ok
                && stored.record.partition == fence.partition
                && stored.record.lease == *lease =>
        {
            stored
        }
        _ => return (LeaseWriteOutcome::Lost, None),
    };
    let ended = match &stored.state {
        StoredLeaseState::Resolved(ended) => Some((ended, false)),
        StoredLeaseState::Expired(ended) => Some((ended, true)),
        StoredLeaseState::Live | StoredLeaseState::Voided => None,
    };
    if let Some((ended, expired)) = ended {
        let repeat = match &params.change {
            LeaseChange::Resolve { resolution, .. } => !expired && resolution == ended,
            LeaseChange::Expire { resolution, .. } => expired && resolution == ended,
            LeaseChange::Extend { .. } => false,
        };
        let outcome = if repeat {
            LeaseWriteOutcome::Done
        } else {
            LeaseWriteOutcome::Lost
        };
        return (outcome, None);
    }
    let Some(record) = record.filter(|r| pending_at(r, lease)) else {
        return (LeaseWriteOutcome::Cancelled, None);
    };
    let (resolution, report, state) = match &params.change {
        LeaseChange::Extend { expires_at } => {
            let mut extended = stored.clone();
            extended.record.expires_at = *expires_at;
            return (
                LeaseWriteOutcome::Done,
                Some(LeaseWrite {
                    lease: extended,
                    record: None,
                    attempt: None,
                }),
            );
        }
        LeaseChange::Resolve { resolution, report } => (
            resolution,
            report.clone(),
            StoredLeaseState::Resolved(resolution.clone()),
        ),
        LeaseChange::Expire { .. } if params.at < stored.record.expires_at => {
            // Never before its time: its worker may still be running it.
            return (LeaseWriteOutcome::Lost, None);
        }
        LeaseChange::Expire { resolution, report } => (
            resolution,
            Some(report.clone()),
            StoredLeaseState::Expired(resolution.clone()),
        ),
    };
    let (next, attempt) = resolve(record, &stored.record, resolution, &report, params.at);
    (
        LeaseWriteOutcome::Done,
        Some(LeaseWrite {
            lease: StoredLease {
                record: stored.record.clone(),
                state,
            },
            record: Some(next),
            attempt,
        }),
    )
}

/// The state a lease is reported in by `get_lease`: a live lease whose
/// event left its version, or whose epoch is not the partition's, is void.
pub fn reported(
    mut stored: StoredLease,
    record: Option<&EventRecord>,
    current_epoch: Option<u64>,
) -> StoredLease {
    if stored.state == StoredLeaseState::Live {
        let pending = record.is_some_and(|r| pending_at(r, &stored.record.lease));
        let epoch_moved = current_epoch.is_some_and(|e| e != stored.record.lease.epoch());
        if !pending || epoch_moved {
            stored.state = StoredLeaseState::Voided;
        }
    }
    stored
}

fn pending_at(record: &EventRecord, lease: &LeaseId) -> bool {
    record.status.is_pending() && record.version == *lease.version()
}

/// A retry policy under which [`transition`] never gives up: the pull
/// queue has already decided that the event is retried, and when.
fn never_give_up() -> RetryPolicy {
    RetryPolicy {
        backlog_limit: Duration::from_secs(1_000 * 365 * 24 * 3600),
        ..RetryPolicy::default()
    }
}

/// The event after `resolution`, through the ordinary state machine, and
/// the attempt it adds to the history.
fn resolve(
    record: &EventRecord,
    lease: &LeaseRecord,
    resolution: &Resolution,
    report: &Option<AttemptReport>,
    at: Timestamp,
) -> (EventRecord, Option<Attempt>) {
    let verdict = match resolution {
        Resolution::Released { at: due } => {
            // No attempt: only the instant of the next one moves.
            let mut next = record.clone();
            next.next_fire_at = Some(*due);
            next.updated_at = at;
            return (next, None);
        }
        Resolution::Delivered { .. } => Verdict::Delivered,
        Resolution::Retry { .. } => Verdict::Retry,
        Resolution::Dead { .. } => Verdict::Permanent,
    };
    // Without a report the attempt is still counted, as the lease's span.
    let reported = report.clone().unwrap_or_else(|| AttemptReport {
        started_at: lease.leased_at,
        duration_ms: lease.leased_at.until(at).as_millis() as u64,
        verdict,
        http_status: None,
        error: None,
        steer: None,
    });
    let retry = never_give_up();
    let step = transition(
        &record.key,
        Some(record),
        EventCommand::RecordAttempt {
            version: record.version.clone(),
            // The next attempt, as the lease was granted for; a repeated
            // resolution never gets here (leases are idempotent by id).
            number: record.attempts + 1,
            report: AttemptReport {
                verdict,
                ..reported.clone()
            },
            tenant: Default::default(),
        },
        TransitionContext {
            now: at,
            partition: record.partition,
            retry: &retry,
        },
    );
    let mut next = step.next.unwrap_or_else(|| record.clone());
    let mut attempt = step.attempt;
    // The history keeps the attempt's own verdict (an expired last
    // attempt is a retriable failure that gave up).
    if let Some(attempt) = &mut attempt {
        attempt.verdict = reported.verdict;
    }
    match resolution {
        Resolution::Retry { at: due } => next.next_fire_at = Some(*due),
        Resolution::Dead { reason } => next.last_error = Some(reason.clone()),
        Resolution::Delivered { .. } | Resolution::Released { .. } => {}
    }
    (next, attempt)
}

/// The stored form of a [`StoredLease`] (the embedded store's value, and
/// PostgreSQL's `lease` column).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseDoc {
    pub lease: LeaseId,
    pub partition: PartitionId,
    pub worker: WorkerId,
    pub leased_at: Timestamp,
    pub expires_at: Timestamp,
    pub deadline_at: Timestamp,
    /// `None`: live.
    pub ended: Option<ResolutionDoc>,
    /// What ended it; absent in leases stored before it was recorded
    /// (see [`LeaseDoc::into_stored`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<EndedBy>,
}

/// What ended a stored lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// Its worker's complete, fail or release.
    Worker,
    /// Its expiry.
    Expiry,
}

/// The stored form of a [`Resolution`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResolutionDoc {
    Delivered { result: Option<String> },
    Retry { at: Timestamp },
    Dead { reason: String },
    Released { at: Timestamp },
}

impl From<&Resolution> for ResolutionDoc {
    fn from(resolution: &Resolution) -> Self {
        match resolution.clone() {
            Resolution::Delivered { result } => ResolutionDoc::Delivered { result },
            Resolution::Retry { at } => ResolutionDoc::Retry { at },
            Resolution::Dead { reason } => ResolutionDoc::Dead { reason },
            Resolution::Released { at } => ResolutionDoc::Released { at },
        }
    }
}

impl From<ResolutionDoc> for Resolution {
    fn from(doc: ResolutionDoc) -> Self {
        match doc {
            ResolutionDoc::Delivered { result } => Resolution::Delivered { result },
            ResolutionDoc::Retry { at } => Resolution::Retry { at },
            ResolutionDoc::Dead { reason } => Resolution::Dead { reason },
            ResolutionDoc::Released { at } => Resolution::Released { at },
        }
    }
}

impl LeaseDoc {
    pub fn of(stored: &StoredLease) -> Self {
        let record = &stored.record;
        LeaseDoc {
            lease: record.lease.clone(),
            partition: record.partition,
            worker: record.worker.clone(),
            leased_at: record.leased_at,
            expires_at: record.expires_at,
            deadline_at: record.deadline_at,
            ended: match &stored.state {
                StoredLeaseState::Resolved(resolution) | StoredLeaseState::Expired(resolution) => {
                    Some(resolution.into())
                }
                // Voided is never stored: it is read off the event.
                StoredLeaseState::Live | StoredLeaseState::Voided => None,
            },
            ended_by: match &stored.state {
                StoredLeaseState::Resolved(_) => Some(EndedBy::Worker),
                StoredLeaseState::Expired(_) => Some(EndedBy::Expiry),
                StoredLeaseState::Live | StoredLeaseState::Voided => None,
            },
        }
    }

    pub fn into_stored(self) -> StoredLease {
        StoredLease {
            record: LeaseRecord {
                lease: self.lease,
                partition: self.partition,
                worker: self.worker,
                leased_at: self.leased_at,
                expires_at: self.expires_at,
                deadline_at: self.deadline_at,
            },
            state: match (self.ended, self.ended_by) {
                (None, _) => StoredLeaseState::Live,
                (Some(ended), Some(EndedBy::Worker)) => StoredLeaseState::Resolved(ended.into()),
                (Some(ended), Some(EndedBy::Expiry)) => StoredLeaseState::Expired(ended.into()),
                // Stored before `ended_by`: a completion or a release was
                // its worker's; a retry or a dead end may have been an
                // expiry, so it is not taken for a worker's failure.
                (Some(ended), None) => match ended {
                    ResolutionDoc::Delivered { .. } | ResolutionDoc::Released { .. } => {
                        StoredLeaseState::Resolved(ended.into())
                    }
                    ResolutionDoc::Retry { .. } | ResolutionDoc::Dead { .. } => {
                        StoredLeaseState::Expired(ended.into())
                    }
                },
            },
        }
    }

    pub fn encode(stored: &StoredLease) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(&LeaseDoc::of(stored))
            .map_err(|e| StoreError::Internal(format!("cannot encode a lease: {e}")))
    }

    pub fn decode(bytes: &[u8]) -> Result<StoredLease, StoreError> {
        serde_json::from_slice::<LeaseDoc>(bytes)
            .map(LeaseDoc::into_stored)
            .map_err(|e| StoreError::Internal(format!("stored lease is corrupt: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use belfry_core::pull::LeaseNonce;
    use belfry_core::{EventId, EventKey, EventVersion, TenantName};

    use super::*;

    fn stored(state: StoredLeaseState) -> StoredLease {
        let key = EventKey::new(
            TenantName::new("pull").unwrap(),
            EventId::new("job").unwrap(),
        );
        StoredLease {
            record: LeaseRecord {
                lease: LeaseId::new(
                    key,
                    EventVersion::from_string("v1".into()),
                    1,
                    3,
                    LeaseNonce([1; 16]),
                )
                .unwrap(),
                partition: PartitionId(2),
                worker: WorkerId::new("w").unwrap(),
                leased_at: Timestamp::from_millis(1_000),
                expires_at: Timestamp::from_millis(2_000),
                deadline_at: Timestamp::from_millis(9_000),
            },
            state,
        }
    }

    #[test]
    fn what_ended_a_lease_is_stored_with_it() {
        let at = Timestamp::from_millis(5_000);
        for state in [
            StoredLeaseState::Live,
            StoredLeaseState::Resolved(Resolution::Retry { at }),
            StoredLeaseState::Expired(Resolution::Retry { at }),
            StoredLeaseState::Expired(Resolution::Dead {
                reason: "gave up".into(),
            }),
        ] {
            let lease = stored(state);
            let bytes = LeaseDoc::encode(&lease).unwrap();
            assert_eq!(LeaseDoc::decode(&bytes).unwrap(), lease);
        }
    }

    /// Leases stored before `ended_by`: a retry or dead end may have been
    /// an expiry, so it never answers a worker's repeated failure.
    #[test]
    fn a_lease_stored_without_what_ended_it_is_read_conservatively() {
        let at = Timestamp::from_millis(5_000);
        for (resolution, expired) in [
            (Resolution::Delivered { result: None }, false),
            (Resolution::Released { at }, false),
            (Resolution::Retry { at }, true),
            (Resolution::Dead { reason: "x".into() }, true),
        ] {
            let mut doc = LeaseDoc::of(&stored(StoredLeaseState::Resolved(resolution.clone())));
            doc.ended_by = None;
            let legacy = serde_json::to_vec(&doc).unwrap();
            assert!(!String::from_utf8_lossy(&legacy).contains("ended_by"));
            let read = LeaseDoc::decode(&legacy).unwrap().state;
            let expected = if expired {
                StoredLeaseState::Expired(resolution)
            } else {
                StoredLeaseState::Resolved(resolution)
            };
            assert_eq!(read, expected);
        }
    }
}
