//! Tenants and where their events go.

use std::collections::BTreeMap;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{QueueName, TenantName};
use crate::retry::{Backoff, BackoffError};
use crate::time::Timestamp;

/// A registered tenant: its name, its delivery channel and the secrets its
/// deliveries are signed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantConfig {
    pub name: TenantName,
    pub sink: SinkConfig,
    /// Standard Webhooks signing secrets; `None` (a tenant registered
    /// before signing existed): deliveries go out unsigned until a secret
    /// is rotated in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<SigningSecrets>,
    /// Where the tenant's notices go (`crate::notice`); `None`: none are
    /// raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<NotifyTarget>,
}

/// A tenant's notice target: a webhook or a Kafka topic. Stored as JSON
/// (`{"url": ...}` or `{"kafka_topic": ...}`). Notices are signed with the
/// tenant's secrets and, on Kafka, produced with its sink's producer
/// settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NotifyTarget {
    Url { url: String },
    KafkaTopic { kafka_topic: String },
}

impl NotifyTarget {
    /// Checks what can be checked without the network, like a sink.
    ///
    /// # Errors
    /// The first problem found, phrased for the client.
    pub fn validate(&self) -> Result<(), SinkConfigError> {
        match self {
            NotifyTarget::Url { url } => validate_url(url).map(|_| ()),
            NotifyTarget::KafkaTopic { kafka_topic } if kafka_topic.trim().is_empty() => {
                Err(SinkConfigError::EmptyTopic)
            }
            NotifyTarget::KafkaTopic { .. } => Ok(()),
        }
    }

    /// The sink a notice of a tenant delivering to `sink` goes out
    /// through: the sink's timeout and Kafka producer settings, but not
    /// its headers (they may hold credentials for another host) nor its
    /// delivery defaults (notices retry by the node's policy).
    pub fn sink(&self, sink: &SinkConfig) -> SinkConfig {
        match self {
            NotifyTarget::Url { url } => SinkConfig::Http(HttpTarget {
                url: url.clone(),
                headers: BTreeMap::new(),
                timeout_ms: match sink {
                    SinkConfig::Http(http) => http.timeout_ms,
                    _ => None,
                },
                delivery: DeliveryDefaults::default(),
            }),
            NotifyTarget::KafkaTopic { kafka_topic } => SinkConfig::Kafka(KafkaTarget {
                topic: kafka_topic.clone(),
                props: match sink {
                    SinkConfig::Kafka(kafka) => kafka.props.clone(),
                    _ => BTreeMap::new(),
                },
                key: KafkaKey::None,
                transactional: false,
                delivery: DeliveryDefaults::default(),
            }),
        }
    }
}

/// A tenant's webhook signing secrets, `whsec_<base64 key>` as the
/// Standard Webhooks specification writes them. Written by the API (which
/// generates them) and read by the sinks (which sign with them); never in
/// an answer after the one that created them. `Debug` hides them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningSecrets {
    /// Signs every delivery.
    pub current: String,
    /// The secret `current` replaced: deliveries carry its signature too
    /// (space-separated) until it expires, so receivers can switch without
    /// refusing anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousSecret>,
}

/// A rotated-out secret and when it stops signing.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecret {
    pub secret: String,
    pub expires_at: Timestamp,
}

impl SigningSecrets {
    /// Only `current`.
    pub fn new(current: String) -> Self {
        SigningSecrets {
            current,
            previous: None,
        }
    }

    /// `next` becomes current; the current one keeps signing until
    /// `old_expires_at`. A previous secret still alive is dropped (only two
    /// signatures at a time).
    pub fn rotated(&self, next: String, old_expires_at: Timestamp) -> Self {
        SigningSecrets {
            current: next,
            previous: Some(PreviousSecret {
                secret: self.current.clone(),
                expires_at: old_expires_at,
            }),
        }
    }

    /// The secrets that sign a delivery at `now`: current first, then the
    /// previous one while it lives.
    pub fn active(&self, now: Timestamp) -> impl Iterator<Item = &str> {
        std::iter::once(self.current.as_str()).chain(
            self.previous
                .as_ref()
                .filter(|previous| now < previous.expires_at)
                .map(|previous| previous.secret.as_str()),
        )
    }
}

impl fmt::Debug for SigningSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningSecrets")
            .field("current", &"<redacted>")
            .field(
                "previous_expires_at",
                &self.previous.as_ref().map(|p| p.expires_at),
            )
            .finish()
    }
}

impl fmt::Debug for PreviousSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreviousSecret")
            .field("secret", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Whether a tenant's deliveries are paused, kept apart from its
/// [`TenantConfig`] so that replacing the config never loses or restores a
/// pause (and a pause never races a config write).
///
/// Paused: its due events stay pending, in order, with no attempt spent,
/// and its pull workers' claims are refused; resumed: they go out in due
/// order. Stored as JSON by both stores; removed with the tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPause {
    pub paused: bool,
    /// Why it was paused (the caller's words, or the receiver's answer
    /// that paused it); kept after a resume until the next pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the current state began: paused since, or resumed since.
    pub since: Timestamp,
}

/// The longest pause reason kept, in bytes.
pub const MAX_PAUSE_REASON_LEN: usize = 1024;

impl TenantPause {
    /// The state after pausing at `now`. Pausing a paused tenant keeps
    /// when it was paused (and its reason, unless a new one is given):
    /// pausing is idempotent.
    pub fn paused(current: Option<&TenantPause>, reason: Option<String>, now: Timestamp) -> Self {
        match current {
            Some(current) if current.paused => TenantPause {
                paused: true,
                reason: reason.or_else(|| current.reason.clone()),
                since: current.since,
            },
            _ => TenantPause {
                paused: true,
                reason,
                since: now,
            },
        }
    }

    /// The state after resuming at `now`; `None` when there is nothing to
    /// resume (never paused, or resumed already): resuming is idempotent.
    pub fn resumed(current: Option<&TenantPause>, now: Timestamp) -> Option<Self> {
        let current = current.filter(|current| current.paused)?;
        Some(TenantPause {
            paused: false,
            reason: current.reason.clone(),
            since: now,
        })
    }

    /// Since when a resumed tenant's events could fire: lateness before
    /// it is the pause's, never the node's downtime (see
    /// [`crate::fire::decide::lookback_expiry`]).
    pub fn resumed_since(&self) -> Option<Timestamp> {
        (!self.paused).then_some(self.since)
    }
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
    /// Nothing is pushed: workers claim the due events with leases
    /// (`crate::pull`, `docs/pull.md`).
    Pull(PullTarget),
}

/// A tenant's defaults for its events' attempts (`docs/api.md`, delivery
/// policy): what an event that sets none of its own gets, before the
/// node's. Part of the tenant's sink object for every channel that
/// delivers (HTTP, Kafka, pull).
///
/// Stored as JSON by both stores (flattened into the sink's tagged
/// object): every field is optional and left out when unset, so a record
/// written before a field existed reads as that field unset, and one
/// without the newer fields is written exactly as before.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryDefaults {
    /// Attempts after which an event fails; when `None`, a pull event gets
    /// [`DEFAULT_MAX_ATTEMPTS`] and a pushed one retries until the node's
    /// backlog limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The back-off of its events that set none; the node's retry policy
    /// when `None`. Read when an attempt comes due, so a change applies to
    /// the next attempt of every event that has no back-off of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
    /// An event not delivered this long after its instant ends `expired`;
    /// no expiry when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_ms: Option<u64>,
}

impl DeliveryDefaults {
    /// The values within their ranges (as the API checks them), for
    /// configs that come another way (serde).
    fn validate(&self) -> Result<(), SinkConfigError> {
        if let Some(max) = self.max_attempts
            && !(1..=MAX_ATTEMPTS).contains(&max)
        {
            return Err(SinkConfigError::MaxAttempts);
        }
        if let Some(backoff) = &self.backoff {
            Backoff::new(
                backoff.initial_delay_ms,
                backoff.multiplier.get(),
                backoff.max_delay_ms,
            )
            .map_err(SinkConfigError::Backoff)?;
        }
        if let Some(age) = self.max_age_ms
            && !(1..=MAX_AGE_MS).contains(&age)
        {
            return Err(SinkConfigError::MaxAge);
        }
        Ok(())
    }
}

/// A pull tenant's defaults for its events' attempts, and the queues its
/// events may name. Stored as JSON like [`DeliveryDefaults`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullTarget {
    #[serde(flatten)]
    pub delivery: DeliveryDefaults,
    /// The queues its events (and schedules, and claims) may name, besides
    /// `default`, which is always one; `None`: any name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<QueueName>>,
}

/// The most attempts an event (or a tenant's default) may ask for.
pub const MAX_ATTEMPTS: u32 = 1000;

/// The longest `max_age_ms` an event (or a tenant's default) may ask for:
/// 366 days.
pub const MAX_AGE_MS: u64 = 366 * 24 * 3600 * 1000;

/// The most queues a pull tenant may declare: as many as one claim may
/// name, so one claim can always name them all.
pub const MAX_DECLARED_QUEUES: usize = 32;

/// Attempts of a pull event when neither it nor its tenant says.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;

impl PullTarget {
    /// Whether the tenant's events may name `queue`: any queue when the
    /// tenant declares none, else a declared one or `default`.
    pub fn admits(&self, queue: &QueueName) -> bool {
        match &self.queues {
            None => true,
            Some(declared) => *queue == QueueName::default_queue() || declared.contains(queue),
        }
    }

    /// Refuses the first of `queues` the tenant does not admit
    /// ([`PullTarget::admits`]); `field` is the request's field that named
    /// it (`queue` of an event or schedule, `queues` of a claim).
    ///
    /// # Errors
    /// The first queue not admitted, with the tenant's declared queues.
    pub fn check_queues<'a>(
        &self,
        field: &'static str,
        queues: impl IntoIterator<Item = &'a QueueName>,
    ) -> Result<(), UndeclaredQueue> {
        match queues.into_iter().find(|queue| !self.admits(queue)) {
            None => Ok(()),
            Some(queue) => Err(UndeclaredQueue {
                field,
                queue: queue.as_str().to_string(),
                declared: std::iter::once("default")
                    .chain(
                        self.queues
                            .iter()
                            .flatten()
                            .map(QueueName::as_str)
                            .filter(|name| *name != "default"),
                    )
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    fn validate(&self) -> Result<(), SinkConfigError> {
        self.delivery.validate()?;
        if let Some(queues) = &self.queues {
            if !(1..=MAX_DECLARED_QUEUES).contains(&queues.len()) {
                return Err(SinkConfigError::QueueCount);
            }
            for (index, queue) in queues.iter().enumerate() {
                if queues[..index].contains(queue) {
                    return Err(SinkConfigError::DuplicateQueue(queue.as_str().to_string()));
                }
            }
        }
        Ok(())
    }
}

/// An event, schedule or claim named a queue its pull tenant does not
/// declare. The message names the field and lists the declared queues.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} names {queue:?}, a queue the tenant does not declare (its queues: {declared})")]
pub struct UndeclaredQueue {
    pub field: &'static str,
    pub queue: String,
    declared: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpTarget {
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Response timeout for one attempt; the node default when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(flatten)]
    pub delivery: DeliveryDefaults,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaTarget {
    pub topic: String,
    /// Producer settings (`bootstrap.servers`, ...).
    #[serde(default)]
    pub props: BTreeMap<String, String>,
    /// What each record's key is; BigBen's choice (the event id) when not
    /// given.
    #[serde(default, skip_serializing_if = "KafkaKey::is_default")]
    pub key: KafkaKey,
    /// Fenced mode: each delivery is a Kafka transaction of a producer per
    /// Belfry partition, so a node that lost the partition cannot commit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transactional: bool,
    #[serde(flatten)]
    pub delivery: DeliveryDefaults,
}

/// The key of a delivered Kafka record. Kafka orders records per
/// partition and picks the partition from the key, so the key decides
/// which deliveries keep their order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaKey {
    /// The client's event id (BigBen's choice).
    #[default]
    EventId,
    /// `tenant/id`: unique across tenants sharing one topic.
    TenantEventId,
    /// No key: the producer spreads records over the partitions.
    None,
}

impl KafkaKey {
    pub fn is_default(&self) -> bool {
        *self == KafkaKey::EventId
    }

    /// The name clients write (`event_id`, `tenant_event_id`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            KafkaKey::EventId => "event_id",
            KafkaKey::TenantEventId => "tenant_event_id",
            KafkaKey::None => "none",
        }
    }

    /// The key named `text`, if any.
    pub fn parse(text: &str) -> Option<Self> {
        [KafkaKey::EventId, KafkaKey::TenantEventId, KafkaKey::None]
            .into_iter()
            .find(|key| key.as_str() == text)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltinTarget {
    pub processor: String,
}

/// The longest webhook URL accepted, in bytes.
pub const MAX_URL_LEN: usize = 2048;
/// The most headers a tenant may add to its deliveries.
pub const MAX_HEADERS: usize = 32;
/// The longest tenant header name, in bytes.
pub const MAX_HEADER_NAME_LEN: usize = 128;
/// The longest tenant header value, in bytes.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;
/// How much of a client's text an error message repeats.
const ECHO_LIMIT: usize = 64;

/// Why a sink configuration was refused. Safe to show to a client: it
/// never repeats a URL (its user info or query may hold secrets) nor a
/// header value, and repeats at most [`ECHO_LIMIT`] characters of a header
/// name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkConfigError {
    #[error("url is longer than {MAX_URL_LEN} bytes")]
    UrlTooLong,
    #[error("url must start with http:// or https://")]
    BadScheme,
    #[error("url is not a valid URL: {0}")]
    BadUrl(String),
    #[error("url port must be between 1 and 65535")]
    BadPort,
    #[error("at most {MAX_HEADERS} headers are allowed, got {0}")]
    TooManyHeaders(usize),
    #[error("header name {0:?}... is longer than {MAX_HEADER_NAME_LEN} bytes")]
    HeaderNameTooLong(String),
    #[error("header {0:?} has a value longer than {MAX_HEADER_VALUE_LEN} bytes")]
    HeaderValueTooLong(String),
    #[error("header name {0:?} is not a valid HTTP header name")]
    BadHeaderName(String),
    #[error("header {0:?} has a value that is not a valid HTTP header value")]
    BadHeaderValue(String),
    #[error(
        "header {0:?} may not be set by a tenant: Host, Forwarded, Proxy-* and X-Forwarded-* \
         steer proxies and virtual hosts"
    )]
    ReservedHeader(String),
    #[error("topic must not be empty")]
    EmptyTopic,
    #[error("processor name must not be empty")]
    EmptyProcessor,
    #[error("max_attempts must be between 1 and {MAX_ATTEMPTS}")]
    MaxAttempts,
    #[error("max_age_ms must be between 1 and {MAX_AGE_MS} (366 days)")]
    MaxAge,
    /// Its message names the field (`backoff.multiplier`, …).
    #[error("{0}")]
    Backoff(BackoffError),
    #[error("queues must name 1 to {MAX_DECLARED_QUEUES} queues (omit it for any queue)")]
    QueueCount,
    #[error("queues names {0:?} twice")]
    DuplicateQueue(String),
}

/// At most [`ECHO_LIMIT`] characters of `text`.
fn echo(text: &str) -> String {
    text.chars().take(ECHO_LIMIT).collect()
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
            SinkConfig::Kafka(target) => target.delivery.validate(),
            SinkConfig::Builtin(target) if target.processor.trim().is_empty() => {
                Err(SinkConfigError::EmptyProcessor)
            }
            SinkConfig::Builtin(_) => Ok(()),
            SinkConfig::Pull(target) => target.validate(),
        }
    }

    /// The tenant's defaults for its events' attempts (none for a
    /// built-in processor).
    pub fn delivery_defaults(&self) -> &DeliveryDefaults {
        const NONE: &DeliveryDefaults = &DeliveryDefaults {
            max_attempts: None,
            backoff: None,
            max_age_ms: None,
        };
        match self {
            SinkConfig::Http(target) => &target.delivery,
            SinkConfig::Kafka(target) => &target.delivery,
            SinkConfig::Pull(target) => &target.delivery,
            SinkConfig::Builtin(_) => NONE,
        }
    }

    /// Whether the tenant's events are claimed by workers rather than
    /// pushed.
    pub fn is_pull(&self) -> bool {
        matches!(self, SinkConfig::Pull(_))
    }
}

impl HttpTarget {
    /// The URL parsed fully ([`validate_url`]), and the headers within the
    /// limits and valid for HTTP/1.1.
    fn validate(&self) -> Result<(), SinkConfigError> {
        validate_url(&self.url)?;
        self.delivery.validate()?;
        if self.headers.len() > MAX_HEADERS {
            return Err(SinkConfigError::TooManyHeaders(self.headers.len()));
        }
        for (name, value) in &self.headers {
            if name.len() > MAX_HEADER_NAME_LEN {
                return Err(SinkConfigError::HeaderNameTooLong(echo(name)));
            }
            let name_ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !name_ok {
                return Err(SinkConfigError::BadHeaderName(echo(name)));
            }
            if reserved_header(name) {
                return Err(SinkConfigError::ReservedHeader(echo(name)));
            }
            if value.len() > MAX_HEADER_VALUE_LEN {
                return Err(SinkConfigError::HeaderValueTooLong(name.clone()));
            }
            if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(SinkConfigError::BadHeaderValue(name.clone()));
            }
        }
        Ok(())
    }
}

/// Whether a tenant may not set header `name` (any case): `Host`,
/// `Forwarded`, `Proxy-*` and `X-Forwarded-*` would let a tenant pick the
/// virtual host or the client a proxy or service behind the URL trusts.
pub fn reserved_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "host"
        || name == "forwarded"
        || name.starts_with("proxy-")
        || name.starts_with("x-forwarded-")
}

/// Parses a webhook URL as the sinks will (WHATWG rules, via `url`) and
/// refuses what would fail at every delivery: another scheme, no host or an
/// invalid host name, port 0 or above 65535, more than [`MAX_URL_LEN`]
/// bytes, whitespace or control characters (which the WHATWG parser would
/// silently drop), a backslash (read as `/` by the URL parser, not by
/// every other) or anything but the host right after `//` (`http:///x`
/// would be read as `http://x/`, and `http:///user:pass@h` hides its
/// credentials from anyone reading it as written).
///
/// # Errors
/// The first problem found.
pub fn validate_url(text: &str) -> Result<url::Url, SinkConfigError> {
    if text.len() > MAX_URL_LEN {
        return Err(SinkConfigError::UrlTooLong);
    }
    if text.contains('\\') {
        return Err(SinkConfigError::BadUrl("it contains a backslash".into()));
    }
    let prefix = text.get(..8).unwrap_or(text).to_ascii_lowercase();
    if !prefix.starts_with("http://") && !prefix.starts_with("https://") {
        return Err(SinkConfigError::BadScheme);
    }
    let authority = &text[text.find("//").map_or(0, |at| at + 2)..];
    if authority.starts_with('/') {
        return Err(SinkConfigError::BadUrl(
            "the host must follow \"//\" directly".into(),
        ));
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SinkConfigError::BadUrl(
            "it contains whitespace or control characters".into(),
        ));
    }
    let url = url::Url::parse(text).map_err(|e| SinkConfigError::BadUrl(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(SinkConfigError::BadScheme);
    }
    match url.host() {
        None => return Err(SinkConfigError::BadUrl("empty host".into())),
        Some(url::Host::Domain(domain)) if !valid_domain(domain) => {
            return Err(SinkConfigError::BadUrl("invalid host name".into()));
        }
        Some(_) => {}
    }
    if url.port() == Some(0) {
        return Err(SinkConfigError::BadPort);
    }
    // Parsing percent-encodes non-ASCII text (three bytes per byte): the
    // URL Belfry calls must fit the bound too, not only what was sent.
    if url.as_str().len() > MAX_URL_LEN {
        return Err(SinkConfigError::UrlTooLong);
    }
    Ok(url)
}

/// A DNS name as the URL parser leaves it (lowercase, IDNA as `xn--`):
/// labels of 1 to 63 letters, digits, `-` or `_`, at most 253 bytes, an
/// optional final dot.
fn valid_domain(domain: &str) -> bool {
    let name = domain.strip_suffix('.').unwrap_or(domain);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(url: &str) -> SinkConfig {
        SinkConfig::Http(HttpTarget {
            url: url.into(),
            headers: BTreeMap::new(),
            timeout_ms: None,
            delivery: Default::default(),
        })
    }

    #[test]
    fn validates_urls() {
        for good in [
            "http://127.0.0.1:9000/hook",
            "https://svc.internal/callbacks",
            "HTTPS://Svc.Internal:65535/a?b=c#d",
            "http://[::1]:8080/",
            "http://user:pw@h/",
            "http://b\u{fc}cher.example/",
        ] {
            assert_eq!(http(good).validate(), Ok(()), "{good}");
        }
        for bad in [
            "ftp://x",
            "http://",
            "http:// spaced",
            "http://h/\npath",
            "not a url",
            "http://@/x",
            "http://:80/",
            "http://h:99999/",
            "http://h:0/",
            "http:h",
            "http://h%20x/",
            "http://[fe80::1%25eth0]/",
            "http://a..b/",
            "http:///x",
            "http:///user:pass@h/",
            "http:\\\\h/",
            "http://h\\@evil/",
        ] {
            assert!(http(bad).validate().is_err(), "{bad}");
        }
        let long = format!("http://h/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(http(&long).validate(), Err(SinkConfigError::UrlTooLong));
        // Found by fuzzing: short as sent, three times longer once parsed
        // (percent-encoded), so the URL called passed the bound and did
        // not validate again.
        let encoded = format!("http://h/{}", "é".repeat(MAX_URL_LEN / 4));
        assert!(encoded.len() <= MAX_URL_LEN);
        assert_eq!(http(&encoded).validate(), Err(SinkConfigError::UrlTooLong));
        let fits = format!("http://h/{}", "é".repeat(MAX_URL_LEN / 8));
        let url = validate_url(&fits).unwrap();
        assert_eq!(validate_url(url.as_str()), Ok(url));
        assert_eq!(
            http("http://h:0/").validate(),
            Err(SinkConfigError::BadPort)
        );
        // The message never repeats the URL (credentials).
        let error = http("http://user:hunter2@:80/").validate().unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    #[test]
    fn validates_headers() {
        let mut headers = BTreeMap::new();
        headers.insert("bad header".to_string(), "v".to_string());
        let sink = SinkConfig::Http(HttpTarget {
            url: "http://h/".into(),
            headers,
            timeout_ms: None,
            delivery: Default::default(),
        });
        assert_eq!(
            sink.validate(),
            Err(SinkConfigError::BadHeaderName("bad header".into()))
        );
    }

    #[test]
    fn header_limits() {
        let with = |headers: Vec<(String, String)>| {
            SinkConfig::Http(HttpTarget {
                url: "http://h/".into(),
                headers: headers.into_iter().collect(),
                timeout_ms: None,
                delivery: Default::default(),
            })
            .validate()
        };
        let many = (0..=MAX_HEADERS)
            .map(|i| (format!("x-{i}"), "v".to_string()))
            .collect();
        assert_eq!(
            with(many),
            Err(SinkConfigError::TooManyHeaders(MAX_HEADERS + 1))
        );
        let long_name = "n".repeat(MAX_HEADER_NAME_LEN + 1);
        assert!(matches!(
            with(vec![(long_name, "v".into())]),
            Err(SinkConfigError::HeaderNameTooLong(echoed)) if echoed.len() == ECHO_LIMIT
        ));
        assert_eq!(
            with(vec![("x".into(), "v".repeat(MAX_HEADER_VALUE_LEN + 1))]),
            Err(SinkConfigError::HeaderValueTooLong("x".into()))
        );
        assert_eq!(
            with(vec![("x".into(), "v".repeat(MAX_HEADER_VALUE_LEN))]),
            Ok(())
        );
    }

    #[test]
    fn pull_attempts_are_bounded() {
        let pull = |max_attempts| {
            SinkConfig::Pull(PullTarget {
                delivery: DeliveryDefaults {
                    max_attempts,
                    ..DeliveryDefaults::default()
                },
                ..PullTarget::default()
            })
        };
        assert_eq!(pull(None).validate(), Ok(()));
        assert_eq!(pull(Some(1)).validate(), Ok(()));
        assert_eq!(pull(Some(MAX_ATTEMPTS)).validate(), Ok(()));
        assert_eq!(pull(Some(0)).validate(), Err(SinkConfigError::MaxAttempts));
        assert_eq!(
            pull(Some(MAX_ATTEMPTS + 1)).validate(),
            Err(SinkConfigError::MaxAttempts)
        );
        let json = serde_json::to_string(&pull(None)).unwrap();
        assert_eq!(json, r#"{"type":"pull"}"#);
        assert_eq!(
            serde_json::from_str::<SinkConfig>(&json).unwrap(),
            pull(None)
        );
    }

    fn queues(names: &[&str]) -> Option<Vec<QueueName>> {
        Some(names.iter().map(|n| QueueName::new(*n).unwrap()).collect())
    }

    #[test]
    fn a_pull_tenants_backoff_and_queues_are_checked() {
        let pull = |backoff, queues| {
            SinkConfig::Pull(PullTarget {
                delivery: DeliveryDefaults {
                    backoff,
                    ..DeliveryDefaults::default()
                },
                queues,
            })
        };
        let good = Backoff::new(100, 1.5, 200).unwrap();
        assert_eq!(pull(Some(good), queues(&["a", "b"])).validate(), Ok(()));
        // A back-off that did not come through `Backoff::new` (serde).
        let bad: Backoff = serde_json::from_str(
            r#"{"initial_delay_ms": 0, "multiplier": 2.0, "max_delay_ms": 10}"#,
        )
        .unwrap();
        let error = pull(Some(bad), None).validate().unwrap_err();
        assert_eq!(error, SinkConfigError::Backoff(BackoffError::InitialDelay));
        assert!(
            error.to_string().contains("backoff.initial_delay_ms"),
            "{error}"
        );
        assert_eq!(
            pull(None, queues(&[])).validate(),
            Err(SinkConfigError::QueueCount)
        );
        let many: Vec<String> = (0..=MAX_DECLARED_QUEUES).map(|i| format!("q{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            pull(None, queues(&many)).validate(),
            Err(SinkConfigError::QueueCount)
        );
        assert_eq!(
            pull(None, queues(&many[..MAX_DECLARED_QUEUES])).validate(),
            Ok(())
        );
        let twice = pull(None, queues(&["a", "b", "a"])).validate().unwrap_err();
        assert_eq!(twice, SinkConfigError::DuplicateQueue("a".into()));
        assert!(twice.to_string().contains("queues"), "{twice}");
    }

    #[test]
    fn declared_queues_admit_themselves_and_default_only() {
        let q = |name: &str| QueueName::new(name).unwrap();
        let open = PullTarget::default();
        assert!(open.admits(&q("anything")));
        assert_eq!(open.check_queues("queue", [&q("x")]), Ok(()));
        let declared = PullTarget {
            queues: queues(&["emails", "sms"]),
            ..PullTarget::default()
        };
        assert!(declared.admits(&q("emails")));
        assert!(declared.admits(&QueueName::default_queue()), "always");
        assert!(!declared.admits(&q("fax")));
        assert_eq!(
            declared.check_queues("queues", [&q("sms"), &q("default")]),
            Ok(())
        );
        let refused = declared
            .check_queues("queues", [&q("sms"), &q("fax"), &q("telex")])
            .unwrap_err();
        assert_eq!(refused.field, "queues");
        assert_eq!(refused.queue, "fax");
        assert_eq!(
            refused.to_string(),
            r#"queues names "fax", a queue the tenant does not declare (its queues: default, emails, sms)"#
        );
    }

    #[test]
    fn pull_targets_written_before_the_new_fields_still_read() {
        // The stored form of both stores is this JSON (the embedded store
        // after a format byte, PostgreSQL in a jsonb column).
        let old: SinkConfig = serde_json::from_str(r#"{"type":"pull","max_attempts":5}"#).unwrap();
        assert_eq!(
            old,
            SinkConfig::Pull(PullTarget {
                delivery: DeliveryDefaults {
                    max_attempts: Some(5),
                    ..DeliveryDefaults::default()
                },
                ..PullTarget::default()
            })
        );
        // Unset fields are left out: an old node reads a new record too.
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"type":"pull","max_attempts":5}"#
        );
        let full = SinkConfig::Pull(PullTarget {
            delivery: DeliveryDefaults {
                max_attempts: Some(3),
                backoff: Some(Backoff::new(100, 1.5, 200).unwrap()),
                ..DeliveryDefaults::default()
            },
            queues: queues(&["a", "b"]),
        });
        let json = serde_json::to_value(&full).unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "type": "pull", "max_attempts": 3,
                "backoff": { "initial_delay_ms": 100, "multiplier": 1.5, "max_delay_ms": 200 },
                "queues": ["a", "b"] })
        );
        assert_eq!(serde_json::from_value::<SinkConfig>(json).unwrap(), full);
    }

    #[test]
    fn signing_secrets_overlap_until_the_old_one_expires() {
        let at = Timestamp::from_millis;
        let secrets = SigningSecrets::new("whsec_old".into()).rotated("whsec_new".into(), at(100));
        assert_eq!(
            secrets.active(at(99)).collect::<Vec<_>>(),
            ["whsec_new", "whsec_old"]
        );
        assert_eq!(secrets.active(at(100)).collect::<Vec<_>>(), ["whsec_new"]);
        assert!(!format!("{secrets:?}").contains("whsec"));
    }
}
