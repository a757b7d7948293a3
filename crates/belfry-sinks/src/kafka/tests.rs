//! Real records through a Kafka-protocol broker: the testkit's
//! [`KafkaBroker`] (librdkafka's mock cluster in its own process, or the
//! broker `BELFRY_TEST_KAFKA_BOOTSTRAP` names). Records are read back with
//! a plain consumer; fault tests (broker down) need the mock and say so
//! when skipped.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use belfry_core::tenant::{KafkaKey, KafkaTarget};
use belfry_core::{
    DeliveryOption, EventId, EventKey, EventRecord, EventVersion, PartitionId, SigningSecrets,
    SinkConfig, TenantConfig, TenantName, Timestamp, Verdict,
};
use belfry_testkit::KafkaBroker;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{HEADER_EPOCH, KafkaSink, KafkaSinkOptions};
use crate::egress::{EgressMode, EgressOptions};
use crate::signing::{Signer, generate_secret, unix_seconds};
use crate::{Delivery, DeliveryResult, Sink};

const WAIT: Duration = Duration::from_secs(20);

fn unique_topic(name: &str) -> String {
    // An external broker keeps topics between runs.
    format!("{name}-{}", std::process::id())
}

fn tenant(broker: &KafkaBroker, topic: &str, extra: &[(&str, &str)]) -> TenantConfig {
    let mut props = BTreeMap::new();
    props.insert(
        "bootstrap.servers".to_string(),
        broker.bootstrap_servers().to_string(),
    );
    for (name, value) in extra {
        props.insert((*name).to_string(), (*value).to_string());
    }
    TenantConfig {
        name: TenantName::new("TenantA/ProgramB/EnvC").unwrap(),
        sink: SinkConfig::Kafka(KafkaTarget {
            topic: topic.to_string(),
            props,
            key: KafkaKey::EventId,
            transactional: false,
            delivery: Default::default(),
        }),
        signing: None,
        notify: None,
    }
}

fn event(tenant: &TenantConfig, id: &str, payload: String) -> EventRecord {
    let at = Timestamp::parse_rfc3339("2030-01-31T04:00:30.250Z").unwrap();
    let key = EventKey::new(tenant.name.clone(), EventId::new(id).unwrap());
    EventRecord {
        debounce_since: None,
        partition: PartitionId(3),
        version: EventVersion::from_string(format!("version-of-{id}")),
        ..crate::scheduled_event(key, at, Some(payload), DeliveryOption::FullEvent)
    }
}

fn triggered_at() -> Timestamp {
    Timestamp::parse_rfc3339("2030-01-31T04:00:31Z").unwrap()
}

/// Delivers `event`, retrying while the attempt is retriable (a loaded test
/// machine can make a first attempt, which opens the producer, outlast a
/// short `message.timeout.ms`).
async fn delivered_eventually(sink: &KafkaSink, tenant: &TenantConfig, event: &EventRecord) {
    let deadline = Instant::now() + WAIT;
    loop {
        let result = deliver(sink, tenant, event).await;
        match result.verdict {
            Verdict::Delivered => return,
            Verdict::Retry if Instant::now() < deadline => {}
            _ => panic!("not delivered: {result:?}"),
        }
    }
}

async fn deliver(sink: &KafkaSink, tenant: &TenantConfig, event: &EventRecord) -> DeliveryResult {
    sink.deliver(Delivery {
        tenant,
        event,
        attempt: 2,
        triggered_at: triggered_at(),
        epoch: Some(7),
    })
    .await
}

fn sink() -> KafkaSink {
    KafkaSink::new(KafkaSinkOptions::default(), EgressOptions::internal())
}

/// One record read back from `topic` (partition 0, from the start).
struct Read {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: BTreeMap<String, String>,
    timestamp: Option<i64>,
}

fn read_all(broker: &KafkaBroker, topic: &str, expected: usize) -> Vec<Read> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", "belfry-sink-tests")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut records = Vec::new();
    let deadline = Instant::now() + WAIT;
    while records.len() < expected && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("consume");
        let mut headers = BTreeMap::new();
        if let Some(all) = message.headers() {
            for header in all.iter() {
                headers.insert(
                    header.key.to_string(),
                    String::from_utf8(header.value.unwrap_or_default().to_vec()).unwrap(),
                );
            }
        }
        records.push(Read {
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().unwrap_or_default().to_vec(),
            headers,
            timestamp: message.timestamp().to_millis(),
        });
    }
    // Anything more would be a duplicate.
    if let Some(Ok(extra)) = consumer.poll(Duration::from_millis(500)) {
        panic!("unexpected extra record at offset {}", extra.offset());
    }
    records
}

#[tokio::test]
async fn a_delivered_record_carries_key_value_and_headers() {
    let topic = unique_topic("out");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    let sink = sink();
    let mut tenant = tenant(&broker, &topic, &[("linger.ms", "0")]);
    let secret = generate_secret();
    tenant.signing = Some(SigningSecrets::new(secret.clone()));
    let event = event(&tenant, "order-42", "{\"orderId\":42}".into());
    let result = deliver(&sink, &tenant, &event).await;
    assert_eq!(result, DeliveryResult::delivered(None));

    let records = read_all(&broker, &topic, 1);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.key.as_deref(), Some(&b"order-42"[..]));
    assert_eq!(
        record.value,
        crate::body::render_delivery_body(&event, triggered_at())
    );
    let value: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(value["eventStatus"], "TRIGGERED");
    assert_eq!(value["payload"], "{\"orderId\":42}");
    assert_eq!(record.timestamp, Some(triggered_at().as_millis()));
    let header = |name: &str| record.headers.get(name).map(String::as_str);
    assert_eq!(header("x-belfry-event-id"), Some("order-42"));
    assert_eq!(header("x-belfry-tenant"), Some("TenantA/ProgramB/EnvC"));
    assert_eq!(
        header("x-belfry-scheduled-at"),
        Some("2030-01-31T04:00:30.25Z")
    );
    assert_eq!(header("x-belfry-attempt"), Some("2"));
    assert_eq!(header("idempotency-key"), Some("version-of-order-42"));
    assert_eq!(header(HEADER_EPOCH), Some("7"));
    assert_eq!(header("webhook-id"), Some("version-of-order-42"));
    let timestamp = unix_seconds(triggered_at()).to_string();
    assert_eq!(header("webhook-timestamp"), Some(timestamp.as_str()));
    let expected = Signer::new(&SigningSecrets::new(secret))
        .unwrap()
        .signature(
            "version-of-order-42",
            &timestamp,
            &record.value,
            triggered_at(),
        );
    assert_eq!(header("webhook-signature"), Some(expected.as_str()));
}

#[tokio::test]
async fn keys_can_be_tenant_scoped_or_absent() {
    let topic = unique_topic("keys");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    let sink = sink();
    let mut scoped = tenant(&broker, &topic, &[]);
    let SinkConfig::Kafka(target) = &mut scoped.sink else {
        unreachable!()
    };
    target.key = KafkaKey::TenantEventId;
    let mut keyless = scoped.clone();
    let SinkConfig::Kafka(target) = &mut keyless.sink else {
        unreachable!()
    };
    target.key = KafkaKey::None;
    for tenant in [&scoped, &keyless] {
        let result = deliver(&sink, tenant, &event(tenant, "a", "p".into())).await;
        assert_eq!(result.verdict, Verdict::Delivered, "{result:?}");
    }
    assert_eq!(sink.open_producers(), 1, "same settings share a producer");
    let records = read_all(&broker, &topic, 2);
    assert_eq!(
        records[0].key.as_deref(),
        Some(&b"TenantA/ProgramB/EnvC/a"[..])
    );
    assert_eq!(records[1].key, None);
}

#[tokio::test]
async fn broker_down_is_retried_then_delivered_after_it_returns() {
    let topic = unique_topic("outage");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    if !broker.supports_faults() {
        eprintln!("SKIPPED: broker outages need the mock broker");
        return;
    }
    let sink = sink();
    let tenant = tenant(&broker, &topic, &[("message.timeout.ms", "1500")]);
    let before = event(&tenant, "before", "1".into());
    delivered_eventually(&sink, &tenant, &before).await;

    broker.broker_down(1).unwrap();
    let during = event(&tenant, "during", "2".into());
    let started = Instant::now();
    let result = deliver(&sink, &tenant, &during).await;
    assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
    assert!(
        result
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("kafka"),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "bounded by message.timeout.ms: {:?}",
        started.elapsed()
    );

    broker.broker_up(1).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let result = deliver(&sink, &tenant, &during).await;
        if result.verdict == Verdict::Delivered {
            break;
        }
        assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
        assert!(Instant::now() < deadline, "never delivered: {result:?}");
    }
    let records = read_all(&broker, &topic, 2);
    let keys: Vec<_> = records.iter().map(|r| r.key.clone().unwrap()).collect();
    assert_eq!(keys, [b"before".to_vec(), b"during".to_vec()]);
}

#[tokio::test]
async fn an_unknown_topic_without_auto_creation_is_permanent() {
    let broker = KafkaBroker::start_with(1, &[]);
    if !broker.supports_faults() {
        eprintln!("SKIPPED: an external broker may create topics on demand");
        return;
    }
    let sink = sink();
    let tenant = tenant(
        &broker,
        "no-such-topic",
        &[
            ("allow.auto.create.topics", "false"),
            ("topic.metadata.propagation.max.ms", "300"),
        ],
    );
    let result = deliver(&sink, &tenant, &event(&tenant, "x", "p".into())).await;
    assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
    assert!(
        result
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("topic"),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_record_too_large_is_permanent() {
    let topic = unique_topic("large");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    let sink = sink();
    let tenant = tenant(&broker, &topic, &[("message.max.bytes", "1000")]);
    let result = deliver(&sink, &tenant, &event(&tenant, "big", "x".repeat(5_000))).await;
    assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
    assert!(
        result
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("large"),
        "{result:?}"
    );
}

#[tokio::test]
async fn forbidden_bootstrap_servers_are_refused() {
    let topic = unique_topic("egress");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    let sink = KafkaSink::new(
        KafkaSinkOptions::default(),
        EgressOptions {
            policy: EgressMode::PublicOnly,
            ..EgressOptions::default()
        },
    );
    let tenant = tenant(&broker, &topic, &[]);
    let result = deliver(&sink, &tenant, &event(&tenant, "x", "p".into())).await;
    assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
    assert!(
        result
            .error
            .as_deref()
            .unwrap_or_default()
            .starts_with("egress_blocked"),
        "{result:?}"
    );
    assert_eq!(sink.open_producers(), 0, "nothing was opened");
}

#[tokio::test]
async fn producers_are_bounded() {
    let topic = unique_topic("bounded");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    let sink = KafkaSink::new(
        KafkaSinkOptions {
            max_producers: 2,
            ..KafkaSinkOptions::default()
        },
        EgressOptions::internal(),
    );
    for (i, linger) in ["1", "2", "3", "1"].iter().enumerate() {
        let mut tenant = tenant(&broker, &topic, &[("linger.ms", linger)]);
        tenant.name = TenantName::new(format!("t{i}")).unwrap();
        let result = deliver(&sink, &tenant, &event(&tenant, "e", "p".into())).await;
        assert_eq!(result.verdict, Verdict::Delivered, "{result:?}");
        assert!(sink.open_producers() <= 2);
    }
    assert_eq!(sink.open_producers(), 2);
    assert_eq!(
        read_all(&broker, &topic, 4).len(),
        4,
        "none lost on eviction"
    );
}

#[tokio::test]
async fn settings_refused_by_the_allow_list_are_permanent_at_delivery() {
    let broker = KafkaBroker::start_with(1, &[]);
    let sink = sink();
    // A config that skipped registration (stored by an older version).
    let tenant = tenant(&broker, "t", &[("enable.idempotence", "false")]);
    let result = deliver(&sink, &tenant, &event(&tenant, "x", "p".into())).await;
    assert_eq!(result.verdict, Verdict::Permanent, "{result:?}");
    assert!(
        result
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("enable.idempotence"),
        "{result:?}"
    );
}

fn transactional(tenant: &mut TenantConfig) {
    let SinkConfig::Kafka(target) = &mut tenant.sink else {
        unreachable!()
    };
    target.transactional = true;
}

/// A read_committed consumer: only records of committed transactions (and
/// records produced outside transactions).
fn read_committed(broker: &KafkaBroker, topic: &str, linger: Duration) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", "belfry-sink-tests-committed")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let mut keys = Vec::new();
    let deadline = Instant::now() + linger;
    while Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.expect("consume");
            keys.push(String::from_utf8(message.key().unwrap_or_default().to_vec()).unwrap());
        }
    }
    keys
}

#[tokio::test]
async fn fenced_mode_commits_each_delivery_in_a_transaction() {
    let topic = unique_topic("fenced");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    let sink = sink();
    let mut tenant = tenant(&broker, &topic, &[]);
    transactional(&mut tenant);
    for id in ["t1", "t2"] {
        let result = deliver(&sink, &tenant, &event(&tenant, id, "p".into())).await;
        assert_eq!(result.verdict, Verdict::Delivered, "{result:?}");
    }
    // A dry run (no partition epoch) goes out without a transaction.
    let dry = sink
        .deliver(Delivery {
            tenant: &tenant,
            event: &event(&tenant, "dry", "p".into()),
            attempt: 0,
            triggered_at: triggered_at(),
            epoch: None,
        })
        .await;
    assert_eq!(dry.verdict, Verdict::Delivered, "{dry:?}");
    assert_eq!(
        sink.open_producers(),
        2,
        "one transactional, one idempotent"
    );
    let keys = read_committed(&broker, &topic, Duration::from_secs(3));
    assert_eq!(keys, ["t1", "t2", "dry"]);
}

/// Two nodes (two sinks with the same `cluster_id`) act for the same Belfry
/// partition in turn: the second one's producer takes the transactional id
/// over, and the first one, deposed, cannot commit.
#[tokio::test]
async fn a_deposed_node_cannot_commit() {
    let topic = unique_topic("deposed");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    if broker.supports_faults() {
        // librdkafka's mock cluster hands a second InitProducerId for the
        // same transactional id a new producer id instead of bumping the
        // epoch of the existing one, so it never fences: this needs a real
        // broker (BELFRY_TEST_KAFKA_BOOTSTRAP).
        eprintln!("SKIPPED: zombie fencing needs a real broker; the mock does not fence");
        return;
    }
    let old_owner = sink();
    let new_owner = sink();
    let mut tenant = tenant(&broker, &topic, &[]);
    transactional(&mut tenant);
    let before = deliver(&old_owner, &tenant, &event(&tenant, "before", "p".into())).await;
    assert_eq!(before.verdict, Verdict::Delivered, "{before:?}");
    let taken = deliver(&new_owner, &tenant, &event(&tenant, "taken", "p".into())).await;
    assert_eq!(taken.verdict, Verdict::Delivered, "{taken:?}");
    let zombie = deliver(&old_owner, &tenant, &event(&tenant, "zombie", "p".into())).await;
    assert_ne!(zombie.verdict, Verdict::Delivered, "{zombie:?}");
    let keys = read_committed(&broker, &topic, Duration::from_secs(3));
    assert!(!keys.contains(&"zombie".to_string()), "{keys:?}");
    assert!(keys.contains(&"before".to_string()) && keys.contains(&"taken".to_string()));
}

/// The producer's queue is bounded: with the broker away, a delivery that
/// finds it full is retried at once instead of queueing more memory.
#[tokio::test]
async fn a_full_producer_queue_is_a_retry() {
    let topic = unique_topic("full");
    let broker = KafkaBroker::start_with(1, &[(&topic, 1)]);
    if !broker.supports_faults() {
        eprintln!("SKIPPED: filling the queue needs the broker down (the mock)");
        return;
    }
    let sink = KafkaSink::new(
        KafkaSinkOptions {
            queue_max_messages: 1,
            ..KafkaSinkOptions::default()
        },
        EgressOptions::internal(),
    );
    let tenant = tenant(&broker, &topic, &[("message.timeout.ms", "3000")]);
    delivered_eventually(&sink, &tenant, &event(&tenant, "first", "p".into())).await;
    broker.broker_down(1).unwrap();
    let events: Vec<EventRecord> = (0..5)
        .map(|i| event(&tenant, &format!("e{i}"), "p".into()))
        .collect();
    let started = Instant::now();
    let results = futures::future::join_all(events.iter().map(|event| async {
        let result = deliver(&sink, &tenant, event).await;
        (result, started.elapsed())
    }))
    .await;
    let full: Vec<_> = results
        .iter()
        .filter(|(result, _)| {
            result
                .error
                .as_deref()
                .unwrap_or_default()
                .contains("queue is full")
        })
        .collect();
    assert!(
        full.len() >= 4,
        "one queued, the others refused: {results:?}"
    );
    for (result, took) in &full {
        assert_eq!(result.verdict, Verdict::Retry, "{result:?}");
        assert!(*took < Duration::from_secs(1), "refused at once: {took:?}");
    }
    assert!(
        results.iter().all(|(r, _)| r.verdict == Verdict::Retry),
        "{results:?}"
    );
}
