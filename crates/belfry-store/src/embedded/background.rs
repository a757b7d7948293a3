//! fjall's flush and compaction threads at a lower CPU priority.
//!
//! A compaction is seconds of CPU that may run at any later time; on a
//! busy node it competed with the fire path at the same priority, and a
//! delivery due meanwhile waited for a core (mixed firing and ingest on
//! two cores: 20–80 ms stalls while a compaction ran). At a higher nice
//! value these threads still get every idle cycle, and their share when
//! the cores are busy keeps them going, but a thread on the fire path
//! that wakes up gets the core first. The store's writer threads keep
//! the default priority: client answers wait on their commits.
//!
//! fjall starts its workers when the database opens and they inherit the
//! nice value of the thread that starts them, so the database is opened
//! on a short-lived thread whose own nice value was raised (on Linux the
//! nice value is per thread). Elsewhere the open runs unchanged.

/// How much nicer than the process fjall's workers run: at 10 a thread
/// weighs about a tenth of a default one when both want the same core.
pub const BACKGROUND_NICE_INCREMENT: i32 = 10;

/// Runs `open` on a new thread whose nice value is `increment` above the
/// caller's; threads it starts inherit that value.
pub(super) fn open_at_lower_priority<T: Send>(
    increment: i32,
    open: impl FnOnce() -> T + Send,
) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                lower_this_thread(increment);
                open()
            })
            .join()
    })
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_this_thread(increment: i32) {
    // SAFETY: gettid, getpriority and setpriority take and return plain
    // integers and touch no memory of this process. A failure (a nice
    // value already at its maximum, a sandbox refusing the call) leaves
    // the priority as it was, which is still correct, only less friendly.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        let current = libc::getpriority(libc::PRIO_PROCESS, tid);
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid, (current + increment).min(19));
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_thread(_increment: i32) {}

#[cfg(all(test, target_os = "linux"))]
#[allow(
    clippy::disallowed_methods,
    reason = "waits for real threads to name themselves"
)]
mod tests {
    use super::*;

    /// The nice value of one thread of this process, from `/proc`.
    fn nice_of(task: &std::path::Path) -> Option<i32> {
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        // Field 19 (nice) counts from the start of the line; the command
        // name (field 2) may hold spaces, so count after its `)`.
        let after_name = stat.rsplit_once(')')?.1;
        after_name.split_whitespace().nth(16)?.parse().ok()
    }

    /// Nice values of this process's threads whose name (as the kernel
    /// keeps it: the first 15 bytes) starts with `prefix`.
    fn nice_of_threads_named(prefix: &str) -> Vec<i32> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|comm| comm.trim().starts_with(prefix))
            })
            .filter_map(|task| nice_of(&task.path()))
            .collect()
    }

    /// [`nice_of_threads_named`] once at least `count` threads of that name
    /// exist, or what there is at `deadline`. `/proc` offers nothing to
    /// wait on, so this polls every 10 ms.
    fn nice_of_at_least_threads_named(
        name: &str,
        count: usize,
        deadline: std::time::Instant,
    ) -> Vec<i32> {
        loop {
            let found = nice_of_threads_named(name);
            if found.len() >= count || std::time::Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn threads_started_by_the_open_run_nicer_and_the_caller_does_not() {
        let own = nice_of(std::path::Path::new("/proc/thread-self")).unwrap();
        let (started, nice) = open_at_lower_priority(BACKGROUND_NICE_INCREMENT, || {
            let (tx, rx) = std::sync::mpsc::channel();
            let worker = std::thread::Builder::new()
                .name("bg-probe".into())
                .spawn(move || {
                    let nice = nice_of(std::path::Path::new("/proc/thread-self"));
                    tx.send(nice).unwrap();
                    std::thread::park();
                })
                .unwrap();
            (worker, rx.recv().unwrap())
        });
        assert_eq!(nice, Some((own + BACKGROUND_NICE_INCREMENT).min(19)));
        assert_eq!(
            nice_of_threads_named("bg-probe"),
            [(own + BACKGROUND_NICE_INCREMENT).min(19)]
        );
        let again = nice_of(std::path::Path::new("/proc/thread-self")).unwrap();
        assert_eq!(again, own, "the caller keeps its priority");
        started.thread().unpark();
        started.join().unwrap();
    }

    #[test]
    fn the_stores_compaction_threads_run_nicer_than_its_writers() {
        let dir = tempfile::tempdir().unwrap();
        let partitions = belfry_core::PartitionCount::new(4).unwrap();
        let store = crate::EmbeddedStore::open(crate::EmbeddedOptions::new(dir.path(), partitions))
            .unwrap();
        let own = nice_of(std::path::Path::new("/proc/thread-self")).unwrap();
        // A new thread names itself once it first runs: on a busy machine
        // that can be after the open returned.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let workers = nice_of_at_least_threads_named("fjall:worker", 3, deadline);
        assert!(workers.len() >= 3, "{workers:?}");
        let nicer = (own + BACKGROUND_NICE_INCREMENT).min(19);
        assert!(workers.iter().all(|n| *n == nicer), "{workers:?}");
        let writers = nice_of_at_least_threads_named("belfry-store-wr", 1, deadline);
        assert!(
            !writers.is_empty() && writers.iter().all(|n| *n == own),
            "{writers:?}"
        );
        drop(store);
    }
}
