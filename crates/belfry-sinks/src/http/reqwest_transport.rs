//! reqwest as a [`Transport`]: `https://` (rustls with the `ring`
//! provider and the platform's roots), and plain http behind an HTTP proxy.
//!
//! One `reqwest::Client` serves every tenant, so its pool keeps
//! connections alive per host. Redirects are off. The egress policy is
//! applied twice, covering both ways reqwest finds an address: a custom
//! DNS resolver (`EgressResolver`) filters what a host name resolves to,
//! and [`Transport::prepare`] checks a URL whose host is an IP literal
//! (hyper connects to those without asking the resolver). With a proxy, the
//! address connected to is the proxy's, which the resolver checks.

use std::error::Error as _;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use belfry_core::Verdict;
use belfry_core::policy::RetryAfter;

use super::client::allowed_addresses;
use super::config::HttpSinkOptions;
use super::retry::classify_status;
use super::transport::{
    DRAIN_LIMIT, ERROR_BODY_LIMIT, Outgoing, Response, Transport, TransportError,
};
use crate::egress::{EgressPolicy, EgressRefusal};

/// The reqwest transport.
#[derive(Debug, Clone)]
pub struct ReqwestTransport {
    client: reqwest::Client,
    egress: Arc<EgressPolicy>,
}

/// A target prepared for reqwest.
#[derive(Debug)]
pub struct ReqwestTarget {
    url: reqwest::Url,
    headers: HeaderMap,
    /// The URL's host when it is an IP literal (checked at every send).
    literal: Option<IpAddr>,
}

impl ReqwestTransport {
    /// Installs rustls' `ring` provider as the process default first
    /// (reqwest is built without one).
    ///
    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn new(
        options: &HttpSinkOptions,
        egress: Arc<EgressPolicy>,
    ) -> Result<Self, reqwest::Error> {
        Self::with_roots(options, egress, Vec::new())
    }

    /// [`ReqwestTransport::new`] trusting only `roots` when there are any
    /// (tests: a test CA), else the platform's roots.
    ///
    /// # Errors
    /// When reqwest cannot build the client (e.g. an invalid user agent).
    pub fn with_roots(
        options: &HttpSinkOptions,
        egress: Arc<EgressPolicy>,
        roots: Vec<reqwest::Certificate>,
    ) -> Result<Self, reqwest::Error> {
        // Err means another provider is already installed: fine, use it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder();
        if !roots.is_empty() {
            builder = builder.tls_certs_only(roots);
        }
        let client = builder
            .tls_backend_rustls()
            .connect_timeout(options.connect_timeout)
            .pool_max_idle_per_host(options.pool_max_idle_per_host)
            .pool_idle_timeout(options.pool_idle_timeout)
            .user_agent(options.user_agent.clone())
            .tcp_nodelay(true)
            // A 3xx is a retry, never followed: following would turn the POST
            // into a GET and deliver somewhere the tenant did not register
            // (and past the egress check of the registered URL).
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(EgressResolver {
                egress: Arc::clone(&egress),
            }))
            .build()?;
        Ok(ReqwestTransport { client, egress })
    }
}

impl Transport for ReqwestTransport {
    type Target = ReqwestTarget;

    fn prepare(
        &self,
        url: &reqwest::Url,
        headers: &HeaderMap,
        _user_agent: &str,
    ) -> Result<ReqwestTarget, String> {
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            _ => None,
        };
        Ok(ReqwestTarget {
            url: url.clone(),
            headers: headers.clone(),
            literal,
        })
    }

    async fn send(
        &self,
        target: &ReqwestTarget,
        request: Outgoing<'_>,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        // Checked at every send: the policy can change (the node's open
        // switch), and reqwest does not resolve address literals.
        if let Some(refusal) = target.literal.and_then(|ip| self.egress.check(ip).err()) {
            return Err(TransportError::Egress(refusal));
        }
        let mut headers = target.headers.clone();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        for (name, value) in request.headers {
            let value = HeaderValue::from_str(value)
                .map_err(|_| TransportError::InvalidRequest(format!("header {name}")))?;
            headers.insert(HeaderName::from_static(name), value);
        }
        let sent = self
            .client
            .post(target.url.clone())
            .headers(headers)
            .body(request.body.to_vec())
            .timeout(timeout)
            .send()
            .await;
        let mut response = sent.map_err(|error| transport_error(&error.without_url()))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(RetryAfter::parse);
        if classify_status(status) == Verdict::Delivered {
            // The receiver has accepted; reading the rest only lets the
            // connection go back to the pool, so its errors do not matter.
            let _ = read_prefix(&mut response, DRAIN_LIMIT).await;
            return Ok(Response {
                status,
                body: Vec::new(),
                retry_after,
            });
        }
        let body = read_prefix(&mut response, ERROR_BODY_LIMIT).await;
        Ok(Response {
            status,
            body: body.to_vec(),
            retry_after,
        })
    }
}

/// A reqwest error in the transport's terms (the reasons match Belfry's
/// client for the same failures).
fn transport_error(error: &reqwest::Error) -> TransportError {
    if let Some(refusal) = find_source::<EgressRefusal>(error) {
        return TransportError::Egress(refusal.clone());
    }
    if error.is_builder() {
        return TransportError::InvalidRequest(error_chain(error));
    }
    if error.is_timeout() {
        return if error.is_connect() {
            TransportError::ConnectTimeout
        } else {
            TransportError::Timeout
        };
    }
    let kind = find_source::<io::Error>(error).map_or(io::ErrorKind::Other, io::Error::kind);
    let io_error = io::Error::new(kind, error_chain(error));
    if error.is_connect() {
        TransportError::Connect(io_error)
    } else {
        TransportError::Io(io_error)
    }
}

/// The first error of type `T` in the source chain.
fn find_source<T: std::error::Error + 'static>(error: &reqwest::Error) -> Option<&T> {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(found) = cause.downcast_ref::<T>() {
            return Some(found);
        }
        source = cause.source();
    }
    None
}

/// `error: cause: cause ...`. Callers strip the URL first
/// (`reqwest::Error::without_url`): the tenant's config already names it,
/// and a URL's query may carry secrets.
fn error_chain(error: &reqwest::Error) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

/// Reads at most `limit` bytes of the body (stops early at the limit; a
/// read error ends it with what arrived).
async fn read_prefix(response: &mut reqwest::Response, limit: usize) -> Bytes {
    let mut collected = Vec::new();
    while collected.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - collected.len();
                collected.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    Bytes::from(collected)
}

/// reqwest's resolver: the system's (`getaddrinfo`, through tokio), then
/// the egress policy on every address.
#[derive(Debug)]
struct EgressResolver {
    egress: Arc<EgressPolicy>,
}

impl Resolve for EgressResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let egress = Arc::clone(&self.egress);
        Box::pin(async move {
            // Port 0: hyper sets the URL's port on what we return.
            let addresses = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let (allowed, refusal) = allowed_addresses(addresses, &egress);
            if allowed.is_empty()
                && let Some(refusal) = refusal
            {
                return Err(Box::new(refusal) as Box<dyn std::error::Error + Send + Sync>);
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}
