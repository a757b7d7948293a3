//! Options of the Kafka sink. Each field's doc comment is the user
//! reference (config key `sinks.kafka.<field>`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How the node's Kafka producers behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSinkOptions {
    /// Producers kept open at once. Tenants with the same bootstrap servers
    /// and settings share one; when more distinct sets are in use, the
    /// least recently used producer is closed (after its records are
    /// acknowledged) and reopened when needed.
    pub max_producers: usize,
    /// How long one delivery may wait for the broker's acknowledgement,
    /// including librdkafka's own retries (`message.timeout.ms`), in
    /// milliseconds. A tenant's `message.timeout.ms` overrides it, up to
    /// `max_message_timeout_ms`.
    pub message_timeout_ms: u64,
    /// The longest a tenant's own `message.timeout.ms` may hold a delivery
    /// slot, in milliseconds.
    pub max_message_timeout_ms: u64,
    /// Records queued in one producer at most
    /// (`queue.buffering.max.messages`); a delivery that finds the queue
    /// full is retried later.
    pub queue_max_messages: u32,
    /// Bytes of records queued in one producer at most, in KiB
    /// (`queue.buffering.max.kbytes`).
    pub queue_max_kbytes: u32,
    /// How long a producer waits to batch records (`linger.ms`); a tenant
    /// may set its own.
    pub linger_ms: u32,
    /// Names this Belfry cluster to Kafka in the fenced (transactional)
    /// mode: transactional ids are `<cluster_id>-<settings>-p<partition>`.
    /// Every node of one cluster must have the same value (so that the new
    /// owner of a partition fences the old one); two Belfry clusters that
    /// share a Kafka cluster must have different values.
    pub cluster_id: String,
}

impl Default for KafkaSinkOptions {
    fn default() -> Self {
        KafkaSinkOptions {
            max_producers: 32,
            message_timeout_ms: 10_000,
            max_message_timeout_ms: 30_000,
            queue_max_messages: 20_000,
            queue_max_kbytes: 16 * 1024,
            linger_ms: 5,
            cluster_id: "belfry".to_string(),
        }
    }
}

impl KafkaSinkOptions {
    /// The produce limit for a tenant: its own `message.timeout.ms` (or
    /// `delivery.timeout.ms`, the Java name) when set and non-zero, capped
    /// at `max_message_timeout_ms`; else the node's.
    pub fn message_timeout(&self, tenant_ms: Option<u64>) -> Duration {
        Duration::from_millis(
            tenant_ms
                .filter(|ms| *ms > 0)
                .map(|ms| ms.min(self.max_message_timeout_ms.max(1)))
                .unwrap_or(self.message_timeout_ms)
                .max(1),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_timeouts_are_capped() {
        let options = KafkaSinkOptions::default();
        assert_eq!(
            options.message_timeout(Some(3_600_000)),
            Duration::from_secs(30)
        );
        assert_eq!(options.message_timeout(Some(2_000)), Duration::from_secs(2));
        assert_eq!(options.message_timeout(None), Duration::from_secs(10));
        assert_eq!(options.message_timeout(Some(0)), Duration::from_secs(10));
    }
}
