//! Webhook signatures per the Standard Webhooks specification
//! (<https://www.standardwebhooks.com>).
//!
//! Every delivery of a tenant with secrets carries:
//! - [`HEADER_WEBHOOK_ID`]: the event's version, the same stable
//!   idempotency key as `idempotency-key` (the same for every retry of one
//!   version);
//! - [`HEADER_WEBHOOK_TIMESTAMP`]: when this attempt started, in Unix
//!   seconds;
//! - [`HEADER_WEBHOOK_SIGNATURE`]: `v1,<base64 HMAC-SHA256>` of
//!   `{id}.{timestamp}.{body}`, keyed with the base64-decoded part of the
//!   `whsec_` secret; during a rotation one such signature per live secret,
//!   space-separated, the current secret's first.
//!
//! The HMAC keys are decoded and precomputed (ring's [`hmac::Key`] holds
//! the padded inner and outer states) once per tenant config, so signing a
//! delivery costs two SHA-256 passes over the message and nothing else.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use belfry_core::{SigningSecrets, Timestamp};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The message id: the event version (the idempotency key).
pub const HEADER_WEBHOOK_ID: &str = "webhook-id";
/// When this attempt started, Unix seconds.
pub const HEADER_WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// `v1,<signature>`, space-separated when more than one secret is live.
pub const HEADER_WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Every secret starts with this.
pub const SECRET_PREFIX: &str = "whsec_";
/// Random bytes in a generated secret (the specification asks for 24 to
/// 64).
pub const SECRET_BYTES: usize = 32;

/// Why a stored secret cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("signing secret does not start with whsec_")]
    Prefix,
    #[error("signing secret is not valid base64")]
    Base64,
    #[error("signing secret is empty")]
    Empty,
}

/// A new secret: `whsec_` and [`SECRET_BYTES`] random bytes in base64.
///
/// # Panics
/// When the operating system's random source fails (nothing sensible can
/// run without it).
pub fn generate_secret() -> String {
    let mut key = [0u8; SECRET_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .expect("the operating system's random source works");
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The HMAC key of a `whsec_` secret.
///
/// # Errors
/// No `whsec_` prefix, or a part after it that is not base64 of at least
/// one byte.
pub fn parse_secret(secret: &str) -> Result<hmac::Key, SecretError> {
    let encoded = secret
        .strip_prefix(SECRET_PREFIX)
        .ok_or(SecretError::Prefix)?;
    let key = STANDARD.decode(encoded).map_err(|_| SecretError::Base64)?;
    if key.is_empty() {
        return Err(SecretError::Empty);
    }
    Ok(hmac::Key::new(hmac::HMAC_SHA256, &key))
}

/// A tenant's secrets, decoded once.
#[derive(Debug)]
pub struct Signer {
    current: hmac::Key,
    /// The rotated-out key and when it stops signing.
    previous: Option<(hmac::Key, Timestamp)>,
}

impl Signer {
    /// # Errors
    /// A stored secret that cannot be decoded.
    pub fn new(secrets: &SigningSecrets) -> Result<Self, SecretError> {
        Ok(Signer {
            current: parse_secret(&secrets.current)?,
            previous: secrets
                .previous
                .as_ref()
                .map(|previous| Ok((parse_secret(&previous.secret)?, previous.expires_at)))
                .transpose()?,
        })
    }

    /// The `webhook-signature` value of a delivery of `body` with message
    /// id `id` at `timestamp` (Unix seconds, as in the header), attempted at
    /// `now` (which decides whether the previous secret still signs).
    pub fn signature(&self, id: &str, timestamp: &str, body: &[u8], now: Timestamp) -> String {
        let mut header = String::with_capacity(2 * 48);
        push_signature(&mut header, &self.current, id, timestamp, body);
        if let Some((key, expires_at)) = &self.previous
            && now < *expires_at
        {
            header.push(' ');
            push_signature(&mut header, key, id, timestamp, body);
        }
        header
    }
}

/// Appends `v1,<base64 HMAC>` of `{id}.{timestamp}.{body}`.
fn push_signature(out: &mut String, key: &hmac::Key, id: &str, timestamp: &str, body: &[u8]) {
    let mut context = hmac::Context::with_key(key);
    context.update(id.as_bytes());
    context.update(b".");
    context.update(timestamp.as_bytes());
    context.update(b".");
    context.update(body);
    out.push_str("v1,");
    STANDARD.encode_string(context.sign().as_ref(), out);
}

/// Unix seconds of `at` (rounded down).
pub fn unix_seconds(at: Timestamp) -> i64 {
    at.as_millis().div_euclid(1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TIMESTAMP: &str = "1649367553";
    const BODY: &str = r#"{"email":"test@example.com","username":"test_user"}"#;
    const EXPECTED: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    #[test]
    fn the_specification_test_vector() {
        let signer = Signer::new(&SigningSecrets::new(SECRET.into())).unwrap();
        let now = Timestamp::from_millis(1_649_367_553_000);
        assert_eq!(
            signer.signature(ID, TIMESTAMP, BODY.as_bytes(), now),
            EXPECTED
        );
    }

    #[test]
    fn both_signatures_during_a_rotation_then_only_the_new_one() {
        let next = generate_secret();
        let expires = Timestamp::from_millis(2_000_000);
        let secrets = SigningSecrets::new(SECRET.into()).rotated(next.clone(), expires);
        let signer = Signer::new(&secrets).unwrap();
        let only_new = Signer::new(&SigningSecrets::new(next)).unwrap().signature(
            ID,
            TIMESTAMP,
            BODY.as_bytes(),
            expires,
        );
        let during = signer.signature(ID, TIMESTAMP, BODY.as_bytes(), Timestamp::from_millis(1));
        assert_eq!(during, format!("{only_new} {EXPECTED}"));
        let after = signer.signature(ID, TIMESTAMP, BODY.as_bytes(), expires);
        assert_eq!(after, only_new);
    }

    #[test]
    fn generated_secrets_are_distinct_and_parse() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert_eq!(
            STANDARD.decode(&a[SECRET_PREFIX.len()..]).unwrap().len(),
            SECRET_BYTES
        );
        assert!(parse_secret(&a).is_ok());
        assert_eq!(parse_secret("abc").unwrap_err(), SecretError::Prefix);
        assert_eq!(parse_secret("whsec_!!").unwrap_err(), SecretError::Base64);
        assert_eq!(parse_secret("whsec_").unwrap_err(), SecretError::Empty);
    }

    #[test]
    fn unix_seconds_round_down() {
        assert_eq!(
            unix_seconds(Timestamp::from_millis(1_649_367_553_999)),
            1_649_367_553
        );
        assert_eq!(unix_seconds(Timestamp::from_millis(-1)), -1);
    }
}
