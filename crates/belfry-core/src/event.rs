//! The event record and its state machine.
//!
//! [`transition`] is a pure function `(state, command, now) → (state,
//! effects)`. Stores call it inside their write path so that the
//! read-modify-write of one event is atomic; the engine performs the
//! [`Effect`]s. See `docs/event-states.md` for the diagram.

use serde::{Deserialize, Serialize};

use crate::ids::{EventKey, EventVersion};
use crate::partition::PartitionId;
pub use crate::policy::EventSettings;
use crate::policy::{Asked, DeliveryPolicy, NodeDefaults, Steer};
use crate::retry::{RetryPolicy, Verdict};
use crate::tenant::DeliveryDefaults;
use crate::time::Timestamp;

/// How the delivered body is shaped (BigBen's `deliveryOption`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DeliveryOption {
    /// The whole event as JSON (BigBen's `EventResponse`).
    #[default]
    #[serde(rename = "FULL_EVENT")]
    FullEvent,
    /// Only the payload string, as is.
    #[serde(rename = "PAYLOAD_ONLY")]
    PayloadOnly,
}

/// Where an event is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Waiting for its instant.
    Scheduled,
    /// At least one attempt failed transiently; the next one is scheduled.
    Retrying,
    /// Terminal: the receiver accepted it.
    Delivered,
    /// Terminal: a permanent refusal, or retries ran out at the backlog limit.
    Failed,
    /// Terminal: it came due while Belfry was down, longer ago than the
    /// look-back allows; recorded instead of fired.
    Missed,
    /// Terminal: cancelled by the client before delivery.
    Cancelled,
    /// Terminal: not delivered by its expiry (`expire_at`, `max_age_ms`);
    /// no attempt was made at or after it.
    Expired,
}

impl EventStatus {
    /// Every status, in declaration order (the embedded store's index bytes
    /// follow it).
    pub const ALL: [EventStatus; 7] = [
        EventStatus::Scheduled,
        EventStatus::Retrying,
        EventStatus::Delivered,
        EventStatus::Failed,
        EventStatus::Missed,
        EventStatus::Cancelled,
        EventStatus::Expired,
    ];

    /// Pending events are in the due index and will be fired.
    pub fn is_pending(self) -> bool {
        matches!(self, EventStatus::Scheduled | EventStatus::Retrying)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Scheduled => "scheduled",
            EventStatus::Retrying => "retrying",
            EventStatus::Delivered => "delivered",
            EventStatus::Failed => "failed",
            EventStatus::Missed => "missed",
            EventStatus::Cancelled => "cancelled",
            EventStatus::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub key: EventKey,
    pub partition: PartitionId,
    /// Current version; the idempotency key of its deliveries.
    pub version: EventVersion,
    /// The instant the client asked for.
    pub event_time: Timestamp,
    pub payload: Option<String>,
    pub delivery: DeliveryOption,
    pub status: EventStatus,
    /// When the next attempt is due; `Some` exactly when the status is
    /// pending. This, not `event_time`, is the event's key in the due index.
    pub next_fire_at: Option<Timestamp>,
    /// Attempts made for the current version.
    pub attempts: u32,
    pub last_error: Option<String>,
    /// When the first attempt of the current version started.
    pub triggered_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// When the event reached a terminal status; drives retention.
    pub finished_at: Option<Timestamp>,
    /// When the pending series of debounced writes began (the acceptance
    /// of the one that made the event pending): no debounced write moves
    /// the instant past it plus its `max_wait_ms`. `None` when the last
    /// write was not debounced. Kept apart by the stores like `settings`.
    #[serde(skip)]
    pub debounce_since: Option<Timestamp>,
    /// The event's own delivery settings. Left out of the record's own
    /// serde form: the stores keep them apart so records written before
    /// they existed still read (the embedded store after the record,
    /// PostgreSQL in columns with defaults).
    #[serde(skip)]
    pub settings: EventSettings,
}

/// What one finished delivery attempt reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptReport {
    pub started_at: Timestamp,
    pub duration_ms: u64,
    pub verdict: Verdict,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    /// What the receiver asked of the next attempts (`Retry-After`, `410`).
    pub steer: Option<Steer>,
}

/// How much later than `started_at + duration_ms` an answer may have come
/// (both are cut to the millisecond).
const ANSWER_TRUNCATION_MS: u64 = 2;

impl AttemptReport {
    /// What the receiver asked for the next attempt, as a delay from
    /// `now`: its `Retry-After` counts from when it answered (the end of
    /// the attempt), so the time taken to record the attempt is not added.
    /// `started_at` and `duration_ms` are each cut to the millisecond, so
    /// the answer came up to 2 ms after their sum: counting from 2 ms later
    /// keeps the next attempt from coming sooner than asked.
    pub fn asked(&self, now: Timestamp) -> Asked {
        match self.steer {
            Some(Steer::RetryAfter(retry_after)) => {
                let answered_at = self.started_at.plus(std::time::Duration::from_millis(
                    self.duration_ms.saturating_add(ANSWER_TRUNCATION_MS),
                ));
                let next = answered_at.plus(retry_after.delay_from(answered_at));
                Asked::Receiver(now.until(next))
            }
            Some(Steer::Gone) | None => Asked::Nothing,
        }
    }
}

/// One entry of an event's execution history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub version: EventVersion,
    /// 1 for the first attempt of a version.
    pub number: u32,
    pub started_at: Timestamp,
    pub duration_ms: u64,
    pub verdict: Verdict,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

/// A change requested for one event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventCommand {
    /// Create the event, or update it (see [`transition`] for the rules).
    Upsert {
        event_time: Timestamp,
        payload: Option<String>,
        delivery: DeliveryOption,
        /// Replaces the event's, like the payload.
        settings: EventSettings,
        /// The version to use if this upsert starts a new one.
        new_version: EventVersion,
    },
    /// Cancel a pending event.
    Cancel,
    /// Record how attempt `number` on `version` ended. `(version, number)`
    /// identifies the attempt: recording it again changes nothing (see
    /// [`CommandOutcome::AttemptAlreadyRecorded`]), so a write that
    /// committed but answered an error can be retried.
    RecordAttempt {
        version: EventVersion,
        /// The number the delivery carried (`X-Belfry-Attempt`): 1 + the
        /// attempts of the record it was made from.
        number: u32,
        report: AttemptReport,
        /// The event's tenant's defaults, for its next attempt
        /// ([`DeliveryPolicy::resolve`] with the node's retry policy).
        tenant: DeliveryDefaults,
    },
    /// End a pending event that is too far past due to fire.
    Expire { reason: String },
    /// [`EventCommand::Expire`] for the fire path: only while the event is
    /// pending with `version`, so a move or re-create acknowledged between
    /// the decision and its recording is not expired with it.
    ExpireVersion {
        version: EventVersion,
        reason: String,
    },
    /// End a pending event whose own expiry passed before its next attempt
    /// (`expired`), only while it is pending with `version`, as
    /// [`EventCommand::ExpireVersion`].
    EndExpired {
        version: EventVersion,
        reason: String,
    },
    /// Send a dead event again: a `failed` (or `missed`) event becomes
    /// pending, due now, as a new version (`new_version`: a new
    /// idempotency key and a new attempt series). Its instant, payload and
    /// history are kept.
    Redrive { new_version: EventVersion },
    /// Compare-and-set for the engine's own control events (recurring
    /// schedules): an [`EventCommand::Upsert`] that applies only while the
    /// event is pending with version `expected`; otherwise nothing changes
    /// ([`CommandOutcome::VersionChanged`]), so a client's change made in
    /// between wins.
    UpsertIfCurrent {
        expected: EventVersion,
        event_time: Timestamp,
        payload: Option<String>,
        delivery: DeliveryOption,
        new_version: EventVersion,
    },
    /// An [`EventCommand::Upsert`] whose instant is `debounce`'s: the
    /// write's `now` plus its delay, but never past the start of the
    /// event's pending series of debounced writes plus its maximum wait
    /// ([`Debounce::instant`]).
    DebouncedUpsert {
        debounce: Debounce,
        payload: Option<String>,
        delivery: DeliveryOption,
        settings: EventSettings,
        new_version: EventVersion,
    },
    /// A client's `command` (an upsert or a cancel) that applies only if
    /// `precondition` holds for the stored event (`If-Match`); otherwise
    /// nothing changes ([`CommandOutcome::PreconditionFailed`]). Decided in
    /// the same transition as the change, so no write slips in between.
    IfMatch {
        precondition: Precondition,
        command: Box<EventCommand>,
    },
}

impl EventCommand {
    /// The command without its conditions: what it does if it applies.
    pub fn unconditional(&self) -> &EventCommand {
        match self {
            EventCommand::IfMatch { command, .. } => command.unconditional(),
            command => command,
        }
    }
}

/// A debounced write's delays, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounce {
    /// From the write's acceptance to the instant.
    pub delay_ms: u64,
    /// From the start of the pending series to the latest instant.
    pub max_wait_ms: u64,
}

impl Debounce {
    /// The instant of a debounced write accepted at `now` on the event
    /// `current`, and the start of its series.
    ///
    /// - The series goes on while the event is pending in it and its
    ///   instant has not come: the instant is `now + delay_ms`, but no
    ///   later than the series' start plus `max_wait_ms`.
    /// - Once its instant has come and no attempt is recorded yet (the
    ///   delivery is due, or under way), the write goes out with it: due
    ///   at once (`now`, a new version), so the series is delivered at its
    ///   cap with the latest payload rather than pushed into the next
    ///   series. A delivery of the previous version already under way
    ///   still arrives (the edit contract).
    /// - Anything else (no event, a finished or cancelled one, one last
    ///   written without debounce, one retrying) starts a series at `now`,
    ///   so a write never moves a version already attempted back into its
    ///   series.
    pub fn instant(self, now: Timestamp, current: Option<&EventRecord>) -> (Timestamp, Timestamp) {
        let in_series = current.filter(|record| {
            record.status == EventStatus::Scheduled && record.debounce_since.is_some()
        });
        if let Some(record) = in_series
            && let Some(since) = record.debounce_since
        {
            if record.event_time <= now {
                // A new instant, so a new version: the same one kept the
                // version, and an attempt under way would swallow this
                // write's payload.
                let at = now.max(record.event_time.plus(std::time::Duration::from_millis(1)));
                return (at, since);
            }
            let wanted = now.plus(std::time::Duration::from_millis(self.delay_ms));
            let latest = since.plus(std::time::Duration::from_millis(self.max_wait_ms));
            return (wanted.min(latest), since);
        }
        let wanted = now.plus(std::time::Duration::from_millis(self.delay_ms));
        let latest = now.plus(std::time::Duration::from_millis(self.max_wait_ms));
        (wanted.min(latest), now)
    }
}

/// What a conditional command requires of the stored event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precondition {
    /// The event is stored, in any status (`If-Match: *`).
    Exists,
    /// The event is stored and its version is one of these (none: never).
    Versions(Vec<EventVersion>),
    /// Nothing is stored under the key (a cancelled or finished event is
    /// stored): a create that must not overwrite what another writer
    /// created since the key was read.
    Absent,
}

impl Precondition {
    pub fn holds(&self, current: Option<&EventRecord>) -> bool {
        match (self, current) {
            (Precondition::Absent, current) => current.is_none(),
            (_, None) => false,
            (Precondition::Exists, Some(_)) => true,
            (Precondition::Versions(versions), Some(record)) => versions.contains(&record.version),
        }
    }
}

/// How far the delivery of an event's version had gone when a cancel or a
/// move replaced it. The store's record ([`Replaced::of`]) shows recorded
/// attempts only; the partition's owner knows of an attempt in flight,
/// which the edge asks for before answering (`docs/api.md`, "Conditional
/// edits").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreviousDelivery {
    /// Pending, no attempt recorded or in flight: it never will be.
    NotStarted,
    /// Pending, with an attempt recorded (`retrying`) or in flight.
    Started,
    /// The version had ended (`delivered`, `failed`, `missed`, `expired`).
    Finished,
    /// No attempt recorded, and the node owning the event's partition
    /// could not be asked whether one is in flight (a cluster whose owner
    /// is unreachable or changing): one may have started.
    Unknown,
}

impl PreviousDelivery {
    pub fn as_str(self) -> &'static str {
        match self {
            PreviousDelivery::NotStarted => "not_started",
            PreviousDelivery::Started => "started",
            PreviousDelivery::Finished => "finished",
            PreviousDelivery::Unknown => "unknown",
        }
    }
}

/// The version a cancel or a move replaced, and how far its delivery had
/// gone as the stored record shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replaced {
    pub version: EventVersion,
    pub delivery: PreviousDelivery,
}

impl Replaced {
    /// For a command that ended in `outcome` on the event stored as
    /// `previous`: the version it cancelled or moved (`None` for anything
    /// else). An attempt that started but is not recorded yet is not seen
    /// here: `NotStarted` is only the store's view.
    pub fn of(previous: Option<&EventRecord>, outcome: &CommandOutcome) -> Option<Self> {
        if !matches!(
            outcome,
            CommandOutcome::Cancelled | CommandOutcome::Updated { moved: true }
        ) {
            return None;
        }
        let previous = previous?;
        let delivery = if !previous.status.is_pending() {
            PreviousDelivery::Finished
        } else if previous.attempts > 0 || previous.triggered_at.is_some() {
            PreviousDelivery::Started
        } else {
            PreviousDelivery::NotStarted
        };
        Some(Replaced {
            version: previous.version.clone(),
            delivery,
        })
    }
}

/// What a command did, as the client-facing answer needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutcome {
    /// A new event (or a new life for a cancelled one).
    Created,
    /// An existing event changed. `moved`: it got a new instant and version.
    Updated {
        moved: bool,
    },
    Cancelled,
    /// Cancel of an unknown (or already cancelled) event.
    NotFound,
    /// Cancel of an event that already reached a terminal status.
    AlreadyFinished(EventStatus),
    /// An attempt was recorded; the event is now in this status.
    AttemptRecorded(EventStatus),
    /// An attempt for a version that is no longer current (moved, cancelled
    /// or finished meanwhile): history only, state unchanged.
    StaleAttempt,
    /// The attempt `(version, number)` is recorded already (a retried
    /// write whose first try committed): nothing changed, no history entry;
    /// the event is in this status.
    AttemptAlreadyRecorded(EventStatus),
    Expired,
    /// `Expire` of an event that is no longer pending: nothing changed.
    NotPending,
    /// `UpsertIfCurrent` of an event that changed version or is no longer
    /// pending: nothing changed.
    VersionChanged,
    /// A failed or missed event is pending again, due now.
    Redriven,
    /// `Redrive` of an event that is not failed or missed (pending,
    /// delivered, cancelled): nothing changed.
    NotRedrivable(EventStatus),
    /// `IfMatch` whose precondition does not hold, on an event that
    /// already is what its command would make it (a retry of a write that
    /// was applied): nothing changed, and the write succeeded.
    AlreadyApplied,
    /// `IfMatch` whose precondition does not hold: nothing changed.
    /// `current` is the stored version, if any.
    PreconditionFailed {
        current: Option<EventVersion>,
    },
}

/// What the runtime must do after a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Put `(at, key)` in the partition's timer if the window covers it.
    Arm { at: Timestamp },
    /// Take `(at, key)` out of the partition's timer.
    Disarm { at: Timestamp },
}

/// Inputs of a transition besides the state and the command.
#[derive(Debug, Clone, Copy)]
pub struct TransitionContext<'a> {
    pub now: Timestamp,
    pub partition: PartitionId,
    pub retry: &'a RetryPolicy,
}

/// The result of applying a command to an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The state to store; `None` leaves the stored state as it is.
    pub next: Option<EventRecord>,
    pub outcome: CommandOutcome,
    pub effects: Vec<Effect>,
    /// An entry to append to the history.
    pub attempt: Option<Attempt>,
}

impl Transition {
    fn unchanged(outcome: CommandOutcome) -> Self {
        Transition {
            next: None,
            outcome,
            effects: Vec::new(),
            attempt: None,
        }
    }
}

/// Applies `command` to the event `key` whose stored state is `current`.
///
/// Upsert rules:
/// - unknown or cancelled → a new event (`Created`), fires at its instant;
/// - same instant → payload and delivery option replaced, version kept, no
///   re-fire if it was already delivered (a client retrying its request must
///   not cause a second delivery);
/// - other instant → moved: new version, attempts reset, fires at the new
///   instant, whatever its status was.
pub fn transition(
    key: &EventKey,
    current: Option<&EventRecord>,
    command: EventCommand,
    ctx: TransitionContext<'_>,
) -> Transition {
    let now = ctx.now;
    match command {
        EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            settings,
            new_version,
        } => match current {
            Some(existing) if existing.status != EventStatus::Cancelled => {
                let mut next = existing.clone();
                next.payload = payload;
                next.delivery = delivery;
                next.settings = settings;
                next.updated_at = now;
                // A write that is not debounced ends the series; a
                // debounced one sets it again.
                next.debounce_since = None;
                if existing.event_time == event_time {
                    // Same place in the timer, new content: re-arming it
                    // tells the owner to drop a record it read ahead.
                    let effects = existing
                        .next_fire_at
                        .map(|at| vec![Effect::Arm { at }])
                        .unwrap_or_default();
                    return Transition {
                        next: Some(next),
                        outcome: CommandOutcome::Updated { moved: false },
                        effects,
                        attempt: None,
                    };
                }
                let mut effects = Vec::new();
                if let Some(old) = existing.next_fire_at {
                    effects.push(Effect::Disarm { at: old });
                }
                effects.push(Effect::Arm { at: event_time });
                next.version = new_version;
                next.event_time = event_time;
                next.status = EventStatus::Scheduled;
                next.next_fire_at = Some(event_time);
                next.attempts = 0;
                next.last_error = None;
                next.triggered_at = None;
                next.finished_at = None;
                Transition {
                    next: Some(next),
                    outcome: CommandOutcome::Updated { moved: true },
                    effects,
                    attempt: None,
                }
            }
            _ => Transition {
                next: Some(EventRecord {
                    debounce_since: None,
                    key: key.clone(),
                    partition: ctx.partition,
                    version: new_version,
                    event_time,
                    payload,
                    delivery,
                    status: EventStatus::Scheduled,
                    next_fire_at: Some(event_time),
                    attempts: 0,
                    last_error: None,
                    triggered_at: None,
                    created_at: now,
                    updated_at: now,
                    finished_at: None,
                    settings,
                }),
                outcome: CommandOutcome::Created,
                effects: vec![Effect::Arm { at: event_time }],
                attempt: None,
            },
        },
        EventCommand::Redrive { new_version } => match current {
            None => Transition::unchanged(CommandOutcome::NotFound),
            Some(existing)
                if !matches!(existing.status, EventStatus::Failed | EventStatus::Missed) =>
            {
                Transition::unchanged(CommandOutcome::NotRedrivable(existing.status))
            }
            Some(existing) => {
                let mut next = existing.clone();
                next.version = new_version;
                next.status = EventStatus::Scheduled;
                next.next_fire_at = Some(now);
                next.debounce_since = None;
                next.attempts = 0;
                next.last_error = None;
                next.triggered_at = None;
                next.finished_at = None;
                next.updated_at = now;
                Transition {
                    next: Some(next),
                    outcome: CommandOutcome::Redriven,
                    effects: vec![Effect::Arm { at: now }],
                    attempt: None,
                }
            }
        },
        EventCommand::Cancel => match current {
            None => Transition::unchanged(CommandOutcome::NotFound),
            Some(existing) if existing.status == EventStatus::Cancelled => {
                Transition::unchanged(CommandOutcome::NotFound)
            }
            Some(existing) if !existing.status.is_pending() => {
                Transition::unchanged(CommandOutcome::AlreadyFinished(existing.status))
            }
            Some(existing) => {
                let mut next = existing.clone();
                let effects = finish(&mut next, EventStatus::Cancelled, now);
                Transition {
                    next: Some(next),
                    outcome: CommandOutcome::Cancelled,
                    effects,
                    attempt: None,
                }
            }
        },
        EventCommand::RecordAttempt {
            version,
            number,
            report,
            tenant,
        } => {
            let Some(existing) = current else {
                return Transition::unchanged(CommandOutcome::StaleAttempt);
            };
            if existing.version == version && number <= existing.attempts {
                // Recorded already: the retry of a write that committed
                // but answered an error. Its effects never reached the
                // owner, so the pending instant it set is armed again
                // (arming an armed entry changes nothing).
                let effects = existing
                    .next_fire_at
                    .filter(|_| existing.status.is_pending())
                    .map(|at| vec![Effect::Arm { at }])
                    .unwrap_or_default();
                return Transition {
                    next: None,
                    outcome: CommandOutcome::AttemptAlreadyRecorded(existing.status),
                    effects,
                    attempt: None,
                };
            }
            let current_version = existing.version == version && existing.status.is_pending();
            let attempt = Attempt {
                version,
                number,
                started_at: report.started_at,
                duration_ms: report.duration_ms,
                verdict: report.verdict,
                http_status: report.http_status,
                error: report.error.clone(),
            };
            if !current_version {
                // The event changed (moved, or cancelled and re-created)
                // while this attempt was in flight. Its current version, if
                // pending, is re-armed: the wake-up its change sent may have
                // found the old delivery still holding the event, and it
                // must not wait for a reload to fire. The history entry
                // keeps the attempt's own number; the stores write it once
                // per (version, number), as the transition cannot see it.
                let effects = existing
                    .next_fire_at
                    .filter(|_| existing.status.is_pending())
                    .map(|at| vec![Effect::Arm { at }])
                    .unwrap_or_default();
                return Transition {
                    next: None,
                    outcome: CommandOutcome::StaleAttempt,
                    effects,
                    attempt: Some(attempt),
                };
            }
            let mut next = existing.clone();
            next.attempts = number;
            next.updated_at = now;
            next.triggered_at.get_or_insert(report.started_at);
            let effects = match report.verdict {
                Verdict::Delivered => {
                    next.last_error = None;
                    next.triggered_at = Some(report.started_at);
                    finish(&mut next, EventStatus::Delivered, now)
                }
                Verdict::Permanent => {
                    next.last_error = report.error;
                    finish(&mut next, EventStatus::Failed, now)
                }
                Verdict::Retry => {
                    let asked = report.asked(now);
                    next.last_error = report.error;
                    let policy = DeliveryPolicy::resolve(
                        NodeDefaults::push(ctx.retry),
                        &tenant,
                        &existing.settings,
                        existing.event_time,
                    );
                    match policy.next_attempt(number, existing.event_time, now, asked) {
                        Ok(at) => {
                            let mut effects = Vec::new();
                            if let Some(old) = existing.next_fire_at {
                                effects.push(Effect::Disarm { at: old });
                            }
                            effects.push(Effect::Arm { at });
                            next.status = EventStatus::Retrying;
                            next.next_fire_at = Some(at);
                            effects
                        }
                        Err(give_up) => {
                            let reason = next.last_error.take().unwrap_or_default();
                            next.last_error = Some(give_up.describe(number, &reason));
                            finish(&mut next, EventStatus::Failed, now)
                        }
                    }
                }
            };
            Transition {
                outcome: CommandOutcome::AttemptRecorded(next.status),
                next: Some(next),
                effects,
                attempt: Some(attempt),
            }
        }
        EventCommand::UpsertIfCurrent {
            expected,
            event_time,
            payload,
            delivery,
            new_version,
        } => match current {
            Some(existing) if existing.status.is_pending() && existing.version == expected => {
                // Control events keep their settings (they have none).
                let upsert = EventCommand::Upsert {
                    event_time,
                    payload,
                    delivery,
                    settings: existing.settings.clone(),
                    new_version,
                };
                transition(key, current, upsert, ctx)
            }
            _ => Transition::unchanged(CommandOutcome::VersionChanged),
        },
        EventCommand::DebouncedUpsert {
            debounce,
            payload,
            delivery,
            settings,
            new_version,
        } => {
            let (event_time, since) = debounce.instant(now, current);
            let upsert = EventCommand::Upsert {
                event_time,
                payload,
                delivery,
                settings,
                new_version,
            };
            let mut step = transition(key, current, upsert, ctx);
            if let Some(next) = step.next.as_mut() {
                next.debounce_since = Some(since);
            }
            step
        }
        EventCommand::IfMatch {
            precondition,
            command,
        } => {
            if precondition.holds(current) {
                transition(key, current, *command, ctx)
            } else if current.is_some_and(|record| already_applied(record, &command)) {
                Transition::unchanged(CommandOutcome::AlreadyApplied)
            } else {
                Transition::unchanged(CommandOutcome::PreconditionFailed {
                    current: current.map(|r| r.version.clone()),
                })
            }
        }
        EventCommand::ExpireVersion { version, reason } => match current {
            Some(existing) if existing.version == version => {
                transition(key, current, EventCommand::Expire { reason }, ctx)
            }
            _ => Transition::unchanged(CommandOutcome::NotPending),
        },
        EventCommand::Expire { reason } => end_pending(current, EventStatus::Missed, reason, now),
        EventCommand::EndExpired { version, reason } => match current {
            Some(existing) if existing.version == version => {
                end_pending(current, EventStatus::Expired, reason, now)
            }
            _ => Transition::unchanged(CommandOutcome::NotPending),
        },
    }
}

/// Whether `record` already is what `command` would make of it: a retried
/// conditional `PUT` whose first try was applied (its answer lost) finds
/// the version it created, not the one it named. RFC 9110 lets such a
/// request succeed instead of failing its precondition. A cancelled event
/// is not: something changed it since.
fn already_applied(record: &EventRecord, command: &EventCommand) -> bool {
    match command {
        EventCommand::Upsert {
            event_time,
            payload,
            delivery,
            settings,
            ..
        } => {
            record.status != EventStatus::Cancelled
                && record.event_time == *event_time
                && record.payload == *payload
                && record.delivery == *delivery
                && record.settings == *settings
                && record.debounce_since.is_none()
        }
        _ => false,
    }
}

/// Ends `current`, if pending, in `status` (`missed` or `expired`) with
/// `reason` as its last error.
fn end_pending(
    current: Option<&EventRecord>,
    status: EventStatus,
    reason: String,
    now: Timestamp,
) -> Transition {
    match current {
        Some(existing) if existing.status.is_pending() => {
            let mut next = existing.clone();
            next.last_error = Some(reason);
            let effects = finish(&mut next, status, now);
            Transition {
                next: Some(next),
                outcome: CommandOutcome::Expired,
                effects,
                attempt: None,
            }
        }
        _ => Transition::unchanged(CommandOutcome::NotPending),
    }
}

/// Moves `record` to a terminal `status`, returning the timer effects.
fn finish(record: &mut EventRecord, status: EventStatus, now: Timestamp) -> Vec<Effect> {
    let effects = record
        .next_fire_at
        .take()
        .map(|at| vec![Effect::Disarm { at }])
        .unwrap_or_default();
    record.status = status;
    record.updated_at = now;
    record.finished_at = Some(now);
    effects
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{EventId, TenantName};
    use crate::policy::RetryAfter;
    use crate::retry::Backoff;

    fn key() -> EventKey {
        EventKey::new(TenantName::new("t").unwrap(), EventId::new("e").unwrap())
    }

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn apply(current: Option<&EventRecord>, command: EventCommand, now: i64) -> Transition {
        let policy = RetryPolicy::default();
        transition(
            &key(),
            current,
            command,
            TransitionContext {
                now: ts(now),
                partition: PartitionId(3),
                retry: &policy,
            },
        )
    }

    fn upsert(at: i64, version: &str) -> EventCommand {
        EventCommand::Upsert {
            event_time: ts(at),
            payload: Some("p".into()),
            delivery: DeliveryOption::FullEvent,
            new_version: EventVersion::from_string(version.into()),
            settings: Default::default(),
        }
    }

    fn report(verdict: Verdict, at: i64) -> AttemptReport {
        AttemptReport {
            started_at: ts(at),
            duration_ms: 3,
            verdict,
            http_status: Some(500),
            error: Some("boom".into()),
            steer: None,
        }
    }

    /// Attempt `number` of `version`, reported as `verdict` at `at`.
    fn attempt(version: &EventVersion, number: u32, verdict: Verdict, at: i64) -> EventCommand {
        EventCommand::RecordAttempt {
            version: version.clone(),
            number,
            report: report(verdict, at),
            tenant: DeliveryDefaults::default(),
        }
    }

    #[test]
    fn create_arms_at_the_instant() {
        let t = apply(None, upsert(5_000, "v1"), 1_000);
        assert_eq!(t.outcome, CommandOutcome::Created);
        assert_eq!(t.effects, vec![Effect::Arm { at: ts(5_000) }]);
        let rec = t.next.unwrap();
        assert_eq!(rec.status, EventStatus::Scheduled);
        assert_eq!(rec.next_fire_at, Some(ts(5_000)));
        assert_eq!(rec.partition, PartitionId(3));
    }

    #[test]
    fn same_instant_update_of_a_pending_event_rearms_it_in_place() {
        let created = apply(None, upsert(5_000, "v1"), 1_000).next.unwrap();
        let updated = apply(Some(&created), upsert(5_000, "v2"), 2_000);
        assert_eq!(updated.outcome, CommandOutcome::Updated { moved: false });
        assert_eq!(updated.effects, vec![Effect::Arm { at: ts(5_000) }]);
        assert_eq!(updated.next.unwrap().version.as_str(), "v1");
    }

    #[test]
    fn same_instant_keeps_version_and_does_not_refire_delivered() {
        let created = apply(None, upsert(5_000, "v1"), 1_000).next.unwrap();
        let delivered = apply(
            Some(&created),
            attempt(&created.version, 1, Verdict::Delivered, 5_000),
            5_001,
        )
        .next
        .unwrap();
        let again = apply(Some(&delivered), upsert(5_000, "v2"), 6_000);
        assert_eq!(again.outcome, CommandOutcome::Updated { moved: false });
        assert!(again.effects.is_empty());
        let rec = again.next.unwrap();
        assert_eq!(rec.status, EventStatus::Delivered);
        assert_eq!(rec.version.as_str(), "v1");
    }

    #[test]
    fn redrive_makes_a_failed_event_due_now_as_a_new_version() {
        let created = apply(None, upsert(5_000, "v1"), 1_000).next.unwrap();
        let failed = apply(
            Some(&created),
            attempt(&created.version, 1, Verdict::Permanent, 5_000),
            5_001,
        )
        .next
        .unwrap();
        assert_eq!(failed.status, EventStatus::Failed);
        let redrive = || EventCommand::Redrive {
            new_version: EventVersion::from_string("v2".into()),
        };
        let t = apply(Some(&failed), redrive(), 9_000);
        assert_eq!(t.outcome, CommandOutcome::Redriven);
        assert_eq!(t.effects, vec![Effect::Arm { at: ts(9_000) }]);
        let again = t.next.unwrap();
        assert_eq!(again.status, EventStatus::Scheduled);
        assert_eq!(again.version.as_str(), "v2");
        assert_eq!(again.next_fire_at, Some(ts(9_000)));
        assert_eq!(again.event_time, ts(5_000), "the instant asked for is kept");
        assert_eq!((again.attempts, again.finished_at), (0, None));
        // Only dead events: a pending, delivered or unknown one is left alone.
        let pending = apply(Some(&again), redrive(), 9_001);
        assert_eq!(
            pending.outcome,
            CommandOutcome::NotRedrivable(EventStatus::Scheduled)
        );
        assert!(pending.next.is_none() && pending.effects.is_empty());
        assert_eq!(
            apply(None, redrive(), 9_002).outcome,
            CommandOutcome::NotFound
        );
    }

    #[test]
    fn move_gets_new_version_and_rearms() {
        let created = apply(None, upsert(5_000, "v1"), 1_000).next.unwrap();
        let moved = apply(Some(&created), upsert(9_000, "v2"), 2_000);
        assert_eq!(moved.outcome, CommandOutcome::Updated { moved: true });
        assert_eq!(
            moved.effects,
            vec![
                Effect::Disarm { at: ts(5_000) },
                Effect::Arm { at: ts(9_000) }
            ]
        );
        assert_eq!(moved.next.unwrap().version.as_str(), "v2");
    }

    #[test]
    fn cancel_then_upsert_is_a_new_event() {
        let created = apply(None, upsert(5_000, "v1"), 1_000).next.unwrap();
        let cancelled = apply(Some(&created), EventCommand::Cancel, 2_000);
        assert_eq!(cancelled.outcome, CommandOutcome::Cancelled);
        assert_eq!(cancelled.effects, vec![Effect::Disarm { at: ts(5_000) }]);
        let cancelled = cancelled.next.unwrap();
        assert_eq!(cancelled.status, EventStatus::Cancelled);
        assert_eq!(
            apply(Some(&cancelled), EventCommand::Cancel, 2_100).outcome,
            CommandOutcome::NotFound
        );
        let revived = apply(Some(&cancelled), upsert(5_000, "v3"), 3_000);
        assert_eq!(revived.outcome, CommandOutcome::Created);
    }

    #[test]
    fn retries_then_fails_at_backlog_limit() {
        let mut rec = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let t = apply(Some(&rec), attempt(&rec.version, 1, Verdict::Retry, 0), 10);
        assert_eq!(
            t.outcome,
            CommandOutcome::AttemptRecorded(EventStatus::Retrying)
        );
        assert_eq!(t.effects[1], Effect::Arm { at: ts(1_010) });
        assert_eq!(t.attempt.as_ref().unwrap().number, 1);
        rec = t.next.unwrap();
        let day = 24 * 3600 * 1000;
        let t = apply(
            Some(&rec),
            attempt(&rec.version, 2, Verdict::Retry, day),
            day,
        );
        assert_eq!(
            t.outcome,
            CommandOutcome::AttemptRecorded(EventStatus::Failed)
        );
        let rec = t.next.unwrap();
        assert!(rec.last_error.unwrap().contains("boom"));
        assert_eq!(rec.next_fire_at, None);
        assert_eq!(rec.finished_at, Some(ts(day)));
    }

    #[test]
    fn the_tenants_attempt_cap_and_back_off_apply_to_a_pushed_event() {
        let tenant = DeliveryDefaults {
            max_attempts: Some(2),
            backoff: Some(Backoff::new(100, 2.0, 1_000).unwrap()),
            ..DeliveryDefaults::default()
        };
        let record_attempt = |rec: &EventRecord, number, at| EventCommand::RecordAttempt {
            version: rec.version.clone(),
            number,
            report: report(Verdict::Retry, at),
            tenant: tenant.clone(),
        };
        let rec = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let first = apply(Some(&rec), record_attempt(&rec, 1, 0), 10)
            .next
            .unwrap();
        assert_eq!(first.status, EventStatus::Retrying);
        assert_eq!(first.next_fire_at, Some(ts(110)), "the tenant's 100 ms");
        let second = apply(Some(&first), record_attempt(&first, 2, 110), 120);
        assert_eq!(
            second.outcome,
            CommandOutcome::AttemptRecorded(EventStatus::Failed)
        );
        assert_eq!(
            second.next.unwrap().last_error.as_deref(),
            Some("gave up after 2 attempts (max_attempts reached): boom")
        );

        // The event's own cap wins over its tenant's.
        let mut own = rec.clone();
        own.settings.max_attempts = Some(3);
        let again = apply(Some(&own), record_attempt(&own, 2, 0), 10);
        assert_eq!(
            again.outcome,
            CommandOutcome::AttemptRecorded(EventStatus::Retrying)
        );
    }

    #[test]
    fn a_receivers_retry_after_counts_from_its_answer() {
        let rec = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let steered = |steer| EventCommand::RecordAttempt {
            version: rec.version.clone(),
            number: 1,
            report: AttemptReport {
                steer: Some(steer),
                duration_ms: 40,
                ..report(Verdict::Retry, 1_000)
            },
            tenant: DeliveryDefaults::default(),
        };
        // Answered at 1 040 (to the millisecond, so up to 1 042) with
        // `Retry-After: 2`, recorded at 1 050.
        let seconds = steered(Steer::RetryAfter(RetryAfter::Seconds(2)));
        let next = apply(Some(&rec), seconds, 1_050).next.unwrap();
        assert_eq!(next.next_fire_at, Some(ts(3_042)));
        // An HTTP date 7 s after the answer.
        let date = steered(Steer::RetryAfter(RetryAfter::At(ts(8_040))));
        let next = apply(Some(&rec), date, 1_050).next.unwrap();
        assert_eq!(next.next_fire_at, Some(ts(8_040)));
        // Past the event's expiry: due at the expiry, to end there.
        let mut expiring = rec.clone();
        expiring.settings.expire_at = Some(ts(5_000));
        let date = steered(Steer::RetryAfter(RetryAfter::At(ts(8_040))));
        let next = apply(Some(&expiring), date, 1_050).next.unwrap();
        assert_eq!(next.next_fire_at, Some(ts(5_000)));
        // Gone: the permanent verdict ends it.
        let gone = EventCommand::RecordAttempt {
            version: rec.version.clone(),
            number: 1,
            report: AttemptReport {
                steer: Some(Steer::Gone),
                http_status: Some(410),
                error: Some("HTTP 410 Gone".into()),
                ..report(Verdict::Permanent, 1_000)
            },
            tenant: DeliveryDefaults::default(),
        };
        let failed = apply(Some(&rec), gone, 1_050).next.unwrap();
        assert_eq!(failed.status, EventStatus::Failed);
        assert_eq!(failed.last_error.as_deref(), Some("HTTP 410 Gone"));
    }

    #[test]
    fn end_expired_ends_the_pending_version_expired() {
        let v1 = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let end = |version: &str| EventCommand::EndExpired {
            version: EventVersion::from_string(version.into()),
            reason: "expired: not delivered by its expiry".into(),
        };
        assert_eq!(
            apply(Some(&v1), end("v0"), 5).outcome,
            CommandOutcome::NotPending
        );
        let t = apply(Some(&v1), end("v1"), 5);
        assert_eq!(t.outcome, CommandOutcome::Expired);
        assert_eq!(t.effects, vec![Effect::Disarm { at: ts(0) }]);
        let expired = t.next.unwrap();
        assert_eq!(expired.status, EventStatus::Expired);
        assert_eq!(expired.finished_at, Some(ts(5)));
        assert!(!expired.status.is_pending());
        assert_eq!(EventStatus::parse("expired"), Some(EventStatus::Expired));
        assert_eq!(
            apply(Some(&expired), end("v1"), 6).outcome,
            CommandOutcome::NotPending
        );
    }

    #[test]
    fn a_repeated_attempt_changes_nothing() {
        let created = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let first = |number: u32| attempt(&created.version, number, Verdict::Retry, 0);
        let recorded = apply(Some(&created), first(1), 10);
        let retrying = recorded.next.unwrap();
        assert_eq!(retrying.attempts, 1);
        assert_eq!(retrying.next_fire_at, Some(ts(1_010)));

        // The same (version, number) again, later: the write that committed
        // is retried after an error.
        let again = apply(Some(&retrying), first(1), 500);
        assert_eq!(
            again.outcome,
            CommandOutcome::AttemptAlreadyRecorded(EventStatus::Retrying)
        );
        assert_eq!(again.next, None, "no state change");
        assert_eq!(again.attempt, None, "no history entry");
        assert_eq!(
            again.effects,
            vec![Effect::Arm { at: ts(1_010) }],
            "the retry it armed is armed again, at the same instant"
        );

        // Once the event finished, a repeat of its last attempt neither
        // counts nor re-arms.
        let delivered = apply(
            Some(&retrying),
            attempt(&created.version, 2, Verdict::Delivered, 1_010),
            1_011,
        )
        .next
        .unwrap();
        for number in [1, 2] {
            let repeat = apply(Some(&delivered), first(number), 2_000);
            assert_eq!(
                repeat.outcome,
                CommandOutcome::AttemptAlreadyRecorded(EventStatus::Delivered)
            );
            assert_eq!((repeat.next, repeat.attempt), (None, None));
            assert!(repeat.effects.is_empty());
        }
    }

    #[test]
    fn a_stale_attempt_keeps_its_own_number() {
        let v1 = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let v2 = apply(Some(&v1), upsert(5_000, "v2"), 1).next.unwrap();
        let stale = apply(Some(&v2), attempt(&v1.version, 3, Verdict::Delivered, 0), 2);
        assert_eq!(stale.outcome, CommandOutcome::StaleAttempt);
        let attempt = stale.attempt.unwrap();
        assert_eq!((attempt.version.as_str(), attempt.number), ("v1", 3));
    }

    #[test]
    fn a_version_expiry_spares_a_newer_version() {
        let v1 = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let v2 = apply(Some(&v1), upsert(5_000, "v2"), 1).next.unwrap();
        let expire = |version: &str| EventCommand::ExpireVersion {
            version: EventVersion::from_string(version.into()),
            reason: "too late".into(),
        };
        let stale = apply(Some(&v2), expire("v1"), 2);
        assert_eq!(stale.outcome, CommandOutcome::NotPending);
        assert!(stale.next.is_none());
        let current = apply(Some(&v2), expire("v2"), 2);
        assert_eq!(current.outcome, CommandOutcome::Expired);
        assert_eq!(current.next.unwrap().status, EventStatus::Missed);
    }

    #[test]
    fn permanent_fails_at_once_and_stale_attempts_change_nothing() {
        let rec = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let stale = apply(
            Some(&rec),
            attempt(
                &EventVersion::from_string("old".into()),
                1,
                Verdict::Delivered,
                0,
            ),
            1,
        );
        assert_eq!(stale.outcome, CommandOutcome::StaleAttempt);
        assert!(stale.next.is_none());
        assert!(stale.attempt.is_some());
        assert_eq!(
            stale.effects,
            vec![Effect::Arm { at: ts(0) }],
            "the current pending version is re-armed"
        );
        let failed = apply(
            Some(&rec),
            attempt(&rec.version, 1, Verdict::Permanent, 0),
            1,
        );
        assert_eq!(
            failed.outcome,
            CommandOutcome::AttemptRecorded(EventStatus::Failed)
        );
    }

    #[test]
    fn upsert_if_current_applies_only_to_the_expected_pending_version() {
        let rec = apply(None, upsert(5_000, "v1"), 0).next.unwrap();
        let cas = |expected: &str| EventCommand::UpsertIfCurrent {
            expected: EventVersion::from_string(expected.into()),
            event_time: ts(9_000),
            payload: Some("new".into()),
            delivery: DeliveryOption::FullEvent,
            new_version: EventVersion::from_string("v2".into()),
        };
        let stale = apply(Some(&rec), cas("v0"), 1);
        assert_eq!(stale.outcome, CommandOutcome::VersionChanged);
        assert!(stale.next.is_none());
        let moved = apply(Some(&rec), cas("v1"), 1);
        assert_eq!(moved.outcome, CommandOutcome::Updated { moved: true });
        let moved = moved.next.unwrap();
        assert_eq!(moved.version.as_str(), "v2");
        assert_eq!(moved.payload.as_deref(), Some("new"));
        let cancelled = apply(Some(&rec), EventCommand::Cancel, 2).next.unwrap();
        assert_eq!(
            apply(Some(&cancelled), cas("v1"), 3).outcome,
            CommandOutcome::VersionChanged
        );
        assert_eq!(
            apply(None, cas("v1"), 3).outcome,
            CommandOutcome::VersionChanged
        );
    }

    #[test]
    fn expire_only_pending() {
        let rec = apply(None, upsert(0, "v1"), 0).next.unwrap();
        let expire = || EventCommand::Expire {
            reason: "missed".into(),
        };
        let t = apply(Some(&rec), expire(), 5);
        assert_eq!(t.outcome, CommandOutcome::Expired);
        let missed = t.next.unwrap();
        assert_eq!(missed.status, EventStatus::Missed);
        let again = apply(Some(&missed), expire(), 6);
        assert_eq!(again.outcome, CommandOutcome::NotPending);
    }

    #[test]
    fn a_retried_conditional_write_that_was_applied_succeeds_unchanged() {
        let v1 = apply(None, upsert(5_000, "v1"), 0).next.unwrap();
        let named_v1 = |command| EventCommand::IfMatch {
            precondition: Precondition::Versions(vec![v1.version.clone()]),
            command: Box::new(command),
        };
        let moved = apply(Some(&v1), named_v1(upsert(9_000, "v2")), 1);
        let v2 = moved.next.unwrap();
        // The retry draws another new version; the stored one stays.
        let retried = apply(Some(&v2), named_v1(upsert(9_000, "v2-retry")), 2);
        assert_eq!(retried.outcome, CommandOutcome::AlreadyApplied);
        assert_eq!((retried.next, retried.effects), (None, vec![]));
        // Anything else under the stale tag fails its precondition.
        let mut other_payload = upsert(9_000, "v3");
        if let EventCommand::Upsert { payload, .. } = &mut other_payload {
            *payload = Some("other".into());
        }
        for command in [upsert(10_000, "v3"), other_payload, EventCommand::Cancel] {
            assert!(matches!(
                apply(Some(&v2), named_v1(command), 3).outcome,
                CommandOutcome::PreconditionFailed { .. }
            ));
        }
        // Cancelled since: not what the write made.
        let cancelled = apply(Some(&v2), EventCommand::Cancel, 4).next.unwrap();
        assert!(matches!(
            apply(Some(&cancelled), named_v1(upsert(9_000, "v4")), 5).outcome,
            CommandOutcome::PreconditionFailed { .. }
        ));
    }

    #[test]
    fn if_match_applies_only_while_its_precondition_holds() {
        let v1 = apply(None, upsert(5_000, "v1"), 0).next.unwrap();
        let if_match = |precondition, command| EventCommand::IfMatch {
            precondition,
            command: Box::new(command),
        };
        let version = |v: &str| Precondition::Versions(vec![EventVersion::from_string(v.into())]);
        let stale = apply(Some(&v1), if_match(version("v0"), upsert(9_000, "v2")), 1);
        assert_eq!(
            stale.outcome,
            CommandOutcome::PreconditionFailed {
                current: Some(v1.version.clone())
            }
        );
        assert!(stale.next.is_none() && stale.effects.is_empty());
        let unknown = apply(None, if_match(Precondition::Exists, upsert(9_000, "v2")), 1);
        assert_eq!(
            unknown.outcome,
            CommandOutcome::PreconditionFailed { current: None }
        );
        assert!(unknown.next.is_none());
        let cancel = apply(Some(&v1), if_match(version("v0"), EventCommand::Cancel), 1);
        assert!(matches!(
            cancel.outcome,
            CommandOutcome::PreconditionFailed { .. }
        ));

        let moved = apply(Some(&v1), if_match(version("v1"), upsert(9_000, "v2")), 1);
        assert_eq!(moved.outcome, CommandOutcome::Updated { moved: true });
        let v2 = moved.next.unwrap();
        let any = apply(
            Some(&v2),
            if_match(Precondition::Exists, EventCommand::Cancel),
            2,
        );
        assert_eq!(any.outcome, CommandOutcome::Cancelled);
        assert_eq!(
            if_match(Precondition::Exists, EventCommand::Cancel).unconditional(),
            &EventCommand::Cancel
        );
    }

    #[test]
    fn if_absent_creates_but_never_overwrites() {
        let if_absent = |command| EventCommand::IfMatch {
            precondition: Precondition::Absent,
            command: Box::new(command),
        };
        let created = apply(None, if_absent(upsert(5_000, "v1")), 0);
        assert_eq!(created.outcome, CommandOutcome::Created);
        let v1 = created.next.unwrap();
        assert_eq!(v1.version.as_str(), "v1");

        // Stored, in any status: nothing changes.
        let taken = apply(Some(&v1), if_absent(upsert(9_000, "v2")), 1);
        assert_eq!(
            taken.outcome,
            CommandOutcome::PreconditionFailed {
                current: Some(v1.version.clone())
            }
        );
        assert!(taken.next.is_none() && taken.effects.is_empty());
        let cancelled = apply(Some(&v1), EventCommand::Cancel, 1).next.unwrap();
        let still_stored = apply(Some(&cancelled), if_absent(upsert(9_000, "v2")), 2);
        assert!(matches!(
            still_stored.outcome,
            CommandOutcome::PreconditionFailed { current: Some(_) }
        ));
    }

    #[test]
    fn previous_delivery_tells_how_far_the_replaced_version_went() {
        let v1 = apply(None, upsert(5_000, "v1"), 0).next.unwrap();
        let of = |previous: &EventRecord, command| {
            let t = apply(Some(previous), command, 6_000);
            let replaced = Replaced::of(Some(previous), &t.outcome);
            if let Some(replaced) = &replaced {
                assert_eq!(replaced.version, previous.version);
            }
            replaced.map(|r| r.delivery)
        };
        assert_eq!(
            of(&v1, EventCommand::Cancel),
            Some(PreviousDelivery::NotStarted)
        );
        assert_eq!(
            of(&v1, upsert(9_000, "v2")),
            Some(PreviousDelivery::NotStarted)
        );
        assert_eq!(of(&v1, upsert(5_000, "v2")), None, "not moved");
        let retrying = apply(
            Some(&v1),
            attempt(&v1.version, 1, Verdict::Retry, 5_000),
            5_001,
        )
        .next
        .unwrap();
        assert_eq!(
            of(&retrying, EventCommand::Cancel),
            Some(PreviousDelivery::Started)
        );
        assert_eq!(
            of(&retrying, upsert(9_000, "v2")),
            Some(PreviousDelivery::Started)
        );
        let delivered = apply(
            Some(&v1),
            attempt(&v1.version, 1, Verdict::Delivered, 5_000),
            5_001,
        )
        .next
        .unwrap();
        assert_eq!(
            of(&delivered, upsert(9_000, "v2")),
            Some(PreviousDelivery::Finished)
        );
        assert_eq!(
            Replaced::of(None, &CommandOutcome::Created),
            None,
            "nothing was replaced"
        );
    }

    fn debounced(version: &str) -> EventCommand {
        EventCommand::DebouncedUpsert {
            debounce: Debounce {
                delay_ms: 5_000,
                max_wait_ms: 30_000,
            },
            payload: Some(version.into()),
            delivery: DeliveryOption::FullEvent,
            settings: Default::default(),
            new_version: EventVersion::from_string(version.into()),
        }
    }

    #[test]
    fn a_debounced_series_is_delivered_at_its_start_plus_the_maximum_wait() {
        // 100 writes 1 s apart: each moves the instant to 5 s after it,
        // but never past 30 s after the first write of the pending series.
        let mut rec = apply(None, debounced("v0"), 0).next.unwrap();
        assert_eq!(rec.event_time, ts(5_000));
        assert_eq!(rec.debounce_since, Some(ts(0)));
        let mut deliveries = Vec::new();
        for i in 1..100_i64 {
            let now = i * 1_000;
            if rec.status.is_pending() && rec.event_time <= ts(now) {
                // Due before this write: delivered, the series ends.
                deliveries.push(rec.event_time);
                let at = rec.event_time.as_millis();
                rec = apply(
                    Some(&rec),
                    attempt(&rec.version, 1, Verdict::Delivered, at),
                    at,
                )
                .next
                .unwrap();
            }
            let since = rec.debounce_since.filter(|_| rec.status.is_pending());
            rec = apply(Some(&rec), debounced(&format!("v{i}")), now)
                .next
                .unwrap();
            let since = since.unwrap_or(ts(now));
            assert_eq!(rec.debounce_since, Some(since), "write {i}");
            let expected = (now + 5_000).min(since.as_millis() + 30_000);
            assert_eq!(rec.event_time, ts(expected), "write {i}");
        }
        // Each series once, 30 s after its first write; the last one, cut
        // short, 5 s after its last write.
        assert_eq!(deliveries, vec![ts(30_000), ts(60_000), ts(90_000)]);
        assert_eq!(rec.debounce_since, Some(ts(90_000)));
        assert_eq!(rec.event_time, ts(104_000));
    }

    #[test]
    fn a_debounce_keeps_its_instant_at_the_cap_and_a_due_one_starts_a_series() {
        let mut rec = apply(None, debounced("v1"), 0).next.unwrap();
        for now in (4_000..=28_000).step_by(4_000) {
            rec = apply(Some(&rec), debounced("v"), now).next.unwrap();
        }
        let capped = apply(Some(&rec), debounced("v2"), 29_000).next.unwrap();
        assert_eq!(capped.event_time, ts(30_000));
        let again = apply(Some(&capped), debounced("v3"), 29_500);
        assert_eq!(
            again.outcome,
            CommandOutcome::Updated { moved: false },
            "same instant: same version"
        );
        assert_eq!(again.next.unwrap().version, capped.version);
        // Due, no attempt recorded: the write goes out with the series,
        // at once and as a new version (never the same instant).
        let debounce = Debounce {
            delay_ms: 5_000,
            max_wait_ms: 30_000,
        };
        assert_eq!(
            debounce.instant(ts(30_000), Some(&capped)),
            (ts(30_001), ts(0))
        );
        assert_eq!(
            debounce.instant(ts(30_400), Some(&capped)),
            (ts(30_400), ts(0))
        );
        let joined = apply(Some(&capped), debounced("v3b"), 30_400);
        assert_eq!(joined.outcome, CommandOutcome::Updated { moved: true });
        let joined = joined.next.unwrap();
        assert_eq!(
            (joined.event_time, joined.version.as_str()),
            (ts(30_400), "v3b")
        );
        // Retrying (an attempt recorded): a write starts a new series
        // rather than moving the attempted version within this one.
        let retrying = apply(
            Some(&joined),
            attempt(&joined.version, 1, Verdict::Retry, 30_400),
            30_410,
        )
        .next
        .unwrap();
        assert_eq!(
            debounce.instant(ts(31_000), Some(&retrying)),
            (ts(36_000), ts(31_000))
        );
        assert_eq!(
            debounce.instant(ts(29_999), Some(&capped)),
            (ts(30_000), ts(0))
        );
        // A plain write ends the series; the next debounced one starts anew.
        let plain = apply(Some(&capped), upsert(31_000, "p"), 20_000)
            .next
            .unwrap();
        assert_eq!(plain.debounce_since, None);
        let fresh = apply(Some(&plain), debounced("v4"), 21_000).next.unwrap();
        assert_eq!(
            (fresh.event_time, fresh.debounce_since),
            (ts(26_000), Some(ts(21_000)))
        );
        // A cancelled event starts a new series too.
        let cancelled = apply(Some(&fresh), EventCommand::Cancel, 22_000)
            .next
            .unwrap();
        let revived = apply(Some(&cancelled), debounced("v5"), 23_000);
        assert_eq!(revived.outcome, CommandOutcome::Created);
        assert_eq!(revived.next.unwrap().debounce_since, Some(ts(23_000)));
    }
}
