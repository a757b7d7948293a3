//! Kafka tenants at registration, through both APIs: BigBen's `MESSAGING`
//! props and `/v1`'s `kafka` sink are accepted as BigBen wrote them, every
//! unsafe or unknown producer setting is refused with a 400 naming it,
//! bootstrap servers the egress policy forbids are refused, and secrets
//! are write-only. (No broker needed: nothing is delivered.)
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]
#![cfg(feature = "kafka")]

mod common;

use axum::http::StatusCode;
use common::{Harness, encode};
use serde_json::{Value, json};

fn messaging(props: Value) -> Value {
    json!({ "tenant": "TenantA/ProgramB/EnvC", "type": "MESSAGING", "props": props })
}

#[tokio::test]
async fn bigben_messaging_tenants_register_as_bigben_wrote_them() {
    let h = Harness::start().await;
    let answer = h
        .post(
            "/events/tenant/register",
            &messaging(json!({
                "topic": "bigben-out",
                "bootstrap.servers": "127.0.0.1:9092",
                "acks": "all",
                "linger.ms": 5,
                "key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
                "sasl.username": "svc",
                "sasl.password": "hunter2",
                "security.protocol": "sasl_plaintext",
                "sasl.mechanism": "PLAIN",
            })),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let props = &answer.body["TenantA/ProgramB/EnvC"]["props"];
    assert_eq!(answer.body["TenantA/ProgramB/EnvC"]["type"], "MESSAGING");
    assert_eq!(props["topic"], "bigben-out");
    assert_eq!(props["bootstrap.servers"], "127.0.0.1:9092");
    assert_eq!(props["linger.ms"], "5");
    assert_eq!(props["sasl.username"], "svc");
    assert_eq!(props["sasl.password"], "****", "write-only: {answer:?}");
    let listed = h.get("/events/tenants").await;
    assert!(!listed.body.to_string().contains("hunter2"), "{listed:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn unsafe_or_unknown_producer_settings_are_refused_by_name() {
    let h = Harness::start().await;
    let cases = [
        ("enable.idempotence", json!("false")),
        ("acks", json!("1")),
        ("acks", json!(0)),
        ("transactional.id", json!("mine")),
        ("ssl.ca.location", json!("/etc/ssl/ca.pem")),
        ("ssl.key.location", json!("/etc/ssl/key.pem")),
        ("sasl.kerberos.kinit.cmd", json!("touch /tmp/pwned")),
        ("plugin.library.paths", json!("/tmp/evil.so")),
        ("interceptor.classes", json!("com.acme.Spy")),
        ("queue.buffering.max.messages", json!(10_000_000)),
        ("test.mock.num.brokers", json!(3)),
        ("no.such.setting", json!("x")),
        ("linger.ms", json!("soon")),
    ];
    for (name, value) in cases {
        let mut props = json!({ "topic": "out", "bootstrap.servers": "127.0.0.1:9092" });
        props[name] = value.clone();
        let bigben = h
            .post("/events/tenant/register", &messaging(props.clone()))
            .await;
        assert_eq!(bigben.status, StatusCode::BAD_REQUEST, "{name}: {bigben:?}");
        let message = bigben.body["message"].as_str().unwrap_or_default();
        assert!(message.contains(name), "{name}: {message}");

        let mut v1_props = props.as_object().unwrap().clone();
        v1_props.remove("topic");
        let v1_props: serde_json::Map<String, Value> = v1_props
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    Value::String(v.as_str().map_or(v.to_string(), String::from)),
                )
            })
            .collect();
        let v1 = h
            .put(
                "/v1/tenants/k",
                &json!({ "sink": { "type": "kafka", "topic": "out", "props": v1_props } }),
            )
            .await;
        assert_eq!(v1.status, StatusCode::BAD_REQUEST, "{name}: {v1:?}");
        assert_eq!(v1.body["error"]["code"], "invalid_sink", "{v1:?}");
        let message = v1.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(name), "{name}: {message}");
    }
    let missing = h
        .post(
            "/events/tenant/register",
            &messaging(json!({ "topic": "out" })),
        )
        .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(
        missing.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("bootstrap.servers"),
        "{missing:?}"
    );
    // Nothing was registered.
    assert_eq!(h.get("/events/tenants").await.body, json!({}));
    h.shutdown().await;
}

#[tokio::test]
async fn forbidden_bootstrap_servers_are_refused_at_registration() {
    let h = Harness::start().await;
    for servers in ["169.254.169.254:9092", "127.0.0.1:9092,[fe80::1]:9092"] {
        let answer = h
            .post(
                "/events/tenant/register",
                &messaging(json!({ "topic": "out", "bootstrap.servers": servers })),
            )
            .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
        let message = answer.body["message"].as_str().unwrap_or_default();
        assert!(message.contains("egress_blocked"), "{message}");
        let v1 = h
            .put(
                "/v1/tenants/k",
                &json!({ "sink": { "type": "kafka", "topic": "out",
                    "props": { "bootstrap.servers": servers } } }),
            )
            .await;
        assert_eq!(v1.status, StatusCode::BAD_REQUEST, "{v1:?}");
        assert_eq!(v1.body["error"]["code"], "invalid_sink");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn v1_kafka_sinks_choose_their_key() {
    let h = Harness::start().await;
    let path = format!("/v1/tenants/{}", encode("orders"));
    let answer = h
        .put(
            &path,
            &json!({ "sink": { "type": "kafka", "topic": "out", "key": "tenant_event_id",
                "props": { "bootstrap.servers": "127.0.0.1:9092", "sasl.password": "s3cret" } } }),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(answer.body["sink"]["type"], "kafka");
    assert_eq!(answer.body["sink"]["key"], "tenant_event_id");
    assert_eq!(answer.body["sink"]["props"]["sasl.password"], "****");
    let default = h
        .put(
            &path,
            &json!({ "sink": { "type": "kafka", "topic": "out",
                "props": { "bootstrap.servers": "127.0.0.1:9092" } } }),
        )
        .await;
    assert_eq!(default.status, StatusCode::OK, "{default:?}");
    assert_eq!(default.body["sink"].get("key"), None, "event_id by default");
    let fenced = h
        .put(
            &path,
            &json!({ "sink": { "type": "kafka", "topic": "out", "transactional": true,
                "props": { "bootstrap.servers": "127.0.0.1:9092" } } }),
        )
        .await;
    assert_eq!(fenced.status, StatusCode::OK, "{fenced:?}");
    assert_eq!(fenced.body["sink"]["transactional"], true);
    for (sink, field) in [
        (
            json!({ "type": "kafka", "topic": "out", "key": "random",
                "props": { "bootstrap.servers": "127.0.0.1:9092" } }),
            "sink.key",
        ),
        (
            json!({ "type": "http", "url": "http://127.0.0.1:1/", "key": "none" }),
            "key",
        ),
        (
            json!({ "type": "kafka", "topic": "out", "transactional": "yes",
                "props": { "bootstrap.servers": "127.0.0.1:9092" } }),
            "sink.transactional",
        ),
    ] {
        let refused = h.put(&path, &json!({ "sink": sink })).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
        let message = refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains(field), "{message}");
    }
    h.shutdown().await;
}
