//! TLS for the API (rustls, ring), with certificates reloaded while
//! serving and optional client-certificate authentication.
//!
//! # Contract
//! - `tls.cert_file` (PEM chain, leaf first) and `tls.key_file` (PEM
//!   PKCS#8, PKCS#1 or SEC1 key) are read at start; a missing, unreadable
//!   or mismatched pair refuses the start.
//! - Every `tls.reload_interval_ms` both files are read again; when their
//!   bytes changed, the new pair is loaded and served to every new
//!   handshake (open connections keep theirs). A new pair that does not
//!   load (half-written, mismatched key) is logged as an error and the old
//!   certificate stays in service; the next change is tried again. Comparing
//!   contents rather than modification times also catches a replacement
//!   through a symlink swap (Kubernetes secrets) and a rewrite within one
//!   timestamp tick.
//! - With `tls.client_ca_file`, client certificates signed by those CAs are
//!   verified: `tls.client_auth = "required"` (the default) refuses a
//!   handshake without one; `"optional"` accepts clients without a
//!   certificate but refuses an invalid one. The CA file is read at start
//!   only. A client certificate authenticates the connection only: what a
//!   request may do is still decided by its API key.
//! - Only TLS 1.2 and 1.3 with rustls's safe defaults; ALPN `http/1.1`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use belfry_core::Clock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use crate::listener::Handshake;

/// TLS settings (`[tls]`); TLS is on when `cert_file` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsOptions {
    /// PEM certificate chain of the API (leaf first). Set: the API speaks
    /// HTTPS only. Requires `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates that sign client certificates: set, clients are
    /// asked for a certificate (see `client_auth`).
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: `"required"` (default) refuses a client
    /// without a valid certificate; `"optional"` lets clients without one
    /// in (an invalid one is still refused).
    pub client_auth: ClientAuth,
    /// How often `cert_file` and `key_file` are checked for a new
    /// certificate. Default 5 s.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "reload_interval_ms"
    )]
    pub reload_interval: Duration,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            client_auth: ClientAuth::Required,
            reload_interval: Duration::from_secs(5),
        }
    }
}

impl TlsOptions {
    /// Problems with the combination of settings, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => problems.push("tls.cert_file is set but tls.key_file is not".into()),
            (None, Some(_)) => problems.push("tls.key_file is set but tls.cert_file is not".into()),
            _ => {}
        }
        if self.client_ca_file.is_some() && self.cert_file.is_none() {
            problems.push("tls.client_ca_file needs tls.cert_file and tls.key_file".into());
        }
        if self.reload_interval.is_zero() {
            problems.push("tls.reload_interval_ms must be at least 1, not 0".into());
        }
        problems
    }
}

/// Whether a client certificate is required when `client_ca_file` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    Required,
    Optional,
}

/// The TLS side of the listener: a handshake with the current certificate.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Handshake for Tls {
    type Stream = tokio_rustls::server::TlsStream<TcpStream>;

    async fn handshake(&self, tcp: TcpStream) -> std::io::Result<Self::Stream> {
        self.acceptor.accept(tcp).await
    }
}

impl Tls {
    /// Loads the certificate (and client CAs), and starts the task that
    /// reloads the certificate when its files change.
    ///
    /// # Errors
    /// Unreadable or invalid files, each error naming the file.
    pub fn start(options: &TlsOptions, clock: Arc<dyn Clock>) -> anyhow::Result<Tls> {
        let (Some(cert_file), Some(key_file)) = (&options.cert_file, &options.key_file) else {
            anyhow::bail!("tls.cert_file and tls.key_file are both required for TLS");
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let pair = PairFiles {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
        };
        let (cert_pem, key_pem) = pair.read().map_err(|e| anyhow::anyhow!(e))?;
        let key = certified_key(&cert_pem, &key_pem, &provider)
            .map_err(|e| anyhow::anyhow!("cannot load tls.cert_file and tls.key_file: {e}"))?;
        let resolver = Arc::new(CurrentCert(RwLock::new(Arc::new(key))));

        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow::anyhow!("cannot configure TLS: {e}"))?;
        let builder = match &options.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let verifier = client_verifier(path, options.client_auth, &provider)?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];

        tokio::spawn(reload_loop(
            pair,
            (cert_pem, key_pem),
            resolver,
            provider,
            options.reload_interval,
            clock,
        ));
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

fn client_verifier(
    path: &Path,
    auth: ClientAuth,
    provider: &Arc<CryptoProvider>,
) -> anyhow::Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    let pem = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read tls.client_ca_file {}: {e}", path.display()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert
            .map_err(|e| anyhow::anyhow!("tls.client_ca_file {}: bad PEM: {e}", path.display()))?;
        roots.add(cert).map_err(|e| {
            anyhow::anyhow!(
                "tls.client_ca_file {}: bad certificate: {e}",
                path.display()
            )
        })?;
    }
    if roots.is_empty() {
        anyhow::bail!("tls.client_ca_file {} holds no certificate", path.display());
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match auth {
        ClientAuth::Required => builder,
        ClientAuth::Optional => builder.allow_unauthenticated(),
    };
    builder
        .build()
        .map_err(|e| anyhow::anyhow!("tls.client_ca_file {}: {e}", path.display()))
}

/// The certificate handed to every new handshake; swapped on reload.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock still holds a complete key (swaps are one store).
        Some(match self.0.read() {
            Ok(key) => key.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        })
    }
}

impl CurrentCert {
    fn replace(&self, key: CertifiedKey) {
        let key = Arc::new(key);
        match self.0.write() {
            Ok(mut current) => *current = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
    }
}

#[derive(Debug, Clone)]
struct PairFiles {
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl PairFiles {
    /// Both files' bytes; the error names the file, never its content.
    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), String> {
        let read = |key: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {key} {}: {e}", path.display()))
        };
        Ok((
            read("tls.cert_file", &self.cert_file)?,
            read("tls.key_file", &self.key_file)?,
        ))
    }
}

/// A certified key from PEM bytes, the key checked against the leaf.
fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate file is not valid PEM: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate file holds no certificate".into());
    }
    // The key's parse error may quote nothing of the key; keep it generic.
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| "the key file holds no usable PEM private key".to_string())?;
    CertifiedKey::from_der(chain, key, provider)
        .map_err(|e| format!("the key does not go with the certificate: {e}"))
}

/// Polls the pair's files; loads a changed pair, keeps the old one when
/// the new one does not load.
async fn reload_loop(
    pair: PairFiles,
    mut seen: (Vec<u8>, Vec<u8>),
    current: Arc<CurrentCert>,
    provider: Arc<CryptoProvider>,
    every: Duration,
    clock: Arc<dyn Clock>,
) {
    loop {
        clock.sleep(every).await;
        let files = pair.clone();
        let read = tokio::task::spawn_blocking(move || files.read()).await;
        let (cert_pem, key_pem) = match read {
            Ok(Ok(pems)) => pems,
            Ok(Err(error)) => {
                tracing::error!(%error, "TLS certificate reload failed; keeping the current one");
                continue;
            }
            Err(_) => continue,
        };
        if (&cert_pem, &key_pem) == (&seen.0, &seen.1) {
            continue;
        }
        match certified_key(&cert_pem, &key_pem, &provider) {
            Ok(key) => {
                current.replace(key);
                tracing::info!(cert_file = %pair.cert_file.display(), "TLS certificate reloaded");
            }
            Err(error) => tracing::error!(
                %error,
                cert_file = %pair.cert_file.display(),
                key_file = %pair.key_file.display(),
                "TLS certificate reload failed; keeping the current one"
            ),
        }
        // Either way, wait for the next change before trying again.
        seen = (cert_pem, key_pem);
    }
}
