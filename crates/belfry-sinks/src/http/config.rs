//! Options of the webhook client. Each field's doc comment is the user
//! reference (config key `http.<field>`).

use std::time::Duration;

use belfry_core::config::{ConfigKeys, Problems};
use serde::{Deserialize, Serialize};

/// How the node's one shared webhook client behaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSinkOptions {
    /// Limit for opening a connection (TCP and TLS).
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "connect_timeout_ms"
    )]
    pub connect_timeout: Duration,
    /// Limit for one attempt, from connecting until the response is read.
    /// A tenant's `timeout_ms` overrides it, up to `max_tenant_timeout_ms`.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "request_timeout_ms"
    )]
    pub request_timeout: Duration,
    /// The longest a tenant's own `timeout_ms` may hold a delivery slot: a
    /// tenant asking for an hour gets this. Hung webhooks then free their
    /// slots within it.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "max_tenant_timeout_ms"
    )]
    pub max_tenant_timeout: Duration,
    /// Idle keep-alive connections kept per receiver host. Match it to the
    /// engine's in-flight limit so a busy receiver never pays for
    /// reconnects. `0`: no keep-alive.
    pub pool_max_idle_per_host: usize,
    /// How long an idle connection is kept open.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "pool_idle_timeout_ms"
    )]
    pub pool_idle_timeout: Duration,
    /// The `User-Agent` header of every delivery.
    #[config(default = "`belfry/` and the version")]
    pub user_agent: String,
}

impl Default for HttpSinkOptions {
    fn default() -> Self {
        HttpSinkOptions {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            max_tenant_timeout: Duration::from_secs(30),
            pool_max_idle_per_host: 1_024,
            pool_idle_timeout: Duration::from_secs(90),
            user_agent: concat!("belfry/", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

impl HttpSinkOptions {
    /// Refuses zero timeouts, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("connect_timeout_ms", self.connect_timeout);
        problems.at_least_one("request_timeout_ms", self.request_timeout);
        problems.at_least_one("max_tenant_timeout_ms", self.max_tenant_timeout);
        if self.pool_idle_timeout.is_zero() {
            let key = problems.key("pool_idle_timeout_ms");
            let idle = problems.key("pool_max_idle_per_host");
            problems.push(format!(
                "{key} must be at least 1, not 0 (to keep no idle connections, set {idle} = 0)"
            ));
        }
    }

    /// The attempt limit for a tenant: its own `timeout_ms` when set and
    /// non-zero, capped at `max_tenant_timeout_ms`; else the node's.
    pub fn timeout_for(&self, tenant_timeout_ms: Option<u64>) -> Duration {
        tenant_timeout_ms
            .filter(|ms| *ms > 0)
            .map(|ms| {
                Duration::from_millis(ms).min(self.max_tenant_timeout.max(Duration::from_millis(1)))
            })
            .unwrap_or(self.request_timeout)
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
            options.timeout_for(Some(hour)),
            Duration::from_secs(30),
            "an hour-long tenant timeout is capped"
        );
        assert_eq!(options.timeout_for(Some(5_000)), Duration::from_secs(5));
        assert_eq!(options.timeout_for(None), Duration::from_secs(10));
        assert_eq!(options.timeout_for(Some(0)), Duration::from_secs(10));
    }
}
