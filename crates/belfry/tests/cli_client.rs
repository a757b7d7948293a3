//! The command-line client (`belfry events|tenants|schedules|dead|bulk|cluster`)
//! against a real node and a real webhook receiver: the real binary, its
//! output and its exit codes.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::process::Output;
use std::time::{Duration, Instant};

use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver, Response, Rule, free_port};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_belfry");

/// Generous bounds: tests check behaviour, benchmarks measure speed.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `belfry ARGS` against `url`, with neither `BELFRY_URL` nor
/// `BELFRY_KEY` leaking in from the test's environment.
async fn belfry(url: &str, args: &[&str]) -> Output {
    belfry_with_env(url, args, &[]).await
}

async fn belfry_with_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("BELFRY_URL")
        .env_remove("BELFRY_KEY")
        .env("BELFRY_URL", url)
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run belfry")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts exit 0 and returns stdout.
fn ok(output: &Output, what: &str) -> String {
    assert_eq!(
        output.status.code(),
        Some(0),
        "{what}: stdout {:?} stderr {:?}",
        stdout(output),
        stderr(output)
    );
    stdout(output)
}

/// Asserts exit 0 and that stdout is JSON; returns it.
fn ok_json(output: &Output, what: &str) -> Value {
    let text = ok(output, what);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text:?}"))
}

async fn start_node(dir: &std::path::Path, env: &[(&str, &str)]) -> BelfryProcess {
    let mut launch = BelfryLaunch::new(BIN, dir.join("data"));
    for (k, v) in env {
        launch = launch.env(*k, *v);
    }
    BelfryProcess::start(launch).await.expect("belfry starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_scheduled_delivered_listed_and_cancelled_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path(), &[]).await;
    let url = node.base_url();
    let tenant = "shop/orders";

    // A name with a `/` is one path segment: the client encodes it.
    let hook = receiver.url("/hook");
    let registered = ok_json(
        &belfry(
            &url,
            &["tenants", "put", tenant, "--webhook", &hook, "--json"],
        )
        .await,
        "tenants put",
    );
    assert_eq!(registered["name"], tenant, "{registered}");
    assert!(registered["signing_secret"].is_string(), "{registered}");
    let listed = ok(&belfry(&url, &["tenants", "list"]).await, "tenants list");
    assert!(listed.starts_with("NAME"), "{listed}");
    assert!(
        listed.contains(tenant) && listed.contains(&hook),
        "{listed}"
    );
    let shown = ok_json(
        &belfry(&url, &["tenants", "get", tenant, "--json"]).await,
        "tenants get",
    );
    assert_eq!(shown["sink"]["url"], hook.as_str(), "{shown}");

    // Schedule one second from now; see it scheduled.
    let scheduled = ok(
        &belfry(
            &url,
            &[
                "events",
                "schedule",
                tenant,
                "order-1",
                "--at",
                "+1s",
                "--payload",
                "hello",
            ],
        )
        .await,
        "events schedule",
    );
    assert!(scheduled.contains("status:"), "{scheduled}");
    assert!(scheduled.contains("order-1"), "{scheduled}");
    let got = ok(
        &belfry(&url, &["events", "get", tenant, "order-1"]).await,
        "events get",
    );
    assert!(got.contains("payload:") && got.contains("hello"), "{got}");

    let listing = ok_json(
        &belfry(&url, &["events", "list", tenant, "--json"]).await,
        "events list --json",
    );
    let events = listing["events"].as_array().expect("events array");
    assert_eq!(events.len(), 1, "{listing}");
    assert_eq!(events[0]["id"], "order-1");
    assert!(listing["next_cursor"].is_null(), "{listing}");

    // Delivered to the receiver, then its attempt is in the history.
    receiver.wait_for_count(1, DELIVERY_DEADLINE).await.unwrap();
    assert_eq!(
        receiver.requests()[0].header("x-belfry-event-id"),
        Some("order-1")
    );
    let started = Instant::now();
    let attempts = loop {
        let answer = ok_json(
            &belfry(&url, &["events", "attempts", tenant, "order-1", "--json"]).await,
            "events attempts --json",
        );
        if answer["attempts"].as_array().is_some_and(|a| !a.is_empty()) {
            break answer;
        }
        assert!(
            started.elapsed() < DELIVERY_DEADLINE,
            "no attempt recorded: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        attempts["attempts"][0]["outcome"], "delivered",
        "{attempts}"
    );
    let table = ok(
        &belfry(&url, &["events", "attempts", tenant, "order-1"]).await,
        "events attempts",
    );
    assert!(table.starts_with('#'), "{table}");
    assert!(
        table.contains("delivered") && table.contains("200"),
        "{table}"
    );

    // The status filter; nothing has failed.
    let delivered = ok(
        &belfry(&url, &["events", "list", tenant, "--status", "delivered"]).await,
        "events list --status",
    );
    assert!(delivered.contains("order-1"), "{delivered}");
    let dead = ok_json(
        &belfry(&url, &["dead", "list", tenant, "--json"]).await,
        "dead list --json",
    );
    assert_eq!(dead["events"].as_array().map(Vec::len), Some(0), "{dead}");

    // Cancel a future event; cancelling it again is refused (exit 1) with
    // the server's message.
    let later = ok_json(
        &belfry(
            &url,
            &[
                "events", "schedule", tenant, "order-2", "--delay", "1h", "--json",
            ],
        )
        .await,
        "events schedule --delay 1h",
    );
    let version = later["version"].as_str().expect("a version");
    // A stale --if-match is refused and changes nothing; the current
    // version cancels.
    let stale = belfry(
        &url,
        &["events", "cancel", tenant, "order-2", "--if-match", "v0"],
    )
    .await;
    assert_eq!(stale.status.code(), Some(1), "{stale:?}");
    assert!(stderr(&stale).contains("precondition_failed"), "{stale:?}");
    let cancelled = ok_json(
        &belfry(
            &url,
            &[
                "events",
                "cancel",
                tenant,
                "order-2",
                "--if-match",
                version,
                "--json",
            ],
        )
        .await,
        "events cancel",
    );
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["previous_delivery"], "not_started", "{cancelled}");
    let again = belfry(&url, &["events", "cancel", tenant, "order-1"]).await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(stderr(&again).contains("already_finished"), "{again:?}");

    let missing = belfry(&url, &["events", "get", tenant, "no-such-event"]).await;
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(stderr(&missing).contains("event_not_found"), "{missing:?}");
    assert!(stdout(&missing).is_empty(), "{missing:?}");

    // Bad input never reaches the server: exit 2.
    let bad = belfry(
        &url,
        &["events", "schedule", tenant, "x", "--at", "tomorrow"],
    )
    .await;
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(stderr(&bad).contains("--at"), "{bad:?}");
}

/// Polls `events get` until the event has `status`.
async fn wait_for_status(url: &str, tenant: &str, id: &str, status: &str) -> Value {
    let started = Instant::now();
    loop {
        let event = ok_json(
            &belfry(url, &["events", "get", tenant, id, "--json"]).await,
            "events get --json",
        );
        if event["status"] == status {
            return event;
        }
        assert!(
            started.elapsed() < DELIVERY_DEADLINE,
            "{id} never became {status}: {event}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_event_is_listed_and_redriven_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    // A 4xx is a permanent refusal: the first delivery kills the event.
    receiver.push_rule(Rule::first(1, Response::status(400)));
    let node = start_node(dir.path(), &[]).await;
    let url = node.base_url();
    ok(
        &belfry(
            &url,
            &["tenants", "put", "acme", "--webhook", &receiver.url("/")],
        )
        .await,
        "tenants put",
    );
    ok(
        &belfry(
            &url,
            &["events", "schedule", "acme", "doomed", "--at", "+0s"],
        )
        .await,
        "events schedule",
    );
    wait_for_status(&url, "acme", "doomed", "failed").await;

    let dead = ok(&belfry(&url, &["dead", "list", "acme"]).await, "dead list");
    assert!(dead.contains("doomed") && dead.contains("failed"), "{dead}");

    let redriven = ok_json(
        &belfry(&url, &["dead", "redrive", "acme", "doomed", "--json"]).await,
        "dead redrive",
    );
    assert_eq!(redriven["attempts"], 0, "{redriven}");
    wait_for_status(&url, "acme", "doomed", "delivered").await;
    assert_eq!(receiver.count(), 2);

    // Only dead events can be redriven: refused with the server's reason.
    let again = belfry(&url, &["dead", "redrive", "acme", "doomed"]).await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(stderr(&again).contains("not_redrivable"), "{again:?}");
    let dead = ok_json(
        &belfry(&url, &["dead", "list", "acme", "--json"]).await,
        "dead list",
    );
    assert_eq!(dead["events"].as_array().map(Vec::len), Some(0), "{dead}");
}

/// `tenants put --notify-url` names the notice target; `tenants get`
/// shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_target_is_set_and_shown_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path(), &[]).await;
    let url = node.base_url();
    let notices = receiver.url("/notices");
    let put = ok_json(
        &belfry(
            &url,
            &[
                "tenants",
                "put",
                "acme",
                "--webhook",
                &receiver.url("/"),
                "--notify-url",
                &notices,
                "--json",
            ],
        )
        .await,
        "tenants put",
    );
    assert_eq!(put["notify"]["url"], notices.as_str(), "{put}");
    let shown = ok(
        &belfry(&url, &["tenants", "get", "acme"]).await,
        "tenants get",
    );
    assert!(
        shown
            .lines()
            .any(|line| line.starts_with("notify") && line.contains(&notices)),
        "{shown}"
    );
    // Both targets at once are refused before any request.
    let both = belfry(
        &url,
        &[
            "tenants",
            "put",
            "acme",
            "--webhook",
            &receiver.url("/"),
            "--notify-url",
            &notices,
            "--notify-kafka-topic",
            "t",
        ],
    )
    .await;
    assert_ne!(both.status.code(), Some(0), "{both:?}");
}

/// Three dead events redriven by one bulk action: created, followed, listed;
/// refusals exit 1 with the server's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_events_are_redriven_in_bulk_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.push_rule(Rule::first(3, Response::status(400)));
    let node = start_node(dir.path(), &[]).await;
    let url = node.base_url();
    ok(
        &belfry(
            &url,
            &["tenants", "put", "acme", "--webhook", &receiver.url("/")],
        )
        .await,
        "tenants put",
    );
    for id in ["d1", "d2", "d3"] {
        ok(
            &belfry(&url, &["events", "schedule", "acme", id, "--at", "+0s"]).await,
            "events schedule",
        );
    }
    for id in ["d1", "d2", "d3"] {
        wait_for_status(&url, "acme", id, "failed").await;
    }

    let created = ok_json(
        &belfry(
            &url,
            &[
                "bulk", "create", "--tenant", "acme", "--action", "redrive", "--status", "failed",
                "--json",
            ],
        )
        .await,
        "bulk create",
    );
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["filter"]["status"], "failed", "{created}");
    let started = Instant::now();
    let done = loop {
        let view = ok_json(
            &belfry(&url, &["bulk", "get", &id, "--json"]).await,
            "bulk get",
        );
        if view["state"] != "running" {
            break view;
        }
        assert!(
            started.elapsed() < DELIVERY_DEADLINE,
            "still running: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["succeeded"], 3, "{done}");
    for id in ["d1", "d2", "d3"] {
        wait_for_status(&url, "acme", id, "delivered").await;
    }

    let shown = ok(&belfry(&url, &["bulk", "get", &id]).await, "bulk get");
    assert!(shown.contains("succeeded:"), "{shown}");
    assert!(shown.contains("acme status=failed"), "{shown}");
    let listed = ok(
        &belfry(&url, &["bulk", "list", "--tenant", "acme"]).await,
        "bulk list",
    );
    assert!(
        listed.starts_with("ID") && listed.contains(&id) && listed.contains("completed"),
        "{listed}"
    );
    let again = belfry(&url, &["bulk", "cancel", &id]).await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(stderr(&again).contains("already_finished"), "{again:?}");
    let bad = belfry(
        &url,
        &["bulk", "create", "--tenant", "acme", "--action", "explode"],
    )
    .await;
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(stderr(&bad).contains("unknown action"), "{bad:?}");
    // A delete must name a finished status: nothing goes by omission.
    let unfiltered = belfry(
        &url,
        &["bulk", "create", "--tenant", "acme", "--action", "delete"],
    )
    .await;
    assert_eq!(unfiltered.status.code(), Some(1), "{unfiltered:?}");
    assert!(
        stderr(&unfiltered).contains("invalid_request"),
        "{unfiltered:?}"
    );
    let missing = belfry(&url, &["bulk", "create", "--action", "redrive"]).await;
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_and_cluster_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let node = start_node(dir.path(), &[]).await;
    let url = node.base_url();
    ok(
        &belfry(
            &url,
            &["tenants", "put", "acme", "--webhook", &receiver.url("/")],
        )
        .await,
        "tenants put",
    );

    let created = ok_json(
        &belfry(
            &url,
            &[
                "schedules",
                "put",
                "acme",
                "nightly",
                "--cron",
                "30 2 * * *",
                "--tz",
                "Europe/Berlin",
                "--json",
            ],
        )
        .await,
        "schedules put",
    );
    assert_eq!(created["status"], "active", "{created}");
    assert_eq!(created["time_zone"], "Europe/Berlin", "{created}");
    let paused = ok(
        &belfry(&url, &["schedules", "pause", "acme", "nightly"]).await,
        "schedules pause",
    );
    assert!(paused.contains("paused"), "{paused}");
    let resumed = ok_json(
        &belfry(&url, &["schedules", "resume", "acme", "nightly", "--json"]).await,
        "schedules resume",
    );
    assert_eq!(resumed["status"], "active", "{resumed}");
    let listed = ok(
        &belfry(&url, &["schedules", "list", "acme"]).await,
        "schedules list",
    );
    assert!(
        listed.contains("nightly") && listed.contains("30 2 * * *"),
        "{listed}"
    );
    ok(
        &belfry(&url, &["schedules", "delete", "acme", "nightly"]).await,
        "schedules delete",
    );
    let gone = belfry(&url, &["schedules", "get", "acme", "nightly"]).await;
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
    let bad_cron = belfry(&url, &["schedules", "put", "acme", "x", "--cron", "nope"]).await;
    assert_eq!(bad_cron.status.code(), Some(1), "{bad_cron:?}");
    assert!(stderr(&bad_cron).contains("invalid_cron"), "{bad_cron:?}");

    // A single node: itself as leader at term 0, every partition its own.
    let cluster = ok(&belfry(&url, &["cluster"]).await, "cluster");
    assert!(
        cluster.contains("mode:") && cluster.contains("single"),
        "{cluster}"
    );
    assert!(cluster.contains("0-63"), "{cluster}");
    let cluster = ok_json(
        &belfry(&url, &["cluster", "--json"]).await,
        "cluster --json",
    );
    assert_eq!(cluster["mode"], "single", "{cluster}");
    assert_eq!(cluster["leader"]["term"], 0, "{cluster}");
    assert_eq!(
        cluster["nodes"][0]["partitions"].as_array().map(Vec::len),
        Some(64),
        "{cluster}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_node_refuses_a_wrong_key_and_no_key_is_ever_printed() {
    let dir = tempfile::tempdir().unwrap();
    let admin = belfry_core::auth::KeySecret::generate().unwrap();
    let admin = admin.expose();
    let node = start_node(dir.path(), &[("BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY", admin)]).await;
    let url = node.base_url();
    let wrong = belfry_core::auth::KeySecret::generate().unwrap();
    let wrong = wrong.expose();

    let refused = belfry(&url, &["tenants", "list", "--key", wrong]).await;
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let message = stderr(&refused);
    assert!(message.contains("unauthorized"), "{message}");
    assert!(!message.contains(wrong) && !stdout(&refused).contains(wrong));

    let keyless = belfry(&url, &["cluster"]).await;
    assert_eq!(keyless.status.code(), Some(1), "{keyless:?}");

    // The right key from the environment works, and `--help` does not
    // show it.
    let accepted = belfry_with_env(&url, &["tenants", "list"], &[("BELFRY_KEY", admin)]).await;
    assert_eq!(
        ok(&accepted, "tenants list with the key").trim(),
        "no tenants"
    );
    let help = belfry_with_env(
        &url,
        &["events", "list", "--help"],
        &[("BELFRY_KEY", admin)],
    )
    .await;
    let help_text = ok(&help, "--help");
    assert!(help_text.contains("BELFRY_KEY"), "{help_text}");
    assert!(!help_text.contains(admin), "the key is in --help");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_exits_3_and_a_failing_one_4() {
    // Nothing listens on a port just found free.
    let url = format!("http://127.0.0.1:{}", free_port());
    let output = belfry(&url, &["events", "get", "acme", "x"]).await;
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let message = stderr(&output);
    assert!(message.contains(&url), "{message}");
    assert!(message.contains("cannot connect"), "{message}");

    // Something answers, but fails: a server error, exit 4, with its status.
    let failing = Receiver::start().await;
    failing.set_default_status(503);
    let output = belfry(&failing.base_url(), &["cluster"]).await;
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    assert!(stderr(&output).contains("503"), "{output:?}");
    // A 200 that is not JSON is no answer of a node either.
    failing.set_default(Response::status(200).with_body("<html>hello</html>"));
    let output = belfry(&failing.base_url(), &["cluster"]).await;
    assert_eq!(output.status.code(), Some(4), "{output:?}");
    assert!(stderr(&output).contains("not JSON"), "{output:?}");

    // Not a URL at all: a usage error.
    let output = belfry("not a url", &["cluster"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}
