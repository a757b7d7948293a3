//! Authentication and tenant isolation (see `docs/security.md`).
//!
//! One middleware ([`middleware::authenticate`], on every request) turns
//! `Authorization: Bearer <secret>` into a [`Principal`] — or answers 401,
//! or refuses a browser's forged write, a foreign `Host` or a client over
//! its rate — and one route layer ([`middleware::authorize`]) checks the
//! principal against the route table ([`middleware::rule`]): a tenant
//! key reaches only its own tenant's paths (anything else looks like a
//! tenant that does not exist: 404, no existence oracle), `read` keys do
//! not write, and cluster internals, keys and the audit log are for
//! admins. Routes that name tenants in their body (BigBen's registration,
//! schedule and cron creation) and listings check the principal in their
//! handlers.
//!
//! # Modes
//! - `auth.mode = "keys"` (default): every request needs a key, except
//!   while the store holds no key at all *and* the node listens on a
//!   loopback address: then Belfry runs open (and says so in its log), so
//!   the quick start works without a key. A non-loopback listener with no
//!   key refuses to start ([`check_startup`]).
//!   While open, a request that came through a proxy is refused: the
//!   loopback address is what open mode trusts, and a proxy on this
//!   machine relays clients from anywhere.
//! - `auth.mode = "none"`: no authentication (BigBen drop-in behind a
//!   trusted network); keys are ignored, and the `Host` must be an address
//!   or an allowed name (against DNS rebinding).
//!
//! # Layout
//! - this file: [`AuthOptions`], [`Auth`] (the key cache, the open-mode
//!   state), [`Principal`], start-up checks and the bootstrap key;
//! - [`middleware`]: the two layers and the route table;
//! - [`routes`]: `/v1/keys` and `/v1/audit`, and [`routes::audit`];
//! - [`cache`]: the known keys, and the budget for reading unknown ones;
//! - [`limit`]: per-key token buckets;
//! - [`mask`]: write-only secrets in tenant answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use belfry_core::auth::{ApiKey, AuditAction, AuditEntry, KeyId, KeySecret, Role};
use belfry_core::{Clock, MonoTime, TenantName, Timestamp};
use belfry_store::{SharedStore, StoreResult};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, code};

pub mod cache;
pub mod limit;
pub mod mask;
pub(crate) mod middleware;
pub(crate) mod routes;

/// How requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// API keys (open only while none exists and the listener is loopback).
    #[default]
    Keys,
    /// No authentication at all: every request may do everything.
    None,
}

/// The `auth` section of the configuration. The doc comments are the
/// user's reference.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthOptions {
    /// `"keys"` (default) or `"none"` (no authentication; also
    /// `belfry serve --insecure-no-auth`).
    pub mode: AuthMode,
    /// An admin key (a valid `bfy_` secret) stored at start if it is not
    /// stored yet, so a deployment can be provisioned without the CLI.
    /// Env `BELFRY_AUTH__BOOTSTRAP_ADMIN_KEY`.
    pub bootstrap_admin_key: Option<String>,
    /// Host names (without port) accepted in the `Host` header of requests
    /// without a key (the node open, or `mode = "none"`), besides
    /// `localhost`, loopback addresses, the listen address and, with
    /// `mode = "none"`, any IP address; `"*"` accepts any. Against DNS
    /// rebinding.
    pub allowed_hosts: Vec<String>,
    /// Requests per second per key; `0` (default) turns the limit off.
    pub rate_limit_per_key: u32,
    /// Requests a key may send at once above its rate (the bucket size);
    /// `0`: twice `rate_limit_per_key`.
    pub rate_limit_burst: u32,
    /// How long a node trusts what it read of a key: its revocation by
    /// another node or the CLI takes effect within this (on the node that
    /// revoked it, at once). Default 5000, at most 60000.
    pub key_cache_ttl_ms: u64,
    /// Store reads per second, node-wide, for keys this node does not
    /// know yet (a key created on another node, or a made-up one); the
    /// rest are answered 503 with `Retry-After` and cost nothing. Keys the
    /// node knows never wait for it. Default 50, at least 1.
    pub unknown_key_reads_per_second: u32,
}

/// The longest `auth.key_cache_ttl_ms`: how long a revoked key may still
/// be accepted by a node that did not revoke it.
pub const MAX_KEY_CACHE_TTL_MS: u64 = 60_000;

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            mode: AuthMode::Keys,
            bootstrap_admin_key: None,
            allowed_hosts: Vec::new(),
            rate_limit_per_key: 0,
            rate_limit_burst: 0,
            key_cache_ttl_ms: 5_000,
            unknown_key_reads_per_second: 50,
        }
    }
}

impl std::fmt::Debug for AuthOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthOptions")
            .field("mode", &self.mode)
            .field(
                "bootstrap_admin_key",
                &self.bootstrap_admin_key.as_ref().map(|_| "****"),
            )
            .field("allowed_hosts", &self.allowed_hosts)
            .field("rate_limit_per_key", &self.rate_limit_per_key)
            .field("rate_limit_burst", &self.rate_limit_burst)
            .field("key_cache_ttl_ms", &self.key_cache_ttl_ms)
            .field(
                "unknown_key_reads_per_second",
                &self.unknown_key_reads_per_second,
            )
            .finish()
    }
}

impl AuthOptions {
    /// Problems with these settings, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(secret) = &self.bootstrap_admin_key
            && let Err(error) = KeySecret::parse(secret)
        {
            problems.push(format!(
                "auth.bootstrap_admin_key is not a valid key: {error}"
            ));
        }
        for host in &self.allowed_hosts {
            if host.is_empty() || host.contains(['/', ' ', '@']) {
                problems.push(format!(
                    "auth.allowed_hosts: {host:?} is not a host name (no scheme, path or port)"
                ));
            }
        }
        if self.key_cache_ttl_ms > MAX_KEY_CACHE_TTL_MS {
            problems.push(format!(
                "auth.key_cache_ttl_ms is {}, more than {MAX_KEY_CACHE_TTL_MS}: a revoked key \
                 would stay valid on other nodes that long",
                self.key_cache_ttl_ms
            ));
        }
        if self.unknown_key_reads_per_second == 0 {
            problems.push(
                "auth.unknown_key_reads_per_second must be at least 1 (keys created on \
                 another node are read under it)"
                    .to_string(),
            );
        }
        problems
    }
}

/// Who is asking, set by [`middleware::authenticate`] on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key used; `None` in open mode.
    pub key: Option<KeyId>,
    pub scope: Scope,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// No key: open mode or `auth.mode = "none"`. May do everything.
    Open,
    /// An admin key.
    Admin,
    /// A tenant's key.
    Tenant { tenant: TenantName, role: Role },
}

impl Principal {
    pub const OPEN: Principal = Principal {
        key: None,
        scope: Scope::Open,
    };

    /// Admin keys, and everyone in open mode.
    pub fn is_admin(&self) -> bool {
        matches!(self.scope, Scope::Open | Scope::Admin)
    }

    /// The tenant a tenant key belongs to.
    pub fn tenant(&self) -> Option<&TenantName> {
        match &self.scope {
            Scope::Tenant { tenant, .. } => Some(tenant),
            _ => None,
        }
    }

    /// Whether `tenant` exists for this principal at all.
    pub fn sees(&self, tenant: &TenantName) -> bool {
        self.is_admin() || self.tenant() == Some(tenant)
    }

    /// Whether the principal may change data (its own tenant's, or any for
    /// admins).
    pub fn can_write(&self) -> bool {
        match &self.scope {
            Scope::Open | Scope::Admin => true,
            Scope::Tenant { role, .. } => role.can_write(),
        }
    }

    /// Whether the principal may claim `tenant`'s events and call their
    /// leases: admins, and `worker` keys of that tenant.
    pub fn may_pull(&self, tenant: &TenantName) -> bool {
        match &self.scope {
            Scope::Open | Scope::Admin => true,
            Scope::Tenant { tenant: own, role } => own == tenant && *role == Role::Worker,
        }
    }

    /// Whether the principal may change `tenant`'s data.
    pub fn may_write(&self, tenant: &TenantName) -> bool {
        self.sees(tenant) && self.can_write()
    }

    /// Who the audit log names: the key id, or `open`.
    pub fn actor(&self) -> String {
        match &self.key {
            Some(id) => id.to_string(),
            None => "open".to_string(),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = crate::error::V1Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // Always set by the middleware; a route without it is refused
        // rather than opened.
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| crate::error::V1Error(unauthorized("an API key is required")))
    }
}

/// A 401 (the middleware adds `WWW-Authenticate: Bearer`).
pub(crate) fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::UNAUTHORIZED,
        code::UNAUTHORIZED,
        message,
    )
}

/// Most keys whose last use is remembered; emptied whole when full (only
/// valid keys enter it).
const TOUCHED_CAPACITY: usize = 10_000;

/// A key's `last_used_at` is written at most this often.
const TOUCH_INTERVAL: Duration = Duration::from_secs(60);

/// While open (no keys), how often the store is asked again whether a key
/// exists (one created by the CLI or another node closes the node).
const OPEN_RECHECK: Duration = Duration::from_secs(1);

/// The authentication state of a node; shared by every request.
pub struct Auth {
    options: AuthOptions,
    store: SharedStore,
    /// Whether the node may run open while no key exists (loopback
    /// listener, `auth.mode = "keys"`).
    open_without_keys: bool,
    /// Lowercase host names accepted while open; empty: any.
    allowed_hosts: Vec<String>,
    /// Whether a key existed at the last check, and when that was.
    keys_exist: AtomicBool,
    keys_checked: Mutex<Option<MonoTime>>,
    keys: Arc<cache::KeyCache>,
    touched: Mutex<HashMap<KeyId, MonoTime>>,
    pub(crate) limiter: limit::RateLimiter,
    /// Ages the key tables and times the rate limits.
    pub(crate) clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("options", &self.options)
            .field("open_without_keys", &self.open_without_keys)
            .finish_non_exhaustive()
    }
}

/// Whether `listen` is a loopback address.
pub fn is_loopback(listen: SocketAddr) -> bool {
    listen.ip().is_loopback()
}

/// The start-up rule: with `auth.mode = "keys"`, no key in the store and a
/// listener that is not loopback, the node must not start. Logs what the
/// node will do otherwise.
///
/// # Errors
/// The refusal, phrased for the operator.
pub async fn check_startup(
    options: &AuthOptions,
    store: &SharedStore,
    listen: SocketAddr,
) -> Result<(), String> {
    if options.mode == AuthMode::None {
        tracing::warn!(
            %listen,
            "auth.mode = \"none\": no authentication, anyone who can reach {listen} may read \
             and change every tenant; use only behind a trusted network"
        );
        if options.allowed_hosts.is_empty() {
            tracing::info!(
                "requests must name this node by IP address or localhost in their Host \
                 header; list DNS names it is reached by in auth.allowed_hosts"
            );
        }
        return Ok(());
    }
    let keys = store
        .list_api_keys()
        .await
        .map_err(|e| format!("cannot read the API keys: {e}"))?;
    if !keys.is_empty() {
        tracing::info!(keys = keys.len(), "API keys required");
        return Ok(());
    }
    if is_loopback(listen) {
        tracing::warn!(
            %listen,
            "no API keys exist: the API is open to anyone on this machine (loopback only); \
             create one with `belfry keys create --role admin` to require keys"
        );
        Ok(())
    } else {
        Err(format!(
            "refusing to listen on {listen} without API keys: create one first \
             (`belfry keys create --role admin`), set auth.bootstrap_admin_key, or set \
             auth.mode = \"none\" (--insecure-no-auth) if a trusted network protects the port"
        ))
    }
}

/// Stores `auth.bootstrap_admin_key` unless a key with its hash exists or
/// was revoked. Returns the key's id when it was stored now.
///
/// # Errors
/// An invalid secret or a store failure.
pub async fn seed_bootstrap_key(
    options: &AuthOptions,
    store: &SharedStore,
    now: Timestamp,
) -> Result<Option<KeyId>, String> {
    let Some(text) = &options.bootstrap_admin_key else {
        return Ok(None);
    };
    let secret = KeySecret::parse(text)
        .map_err(|e| format!("auth.bootstrap_admin_key is not a valid key: {e}"))?;
    if store
        .api_key_by_hash(&secret.hash())
        .await
        .map_err(|e| format!("cannot read the API keys: {e}"))?
        .is_some()
    {
        return Ok(None);
    }
    let key = ApiKey::new(&secret, None, Role::Admin, now, None).map_err(|e| e.to_string())?;
    let id = key.id.clone();
    let stored = store
        .put_api_key(key)
        .await
        .map_err(|e| format!("cannot store the bootstrap admin key: {e}"))?;
    if !stored {
        // Stored by another node meanwhile, or revoked: a revoked key
        // stays revoked, whatever the configuration still says.
        let exists = store
            .api_key_by_hash(&secret.hash())
            .await
            .map_err(|e| format!("cannot read the API keys: {e}"))?
            .is_some();
        if !exists {
            tracing::warn!(
                "auth.bootstrap_admin_key was revoked: it stays revoked and is not stored \
                 again; remove it from the configuration"
            );
        }
        return Ok(None);
    }
    let entry = AuditEntry::new(
        now,
        "bootstrap",
        AuditAction::KeyCreated,
        None,
        Some(id.to_string()),
    )
    .map_err(|e| e.to_string())?;
    store
        .append_audit(entry)
        .await
        .map_err(|e| format!("cannot write the audit log: {e}"))?;
    tracing::info!(key = %id, "bootstrap admin key stored");
    Ok(Some(id))
}

/// The outcome of looking a presented secret up.
pub(crate) enum Lookup {
    Valid(ApiKey),
    /// Malformed, unknown (or revoked), or expired: all a 401.
    Refused(&'static str),
    /// Not known to this node, and its budget for reading unknown keys is
    /// spent: a 503, retry after this long.
    Busy(Duration),
}

impl Auth {
    /// The state of a node listening on `listen`.
    pub fn new(
        options: AuthOptions,
        store: SharedStore,
        listen: SocketAddr,
        clock: Arc<dyn Clock>,
    ) -> Auth {
        let open_without_keys = options.mode == AuthMode::Keys && is_loopback(listen);
        let mut allowed_hosts: Vec<String> = options
            .allowed_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        if allowed_hosts.iter().any(|h| h == "*") {
            allowed_hosts.clear();
        } else {
            allowed_hosts.push(host_of_addr(listen));
        }
        let limiter = limit::RateLimiter::new(options.rate_limit_per_key, options.rate_limit_burst);
        let keys = Arc::new(cache::KeyCache::new(
            store.clone(),
            clock.clone(),
            Duration::from_millis(options.key_cache_ttl_ms),
            options.unknown_key_reads_per_second,
        ));
        Auth {
            options,
            store,
            open_without_keys,
            allowed_hosts,
            keys_exist: AtomicBool::new(false),
            keys_checked: Mutex::new(None),
            keys,
            touched: Mutex::new(HashMap::new()),
            limiter,
            clock,
        }
    }

    pub fn options(&self) -> &AuthOptions {
        &self.options
    }

    /// Whether a request without a key is let in now (as [`Principal::OPEN`]).
    ///
    /// # Errors
    /// The store could not tell whether keys exist: the request is not let
    /// in, and is answered as a store outage (503), not as a missing key.
    pub(crate) async fn open_now(&self) -> Result<bool, belfry_store::StoreError> {
        if self.options.mode == AuthMode::None {
            return Ok(true);
        }
        if !self.open_without_keys {
            return Ok(false);
        }
        if self.keys_exist.load(Ordering::Acquire) {
            // Once a key exists the node stays closed until a check finds
            // none (every key revoked).
            if !self.recheck_due() {
                return Ok(false);
            }
        } else if !self.recheck_due() {
            return Ok(true);
        }
        match self.store.list_api_keys().await {
            Ok(keys) => {
                self.keys_exist.store(!keys.is_empty(), Ordering::Release);
                Ok(keys.is_empty())
            }
            Err(error) => {
                // Unknown: ask again at the next request.
                *lock(&self.keys_checked) = None;
                Err(error)
            }
        }
    }

    fn recheck_due(&self) -> bool {
        let mut checked = lock(&self.keys_checked);
        let now = self.clock.monotonic();
        let due = checked.is_none_or(|at| now.since(at) >= OPEN_RECHECK);
        if due {
            *checked = Some(now);
        }
        due
    }

    /// Whether the `Host` header may be served without a key: a loopback
    /// name, the listen address, a name in `auth.allowed_hosts` (`"*"`:
    /// any) and, with `auth.mode = "none"`, any IP address. A request whose
    /// `Host` is some other name was sent to that name: a page whose name
    /// now resolves to this node (DNS rebinding) reads as just that.
    pub(crate) fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return true;
        };
        if self.allowed_hosts.is_empty() {
            return true;
        }
        let name = strip_port(host).to_ascii_lowercase();
        if name == "localhost" || self.allowed_hosts.contains(&name) {
            return true;
        }
        let ip = name
            .strip_prefix('[')
            .and_then(|v6| v6.strip_suffix(']'))
            .unwrap_or(&name)
            .parse::<std::net::IpAddr>();
        match ip {
            Ok(ip) => ip.is_loopback() || self.options.mode == AuthMode::None,
            Err(_) => false,
        }
    }

    /// Whether the node runs open (`auth.mode = "keys"`, no key yet) rather
    /// than with `auth.mode = "none"`.
    pub(crate) fn open_for_lack_of_keys(&self) -> bool {
        self.open_without_keys
    }

    /// The key behind `secret`, from the node's key tables or the store
    /// (see [`cache`]).
    pub(crate) async fn lookup(&self, secret: &str, now: Timestamp) -> StoreResult<Lookup> {
        let Ok(secret) = KeySecret::parse(secret) else {
            return Ok(Lookup::Refused("the API key is malformed"));
        };
        let key = match self.keys.find(&secret.hash()).await? {
            cache::Found::Key(key) => key,
            cache::Found::Missing => {
                return Ok(Lookup::Refused("the API key is unknown or revoked"));
            }
            cache::Found::Busy(wait) => return Ok(Lookup::Busy(wait)),
        };
        if key.expired(now) {
            return Ok(Lookup::Refused("the API key has expired"));
        }
        self.keys_exist.store(true, Ordering::Release);
        self.touch(&key, now);
        Ok(Lookup::Valid(key))
    }

    /// Files every stored key as known, so that a flood of made-up keys
    /// from the first second on does not delay the real ones (they would
    /// otherwise share the budget for unknown keys until first read).
    ///
    /// # Errors
    /// The store could not list the keys.
    pub async fn load_known_keys(&self) -> StoreResult<usize> {
        if self.options.mode == AuthMode::None {
            return Ok(0);
        }
        let read_at = self.clock.monotonic();
        let keys = self.store.list_api_keys().await?;
        let count = keys.len().min(cache::KNOWN_CAPACITY);
        for key in keys.into_iter().take(cache::KNOWN_CAPACITY) {
            self.keys.remember(key, read_at);
        }
        Ok(count)
    }

    /// Records the key's use, at most once a minute per key, off the
    /// request path.
    fn touch(&self, key: &ApiKey, now: Timestamp) {
        {
            let mut touched = lock(&self.touched);
            let at_now = self.clock.monotonic();
            if touched
                .get(&key.id)
                .is_some_and(|at| at_now.since(*at) < TOUCH_INTERVAL)
            {
                return;
            }
            if touched.len() >= TOUCHED_CAPACITY {
                touched.clear();
            }
            touched.insert(key.id.clone(), at_now);
        }
        let store = self.store.clone();
        let id = key.id.clone();
        tokio::spawn(async move {
            if let Err(error) = store.touch_api_key(&id, now).await {
                tracing::debug!(key = %id, %error, "could not record a key's last use");
            }
        });
    }

    /// After a key was created through this node: it is valid here at
    /// once, and the node is no longer open.
    pub(crate) fn key_created(&self, key: ApiKey) {
        self.keys.created(key);
        self.keys_exist.store(true, Ordering::Release);
        *lock(&self.keys_checked) = None;
    }

    /// After a key was revoked through this node: refused here at once.
    pub(crate) fn key_revoked(&self, key: &ApiKey) {
        self.keys.revoked(&key.hash);
        lock(&self.touched).remove(&key.id);
        *lock(&self.keys_checked) = None;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded maps are caches: a panic elsewhere leaves them usable.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// `host:port`, `[v6]:port`, `host` → the host part as written.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn host_of_addr(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) => v4.ip().to_string(),
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_stripped_from_host_headers() {
        assert_eq!(strip_port("localhost:8080"), "localhost");
        assert_eq!(strip_port("localhost"), "localhost");
        assert_eq!(strip_port("[::1]:8080"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(strip_port("evil.example:x"), "evil.example:x");
    }

    #[test]
    fn principals_see_their_own_tenant_only() {
        let acme = TenantName::new("acme").unwrap();
        let other = TenantName::new("other").unwrap();
        let reader = Principal {
            key: KeyId::parse("key_a"),
            scope: Scope::Tenant {
                tenant: acme.clone(),
                role: Role::Read,
            },
        };
        assert!(reader.sees(&acme) && !reader.sees(&other));
        assert!(!reader.may_write(&acme) && !reader.is_admin());
        assert_eq!(reader.actor(), "key_a");
        let writer = Principal {
            scope: Scope::Tenant {
                tenant: acme.clone(),
                role: Role::Write,
            },
            ..reader
        };
        assert!(writer.may_write(&acme) && !writer.may_write(&other));
        assert!(Principal::OPEN.may_write(&other) && Principal::OPEN.is_admin());
        assert_eq!(Principal::OPEN.actor(), "open");
    }

    #[test]
    fn options_are_checked_and_debug_hides_the_bootstrap_key() {
        let secret = KeySecret::generate().unwrap();
        let options = AuthOptions {
            bootstrap_admin_key: Some(secret.expose().to_string()),
            ..AuthOptions::default()
        };
        assert!(options.problems().is_empty());
        assert!(!format!("{options:?}").contains(secret.expose()));
        let bad = AuthOptions {
            bootstrap_admin_key: Some("bfy_short".into()),
            allowed_hosts: vec!["http://x/".into()],
            ..AuthOptions::default()
        };
        assert_eq!(bad.problems().len(), 2);
        let at_the_cap = AuthOptions {
            key_cache_ttl_ms: MAX_KEY_CACHE_TTL_MS,
            ..AuthOptions::default()
        };
        assert!(at_the_cap.problems().is_empty());
        let unbounded = AuthOptions {
            key_cache_ttl_ms: MAX_KEY_CACHE_TTL_MS + 1,
            unknown_key_reads_per_second: 0,
            ..AuthOptions::default()
        };
        let problems = unbounded.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("auth.key_cache_ttl_ms"));
        assert!(problems[1].starts_with("auth.unknown_key_reads_per_second"));
    }
}
