//! API keys, roles and audit entries: the pure part of authentication.
//!
//! # Key format
//! A secret reads `bfy_` + 30 random base62 characters + 6 base62
//! characters of checksum, 40 characters in all, like GitHub's tokens:
//! - the prefix lets secret scanners recognise a leaked Belfry key;
//! - the random part carries ≈ 178 bits of entropy (from the OS);
//! - the checksum is the CRC-32 (IEEE) of the random part, in base62,
//!   zero-padded to 6 characters: a typo or a truncated copy is refused
//!   without a store lookup, and scanners can drop false positives.
//!
//! Only [`KeyHash`] (SHA-256 of the whole secret) is stored: the secret
//! is high-entropy, so a fast hash is enough (no password hashing), and a
//! lookup by hash needs no constant-time comparison of secrets.
//!
//! # Roles
//! `read` < `write` for a tenant's own data; `worker` (for pull
//! workers, not built yet) reads like `read`; `admin` keys have no tenant and may do
//! everything. See `docs/security.md` for the route table.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::TenantName;
use crate::time::Timestamp;

/// The prefix of every secret.
pub const SECRET_PREFIX: &str = "bfy_";
/// Base62 characters of randomness in a secret.
pub const RANDOM_LEN: usize = 30;
/// Base62 characters of checksum in a secret.
pub const CHECKSUM_LEN: usize = 6;
/// The length of a whole secret.
pub const SECRET_LEN: usize = SECRET_PREFIX.len() + RANDOM_LEN + CHECKSUM_LEN;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read a tenant's configuration (masked), events and schedules.
    Read,
    /// Everything `read` may, plus change the tenant's events, schedules
    /// and its own registration.
    Write,
    /// For pull workers: claims and lease calls of its tenant, and reads
    /// like `read`.
    Worker,
    /// Every route, every tenant; no tenant of its own.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }

    /// # Errors
    /// Anything but `read`, `write`, `worker` or `admin`.
    pub fn parse(text: &str) -> Result<Role, KeyError> {
        match text {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "worker" => Ok(Role::Worker),
            "admin" => Ok(Role::Admin),
            other => Err(KeyError::UnknownRole(other.to_string())),
        }
    }

    /// Whether the role may change a tenant's data.
    pub fn can_write(self) -> bool {
        matches!(self, Role::Write | Role::Admin)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a secret, a role or a key was refused. Safe to show to a client
/// (never carries the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("an API key starts with \"bfy_\" and is 40 characters long")]
    Malformed,
    #[error("the API key's checksum does not match (a typo or a truncated copy?)")]
    BadChecksum,
    #[error("unknown role {0:?}; expected read, write, worker or admin")]
    UnknownRole(String),
    #[error("an admin key has no tenant (tenant must be null)")]
    AdminWithTenant,
    #[error("a {0} key needs a tenant")]
    MissingTenant(Role),
    #[error("the operating system's random source failed")]
    Random,
}

/// A whole secret, as clients send it. Its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret(String);

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(****)")
    }
}

impl KeySecret {
    /// A new secret from the operating system's random source.
    ///
    /// # Errors
    /// [`KeyError::Random`] if the random source failed.
    pub fn generate() -> Result<KeySecret, KeyError> {
        Ok(KeySecret::from_random_part(&random_base62(RANDOM_LEN)?))
    }

    /// The secret made of this random part (30 base62 characters) and its
    /// checksum. For tests and [`KeySecret::generate`].
    ///
    /// # Panics
    /// If `random` is not 30 base62 characters (a caller's bug).
    pub fn from_random_part(random: &str) -> KeySecret {
        assert!(
            random.len() == RANDOM_LEN && random.bytes().all(is_base62),
            "the random part must be {RANDOM_LEN} base62 characters"
        );
        KeySecret(format!("{SECRET_PREFIX}{random}{}", checksum(random)))
    }

    /// Checks the format and the checksum.
    ///
    /// # Errors
    /// [`KeyError::Malformed`] or [`KeyError::BadChecksum`].
    pub fn parse(text: &str) -> Result<KeySecret, KeyError> {
        let rest = text
            .strip_prefix(SECRET_PREFIX)
            .ok_or(KeyError::Malformed)?;
        if rest.len() != RANDOM_LEN + CHECKSUM_LEN || !rest.bytes().all(is_base62) {
            return Err(KeyError::Malformed);
        }
        let (random, sum) = rest.split_at(RANDOM_LEN);
        if checksum(random) != sum {
            return Err(KeyError::BadChecksum);
        }
        Ok(KeySecret(text.to_string()))
    }

    /// The secret itself: show it once, never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the store keeps.
    pub fn hash(&self) -> KeyHash {
        let digest = Sha256::digest(self.0.as_bytes());
        let mut hex = String::with_capacity(64);
        for byte in digest.iter() {
            hex.push(char::from(HEX[usize::from(byte >> 4)]));
            hex.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        KeyHash(hex)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// SHA-256 of a secret, lowercase hex: the only form a secret is stored in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyHash(String);

impl KeyHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A stored hash read back.
    pub fn from_stored(hex: String) -> KeyHash {
        KeyHash(hex)
    }
}

/// A key's public identifier (`key_` + 16 base62 characters): safe to
/// log, list and put in URLs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyId(String);

impl KeyId {
    /// A new random id.
    ///
    /// # Errors
    /// [`KeyError::Random`] if the random source failed.
    pub fn generate() -> Result<KeyId, KeyError> {
        Ok(KeyId(format!("key_{}", random_base62(16)?)))
    }

    /// An id as given by a client or read from the store; `None` if it
    /// cannot be one (so lookups of garbage never reach the store).
    pub fn parse(text: &str) -> Option<KeyId> {
        let rest = text.strip_prefix("key_")?;
        (!rest.is_empty() && rest.len() <= 64 && rest.bytes().all(is_base62))
            .then(|| KeyId(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stored key: everything but the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: KeyId,
    /// `None` exactly for admin keys.
    pub tenant: Option<TenantName>,
    pub role: Role,
    pub hash: KeyHash,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    /// Updated at most once a minute per key (not a write per request).
    pub last_used_at: Option<Timestamp>,
}

impl ApiKey {
    /// A new key for `secret`, checked: admin keys have no tenant, every
    /// other role has one.
    ///
    /// # Errors
    /// [`KeyError::AdminWithTenant`], [`KeyError::MissingTenant`],
    /// [`KeyError::Random`].
    pub fn new(
        secret: &KeySecret,
        tenant: Option<TenantName>,
        role: Role,
        created_at: Timestamp,
        expires_at: Option<Timestamp>,
    ) -> Result<ApiKey, KeyError> {
        match (&tenant, role) {
            (Some(_), Role::Admin) => return Err(KeyError::AdminWithTenant),
            (None, role) if role != Role::Admin => return Err(KeyError::MissingTenant(role)),
            _ => {}
        }
        Ok(ApiKey {
            id: KeyId::generate()?,
            tenant,
            role,
            hash: secret.hash(),
            created_at,
            expires_at,
            last_used_at: None,
        })
    }

    /// Whether the key has expired at `now` (an expiry is exclusive: a key
    /// expiring at `t` is refused from `t` on).
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }
}

/// What an audit entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditAction {
    KeyCreated,
    KeyRevoked,
    TenantRegistered,
    TenantChanged,
    TenantDeleted,
    EventsBulkCancelled,
    EventRedriven,
    EventDeleted,
    BulkActionCreated,
    BulkActionCancelled,
    TenantPaused,
    TenantResumed,
}

impl AuditAction {
    /// Every action, in declaration order.
    pub const ALL: [AuditAction; 12] = [
        AuditAction::KeyCreated,
        AuditAction::KeyRevoked,
        AuditAction::TenantRegistered,
        AuditAction::TenantChanged,
        AuditAction::TenantDeleted,
        AuditAction::EventsBulkCancelled,
        AuditAction::EventRedriven,
        AuditAction::EventDeleted,
        AuditAction::BulkActionCreated,
        AuditAction::BulkActionCancelled,
        AuditAction::TenantPaused,
        AuditAction::TenantResumed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::KeyCreated => "key_created",
            AuditAction::KeyRevoked => "key_revoked",
            AuditAction::TenantRegistered => "tenant_registered",
            AuditAction::TenantChanged => "tenant_changed",
            AuditAction::TenantDeleted => "tenant_deleted",
            AuditAction::EventsBulkCancelled => "events_bulk_cancelled",
            AuditAction::EventRedriven => "event_redriven",
            AuditAction::EventDeleted => "event_deleted",
            AuditAction::BulkActionCreated => "bulk_action_created",
            AuditAction::BulkActionCancelled => "bulk_action_cancelled",
            AuditAction::TenantPaused => "tenant_paused",
            AuditAction::TenantResumed => "tenant_resumed",
        }
    }

    /// The inverse of [`AuditAction::as_str`].
    pub fn parse(text: &str) -> Option<AuditAction> {
        Self::ALL.into_iter().find(|action| action.as_str() == text)
    }
}

/// One entry of the audit log: who (a key id, never a secret), what, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Orders entries of the same millisecond: see [`AuditEntry::new`].
    pub id: String,
    pub at: Timestamp,
    /// The key's id, or `open` (a request without a key in open mode or
    /// with `auth.mode = "none"`), `cli` (`belfry keys`), `bootstrap`
    /// (`auth.bootstrap_admin_key`).
    pub actor: String,
    pub action: AuditAction,
    /// The tenant concerned, if any.
    pub tenant: Option<TenantName>,
    /// What was acted on besides the tenant (a key id, a count), if
    /// anything. Never a secret.
    pub target: Option<String>,
}

/// The sequence of [`AuditEntry::new`] in this process.
static AUDIT_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Hex digits of the sequence number at the start of an audit id.
const AUDIT_SEQUENCE_LEN: usize = 16;
/// Random base62 characters after it.
const AUDIT_RANDOM_LEN: usize = 8;

impl AuditEntry {
    /// A new entry. Its id is a process-wide sequence number (16
    /// lower-case hex digits) followed by 8 random base62 characters.
    ///
    /// # Contract
    /// The audit log is ordered by `(at, id)`. Within one process, ids
    /// increase in the order `new` is called, so entries made by one node
    /// in the same millisecond are listed in the order they were made
    /// (byte order, which both stores use). Across processes (nodes, a
    /// `belfry keys` run, a restart) sequences are independent: entries of
    /// different processes in one millisecond are listed in an arbitrary
    /// but stable order. The random part keeps ids of different processes
    /// distinct.
    ///
    /// # Errors
    /// [`KeyError::Random`] if the random source failed.
    pub fn new(
        at: Timestamp,
        actor: impl Into<String>,
        action: AuditAction,
        tenant: Option<TenantName>,
        target: Option<String>,
    ) -> Result<AuditEntry, KeyError> {
        // Relaxed: only the uniqueness and order of the values drawn in
        // this process matter, not their order against other memory.
        let sequence = AUDIT_SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{sequence:0width$x}{}",
            random_base62(AUDIT_RANDOM_LEN)?,
            width = AUDIT_SEQUENCE_LEN
        );
        Ok(AuditEntry {
            id,
            at,
            actor: actor.into(),
            action,
            tenant,
            target,
        })
    }
}

fn is_base62(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
}

/// `len` uniformly random base62 characters (rejection sampling, so no
/// character is likelier than another).
pub(crate) fn random_base62(len: usize) -> Result<String, KeyError> {
    let mut out = String::with_capacity(len);
    let mut buffer = [0u8; 64];
    while out.len() < len {
        getrandom::fill(&mut buffer).map_err(|_| KeyError::Random)?;
        for byte in buffer {
            // 248 = 4 × 62: bytes above it would favour the first characters.
            if byte < 248 && out.len() < len {
                out.push(char::from(BASE62[usize::from(byte % 62)]));
            }
        }
    }
    Ok(out)
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's) of `data`, in base62,
/// zero-padded to [`CHECKSUM_LEN`] characters (62^6 > 2^32).
fn checksum(data: &str) -> String {
    base62_fixed(u64::from(crc32(data.as_bytes())), CHECKSUM_LEN)
}

/// The low `width` base62 digits of `value`, zero-padded. [`BASE62`] is in
/// byte order, so equal-width results sort as their values do.
pub(crate) fn base62_fixed(mut value: u64, width: usize) -> String {
    let mut digits = vec![b'0'; width];
    for slot in digits.iter_mut().rev() {
        *slot = BASE62[(value % 62) as usize];
        value /= 62;
    }
    // Every byte is from BASE62, which is ASCII.
    String::from_utf8_lossy(&digits).into_owned()
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        // The CRC-32/ISO-HDLC check value of "123456789".
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn generated_secrets_parse_and_have_the_documented_shape() {
        for _ in 0..100 {
            let secret = KeySecret::generate().unwrap();
            let text = secret.expose();
            assert_eq!(text.len(), SECRET_LEN);
            assert!(text.starts_with("bfy_"));
            assert!(text[4..].bytes().all(|b| b.is_ascii_alphanumeric()));
            assert_eq!(KeySecret::parse(text).unwrap(), secret);
        }
        assert_ne!(
            KeySecret::generate().unwrap(),
            KeySecret::generate().unwrap()
        );
    }

    #[test]
    fn a_known_random_part_gives_a_fixed_secret() {
        let secret = KeySecret::from_random_part("abcdefghijklmnopqrstuvwxyz0123");
        let sum = checksum("abcdefghijklmnopqrstuvwxyz0123");
        assert_eq!(sum.len(), CHECKSUM_LEN);
        assert_eq!(
            secret.expose(),
            format!("bfy_abcdefghijklmnopqrstuvwxyz0123{sum}")
        );
        // The checksum is the CRC-32 in base62, most significant first.
        let crc = crc32(b"abcdefghijklmnopqrstuvwxyz0123");
        let decoded = sum.bytes().fold(0u64, |acc, b| {
            acc * 62 + BASE62.iter().position(|c| *c == b).unwrap() as u64
        });
        assert_eq!(decoded, u64::from(crc));
    }

    #[test]
    fn typos_truncations_and_garbage_are_refused() {
        let secret = KeySecret::generate().unwrap();
        let text = secret.expose().to_string();
        // One character changed anywhere in the random part or checksum.
        for position in 4..SECRET_LEN {
            let mut bytes = text.clone().into_bytes();
            bytes[position] = if bytes[position] == b'a' { b'b' } else { b'a' };
            let changed = String::from_utf8(bytes).unwrap();
            assert!(KeySecret::parse(&changed).is_err(), "{position}");
        }
        assert_eq!(
            KeySecret::parse(&text[..SECRET_LEN - 1]),
            Err(KeyError::Malformed)
        );
        assert_eq!(
            KeySecret::parse(&format!("ghp_{}", &text[4..])),
            Err(KeyError::Malformed)
        );
        assert_eq!(KeySecret::parse(""), Err(KeyError::Malformed));
        assert_eq!(
            KeySecret::parse(&format!("{text}x")),
            Err(KeyError::Malformed)
        );
        let mut non_ascii = text.clone();
        non_ascii.replace_range(10..11, "é");
        assert!(KeySecret::parse(&non_ascii).is_err());
    }

    #[test]
    fn the_hash_is_sha256_hex_and_debug_hides_the_secret() {
        let secret = KeySecret::from_random_part("000000000000000000000000000000");
        let hash = secret.hash();
        assert_eq!(hash.as_str().len(), 64);
        assert!(hash.as_str().bytes().all(|b| HEX.contains(&b)));
        assert_eq!(secret.hash(), hash);
        assert!(!format!("{secret:?}").contains("bfy_"));
        // SHA-256("abc"), to pin the hex encoding.
        let digest = Sha256::digest(b"abc");
        assert_eq!(digest[0], 0xba);
    }

    proptest::proptest! {
        /// Whatever a client sends, parsing answers (never panics) and
        /// accepts only the documented shape with a matching checksum.
        #[test]
        fn parsing_arbitrary_text_never_panics(text in "\\PC{0,60}") {
            if let Ok(secret) = KeySecret::parse(&text) {
                proptest::prop_assert_eq!(secret.expose(), text.as_str());
                proptest::prop_assert_eq!(text.len(), SECRET_LEN);
                proptest::prop_assert!(text.starts_with(SECRET_PREFIX));
            }
        }

        /// Any random part gives a secret that parses back; changing one
        /// character of the random part is always caught.
        #[test]
        fn every_random_part_round_trips_and_one_change_is_caught(
            random in "[0-9A-Za-z]{30}",
            position in 0usize..RANDOM_LEN,
            replacement in "[0-9A-Za-z]",
        ) {
            let secret = KeySecret::from_random_part(&random);
            proptest::prop_assert!(KeySecret::parse(secret.expose()).is_ok());
            let mut changed = random.clone().into_bytes();
            let new = replacement.as_bytes()[0];
            proptest::prop_assume!(changed[position] != new);
            changed[position] = new;
            let changed = String::from_utf8(changed).unwrap();
            let forged = format!("{SECRET_PREFIX}{changed}{}", &secret.expose()[4 + RANDOM_LEN..]);
            proptest::prop_assert!(KeySecret::parse(&forged).is_err());
        }
    }

    #[test]
    fn roles_and_tenants_must_agree() {
        let secret = KeySecret::generate().unwrap();
        let acme = TenantName::new("acme").unwrap();
        let now = Timestamp::from_millis(1_000);
        assert!(ApiKey::new(&secret, None, Role::Admin, now, None).is_ok());
        assert_eq!(
            ApiKey::new(&secret, Some(acme.clone()), Role::Admin, now, None),
            Err(KeyError::AdminWithTenant)
        );
        assert_eq!(
            ApiKey::new(&secret, None, Role::Write, now, None),
            Err(KeyError::MissingTenant(Role::Write))
        );
        let key = ApiKey::new(&secret, Some(acme), Role::Read, now, Some(now)).unwrap();
        assert!(key.expired(now));
        assert!(!key.expired(Timestamp::from_millis(999)));
        assert!(key.id.as_str().starts_with("key_"));
        assert_eq!(KeyId::parse(key.id.as_str()), Some(key.id.clone()));
        assert_eq!(KeyId::parse("key_"), None);
        assert_eq!(KeyId::parse("../etc"), None);
    }

    #[test]
    fn roles_and_actions_round_trip() {
        for role in [Role::Read, Role::Write, Role::Worker, Role::Admin] {
            assert_eq!(Role::parse(role.as_str()), Ok(role));
            assert_eq!(
                serde_json::to_value(role).unwrap(),
                serde_json::Value::String(role.as_str().into())
            );
        }
        assert!(Role::parse("root").is_err());
        assert!(Role::Write.can_write() && Role::Admin.can_write());
        assert!(!Role::Read.can_write() && !Role::Worker.can_write());
        for action in AuditAction::ALL {
            assert_eq!(AuditAction::parse(action.as_str()), Some(action));
            assert_eq!(
                serde_json::to_value(action).unwrap(),
                serde_json::Value::String(action.as_str().into())
            );
        }
    }
}
