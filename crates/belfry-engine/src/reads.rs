//! Fire-time record reads, coalesced node-wide.
//!
//! A delivery reads its event's record when it starts (unless the
//! partition read it ahead): the record decides whether the version is
//! still due. One read per delivery costs a store round trip each, which on
//! PostgreSQL at 10,000 deliveries/s queued behind the connection pool and
//! made the lateness. Here the reads wait for one of a few read slots; the
//! requests that arrive meanwhile go out together as one batched
//! `get_events`, like a group commit: an idle node reads at once, a busy one
//! in batches.

use std::sync::Arc;

use belfry_core::{EventKey, EventRecord};
use belfry_store::{SharedStore, StoreError, StoreResult};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::tasks::Spawner;

/// Batched reads in flight at once: enough to overlap a round trip with
/// gathering the next batch, few enough to leave the pool to writes.
const READS_IN_FLIGHT: usize = 4;
/// Keys per batched read.
const MAX_BATCH: usize = 512;
/// Requests waiting for a read; senders wait beyond it (each request is a
/// delivery holding its slot, so this bound is never the first to bite).
const QUEUE: usize = 4_096;

type Reply = oneshot::Sender<StoreResult<Option<EventRecord>>>;

/// A cheap handle to the node's read batcher.
#[derive(Debug, Clone)]
pub(crate) struct RecordReads {
    requests: mpsc::Sender<(EventKey, Reply)>,
}

impl RecordReads {
    /// Starts the batcher task; it ends when every handle is dropped.
    pub(crate) fn start(store: SharedStore, tasks: &Spawner) -> RecordReads {
        let (requests, queue) = mpsc::channel(QUEUE);
        tasks.spawn(run(store, queue, tasks.clone()));
        RecordReads { requests }
    }

    /// The current record of `key`, read at or after this call.
    pub(crate) async fn get(&self, key: &EventKey) -> StoreResult<Option<EventRecord>> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the node is stopping".into());
        self.requests
            .send((key.clone(), reply))
            .await
            .map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }
}

async fn run(store: SharedStore, mut queue: mpsc::Receiver<(EventKey, Reply)>, tasks: Spawner) {
    let slots = Arc::new(Semaphore::new(READS_IN_FLIGHT));
    loop {
        // A slot first: while every slot is busy, requests gather.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let store = store.clone();
        tasks.spawn(async move {
            let (keys, replies): (Vec<EventKey>, Vec<Reply>) = batch.into_iter().unzip();
            match store.get_events(&keys).await {
                Ok(records) => {
                    for (reply, record) in replies.into_iter().zip(records) {
                        let _ = reply.send(Ok(record));
                    }
                }
                Err(error) => {
                    for reply in replies {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
            drop(slot);
        });
    }
}
