//! Validated names. Every string that reaches the store went through here.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a name was refused. The message is safe to show to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} is longer than {max} bytes")]
    TooLong { what: &'static str, max: usize },
    #[error("{what} must not contain control characters")]
    ControlCharacter { what: &'static str },
    #[error("{what} may contain only letters, digits, '_', '.' and '-'")]
    NotPlain { what: &'static str },
}

/// Names that go into URLs and metrics unescaped: ASCII letters, digits,
/// `_`, `.` and `-` only.
fn plain(what: &'static str, value: &str) -> Result<(), IdError> {
    if value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        Ok(())
    } else {
        Err(IdError::NotPlain { what })
    }
}

fn validate(what: &'static str, max: usize, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { what });
    }
    if value.len() > max {
        return Err(IdError::TooLong { what, max });
    }
    if value.chars().any(char::is_control) {
        return Err(IdError::ControlCharacter { what });
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr) => {
        name_type!($(#[$doc])* $name, $what, $max, |_: &str| Ok(()));
    };
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $extra:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The longest accepted value, in bytes.
            pub const MAX_LEN: usize = $max;

            /// # Errors
            /// Empty, longer than [`Self::MAX_LEN`] bytes, or containing a
            /// control character.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                validate($what, $max, &value)?;
                let extra: fn(&str) -> Result<(), IdError> = $extra;
                extra(&value)?;
                Ok($name(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.0)
            }
        }
    };
}

name_type!(
    /// A tenant's name, e.g. `TenantB/ProgramB/EnvC`. May contain `/`.
    TenantName,
    "tenant",
    200
);
name_type!(
    /// The client's id of an event; unique within its tenant. May contain `/`.
    EventId,
    "event id",
    500
);

name_type!(
    /// A named queue of a pull tenant (see `crate::pull`); events of one
    /// queue are leased in due order, queues of a tenant in turn. 1–64
    /// letters, digits, `_`, `.`, `-`.
    QueueName,
    "queue",
    64,
    |value| plain("queue", value)
);
name_type!(
    /// The name a pull worker gives itself: shown in its leases and in the
    /// attempt history, never trusted for anything.
    WorkerId,
    "worker id",
    128
);

impl QueueName {
    /// The queue of an event that names none.
    pub fn default_queue() -> QueueName {
        QueueName(String::from("default"))
    }
}

impl TryFrom<String> for QueueName {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        QueueName::new(value)
    }
}

impl TryFrom<String> for WorkerId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        WorkerId::new(value)
    }
}

impl TryFrom<String> for TenantName {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        TenantName::new(value)
    }
}

/// Accepts what [`EventId::new`] accepts and, unlike it, the engine's
/// internal ids: this is the path stores and serde read stored ids through.
impl TryFrom<String> for EventId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        EventId::from_stored(value)
    }
}

/// The first character of every id the engine reserves for itself (e.g. a
/// recurring schedule's control event). Client ids can never contain it:
/// [`EventId::new`] rejects control characters.
pub const INTERNAL_ID_MARK: char = '\u{1}';

impl EventId {
    /// An engine-internal id: [`INTERNAL_ID_MARK`] followed by `rest`, which
    /// must itself be a valid id (so the only control character is the
    /// mark).
    ///
    /// # Errors
    /// `rest` is not a valid id, or the whole is too long.
    pub fn internal(rest: &str) -> Result<EventId, IdError> {
        EventId::new(rest)?;
        let value = format!("{INTERNAL_ID_MARK}{rest}");
        if value.len() > Self::MAX_LEN {
            return Err(IdError::TooLong {
                what: "event id",
                max: Self::MAX_LEN,
            });
        }
        Ok(EventId(value))
    }

    /// Whether this id is engine-internal (see [`EventId::internal`]);
    /// client-facing listings hide such ids.
    pub fn is_internal(&self) -> bool {
        self.0.starts_with(INTERNAL_ID_MARK)
    }

    /// An internal id's text after the mark; `None` for client ids.
    pub fn internal_rest(&self) -> Option<&str> {
        self.0.strip_prefix(INTERNAL_ID_MARK)
    }

    /// Reads back a stored id: a client id or an internal one.
    ///
    /// # Errors
    /// Neither a valid client id nor a valid internal id.
    pub fn from_stored(value: String) -> Result<EventId, IdError> {
        match value.strip_prefix(INTERNAL_ID_MARK) {
            Some(rest) => EventId::internal(rest),
            None => EventId::new(value),
        }
    }

    /// A cursor that sorts right before every internal id starting with
    /// `INTERNAL_ID_MARK` + `prefix` (an exclusive `after` bound for
    /// listing them). Never stored as an event.
    pub fn internal_cursor(prefix: &str) -> EventId {
        EventId(format!("{INTERNAL_ID_MARK}{prefix}"))
    }
}

/// The identity of an event: `(tenant, id)`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventKey {
    pub tenant: TenantName,
    pub id: EventId,
}

impl EventKey {
    pub fn new(tenant: TenantName, id: EventId) -> Self {
        EventKey { tenant, id }
    }

    /// A key that sorts before every valid key (its names are empty, which
    /// validation forbids). Only for cursors, never stored as an event:
    /// `(t, EventKey::before_all())` means "everything due before `t`".
    pub fn before_all() -> Self {
        EventKey {
            tenant: TenantName(String::new()),
            id: EventId(String::new()),
        }
    }
}

impl fmt::Debug for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{:?}", self.tenant, self.id)
    }
}

/// The server's id of one *version* of an event (BigBen's `eventId`).
///
/// A new version starts whenever an event is created or moved to another
/// instant; it is the delivery's idempotency key, stable across retries.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventVersion(String);

impl EventVersion {
    /// A fresh, time-ordered (UUIDv7) version id.
    pub fn generate() -> Self {
        EventVersion(uuid::Uuid::now_v7().to_string())
    }

    /// Wraps an existing id (read back from storage or derived elsewhere).
    pub fn from_string(value: String) -> Self {
        EventVersion(value)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EventVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_slashes_and_reject_junk() {
        assert!(TenantName::new("TenantB/ProgramB/EnvC").is_ok());
        assert_eq!(TenantName::new(""), Err(IdError::Empty { what: "tenant" }));
        assert!(matches!(
            EventId::new("a\nb"),
            Err(IdError::ControlCharacter { .. })
        ));
        assert!(matches!(
            TenantName::new("x".repeat(201)),
            Err(IdError::TooLong { .. })
        ));
    }

    #[test]
    fn queue_names_are_plain() {
        for good in ["default", "emails.high-prio_2", &"q".repeat(64)] {
            assert!(QueueName::new(good).is_ok(), "{good}");
        }
        for bad in ["a b", "a/b", "é", "q:1"] {
            assert_eq!(
                QueueName::new(bad),
                Err(IdError::NotPlain { what: "queue" }),
                "{bad}"
            );
        }
        assert!(matches!(
            QueueName::new("q".repeat(65)),
            Err(IdError::TooLong { .. })
        ));
        assert!(serde_json::from_str::<QueueName>(r#""a b""#).is_err());
    }

    #[test]
    fn internal_ids_round_trip_through_serde_but_not_through_new() {
        let id = EventId::internal("schedule/nightly").unwrap();
        assert!(id.is_internal());
        assert_eq!(id.internal_rest(), Some("schedule/nightly"));
        assert!(EventId::new(id.as_str()).is_err());
        let json = serde_json::to_string(&id).unwrap();
        let back: EventId = serde_json::from_str(&json).unwrap();
        assert_eq!(back, id);
        assert!(EventId::internal("a\u{1}b").is_err());
        assert!(!EventId::new("plain").unwrap().is_internal());
        assert!(EventId::internal_cursor("schedule/") < id);
    }

    #[test]
    fn serde_validates() {
        let bad: Result<TenantName, _> = serde_json::from_str("\"\"");
        assert!(bad.is_err());
        let good: TenantName = serde_json::from_str("\"a/b\"").unwrap();
        assert_eq!(good.as_str(), "a/b");
    }
}
