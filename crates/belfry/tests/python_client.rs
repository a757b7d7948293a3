//! The README's "A two-minute tour", run by a Python client generated from
//! the node's own OpenAPI document: openapi-python-client (PyPI, pinned in
//! `common::PYTHON_PACKAGES`) writes the client from `GET /openapi.json`
//! into a temp dir, and `tests/support/readme_tour.py` takes every step of
//! the tour with it against a real `belfry serve` (debug build, temp data
//! dir, loopback, no keys, as the tour runs), asserting what the tour
//! shows. A document the generator cannot read, or a step the client
//! cannot express, fails here.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::path::Path;
use std::process::{Command, Output};

use belfry_testkit::{BelfryLaunch, BelfryProcess};

mod common;

/// The generated package's name.
const PACKAGE: &str = "belfry_client";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_python_client_runs_the_readme_tour() {
    let Some(python) = common::test_python("openapi_python_client", "the generated client") else {
        return;
    };
    let generator = python.with_file_name("openapi-python-client");
    assert!(
        generator.is_file(),
        "no openapi-python-client CLI at {}",
        generator.display()
    );

    let dir = tempfile::tempdir().unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data"));
    let node = BelfryProcess::start(launch).await.expect("node starts");

    let client_dir = dir.path().join("client");
    std::fs::create_dir_all(&client_dir).unwrap();
    let config = client_dir.join("generator.json");
    // No formatting hooks: the client is generated to be run, not read.
    std::fs::write(
        &config,
        format!(r#"{{"package_name_override": "{PACKAGE}", "post_hooks": []}}"#),
    )
    .unwrap();
    let generated = run_blocking({
        let mut command = Command::new(&generator);
        command
            .arg("generate")
            .args(["--url", &node.url("/openapi.json")])
            .args(["--meta", "none"])
            .arg("--config")
            .arg(&config)
            .arg("--output-path")
            .arg(client_dir.join(PACKAGE))
            .arg("--fail-on-warning")
            .current_dir(&client_dir)
            .env("NO_COLOR", "1");
        command
    })
    .await;
    check("openapi-python-client generate", &generated, &node);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/readme_tour.py");
    let toured = run_blocking({
        let mut command = Command::new(&python);
        command
            .arg(&script)
            .arg(node.base_url())
            .env("PYTHONPATH", &client_dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(&client_dir);
        command
    })
    .await;
    check("readme_tour.py", &toured, &node);
    let stdout = String::from_utf8_lossy(&toured.stdout);
    // A script that stopped early would also exit 0.
    assert!(
        stdout.contains("tour done"),
        "the tour did not finish: {stdout}"
    );
}

async fn run_blocking(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("the command runs"))
        .await
        .unwrap()
}

fn check(what: &str, output: &Output, node: &BelfryProcess) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{what}:\n{stdout}\n{stderr}");
    if !output.status.success() {
        node.print_logs();
        panic!("{what} failed ({}):\n{stdout}\n{stderr}", output.status);
    }
}
