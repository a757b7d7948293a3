//! Who holds a data directory. fjall locks the directory's `lock` file and,
//! when another process holds it, answers only `Locked`; the holder writes
//! its pid beside the lock so that the refusal can name it.

use std::path::{Path, PathBuf};

/// The holder's pid, beside fjall's `lock` file. Written after the lock is
/// taken and removed when the store closes; only read when the lock fails.
const OWNER_PID_FILE: &str = "belfry.pid";

pub(super) fn pid_file(data_dir: &Path) -> PathBuf {
    data_dir.join(OWNER_PID_FILE)
}

/// Records this process as the directory's holder. Best effort: without
/// the file a second process still cannot open the directory; it just
/// cannot say who holds it.
pub(super) fn record(data_dir: &Path) {
    let path = pid_file(data_dir);
    if let Err(error) = std::fs::write(&path, format!("{}\n", std::process::id())) {
        tracing::warn!(path = %path.display(), %error, "cannot record this process as the data directory's holder");
    }
}

/// Forgets the record (the store is closing, the lock about to go).
pub(super) fn forget(data_dir: &Path) {
    let _ = std::fs::remove_file(pid_file(data_dir));
}

/// The refusal when another process holds `data_dir`.
pub(super) fn in_use_message(data_dir: &Path) -> String {
    let holder = match holder_pid(data_dir) {
        Some(pid) => format!("another belfry process (pid {pid})"),
        None => "another process (its pid is not recorded)".to_string(),
    };
    format!(
        "the data directory {} is in use by {holder}; stop that process or use another data directory",
        data_dir.display()
    )
}

/// The recorded holder, if the record is readable and (where `/proc` tells)
/// names a running process: a record left by a killed holder is ignored.
fn holder_pid(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pid_file(data_dir)).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let proc_root = Path::new("/proc");
    if proc_root.is_dir() && !proc_root.join(pid.to_string()).exists() {
        return None;
    }
    Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_recorded_holder() {
        let dir = tempfile::tempdir().unwrap();
        record(dir.path());
        let message = in_use_message(dir.path());
        assert!(
            message.contains(&format!(
                "another belfry process (pid {})",
                std::process::id()
            )),
            "{message}"
        );
        forget(dir.path());
        assert!(in_use_message(dir.path()).contains("its pid is not recorded"));
    }

    #[test]
    fn an_unreadable_record_is_no_pid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(pid_file(dir.path()), "not a pid").unwrap();
        assert!(in_use_message(dir.path()).contains("its pid is not recorded"));
    }
}
