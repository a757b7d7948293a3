//! One worker per partition: the loader and the timer window.
//!
//! The worker is a single task, so loading a page and applying wake-ups
//! (offers and removals) never interleave: a wake-up sent after a store
//! commit is handled either before the page read (and then the read sees the
//! commit) or after the cursor moved past it (and then it is inserted). See
//! [`belfry_core::timer`] for the window contract.

use std::sync::Arc;
use std::time::Duration;

use belfry_core::{DueCursor, EventKey, PartitionId, TimerWindow, Timestamp};
use belfry_store::DuePageParams;
use tokio::sync::{mpsc, watch};

use crate::Shared;
use crate::ownership::PartitionLease;

/// At most this many entries are handed to the dispatcher per wake-up, so
/// wake-ups keep being served during a large burst.
const FIRE_BATCH: usize = 2_048;
/// How often a partition whose lease lapsed checks whether it was renewed.
const LEASE_RECHECK: Duration = Duration::from_millis(100);
/// Pause after a failed page read before trying again.
const LOAD_RETRY: Duration = Duration::from_millis(500);

/// A wake-up for a partition worker.
#[derive(Debug)]
pub enum PartitionMsg {
    /// A new, moved or retried event: keep it if the window covers it.
    Offer(DueCursor),
    /// An event moved away, was cancelled or finished.
    Remove(DueCursor),
    /// Wake-ups may have been lost: drop the window, reload from the store.
    Reload,
}

pub(crate) struct PartitionWorker {
    shared: Arc<Shared>,
    id: PartitionId,
    lease: Arc<PartitionLease>,
    inbox: mpsc::UnboundedReceiver<PartitionMsg>,
    /// Set when this node stops owning the partition.
    released: watch::Receiver<bool>,
    window: TimerWindow,
    /// This partition's share of `max_events_in_memory`.
    capacity: usize,
    /// When the last page read failed; loads pause for [`LOAD_RETRY`].
    load_failed_at: Option<tokio::time::Instant>,
}

impl PartitionWorker {
    pub(crate) fn new(
        shared: Arc<Shared>,
        id: PartitionId,
        lease: Arc<PartitionLease>,
        inbox: mpsc::UnboundedReceiver<PartitionMsg>,
        released: watch::Receiver<bool>,
    ) -> Self {
        let partitions = usize::from(shared.store.partitions().get());
        let capacity = (shared.options.max_events_in_memory / partitions).max(64);
        PartitionWorker {
            shared,
            id,
            lease,
            inbox,
            released,
            window: TimerWindow::new(),
            capacity,
            load_failed_at: None,
        }
    }

    pub(crate) async fn run(mut self) {
        let mut stop = self.shared.stop_signal.subscribe();
        let mut released = self.released.clone();
        loop {
            if *stop.borrow() || *released.borrow() {
                break;
            }
            self.load_if_needed().await;
            let now = self.shared.clock.now();
            // A new owner waits out the previous owner's lease; an owner
            // whose lease lapsed (no renewal: database or network trouble)
            // holds its entries until it is renewed or released.
            let may_fire = self.lease.may_fire();
            let due = if may_fire {
                self.window.pop_due(now, FIRE_BATCH)
            } else {
                Vec::new()
            };
            if !due.is_empty() {
                crate::dispatch::fire(&self.shared, self.id, &self.lease, due);
                self.drain_inbox();
                continue;
            }
            let mut sleep_for = self.sleep_duration(now);
            if !may_fire {
                let takeover_wait = self.lease.wait_before_firing();
                sleep_for = sleep_for.min(if takeover_wait.is_zero() {
                    LEASE_RECHECK
                } else {
                    takeover_wait
                });
            }
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = released.changed() => break,
                msg = self.inbox.recv() => match msg {
                    Some(msg) => {
                        self.handle(msg);
                        self.drain_inbox();
                    }
                    None => break,
                },
                _ = tokio::time::sleep(sleep_for) => {}
            }
        }
    }

    fn drain_inbox(&mut self) {
        while let Ok(msg) = self.inbox.try_recv() {
            self.handle(msg);
        }
    }

    fn handle(&mut self, msg: PartitionMsg) {
        match msg {
            PartitionMsg::Offer(entry) => {
                if self.window.offer(entry) && self.window.len() > self.capacity {
                    self.window.shrink_to(self.capacity);
                }
            }
            PartitionMsg::Remove(entry) => {
                self.window.remove(&entry);
            }
            PartitionMsg::Reload => {
                self.window = TimerWindow::new();
            }
        }
    }

    /// The instant up to which the window should be loaded.
    fn horizon(&self, now: Timestamp) -> Timestamp {
        now.plus(self.shared.options.window)
    }

    /// Pages in more events when the loaded range ends less than half a
    /// window ahead and there is room.
    async fn load_if_needed(&mut self) {
        if let Some(failed_at) = self.load_failed_at {
            if failed_at.elapsed() < LOAD_RETRY {
                return;
            }
            self.load_failed_at = None;
        }
        let now = self.shared.clock.now();
        let half_window = self.shared.options.window / 2;
        let needs_more = match self.window.cursor() {
            None => true,
            Some(cursor) => cursor.due < now.plus(half_window),
        };
        let room = self.capacity.saturating_sub(self.window.len());
        if !needs_more || room < self.capacity / 4 {
            return;
        }
        let through = self.horizon(now);
        let page = self
            .shared
            .store
            .due_page(DuePageParams {
                partition: self.id,
                after: self.window.cursor().cloned(),
                through,
                limit: room,
            })
            .await;
        match page {
            Ok(entries) => {
                let full = entries.len() >= room;
                let covered_through = match entries.last() {
                    Some(last) if full => last.clone(),
                    // Everything due up to `through` is now in the window.
                    _ => DueCursor {
                        due: through.plus(Duration::from_millis(1)),
                        key: EventKey::before_all(),
                    },
                };
                self.window.extend(entries, covered_through);
            }
            Err(error) => {
                tracing::warn!(partition = %self.id, %error, "loading due events failed; retrying");
                self.load_failed_at = Some(tokio::time::Instant::now());
            }
        }
    }

    /// How long to sleep before the next thing to do: the earliest due
    /// entry, or the moment the loaded range gets short.
    fn sleep_duration(&self, now: Timestamp) -> Duration {
        let half_window = self.shared.options.window / 2;
        let room = self.capacity.saturating_sub(self.window.len());
        let mut wake_at = match self.window.cursor() {
            // A full window reloads only after entries fire: no timed reload.
            _ if room < self.capacity / 4 => now.plus(Duration::from_secs(1)),
            Some(cursor) => cursor.due.minus(half_window),
            None => now,
        };
        if let Some(next_due) = self.window.next_due() {
            wake_at = wake_at.min(next_due);
        }
        if self.load_failed_at.is_some() {
            wake_at = wake_at.min(now.plus(LOAD_RETRY));
        }
        // Never spin: at least 1 ms, at most a second between checks (the
        // wall clock may jump; re-reading it often keeps lateness bounded).
        now.until(wake_at)
            .clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}
