//! Options of the Kafka sink. Each field's doc comment is the user
//! reference (config key `sinks.kafka.<field>`).

use std::time::Duration;

use belfry_core::config::{ConfigKeys, Problems};
use serde::{Deserialize, Serialize};

/// How the node's Kafka producers behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSinkOptions {
    /// Producers kept open at once. Tenants with the same bootstrap servers
    /// and settings share one; when more distinct sets are in use, the
    /// least recently used producer is closed (after its records are
    /// acknowledged) and reopened when needed.
    pub max_producers: usize,
    /// How long one delivery may wait for the broker's acknowledgement,
    /// including librdkafka's own retries (`message.timeout.ms`). A
    /// tenant's `message.timeout.ms` overrides it, up to
    /// `max_message_timeout_ms`.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "message_timeout_ms"
    )]
    pub message_timeout: Duration,
    /// The longest a tenant's own `message.timeout.ms` may hold a delivery
    /// slot.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "max_message_timeout_ms"
    )]
    pub max_message_timeout: Duration,
    /// Records queued in one producer at most
    /// (`queue.buffering.max.messages`); a delivery that finds the queue
    /// full is retried later.
    pub queue_max_messages: u32,
    /// Bytes of records queued in one producer at most, in KiB
    /// (`queue.buffering.max.kbytes`).
    pub queue_max_kbytes: u32,
    /// How long a producer waits to batch records (`linger.ms`); a tenant
    /// may set its own.
    #[serde(with = "belfry_core::time::serde_millis", rename = "linger_ms")]
    pub linger: Duration,
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
            message_timeout: Duration::from_secs(10),
            max_message_timeout: Duration::from_secs(30),
            queue_max_messages: 20_000,
            queue_max_kbytes: 16 * 1024,
            linger: Duration::from_millis(5),
            cluster_id: "belfry".to_string(),
        }
    }
}

impl KafkaSinkOptions {
    /// Refuses zero counts and timeouts, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("max_producers", self.max_producers);
        problems.at_least_one("message_timeout_ms", self.message_timeout);
        problems.at_least_one("max_message_timeout_ms", self.max_message_timeout);
        problems.at_least_one("queue_max_messages", self.queue_max_messages);
        problems.at_least_one("queue_max_kbytes", self.queue_max_kbytes);
    }

    /// The produce limit for a tenant: its own `message.timeout.ms` (or
    /// `delivery.timeout.ms`, the Java name) when set and non-zero, capped
    /// at `max_message_timeout_ms`; else the node's.
    pub fn message_timeout_for(&self, tenant_ms: Option<u64>) -> Duration {
        let least = Duration::from_millis(1);
        tenant_ms
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms).min(self.max_message_timeout.max(least)))
            .unwrap_or(self.message_timeout)
            .max(least)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_timeouts_are_capped() {
        let options = KafkaSinkOptions::default();
        assert_eq!(
            options.message_timeout_for(Some(3_600_000)),
            Duration::from_secs(30)
        );
        assert_eq!(
            options.message_timeout_for(Some(2_000)),
            Duration::from_secs(2)
        );
        assert_eq!(options.message_timeout_for(None), Duration::from_secs(10));
        assert_eq!(
            options.message_timeout_for(Some(0)),
            Duration::from_secs(10)
        );
    }
}
