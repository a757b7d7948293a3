//! A Kafka-protocol broker for tests: [`KafkaBroker`].
//!
//! By default it runs `belfry-kafka-mock` (librdkafka's mock cluster in its
//! own process, built by `cargo build -p belfry-kafka-mock`), so `belfry`
//! processes and independent clients connect to it over TCP. When
//! `BELFRY_TEST_KAFKA_BOOTSTRAP` names a real broker's bootstrap servers,
//! tests use that broker instead; fault injection is then unavailable and
//! [`KafkaBroker::supports_faults`] says so.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// Names a real broker to test against instead of the mock.
pub const EXTERNAL_BOOTSTRAP_VAR: &str = "BELFRY_TEST_KAFKA_BOOTSTRAP";
/// Overrides where the mock broker's binary is.
pub const MOCK_BINARY_VAR: &str = "BELFRY_KAFKA_MOCK_BIN";

/// A running broker; the mock process stops when this is dropped.
#[derive(Debug)]
pub struct KafkaBroker {
    bootstrap: String,
    mock: Option<Mutex<MockProcess>>,
}

#[derive(Debug)]
struct MockProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl KafkaBroker {
    /// Starts a one-broker mock cluster (or uses the external broker).
    ///
    /// # Panics
    /// When the mock binary is missing or does not start: tests cannot run.
    pub fn start() -> Self {
        Self::start_with(1, &[])
    }

    /// Starts a mock cluster of `brokers` brokers with `topics` (name,
    /// partitions) created; on an external broker the topics must exist or
    /// be auto-created.
    ///
    /// # Panics
    /// When the mock binary is missing or does not start.
    pub fn start_with(brokers: u32, topics: &[(&str, u32)]) -> Self {
        if let Ok(bootstrap) = std::env::var(EXTERNAL_BOOTSTRAP_VAR)
            && !bootstrap.trim().is_empty()
        {
            return KafkaBroker {
                bootstrap,
                mock: None,
            };
        }
        let binary = mock_binary();
        let mut command = Command::new(&binary);
        command.arg("--brokers").arg(brokers.to_string());
        for (name, partitions) in topics {
            command.arg("--topic").arg(format!("{name}:{partitions}"));
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the test broker {}: {e}; build it with `cargo build -p belfry-kafka-mock`",
                    binary.display()
                )
            });
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut first = String::new();
        stdout
            .read_line(&mut first)
            .expect("read the test broker's first line");
        let bootstrap = first
            .trim()
            .strip_prefix("bootstrap.servers=")
            .unwrap_or_else(|| panic!("test broker did not start: {first:?}"))
            .to_string();
        KafkaBroker {
            bootstrap,
            mock: Some(Mutex::new(MockProcess {
                child,
                stdin,
                stdout,
            })),
        }
    }

    /// `host:port,...` for `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Whether [`KafkaBroker::command`] works (the mock, not a real broker).
    pub fn supports_faults(&self) -> bool {
        self.mock.is_some()
    }

    /// Takes broker `id` (from 1) down: connections close, new ones fail.
    ///
    /// # Errors
    /// What the mock answered, or that this is an external broker.
    pub fn broker_down(&self, id: u32) -> Result<(), String> {
        self.command(&format!("broker-down {id}"))
    }

    /// Brings broker `id` back up.
    ///
    /// # Errors
    /// As [`KafkaBroker::broker_down`].
    pub fn broker_up(&self, id: u32) -> Result<(), String> {
        self.command(&format!("broker-up {id}"))
    }

    /// Creates a topic on the mock.
    ///
    /// # Errors
    /// As [`KafkaBroker::broker_down`].
    pub fn create_topic(&self, name: &str, partitions: u32) -> Result<(), String> {
        self.command(&format!("create-topic {name} {partitions}"))
    }

    /// Sends one control command (see `belfry-kafka-mock --help`).
    ///
    /// # Errors
    /// The mock's `error: ...` answer, or that there is no mock.
    pub fn command(&self, line: &str) -> Result<(), String> {
        let Some(mock) = &self.mock else {
            return Err("fault injection needs the mock broker, not an external one".into());
        };
        let mut mock = mock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        writeln!(mock.stdin, "{line}")
            .and_then(|()| mock.stdin.flush())
            .map_err(|e| format!("test broker: {e}"))?;
        let mut answer = String::new();
        mock.stdout
            .read_line(&mut answer)
            .map_err(|e| format!("test broker: {e}"))?;
        match answer.trim() {
            "ok" => Ok(()),
            other => Err(other.to_string()),
        }
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        if let Some(mock) = self.mock.take() {
            let mut mock = mock
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = mock.child.kill();
            let _ = mock.child.wait();
        }
    }
}

/// `$BELFRY_KAFKA_MOCK_BIN`, else `belfry-kafka-mock` in the target folder
/// this test runs from (`target/<profile>/deps/<test>` → `target/<profile>/`).
fn mock_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(MOCK_BINARY_VAR) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .skip(1)
        .map(|dir| dir.join("belfry-kafka-mock"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from("belfry-kafka-mock"))
}
