//! TLS on a real `belfry serve` process: curl verifying against a test CA
//! made at test time, a certificate replaced on disk and served without a
//! restart, and client certificates required.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::{CertificateDer, ServerName};

/// Generous: a debug build on a loaded 2-core machine.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// Reload interval given to the node, and how long a reload may take.
const RELOAD_INTERVAL_MS: u64 = 200;
const RELOAD_DEADLINE: Duration = Duration::from_secs(15);

/// A test CA that signs server and client certificates.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        TestCa { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// `(certificate PEM, key PEM, certificate DER)` for `localhost` and
    /// 127.0.0.1, or a client certificate.
    fn issue(&self, common_name: &str, serial: u64, client: bool) -> (String, String, Vec<u8>) {
        let names = if client {
            Vec::new()
        } else {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        };
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }
}

/// A `belfry serve` child, killed on drop.
struct Node {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start(dir: &Path, env: &[(&str, String)]) -> Node {
        Node::start_with(dir, &[], env)
    }

    /// With `args` after `serve --listen … --data-dir …`.
    fn start_with(dir: &Path, args: &[&str], env: &[(&str, String)]) -> Node {
        let port = belfry_testkit::free_port();
        let log = dir.join("belfry.log");
        let child = Command::new(env!("CARGO_BIN_EXE_belfry"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(dir.join("data"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("spawn belfry");
        Node { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    /// The node's log (stdout) and anything it wrote to stderr.
    fn logs(&self) -> String {
        let stderr = self.log.with_file_name("stderr.log");
        std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(stderr).unwrap_or_default()
    }

    /// Waits until curl with `args` gets `/ping` answered.
    fn wait_ready(&mut self, args: &[&str]) {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("belfry exited with {status}:\n{}", self.logs());
            }
            if curl(args, &self.url("/ping")).0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready in time:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs curl; `(success, stdout + stderr)`.
fn curl(args: &[&str], url: &str) -> (bool, String) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl is installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_string_lossy().into_owned()
}

/// Replaces `name` in `dir` at once (write aside, rename over).
fn replace(dir: &Path, name: &str, content: &str) {
    let aside = dir.join(format!("{name}.new"));
    std::fs::write(&aside, content).unwrap();
    std::fs::rename(aside, dir.join(name)).unwrap();
}

/// The leaf certificate the node presents, verified against `ca_pem`.
async fn served_certificate(port: u16, ca_pem: &str) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        let cert: CertificateDer<'static> = cert.unwrap();
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("handshake verifies against the test CA");
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

async fn wait_for_certificate(node: &Node, ca_pem: &str, expected: &[u8], what: &str) {
    let deadline = Instant::now() + RELOAD_DEADLINE;
    while served_certificate(node.port, ca_pem).await != expected {
        assert!(
            Instant::now() < deadline,
            "{what} not served in time:\n{}",
            node.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_verifies_against_the_test_ca_and_a_replaced_certificate_is_served_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("Belfry test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (cert, key, first_der) = ca.issue("belfry-1", 1, false);
    let cert_file = write(dir.path(), "cert.pem", &cert);
    let key_file = write(dir.path(), "key.pem", &key);
    let mut node = Node::start(
        dir.path(),
        &[
            ("BELFRY_TLS__CERT_FILE", cert_file),
            ("BELFRY_TLS__KEY_FILE", key_file),
            (
                "BELFRY_TLS__RELOAD_INTERVAL_MS",
                RELOAD_INTERVAL_MS.to_string(),
            ),
        ],
    );
    node.wait_ready(&["--cacert", &ca_file]);

    let (ok, answer) = curl(&["--cacert", &ca_file], &node.url("/ping"));
    assert!(ok, "{answer}");
    assert!(answer.contains("\"OK\""), "{answer}");
    // Without the CA curl refuses the certificate; plain HTTP gets nothing.
    assert!(!curl(&[], &node.url("/ping")).0);
    let plain = format!("http://127.0.0.1:{}/ping", node.port);
    assert!(!curl(&[], &plain).0);
    assert_eq!(served_certificate(node.port, &ca.pem()).await, first_der);

    // A new certificate (other serial and name) replaces the files.
    let (cert, key, second_der) = ca.issue("belfry-2", 2, false);
    replace(dir.path(), "key.pem", &key);
    replace(dir.path(), "cert.pem", &cert);
    wait_for_certificate(&node, &ca.pem(), &second_der, "the new certificate").await;
    let (ok, answer) = curl(&["--cacert", &ca_file], &node.url("/ping"));
    assert!(ok, "{answer}");

    // A broken replacement keeps the current certificate in service.
    let failures = || node.logs().matches("TLS certificate reload failed").count();
    let before = failures();
    replace(dir.path(), "cert.pem", "not a certificate");
    let deadline = Instant::now() + RELOAD_DEADLINE;
    while failures() == before {
        assert!(
            Instant::now() < deadline,
            "no error logged:\n{}",
            node.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served_certificate(node.port, &ca.pem()).await, second_der);
    assert!(curl(&["--cacert", &ca_file], &node.url("/ping")).0);
    assert_eq!(node.child.try_wait().unwrap(), None, "still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_or_optional() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("Belfry test CA");
    let clients = TestCa::new("Belfry test client CA");
    let stranger = TestCa::new("Someone else's CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (cert, key, _) = ca.issue("belfry", 1, false);
    let cert_file = write(dir.path(), "cert.pem", &cert);
    let key_file = write(dir.path(), "key.pem", &key);
    let client_ca_file = write(dir.path(), "client-ca.pem", &clients.pem());
    let (client_cert, client_key, _) = clients.issue("worker-1", 7, true);
    let client_cert = write(dir.path(), "client.pem", &client_cert);
    let client_key = write(dir.path(), "client-key.pem", &client_key);
    let (bad_cert, bad_key, _) = stranger.issue("intruder", 8, true);
    let bad_cert = write(dir.path(), "bad.pem", &bad_cert);
    let bad_key = write(dir.path(), "bad-key.pem", &bad_key);
    let with_cert = [
        "--cacert",
        ca_file.as_str(),
        "--cert",
        client_cert.as_str(),
        "--key",
        client_key.as_str(),
    ];
    let with_bad_cert = [
        "--cacert",
        ca_file.as_str(),
        "--cert",
        bad_cert.as_str(),
        "--key",
        bad_key.as_str(),
    ];
    let without_cert = ["--cacert", ca_file.as_str()];

    for mode in ["required", "optional"] {
        let node_dir = dir.path().join(mode);
        std::fs::create_dir_all(&node_dir).unwrap();
        let mut node = Node::start(
            &node_dir,
            &[
                ("BELFRY_TLS__CERT_FILE", cert_file.clone()),
                ("BELFRY_TLS__KEY_FILE", key_file.clone()),
                ("BELFRY_TLS__CLIENT_CA_FILE", client_ca_file.clone()),
                ("BELFRY_TLS__CLIENT_AUTH", mode.to_string()),
            ],
        );
        node.wait_ready(&with_cert);
        let (ok, answer) = curl(&with_cert, &node.url("/ping"));
        assert!(ok, "{mode}: {answer}");
        let (ok, answer) = curl(&with_bad_cert, &node.url("/ping"));
        assert!(
            !ok,
            "{mode}: a certificate from another CA is refused: {answer}"
        );
        let (ok, answer) = curl(&without_cert, &node.url("/ping"));
        assert_eq!(
            ok,
            mode == "optional",
            "{mode} without a certificate: {answer}"
        );
    }
}

/// `belfry serve --tls-cert --tls-key --tls-client-ca`: the flags alone
/// turn HTTPS and client certificates on, and win over the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_flags_set_the_certificate_key_and_client_ca() {
    let help = Command::new(env!("CARGO_BIN_EXE_belfry"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--tls-cert <FILE>",
        "--tls-key <FILE>",
        "--tls-client-ca <FILE>",
    ] {
        assert!(
            help.contains(flag),
            "`belfry serve --help` lists {flag}:\n{help}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("Belfry test CA");
    let clients = TestCa::new("Belfry test client CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (cert, key, _) = ca.issue("belfry", 1, false);
    let cert_file = write(dir.path(), "cert.pem", &cert);
    let key_file = write(dir.path(), "key.pem", &key);
    let client_ca_file = write(dir.path(), "client-ca.pem", &clients.pem());
    let (client_cert, client_key, _) = clients.issue("worker-1", 7, true);
    let client_cert = write(dir.path(), "client.pem", &client_cert);
    let client_key = write(dir.path(), "client-key.pem", &client_key);
    let broken = write(dir.path(), "broken.pem", "not a certificate");
    let with_cert = [
        "--cacert",
        ca_file.as_str(),
        "--cert",
        client_cert.as_str(),
        "--key",
        client_key.as_str(),
    ];

    let mut node = Node::start_with(
        dir.path(),
        &[
            "--tls-cert",
            &cert_file,
            "--tls-key",
            &key_file,
            "--tls-client-ca",
            &client_ca_file,
        ],
        // A broken certificate in the environment: the flag wins.
        &[("BELFRY_TLS__CERT_FILE", broken)],
    );
    node.wait_ready(&with_cert);
    let (ok, answer) = curl(&with_cert, &node.url("/ping"));
    assert!(ok, "{answer}");
    assert!(answer.contains("\"OK\""), "{answer}");
    let (ok, answer) = curl(&["--cacert", &ca_file], &node.url("/ping"));
    assert!(!ok, "a client without a certificate is refused: {answer}");
    let plain = format!("http://127.0.0.1:{}/ping", node.port);
    assert!(!curl(&[], &plain).0, "no plain HTTP");
}

#[test]
fn a_bad_certificate_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let cert_file = write(dir.path(), "cert.pem", "not a certificate");
    let key_file = write(dir.path(), "key.pem", "not a key");
    let output = Command::new(env!("CARGO_BIN_EXE_belfry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("BELFRY_TLS__CERT_FILE", &cert_file)
        .env("BELFRY_TLS__KEY_FILE", &key_file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        logs.contains("cannot load tls.cert_file and tls.key_file"),
        "{logs}"
    );
    assert!(
        !logs.contains("not a key"),
        "the key's content is not logged: {logs}"
    );
}
