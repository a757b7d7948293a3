//! API keys end to end with the real binary: `belfry keys` on a data
//! directory and on PostgreSQL, a node that then requires them, the
//! bootstrap key from the environment, and the refusal to serve a public
//! address without keys.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use belfry_testkit::postgres::PgServer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, free_port, http_client};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_belfry");
const DEADLINE: Duration = Duration::from_secs(30);

fn keys(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("keys")
        .args(args)
        .env_remove("BELFRY_DATABASE_URL")
        .env_remove("BELFRY_DATA_DIR")
        .output()
        .expect("run belfry keys")
}

fn json_of(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// `GET url` with an optional bearer key: the status.
async fn status(url: &str, key: Option<&str>) -> u16 {
    let mut request = http_client().get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap().status().as_u16()
}

/// Create, list and revoke against `store` (`--data-dir D` or
/// `--database-url U`); returns `(admin secret, acme key id, acme secret)`.
fn create_and_list(store: &[&str]) -> (String, String, String) {
    let admin = json_of(&keys(&[&["create", "--role", "admin"], store].concat()));
    assert_eq!(admin["role"], "admin");
    assert_eq!(admin["tenant"], Value::Null);
    let acme = json_of(&keys(
        &[
            &[
                "create",
                "--role",
                "write",
                "--tenant",
                "acme",
                "--expires-at",
                "2099-01-01T00:00:00Z",
            ],
            store,
        ]
        .concat(),
    ));
    assert_eq!(acme["tenant"], "acme");
    assert_eq!(acme["expires_at"], "2099-01-01T00:00:00Z");
    let listed = json_of(&keys(&[&["list"], store].concat()));
    let text = listed.to_string();
    assert_eq!(listed["keys"].as_array().unwrap().len(), 2, "{listed}");
    assert!(
        !text.contains("bfy_") && !text.contains("secret"),
        "{listed}"
    );
    // Bad input: exit 2, nothing stored.
    for bad in [
        &["create", "--role", "root"][..],
        &["create", "--role", "write"][..],
        &["create", "--role", "admin", "--tenant", "acme"][..],
        &[
            "create",
            "--role",
            "read",
            "--tenant",
            "acme",
            "--expires-at",
            "2001-01-01T00:00:00Z",
        ][..],
        &["revoke", "not-a-key"][..],
    ] {
        let output = keys(&[bad, store].concat());
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {output:?}");
    }
    let listed = json_of(&keys(&[&["list"], store].concat()));
    assert_eq!(listed["keys"].as_array().unwrap().len(), 2);
    (
        admin["secret"].as_str().unwrap().to_string(),
        acme["id"].as_str().unwrap().to_string(),
        acme["secret"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_keys_on_a_data_directory_then_the_node_requires_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap().to_string();
    let store = ["--data-dir", data_arg.as_str(), "--partitions", "4"];
    let (admin, acme_id, acme) = create_and_list(&store);

    let mut node = BelfryProcess::start(BelfryLaunch::new(BIN, &data))
        .await
        .expect("belfry starts");
    // The data directory is the node's now: the CLI says so.
    let locked = keys(&[&["list"][..], &store].concat());
    assert_eq!(locked.status.code(), Some(1), "{locked:?}");
    assert!(
        String::from_utf8_lossy(&locked.stderr).contains("in use by another belfry process"),
        "{locked:?}"
    );

    assert_eq!(status(&node.url("/v1/tenants"), None).await, 401);
    assert_eq!(status(&node.url("/v1/tenants"), Some(&admin)).await, 200);
    assert_eq!(
        status(&node.url("/v1/tenants/acme/events"), Some(&acme)).await,
        200
    );
    assert_eq!(
        status(&node.url("/v1/tenants/beta/events"), Some(&acme)).await,
        404
    );
    assert_eq!(status(&node.url("/v1/cluster"), Some(&acme)).await, 403);
    node.terminate().await;

    // Revoked with the node stopped: refused after the restart.
    let revoked = keys(&[&["revoke", acme_id.as_str()][..], &store].concat());
    assert!(revoked.status.success(), "{revoked:?}");
    let again = keys(&[&["revoke", acme_id.as_str()][..], &store].concat());
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    node.restart().await.expect("belfry restarts");
    assert_eq!(
        status(&node.url("/v1/tenants/acme/events"), Some(&acme)).await,
        401
    );
    assert_eq!(status(&node.url("/v1/tenants"), Some(&admin)).await, 200);
    // The audit log has the CLI's changes.
    let log: Value = http_client()
        .get(node.url("/v1/audit"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let actions: Vec<(&str, &str)> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["actor"].as_str().unwrap(), e["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actions,
        [
            ("cli", "key_created"),
            ("cli", "key_created"),
            ("cli", "key_revoked")
        ]
    );
    node.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_keys_on_postgresql() {
    let url = PgServer::shared().fresh_database().await;
    let store = ["--database-url", url.as_str()];
    let (_, acme_id, _) = create_and_list(&store);
    let revoked = keys(&[&["revoke", acme_id.as_str()][..], &store].concat());
    assert!(revoked.status.success(), "{revoked:?}");
    let listed = json_of(&keys(&[&["list"][..], &store].concat()));
    let ids: Vec<&str> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 1);
    assert_ne!(ids[0], acme_id);
}

/// `belfry serve` on `listen` with `data_dir`, its output in files.
fn spawn_serve(dir: &Path, listen: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    Command::new(BIN)
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(dir.join("data"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log("stdout.log"))
        .stderr(log("stderr.log"))
        .spawn()
        .expect("spawn belfry serve")
}

fn logs(dir: &Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    format!("{}{}", read("stdout.log"), read("stderr.log"))
}

/// Waits for `child` to exit (it must, within the deadline).
async fn exited(child: &mut Child, dir: &Path) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "belfry kept running: {}",
            logs(dir)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for `/ping` on `port` to answer while `child` runs.
async fn serving(child: &mut Child, dir: &Path, port: u16) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let ping = format!("http://127.0.0.1:{port}/ping");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("belfry exited with {status}: {}", logs(dir));
        }
        if http_client()
            .get(&ping)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not serving: {}",
            logs(dir)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_needs_a_key_or_an_explicit_no_auth() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let public = format!("0.0.0.0:{port}");

    // No key: refused, with the reason and the ways out.
    let mut child = spawn_serve(dir.path(), &public, &[], &[]);
    let exit = exited(&mut child, dir.path()).await;
    assert!(!exit.success());
    let output = logs(dir.path());
    assert!(output.contains("refusing to listen"), "{output}");
    assert!(output.contains("--insecure-no-auth"), "{output}");

    // Explicitly without authentication: serves, keyless.
    let mut child = spawn_serve(dir.path(), &public, &["--insecure-no-auth"], &[]);
    serving(&mut child, dir.path(), port).await;
    let url = format!("http://127.0.0.1:{port}/v1/tenants");
    assert_eq!(status(&url, None).await, 200);
    stop(&mut child);

    // A malformed bootstrap key is a configuration error (exit 2).
    let mut child = spawn_serve(
        dir.path(),
        &public,
        &[],
        &[("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", "bfy_not-a-key")],
    );
    assert_eq!(exited(&mut child, dir.path()).await.code(), Some(2));

    // A store that cannot be opened: exit 1.
    let unopenable = keys(&["create", "--role", "admin", "--data-dir", "/dev/null/x"]);
    assert_eq!(unopenable.status.code(), Some(1), "{unopenable:?}");

    // The bootstrap key from the environment: serves, and requires keys.
    let secret = belfry_core::auth::KeySecret::generate().unwrap();
    let mut child = spawn_serve(
        dir.path(),
        &public,
        &[],
        &[("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", secret.expose())],
    );
    serving(&mut child, dir.path(), port).await;
    assert_eq!(status(&url, None).await, 401);
    assert_eq!(status(&url, Some(secret.expose())).await, 200);
    stop(&mut child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_answers_or_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let secret = belfry_core::auth::KeySecret::generate().unwrap();
    let admin = secret.expose();
    let node = BelfryProcess::start(
        BelfryLaunch::new(BIN, dir.path().join("data"))
            .env("RUST_LOG", "debug")
            .env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", admin),
    )
    .await
    .expect("belfry starts");
    let client = http_client();
    // A webhook that refuses connections (port 9 on loopback), with
    // credentials in its URL and a secret header.
    let registered = client
        .post(node.url("/events/tenant/register"))
        .bearer_auth(admin)
        .json(
            &serde_json::json!({ "tenant": "acme", "type": "HTTP", "props": {
            "url": "http://hook-user:url-password-42@127.0.0.1:9/hook",
            "headers": { "Authorization": "Bearer header-secret-42" } } }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 200);
    let answer = registered.text().await.unwrap();
    let now = belfry_core::Timestamp::from_millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
    );
    let scheduled = client
        .post(node.url("/events/schedule"))
        .bearer_auth(admin)
        .json(&serde_json::json!([{ "id": "e1", "tenant": "acme",
            "eventTime": now.to_rfc3339(), "payload": "p" }]))
        .send()
        .await
        .unwrap();
    assert_eq!(scheduled.status(), 200);
    // Wait for a failed attempt: the delivery path has run and logged.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut answers = vec![answer];
    loop {
        let attempts: Value = client
            .get(node.url("/v1/tenants/acme/events/e1/attempts"))
            .bearer_auth(admin)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if attempts["attempts"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            answers.push(attempts.to_string());
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no attempt: {attempts}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for path in [
        "/events/tenants",
        "/v1/tenants/acme",
        "/v1/tenants/acme/events/e1",
    ] {
        let text = client
            .get(node.url(path))
            .bearer_auth(admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        answers.push(text);
    }
    let logs = node.logs_tail(100_000);
    assert!(
        logs.contains("DEBUG") || logs.contains("INFO"),
        "no logs captured"
    );
    for secret in ["url-password-42", "header-secret-42", admin] {
        assert!(!logs.contains(secret), "the log shows {secret}");
        for answer in &answers {
            assert!(
                !answer.contains(secret),
                "an answer shows {secret}: {answer}"
            );
        }
    }
}

/// `GET url` with a key until it answers `want` (within the deadline).
async fn until_status(url: &str, key: Option<&str>, want: u16) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let got = status(url, key).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} answered {got}, never {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_made_on_one_cluster_node_hold_on_the_others() {
    let url = PgServer::shared().fresh_database().await;
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let launch = BelfryLaunch::new(BIN, dir.path().join("unused"))
            .arg("--database-url")
            .arg(url.as_str())
            .env("BELFRY_AUTH__KEY_CACHE_TTL_MS", "200");
        nodes.push(BelfryProcess::start(launch).await.expect("node starts"));
        dirs.push(dir);
    }
    let (a, b) = (&nodes[0], &nodes[1]);
    // Both open (loopback, no key), until node A makes the first key.
    assert_eq!(status(&b.url("/v1/tenants"), None).await, 200);
    let created: Value = http_client()
        .post(a.url("/v1/keys"))
        .json(&serde_json::json!({ "tenant": null, "role": "admin" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let admin = created["secret"].as_str().unwrap().to_string();
    // B closes within its open-mode recheck (1 s) and takes A's key.
    until_status(&b.url("/v1/tenants"), None, 401).await;
    assert_eq!(status(&b.url("/v1/tenants"), Some(&admin)).await, 200);
    // A tenant key made through B, revoked through A: B refuses it within
    // its cache TTL.
    let tenant_key: Value = http_client()
        .post(b.url("/v1/keys"))
        .bearer_auth(&admin)
        .json(&serde_json::json!({ "tenant": "acme", "role": "read" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = tenant_key["secret"].as_str().unwrap();
    let events = |node: &BelfryProcess| node.url("/v1/tenants/acme/events");
    assert_eq!(status(&events(b), Some(secret)).await, 200);
    assert_eq!(status(&events(a), Some(secret)).await, 200);
    let revoked = http_client()
        .delete(a.url(&format!("/v1/keys/{}", tenant_key["id"].as_str().unwrap())))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 204);
    assert_eq!(status(&events(a), Some(secret)).await, 401);
    until_status(&events(b), Some(secret), 401).await;
}
