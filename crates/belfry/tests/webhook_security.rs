//! Webhook security against the real binary: Belfry's signed deliveries
//! accepted by an independent verifier (the `standardwebhooks` package from
//! PyPI, in a Python receiver), also during a secret rotation; and the
//! egress policy from the node's configuration.
//!
//! The verifier needs Python 3 with `standardwebhooks`: the interpreter
//! named by `BELFRY_TEST_PYTHON`, else a virtual environment this test
//! makes under `target/belfry-test-venv` (`pip install`, once).
//! `scripts/test.sh` makes sure `python3` exists; without it the test is
//! skipped with a loud message.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, get_json, post_json, put_json};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

mod common;
use common::{now_ms, rfc3339};

const DEADLINE: Duration = Duration::from_secs(60);
/// A Python interpreter with the independent verifier (`standardwebhooks`).
fn verifier_python() -> Option<PathBuf> {
    common::test_python("standardwebhooks", "Belfry's webhook signing")
}

/// The Python receiver: verifies each request with every secret in its
/// secrets file, answers 204 (all verify) or 400.
struct Verifier {
    child: tokio::process::Child,
    port: u16,
    secrets: PathBuf,
    log: PathBuf,
}

impl Verifier {
    async fn start(python: &Path, dir: &Path) -> Verifier {
        let secrets = dir.join("secrets.json");
        let log = dir.join("verified.jsonl");
        std::fs::write(&secrets, "[]").unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/support/standardwebhooks_receiver.py");
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .arg(&secrets)
            .arg(&log)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the Python receiver starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        tokio::time::timeout(DEADLINE, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("the receiver prints its port")
            .unwrap();
        let port = line.trim().parse().expect("a port");
        Verifier {
            child,
            port,
            secrets,
            log,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every later request must verify with each of `secrets`.
    fn require(&self, secrets: &[&str]) {
        std::fs::write(&self.secrets, serde_json::to_string(secrets).unwrap()).unwrap();
    }

    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn start_node(dir: &Path, env: &[(&str, &str)]) -> BelfryProcess {
    let mut launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"));
    for (key, value) in env {
        launch = launch.env(*key, *value);
    }
    BelfryProcess::start(launch).await.expect("belfry starts")
}

/// Schedules `id` for a moment ago and waits until it is `status`.
async fn fire(node: &BelfryProcess, tenant: &str, id: &str, status: &str) -> Value {
    let path = format!("/v1/tenants/{tenant}/events/{id}");
    let (code, body) = put_json(
        &node.url(&path),
        &json!({ "deliver_at": rfc3339(now_ms() - 1_000), "payload": "{\"n\":1}" }),
    )
    .await;
    assert!(code == 201 || code == 200, "{code}: {body}");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (_, event) = get_json(&node.url(&path)).await;
        if event["status"] == status {
            return event;
        }
        if tokio::time::Instant::now() > deadline {
            node.print_logs();
            panic!("{id} never {status}: {event}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn rotate(node: &BelfryProcess, tenant: &str, body: Value) -> String {
    let (code, answer) = post_json(
        &node.url(&format!("/v1/tenants/{tenant}/signing-secrets/rotate")),
        &body,
    )
    .await;
    assert_eq!(code, 200, "{answer}");
    answer["signing_secret"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_verifier_accepts_signed_deliveries_through_a_rotation() {
    let Some(python) = verifier_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let verifier = Verifier::start(&python, dir.path()).await;
    let node = start_node(dir.path(), &[]).await;

    let (code, created) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({ "sink": { "type": "http", "url": verifier.url() } }),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let first = created["signing_secret"].as_str().unwrap().to_string();

    verifier.require(&[&first]);
    fire(&node, "acme", "before", "delivered").await;

    // Rotation with the default overlap: both signatures; a receiver with
    // either secret accepts.
    let second = rotate(&node, "acme", json!({})).await;
    verifier.require(&[&first, &second]);
    fire(&node, "acme", "during", "delivered").await;

    // Rotation ending the old secret at once: the newest alone.
    let third = rotate(&node, "acme", json!({ "grace_period_secs": 0 })).await;
    verifier.require(&[&third]);
    fire(&node, "acme", "after", "delivered").await;

    // Control: a receiver holding a retired secret refuses (a 4xx: the
    // event fails), so the verifier really checks.
    verifier.require(&[&second]);
    let refused = fire(&node, "acme", "retired", "failed").await;
    assert!(
        refused["last_error"]
            .as_str()
            .unwrap()
            .starts_with("HTTP 400"),
        "{refused}"
    );

    let records = verifier.records();
    let signatures: Vec<(bool, u64)> = records
        .iter()
        .map(|r| {
            (
                r["verified"].as_bool().unwrap(),
                r["signatures"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        signatures,
        [(true, 1), (true, 2), (true, 1), (false, 1)],
        "{records:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_only_refuses_loopback_with_egress_blocked() {
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[("BELFRY_EGRESS__POLICY", "public-only")]).await;
    for (tenant, url) in [
        ("by-address", receiver.url("/hook")),
        (
            "by-name",
            receiver.base_url().replace("127.0.0.1", "localhost") + "/hook",
        ),
    ] {
        let (code, body) = put_json(
            &node.url(&format!("/v1/tenants/{tenant}")),
            &json!({ "sink": { "type": "http", "url": url } }),
        )
        .await;
        assert_eq!(code, 201, "{body}");
        let failed = fire(&node, tenant, "e", "failed").await;
        assert_eq!(failed["attempts"], 1, "permanent: {failed}");
        let (_, history) =
            get_json(&node.url(&format!("/v1/tenants/{tenant}/events/e/attempts"))).await;
        let error = history["attempts"][0]["error"].as_str().unwrap();
        assert!(error.starts_with("egress_blocked: "), "{error}");
        assert!(error.contains("loopback"), "{error}");
    }
    assert_eq!(receiver.count(), 0, "nothing reached the receiver");
}
