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
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

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
    // Registered while the policy allowed loopback; the node restarted
    // under public-only refuses the stored URLs at delivery, by address
    // and by a name that resolves to loopback.
    let tenants = [
        ("by-address", receiver.url("/hook")),
        (
            "by-name",
            receiver.base_url().replace("127.0.0.1", "localhost") + "/hook",
        ),
    ];
    let mut node = start_node(dir.path(), &[]).await;
    for (tenant, url) in &tenants {
        let (code, body) = put_json(
            &node.url(&format!("/v1/tenants/{tenant}")),
            &json!({ "sink": { "type": "http", "url": url } }),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    node.terminate().await;
    let node = start_node(dir.path(), &[("BELFRY_EGRESS__POLICY", "public-only")]).await;
    for (tenant, _) in &tenants {
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

// ---- A tenant key is no proxy into the node's network ----

/// `method url` with `key` as bearer and an optional JSON body: the status
/// and the answer's text.
async fn keyed(method: &str, url: &str, key: Option<&str>, body: Option<&Value>) -> (u16, String) {
    let client = belfry_testkit::http_client();
    let mut request = client.request(method.parse().unwrap(), url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.expect("the node answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// A node with keys (a bootstrap admin key) and the node's own default
/// egress policy; the admin key.
async fn keyed_node_with_default_egress(dir: &Path) -> (BelfryProcess, String) {
    let admin = belfry_core::auth::KeySecret::generate().unwrap();
    let admin = admin.expose().to_string();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.join("data"))
        .default_egress()
        .env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", &admin);
    let node = BelfryProcess::start(launch).await.expect("belfry starts");
    (node, admin)
}

/// A `write` key for `tenant`, made with the admin key.
async fn write_key(node: &BelfryProcess, admin: &str, tenant: &str) -> String {
    let (code, created) = keyed(
        "POST",
        &node.url("/v1/keys"),
        Some(admin),
        Some(&json!({ "role": "write", "tenant": tenant })),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    created["secret"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_key_cannot_aim_its_webhook_at_internal_addresses_by_default() {
    let receiver = Receiver::start().await;
    let port = receiver.addr().port();
    let dir = tempfile::tempdir().unwrap();
    let (node, admin) = keyed_node_with_default_egress(dir.path()).await;
    let (code, body) = keyed(
        "PUT",
        &node.url("/v1/tenants/acme"),
        Some(&admin),
        Some(&json!({ "sink": { "type": "http", "url": "http://hooks.example.com/x" } })),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let tenant = write_key(&node, &admin, "acme").await;

    // Loopback and private targets, literally and in every other spelling
    // that reaches them, through both registration routes.
    let internal = [
        (receiver.url("/hook"), "loopback"),
        (format!("http://localhost:{port}/hook"), "loopback"),
        (format!("http://app.localhost:{port}/hook"), "loopback"),
        (format!("http://[::1]:{port}/hook"), "loopback"),
        (format!("http://[::ffff:127.0.0.1]:{port}/hook"), "loopback"),
        (format!("http://0x7f.1:{port}/hook"), "loopback"),
        (format!("http://[64:ff9b::7f00:1]:{port}/hook"), "loopback"),
        (
            "http://10.1.2.3:2375/containers/json".to_string(),
            "private",
        ),
        ("http://192.168.1.1/".to_string(), "private"),
        ("http://100.64.0.1/".to_string(), "shared"),
        ("http://[fd00::1]/".to_string(), "unique local"),
    ];
    for (url, range) in &internal {
        let (code, answer) = keyed(
            "PUT",
            &node.url("/v1/tenants/acme"),
            Some(&tenant),
            Some(&json!({ "sink": { "type": "http", "url": url,
                "headers": { "Content-Type": "application/json" } } })),
        )
        .await;
        assert_eq!(code, 400, "{url}: {answer}");
        assert!(answer.contains("invalid_sink"), "{url}: {answer}");
        assert!(
            answer.contains("egress_blocked") && answer.contains(range),
            "{url}: says why: {answer}"
        );
        let (code, answer) = keyed(
            "POST",
            &node.url("/events/tenant/register"),
            Some(&tenant),
            Some(&json!({ "tenant": "acme", "type": "HTTP", "props": { "url": url } })),
        )
        .await;
        assert_eq!(code, 400, "BigBen {url}: {answer}");
        assert!(answer.contains("egress_blocked"), "{url}: {answer}");
    }
    // Nothing changed, and nothing was delivered.
    let (_, shown) = keyed("GET", &node.url("/v1/tenants/acme"), Some(&tenant), None).await;
    assert!(shown.contains("hooks.example.com"), "{shown}");
    let (code, _) = keyed(
        "PUT",
        &node.url("/v1/tenants/acme/events/probe"),
        Some(&tenant),
        Some(&json!({ "deliver_at": rfc3339(now_ms() + 3_600_000), "payload": "{}" })),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(receiver.count(), 0, "nothing reached the internal service");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_refused_and_malformed_urls_are_refused_at_registration() {
    // Under `internal` (the operator allowed the network): link-local,
    // metadata and the other always-refused ranges still are.
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    let refused = [
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://0.0.0.0:8080/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http:///x", "host"),
        ("http:///user:pass@host.example/x", "host"),
        ("http:\\\\host.example/x", "backslash"),
        ("http://host.example\\@evil.example/", "backslash"),
    ];
    for (url, why) in refused {
        for (path, body) in [
            (
                "/v1/tenants/acme",
                json!({ "sink": { "type": "http", "url": url } }),
            ),
            (
                "/events/tenant/register",
                json!({ "tenant": "acme", "type": "HTTP", "props": { "url": url } }),
            ),
        ] {
            let method = if path.starts_with("/v1") {
                "PUT"
            } else {
                "POST"
            };
            let (code, answer) = keyed(method, &node.url(path), None, Some(&body)).await;
            assert_eq!(code, 400, "{path} {url}: {answer}");
            assert!(answer.contains(why), "{path} {url}: says why: {answer}");
            assert!(!answer.contains("pass"), "{path} {url}: {answer}");
        }
    }
    let (_, tenants) = get_json(&node.url("/v1/tenants")).await;
    assert_eq!(tenants["tenants"], json!([]), "nothing registered");
    let logs = node.logs_tail(10_000);
    assert!(!logs.contains("user:pass"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_headers_that_steer_proxies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    for name in [
        "Host",
        "host",
        "Proxy-Authorization",
        "Proxy-Connection",
        "Forwarded",
        "X-Forwarded-For",
        "x-forwarded-host",
    ] {
        let headers = json!({ name: "admin.internal" });
        let (code, answer) = keyed(
            "PUT",
            &node.url("/v1/tenants/acme"),
            None,
            Some(
                &json!({ "sink": { "type": "http", "url": "http://hooks.example.com/",
                "headers": headers } }),
            ),
        )
        .await;
        assert_eq!(code, 400, "{name}: {answer}");
        assert!(answer.contains(name), "{name}: names it: {answer}");
        let (code, answer) = keyed(
            "POST",
            &node.url("/events/tenant/register"),
            None,
            Some(&json!({ "tenant": "acme", "type": "HTTP", "props": {
                "url": "http://hooks.example.com/", "headers": headers } })),
        )
        .await;
        assert_eq!(code, 400, "BigBen {name}: {answer}");
    }
    let (_, tenants) = get_json(&node.url("/v1/tenants")).await;
    assert_eq!(tenants["tenants"], json!([]), "nothing registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_answers_with_the_receivers_body() {
    // The operator allowed internal receivers (`internal`): even then a
    // dry run, `last_error`, the attempts and BigBen's `find` say how the
    // receiver answered, never what.
    const SECRET: &str = "internal-answer-4242";
    let receiver = Receiver::start().await;
    receiver.set_default(belfry_testkit::receiver::Response::status(500).with_body(SECRET));
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &[]).await;
    let (code, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, _) = put_json(
        &node.url("/v1/tenants/acme/events/later"),
        &json!({ "deliver_at": rfc3339(now_ms() + 3_600_000), "payload": "{}" }),
    )
    .await;
    assert_eq!(code, 201);
    for status in [500, 404, 200] {
        receiver.set_default(belfry_testkit::receiver::Response::status(status).with_body(SECRET));
        let before = receiver.count();
        let (code, answer) = keyed(
            "POST",
            &node.url("/events/dryrun?tenant=acme&id=later"),
            None,
            None,
        )
        .await;
        assert_eq!(code, 200, "{answer}");
        assert_eq!(receiver.count(), before + 1, "the dry run delivered");
        assert!(!answer.contains(SECRET), "dry run {status}: {answer}");
        if status != 200 {
            assert!(answer.contains(&format!("HTTP {status}")), "{answer}");
        }
    }
    receiver.set_default(belfry_testkit::receiver::Response::status(400).with_body(SECRET));
    let failed = fire(&node, "acme", "now", "failed").await;
    assert_eq!(failed["last_error"], "HTTP 400 Bad Request", "{failed}");
    for path in [
        "/v1/tenants/acme/events/now",
        "/v1/tenants/acme/events/now/attempts",
        "/events/find?tenant=acme&id=now",
    ] {
        let (_, answer) = keyed("GET", &node.url(path), None, None).await;
        assert!(!answer.contains(SECRET), "{path}: {answer}");
    }
    let logs = node.logs_tail(10_000);
    assert!(!logs.contains(SECRET), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loopback_node_delivers_to_loopback_until_it_has_keys() {
    // No keys on a loopback listener: only this machine's users, who may
    // do everything anyway, so the default allows loopback (the README's
    // tour). The first key closes it for good.
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let launch =
        BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("data")).default_egress();
    let node = BelfryProcess::start(launch).await.expect("belfry starts");
    let (code, body) = put_json(
        &node.url("/v1/tenants/acme"),
        &json!({ "sink": { "type": "http", "url": receiver.url("/hook") } }),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    fire(&node, "acme", "open", "delivered").await;
    assert_eq!(receiver.count(), 1);

    let (code, created) = keyed(
        "POST",
        &node.url("/v1/keys"),
        None,
        Some(&json!({ "role": "admin" })),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    let admin = created["secret"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (code, answer) = keyed(
            "PUT",
            &node.url("/v1/tenants/other"),
            Some(&admin),
            Some(&json!({ "sink": { "type": "http", "url": receiver.url("/hook") } })),
        )
        .await;
        if code == 400 {
            assert!(answer.contains("egress_blocked"), "{answer}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "loopback still accepted with keys: {code} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The tenant registered while open is refused at delivery now.
    let (code, _) = keyed(
        "PUT",
        &node.url("/v1/tenants/acme/events/keyed"),
        Some(&admin),
        Some(&json!({ "deliver_at": rfc3339(now_ms() - 1_000), "payload": "{}" })),
    )
    .await;
    assert_eq!(code, 201);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (_, event) = keyed(
            "GET",
            &node.url("/v1/tenants/acme/events/keyed"),
            Some(&admin),
            None,
        )
        .await;
        let event: Value = serde_json::from_str(&event).unwrap();
        if event["status"] == "failed" {
            let error = event["last_error"].as_str().unwrap();
            assert!(error.starts_with("egress_blocked: "), "{error}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{event}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.count(), 1, "nothing after the first key");
}
