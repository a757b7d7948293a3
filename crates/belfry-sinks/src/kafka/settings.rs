//! A tenant's producer settings: the allow-list every registration is
//! checked against, and how `bootstrap.servers` reads.
//!
//! BigBen passed every `MESSAGING` prop but `topic` to its producer as is.
//! Belfry accepts the settings below (librdkafka's names) and refuses
//! everything else with a message naming the key: a setting that could
//! weaken delivery (`acks=1`, `enable.idempotence=false`), reach the
//! node's files or run programs (`ssl.*.location`, `sasl.kerberos.kinit.cmd`,
//! `plugin.library.paths`), take over what Belfry manages
//! (`transactional.id`, the producer queue bounds) or is simply unknown.
//!
//! Pure: no librdkafka here, so registration checks run in every build.

use std::collections::BTreeMap;

/// The most settings a tenant may give.
pub const MAX_SETTINGS: usize = 48;
/// The longest setting value, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

/// The Kafka port when `bootstrap.servers` names none.
pub const DEFAULT_PORT: u16 = 9092;

/// Java client settings BigBen clients pass that mean nothing to
/// Belfry's producer (records are bytes already): accepted and ignored.
pub const IGNORED: &[&str] = &["key.serializer", "value.serializer"];

/// What a setting's value may be.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// A whole number in `min..=max`.
    Int(i64, i64),
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// `true` or `false`.
    Bool,
    /// Any text without control characters.
    Text,
    /// `host:port,...`.
    Servers,
}

/// The settings a tenant may give, with what their values may be.
const ALLOWED: &[(&str, Rule)] = &[
    ("bootstrap.servers", Rule::Servers),
    ("metadata.broker.list", Rule::Servers),
    ("client.id", Rule::Text),
    // Idempotent and acknowledged by every in-sync replica: Belfry's
    // defaults, which a tenant may only repeat.
    ("acks", Rule::OneOf(&["all", "-1"])),
    ("request.required.acks", Rule::OneOf(&["all", "-1"])),
    ("enable.idempotence", Rule::OneOf(&["true"])),
    (
        "compression.type",
        Rule::OneOf(&["none", "gzip", "snappy", "lz4"]),
    ),
    (
        "compression.codec",
        Rule::OneOf(&["none", "gzip", "snappy", "lz4"]),
    ),
    ("compression.level", Rule::Int(-1, 12)),
    ("linger.ms", Rule::Int(0, 5_000)),
    ("queue.buffering.max.ms", Rule::Int(0, 5_000)),
    ("batch.size", Rule::Int(1, 16 * 1024 * 1024)),
    ("batch.num.messages", Rule::Int(1, 100_000)),
    ("message.max.bytes", Rule::Int(1_000, 100 * 1024 * 1024)),
    // Capped by the node's `sinks.kafka.max_message_timeout_ms` when used.
    ("message.timeout.ms", Rule::Int(1, 3_600_000)),
    ("delivery.timeout.ms", Rule::Int(1, 3_600_000)),
    ("request.timeout.ms", Rule::Int(1, 900_000)),
    ("retries", Rule::Int(1, i32::MAX as i64)),
    ("message.send.max.retries", Rule::Int(1, i32::MAX as i64)),
    ("retry.backoff.ms", Rule::Int(1, 300_000)),
    ("retry.backoff.max.ms", Rule::Int(1, 300_000)),
    ("max.in.flight.requests.per.connection", Rule::Int(1, 5)),
    ("max.in.flight", Rule::Int(1, 5)),
    (
        "partitioner",
        Rule::OneOf(&[
            "random",
            "consistent",
            "consistent_random",
            "murmur2",
            "murmur2_random",
            "fnv1a",
            "fnv1a_random",
        ]),
    ),
    ("allow.auto.create.topics", Rule::Bool),
    ("topic.metadata.propagation.max.ms", Rule::Int(0, 3_600_000)),
    (
        "topic.metadata.refresh.interval.ms",
        Rule::Int(-1, 3_600_000),
    ),
    ("metadata.max.age.ms", Rule::Int(1, 86_400_000)),
    ("socket.timeout.ms", Rule::Int(10, 300_000)),
    (
        "socket.connection.setup.timeout.ms",
        Rule::Int(1_000, 300_000),
    ),
    ("socket.keepalive.enable", Rule::Bool),
    ("connections.max.idle.ms", Rule::Int(0, 86_400_000)),
    ("reconnect.backoff.ms", Rule::Int(0, 3_600_000)),
    ("reconnect.backoff.max.ms", Rule::Int(0, 3_600_000)),
    ("broker.address.family", Rule::OneOf(&["any", "v4", "v6"])),
    // This build has no TLS in its Kafka client (no OpenSSL): plaintext,
    // optionally with SASL/PLAIN.
    (
        "security.protocol",
        Rule::OneOf(&["plaintext", "sasl_plaintext"]),
    ),
    ("sasl.mechanism", Rule::OneOf(&["PLAIN"])),
    ("sasl.mechanisms", Rule::OneOf(&["PLAIN"])),
    ("sasl.username", Rule::Text),
    // Write-only: answers mask it.
    ("sasl.password", Rule::Text),
];

/// Settings refused with a reason more useful than "unknown".
fn refusal_reason(name: &str) -> Option<&'static str> {
    let reason = match name {
        "transactional.id" | "transaction.timeout.ms" => {
            "Belfry manages transactions itself (the fenced delivery mode)"
        }
        "queue.buffering.max.messages" | "queue.buffering.max.kbytes" | "buffer.memory" => {
            "the producer queue is bounded by the node (sinks.kafka)"
        }
        "plugin.library.paths" | "interceptor.classes" => {
            "plugins and interceptors are not allowed"
        }
        "max.request.size" => "use message.max.bytes (librdkafka's name)",
        _ if name.starts_with("ssl.") || name.starts_with("ssl_") => {
            "TLS settings (and file paths on the node) are not accepted from tenants; this build's Kafka client has no TLS"
        }
        _ if name.starts_with("sasl.kerberos.") || name.starts_with("sasl.oauthbearer.") => {
            "only SASL/PLAIN is supported"
        }
        _ if name.ends_with(".location") || name.ends_with(".cmd") || name.ends_with("_cb") => {
            "settings that name files, commands or callbacks on the node are not allowed"
        }
        _ => return None,
    };
    Some(reason)
}

/// Why a tenant's settings were refused; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("props.bootstrap.servers is required for Kafka delivery")]
    MissingServers,
    #[error("at most {MAX_SETTINGS} producer settings are allowed, got {0}")]
    TooMany(usize),
    #[error("producer setting {0:?} is not allowed: {1}")]
    Refused(String, &'static str),
    #[error("producer setting {0:?} is unknown or not supported (allowed: {1})")]
    Unknown(String, String),
    #[error("producer setting {name:?}: {reason}")]
    BadValue { name: String, reason: String },
}

/// At most 64 characters of a client-given name, for messages.
fn echo(name: &str) -> String {
    name.chars().take(64).collect()
}

/// Checks `props` (every setting but `topic`) against the allow-list.
///
/// # Errors
/// The first refused setting, by name.
pub fn validate(props: &BTreeMap<String, String>) -> Result<(), SettingsError> {
    if props.len() > MAX_SETTINGS {
        return Err(SettingsError::TooMany(props.len()));
    }
    for (name, value) in props {
        if IGNORED.contains(&name.as_str()) {
            continue;
        }
        if let Some(reason) = refusal_reason(name) {
            return Err(SettingsError::Refused(echo(name), reason));
        }
        let Some((_, rule)) = ALLOWED.iter().find(|(allowed, _)| *allowed == name) else {
            return Err(SettingsError::Unknown(echo(name), allowed_names()));
        };
        let bad = |reason: String| SettingsError::BadValue {
            name: name.clone(),
            reason,
        };
        if value.len() > MAX_VALUE_LEN {
            return Err(bad(format!("longer than {MAX_VALUE_LEN} bytes")));
        }
        if value.chars().any(char::is_control) {
            return Err(bad("contains control characters".into()));
        }
        match *rule {
            Rule::Int(min, max) => match value.trim().parse::<i64>() {
                Ok(n) if (min..=max).contains(&n) => {}
                _ => return Err(bad(format!("must be a whole number from {min} to {max}"))),
            },
            Rule::OneOf(words) => {
                if !words.contains(&value.as_str()) {
                    return Err(bad(format!("must be one of {}", words.join(", "))));
                }
            }
            Rule::Bool => {
                if value != "true" && value != "false" {
                    return Err(bad("must be true or false".into()));
                }
            }
            Rule::Text => {}
            Rule::Servers => {
                parse_servers(value).map_err(bad)?;
            }
        }
    }
    if servers_of(props).is_none() {
        return Err(SettingsError::MissingServers);
    }
    Ok(())
}

fn allowed_names() -> String {
    ALLOWED
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The bootstrap servers a tenant named (`bootstrap.servers`, or its
/// alias `metadata.broker.list`).
pub fn servers_of(props: &BTreeMap<String, String>) -> Option<&str> {
    props
        .get("bootstrap.servers")
        .or_else(|| props.get("metadata.broker.list"))
        .map(String::as_str)
        .filter(|servers| !servers.trim().is_empty())
}

/// One entry of `bootstrap.servers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// A host name or an IP address (without brackets).
    pub host: String,
    pub port: u16,
}

/// `host:port,...` as librdkafka reads it: entries separated by commas,
/// each optionally prefixed `plaintext://` (any `scheme://`), IPv6 in
/// brackets, port [`DEFAULT_PORT`] when missing.
///
/// # Errors
/// An empty list, an empty host or an invalid port.
pub fn parse_servers(text: &str) -> Result<Vec<Server>, String> {
    let mut servers = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let entry = entry.split_once("://").map_or(entry, |(_, rest)| rest);
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{entry:?} has an unclosed ["))?;
            (host, after.strip_prefix(':'))
        } else {
            match entry.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (entry, None),
            }
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
        {
            return Err(format!("{:?} is not a valid host", echo(host)));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(port) => match port.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => return Err(format!("{:?} is not a valid port", echo(port))),
            },
        };
        servers.push(Server {
            host: host.to_string(),
            port,
        });
    }
    if servers.is_empty() {
        return Err("names no server".into());
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn servers() -> (&'static str, &'static str) {
        ("bootstrap.servers", "k1:9092,k2:9093")
    }

    #[test]
    fn bigben_props_pass() {
        assert_eq!(validate(&props(&[servers()])), Ok(()));
        assert_eq!(
            validate(&props(&[
                servers(),
                ("acks", "all"),
                ("linger.ms", "10"),
                ("compression.type", "lz4"),
                (
                    "key.serializer",
                    "org.apache.kafka.common.serialization.StringSerializer"
                ),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
                ("security.protocol", "sasl_plaintext"),
                ("sasl.mechanism", "PLAIN"),
            ])),
            Ok(())
        );
    }

    #[test]
    fn unsafe_and_unknown_settings_name_the_key() {
        for (name, value) in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("acks", "0"),
            ("transactional.id", "x"),
            ("ssl.ca.location", "/etc/passwd"),
            ("ssl.keystore.location", "/k"),
            ("sasl.kerberos.kinit.cmd", "rm -rf /"),
            ("plugin.library.paths", "/tmp/evil.so"),
            ("interceptor.classes", "x"),
            ("queue.buffering.max.messages", "10000000"),
            ("no.such.setting", "1"),
            ("test.mock.num.brokers", "3"),
            ("debug", "all"),
            ("linger.ms", "abc"),
            ("max.in.flight", "6"),
            ("security.protocol", "ssl"),
        ] {
            let error = validate(&props(&[servers(), (name, value)])).unwrap_err();
            assert!(error.to_string().contains(name), "{name}: {error}");
        }
        assert_eq!(
            validate(&props(&[("acks", "all")])),
            Err(SettingsError::MissingServers)
        );
    }

    #[test]
    fn servers_parse_like_librdkafka() {
        let parsed = parse_servers("PLAINTEXT://a:1, [::1]:2,b,10.0.0.1:9093").unwrap();
        let pairs: Vec<_> = parsed.iter().map(|s| (s.host.as_str(), s.port)).collect();
        assert_eq!(
            pairs,
            [
                ("a", 1),
                ("::1", 2),
                ("b", DEFAULT_PORT),
                ("10.0.0.1", 9093)
            ]
        );
        for bad in ["", " , ", "a:0", "a:x", "[::1", "a b:1", ":9092"] {
            assert!(parse_servers(bad).is_err(), "{bad:?}");
        }
    }
}
