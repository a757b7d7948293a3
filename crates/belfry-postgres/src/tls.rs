//! TLS to PostgreSQL with libpq's `sslmode` semantics (rustls, ring).
//!
//! The database URL is the one home of these settings, as for libpq and
//! `psql`: `postgres://u@db.example:5432/belfry?sslmode=verify-full&sslrootcert=/etc/belfry/db-ca.pem`.
//! [`parse_url`] takes `sslmode` and `sslrootcert` out of the URL (the
//! driver knows neither `verify-*` nor `sslrootcert`) and hands the rest to
//! tokio-postgres; every connection of the store (both pools, the LISTEN
//! connection, the presence session) uses the [`MakeTls`] it returns.
//!
//! # Modes
//! - `disable`: plain TCP only.
//! - `prefer` (the default, as in libpq): TLS when the server offers it,
//!   else plain. The certificate is not checked unless `sslrootcert` is
//!   given (then as `verify-ca`); it protects against a passive listener
//!   only.
//! - `require`: TLS or no connection; certificate checked only with
//!   `sslrootcert` (then as `verify-ca`, as libpq does).
//! - `verify-ca`: TLS, and the server's certificate must chain to a CA of
//!   `sslrootcert`; its host name is not checked.
//! - `verify-full`: as `verify-ca`, and the certificate must be issued for
//!   the host name of the URL (DNS name or IP address). The only mode that
//!   stops an active man in the middle.
//!
//! `sslrootcert` is a PEM file of CA certificates, or `system` for the
//! operating system's trusted roots. The `verify-*` modes need it: libpq's
//! fallback (`~/.postgresql/root.crt`) is not read.
//!
//! Not supported: `allow`, client certificates (`sslcert`, `sslkey`), and
//! SCRAM channel binding (a SCRAM password login works over TLS, without
//! binding the login to the TLS session).

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Socket;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// libpq's `sslmode`, less `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, String> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "invalid database URL: sslmode must be disable, prefer, require, verify-ca \
                     or verify-full, not {other:?}"
                ));
            }
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RootCert {
    File(PathBuf),
    /// `sslrootcert=system`.
    System,
}

/// The TLS half of a database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TlsParams {
    mode: SslMode,
    root_cert: Option<RootCert>,
}

/// Reads a database URL: the driver's config and the TLS connector every
/// connection must use.
///
/// # Errors
/// A malformed URL, an unknown `sslmode`, a `verify-*` mode without
/// `sslrootcert`, or an `sslrootcert` that cannot be read or holds no
/// certificate. The message never repeats the URL (it may hold a password).
pub fn parse_url(url: &str) -> Result<(tokio_postgres::Config, MakeTls), String> {
    let (rest, params) = take_tls_params(url)?;
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| format!("invalid database URL: {e}"))?;
    config.ssl_mode(match params.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    let tls = MakeTls::new(&params)?;
    Ok((config, tls))
}

/// Splits `sslmode` and `sslrootcert` off a URL (`postgres://…?a=b&…`) or
/// a key/value string (`host=… sslmode=…`); the last of a repeated key
/// wins, as in libpq.
fn take_tls_params(url: &str) -> Result<(String, TlsParams), String> {
    let mut mode = None;
    let mut root_cert = None;
    let mut take = |key: &str, value: String| -> Result<bool, String> {
        match key {
            "sslmode" => mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => {
                root_cert = Some(if value == "system" {
                    RootCert::System
                } else {
                    RootCert::File(PathBuf::from(value))
                });
            }
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&') {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    let decode = |s: &str| {
                        percent_encoding::percent_decode_str(s)
                            .decode_utf8()
                            .map(|s| s.into_owned())
                            .map_err(|_| {
                                "invalid database URL: a parameter is not UTF-8".to_string()
                            })
                    };
                    if !take(&decode(key)?, decode(value)?)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // Key/value form: plain `key=value` tokens; a quoted value of
        // these two keys may not hold spaces.
        let mut kept = Vec::new();
        for token in url.split_whitespace() {
            let taken = match token.split_once('=') {
                Some((key, value)) => take(key, value.trim_matches('\'').to_string())?,
                None => false,
            };
            if !taken {
                kept.push(token);
            }
        }
        kept.join(" ")
    };
    let params = TlsParams {
        mode: mode.unwrap_or(SslMode::Prefer),
        root_cert,
    };
    if matches!(params.mode, SslMode::VerifyCa | SslMode::VerifyFull) && params.root_cert.is_none()
    {
        return Err(format!(
            "database URL: sslmode={} needs sslrootcert=FILE (PEM CA certificates) or \
             sslrootcert=system (the operating system's trusted roots)",
            params.mode.as_str()
        ));
    }
    Ok((rest, params))
}

/// Opens the TLS side of every connection to the database; cheap to clone.
#[derive(Clone)]
pub struct MakeTls {
    mode: SslMode,
    /// `None` for `disable`.
    config: Option<Arc<ClientConfig>>,
}

impl fmt::Debug for MakeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MakeTls")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl MakeTls {
    fn new(params: &TlsParams) -> Result<MakeTls, String> {
        if params.mode == SslMode::Disable {
            return Ok(MakeTls {
                mode: params.mode,
                config: None,
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = params.root_cert.as_ref().map(load_roots).transpose()?;
        let verifier: Arc<dyn ServerCertVerifier> = match (params.mode, roots) {
            (SslMode::VerifyFull, Some(roots)) => {
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| format!("database URL: sslrootcert: {e}"))?
            }
            // libpq checks the chain whenever a root certificate is given.
            (_, roots) => Arc::new(NoHostCheck {
                roots,
                algorithms: provider.signature_verification_algorithms,
            }),
        };
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // PostgreSQL 17's direct TLS negotiation requires it; older
        // servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(MakeTls {
            mode: params.mode,
            config: Some(Arc::new(config)),
        })
    }

    /// The `sslmode` in force.
    pub fn mode(&self) -> SslMode {
        self.mode
    }
}

fn load_roots(root_cert: &RootCert) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match root_cert {
        RootCert::File(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("cannot read sslrootcert {}: {e}", path.display()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "sslrootcert {} holds no usable PEM certificate",
                    path.display()
                ));
            }
        }
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "sslrootcert=system: no trusted root certificate found on this system"
                        .to_string(),
                );
            }
        }
    }
    Ok(roots)
}

/// Every mode but `verify-full`: any host name. With roots (`verify-ca`, or
/// `sslrootcert` given to `prefer`/`require`) the chain must lead to one of
/// them; without, encryption without authentication, as libpq does. The
/// handshake signature is checked either way (the server holds the key of
/// the certificate it shows).
#[derive(Debug)]
struct NoHostCheck {
    roots: Option<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoHostCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl MakeTlsConnect<Socket> for MakeTls {
    type Stream = TlsStream;
    type TlsConnect = TlsConnector;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<TlsConnector, io::Error> {
        // Called for Unix sockets too (empty domain), where TLS is never
        // used: a bad name fails only if a handshake is attempted.
        Ok(TlsConnector {
            mode: self.mode,
            config: self.config.clone(),
            name: ServerName::try_from(domain.to_string()).ok(),
        })
    }
}

/// One connection's handshake.
pub struct TlsConnector {
    mode: SslMode,
    config: Option<Arc<ClientConfig>>,
    name: Option<ServerName<'static>>,
}

impl TlsConnect<Socket> for TlsConnector {
    type Stream = TlsStream;
    type Error = io::Error;
    type Future = BoxFuture<'static, Result<TlsStream, io::Error>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS is disabled"))?;
            let name = self
                .name
                .ok_or_else(|| io::Error::other("the database host is not a valid TLS name"))?;
            tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map(TlsStream)
                .map_err(|error| explain(error, self.mode))
        })
    }
}

/// Names the mode beside a refused certificate: the fix is in the URL.
fn explain(error: io::Error, mode: SslMode) -> io::Error {
    let refused = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|inner| matches!(inner, rustls::Error::InvalidCertificate(_)));
    if refused {
        io::Error::new(
            error.kind(),
            format!(
                "the server's certificate is refused (sslmode={}, check sslrootcert and the \
                 host name): {error}",
                mode.as_str()
            ),
        )
    } else {
        error
    }
}

/// A TLS connection to the database.
pub struct TlsStream(tokio_rustls::client::TlsStream<Socket>);

impl AsyncRead for TlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tokio_postgres::tls::TlsStream for TlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// One connection to the database at `url`, with its TLS settings, driven
/// on a spawned task: for tools and tests that need a plain client.
///
/// # Errors
/// A malformed URL or TLS setting, or a failed connection.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (config, tls) = parse_url(url)?;
    let (client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| crate::error::describe(&e))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "database connection closed");
        }
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, TlsParams) {
        take_tls_params(url).unwrap()
    }

    #[test]
    fn tls_parameters_leave_the_url_and_the_rest_stays() {
        let (rest, params) = split(
            "postgres://u:p@h:5432/db?application_name=x&sslmode=verify-full&sslrootcert=%2Fca%20dir%2Fca.pem&connect_timeout=3",
        );
        assert_eq!(
            rest,
            "postgres://u:p@h:5432/db?application_name=x&connect_timeout=3"
        );
        assert_eq!(params.mode, SslMode::VerifyFull);
        assert_eq!(
            params.root_cert,
            Some(RootCert::File(PathBuf::from("/ca dir/ca.pem")))
        );
        let (rest, params) = split("postgresql://h/db?sslmode=require");
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!((params.mode, params.root_cert), (SslMode::Require, None));
        let (rest, params) = split("postgres://h1:1,h2:2/db");
        assert_eq!(rest, "postgres://h1:1,h2:2/db");
        assert_eq!(params.mode, SslMode::Prefer, "libpq's default");
        let (rest, params) = split("host=h dbname=d sslmode=verify-ca sslrootcert=system");
        assert_eq!(rest, "host=h dbname=d");
        assert_eq!(
            (params.mode, params.root_cert),
            (SslMode::VerifyCa, Some(RootCert::System))
        );
    }

    #[test]
    fn bad_tls_parameters_are_refused_without_repeating_the_url() {
        let error = take_tls_params("postgres://u:secret@h/db?sslmode=allow").unwrap_err();
        assert!(error.contains("not \"allow\""), "{error}");
        assert!(!error.contains("secret"), "{error}");
        let error = take_tls_params("postgres://u:secret@h/db?sslmode=verify-full").unwrap_err();
        assert!(error.contains("needs sslrootcert"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        let error = parse_url("postgres://h/db?sslmode=require&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err();
        assert!(
            error.starts_with("cannot read sslrootcert /nonexistent/ca.pem"),
            "{error}"
        );
    }

    #[test]
    fn the_driver_gets_the_matching_mode() {
        use tokio_postgres::config::SslMode as Driver;
        for (given, driver) in [
            ("disable", Driver::Disable),
            ("prefer", Driver::Prefer),
            ("require", Driver::Require),
        ] {
            let (config, tls) = parse_url(&format!("postgres://h/db?sslmode={given}")).unwrap();
            assert_eq!(config.get_ssl_mode(), driver);
            assert_eq!(tls.mode().as_str(), given);
        }
    }
}
