//! The engine's task tracker: every task of the engine is spawned here, so
//! dropping the [`crate::Engine`] aborts all of them (a crash in tests is a
//! drop), and [`crate::Engine::shutdown`] can tell them to stop first.
//!
//! [`TaskTracker`] owns the tasks; components hold a [`Spawner`], which
//! does not keep them alive: a task spawned once the tracker is gone is
//! dropped unstarted.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use futures::FutureExt as _;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinSet;

/// Owns every task of one engine; dropping it aborts them.
#[derive(Debug)]
pub(crate) struct TaskTracker {
    tasks: Arc<Mutex<JoinSet<()>>>,
    stop: watch::Sender<bool>,
}

/// Spawns tasks onto a [`TaskTracker`] without keeping it alive, and
/// tells whether the engine is stopping.
#[derive(Debug, Clone)]
pub(crate) struct Spawner {
    tasks: Weak<Mutex<JoinSet<()>>>,
    stop: watch::Receiver<bool>,
}

fn lock(tasks: &Mutex<JoinSet<()>>) -> MutexGuard<'_, JoinSet<()>> {
    // Poison means a panic while spawning; the set itself stays valid.
    tasks.lock().unwrap_or_else(|e| e.into_inner())
}

impl TaskTracker {
    pub(crate) fn new() -> Self {
        TaskTracker {
            tasks: Arc::new(Mutex::new(JoinSet::new())),
            stop: watch::channel(false).0,
        }
    }

    pub(crate) fn spawner(&self) -> Spawner {
        Spawner {
            tasks: Arc::downgrade(&self.tasks),
            stop: self.stop.subscribe(),
        }
    }

    /// Signals every task to stop; no new delivery begins after it.
    pub(crate) fn signal_stop(&self) {
        // `send_replace` stores the value even while nobody subscribed.
        self.stop.send_replace(true);
    }

    /// Tasks not finished yet.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        let mut tasks = lock(&self.tasks);
        reap(&mut tasks);
        tasks.len()
    }
}

/// Drops finished tasks' results, logging panics.
fn reap(tasks: &mut JoinSet<()>) {
    while let Some(done) = tasks.try_join_next() {
        if let Err(error) = done
            && error.is_panic()
        {
            tracing::error!(%error, "an engine task panicked");
        }
    }
}

impl Spawner {
    /// Runs `task` until it ends or the tracker is dropped.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let Some(tasks) = self.tasks.upgrade() else {
            return;
        };
        let mut tasks = lock(&tasks);
        reap(&mut tasks);
        tasks.spawn(task);
    }

    /// Runs `task` like [`Spawner::spawn`]; the returned [`Joined`]
    /// resolves with its output, or `None` if it was aborted (the tracker
    /// went). A panic in `task` resumes in whoever awaits the result.
    pub(crate) fn spawn_joined<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> Joined<T> {
        let (sender, receiver) = oneshot::channel();
        self.spawn(async move {
            let result = AssertUnwindSafe(task).catch_unwind().await;
            let _ = sender.send(result);
        });
        Joined(receiver)
    }

    /// Whether the engine is stopping.
    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// A receiver of the stop signal (`true` once stopping).
    pub(crate) fn stop_receiver(&self) -> watch::Receiver<bool> {
        self.stop.clone()
    }
}

/// The output of a task of [`Spawner::spawn_joined`].
#[derive(Debug)]
pub(crate) struct Joined<T>(oneshot::Receiver<std::thread::Result<T>>);

impl<T> Joined<T> {
    /// The task's output; `None` if it was aborted.
    pub(crate) async fn join(self) -> Option<T> {
        match self.0.await {
            Ok(Ok(output)) => Some(output),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => None,
        }
    }
}

/// A pause in real time, for pacing the engine's own work (the recorder's
/// linger, retry pauses, polls, a worker's longest sleep). Event time is
/// read from the injected clock; pacing is not event time, and a test's
/// manual clock, which moves only when told, would stall it.
#[allow(clippy::disallowed_methods)] // pacing, not event time (see above)
pub(crate) fn pause(duration: std::time::Duration) -> tokio::time::Sleep {
    tokio::time::sleep(duration)
}

/// Ticks in real time, for the engine's periodic loops (membership,
/// retention); see [`pause`].
#[allow(clippy::disallowed_methods)] // pacing, not event time (see pause)
pub(crate) fn ticks(period: std::time::Duration) -> tokio::time::Interval {
    tokio::time::interval(period)
}

/// Resolves once `done` holds, checking it again at each signal of
/// `signal` (registered before each check, so no signal is missed).
pub(crate) async fn wait_until(signal: &Notify, done: impl Fn() -> bool) {
    loop {
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if done() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::TaskTracker;

    #[tokio::test]
    async fn dropping_the_tracker_aborts_its_tasks() {
        let tracker = TaskTracker::new();
        let spawner = tracker.spawner();
        let (held, mut released) = tokio::sync::mpsc::channel::<()>(1);
        spawner.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        assert_eq!(tracker.running(), 1);
        drop(tracker);
        // The task's future (and the sender it holds) is dropped.
        assert!(released.recv().await.is_none());
        // Spawned after the tracker went: dropped unstarted.
        let joined = spawner.spawn_joined(async { 1 });
        assert_eq!(joined.join().await, None);
    }

    #[tokio::test]
    async fn a_joined_task_answers_its_output() {
        let tracker = TaskTracker::new();
        let joined = tracker.spawner().spawn_joined(async { 7 });
        assert_eq!(joined.join().await, Some(7));
    }
}
