//! Options of the webhook client. Each field's doc comment is the user
//! reference (config key `http.<field>`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How the node's one shared webhook client behaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSinkOptions {
    /// Limit for opening a connection (TCP and TLS), in milliseconds.
    pub connect_timeout_ms: u64,
    /// Limit for one attempt, from connecting until the response is read,
    /// in milliseconds. A tenant's `timeout_ms` overrides it, up to
    /// `max_tenant_timeout_ms`.
    pub request_timeout_ms: u64,
    /// The longest a tenant's own `timeout_ms` may hold a delivery slot, in
    /// milliseconds: a tenant asking for an hour gets this. Hung webhooks
    /// then free their slots within it.
    pub max_tenant_timeout_ms: u64,
    /// Idle keep-alive connections kept per receiver host. Match it to the
    /// engine's in-flight limit so a busy receiver never pays for reconnects.
    pub pool_max_idle_per_host: usize,
    /// How long an idle connection is kept open, in milliseconds.
    pub pool_idle_timeout_ms: u64,
    /// The `User-Agent` header of every delivery.
    pub user_agent: String,
}

impl Default for HttpSinkOptions {
    fn default() -> Self {
        HttpSinkOptions {
            connect_timeout_ms: 2_000,
            request_timeout_ms: 10_000,
            max_tenant_timeout_ms: 30_000,
            pool_max_idle_per_host: 1_024,
            pool_idle_timeout_ms: 90_000,
            user_agent: concat!("belfry/", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

impl HttpSinkOptions {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The attempt limit for a tenant: its own `timeout_ms` when set and
    /// non-zero, capped at `max_tenant_timeout_ms`; else the node's.
    pub fn request_timeout(&self, tenant_timeout_ms: Option<u64>) -> Duration {
        Duration::from_millis(
            tenant_timeout_ms
                .filter(|ms| *ms > 0)
                .map(|ms| ms.min(self.max_tenant_timeout_ms.max(1)))
                .unwrap_or(self.request_timeout_ms),
        )
    }

    pub fn pool_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.pool_idle_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_timeouts_are_capped() {
        let options = HttpSinkOptions::default();
        let hour = 3_600_000;
        assert_eq!(
            options.request_timeout(Some(hour)),
            Duration::from_secs(30),
            "an hour-long tenant timeout is capped"
        );
        assert_eq!(options.request_timeout(Some(5_000)), Duration::from_secs(5));
        assert_eq!(options.request_timeout(None), Duration::from_secs(10));
        assert_eq!(options.request_timeout(Some(0)), Duration::from_secs(10));
    }
}
