//! TLS to PostgreSQL, end to end: real `belfry` processes and a real
//! PostgreSQL that accepts TCP connections over TLS only (`hostssl`), with
//! a certificate for `localhost` and 127.0.0.1 from a test CA made at test
//! time. `sslmode` and `sslrootcert` are libpq's, in the database URL.
//!
//! What each connection really used is read from the server's
//! `pg_stat_ssl`, not inferred from the node starting.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use belfry_testkit::postgres::PgServer;
use belfry_testkit::{
    BelfryLaunch, BelfryProcess, HarnessError, Receiver, get_json, post_json, put_json,
};
use serde_json::{Value, json};

mod common;
use common::{call, now_ms, rfc3339};

const SETTLE: Duration = Duration::from_secs(60);

async fn start_node(url: &str) -> Result<(BelfryProcess, tempfile::TempDir), HarnessError> {
    let dir = tempfile::tempdir().unwrap();
    let launch = BelfryLaunch::new(env!("CARGO_BIN_EXE_belfry"), dir.path().join("unused"))
        .arg("--database-url")
        .arg(url);
    BelfryProcess::start(launch).await.map(|node| (node, dir))
}

/// The log of a node that must refuse to start on `url`.
async fn refused_start(url: &str) -> String {
    match start_node(url).await {
        Err(HarnessError::ExitedEarly { logs, .. }) => logs,
        Err(other) => panic!("expected an exit at startup, got {other}"),
        Ok(_) => panic!("a node started on {url}"),
    }
}

/// A TLS-only server and the `verify-full` URL of a fresh database on it.
async fn tls_database() -> (PgServer, String) {
    let server = PgServer::launch_tls().expect("a TLS-only PostgreSQL");
    let name = format!("tls_{}", std::process::id());
    let url = server.create_database(&name).await.expect("a database");
    assert!(url.contains("sslmode=verify-full&sslrootcert="), "{url}");
    (server, url)
}

/// `url` with its query (`?…`) replaced.
fn with_query(url: &str, query: &str) -> String {
    let base = url.split_once('?').map_or(url, |(base, _)| base);
    format!("{base}?{query}")
}

/// `(over TLS, in all)`: the connections the nodes hold to `url`'s
/// database, as the server sees them.
async fn node_connections(url: &str) -> (i64, i64) {
    let client = belfry_postgres::tls::connect(url)
        .await
        .expect("connect to look at the nodes' connections");
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.application_name = 'belfry' AND a.datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Polls until every node reports `size` members and 64 owned partitions.
async fn wait_for_members(nodes: &[BelfryProcess], size: usize) {
    let deadline = Instant::now() + SETTLE;
    'poll: loop {
        assert!(Instant::now() < deadline, "never settled at {size} nodes");
        tokio::time::sleep(Duration::from_millis(200)).await;
        for node in nodes {
            let (_, detail) = get_json(&node.url("/v1/cluster")).await;
            let Some(views) = detail["nodes"].as_array() else {
                continue 'poll;
            };
            let owned: usize = views
                .iter()
                .map(|n| n["partitions"].as_array().map_or(0, Vec::len))
                .sum();
            if views.len() != size || owned != 64 {
                continue 'poll;
            }
        }
        return;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_verify_full_tls_deliver_on_time_and_serve_pull_claims() {
    let (_server, url) = tls_database().await;
    // The server really refuses plain connections.
    let plain = belfry_postgres::tls::connect(&with_query(&url, "sslmode=disable"))
        .await
        .expect_err("a plain connection is refused");
    assert!(plain.contains("no encryption"), "{plain}");

    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..3 {
        let (node, dir) = start_node(&url).await.expect("a node starts over TLS");
        nodes.push(node);
        dirs.push(dir);
    }
    wait_for_members(&nodes, 3).await;

    // Deliveries: a webhook tenant, events scheduled through every node.
    let receiver = Receiver::start_lean().await;
    let (status, body) = post_json(
        &nodes[1].url("/events/tenant/register"),
        &json!({"tenant": "c", "type": "HTTP", "props": {"url": receiver.url("/hook")}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let first = now_ms() + 2_000;
    let mut due = HashMap::new();
    for (n, node) in nodes.iter().enumerate() {
        let batch: Vec<Value> = (0..40)
            .map(|i| {
                let id = format!("e{n}-{i}");
                let at = first + i * 25;
                due.insert(id.clone(), at);
                json!({"id": id, "tenant": "c", "eventTime": rfc3339(at)})
            })
            .collect();
        let (status, answer) = post_json(&node.url("/events/schedule"), &Value::Array(batch)).await;
        assert_eq!(status, 200, "{answer}");
    }
    let deadline = Instant::now() + SETTLE;
    let arrivals = loop {
        let mut arrivals: HashMap<String, i64> = HashMap::new();
        for request in receiver.requests() {
            if let Some(id) = request.header("x-belfry-event-id") {
                arrivals
                    .entry(id.to_string())
                    .or_insert(request.arrived_at_ms);
            }
        }
        if due.keys().all(|id| arrivals.contains_key(id)) {
            break arrivals;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} delivered",
            arrivals.len(),
            due.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (id, at) in &due {
        assert!(arrivals[id] >= *at, "{id} delivered early");
    }

    // Pull: events of every node's partitions, claimed through one node.
    let (status, body) = put_json(
        &nodes[0].url("/v1/tenants/jobs"),
        &json!({ "sink": { "type": "pull" } }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let events: Vec<Value> = (0..12)
        .map(|i| json!({ "id": format!("j{i}"), "deliver_at": rfc3339(now_ms()) }))
        .collect();
    let (status, body) = post_json(
        &nodes[1].url("/v1/tenants/jobs/events"),
        &json!({ "events": events }),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let worker = nodes[2].base_url();
    let mut leased = HashMap::new();
    let deadline = Instant::now() + SETTLE;
    while leased.len() < 12 {
        assert!(
            Instant::now() < deadline,
            "claimed only {:?}",
            leased.keys()
        );
        let body =
            json!({ "worker_id": "w", "max_events": 12, "lease_ms": 30_000, "wait_ms": 1_000 });
        let (status, answer) = call(&worker, "/v1/tenants/jobs/leases", &body)
            .await
            .expect("the node answers");
        assert_eq!(status, 200, "{answer}");
        for lease in answer["leases"].as_array().unwrap() {
            let id = lease["event"]["id"].as_str().unwrap().to_string();
            assert!(leased.insert(id, lease.clone()).is_none(), "leased twice");
        }
    }
    for (id, lease) in &leased {
        let path = format!(
            "/v1/leases/{}/complete",
            lease["lease_id"].as_str().unwrap()
        );
        let (status, done) = call(&worker, &path, &json!({})).await.unwrap();
        assert_eq!(status, 200, "{id}: {done}");
        assert_eq!(done["state"], "delivered", "{id}: {done}");
    }

    // Every connection of every node (pools, LISTEN, presence) is TLS.
    let (encrypted, all) = node_connections(&url).await;
    assert!(
        all >= 9,
        "three nodes hold at least 3 connections each: {all}"
    );
    assert_eq!(encrypted, all, "every connection of the nodes uses TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_of_another_ca_or_for_another_host() {
    let (server, url) = tls_database().await;
    let port = server.port().unwrap();
    let database = url
        .split_once('?')
        .and_then(|(base, _)| base.rsplit_once('/'))
        .map(|(_, name)| name.to_string())
        .unwrap();
    let ca = server.ca_file().unwrap();

    // Another CA (of the same name, as an attacker would make it): a
    // certificate for the right host.
    let other = PgServer::launch_tls().expect("a second TLS server");
    let other_ca = other.ca_file().unwrap();
    let logs = refused_start(&with_query(
        &url,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            other_ca.to_string_lossy()
        ),
    ))
    .await;
    assert!(
        logs.contains("cannot connect to PostgreSQL")
            && logs.contains("the server's certificate is refused (sslmode=verify-full")
            && logs.contains("invalid peer certificate"),
        "{logs}"
    );
    // verify-ca checks the chain as well.
    let logs = refused_start(&with_query(
        &url,
        &format!(
            "sslmode=verify-ca&sslrootcert={}",
            other_ca.to_string_lossy()
        ),
    ))
    .await;
    assert!(
        logs.contains("the server's certificate is refused (sslmode=verify-ca"),
        "{logs}"
    );

    // The right CA, another host name (the address is the server's).
    let wrong_host = format!(
        "postgres://postgres@db.wrong.invalid:{port}/{database}?hostaddr=127.0.0.1&\
         sslmode=verify-full&sslrootcert={}",
        ca.to_string_lossy()
    );
    let logs = refused_start(&wrong_host).await;
    assert!(
        logs.contains("the server's certificate is refused (sslmode=verify-full")
            && logs.contains("db.wrong.invalid"),
        "{logs}"
    );
    // verify-ca does not check the name: the same URL works there.
    let (_node, _dir) = start_node(&wrong_host.replace("verify-full", "verify-ca"))
        .await
        .expect("verify-ca ignores the host name");
    // And verify-full accepts the name the certificate is for.
    let right_host = wrong_host.replace("db.wrong.invalid", "localhost");
    let (_node2, _dir2) = start_node(&right_host)
        .await
        .expect("verify-full with the certificate's name");
    let (encrypted, all) = node_connections(&url).await;
    assert!(
        all >= 2 && encrypted == all,
        "{encrypted} of {all} over TLS"
    );

    // verify-full without a CA to verify with is refused before connecting.
    let logs = refused_start(&with_query(&url, "sslmode=verify-full")).await;
    assert!(
        logs.contains("sslmode=verify-full needs sslrootcert"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_needs_tls_on_the_server_and_prefer_and_disable_work_without_it() {
    // A server without TLS.
    let plain = PgServer::launch().expect("a plain PostgreSQL");
    let url = plain.create_database("plain").await.unwrap();
    let logs = refused_start(&with_query(&url, "sslmode=require")).await;
    assert!(
        logs.contains("cannot connect to PostgreSQL")
            && logs.contains("server does not support TLS"),
        "{logs}"
    );
    // prefer falls back to plain; disable is plain.
    let (_a, _dir_a) = start_node(&with_query(&url, "sslmode=prefer"))
        .await
        .expect("prefer falls back to plain");
    let (_b, _dir_b) = start_node(&with_query(&url, "sslmode=disable"))
        .await
        .expect("disable works without TLS");
    let (encrypted, all) = node_connections(&with_query(&url, "sslmode=disable")).await;
    assert!(all >= 2 && encrypted == 0, "{encrypted} of {all} over TLS");

    // The TLS-only server: require and prefer use TLS (without a CA, the
    // certificate is not checked, as in libpq); disable is refused.
    let (_server, tls_url) = tls_database().await;
    let (_c, _dir_c) = start_node(&with_query(&tls_url, "sslmode=require"))
        .await
        .expect("require over TLS");
    let (_d, _dir_d) = start_node(&with_query(&tls_url, "sslmode=prefer"))
        .await
        .expect("prefer takes TLS where offered");
    let (encrypted, all) = node_connections(&tls_url).await;
    assert!(
        all >= 2 && encrypted == all,
        "{encrypted} of {all} over TLS"
    );
    let logs = refused_start(&with_query(&tls_url, "sslmode=disable")).await;
    assert!(logs.contains("no encryption"), "{logs}");
}
