//! Write-only secrets: what a tenant's sink looks like in an answer.
//!
//! A tenant's header values (the `Authorization` its webhook expects),
//! the credentials in its URL (`user:password@`) and Kafka settings that
//! name a secret are accepted and stored, but every answer shows
//! [`MASK`] in their place, whoever asks (admins included): a secret read
//! back is a secret leaked to every script and log that sees the answer.
//! The shape of the answer does not change (BigBen clients parse it).

use belfry_core::SinkConfig;

/// What a secret value reads as.
pub const MASK: &str = "****";

/// `sink` as answers show it.
pub fn sink(sink: &SinkConfig) -> SinkConfig {
    let mut shown = sink.clone();
    match &mut shown {
        SinkConfig::Http(target) => {
            target.url = url(&target.url);
            for value in target.headers.values_mut() {
                *value = MASK.to_string();
            }
        }
        SinkConfig::Kafka(target) => {
            for (name, value) in &mut target.props {
                if secret_setting(name) {
                    *value = MASK.to_string();
                }
            }
        }
        SinkConfig::Builtin(_) | SinkConfig::Pull(_) => {}
    }
    shown
}

/// `url` with any `user:password@` replaced by `****@`. The authority is
/// found as the URL parser finds it, past any number of `/` or `\\` after
/// the scheme (`http:///u:p@h` was once accepted and stored, and is
/// delivered to `h` with those credentials).
pub fn url(url: &str) -> String {
    let Some(scheme_end) = url.find(':') else {
        return url.to_string();
    };
    let after_scheme = &url[scheme_end + 1..];
    let slashes = after_scheme.len() - after_scheme.trim_start_matches(['/', '\\']).len();
    if slashes == 0 {
        return url.to_string();
    }
    let authority_start = scheme_end + 1 + slashes;
    let rest = &url[authority_start..];
    let authority_len = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    match authority.rfind('@') {
        Some(at) => format!(
            "{}{MASK}{}",
            &url[..authority_start],
            &url[authority_start + at..]
        ),
        None => url.to_string(),
    }
}

/// Kafka client settings whose values are secrets (`sasl.password`,
/// `ssl.key.password`, `sasl.jaas.config`, `sasl.oauthbearer.client.secret`…).
fn secret_setting(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "token",
        "ssl.key.pem",
        "credential",
    ]
    .iter()
    .any(|word| name.contains(word))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use belfry_core::tenant::{HttpTarget, KafkaTarget};

    use super::*;

    #[test]
    fn urls_lose_their_credentials_only() {
        assert_eq!(url("http://u:p@h:1/x?a=b"), "http://****@h:1/x?a=b");
        assert_eq!(url("https://token@h/x"), "https://****@h/x");
        assert_eq!(url("http://a:b@c@h/"), "http://****@h/");
        assert_eq!(url("http://h/x@y"), "http://h/x@y");
        assert_eq!(url("http://h:8080/x"), "http://h:8080/x");
        assert_eq!(url("not a url"), "not a url");
        // Stored by older versions: the parser skips the extra slashes.
        assert_eq!(url("http:///u:p@h/x"), "http:///****@h/x");
        assert_eq!(url("http:\\\\u:p@h/x"), "http:\\\\****@h/x");
    }

    #[test]
    fn header_values_and_secret_settings_are_masked() {
        let http = SinkConfig::Http(HttpTarget {
            url: "http://user:pw@h/x".into(),
            headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
            timeout_ms: Some(5),
            delivery: Default::default(),
        });
        let shown = serde_json::to_string(&sink(&http)).unwrap();
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw"),
            "{shown}"
        );
        assert!(shown.contains("Authorization") && shown.contains(MASK));
        let kafka = SinkConfig::Kafka(KafkaTarget {
            topic: "t".into(),
            props: BTreeMap::from([
                ("bootstrap.servers".into(), "k:9092".into()),
                ("sasl.password".into(), "hunter2".into()),
            ]),
            key: Default::default(),
            transactional: false,
            delivery: Default::default(),
        });
        let shown = serde_json::to_string(&sink(&kafka)).unwrap();
        assert!(
            !shown.contains("hunter2") && shown.contains("k:9092"),
            "{shown}"
        );
    }
}
