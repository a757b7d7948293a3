//! [`LogSink`]: one `info` log line per delivery, always delivered.

use async_trait::async_trait;

use crate::{Delivery, DeliveryResult, Sink};

/// The name tenants use to pick this processor (`eventProcessorClass`).
pub const PROCESSOR_NAME: &str = "log";

/// The tracing target of delivery lines, so they can be filtered apart.
pub const LOG_TARGET: &str = "belfry::delivery";

/// Writes the delivery to the log with `tracing::info!`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogSink;

#[async_trait]
impl Sink for LogSink {
    async fn deliver(&self, delivery: Delivery<'_>) -> DeliveryResult {
        let event = delivery.event;
        tracing::info!(
            target: LOG_TARGET,
            tenant = event.key.tenant.as_str(),
            id = event.key.id.as_str(),
            version = event.version.as_str(),
            attempt = delivery.attempt,
            scheduled_at = %event.event_time,
            triggered_at = %delivery.triggered_at,
            payload = event.payload.as_deref().unwrap_or(""),
            "event delivered to the log processor"
        );
        DeliveryResult::delivered(None)
    }
}

#[cfg(test)]
mod tests {
    use belfry_core::tenant::BuiltinTarget;
    use belfry_core::{
        DeliveryOption, EventId, EventKey, SinkConfig, TenantConfig, TenantName, Timestamp, Verdict,
    };

    use super::*;

    #[tokio::test]
    async fn always_delivered() {
        let tenant = TenantConfig {
            name: TenantName::new("t").unwrap(),
            sink: SinkConfig::Builtin(BuiltinTarget {
                processor: PROCESSOR_NAME.into(),
            }),
            signing: None,
            notify: None,
        };
        let at = Timestamp::from_millis(1_000);
        let key = EventKey::new(tenant.name.clone(), EventId::new("e").unwrap());
        let event = crate::scheduled_event(key, at, None, DeliveryOption::FullEvent);
        let result = LogSink
            .deliver(Delivery {
                tenant: &tenant,
                event: &event,
                attempt: 1,
                triggered_at: at,
                epoch: Some(0),
            })
            .await;
        assert_eq!(result.verdict, Verdict::Delivered);
        assert_eq!(result.error, None);
    }
}
