//! The engine's task tracker: every task of the engine is spawned here, so
//! dropping the [`crate::Engine`] stops all of them (a crash in tests is a
//! drop), and [`crate::Engine::shutdown`] can tell them to stop first.
//!
//! [`TaskTracker`] owns the tasks; components hold a [`Spawner`], which
//! does not keep them alive: a task spawned once the tracker is gone is
//! dropped unstarted. A task is dropped at its next wake-up after the
//! tracker goes; spawning costs two atomic counts and no lock, since a
//! task is spawned for every API write.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Owns every task of one engine; dropping it stops them.
#[derive(Debug)]
pub(crate) struct TaskTracker {
    /// Cancelled on drop: every task ends at its next wake-up.
    gone: CancellationToken,
    /// Counts the tasks still running.
    running: tokio_util::task::TaskTracker,
    stop: watch::Sender<bool>,
}

/// Spawns tasks onto a [`TaskTracker`] without keeping it alive, and
/// tells whether the engine is stopping.
#[derive(Debug, Clone)]
pub(crate) struct Spawner {
    gone: CancellationToken,
    running: tokio_util::task::TaskTracker,
    stop: watch::Receiver<bool>,
}

impl TaskTracker {
    pub(crate) fn new() -> Self {
        TaskTracker {
            gone: CancellationToken::new(),
            running: tokio_util::task::TaskTracker::new(),
            stop: watch::channel(false).0,
        }
    }

    pub(crate) fn spawner(&self) -> Spawner {
        Spawner {
            gone: self.gone.clone(),
            running: self.running.clone(),
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
        self.running.len()
    }
}

impl Drop for TaskTracker {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

impl Spawner {
    /// Runs `task` until it ends or the tracker is dropped. A panic ends
    /// only this task, and is logged.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        // Boxed before it is wrapped: the wrapper then moves a pointer, not
        // the task's (perhaps kilobytes of) state.
        let task = Box::pin(task);
        drop(self.spawn_joined(async move {
            if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
                let message = panic
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("(no message)");
                tracing::error!(panic = message, "an engine task panicked");
            }
        }));
    }

    /// Runs `task` like [`Spawner::spawn`]; the returned [`Joined`]
    /// resolves with its output, or `None` if it was stopped (the tracker
    /// went). A panic in `task` resumes in whoever awaits the result.
    pub(crate) fn spawn_joined<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> Joined<T> {
        let gone = self.gone.clone();
        // Boxed: a delivery's future is kilobytes, and the runtime would
        // copy it several times while spawning and polling it in place.
        let task = Box::pin(task);
        Joined(self.running.spawn(async move {
            tokio::select! {
                biased;
                () = gone.cancelled() => None,
                output = task => Some(output),
            }
        }))
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
pub(crate) struct Joined<T>(JoinHandle<Option<T>>);

impl<T> Joined<T> {
    /// The task's output; `None` if it was stopped.
    pub(crate) async fn join(self) -> Option<T> {
        match self.0.await {
            Ok(output) => output,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
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
