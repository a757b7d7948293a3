//! API keys end to end with the real binary: `belfry keys` on a data
//! directory and on PostgreSQL, a node that then requires them, the
//! bootstrap key from the environment, and the refusal to serve a public
//! address without keys.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

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

/// The sum of a counter's samples in a `/metrics` text, by `result` label
/// when given (0 when absent).
fn counter_sum(metrics: &str, name: &str, result: Option<&str>) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| result.is_none_or(|r| line.contains(&format!("result=\"{r}\""))))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metrics_text(node: &BelfryProcess, admin: &str) -> String {
    let answer = http_client()
        .get(node.url("/metrics"))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.text().await.unwrap()
}

/// Made-up keys each cost a store read and evicted the valid keys from
/// the cache. Now a flood of them costs at most the node's budget of
/// reads per second, and a valid key keeps answering from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_made_up_keys_costs_bounded_store_reads() {
    const CONNECTIONS: usize = 8;
    const BUDGET_PER_SECOND: f64 = 50.0;
    const TTL_MS: f64 = 5_000.0;
    let flood: usize = std::env::var("BELFRY_TEST_KEY_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let url = PgServer::shared().fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let admin = belfry_core::auth::KeySecret::generate().unwrap();
    let admin = admin.expose().to_string();
    let node = BelfryProcess::start(
        BelfryLaunch::new(BIN, dir.path().join("unused"))
            .arg("--database-url")
            .arg(url.as_str())
            .env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", &admin)
            .env("BELFRY_AUTH__KEY_CACHE_TTL_MS", "5000"),
    )
    .await
    .expect("node starts");
    // A tenant key made through the node, besides the bootstrap key.
    let created: Value = http_client()
        .post(node.url("/v1/keys"))
        .bearer_auth(&admin)
        .json(&serde_json::json!({ "tenant": "acme", "role": "read" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reader = created["secret"].as_str().unwrap().to_string();
    let reads_before = counter_sum(
        &metrics_text(&node, &admin).await,
        "belfry_auth_key_reads_total",
        None,
    );

    let started = std::time::Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flooders = Vec::new();
    for connection in 0..CONNECTIONS {
        let target = node.url("/v1/tenants");
        let count = flood / CONNECTIONS + usize::from(connection < flood % CONNECTIONS);
        flooders.push(tokio::spawn(async move {
            let client = http_client();
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            for _ in 0..count {
                let key = belfry_core::auth::KeySecret::generate().unwrap();
                let status = client
                    .get(&target)
                    .bearer_auth(key.expose())
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16();
                *statuses.entry(status).or_default() += 1;
            }
            statuses
        }));
    }
    // Meanwhile the valid keys, one request at a time, on a thread of
    // their own so the flood's tasks do not delay the measurement.
    let valid = {
        let stop = stop.clone();
        let (admin_url, reader_url) =
            (node.url("/v1/tenants"), node.url("/v1/tenants/acme/events"));
        let (admin, reader) = (admin.clone(), reader.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let client = http_client();
                let mut latencies = Vec::new();
                let mut refused = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (url, key) in [(&admin_url, &admin), (&reader_url, &reader)] {
                        let sent = std::time::Instant::now();
                        let status = client
                            .get(url.as_str())
                            .bearer_auth(key)
                            .send()
                            .await
                            .unwrap()
                            .status()
                            .as_u16();
                        latencies.push(sent.elapsed());
                        if status != 200 {
                            refused.push(status);
                        }
                    }
                }
                (latencies, refused)
            })
        })
    };
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for flooder in flooders {
        for (status, count) in flooder.await.unwrap() {
            *statuses.entry(status).or_default() += count;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut latencies, refused) = valid.join().unwrap();

    let metrics = metrics_text(&node, &admin).await;
    let reads = counter_sum(&metrics, "belfry_auth_key_reads_total", None) - reads_before;
    let shed = counter_sum(&metrics, "belfry_auth_key_lookups_shed_total", None);
    latencies.sort();
    let quantile = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    println!(
        "{flood} made-up keys over {CONNECTIONS} connections in {elapsed:.1} s \
         ({:.0} req/s): statuses {statuses:?}; store reads {reads} ({:.1}/s), \
         shed {shed}; valid keys: {} requests, p50 {:?}, p99 {:?}, max {:?}",
        flood as f64 / elapsed,
        reads / elapsed,
        latencies.len(),
        quantile(0.5),
        quantile(0.99),
        latencies.last().unwrap(),
    );
    // Every made-up key is refused: 401 once read, 503 while the budget
    // is spent.
    assert_eq!(
        statuses.get(&401).copied().unwrap_or(0) + statuses.get(&503).copied().unwrap_or(0),
        flood,
        "{statuses:?}"
    );
    // The bound: the budget (one second's worth at once, then the rate),
    // plus one re-read per known key (2) per TTL.
    let bound = BUDGET_PER_SECOND * (elapsed + 1.0) + 2.0 * (elapsed * 1000.0 / TTL_MS + 1.0);
    assert!(
        reads <= bound,
        "{reads} store reads in {elapsed:.1} s, more than the bound {bound:.0}"
    );
    // The valid keys never left the cache: re-read only when their entry
    // aged, never refused.
    assert!(refused.is_empty(), "valid keys refused: {refused:?}");
    let found = counter_sum(&metrics, "belfry_auth_key_reads_total", Some("found"));
    assert!(
        found <= 2.0 * (elapsed * 1000.0 / TTL_MS + 2.0),
        "valid keys read {found} times in {elapsed:.1} s"
    );
}

/// A raw HTTP/1.0 request, as nginx's default `proxy_pass` sends it; the
/// status code.
async fn http10(port: u16, method: &str, path: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

/// A same-host reverse proxy made every internet client an admin of an
/// open node (no key yet, loopback): it could mint an admin key. Now
/// what came through a proxy is refused, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_mode_refuses_requests_that_came_through_a_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(BelfryLaunch::new(BIN, dir.path().join("data")))
        .await
        .expect("belfry starts");
    let host = format!("127.0.0.1:{}", node.port());
    let admin_key = serde_json::json!({ "tenant": null, "role": "admin" });
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.7"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "belfry.example"),
        ("forwarded", "for=203.0.113.7"),
        ("x-real-ip", "203.0.113.7"),
        ("via", "1.1 proxy"),
    ] {
        let answer = http_client()
            .post(node.url("/v1/keys"))
            .header("host", &host)
            .header(name, value)
            .json(&admin_key)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 403, "{name}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["error"]["code"], "proxied_request_refused", "{name}");
    }
    // nginx's default: HTTP/1.0, Host 127.0.0.1:PORT, no other marker.
    assert_eq!(
        http10(node.port(), "POST", "/v1/keys", &admin_key.to_string()).await,
        403
    );
    // A Host that is not a loopback name.
    let answer = http_client()
        .post(node.url("/v1/keys"))
        .header("host", format!("evil.example:{}", node.port()))
        .json(&admin_key)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    // Nothing was created: the node is still open, without a key.
    let (status, keys) = belfry_testkit::get_json(&node.url("/v1/keys")).await;
    assert_eq!(status, 200);
    assert_eq!(keys["keys"], serde_json::json!([]), "{keys}");
    // A client on this machine still gets in, by every loopback name.
    for name in ["localhost", "127.0.0.1", "127.0.0.2"] {
        let answer = http_client()
            .get(node.url("/v1/tenants"))
            .header("host", format!("{name}:{}", node.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{name}");
    }
}

/// `auth.mode = "none"` served any `Host`, so a page whose name was made to
/// resolve to the node (DNS rebinding) could drive it from a browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_auth_mode_refuses_foreign_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(
        BelfryLaunch::new(BIN, dir.path().join("data")).arg("--insecure-no-auth"),
    )
    .await
    .expect("belfry starts");
    let with_host = |host: String| {
        let url = node.url("/v1/tenants");
        async move {
            http_client()
                .get(url)
                .header("host", host)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let port = node.port();
    assert_eq!(with_host(format!("rebound.evil.example:{port}")).await, 403);
    let answer = http_client()
        .post(node.url("/v1/tenants/acme"))
        .header("host", "rebound.evil.example")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    // Loopback names and addresses (a rebinding page has a name, not an
    // address) are served.
    for host in ["localhost", "127.0.0.1", "10.1.2.3", "[::1]"] {
        assert_eq!(with_host(format!("{host}:{port}")).await, 200, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_cache_ttl_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_serve(
        dir.path(),
        &format!("127.0.0.1:{}", free_port()),
        &[],
        &[("BELFRY_AUTH__KEY_CACHE_TTL_MS", "86400000")],
    );
    let exit = exited(&mut child, dir.path()).await;
    assert_eq!(exit.code(), Some(2), "{}", logs(dir.path()));
    let output = logs(dir.path());
    assert!(output.contains("auth.key_cache_ttl_ms"), "{output}");
}

/// A revoked bootstrap key was stored again at the next start (it is
/// still in the configuration). Now it stays revoked, and its revocation
/// holds at once on the node that revoked it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_bootstrap_key_stays_revoked_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = belfry_core::auth::KeySecret::generate().unwrap();
    let bootstrap = bootstrap.expose();
    let mut node = BelfryProcess::start(
        BelfryLaunch::new(BIN, dir.path().join("data"))
            .env("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", bootstrap)
            .env("BELFRY_AUTH__KEY_CACHE_TTL_MS", "60000"),
    )
    .await
    .expect("belfry starts");
    let tenants = node.url("/v1/tenants");
    assert_eq!(status(&tenants, Some(bootstrap)).await, 200);
    // The operator's own admin key replaces the bootstrap one.
    let created: Value = http_client()
        .post(node.url("/v1/keys"))
        .bearer_auth(bootstrap)
        .json(&serde_json::json!({ "tenant": null, "role": "admin" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let admin = created["secret"].as_str().unwrap().to_string();
    let (_, me) = {
        let answer = http_client()
            .get(node.url("/v1/whoami"))
            .bearer_auth(bootstrap)
            .send()
            .await
            .unwrap();
        (answer.status(), answer.json::<Value>().await.unwrap())
    };
    let bootstrap_id = me["key_id"].as_str().unwrap().to_string();
    let revoked = http_client()
        .delete(node.url(&format!("/v1/keys/{bootstrap_id}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 204);
    // At once here, although the cache TTL is a minute.
    assert_eq!(status(&tenants, Some(bootstrap)).await, 401);
    node.restart().await.expect("belfry restarts");
    assert_eq!(status(&tenants, Some(bootstrap)).await, 401);
    assert_eq!(status(&tenants, Some(&admin)).await, 200);
    assert!(
        node.logs_tail(1_000)
            .contains("auth.bootstrap_admin_key was revoked"),
        "{}",
        node.logs_tail(200)
    );
}
