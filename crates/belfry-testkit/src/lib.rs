//! Test and benchmark fixtures for Belfry.
//!
//! # Layout
//! - [`receiver`]: [`Receiver`], a recording webhook receiver (real HTTP/1.1
//!   on loopback) with programmable answers; also the benchmark's sink.
//! - [`process`]: [`BelfryProcess`], runs the real `belfry` binary for
//!   integration tests (start, kill -9, SIGTERM, restart).
//! - [`patroni`]: [`HaCluster`], etcd and two Patroni-managed PostgreSQL
//!   members (a primary and its synchronous standby) for failover tests.
//! - [`kafka`]: [`KafkaBroker`], a Kafka-protocol test broker in its own
//!   process (librdkafka's mock cluster), or an external one.
//! - [`webdriver`]: [`Browser`], headless Chromium driven over the W3C
//!   WebDriver protocol (Debian's `chromium` and `chromium-driver`).
//! - this file: small JSON-over-HTTP helpers for tests.
//!
//! This crate must not depend on any belfry crate: `belfry-sinks`
//! dev-depends on it.
#![allow(
    clippy::disallowed_methods,
    reason = "the test kit drives real processes on the system clock"
)]

use std::sync::OnceLock;

use serde_json::Value;

pub mod kafka;
pub mod patroni;
pub mod postgres;
pub mod process;
pub mod receiver;
pub mod webdriver;

pub use kafka::KafkaBroker;
pub use patroni::HaCluster;
pub use postgres::{PgError, PgServer};
pub use process::{BelfryLaunch, BelfryProcess, HarnessError, free_port};
pub use receiver::{LEAN_HEADERS, Receiver, RecordedRequest, Response, Rule};
pub use webdriver::Browser;

/// Installs rustls' `ring` provider as the process default. The workspace
/// builds reqwest with `rustls-no-provider`, so building any client panics
/// without one; installing twice is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A shared plain-HTTP client for tests (keep-alive, no redirects).
///
/// # Panics
/// When the client cannot be built (broken TLS setup: tests cannot run).
pub fn http_client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            install_crypto_provider();
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("build the test HTTP client")
        })
        .clone()
}

/// Sends `request` and returns the status and the body as JSON: `Null` for
/// an empty body, a JSON string for a body that is not JSON.
///
/// # Panics
/// On a transport error (refused, reset): a test helper has nothing better
/// to do, and the panic message names the URL.
async fn send(request: reqwest::RequestBuilder, what: &str) -> (u16, Value) {
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
    let status = response.status().as_u16();
    let bytes = response
        .bytes()
        .await
        .unwrap_or_else(|e| panic!("{what}: reading the body failed: {e}"));
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    (status, body)
}

/// `POST url` with a JSON body.
pub async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    send(http_client().post(url).json(body), &format!("POST {url}")).await
}

/// `PUT url` with a JSON body.
pub async fn put_json(url: &str, body: &Value) -> (u16, Value) {
    send(http_client().put(url).json(body), &format!("PUT {url}")).await
}

/// `GET url`.
pub async fn get_json(url: &str) -> (u16, Value) {
    send(http_client().get(url), &format!("GET {url}")).await
}

/// `DELETE url`.
pub async fn delete(url: &str) -> (u16, Value) {
    send(http_client().delete(url), &format!("DELETE {url}")).await
}

/// `POST url` with a raw body (for malformed-input tests).
pub async fn post_raw(url: &str, content_type: &str, body: impl Into<Vec<u8>>) -> (u16, Value) {
    send(
        http_client()
            .post(url)
            .header("content-type", content_type)
            .body(body.into()),
        &format!("POST {url}"),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn json_helpers_round_trip_through_the_receiver() {
        let receiver = Receiver::start().await;
        receiver.set_responder(|request| Response::status(201).with_body(request.body.clone()));
        let (status, body) =
            post_json(&receiver.url("/a"), &serde_json::json!({"k": [1, 2]})).await;
        assert_eq!(status, 201);
        assert_eq!(body, serde_json::json!({"k": [1, 2]}));
        let seen = receiver.requests();
        assert_eq!(seen[0].header("content-type"), Some("application/json"));

        receiver.set_responder(|_| Response::status(404).with_body("plain text"));
        assert_eq!(
            get_json(&receiver.url("/b")).await,
            (404, Value::String("plain text".into()))
        );
        receiver.clear_responder();
        assert_eq!(delete(&receiver.url("/c")).await, (200, Value::Null));
    }

    #[test]
    fn free_port_gives_a_bindable_port() {
        let port = free_port();
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    }
}
