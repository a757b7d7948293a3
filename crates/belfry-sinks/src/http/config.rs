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
    /// in milliseconds. A tenant's `timeout_ms` overrides it.
    pub request_timeout_ms: u64,
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
    /// non-zero, else the node's.
    pub fn request_timeout(&self, tenant_timeout_ms: Option<u64>) -> Duration {
        Duration::from_millis(
            tenant_timeout_ms
                .filter(|ms| *ms > 0)
                .unwrap_or(self.request_timeout_ms),
        )
    }

    pub fn pool_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.pool_idle_timeout_ms)
    }
}
