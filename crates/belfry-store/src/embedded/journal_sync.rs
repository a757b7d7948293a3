//! One fsync of the shared journal at a time, shared by every writer shard.
//!
//! fjall keeps one journal for the whole database, so two shards that each
//! fsync after their own commit sync the same file twice. Under load that
//! doubled the fsyncs (≈ 60 µs of CPU each on these virtual disks). Here a
//! shard whose batch committed waits for an fsync that *started after* its
//! commit: if one is running it waits for it and, since that one may have
//! started before the commit, the next; whoever finds none running runs it
//! for everyone committed so far.

use std::sync::{Condvar, Mutex, PoisonError};

use fjall::{Database, PersistMode};

/// Commits counted, commits known durable, and whether an fsync runs.
#[derive(Default)]
struct State {
    committed: u64,
    synced: u64,
    syncing: bool,
}

/// See the module docs. Shared (`Arc`) by the writer shards of one store.
#[derive(Default)]
pub struct JournalSync {
    state: Mutex<State>,
    finished: Condvar,
}

impl JournalSync {
    /// Returns once the journal was fsynced after the caller's batch
    /// committed (call it right after `commit` returned). An fsync error is
    /// answered to the shard that ran it; the shards waiting on it run
    /// their own.
    pub fn persist_committed(&self, db: &Database) -> fjall::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.committed += 1;
        let mine = state.committed;
        loop {
            if state.synced >= mine {
                return Ok(());
            }
            if !state.syncing {
                state.syncing = true;
                // Every commit counted so far returned before this point.
                let covers = state.committed;
                drop(state);
                let result = db.persist(PersistMode::SyncAll);
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.syncing = false;
                if result.is_ok() {
                    state.synced = state.synced.max(covers);
                }
                self.finished.notify_all();
                return result;
            }
            state = self
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}
