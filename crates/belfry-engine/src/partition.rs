//! One worker per partition: the loader and the timer window.
//!
//! The worker is a single task, so loading a page and applying wake-ups
//! (offers and removals) never interleave: a wake-up sent after a store
//! commit is handled either before the page read (and then the read sees the
//! commit) or after the cursor moved past it (and then it is inserted). See
//! [`belfry_core::timer`] for the window contract.
//!
//! # Read-ahead
//! Entries due within [`READ_AHEAD`] get their records read in one batch,
//! off the runtime's threads, before they fire, so a delivery needs no store
//! read at its instant. That read could otherwise wait behind the storage
//! engine: fjall holds its version lock while a flush fsyncs, and fire-time
//! reads on the runtime's threads turned each flush into a 50–100 ms stall of
//! every delivery. Any wake-up for a key (moved, cancelled, updated: each is
//! an `Offer` or `Remove`) drops its read-ahead record, so a changed event is
//! read again at fire time, as before.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{DueCursor, EventKey, EventRecord, PartitionId, TimerWindow, Timestamp};
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
/// How long before their instant entries' records are read ahead: a round
/// starts when the first entry not yet read is due within half of it and
/// reads everything due within all of it, so rounds are few and large.
const READ_AHEAD: Duration = Duration::from_millis(500);
/// Most records one partition holds read ahead, and most bytes of payload:
/// memory stays bounded however many events share an instant (the rest are
/// read at fire time).
const READ_AHEAD_MAX_RECORDS: usize = 4_096;
const READ_AHEAD_MAX_PAYLOAD_BYTES: usize = 2 * 1024 * 1024;

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
    read_ahead: ReadAhead,
}

/// Records read ahead for entries about to fire (see the module docs).
#[derive(Default)]
struct ReadAhead {
    records: HashMap<EventKey, EventRecord>,
    payload_bytes: usize,
    /// Entries up to here were requested (or skipped for the budget).
    requested_through: Option<DueCursor>,
    /// Keys of the read in flight, if one is.
    in_flight: Option<HashSet<EventKey>>,
    /// Keys that got a wake-up while their read was in flight: its result is
    /// stale.
    stale: HashSet<EventKey>,
}

type ReadAheadResult = Vec<(EventKey, Option<EventRecord>)>;

impl ReadAhead {
    /// A wake-up for `key`: what was read for it may be outdated.
    fn invalidate(&mut self, key: &EventKey) {
        if let Some(record) = self.records.remove(key) {
            self.payload_bytes -= payload_len(&record);
        }
        if self
            .in_flight
            .as_ref()
            .is_some_and(|keys| keys.contains(key))
        {
            self.stale.insert(key.clone());
        }
    }

    /// The window was dropped: forget everything, including a read in flight.
    fn reset(&mut self) {
        self.records.clear();
        self.payload_bytes = 0;
        self.requested_through = None;
        if let Some(keys) = &self.in_flight {
            self.stale.extend(keys.iter().cloned());
        }
    }

    /// The record read ahead for `entry`, if it is still the one due then.
    fn take(&mut self, entry: &DueCursor) -> Option<EventRecord> {
        let record = self.records.remove(&entry.key)?;
        self.payload_bytes -= payload_len(&record);
        (record.next_fire_at == Some(entry.due)).then_some(record)
    }

    fn accept(&mut self, results: ReadAheadResult) {
        for (key, record) in results {
            let Some(record) = record else { continue };
            if self.stale.contains(&key) {
                continue;
            }
            self.payload_bytes += payload_len(&record);
            if let Some(old) = self.records.insert(key, record) {
                self.payload_bytes -= payload_len(&old);
            }
        }
        self.in_flight = None;
        self.stale.clear();
    }
}

fn payload_len(record: &EventRecord) -> usize {
    record.payload.as_ref().map_or(0, String::len)
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
            read_ahead: ReadAhead::default(),
        }
    }

    pub(crate) async fn run(mut self) {
        let mut stop = self.shared.stop_signal.subscribe();
        let mut released = self.released.clone();
        // Results of read-ahead rounds, each read on its own task.
        let (read_ahead_tx, mut read_ahead_results) = mpsc::unbounded_channel();
        loop {
            if *stop.borrow() || *released.borrow() {
                break;
            }
            self.load_if_needed().await;
            // Wake-ups first: they may invalidate records read ahead.
            self.drain_inbox();
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
                let due = due
                    .into_iter()
                    .map(|entry| {
                        let record = self.read_ahead.take(&entry);
                        (entry, record)
                    })
                    .collect();
                crate::dispatch::fire(&self.shared, self.id, &self.lease, due);
                self.drain_inbox();
                continue;
            }
            if may_fire {
                self.start_read_ahead(now, &read_ahead_tx);
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
                Some(results) = read_ahead_results.recv() => {
                    self.read_ahead.accept(results);
                }
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
                self.read_ahead.invalidate(&entry.key);
                // An entry at or before what was already requested is read
                // in the next round.
                if self
                    .read_ahead
                    .requested_through
                    .as_ref()
                    .is_some_and(|through| entry <= *through)
                {
                    self.read_ahead.requested_through = None;
                }
                if self.window.offer(entry) && self.window.len() > self.capacity {
                    self.window.shrink_to(self.capacity);
                }
            }
            PartitionMsg::Remove(entry) => {
                self.read_ahead.invalidate(&entry.key);
                self.window.remove(&entry);
            }
            PartitionMsg::Reload => {
                self.read_ahead.reset();
                self.window = TimerWindow::new();
            }
        }
    }

    /// Starts reading the records of entries due within [`READ_AHEAD`] that
    /// have none yet, unless a read is in flight or the budget is spent.
    fn start_read_ahead(
        &mut self,
        now: Timestamp,
        results: &mpsc::UnboundedSender<ReadAheadResult>,
    ) {
        let read_ahead = &mut self.read_ahead;
        if read_ahead.in_flight.is_some()
            || read_ahead.records.len() >= READ_AHEAD_MAX_RECORDS
            || read_ahead.payload_bytes >= READ_AHEAD_MAX_PAYLOAD_BYTES
        {
            return;
        }
        let starts_round = self
            .window
            .due_between(
                read_ahead.requested_through.as_ref(),
                now.plus(READ_AHEAD / 2),
            )
            .next()
            .is_some();
        if !starts_round {
            return;
        }
        let room = READ_AHEAD_MAX_RECORDS - read_ahead.records.len();
        let mut keys = Vec::new();
        let mut last = None;
        for entry in self
            .window
            .due_between(read_ahead.requested_through.as_ref(), now.plus(READ_AHEAD))
        {
            if keys.len() >= room {
                break;
            }
            last = Some(entry.clone());
            if !read_ahead.records.contains_key(&entry.key) {
                keys.push(entry.key.clone());
            }
        }
        let Some(last) = last else { return };
        read_ahead.requested_through = Some(last);
        if keys.is_empty() {
            return;
        }
        read_ahead.in_flight = Some(keys.iter().cloned().collect());
        let (results, store) = (results.clone(), self.shared.store.clone());
        tokio::spawn(async move {
            // A failed read only means those entries are read at fire time.
            let records = store.get_events(&keys).await.unwrap_or_default();
            let mut paired: ReadAheadResult = keys.into_iter().zip(records).collect();
            paired.retain(|(_, record)| record.is_some());
            let _ = results.send(paired);
        });
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
        let read_ahead = &self.read_ahead;
        let may_read_ahead = read_ahead.in_flight.is_none()
            && read_ahead.records.len() < READ_AHEAD_MAX_RECORDS
            && read_ahead.payload_bytes < READ_AHEAD_MAX_PAYLOAD_BYTES;
        if may_read_ahead
            && let Some(next) = self
                .window
                .due_between(
                    read_ahead.requested_through.as_ref(),
                    Timestamp::from_millis(i64::MAX),
                )
                .next()
        {
            wake_at = wake_at.min(next.due.minus(READ_AHEAD / 2));
        }
        // Never spin: at least 1 ms, at most a second between checks (the
        // wall clock may jump; re-reading it often keeps lateness bounded).
        now.until(wake_at)
            .clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}
