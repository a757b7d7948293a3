//! Tenants and where their events go.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::TenantName;

/// A registered tenant: its name and its delivery channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantConfig {
    pub name: TenantName,
    pub sink: SinkConfig,
}

/// Where and how a tenant's events are delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SinkConfig {
    /// `POST` to a webhook.
    Http(HttpTarget),
    /// A record on a Kafka topic (BigBen's `MESSAGING`).
    Kafka(KafkaTarget),
    /// A processor built into Belfry (BigBen's `CUSTOM_CLASS`), by name.
    Builtin(BuiltinTarget),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpTarget {
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Response timeout for one attempt; the node default when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaTarget {
    pub topic: String,
    /// Producer settings (`bootstrap.servers`, ...).
    #[serde(default)]
    pub props: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltinTarget {
    pub processor: String,
}

/// Why a sink configuration was refused. Safe to show to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkConfigError {
    #[error("url must start with http:// or https:// and name a host: {0:?}")]
    BadUrl(String),
    #[error("header name {0:?} is not a valid HTTP header name")]
    BadHeaderName(String),
    #[error("header {0:?} has a value that is not a valid HTTP header value")]
    BadHeaderValue(String),
    #[error("topic must not be empty")]
    EmptyTopic,
    #[error("processor name must not be empty")]
    EmptyProcessor,
}

impl SinkConfig {
    /// Checks what can be checked without the network.
    ///
    /// # Errors
    /// The first problem found, phrased for the client.
    pub fn validate(&self) -> Result<(), SinkConfigError> {
        match self {
            SinkConfig::Http(target) => target.validate(),
            SinkConfig::Kafka(target) if target.topic.trim().is_empty() => {
                Err(SinkConfigError::EmptyTopic)
            }
            SinkConfig::Kafka(_) => Ok(()),
            SinkConfig::Builtin(target) if target.processor.trim().is_empty() => {
                Err(SinkConfigError::EmptyProcessor)
            }
            SinkConfig::Builtin(_) => Ok(()),
        }
    }
}

impl HttpTarget {
    fn validate(&self) -> Result<(), SinkConfigError> {
        let rest = self
            .url
            .strip_prefix("http://")
            .or_else(|| self.url.strip_prefix("https://"))
            .ok_or_else(|| SinkConfigError::BadUrl(self.url.clone()))?;
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host_ok = !host.is_empty()
            && !host.starts_with(':')
            && !self
                .url
                .chars()
                .any(|c| c.is_whitespace() || c.is_control());
        if !host_ok {
            return Err(SinkConfigError::BadUrl(self.url.clone()));
        }
        for (name, value) in &self.headers {
            let name_ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !name_ok {
                return Err(SinkConfigError::BadHeaderName(name.clone()));
            }
            if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(SinkConfigError::BadHeaderValue(name.clone()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(url: &str) -> SinkConfig {
        SinkConfig::Http(HttpTarget {
            url: url.into(),
            headers: BTreeMap::new(),
            timeout_ms: None,
        })
    }

    #[test]
    fn validates_urls() {
        assert!(http("http://127.0.0.1:9000/hook").validate().is_ok());
        assert!(http("https://svc.internal/callbacks").validate().is_ok());
        assert!(http("ftp://x").validate().is_err());
        assert!(http("http://").validate().is_err());
        assert!(http("http:// spaced").validate().is_err());
        assert!(http("not a url").validate().is_err());
    }

    #[test]
    fn validates_headers() {
        let mut headers = BTreeMap::new();
        headers.insert("bad header".to_string(), "v".to_string());
        let sink = SinkConfig::Http(HttpTarget {
            url: "http://h/".into(),
            headers,
            timeout_ms: None,
        });
        assert_eq!(
            sink.validate(),
            Err(SinkConfigError::BadHeaderName("bad header".into()))
        );
    }
}
