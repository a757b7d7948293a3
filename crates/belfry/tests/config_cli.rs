//! `belfry serve` refuses a bad configuration at start, as a real process:
//! exit code 2, the problem on stderr naming the key, nothing started.
//!
//! Each run points `--data-dir` at a regular file and listens on port 0, so
//! a configuration that were wrongly accepted makes the node fail at once
//! (it cannot open its store) instead of running: no test can hang.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `belfry serve` with `env` (and no other `BELFRY_*` variable) and
/// `extra` arguments.
fn serve(dir: &Path, env: &[(&str, &str)], extra: &[&str]) -> Output {
    let not_a_directory = dir.join("data-is-a-file");
    std::fs::write(&not_a_directory, b"").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_belfry"));
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&not_a_directory)
        .args(extra);
    for (name, _) in std::env::vars() {
        if name.starts_with("BELFRY_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("the belfry binary runs")
}

/// Asserts a configuration refusal and returns stderr.
fn refused(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        stderr.starts_with("belfry: invalid configuration: "),
        "{stderr}"
    );
    stderr
}

#[test]
fn an_unknown_nested_key_in_the_environment_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = refused(&serve(dir.path(), &[("BELFRY_ENGINE__TYPO", "1")], &[]));
    assert!(
        stderr.contains("unknown key engine.typo in environment variable BELFRY_ENGINE__TYPO"),
        "{stderr}"
    );
    let stderr = refused(&serve(
        dir.path(),
        &[("BELFRY_ENGINE__RETRY__FAST_RETRY", "5")],
        &[],
    ));
    assert!(
        stderr.contains("unknown key engine.retry.fast_retry in environment variable"),
        "{stderr}"
    );
}

#[test]
fn test_variables_are_not_config_keys() {
    let dir = tempfile::tempdir().unwrap();
    // Accepted, so the node gets as far as its (unusable) data directory.
    let output = serve(
        dir.path(),
        &[
            ("BELFRY_TEST_SOMETHING", "1"),
            ("BELFRY_LOG_FORMAT", "json"),
        ],
        &[],
    );
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(!logs.contains("invalid configuration"), "{logs}");
    assert!(logs.contains("cannot open the store"), "{logs}");
}

#[test]
fn zero_intervals_from_the_environment_are_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    for (variable, key) in [
        (
            "BELFRY_ENGINE__PURGE_INTERVAL_MS",
            "engine.purge_interval_ms",
        ),
        ("BELFRY_CLUSTER__TICK_MS", "cluster.tick_ms"),
        ("BELFRY_HTTP__REQUEST_TIMEOUT_MS", "http.request_timeout_ms"),
    ] {
        let stderr = refused(&serve(dir.path(), &[(variable, "0")], &[]));
        assert!(
            stderr.contains(&format!("{key} must be at least 1, not 0")),
            "{stderr}"
        );
    }
    let stderr = refused(&serve(
        dir.path(),
        &[("BELFRY_ENGINE__WINDOW_MS", "-5")],
        &[],
    ));
    assert!(
        stderr.contains(
            "engine.window_ms must not be negative, not -5 in environment variable \
             BELFRY_ENGINE__WINDOW_MS"
        ),
        "{stderr}"
    );
}

#[test]
fn a_bad_config_file_is_refused_with_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("belfry.toml");
    std::fs::write(
        &file,
        "[engine]\nwindow_mss = 5\n[engine.retry]\nmultiplier = 0.5\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let stderr = refused(&serve(dir.path(), &[], &["--config", file]));
    assert!(
        stderr.contains(&format!("unknown key engine.window_mss in {file}")),
        "{stderr}"
    );
    std::fs::write(
        file,
        "[engine]\npurge_interval_ms = 0\n[engine.retry]\nmultiplier = 0.5\n",
    )
    .unwrap();
    let stderr = refused(&serve(dir.path(), &[], &["--config", file]));
    assert!(
        stderr.contains("engine.purge_interval_ms must be at least 1, not 0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("engine.retry.multiplier must be a finite number of at least 1.0"),
        "{stderr}"
    );
}
