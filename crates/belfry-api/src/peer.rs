//! Calls between the nodes of a cluster (`docs/security.md`, "Internal
//! calls").
//!
//! A node that forwards a pull worker's request to another node signs it
//! with the secret the cluster's nodes share (stored once in the
//! database): HMAC-SHA256 over the method, path and query, the sending
//! and receiving node ids, the signing time, a random nonce, the principal
//! the sender authenticated and the SHA-256 of the body. The worker's key
//! does not travel: the receiver acts for the signed principal.
//!
//! A request carrying the forwarded marker ([`FORWARDED`]) is admitted
//! only with a valid signature, addressed to this node, signed within
//! [`FRESHNESS`] of this node's clock and not seen before; anything else
//! is `403 forward_refused`. A request without the marker is an ordinary
//! client request, whatever other headers it carries.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use belfry_core::TenantName;
use belfry_core::auth::{KeyId, Role};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use ring::rand::SecureRandom;
use ring::{digest, hmac};

use crate::ApiState;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, Code};

/// Marks a request forwarded by another node (its value: that node's id).
pub const FORWARDED: HeaderName = HeaderName::from_static("belfry-forwarded");
/// The node the forward is addressed to.
pub const FORWARDED_TO: HeaderName = HeaderName::from_static("belfry-forwarded-to");
/// When it was signed, Unix milliseconds.
pub const FORWARDED_AT: HeaderName = HeaderName::from_static("belfry-forwarded-at");
/// 16 random bytes, hex: two forwards never share a signature.
pub const FORWARDED_NONCE: HeaderName = HeaderName::from_static("belfry-forwarded-nonce");
/// Whom the sender authenticated (see [`encode_principal`]).
pub const FORWARDED_FOR: HeaderName = HeaderName::from_static("belfry-forwarded-for");
/// `v1=` and the hex HMAC-SHA256.
pub const FORWARDED_SIGNATURE: HeaderName = HeaderName::from_static("belfry-forwarded-signature");

/// Bytes of the cluster secret a node generates.
pub const SECRET_LEN: usize = 32;
/// How far a forward's signing time may be from the receiver's clock, in
/// milliseconds, either way: the nodes' clocks must agree this well.
pub const FRESHNESS: i64 = 30_000;
/// Signatures remembered to refuse replays. Past it the oldest is
/// forgotten, and forwards signed no later than it are refused from then
/// on (so a forgotten one cannot come back): only a node receiving more
/// than this many forwards per [`FRESHNESS`] refuses a late one.
const REMEMBERED: usize = 100_000;

/// This node's part in the calls between nodes: who it is, the cluster's
/// shared key, and the forwards it accepted lately.
pub struct PeerAuth {
    /// This node's id: its forwards name it, and only forwards addressed
    /// to it are accepted.
    node: String,
    key: hmac::Key,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for PeerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("PeerAuth")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Accepted signatures (their first 16 bytes) within the window.
#[derive(Default)]
struct Seen {
    /// In the order accepted, with their signing times.
    order: VecDeque<(i64, [u8; 16])>,
    ids: HashSet<[u8; 16]>,
    /// Forwards signed at or before this are refused: a signature of such
    /// a forward may have been forgotten.
    floor: i64,
}

/// Why a forwarded request was refused (the message says which check).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this node is not part of a cluster and accepts no forwarded request")]
    NotInCluster,
    #[error("a forwarded request must carry every belfry-forwarded-* header, well formed")]
    Malformed,
    #[error("the forwarded request is addressed to another node")]
    WrongNode,
    #[error("the forwarded request was signed too long ago (or in the future)")]
    Stale,
    #[error("the forwarded request's signature is not valid")]
    BadSignature,
    #[error("the forwarded request was already received once")]
    Replayed,
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        ApiError::new(Code::ForwardRefused, refused.to_string())
    }
}

/// A fresh random cluster secret.
///
/// # Errors
/// The OS random source failed.
pub fn generate_secret() -> Result<[u8; SECRET_LEN], ring::error::Unspecified> {
    let mut secret = [0_u8; SECRET_LEN];
    ring::rand::SystemRandom::new().fill(&mut secret)?;
    Ok(secret)
}

fn locked(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    // Poison means a panic while held; the set stays consistent per call.
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The signed text: one field per line (no field can hold a line break:
/// they are header values, a method and a request target).
struct Signed<'a> {
    method: &'a str,
    target: &'a str,
    from: &'a str,
    to: &'a str,
    at: i64,
    nonce: &'a str,
    principal: &'a str,
    body: &'a [u8],
}

impl Signed<'_> {
    fn text(&self) -> String {
        let body = hex(digest::digest(&digest::SHA256, self.body).as_ref());
        format!(
            "belfry-forward-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{body}",
            self.method, self.target, self.from, self.to, self.at, self.nonce, self.principal
        )
    }
}

/// `open`, `admin KEY` or `ROLE KEY TENANT` (`-` for no key; the tenant
/// percent-encoded).
fn encode_principal(principal: &Principal) -> String {
    let key = principal.key.as_ref().map_or("-", KeyId::as_str);
    match &principal.scope {
        Scope::Open => "open".to_owned(),
        Scope::Admin => format!("admin {key}"),
        Scope::Tenant { tenant, role } => format!(
            "{} {key} {}",
            role.as_str(),
            percent_encoding::utf8_percent_encode(
                tenant.as_str(),
                percent_encoding::NON_ALPHANUMERIC
            )
        ),
    }
}

fn decode_principal(text: &str) -> Option<Principal> {
    let mut parts = text.split(' ');
    let scope = parts.next()?;
    if scope == "open" {
        return parts.next().is_none().then_some(Principal::OPEN);
    }
    let key = match parts.next()? {
        "-" => None,
        key => Some(KeyId::parse(key)?),
    };
    let scope = if scope == "admin" {
        Scope::Admin
    } else {
        let role = Role::parse(scope).ok()?;
        let tenant = percent_encoding::percent_decode_str(parts.next()?)
            .decode_utf8()
            .ok()?;
        Scope::Tenant {
            tenant: TenantName::new(tenant.into_owned()).ok()?,
            role,
        }
    };
    parts.next().is_none().then_some(Principal { key, scope })
}

fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<&'h str, Refused> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .ok_or(Refused::Malformed)
}

impl PeerAuth {
    /// Node `node` of the cluster whose nodes share `secret`.
    pub fn new(node: impl Into<String>, secret: &[u8]) -> Self {
        PeerAuth {
            node: node.into(),
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The headers that make a request to node `to` a signed forward of
    /// `principal`'s request (`target`: its path and query), signed at
    /// `at` (Unix milliseconds).
    ///
    /// # Errors
    /// The OS random source failed (no nonce).
    pub(crate) fn sign(
        &self,
        method: &Method,
        target: &str,
        to: &str,
        at: i64,
        principal: &Principal,
        body: &[u8],
    ) -> Result<Vec<(HeaderName, HeaderValue)>, ring::error::Unspecified> {
        let mut nonce = [0_u8; 16];
        ring::rand::SystemRandom::new().fill(&mut nonce)?;
        let nonce = hex(&nonce);
        let principal = encode_principal(principal);
        let signed = Signed {
            method: method.as_str(),
            target,
            from: &self.node,
            to,
            at,
            nonce: &nonce,
            principal: &principal,
            body,
        };
        let tag = hmac::sign(&self.key, signed.text().as_bytes());
        let value =
            |text: String| HeaderValue::try_from(text).map_err(|_| ring::error::Unspecified);
        Ok(vec![
            (FORWARDED, value(self.node.clone())?),
            (FORWARDED_TO, value(to.to_owned())?),
            (FORWARDED_AT, value(at.to_string())?),
            (FORWARDED_NONCE, value(nonce)?),
            (FORWARDED_FOR, value(principal)?),
            (
                FORWARDED_SIGNATURE,
                value(format!("v1={}", hex(tag.as_ref())))?,
            ),
        ])
    }

    /// The principal a forwarded request acts for, if its signature holds
    /// (see the module documentation); `now`: this node's clock, Unix
    /// milliseconds. An accepted forward is remembered, so the same
    /// request a second time is refused.
    ///
    /// # Errors
    /// [`Refused`], naming the check that failed.
    pub(crate) fn verify(
        &self,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Principal, Refused> {
        let from = header(headers, &FORWARDED)?;
        let to = header(headers, &FORWARDED_TO)?;
        let at: i64 = header(headers, &FORWARDED_AT)?
            .parse()
            .map_err(|_| Refused::Malformed)?;
        let nonce = header(headers, &FORWARDED_NONCE)?;
        let principal_text = header(headers, &FORWARDED_FOR)?;
        let tag = header(headers, &FORWARDED_SIGNATURE)?
            .strip_prefix("v1=")
            .and_then(unhex)
            .ok_or(Refused::Malformed)?;
        if to != self.node {
            return Err(Refused::WrongNode);
        }
        if at.abs_diff(now) > FRESHNESS.unsigned_abs() {
            return Err(Refused::Stale);
        }
        let signed = Signed {
            method: method.as_str(),
            target,
            from,
            to,
            at,
            nonce,
            principal: principal_text,
            body,
        };
        hmac::verify(&self.key, signed.text().as_bytes(), &tag)
            .map_err(|_| Refused::BadSignature)?;
        // Signed by a node: a principal that does not parse is a bug there.
        let principal = decode_principal(principal_text).ok_or(Refused::Malformed)?;
        let id: [u8; 16] = tag
            .get(..16)
            .and_then(|t| t.try_into().ok())
            .ok_or(Refused::Malformed)?;
        self.remember(id, at, now)?;
        Ok(principal)
    }

    /// Records an accepted signature; refuses one seen before.
    fn remember(&self, id: [u8; 16], at: i64, now: i64) -> Result<(), Refused> {
        let mut seen = locked(&self.seen);
        if at <= seen.floor || seen.ids.contains(&id) {
            return Err(Refused::Replayed);
        }
        // Stale ones are refused by their time already.
        while let Some(&(oldest, old)) = seen.order.front() {
            if oldest >= now.saturating_sub(FRESHNESS) && seen.order.len() < REMEMBERED {
                break;
            }
            seen.order.pop_front();
            seen.ids.remove(&old);
            if oldest >= now.saturating_sub(FRESHNESS) {
                seen.floor = seen.floor.max(oldest);
            }
        }
        seen.order.push_back((at, id));
        seen.ids.insert(id);
        Ok(())
    }
}

/// Admits a request carrying the [`FORWARDED`] marker: reads its body
/// (up to `api.max_body_bytes`), checks its signature and sets the
/// principal it was signed for.
///
/// # Errors
/// `403 forward_refused` (see [`Refused`]), `413` for a body too large.
pub(crate) async fn admit(state: &ApiState, request: Request) -> Result<Request, ApiError> {
    let Some(peers) = state.cluster.peers() else {
        return Err(refuse(Refused::NotInCluster));
    };
    let (mut parts, body) = request.into_parts();
    let limit = state.options.max_body_bytes;
    let body = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(ApiError::new(
                Code::BodyTooLarge,
                format!("request body is larger than {limit} bytes"),
            ));
        }
        Err(_) => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "the request body could not be read",
            ));
        }
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |target| target.as_str());
    let principal = peers
        .verify(
            &parts.method,
            target,
            &parts.headers,
            &body,
            state.engine.now().as_millis(),
        )
        .map_err(refuse)?;
    parts.extensions.insert(principal);
    Ok(Request::from_parts(parts, Body::from(body)))
}

fn refuse(refused: Refused) -> ApiError {
    tracing::warn!(reason = %refused, "refused a request marked as forwarded by another node");
    refused.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal() -> Principal {
        Principal {
            key: KeyId::parse("key_abc"),
            scope: Scope::Tenant {
                tenant: TenantName::new("acme/billing jobs").unwrap(),
                role: Role::Worker,
            },
        }
    }

    fn signed(from: &PeerAuth, to: &str, at: i64, body: &[u8]) -> HeaderMap {
        from.sign(
            &Method::POST,
            "/v1/leases/x/complete",
            to,
            at,
            &principal(),
            body,
        )
        .unwrap()
        .into_iter()
        .collect()
    }

    #[test]
    fn a_signed_forward_is_accepted_once_and_only_as_signed() {
        let a = PeerAuth::new("a", &[7; 32]);
        let b = PeerAuth::new("b", &[7; 32]);
        let path = "/v1/leases/x/complete";
        let headers = signed(&a, "b", 1_000_000, b"{}");
        assert_eq!(
            b.verify(&Method::POST, path, &headers, b"{}", 1_000_100),
            Ok(principal())
        );
        assert_eq!(
            b.verify(&Method::POST, path, &headers, b"{}", 1_000_200),
            Err(Refused::Replayed)
        );
        let headers = signed(&a, "b", 1_000_000, b"{}");
        for (method, path, body) in [
            (Method::PUT, path, &b"{}"[..]),
            (Method::POST, "/v1/leases/y/complete", b"{}"),
            (Method::POST, path, b"{\"result\":1}"),
        ] {
            assert_eq!(
                b.verify(&method, path, &headers, body, 1_000_000),
                Err(Refused::BadSignature)
            );
        }
        assert_eq!(
            a.verify(&Method::POST, path, &headers, b"{}", 1_000_000),
            Err(Refused::WrongNode)
        );
        assert_eq!(
            b.verify(
                &Method::POST,
                path,
                &headers,
                b"{}",
                1_000_000 + FRESHNESS + 1
            ),
            Err(Refused::Stale)
        );
        let other_cluster = PeerAuth::new("b", &[8; 32]);
        assert_eq!(
            other_cluster.verify(&Method::POST, path, &headers, b"{}", 1_000_000),
            Err(Refused::BadSignature)
        );
        let mut forged = headers.clone();
        forged.insert(FORWARDED_FOR, HeaderValue::from_static("admin -"));
        assert_eq!(
            b.verify(&Method::POST, path, &forged, b"{}", 1_000_000),
            Err(Refused::BadSignature)
        );
        let mut bare = HeaderMap::new();
        bare.insert(FORWARDED, HeaderValue::from_static("a"));
        assert_eq!(
            b.verify(&Method::POST, path, &bare, b"{}", 1_000_000),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn principals_survive_the_trip() {
        for principal in [
            Principal::OPEN,
            Principal {
                key: KeyId::parse("key_x"),
                scope: Scope::Admin,
            },
            principal(),
        ] {
            assert_eq!(
                decode_principal(&encode_principal(&principal)),
                Some(principal)
            );
        }
        assert_eq!(decode_principal("root key_x"), None);
        assert_eq!(decode_principal("open extra"), None);
    }

    #[test]
    fn a_full_memory_forgets_the_oldest_and_refuses_what_it_may_have_forgotten() {
        let peer = PeerAuth::new("b", &[7; 32]);
        let now = 10_000_000;
        for n in 0..REMEMBERED as u32 {
            let mut id = [0; 16];
            id[..4].copy_from_slice(&n.to_be_bytes());
            peer.remember(id, now - 1_000 + i64::from(n % 2), now)
                .unwrap();
        }
        let first = [0; 16];
        // Forgotten to make room, but signed no later than the floor.
        peer.remember([9; 16], now, now).unwrap();
        assert_eq!(
            peer.remember(first, now - 1_000, now),
            Err(Refused::Replayed)
        );
        assert!(locked(&peer.seen).order.len() <= REMEMBERED);
    }
}
