//! The API against its own OpenAPI document, fuzzed by an independent
//! tool: schemathesis (PyPI, pinned in `common::PYTHON_PACKAGES`) runs its
//! examples, coverage, fuzzing and stateful (links) phases against a real
//! `belfry serve` (debug build, temp data dir, loopback, a bootstrap admin
//! key) with three checks: no 5xx, every answer matches its schema, and
//! data that violates the schema is refused with a 4xx.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::process::Command;

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

    let report = dir.path().join("schemathesis-report");
    let workdir = dir.path().to_path_buf();
    let output = tokio::task::spawn_blocking({
        let schema = node.url("/openapi.json");
        let header = format!("Authorization: Bearer {}", admin.expose());
        move || {
            Command::new(&st)
                .arg("run")
                .arg(&schema)
                .args(["--header", &header])
                .args([
                    "--checks",
                    "not_a_server_error,response_schema_conformance,negative_data_rejection",
                ])
                .args(["--phases", "examples,coverage,fuzzing,stateful"])
                .args(["--max-examples", MAX_EXAMPLES])
                .args(["--workers", "1"])
                .args(["--seed", "20261125"])
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
            "schemathesis found contract violations ({}):\n{stdout}\n{stderr}",
            output.status
        );
    }
    // A run that tested nothing would also exit 0.
    assert!(
        stdout.contains("Fuzzing") && stdout.contains("passed"),
        "schemathesis did not test: {stdout}\n{stderr}"
    );
}
