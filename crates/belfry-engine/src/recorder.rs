//! Applies attempt outcomes to the store in batches.
//!
//! Outcomes arrive one per delivery; after the first one the recorder
//! lingers `record_linger_ms` (default 10 ms), then takes everything waiting
//! (up to [`MAX_BATCH`]) into one `apply`, so thousands of deliveries per
//! second share a few fsyncs. Without the linger, each batch was as small
//! as one commit's latency allowed and fsyncs were most of the node's system
//! time at 5,000 deliveries/s. A failed write is retried, never dropped: an
//! outcome lost here would mean a duplicate delivery after restart. Retrying
//! is safe even when the failed write had committed: an attempt is recorded
//! once per (version, number) (`EventCommand::RecordAttempt`), so its repeat
//! changes nothing but re-arms the retry the first write set.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::event::CommandOutcome;
use belfry_core::fire::Finish;
use belfry_core::{Clock, EventStatus, RetryPolicy};
use belfry_store::{Applied, ApplyParams, KeyedCommand, SharedStore, StoreError};
use tokio::sync::{mpsc, watch};

use crate::partition::Ticket;

/// One delivery's outcome, with the ticket it finishes.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) command: KeyedCommand,
    pub(crate) ticket: Ticket,
}

/// Finishes the outcomes' tickets (the outcome is stored, or dropped as
/// stale).
fn finish_all(outcomes: impl IntoIterator<Item = Outcome>) {
    for outcome in outcomes {
        outcome.ticket.finish(Finish::Done);
    }
}

const MAX_BATCH: usize = 10_000;
const WRITE_RETRY: Duration = Duration::from_millis(200);

/// Deliveries in flight, which the recorder waits for while it stops.
pub(crate) trait InFlight: Send + Sync {
    fn in_flight(&self) -> usize;
    /// Resolves once no delivery is in flight.
    fn wait_idle(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// Where the effects of recorded outcomes go (the owning partitions).
pub(crate) trait RouteEffects: Send + Sync {
    fn route(&self, applied: &[Applied]);
}

/// The recorder and what it reads: no more than it needs.
pub(crate) struct Recorder {
    pub(crate) store: SharedStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) linger: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) in_flight: Arc<dyn InFlight>,
    pub(crate) effects: Arc<dyn RouteEffects>,
}

/// Records `outcomes` until `stop` says so and the deliveries in flight
/// have handed theirs over.
pub(crate) async fn run(
    recorder: Recorder,
    mut outcomes: mpsc::Receiver<Outcome>,
    mut stop: watch::Receiver<bool>,
) {
    let recorder = &recorder;
    let mut stopping = false;
    loop {
        let first = tokio::select! {
            item = outcomes.recv() => item,
            // At shutdown, wait for in-flight deliveries' outcomes until the
            // channel is idle, then finish.
            _ = stop.changed() => None,
        };
        let Some(first) = first else {
            drain_after_stop(recorder, &mut outcomes).await;
            return;
        };
        // Stopping cuts the linger short: the batch is written at once.
        if !recorder.linger.is_zero() {
            tokio::select! {
                _ = crate::tasks::pause(recorder.linger) => {}
                _ = stop.changed() => stopping = true,
            }
        }
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match outcomes.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        record(recorder, batch).await;
        if stopping {
            drain_after_stop(recorder, &mut outcomes).await;
            return;
        }
    }
}

async fn drain_after_stop(recorder: &Recorder, outcomes: &mut mpsc::Receiver<Outcome>) {
    let mut pending = ChannelPending {
        in_flight: recorder.in_flight.as_ref(),
        outcomes,
    };
    drain_until_idle(&mut pending, |batch| record(recorder, batch)).await;
}

/// What the recorder sees while it stops: deliveries still in flight and
/// the outcomes that have arrived. A seam so the stopping order can be
/// tested step by step.
trait Pending<T> {
    fn in_flight(&self) -> usize;
    fn try_next(&mut self) -> Option<T>;
    /// Resolves with an arrived outcome, or `None` once nothing is in
    /// flight (or the channel closed).
    fn next_or_idle(&mut self) -> impl Future<Output = Option<T>> + Send;
}

struct ChannelPending<'a> {
    in_flight: &'a dyn InFlight,
    outcomes: &'a mut mpsc::Receiver<Outcome>,
}

impl Pending<Outcome> for ChannelPending<'_> {
    fn in_flight(&self) -> usize {
        self.in_flight.in_flight()
    }

    fn try_next(&mut self) -> Option<Outcome> {
        self.outcomes.try_recv().ok()
    }

    async fn next_or_idle(&mut self) -> Option<Outcome> {
        tokio::select! {
            () = self.in_flight.wait_idle() => None,
            item = self.outcomes.recv() => item,
        }
    }
}

/// Records every outcome still to come, then returns once nothing is in
/// flight. In-flight deliveries finish within the shutdown grace (the
/// engine stops waiting for this task after it).
async fn drain_until_idle<T, Recorded: Future<Output = ()>>(
    pending: &mut impl Pending<T>,
    mut record: impl FnMut(Vec<T>) -> Recorded,
) {
    loop {
        // Checked before draining: a delivery hands its outcome over before
        // it releases its slot, so "nothing in flight" seen here means every
        // outcome is in the channel already. Checking after draining lost an
        // outcome sent in between (and redelivered it after restart).
        let idle = pending.in_flight() == 0;
        let mut batch = Vec::new();
        while let Some(item) = pending.try_next() {
            batch.push(item);
        }
        if !batch.is_empty() {
            record(batch).await;
            continue;
        }
        if idle {
            return;
        }
        if let Some(item) = pending.next_or_idle().await {
            record(vec![item]).await;
        }
    }
}

/// Writes one batch, retrying until it lands. Outcomes of a partition
/// this node no longer owns are rejected by their epoch: they are dropped
/// (the new owner re-delivers; that is the at-least-once duplicate window).
async fn record(recorder: &Recorder, batch: Vec<Outcome>) {
    let mut groups = vec![batch];
    while let Some(group) = groups.pop() {
        match record_group(recorder, group).await {
            Ok(()) => {}
            Err(Split(parts)) => groups.extend(parts),
        }
    }
}

/// Counts the terminal states the recorded outcomes reached.
fn count_endings(applied: &[Applied]) {
    let (mut delivered, mut failed, mut missed, mut expired) = (0, 0, 0, 0);
    for item in applied {
        match item.outcome {
            // A repeat is the retry of a write that committed but answered
            // an error, which counted nothing then.
            CommandOutcome::AttemptRecorded(EventStatus::Delivered)
            | CommandOutcome::AttemptAlreadyRecorded(EventStatus::Delivered) => delivered += 1,
            CommandOutcome::AttemptRecorded(EventStatus::Failed)
            | CommandOutcome::AttemptAlreadyRecorded(EventStatus::Failed) => failed += 1,
            CommandOutcome::Expired => match item.record.as_ref().map(|r| r.status) {
                Some(EventStatus::Expired) => expired += 1,
                _ => missed += 1,
            },
            _ => {}
        }
    }
    belfry_metrics::events_ended(belfry_metrics::Ended::Delivered, delivered);
    belfry_metrics::events_ended(belfry_metrics::Ended::Failed, failed);
    belfry_metrics::events_ended(belfry_metrics::Ended::Missed, missed);
    belfry_metrics::events_ended(belfry_metrics::Ended::Expired, expired);
}

/// A fenced batch, split by partition to separate stale outcomes from valid
/// ones.
struct Split(Vec<Vec<Outcome>>);

async fn record_group(recorder: &Recorder, mut batch: Vec<Outcome>) -> Result<(), Split> {
    loop {
        let params = ApplyParams {
            commands: batch.iter().map(|o| o.command.clone()).collect(),
            now: recorder.clock.now(),
            retry: recorder.retry.clone(),
        };
        match recorder.store.apply(params).await {
            Ok(applied) => {
                count_endings(&applied);
                // Before the effects: a retry armed by this outcome may
                // claim the event again.
                finish_all(batch);
                recorder.effects.route(&applied);
                return Ok(());
            }
            Err(StoreError::Partial(partial)) => {
                // Some writer shards committed: finish those outcomes and
                // route their effects; only the rest is written again (a
                // committed attempt written again would change nothing, but
                // its effects are routed once here).
                let mut failed = Vec::new();
                let mut applied = Vec::new();
                for (outcome, result) in batch.into_iter().zip(partial.results) {
                    match result {
                        Ok(done) => {
                            finish_all([outcome]);
                            applied.push(done);
                        }
                        Err(_) => failed.push(outcome),
                    }
                }
                count_endings(&applied);
                recorder.effects.route(&applied);
                tracing::warn!(
                    failed = failed.len(),
                    "recording delivery outcomes failed in part; retrying the rest"
                );
                batch = failed;
                if batch.is_empty() {
                    return Ok(());
                }
                crate::tasks::pause(WRITE_RETRY).await;
            }
            Err(StoreError::Fenced { partition, epoch }) => {
                belfry_metrics::fenced_write_rejected();
                let mut by_partition: std::collections::BTreeMap<_, Vec<Outcome>> =
                    Default::default();
                for outcome in batch {
                    let group = outcome.command.fence.map(|f| f.partition);
                    by_partition.entry(group).or_default().push(outcome);
                }
                if by_partition.len() == 1 {
                    let outcomes: Vec<Outcome> = by_partition.into_values().flatten().collect();
                    tracing::warn!(
                        partition = %partition,
                        epoch,
                        outcomes = outcomes.len(),
                        "dropping outcomes of a partition now owned elsewhere"
                    );
                    finish_all(outcomes);
                    return Ok(());
                }
                return Err(Split(by_partition.into_values().collect()));
            }
            Err(error) => {
                tracing::warn!(%error, outcomes = batch.len(), "recording delivery outcomes failed; retrying");
                crate::tasks::pause(WRITE_RETRY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::{Pending, drain_until_idle};

    /// One delivery in flight whose outcome arrives exactly when the
    /// recorder has just found the channel empty: the interleaving that
    /// lost an outcome at shutdown.
    struct FinishesRightAfterTheDrain {
        in_flight: usize,
        channel: VecDeque<&'static str>,
    }

    impl Pending<&'static str> for FinishesRightAfterTheDrain {
        fn in_flight(&self) -> usize {
            self.in_flight
        }

        fn try_next(&mut self) -> Option<&'static str> {
            let item = self.channel.pop_front();
            if item.is_none() && self.in_flight == 1 {
                // The delivery hands its outcome over, then frees its slot.
                self.channel.push_back("late outcome");
                self.in_flight = 0;
            }
            item
        }

        async fn next_or_idle(&mut self) -> Option<&'static str> {
            self.channel.pop_front()
        }
    }

    #[tokio::test]
    async fn an_outcome_that_arrives_while_stopping_is_recorded() {
        let mut pending = FinishesRightAfterTheDrain {
            in_flight: 1,
            channel: VecDeque::new(),
        };
        let mut recorded = Vec::new();
        drain_until_idle(&mut pending, |batch| {
            recorded.extend(batch);
            std::future::ready(())
        })
        .await;
        assert_eq!(recorded, ["late outcome"]);
    }
}
