//! Helpers shared by the process-level tests.

// Each test binary compiles this module and uses a subset of it.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the UNIX epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// `ms` as RFC 3339 UTC with milliseconds (`2030-01-31T04:00:30.250Z`).
pub fn rfc3339(ms: i64) -> String {
    belfry_core::Timestamp::from_millis(ms).to_rfc3339()
}

/// The packages the end-to-end tests take from PyPI, pinned so a release
/// cannot change a test (`scripts/test.sh` installs the same).
pub const PYTHON_PACKAGES: &[&str] = &[
    "standardwebhooks==1.1.0",
    "confluent-kafka==2.12.2",
    "prometheus-client==0.21.1",
    "schemathesis==4.32.5",
    "openapi-python-client==0.29.1",
];

/// A Python interpreter that imports `module` (one of [`PYTHON_PACKAGES`]'):
/// `$BELFRY_TEST_PYTHON`, else the test venv under the target folder, made
/// and filled here when missing. `None` (after a loud message naming
/// `unchecked`, what then goes untested) only when `python3` is not
/// installed at all. Found once per test binary: tests run in parallel.
pub fn test_python(module: &str, unchecked: &str) -> Option<std::path::PathBuf> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static FOUND: OnceLock<Mutex<HashMap<String, Option<std::path::PathBuf>>>> = OnceLock::new();
    let mut found = FOUND
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    found
        .entry(module.to_string())
        .or_insert_with(|| find_or_make_python(module, unchecked))
        .clone()
}

fn imports(python: &std::path::Path, module: &str) -> bool {
    std::process::Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn find_or_make_python(module: &str, unchecked: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    use std::process::Command;
    if let Some(python) = std::env::var_os("BELFRY_TEST_PYTHON") {
        let python = PathBuf::from(python);
        assert!(
            imports(&python, module),
            "BELFRY_TEST_PYTHON={} cannot import {module}",
            python.display()
        );
        return Some(python);
    }
    let venv = target_dir().join("belfry-test-venv");
    let python = venv.join("bin").join("python");
    if imports(&python, module) {
        return Some(python);
    }
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!(
            "\n!!!!!!!!\n!! SKIPPED: python3 is not installed, so {unchecked} was NOT checked\n\
             !! by an independent client. Install python3 (scripts/test.sh does) and\n\
             !! run the tests again.\n!!!!!!!!\n"
        );
        return None;
    }
    if !venv.join("bin").join("pip").is_file() {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            made,
            "python3 -m venv {} failed (Debian: apt-get install python3-venv)",
            venv.display()
        );
    }
    let installed = Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet"])
        .args(PYTHON_PACKAGES)
        .status()
        .is_ok_and(|status| status.success());
    assert!(installed, "pip install {PYTHON_PACKAGES:?} failed");
    assert!(
        imports(&python, module),
        "{} cannot import {module}",
        python.display()
    );
    Some(python)
}

/// The build's target folder: `CARGO_TARGET_DIR`, else the workspace's.
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Where a test keeps files for people to look at afterwards:
/// `target/test-artifacts/{name}`, created if missing.
pub fn test_artifacts(name: &str) -> std::path::PathBuf {
    let dir = target_dir().join("test-artifacts").join(name);
    std::fs::create_dir_all(&dir).expect("create the test artifacts folder");
    dir
}

/// `POST path` with a JSON `body` (40 s at most); `None` when the node
/// did not answer (killed, restarting).
pub async fn call(
    base: &str,
    path: &str,
    body: &serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    let response = belfry_testkit::http_client()
        .post(format!("{base}{path}"))
        .timeout(std::time::Duration::from_secs(40))
        .json(body)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await.ok()?;
    Some((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// The node's `GET /metrics` exposition text.
pub async fn scrape(node: &belfry_testkit::BelfryProcess) -> String {
    let response = belfry_testkit::http_client()
        .get(node.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// The value of the unlabelled sample or the sample with exactly these
/// labels, as the exposition text shows it.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}
