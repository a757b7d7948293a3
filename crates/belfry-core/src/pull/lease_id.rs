//! Lease ids: what a worker holds while it runs an event.
//!
//! A [`LeaseId`] names the event key, the version it was granted on, the
//! attempt number, the fencing epoch of the partition it was granted under,
//! and a random nonce that tells two grants of the same attempt apart (a
//! released event is leased again with the same attempt number). On the
//! wire it is opaque: base64url (no padding) of a compact binary form,
//! so tenant names and event ids with `/`, spaces or any other character
//! the ids allow travel safely in a path segment.
//!
//! Binary form (version 1), big-endian:
//! `1u8, epoch u64, attempt u32, nonce [u8; 16]`, then tenant, event id and
//! event version, each as `u16` length + UTF-8 bytes.
//!
//! A lease id is not a credential: every call on it is checked against
//! the lease the partition owner recorded (nonce included), and the API
//! checks that the caller's key reaches the id's tenant.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::{EventId, EventKey, EventVersion, TenantName};

/// The format byte of the binary form.
const FORMAT: u8 = 1;
/// Format, epoch, attempt, nonce.
const FIXED_LEN: usize = 1 + 8 + 4 + NONCE_LEN;
const NONCE_LEN: usize = 16;

/// Why a lease id was refused. Safe to show to a client (repeats nothing
/// of the input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseIdError {
    #[error("lease id must not be empty")]
    Empty,
    #[error("lease id is longer than {max} characters")]
    TooLong { max: usize },
    #[error("lease id is not one Belfry issued")]
    Malformed,
    /// Only when making one: versions are UUIDs (36 bytes), far below.
    #[error("event version is longer than {max} bytes")]
    VersionTooLong { max: usize },
}

/// 128 random bits of a lease id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseNonce(pub [u8; NONCE_LEN]);

impl fmt::Debug for LeaseNonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0[..4] {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("…")
    }
}

/// Where nonces come from: SHA-256 of a secret key and a counter, so the
/// pull queue stays deterministic under a seed in tests while production
/// nonces (from [`NonceSource::random`]) cannot be guessed.
#[derive(Clone)]
pub struct NonceSource {
    key: [u8; 32],
    counter: u64,
}

impl NonceSource {
    /// A source keyed by `seed` (tests and simulations).
    pub fn from_seed(seed: u64) -> Self {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_be_bytes());
        NonceSource { key, counter: 0 }
    }

    /// A source keyed from the operating system's random source.
    ///
    /// # Errors
    /// The OS random source failed.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        Ok(NonceSource { key, counter: 0 })
    }

    pub fn next_nonce(&mut self) -> LeaseNonce {
        self.counter += 1;
        let digest = Sha256::new()
            .chain_update(self.key)
            .chain_update(self.counter.to_be_bytes())
            .finalize();
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&digest[..NONCE_LEN]);
        LeaseNonce(nonce)
    }
}

impl fmt::Debug for NonceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NonceSource")
            .field("key", &"<redacted>")
            .field("counter", &self.counter)
            .finish()
    }
}

/// See the module documentation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaseId {
    key: EventKey,
    version: EventVersion,
    attempt: u32,
    epoch: u64,
    nonce: LeaseNonce,
}

/// Hashes the nonce alone: it is 128 random bits the node drew for this
/// lease, so it tells leases apart as well as the whole id, and the pull
/// queue's maps keyed by lease id no longer hash the event's tenant, id
/// and version on every call. (Equal ids have equal nonces, as `Hash`
/// requires; ids a client makes up only cost a comparison.)
impl std::hash::Hash for LeaseId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nonce.hash(state);
    }
}

impl LeaseId {
    /// The longest event version a lease id carries, in bytes.
    pub const MAX_VERSION_LEN: usize = 128;
    /// The longest binary form.
    const MAX_RAW_LEN: usize =
        FIXED_LEN + 2 + TenantName::MAX_LEN + 2 + EventId::MAX_LEN + 2 + Self::MAX_VERSION_LEN;
    /// The longest lease id on the wire, in characters.
    pub const MAX_LEN: usize = (Self::MAX_RAW_LEN * 4).div_ceil(3);

    /// # Errors
    /// The version is longer than [`Self::MAX_VERSION_LEN`].
    pub fn new(
        key: EventKey,
        version: EventVersion,
        attempt: u32,
        epoch: u64,
        nonce: LeaseNonce,
    ) -> Result<Self, LeaseIdError> {
        if version.as_str().len() > Self::MAX_VERSION_LEN {
            return Err(LeaseIdError::VersionTooLong {
                max: Self::MAX_VERSION_LEN,
            });
        }
        Ok(LeaseId {
            key,
            version,
            attempt,
            epoch,
            nonce,
        })
    }

    pub fn key(&self) -> &EventKey {
        &self.key
    }

    pub fn tenant(&self) -> &TenantName {
        &self.key.tenant
    }

    pub fn version(&self) -> &EventVersion {
        &self.version
    }

    /// 1 for the first attempt of a version.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The partition's fencing epoch the lease was granted under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn nonce(&self) -> LeaseNonce {
        self.nonce
    }

    /// Reads a lease id from the wire.
    ///
    /// # Errors
    /// Empty, longer than [`Self::MAX_LEN`], not base64url, or not a binary
    /// form this version writes (wrong format byte, truncated, trailing
    /// bytes, invalid names, attempt 0).
    pub fn parse(text: &str) -> Result<Self, LeaseIdError> {
        if text.is_empty() {
            return Err(LeaseIdError::Empty);
        }
        if text.len() > Self::MAX_LEN {
            return Err(LeaseIdError::TooLong { max: Self::MAX_LEN });
        }
        let raw = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| LeaseIdError::Malformed)?;
        Self::from_raw(&raw).ok_or(LeaseIdError::Malformed)
    }

    fn from_raw(raw: &[u8]) -> Option<Self> {
        let mut reader = Reader(raw);
        if reader.take(1)? != [FORMAT] {
            return None;
        }
        let epoch = u64::from_be_bytes(reader.take(8)?.try_into().ok()?);
        let attempt = u32::from_be_bytes(reader.take(4)?.try_into().ok()?);
        let nonce = LeaseNonce(reader.take(NONCE_LEN)?.try_into().ok()?);
        let tenant = TenantName::new(reader.string()?).ok()?;
        let id = EventId::from_stored(reader.string()?).ok()?;
        let version = reader.string()?;
        if !reader.0.is_empty() || attempt == 0 || version.is_empty() {
            return None;
        }
        LeaseId::new(
            EventKey::new(tenant, id),
            EventVersion::from_string(version),
            attempt,
            epoch,
            nonce,
        )
        .ok()
    }

    fn to_raw(&self) -> Vec<u8> {
        let strings = [
            self.key.tenant.as_str(),
            self.key.id.as_str(),
            self.version.as_str(),
        ];
        let mut raw =
            Vec::with_capacity(FIXED_LEN + strings.iter().map(|s| 2 + s.len()).sum::<usize>());
        raw.push(FORMAT);
        raw.extend_from_slice(&self.epoch.to_be_bytes());
        raw.extend_from_slice(&self.attempt.to_be_bytes());
        raw.extend_from_slice(&self.nonce.0);
        for text in strings {
            // Validated names and the version bound keep every length
            // far below `u16::MAX`.
            let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
            raw.extend_from_slice(&len.to_be_bytes());
            raw.extend_from_slice(&text.as_bytes()[..usize::from(len)]);
        }
        raw
    }
}

/// Reads the binary form front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn string(&mut self) -> Option<String> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().ok()?);
        let bytes = self.take(usize::from(len))?;
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.to_raw()))
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Lease({:?} {:?} #{} e{} {:?})",
            self.key, self.version, self.attempt, self.epoch, self.nonce
        )
    }
}

impl FromStr for LeaseId {
    type Err = LeaseIdError;
    fn from_str(text: &str) -> Result<Self, LeaseIdError> {
        LeaseId::parse(text)
    }
}

impl Serialize for LeaseId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        LeaseId::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(tenant: &str, id: &str, version: &str) -> LeaseId {
        let mut nonces = NonceSource::from_seed(7);
        LeaseId::new(
            EventKey::new(TenantName::new(tenant).unwrap(), EventId::new(id).unwrap()),
            EventVersion::from_string(version.into()),
            3,
            42,
            nonces.next_nonce(),
        )
        .unwrap()
    }

    #[test]
    fn round_trips_any_name_the_ids_allow_as_url_safe_text() {
        for (tenant, id) in [
            ("shop/orders", "order 42/timeout"),
            ("ünïcødé ✓", "?&=#%+ \"'<>"),
            ("t", "e"),
        ] {
            let original = lease(tenant, id, "0190f0e2-7c55-7000-8000-000000000000");
            let text = original.to_string();
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{text}"
            );
            let back = LeaseId::parse(&text).unwrap();
            assert_eq!(back, original);
            assert_eq!(back.key().tenant.as_str(), tenant);
            assert_eq!(back.key().id.as_str(), id);
            assert_eq!((back.attempt(), back.epoch()), (3, 42));
            let json = serde_json::to_string(&original).unwrap();
            assert_eq!(serde_json::from_str::<LeaseId>(&json).unwrap(), original);
        }
    }

    #[test]
    fn internal_ids_round_trip() {
        let key = EventKey::new(
            TenantName::new("t").unwrap(),
            EventId::internal("schedule/x").unwrap(),
        );
        let original = LeaseId::new(
            key,
            EventVersion::from_string("v".into()),
            1,
            0,
            LeaseNonce([0; 16]),
        )
        .unwrap();
        assert_eq!(LeaseId::parse(&original.to_string()).unwrap(), original);
    }

    #[test]
    fn the_longest_names_fit_in_max_len() {
        let original = lease(
            &"t".repeat(TenantName::MAX_LEN),
            &"é".repeat(EventId::MAX_LEN / 2),
            &"v".repeat(LeaseId::MAX_VERSION_LEN),
        );
        let text = original.to_string();
        assert_eq!(text.len(), LeaseId::MAX_LEN);
        assert_eq!(LeaseId::parse(&text).unwrap(), original);
        let too_long = LeaseId::new(
            original.key().clone(),
            EventVersion::from_string("v".repeat(LeaseId::MAX_VERSION_LEN + 1)),
            1,
            1,
            LeaseNonce([0; 16]),
        );
        assert_eq!(
            too_long,
            Err(LeaseIdError::VersionTooLong {
                max: LeaseId::MAX_VERSION_LEN
            })
        );
    }

    #[test]
    fn rejects_garbage_with_typed_errors() {
        assert_eq!(LeaseId::parse(""), Err(LeaseIdError::Empty));
        assert_eq!(
            LeaseId::parse(&"A".repeat(LeaseId::MAX_LEN + 1)),
            Err(LeaseIdError::TooLong {
                max: LeaseId::MAX_LEN
            })
        );
        let good = lease("t", "e", "v1").to_string();
        let raw = URL_SAFE_NO_PAD.decode(&good).unwrap();
        let encode = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        let mut wrong_format = raw.clone();
        wrong_format[0] = 2;
        let mut zero_attempt = raw.clone();
        zero_attempt[9..13].copy_from_slice(&0u32.to_be_bytes());
        let mut trailing = raw.clone();
        trailing.push(0);
        let mut control_char = raw.clone();
        // The tenant's single byte ("t") right after its length.
        control_char[FIXED_LEN + 2] = b'\n';
        for bad in [
            "not base64!".to_string(),
            "a+b/c=".to_string(),
            encode(&raw[..raw.len() - 1]),
            encode(&raw[..5]),
            encode(&wrong_format),
            encode(&zero_attempt),
            encode(&trailing),
            encode(&control_char),
            encode(&[FORMAT]),
        ] {
            assert_eq!(LeaseId::parse(&bad), Err(LeaseIdError::Malformed), "{bad}");
        }
        assert!(serde_json::from_str::<LeaseId>("\"xx\"").is_err());
    }

    #[test]
    fn nonces_differ_and_a_seed_repeats_them() {
        let mut a = NonceSource::from_seed(1);
        let mut b = NonceSource::from_seed(1);
        let first = a.next_nonce();
        assert_ne!(first, a.next_nonce());
        assert_eq!(first, b.next_nonce());
        assert_ne!(first, NonceSource::from_seed(2).next_nonce());
        let mut random = NonceSource::random().unwrap();
        assert_ne!(random.next_nonce(), first);
        assert!(!format!("{random:?}").contains(&format!("{:?}", random.key)));
    }
}
