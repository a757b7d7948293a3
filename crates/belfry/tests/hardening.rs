//! Smaller hardening, end to end against the real binary: removing a
//! tenant leaves nothing the next tenant of its name could inherit (keys,
//! events, schedules), on the embedded store and on PostgreSQL; wrongly
//! typed bodies are answered in the API's words on every body-taking
//! route; the data directory is private to its user.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

mod common;

use std::time::Duration;

use belfry_api::bodies::{BodyRoute, leaked_rust_name};
use belfry_testkit::postgres::PgServer;
use belfry_testkit::{BelfryLaunch, BelfryProcess, http_client};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_belfry");

/// `method url` with an optional JSON body and bearer key: status and body.
async fn send(method: &str, url: &str, key: Option<&str>, body: Option<Value>) -> (u16, Value) {
    let mut request = http_client().request(method.parse().unwrap(), url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn in_an_hour() -> String {
    common::rfc3339(common::now_ms() + 3_600_000)
}

/// Registers `acme`, gives it a key, an event and a schedule; removing it
/// is refused until it is empty; once removed, its key no longer works and
/// a new `acme` starts with nothing.
async fn tenant_removal_leaves_nothing_behind(node: &BelfryProcess) {
    let url = |path: &str| node.url(path);
    // An open node: the first key is created anonymously.
    let (status, admin) = send(
        "POST",
        &url("/v1/keys"),
        None,
        Some(json!({"role": "admin"})),
    )
    .await;
    assert_eq!(status, 201, "{admin}");
    let admin = admin["secret"].as_str().unwrap().to_string();
    let admin = Some(admin.as_str());
    let sink = json!({"sink": {"type": "builtin", "processor": "log"}});
    let (status, body) = send("PUT", &url("/v1/tenants/acme"), admin, Some(sink.clone())).await;
    assert_eq!(status, 201, "{body}");
    let (status, key) = send(
        "POST",
        &url("/v1/keys"),
        admin,
        Some(json!({"role": "write", "tenant": "acme"})),
    )
    .await;
    assert_eq!(status, 201, "{key}");
    let old_key = key["secret"].as_str().unwrap().to_string();
    let old_key = Some(old_key.as_str());
    let event = json!({"deliver_at": in_an_hour(), "payload": "secret of the old acme"});
    let (status, body) = send(
        "PUT",
        &url("/v1/tenants/acme/events/e1"),
        old_key,
        Some(event),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let schedule = json!({"expression": "0 0 * * *", "type": "UNIX"});
    let (status, body) = send(
        "PUT",
        &url("/v1/tenants/acme/schedules/s1"),
        admin,
        Some(schedule),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");

    // Refused while it holds an event or a schedule; nothing changes.
    let (status, body) = send("DELETE", &url("/v1/tenants/acme"), admin, None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "tenant_not_empty", "{body}");
    let (status, _) = send("GET", &url("/v1/tenants/acme/events/e1"), old_key, None).await;
    assert_eq!(status, 200);

    // Emptied through the API: the event cancelled and its record deleted,
    // the schedule deleted. Still refused while the schedule remains.
    let (status, body) = send("DELETE", &url("/v1/tenants/acme/events/e1"), admin, None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(
        "POST",
        &url("/v1/tenants/acme/events/e1/delete"),
        admin,
        None,
    )
    .await;
    assert!(status == 200 || status == 204, "{status} {body}");
    let (status, body) = send("DELETE", &url("/v1/tenants/acme"), admin, None).await;
    assert_eq!(status, 409, "the schedule is still there: {body}");
    let (status, body) = send("DELETE", &url("/v1/tenants/acme/schedules/s1"), admin, None).await;
    assert!(status == 200 || status == 204, "{status} {body}");
    let (status, body) = send("DELETE", &url("/v1/tenants/acme"), admin, None).await;
    assert_eq!(status, 204, "{body}");

    // The old key is revoked with its tenant, before any new acme exists.
    let (status, _) = send("GET", &url("/v1/tenants/acme/events"), old_key, None).await;
    assert_eq!(status, 401);
    let (status, body) = send("PUT", &url("/v1/tenants/acme"), admin, Some(sink)).await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = send("GET", &url("/v1/tenants/acme/events"), old_key, None).await;
    assert_eq!(status, 401, "an old key works for the new tenant");
    let (status, listed) = send("GET", &url("/v1/tenants/acme/events"), admin, None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["events"], json!([]), "{listed}");
    let (status, listed) = send("GET", &url("/v1/tenants/acme/schedules"), admin, None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["schedules"], json!([]), "{listed}");
    let (status, keys) = send("GET", &url("/v1/keys"), admin, None).await;
    assert_eq!(status, 200);
    let tenants: Vec<&Value> = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| &k["tenant"])
        .collect();
    assert_eq!(
        tenants,
        [&Value::Null],
        "only the admin key is left: {keys}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_tenant_leaves_nothing_for_its_successor_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(BelfryLaunch::new(BIN, dir.path().join("data")))
        .await
        .expect("belfry starts");
    tenant_removal_leaves_nothing_behind(&node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_tenant_leaves_nothing_for_its_successor_postgres() {
    let url = PgServer::shared().fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let launch = BelfryLaunch::new(BIN, dir.path().join("unused"))
        .arg("--database-url")
        .arg(url);
    let node = BelfryProcess::start(launch).await.expect("belfry starts");
    tenant_removal_leaves_nothing_behind(&node).await;
}

/// Bodies of the wrong types for every field a route reads, or of the
/// wrong JSON type altogether.
fn wrongly_typed_bodies() -> Vec<Value> {
    let mut bodies = vec![
        json!([]),
        json!("text"),
        json!(7),
        json!(null),
        json!({"events": [{"id": "a", "deliver_at": 5, "max_attempts": "x"}]}),
        json!([{"id": 1, "eventTime": 2, "tenant": 3, "mode": 4}]),
        json!({"leases": [{"lease_id": 5, "result": 6}]}),
    ];
    let fields = [
        "tenant",
        "id",
        "expression",
        "type",
        "timeZone",
        "payload",
        "deliveryOption",
        "startAt",
        "endAt",
        "maxOccurrences",
        "misfire",
        "catchUpWindowMs",
        "sink",
        "props",
        "deliver_at",
        "delivery",
        "queue",
        "max_attempts",
        "backoff",
        "expression",
        "time_zone",
        "start_at",
        "end_at",
        "max_occurrences",
        "catch_up_window_ms",
        "paused",
        "action",
        "filter",
        "worker_id",
        "max_events",
        "lease_ms",
        "wait_ms",
        "queues",
        "extend_ms",
        "result",
        "error",
        "retry_after_ms",
        "delay_ms",
        "role",
        "expires_at",
        "keep_previous",
        "events",
        "leases",
    ];
    for wrong in [
        json!("text"),
        json!(-1),
        json!(1.5),
        json!(true),
        json!([1]),
        json!({"a": 1}),
        json!(18446744073709551616u128 as f64),
    ] {
        bodies.push(Value::Object(
            fields
                .iter()
                .map(|f| (f.to_string(), wrong.clone()))
                .collect(),
        ));
        for field in fields {
            bodies.push(json!({ field: wrong }));
        }
    }
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrongly_typed_bodies_are_answered_in_the_apis_words_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let node = BelfryProcess::start(BelfryLaunch::new(BIN, dir.path().join("data")))
        .await
        .expect("belfry starts");
    let sink = json!({"sink": {"type": "builtin", "processor": "log"}});
    let (status, _) = send("PUT", &node.url("/v1/tenants/t"), None, Some(sink)).await;
    assert_eq!(status, 201);
    let bodies = wrongly_typed_bodies();
    let mut refused = 0;
    for route in BodyRoute::ALL {
        let (method, path) = route.method_and_path();
        for body in &bodies {
            let (status, answer) = send(method, &node.url(path), None, Some(body.clone())).await;
            let text = answer.to_string();
            assert!(status < 500, "{method} {path} {body}: {status} {text}");
            let input = body.to_string();
            assert_eq!(
                leaked_rust_name(&text, input.as_bytes()),
                None,
                "{method} {path} with {input} answered {status} {text}"
            );
            if status == 400 {
                refused += 1;
            }
        }
    }
    // The bodies are wrong: most must be refused for the check to mean much.
    assert!(
        refused > bodies.len() * BodyRoute::ALL.len() / 2,
        "{refused} refused"
    );
}

/// Every file and folder under `dir` that group or others may access.
fn open_to_others(dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut open = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            open.push(format!("{} {mode:04o}", path.display()));
        }
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_and_its_files_are_private_to_their_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A new data directory: created 0700, every file inside owner-only.
    let data = dir.path().join("new");
    let mut node = BelfryProcess::start(BelfryLaunch::new(BIN, &data))
        .await
        .expect("belfry starts");
    let sink = json!({"sink": {"type": "builtin", "processor": "log"}});
    let (status, _) = send("PUT", &node.url("/v1/tenants/t"), None, Some(sink)).await;
    assert_eq!(status, 201);
    let event = json!({"deliver_at": in_an_hour(), "payload": "private"});
    let (status, _) = send(
        "PUT",
        &node.url("/v1/tenants/t/events/e"),
        None,
        Some(event),
    )
    .await;
    assert_eq!(status, 201);
    node.terminate().await;
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "data directory mode {mode:04o}");
    assert_eq!(open_to_others(&data), Vec::<String>::new());

    // An existing directory open to others (as earlier versions made
    // them): tightened to 0700 at start, with a warning.
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut node = BelfryProcess::start(BelfryLaunch::new(BIN, &old))
        .await
        .expect("belfry starts");
    let mode = std::fs::metadata(&old).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "data directory mode {mode:04o}");
    let logs = node.logs_tail(200);
    assert!(logs.contains("accessible to other local users"), "{logs}");
    node.terminate().await;
}

/// Kafka ingestion that does not say which tenants its topics may schedule
/// for is refused at start: whoever may write a topic would otherwise
/// schedule for every tenant. (Refused before any broker is contacted.)
#[tokio::test]
async fn kafka_ingestion_without_allowed_tenants_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let run = async |allowed: &str| {
        let config = dir.path().join("belfry.toml");
        std::fs::write(
            &config,
            format!(
                "[kafka.ingest]\n\
                 bootstrap_servers = \"127.0.0.1:1\"\n\
                 topics = [\"requests\"]\n\
                 dead_letter_topic = \"requests-dlq\"\n\
                 {allowed}"
            ),
        )
        .unwrap();
        // An invalid configuration exits before serving; a node that serves
        // instead is killed when the timeout drops it (`kill_on_drop`).
        let child = tokio::process::Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let output = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .ok()?
            .unwrap();
        Some((
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    };
    let (code, stderr) = run("").await.expect("refused at start, not served");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("kafka.ingest.allowed_tenants") && stderr.contains("must list the tenants"),
        "{stderr}"
    );
    let (code, stderr) = run("allowed_tenants = [\"*\", \"acme\"]\n")
        .await
        .expect("refused");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be combined"), "{stderr}");
}
