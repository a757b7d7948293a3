//! Real HTTP on loopback against the testkit receiver.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use belfry_core::tenant::HttpTarget;
use belfry_core::{
    DeliveryOption, EventId, EventKey, EventRecord, EventStatus, EventVersion, PartitionId,
    SinkConfig, TenantConfig, TenantName, Timestamp, Verdict,
};
use belfry_testkit::{Receiver, Response, Rule, free_port};

use super::sink::ERROR_BODY_LIMIT;
use super::{HttpSink, HttpSinkOptions};
use crate::body::{BigBenStatus, EventResponse};
use crate::{Delivery, DeliveryResult, Sink};

const WAIT: Duration = Duration::from_secs(10);

fn sink() -> HttpSink {
    HttpSink::new(HttpSinkOptions::default()).unwrap()
}

fn tenant(url: String, timeout_ms: Option<u64>) -> TenantConfig {
    let mut headers = BTreeMap::new();
    headers.insert("Authorization".to_string(), "Bearer s3cret".to_string());
    TenantConfig {
        name: TenantName::new("TenantB/ProgramB/EnvC").unwrap(),
        sink: SinkConfig::Http(HttpTarget {
            url,
            headers,
            timeout_ms,
        }),
    }
}

fn event(tenant: &TenantConfig, id: &str, delivery: DeliveryOption) -> EventRecord {
    let at = Timestamp::parse_rfc3339("2030-01-31T04:00:30.250Z").unwrap();
    EventRecord {
        key: EventKey::new(tenant.name.clone(), EventId::new(id).unwrap()),
        partition: PartitionId(1),
        version: EventVersion::from_string("0190-version-1".into()),
        event_time: at,
        payload: Some("{\"orderId\":42}".into()),
        delivery,
        status: EventStatus::Scheduled,
        next_fire_at: Some(at),
        attempts: 0,
        last_error: None,
        triggered_at: None,
        created_at: at,
        updated_at: at,
        finished_at: None,
    }
}

fn triggered_at() -> Timestamp {
    Timestamp::parse_rfc3339("2030-01-31T04:00:31Z").unwrap()
}

async fn deliver_to(
    sink: &HttpSink,
    tenant: &TenantConfig,
    event: &EventRecord,
    attempt: u32,
) -> DeliveryResult {
    sink.deliver(Delivery {
        tenant,
        event,
        attempt,
        triggered_at: triggered_at(),
    })
    .await
}

/// Delivers one FULL_EVENT event to `path` on `receiver`.
async fn deliver_once(receiver: &Receiver, path: &str) -> DeliveryResult {
    let tenant = tenant(receiver.url(path), None);
    let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
    deliver_to(&sink(), &tenant, &event, 1).await
}

#[tokio::test]
async fn success_statuses_are_delivered() {
    let receiver = Receiver::start().await;
    receiver.push_rule(Rule::always(Response::status(204)).for_path("/no-content"));
    receiver
        .push_rule(Rule::always(Response::status(202).with_body("queued")).for_path("/accepted"));

    for (path, status) in [("/ok", 200), ("/no-content", 204), ("/accepted", 202)] {
        let result = deliver_once(&receiver, path).await;
        assert_eq!(result, DeliveryResult::delivered(Some(status)), "{path}");
    }
    assert_eq!(receiver.count(), 3);
}

#[tokio::test]
async fn server_errors_redirects_408_and_429_are_retried() {
    let receiver = Receiver::start().await;
    receiver.set_responder(|request| {
        let status = request.path.trim_start_matches('/').parse().unwrap_or(200);
        Response::status(status).with_body(format!("answer {status}"))
    });
    for status in [500, 503, 301, 408, 429] {
        let result = deliver_once(&receiver, &format!("/{status}")).await;
        assert_eq!(result.verdict, Verdict::Retry, "{status}");
        assert_eq!(result.http_status, Some(status), "{status}");
        assert_eq!(
            result.error.as_deref(),
            Some(format!("HTTP {status}: answer {status}").as_str())
        );
    }
    // The redirect was not followed: exactly one request per delivery.
    assert_eq!(receiver.count(), 5);
}

#[tokio::test]
async fn client_errors_are_permanent_with_the_body_as_message() {
    let receiver = Receiver::start().await;
    receiver.push_rule(
        Rule::always(Response::status(404).with_body("no such order")).for_path("/gone"),
    );
    receiver.push_rule(Rule::always(Response::status(400)).for_path("/empty"));
    receiver.push_rule(
        Rule::always(Response::status(422).with_body(vec![b'x'; 10 * ERROR_BODY_LIMIT]))
            .for_path("/huge"),
    );

    let result = deliver_once(&receiver, "/gone").await;
    assert_eq!(
        result,
        DeliveryResult::failed(Verdict::Permanent, Some(404), "HTTP 404: no such order")
    );

    let result = deliver_once(&receiver, "/empty").await;
    assert_eq!(
        result,
        DeliveryResult::failed(Verdict::Permanent, Some(400), "HTTP 400")
    );

    let result = deliver_once(&receiver, "/huge").await;
    assert_eq!(result.verdict, Verdict::Permanent);
    let message = result.error.unwrap();
    assert_eq!(message.len(), "HTTP 422: ".len() + ERROR_BODY_LIMIT);
}

#[tokio::test]
async fn a_receiver_slower_than_the_tenant_timeout_is_retried() {
    let receiver = Receiver::start().await;
    let slow = Duration::from_secs(20);
    receiver.set_default(Response::status(200).with_delay(slow));
    let tenant = tenant(receiver.url("/slow"), Some(300));
    let event = event(&tenant, "order-42", DeliveryOption::FullEvent);

    let started = Instant::now();
    let result = deliver_to(&sink(), &tenant, &event, 1).await;
    assert_eq!(
        result,
        DeliveryResult::failed(Verdict::Retry, None, "timeout after 300 ms")
    );
    // Generous: only shows the tenant's limit applied, not the receiver's delay.
    assert!(started.elapsed() < slow, "{:?}", started.elapsed());
    assert_eq!(receiver.count(), 1);
}

#[tokio::test]
async fn connection_refused_is_retried() {
    let port = free_port();
    let tenant = tenant(format!("http://127.0.0.1:{port}/hook"), None);
    let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
    let result = deliver_to(&sink(), &tenant, &event, 1).await;
    assert_eq!(
        result,
        DeliveryResult::failed(Verdict::Retry, None, "connection refused")
    );
}

#[tokio::test]
async fn https_goes_through_rustls() {
    // The receiver speaks plain HTTP, so the TLS handshake fails: a retry
    // with a connect error, which shows the https path is wired (without a
    // TLS backend reqwest refuses the URL scheme while building the request).
    let receiver = Receiver::start().await;
    let url = receiver.base_url().replace("http://", "https://") + "/hook";
    let tenant = tenant(url, Some(5_000));
    let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
    let result = deliver_to(&sink(), &tenant, &event, 1).await;
    assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
    let message = result.error.unwrap();
    assert!(message.starts_with("connect failed"), "{message}");
    assert_eq!(receiver.count(), 0);
}

#[tokio::test]
async fn request_carries_every_header() {
    let receiver = Receiver::start().await;
    let tenant = tenant(receiver.url("/hooks/orders"), None);
    let event = event(&tenant, "zoë 100%", DeliveryOption::FullEvent);
    let sink = sink();
    assert_eq!(
        deliver_to(&sink, &tenant, &event, 1).await.verdict,
        Verdict::Delivered
    );
    assert_eq!(
        deliver_to(&sink, &tenant, &event, 2).await.verdict,
        Verdict::Delivered
    );

    let seen = receiver.wait_for_count(2, WAIT).await.unwrap();
    let first = &seen[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/hooks/orders");
    assert_eq!(first.header("content-type"), Some("application/json"));
    assert_eq!(first.header("authorization"), Some("Bearer s3cret"));
    assert_eq!(first.header("x-belfry-event-id"), Some("zo%C3%AB%20100%25"));
    assert_eq!(
        first.header("x-belfry-tenant"),
        Some("TenantB/ProgramB/EnvC")
    );
    assert_eq!(
        first.header("x-belfry-scheduled-at"),
        Some("2030-01-31T04:00:30.25Z")
    );
    assert_eq!(first.header("x-belfry-attempt"), Some("1"));
    assert_eq!(first.header("idempotency-key"), Some("0190-version-1"));
    assert_eq!(
        first.header("user-agent"),
        Some(concat!("belfry/", env!("CARGO_PKG_VERSION")))
    );
    // A retry of the same version: same key, next attempt number.
    assert_eq!(seen[1].header("idempotency-key"), Some("0190-version-1"));
    assert_eq!(seen[1].header("x-belfry-attempt"), Some("2"));
}

#[tokio::test]
async fn belfry_headers_win_over_tenant_headers() {
    let receiver = Receiver::start().await;
    let mut tenant = tenant(receiver.url("/h"), None);
    if let SinkConfig::Http(target) = &mut tenant.sink {
        target
            .headers
            .insert("Content-Type".into(), "text/plain".into());
        target
            .headers
            .insert("Idempotency-Key".into(), "forged".into());
    }
    let event = event(&tenant, "e", DeliveryOption::FullEvent);
    deliver_to(&sink(), &tenant, &event, 1).await;
    let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
    let values = |name: &str| -> Vec<&str> {
        seen[0]
            .headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(values("content-type"), ["application/json"]);
    assert_eq!(values("idempotency-key"), ["0190-version-1"]);
}

#[tokio::test]
async fn full_event_body_parses_back() {
    let receiver = Receiver::start().await;
    let tenant = tenant(receiver.url("/full"), None);
    let event = event(&tenant, "order-42", DeliveryOption::FullEvent);
    deliver_to(&sink(), &tenant, &event, 1).await;

    let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
    let body: EventResponse = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body.id.as_deref(), Some("order-42"));
    assert_eq!(body.tenant.as_deref(), Some("TenantB/ProgramB/EnvC"));
    assert_eq!(body.event_time.as_deref(), Some("2030-01-31T04:00:30.25Z"));
    assert_eq!(body.payload.as_deref(), Some("{\"orderId\":42}"));
    assert_eq!(body.event_id.as_deref(), Some("0190-version-1"));
    assert_eq!(body.triggered_at.as_deref(), Some("2030-01-31T04:00:31Z"));
    assert_eq!(body.event_status, Some(BigBenStatus::Triggered));
    assert_eq!(body.delivery_option, Some(DeliveryOption::FullEvent));
    assert_eq!(body.error, None);
    // Null fields are present, not omitted.
    let raw = seen[0].body_json().unwrap();
    assert!(raw.as_object().unwrap()["error"].is_null());
}

#[tokio::test]
async fn payload_only_body_is_the_raw_payload() {
    let receiver = Receiver::start().await;
    let tenant = tenant(receiver.url("/raw"), None);
    let event = event(&tenant, "order-42", DeliveryOption::PayloadOnly);
    deliver_to(&sink(), &tenant, &event, 1).await;

    let seen = receiver.wait_for_count(1, WAIT).await.unwrap();
    assert_eq!(seen[0].body_text(), "{\"orderId\":42}");
    assert_eq!(seen[0].header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn sequential_deliveries_reuse_one_connection() {
    let receiver = Receiver::start().await;
    let tenant = tenant(receiver.url("/reuse"), None);
    let sink = sink();
    let deliveries = 50;
    for i in 0..deliveries {
        let event = event(&tenant, &format!("e{i}"), DeliveryOption::FullEvent);
        let result = deliver_to(&sink, &tenant, &event, 1).await;
        assert_eq!(result.verdict, Verdict::Delivered);
    }
    receiver.wait_for_count(deliveries, WAIT).await.unwrap();
    // Keep-alive: one connection, allowing one spare for a race with the
    // server's close of an idle connection.
    assert!(
        receiver.accepted_connections() <= 2,
        "{} connections for {deliveries} deliveries",
        receiver.accepted_connections()
    );
}
