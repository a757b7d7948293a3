//! The API against its own OpenAPI document, fuzzed by an independent
//! tool: schemathesis (PyPI, pinned in `common::PYTHON_PACKAGES`) runs its
//! examples, coverage, fuzzing and stateful (links) phases against a real
//! `belfry serve` (debug build, temp data dir, loopback, a bootstrap admin
//! key) with all its default checks: among them no 5xx, every answer
//! matches its schema, data that violates the schema is refused with a
//! 4xx, and data the schema allows is accepted (a 2xx, or a 404 or 409
//! for what does not exist or conflicts).
//!
//! The few refusals no schema can express (BigBen's answer for an
//! unregistered tenant, an expression that does not parse, …) are
//! allowed per operation in `tests/support/schemathesis.toml`, each with
//! its reason.
//!
//! The seed is `BELFRY_TEST_SEED` when set, else taken from the clock;
//! it is printed, so a failure replays with that variable.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use belfry_core::auth::KeySecret;
use belfry_testkit::{BelfryLaunch, BelfryProcess};

mod common;

/// Test cases per operation and phase: enough to find what the first
/// runs found, bounded so the run takes a few minutes on two cores.
const MAX_EXAMPLES: &str = "20";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_its_openapi_contract_under_schemathesis() {
    let Some(python) = common::test_python("schemathesis", "the OpenAPI contract") else {
        return;
    };
    let st = python.with_file_name("st");
    assert!(st.is_file(), "no schemathesis CLI at {}", st.display());

    let dir = tempfile::tempdir().unwrap();
    let admin = KeySecret::generate().unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"))
        .env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", admin.expose());
    let node = BelfryProcess::start(launch).await.expect("node starts");

    let seed = std::env::var("BELFRY_TEST_SEED").unwrap_or_else(|_| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        (now.as_nanos() % 1_000_000_007).to_string()
    });
    eprintln!("schemathesis seed: {seed} (replay with BELFRY_TEST_SEED={seed})");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/schemathesis.toml");
    let report = dir.path().join("schemathesis-report");
    let workdir = dir.path().to_path_buf();
    let output = tokio::task::spawn_blocking({
        let schema = node.url("/openapi.json");
        let header = format!("Authorization: Bearer {}", admin.expose());
        let seed = seed.clone();
        move || {
            Command::new(&st)
                .arg("--config-file")
                .arg(&config)
                .arg("run")
                .arg(&schema)
                .args(["--header", &header])
                .args(["--phases", "examples,coverage,fuzzing,stateful"])
                .args(["--max-examples", MAX_EXAMPLES])
                .args(["--workers", "1"])
                .args(["--seed", &seed])
                .args(["--request-timeout", "20"])
                .arg("--no-shrink")
                .args(["--output-truncate", "true"])
                .arg("--report-dir")
                .arg(&report)
                // schemathesis keeps a cache in its working directory: keep
                // it out of the source tree.
                .current_dir(&workdir)
                // No colours in the captured output.
                .env("NO_COLOR", "1")
                .output()
                .expect("schemathesis runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    if !output.status.success() {
        node.print_logs();
        panic!(
            "schemathesis found contract violations with seed {seed} ({}):\n{stdout}\n{stderr}",
            output.status
        );
    }
    // A run that tested nothing would also exit 0.
    assert!(
        stdout.contains("Fuzzing") && stdout.contains("passed"),
        "schemathesis did not test: {stdout}\n{stderr}"
    );
}
