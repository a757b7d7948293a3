//! From a fired entry to a recorded attempt.
//!
//! Fired entries queue for a delivery slot in
//! [`belfry_core::fire::DeliverySlots`] (one FIFO per tenant, tenants in
//! turn, a global and a per-tenant limit, and a reserve that hung tenants
//! cannot drain), and, for tenants given them in `[limits.tenants]`, their
//! own concurrency and delivery rate. A tenant over its rate is parked
//! until its next token: one timer task (not a loop) starts it then. Only
//! deliveries in flight are tasks. The queues are
//! bounded: every queued entry is an outstanding entry of its partition's
//! core, and a core bounds those per tenant and in total.
//!
//! A delivery checks the event's record (read ahead by its partition, or
//! read now): the window is a hint, the store is the truth. It then claims
//! the record's version with its partition's core (a second copy of a
//! version being delivered is dropped), delivers, and hands the outcome to
//! the recorder, which tells the core the entry is finished once the
//! outcome is stored.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use belfry_core::event::{AttemptReport, EventCommand};
use belfry_core::fire::decide::{self, Route};
use belfry_core::fire::{Action, DeliverySlots, Finish, Fired, Input, SlotPolicy};
use belfry_core::{TenantName, Timestamp, Verdict};
use belfry_sinks::Delivery;
use belfry_store::{Fence, KeyedCommand};
use tokio::sync::Notify;

use crate::partition::PartitionRuntime;
use crate::recorder::Outcome;
use crate::{EngineOptions, Shared};

/// Pause before firing again an entry whose record or tenant could not be
/// read, or whose firing window closed right before the send.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// One fired entry waiting for, or holding, a delivery slot.
#[derive(Debug)]
pub(crate) struct Job {
    partition: Arc<PartitionRuntime>,
    fired: Fired,
}

/// The delivery slots, shared by every partition.
#[derive(Debug)]
pub(crate) struct Slots {
    slots: Mutex<DeliverySlots<Job>>,
    /// Signalled whenever the last in-flight delivery finishes.
    idle: Notify,
    /// When the rate timer will next start what waits for a token.
    rate_timer: Mutex<Option<Timestamp>>,
}

impl Slots {
    pub(crate) fn new(options: &EngineOptions) -> Self {
        let mut slots = DeliverySlots::new(SlotPolicy::new(
            options.max_in_flight,
            options.max_in_flight_per_tenant,
        ));
        for (name, limits) in &options.quotas.tenants {
            // Names are checked with the config; a bad one limits nobody.
            if let Ok(tenant) = TenantName::new(name.clone()) {
                slots.set_tenant_limits(
                    tenant,
                    limits.max_concurrent_deliveries,
                    limits.max_deliveries_per_second.map(f64::from),
                );
            }
        }
        Slots {
            slots: Mutex::new(slots),
            idle: Notify::new(),
            rate_timer: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DeliverySlots<Job>> {
        // Poison means a panic while held; `DeliverySlots` keeps its
        // counters consistent before anything can panic.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a token of `tenant`'s delivery rate for a dry run (a
    /// delivery now, outside the slots); `false` when it has none.
    pub(crate) fn take_dry_run_token(&self, tenant: &TenantName, now: Timestamp) -> bool {
        self.lock().take_token_now(tenant, now)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight()
    }

    /// Resolves once no delivery is in flight.
    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Drops every queued job (shutdown): they stay pending in the store.
    pub(crate) fn drop_queued(&self, shared: &Shared) {
        let dropped = self.lock().clear_queued();
        for job in dropped {
            finish(shared, &job.partition, job.fired.entry, Finish::Done);
        }
    }
}

/// Tells a partition's core that a fired entry is finished.
pub(crate) fn finish(
    shared: &Shared,
    partition: &PartitionRuntime,
    entry: belfry_core::DueCursor,
    finish: Finish,
) {
    partition.input(Input::Finished { entry, finish }, shared.clock.now());
    shared.finished.notify_waiters();
}

/// Hands fired entries of `partition` to the dispatcher.
pub(crate) fn submit(shared: &Arc<Shared>, partition: &Arc<PartitionRuntime>, fired: Vec<Fired>) {
    let mut jobs = Vec::with_capacity(fired.len());
    for fired in fired {
        // A schedule's control event plans occurrences instead of
        // delivering; it takes no delivery slot, so a slow tenant cannot
        // delay it.
        if decide::route_of_key(&fired.entry.key) == Some(Route::Schedule) {
            let tasks = shared.tasks.clone();
            let (shared, partition) = (shared.clone(), partition.clone());
            tasks.spawn(async move {
                let entry = fired.entry;
                crate::schedules::fire(
                    shared.clone(),
                    partition.id,
                    partition.term.clone(),
                    entry.clone(),
                )
                .await;
                finish(&shared, &partition, entry, Finish::Done);
            });
            continue;
        }
        jobs.push(Job {
            partition: partition.clone(),
            fired,
        });
    }
    if jobs.is_empty() {
        return;
    }
    let (starting, next_token) = {
        let mut slots = shared.slots.lock();
        slots.advance(shared.clock.now());
        for job in jobs {
            slots.submit(job.fired.entry.key.tenant.clone(), job);
        }
        (slots.start_ready(), slots.next_token_at())
    };
    start(shared, starting);
    arm_rate_timer(shared, next_token);
}

/// Makes sure slots are tried again at `at`, when a tenant held back by
/// its rate gets its next token. One sleeping task per instant asked for,
/// none while an earlier one is armed (it re-arms for the rest).
fn arm_rate_timer(shared: &Arc<Shared>, at: Option<Timestamp>) {
    let Some(at) = at else {
        return;
    };
    {
        let mut armed = shared
            .slots
            .rate_timer
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if armed.is_some_and(|armed| armed <= at) {
            return;
        }
        *armed = Some(at);
    }
    let tasks = shared.tasks.clone();
    let shared = shared.clone();
    tasks.spawn(async move {
        let wait = at
            .as_millis()
            .saturating_sub(shared.clock.now().as_millis());
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
        }
        {
            let mut armed = shared
                .slots
                .rate_timer
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *armed == Some(at) {
                *armed = None;
            }
        }
        if shared.tasks.stopping() {
            return;
        }
        let (starting, next_token) = {
            let mut slots = shared.slots.lock();
            slots.advance(shared.clock.now());
            (slots.start_ready(), slots.next_token_at())
        };
        start(&shared, starting);
        arm_rate_timer(&shared, next_token);
    });
}

fn start(shared: &Arc<Shared>, jobs: Vec<(TenantName, Job)>) {
    for (tenant, job) in jobs {
        let slot = HeldSlot {
            shared: shared.clone(),
            tenant,
            completed: false,
            answered: false,
        };
        shared.tasks.spawn(async move {
            let mut answered = false;
            deliver_one(&slot.shared, job, &mut answered).await;
            slot.complete(answered);
        });
    }
}

/// A held delivery slot; released on drop, so even a panicking delivery
/// cannot leak it.
struct HeldSlot {
    shared: Arc<Shared>,
    tenant: TenantName,
    /// Whether the delivery ran to its end. Only then are the next jobs
    /// started from here: a task dropped unfinished (the runtime shutting
    /// down cancels every task) must not spawn more, which would be
    /// cancelled and dropped in turn, recursively.
    completed: bool,
    /// Whether the tenant's endpoint answered: that widens its slow start.
    answered: bool,
}

impl HeldSlot {
    /// The delivery ran to its end: release the slot and start the next.
    fn complete(mut self, answered: bool) {
        self.completed = true;
        self.answered = answered;
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        let (next, next_token) = {
            let mut slots = self.shared.slots.lock();
            slots.advance(self.shared.clock.now());
            if self.answered {
                slots.answered(&self.tenant);
            }
            slots.finish(&self.tenant);
            if slots.in_flight() == 0 {
                self.shared.slots.idle.notify_waiters();
            }
            if self.shared.tasks.stopping() || !self.completed {
                (Vec::new(), None)
            } else {
                (slots.start_ready(), slots.next_token_at())
            }
        };
        start(&self.shared, next);
        arm_rate_timer(&self.shared, next_token);
    }
}

/// One delivery, holding a tenant slot and a global slot. The outcome is
/// handed to the recorder before the slot is released. Sets `answered`
/// when the tenant's endpoint answered the attempt, whatever it answered.
async fn deliver_one(shared: &Arc<Shared>, job: Job, answered: &mut bool) {
    let Job {
        partition,
        fired: Fired {
            entry,
            record: read_ahead,
        },
    } = job;
    let done = |finish_as: Finish| finish(shared, &partition, entry.clone(), finish_as);
    let retry_later = || Finish::RetryAt(shared.clock.now().plus(RETRY_PAUSE));
    if shared.tasks.stopping() {
        // Not started: it stays pending in the store for the next start.
        return done(Finish::Done);
    }
    if !partition.term.may_fire() {
        // Released or lapsed while queued: the next owner (or this one,
        // once renewed) fires it.
        return done(retry_later());
    }
    // The window is a hint; the record decides whether this is still due.
    let mut read_ahead = read_ahead;
    let record = loop {
        let read = match read_ahead.take() {
            Some(record) => Ok(Some(record)),
            None => shared.reads.get(&entry.key).await,
        };
        let record = match read {
            Ok(Some(record)) => record,
            Ok(None) => return done(Finish::Done),
            Err(error) => {
                tracing::warn!(key = ?entry.key, %error, "reading a due event failed; retrying it shortly");
                return done(retry_later());
            }
        };
        if !decide::still_due(&record, &entry) {
            return done(Finish::Done);
        }
        // A second copy of a version whose delivery is in progress is
        // dropped (the core finished it); an event changed since its record
        // was read is read again.
        let claim = partition.input(
            Input::Claim {
                entry: entry.clone(),
                version: record.version.clone(),
            },
            shared.clock.now(),
        );
        match claim[..] {
            [Action::Claimed { granted: true, .. }] => break record,
            [Action::Reread { .. }] => continue,
            _ => return,
        }
    };
    let fence = Some(Fence {
        partition: partition.id,
        epoch: partition.term.epoch,
    });
    let now = shared.clock.now();
    if let Some(reason) = decide::lookback_expiry(&record, &entry, now, shared.options.lookback) {
        let command = KeyedCommand {
            key: entry.key.clone(),
            command: EventCommand::ExpireVersion {
                version: record.version.clone(),
                reason,
            },
            fence,
        };
        return send_outcome(shared, &partition, entry, command).await;
    }
    // The attempt's identity with the version: the receiver sees it as
    // `X-Belfry-Attempt`, and recording it twice counts it once.
    let number = record.attempts + 1;
    let report = match shared.tenants.get(&entry.key.tenant).await {
        Ok(Some(tenant)) => {
            // Checked last, right before the send: a node paused past its
            // lease must not deliver for a partition someone else now owns.
            if !partition.term.may_fire() {
                tracing::debug!(partition = %partition.id, "firing window closed before delivery; holding the event");
                return done(retry_later());
            }
            // A pull tenant's event waits for a worker's claim: the pull
            // queue holds it, outstanding here until it finishes it. The
            // hand-off cannot hang, so it counts as answered: a pull
            // tenant's slow start never holds its hand-offs back.
            if decide::route(&entry.key, &tenant.sink) == Route::Pull
                && let belfry_core::SinkConfig::Pull(target) = &tenant.sink
            {
                *answered = true;
                crate::pull::ready(
                    shared,
                    belfry_core::pull::ReadyEntry {
                        entry,
                        partition: partition.id,
                        epoch: partition.term.epoch,
                        queue: record.pull.queue(),
                        policy: crate::pull::policy(shared, target, &record.pull),
                        record,
                    },
                );
                return;
            }
            belfry_metrics::attempt_started(
                record.attempts == 0,
                Duration::from_millis(
                    u64::try_from(now.as_millis() - entry.due.as_millis()).unwrap_or(0),
                ),
            );
            let started = Instant::now();
            let result = shared
                .sinks
                .deliver(Delivery {
                    tenant: &tenant,
                    event: &record,
                    attempt: number,
                    triggered_at: now,
                    epoch: Some(partition.term.epoch),
                })
                .await;
            let took = started.elapsed();
            *answered = result.http_status.is_some() || result.verdict == Verdict::Delivered;
            belfry_metrics::attempt_ended(
                channel_of(&tenant.sink),
                outcome_of(result.verdict),
                took,
            );
            AttemptReport {
                started_at: now,
                duration_ms: took.as_millis() as u64,
                verdict: result.verdict,
                http_status: result.http_status,
                error: result.error,
            }
        }
        Ok(None) => AttemptReport {
            started_at: now,
            duration_ms: 0,
            verdict: Verdict::Permanent,
            http_status: None,
            error: Some(format!("tenant not registered: {}", entry.key.tenant)),
        },
        Err(error) => {
            tracing::warn!(tenant = %entry.key.tenant, %error, "reading the tenant failed; retrying shortly");
            return done(retry_later());
        }
    };
    let command = KeyedCommand {
        key: entry.key.clone(),
        command: EventCommand::RecordAttempt {
            version: record.version.clone(),
            number,
            report,
        },
        fence,
    };
    send_outcome(shared, &partition, entry, command).await;
}

fn channel_of(sink: &belfry_core::SinkConfig) -> belfry_metrics::Channel {
    match sink {
        belfry_core::SinkConfig::Http(_) => belfry_metrics::Channel::Http,
        belfry_core::SinkConfig::Kafka(_) => belfry_metrics::Channel::Kafka,
        belfry_core::SinkConfig::Builtin(_) => belfry_metrics::Channel::Log,
        belfry_core::SinkConfig::Pull(_) => belfry_metrics::Channel::Pull,
    }
}

fn outcome_of(verdict: Verdict) -> belfry_metrics::Outcome {
    match verdict {
        Verdict::Delivered => belfry_metrics::Outcome::Delivered,
        Verdict::Retry => belfry_metrics::Outcome::Retry,
        Verdict::Permanent => belfry_metrics::Outcome::Permanent,
    }
}

/// Hands an outcome to the recorder, which finishes the entry once it is
/// stored. The channel is bounded: a slow store holds deliveries here,
/// keeping their slots, so nothing piles up in memory. The attempt is
/// over, so the entry stops counting against its tenant's outstanding
/// bound now, not once its outcome is stored.
async fn send_outcome(
    shared: &Arc<Shared>,
    partition: &Arc<PartitionRuntime>,
    entry: belfry_core::DueCursor,
    command: KeyedCommand,
) {
    partition.attempted(entry.clone(), shared.clock.now());
    let outcome = Outcome {
        command,
        partition: partition.clone(),
        entry,
    };
    if let Err(unsent) = shared.outcomes.send(outcome).await {
        // The recorder is gone (the engine stopped): the event stays
        // pending in the store and fires again after the next start.
        let outcome = unsent.0;
        finish(shared, &outcome.partition, outcome.entry, Finish::Done);
    }
}
