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

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use belfry_core::breaker::{Admission, Pass};
use belfry_core::event::{AttemptReport, EventCommand};
use belfry_core::fire::decide::{self, Route};
use belfry_core::fire::{DeliverySlots, Finish, SlotPolicy};
use belfry_core::policy::Steer;
use belfry_core::{TenantName, Timestamp, Verdict};
use belfry_sinks::Delivery;
use belfry_store::{Fence, KeyedCommand};
use tokio::sync::Notify;

use crate::partition::{Claim, Deliver, Ticket};
use crate::recorder::Outcome;
use crate::{EngineOptions, Shared};

/// Pause before firing again an entry whose record or tenant could not be
/// read, or whose firing window closed right before the send.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The delivery slots, shared by every partition.
#[derive(Debug)]
pub(crate) struct Slots {
    slots: Mutex<DeliverySlots<Ticket>>,
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
        for (name, limits) in &options.limits.tenants {
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

    fn lock(&self) -> MutexGuard<'_, DeliverySlots<Ticket>> {
        // Poison means a panic while held; `DeliverySlots` keeps its
        // counters consistent before anything can panic.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rate_timer(&self) -> MutexGuard<'_, Option<Timestamp>> {
        // Poison means a panic while held; the instant stays valid.
        self.rate_timer.lock().unwrap_or_else(|e| e.into_inner())
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
        crate::tasks::wait_until(&self.idle, || self.in_flight() == 0).await;
    }

    /// Drops every queued ticket (shutdown): they stay pending in the store.
    pub(crate) fn drop_queued(&self) {
        let dropped = self.lock().clear_queued();
        for ticket in dropped {
            ticket.finish(Finish::Done);
        }
    }
}

impl crate::recorder::InFlight for Slots {
    fn in_flight(&self) -> usize {
        Slots::in_flight(self)
    }

    fn wait_idle(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(Slots::wait_idle(self))
    }
}

/// The partitions' [`Deliver`] handle: fired entries to delivery slots.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    /// Weak: the engine's state holds the partitions, which hold this.
    shared: Weak<Shared>,
}

impl Dispatcher {
    pub(crate) fn new(shared: Weak<Shared>) -> Self {
        Dispatcher { shared }
    }
}

impl Deliver for Dispatcher {
    fn deliver(&self, tickets: Vec<Ticket>) {
        if let Some(shared) = self.shared.upgrade() {
            submit(&shared, tickets);
        }
    }
}

/// Queues tickets for delivery slots and starts what may start.
fn submit(shared: &Arc<Shared>, tickets: Vec<Ticket>) {
    let mut queued = Vec::with_capacity(tickets.len());
    for ticket in tickets {
        // A schedule's control event plans occurrences instead of
        // delivering; it takes no delivery slot, so a slow tenant cannot
        // delay it.
        if decide::route_of_key(&ticket.entry().key) == Some(Route::Schedule) {
            // The firing reads the definition when it runs: a waiting
            // firing keeps no record.
            let mut ticket = ticket;
            drop(ticket.take_read_ahead());
            let tasks = shared.env.tasks.clone();
            let shared = shared.clone();
            tasks.spawn(async move {
                crate::schedules::fire(shared, &ticket).await;
                ticket.finish(Finish::Done);
            });
            continue;
        }
        // A notice takes no delivery slot: a slow notice target must not
        // hold the tenant's deliveries.
        if decide::route_of_key(&ticket.entry().key) == Some(Route::Notice) {
            let tasks = shared.env.tasks.clone();
            let shared = shared.clone();
            tasks.spawn(async move { deliver_notice(&shared, ticket).await });
            continue;
        }
        queued.push(ticket);
    }
    if queued.is_empty() {
        return;
    }
    let (starting, next_token) = {
        let mut slots = shared.fire_path.slots.lock();
        slots.advance(shared.env.clock.now());
        for ticket in queued {
            slots.submit(ticket.entry().key.tenant.clone(), ticket);
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
        let mut armed = shared.fire_path.slots.rate_timer();
        if armed.is_some_and(|armed| armed <= at) {
            return;
        }
        *armed = Some(at);
    }
    let tasks = shared.env.tasks.clone();
    let shared = shared.clone();
    tasks.spawn(async move {
        let wait = at
            .as_millis()
            .saturating_sub(shared.env.clock.now().as_millis());
        if wait > 0 {
            crate::tasks::pause(Duration::from_millis(wait.unsigned_abs())).await;
        }
        {
            let mut armed = shared.fire_path.slots.rate_timer();
            if *armed == Some(at) {
                *armed = None;
            }
        }
        if shared.env.tasks.stopping() {
            return;
        }
        let (starting, next_token) = {
            let mut slots = shared.fire_path.slots.lock();
            slots.advance(shared.env.clock.now());
            (slots.start_ready(), slots.next_token_at())
        };
        start(&shared, starting);
        arm_rate_timer(&shared, next_token);
    });
}

fn start(shared: &Arc<Shared>, tickets: Vec<(TenantName, Ticket)>) {
    for (tenant, ticket) in tickets {
        let slot = HeldSlot {
            shared: shared.clone(),
            tenant,
            completed: false,
            answered: false,
        };
        shared.env.tasks.spawn(async move {
            let mut answered = false;
            deliver_one(&slot.shared, ticket, &mut answered).await;
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
            let mut slots = self.shared.fire_path.slots.lock();
            slots.advance(self.shared.env.clock.now());
            if self.answered {
                slots.answered(&self.tenant);
            }
            slots.finish(&self.tenant);
            if slots.in_flight() == 0 {
                self.shared.fire_path.slots.idle.notify_waiters();
            }
            if self.shared.env.tasks.stopping() || !self.completed {
                (Vec::new(), None)
            } else {
                (slots.start_ready(), slots.next_token_at())
            }
        };
        start(&self.shared, next);
        arm_rate_timer(&self.shared, next_token);
    }
}

/// One delivery, holding a tenant slot and a global slot: reads and claims
/// the record, then holds it (its tenant is paused, or its endpoint's
/// circuit open), expires it, hands it to the pull queue or sends it, as
/// the core decides. The outcome is handed to the recorder before the slot
/// is released. Sets `answered` when the tenant's endpoint answered the
/// attempt, whatever it answered.
async fn deliver_one(shared: &Arc<Shared>, ticket: Ticket, answered: &mut bool) {
    let retry_later = || Finish::RetryAt(shared.env.clock.now().plus(RETRY_PAUSE));
    if shared.env.tasks.stopping() {
        // Not started: it stays pending in the store for the next start.
        return ticket.finish(Finish::Done);
    }
    if !ticket.may_fire() {
        // Released or lapsed while queued: the next owner (or this one,
        // once renewed) fires it.
        return ticket.finish(retry_later());
    }
    let Some((ticket, record)) = claimed_record(shared, ticket).await else {
        return;
    };
    let entry = ticket.entry();
    let tenant = match shared.tenants.get(&entry.key.tenant).await {
        Ok(tenant) => tenant,
        Err(error) => {
            tracing::warn!(tenant = %entry.key.tenant, %error, "reading the tenant failed; retrying shortly");
            return ticket.finish(retry_later());
        }
    };
    let now = shared.env.clock.now();
    let lookback = shared.env.options.lookback;
    let Some(tenant) = tenant else {
        if let Some(reason) = decide::lookback_expiry(&record, entry, now, lookback, None) {
            let version = record.version.clone();
            let command = EventCommand::ExpireVersion { version, reason };
            return send_outcome(shared, ticket, command).await;
        }
        let report = AttemptReport {
            started_at: now,
            duration_ms: 0,
            verdict: Verdict::Permanent,
            http_status: None,
            error: Some(format!("tenant not registered: {}", entry.key.tenant)),
            steer: None,
        };
        return send_outcome(shared, ticket, attempt_command(&record, report, None)).await;
    };
    let route = decide::route(&entry.key, &tenant.config.sink, tenant.pause.as_ref());
    if route == Route::Hold {
        // Paused: no attempt, nothing recorded; the partition holds the
        // tenant's lane until it resumes.
        return ticket.finish(Finish::Held);
    }
    let resumed_since = tenant
        .pause
        .as_ref()
        .and_then(belfry_core::TenantPause::resumed_since);
    if let Some(reason) = decide::lookback_expiry(&record, entry, now, lookback, resumed_since) {
        let version = record.version.clone();
        let command = EventCommand::ExpireVersion { version, reason };
        return send_outcome(shared, ticket, command).await;
    }
    let config = &tenant.config;
    let policy = decide::delivery_policy(&config.sink, &record, &shared.env.options.retry);
    if let Some(reason) = decide::policy_expiry(&record, &policy, now) {
        let version = record.version.clone();
        let command = EventCommand::EndExpired { version, reason };
        return send_outcome(shared, ticket, command).await;
    }
    // Checked last, right before the send: a node paused past its lease
    // must not deliver for a partition someone else now owns.
    if !ticket.may_fire() {
        tracing::debug!(partition = %ticket.partition(), "firing window closed before delivery; holding the event");
        return ticket.finish(retry_later());
    }
    if route == Route::Pull {
        // The hand-off cannot hang, so it counts as answered: a pull
        // tenant's slow start never holds its hand-offs back.
        *answered = true;
        return hand_to_pull(shared, ticket, record, policy);
    }
    let pass = match crate::circuits::admit(shared, config, now) {
        Admission::Send(pass) => pass,
        // The endpoint's circuit is open: no attempt, nothing recorded;
        // the partition holds the tenant's lane until the probe time (or
        // its recheck, while a probe is out).
        Admission::Hold { until: Some(until) } => return ticket.finish(Finish::HeldUntil(until)),
        Admission::Hold { until: None } => return ticket.finish(Finish::Held),
    };
    let probe = UnsentProbe::new(shared, &config.name, pass);
    // Boxed: the sink's future is kilobytes; inline, it would make every
    // delivery task that large from its start, and the spawn copies it.
    let mut report = Box::pin(send(shared, &ticket, config, &record, now, answered)).await;
    probe.sent();
    report.error = crate::circuits::record(
        shared,
        &config.name,
        pass,
        report.verdict,
        report.error.take(),
    );
    let gone = report.steer == Some(Steer::Gone);
    let command = attempt_command(&record, report, Some(config));
    send_outcome(shared, ticket, command).await;
    if gone {
        Box::pin(receiver_gone(shared, &config.name)).await;
    }
}

/// Delivers a fired notice to its tenant's notice target, outside the
/// delivery slots.
async fn deliver_notice(shared: &Arc<Shared>, ticket: Ticket) {
    let retry_later = || Finish::RetryAt(shared.env.clock.now().plus(RETRY_PAUSE));
    if shared.env.tasks.stopping() {
        return ticket.finish(Finish::Done);
    }
    if !ticket.may_fire() {
        return ticket.finish(retry_later());
    }
    let Some((ticket, record)) = claimed_record(shared, ticket).await else {
        return;
    };
    // From here on the tenant's deliveries do not wait for it.
    ticket.attempted();
    let entry = ticket.entry();
    let tenant = match shared.tenants.get(&entry.key.tenant).await {
        Ok(tenant) => tenant,
        Err(error) => {
            tracing::warn!(tenant = %entry.key.tenant, %error, "reading the tenant failed; retrying the notice shortly");
            return ticket.finish(retry_later());
        }
    };
    let version = record.version.clone();
    let Some((config, target)) = tenant
        .as_ref()
        .and_then(|t| t.config.notify.as_ref().map(|target| (&t.config, target)))
    else {
        let reason = "expired: the tenant has no notice target any more".to_string();
        let command = EventCommand::EndExpired { version, reason };
        return send_outcome(shared, ticket, command).await;
    };
    let notice_tenant = belfry_core::TenantConfig {
        name: config.name.clone(),
        sink: target.sink(&config.sink),
        signing: config.signing.clone(),
        notify: None,
    };
    let now = shared.env.clock.now();
    let policy = decide::delivery_policy(&notice_tenant.sink, &record, &shared.env.options.retry);
    if let Some(reason) = decide::policy_expiry(&record, &policy, now) {
        let command = EventCommand::EndExpired { version, reason };
        return send_outcome(shared, ticket, command).await;
    }
    if !ticket.may_fire() {
        return ticket.finish(retry_later());
    }
    let started = shared.env.clock.monotonic();
    let result = Box::pin(shared.env.sinks.deliver(Delivery {
        tenant: &notice_tenant,
        event: &record,
        attempt: record.attempts + 1,
        triggered_at: now,
        epoch: Some(ticket.epoch()),
    }))
    .await;
    let took = shared.env.clock.monotonic().since(started);
    let report = AttemptReport {
        started_at: now,
        duration_ms: took.as_millis() as u64,
        verdict: result.verdict,
        http_status: result.http_status,
        error: result.error,
        // A notice target's `410 Gone` or `Retry-After` does not steer the
        // tenant's deliveries.
        steer: None,
    };
    let command = EventCommand::RecordAttempt {
        version,
        number: record.attempts + 1,
        report,
        tenant: Default::default(),
    };
    send_outcome(shared, ticket, command).await;
}

/// A probe admitted and not sent yet: dropped unsent (the delivery's task
/// cancelled), it gives the circuit its probe back.
struct UnsentProbe<'a> {
    shared: &'a Arc<Shared>,
    tenant: &'a TenantName,
    pass: Option<Pass>,
}

impl<'a> UnsentProbe<'a> {
    fn new(shared: &'a Arc<Shared>, tenant: &'a TenantName, pass: Pass) -> Self {
        UnsentProbe {
            shared,
            tenant,
            pass: pass.is_probe().then_some(pass),
        }
    }

    fn sent(mut self) {
        self.pass = None;
    }
}

impl Drop for UnsentProbe<'_> {
    fn drop(&mut self) {
        if let Some(pass) = self.pass.take() {
            crate::circuits::abandon(self.shared, self.tenant, pass);
        }
    }
}

/// The record of the attempt `report` tells of, on `record`'s version,
/// with its tenant's defaults for the next attempt.
fn attempt_command(
    record: &belfry_core::EventRecord,
    report: AttemptReport,
    tenant: Option<&belfry_core::TenantConfig>,
) -> EventCommand {
    EventCommand::RecordAttempt {
        version: record.version.clone(),
        // The attempt's identity with the version: the receiver sees it
        // as `X-Belfry-Attempt`, and recording it twice counts it once.
        number: record.attempts + 1,
        report,
        tenant: tenant.map_or_else(Default::default, |t| t.sink.delivery_defaults().clone()),
    }
}

/// The receiver answered `410 Gone`: the event failed for good (its report
/// says so), and the tenant's deliveries pause until someone resumes them.
async fn receiver_gone(shared: &Arc<Shared>, tenant: &belfry_core::TenantName) {
    let reason = "the receiver answered 410 Gone".to_string();
    let tenants = crate::tenants::Tenants { shared };
    match tenants.pause(tenant, Some(reason)).await {
        Ok(_) => {
            tracing::warn!(%tenant, "the receiver answered 410 Gone: the tenant's deliveries are paused")
        }
        Err(error) => {
            tracing::warn!(%tenant, %error, "the receiver answered 410 Gone; pausing the tenant failed")
        }
    }
}

/// The ticket's record (read ahead, or read now), once claimed with its
/// partition's core; `None` when the ticket was finished instead. The
/// window is a hint; the record decides whether this is still due.
async fn claimed_record(
    shared: &Arc<Shared>,
    mut ticket: Ticket,
) -> Option<(Ticket, belfry_core::EventRecord)> {
    loop {
        let read = match ticket.take_read_ahead() {
            Some(record) => Ok(Some(record)),
            None => shared.fire_path.reads.get(&ticket.entry().key).await,
        };
        let record = match read {
            Ok(Some(record)) if decide::still_due(&record, ticket.entry()) => record,
            Ok(_) => {
                ticket.finish(Finish::Done);
                return None;
            }
            Err(error) => {
                tracing::warn!(key = ?ticket.entry().key, %error, "reading a due event failed; retrying it shortly");
                ticket.finish(Finish::RetryAt(shared.env.clock.now().plus(RETRY_PAUSE)));
                return None;
            }
        };
        // A second copy of a version whose delivery is in progress is
        // dropped (the core finished it); an event changed since its
        // record was read is read again.
        match ticket.claim(&record.version) {
            Claim::Granted => return Some((ticket, record)),
            Claim::Reread => continue,
            Claim::Duplicate => return None,
        }
    }
}

/// A pull tenant's event waits for a worker's claim: the pull queue holds
/// its ticket until it finishes it.
fn hand_to_pull(
    shared: &Arc<Shared>,
    ticket: Ticket,
    record: belfry_core::EventRecord,
    policy: belfry_core::DeliveryPolicy,
) {
    let ready = belfry_core::pull::ReadyEntry {
        entry: ticket.entry().clone(),
        partition: ticket.partition(),
        epoch: ticket.epoch(),
        queue: record.settings.queue(),
        policy,
        record,
    };
    crate::pull::ready(shared, ticket, ready);
}

/// Sends one attempt through the sinks and reports it.
async fn send(
    shared: &Arc<Shared>,
    ticket: &Ticket,
    tenant: &belfry_core::TenantConfig,
    record: &belfry_core::EventRecord,
    now: Timestamp,
    answered: &mut bool,
) -> AttemptReport {
    let late = now.as_millis() - ticket.entry().due.as_millis();
    belfry_metrics::attempt_started(
        record.attempts == 0,
        Duration::from_millis(u64::try_from(late).unwrap_or(0)),
    );
    let started = shared.env.clock.monotonic();
    let result = shared
        .env
        .sinks
        .deliver(Delivery {
            tenant,
            event: record,
            attempt: record.attempts + 1,
            triggered_at: now,
            epoch: Some(ticket.epoch()),
        })
        .await;
    let took = shared.env.clock.monotonic().since(started);
    *answered = result.http_status.is_some() || result.verdict == Verdict::Delivered;
    belfry_metrics::attempt_ended(channel_of(&tenant.sink), outcome_of(result.verdict), took);
    AttemptReport {
        started_at: now,
        duration_ms: took.as_millis() as u64,
        verdict: result.verdict,
        http_status: result.http_status,
        error: result.error,
        steer: result.steer,
    }
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

/// Hands an outcome to the recorder, which finishes the ticket once it is
/// stored. The channel is bounded: a slow store holds deliveries here,
/// keeping their slots, so nothing piles up in memory. The attempt is
/// over, so the entry stops counting against its tenant's outstanding
/// bound now, not once its outcome is stored.
async fn send_outcome(shared: &Arc<Shared>, ticket: Ticket, command: EventCommand) {
    ticket.attempted();
    let command = KeyedCommand {
        key: ticket.entry().key.clone(),
        command,
        fence: Some(Fence {
            partition: ticket.partition(),
            epoch: ticket.epoch(),
        }),
    };
    if let Err(unsent) = shared
        .fire_path
        .outcomes
        .send(Outcome { command, ticket })
        .await
    {
        // The recorder is gone (the engine stopped): the event stays
        // pending in the store and fires again after the next start.
        unsent.0.ticket.finish(Finish::Done);
    }
}
