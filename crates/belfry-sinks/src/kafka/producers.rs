//! The node's producers: one per distinct (bootstrap servers, settings),
//! shared by every tenant that uses that set, at most
//! `sinks.kafka.max_producers` at once (least recently used closed first).
//!
//! Each producer's queue is bounded (`queue.buffering.max.messages`,
//! `queue.buffering.max.kbytes`), so memory stays bounded however many
//! events come due: a delivery that finds the queue full is retried.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_core::{Clock, MonoTime};
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer as _};

use super::settings::Server;
use crate::egress::{EgressPolicy, EgressRefusal};

/// librdkafka's log and error callbacks, into `tracing`.
#[derive(Debug, Default)]
pub(crate) struct Context;

/// The tracing target of librdkafka's lines.
const LOG_TARGET: &str = "belfry::kafka";

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => {
                tracing::warn!(target: LOG_TARGET, facility, "{message}");
            }
            _ => tracing::debug!(target: LOG_TARGET, facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Brokers going away are expected (deliveries retry); one line each.
        tracing::info!(target: LOG_TARGET, %error, "kafka client: {reason}");
    }
}

/// The complete settings of one producer: the key that tenants share it by.
pub(crate) type Settings = BTreeMap<String, String>;

/// One open producer.
pub(crate) struct Producer {
    pub(crate) inner: FutureProducer<Context>,
    /// The settings it was built with (for eviction).
    settings: Arc<Settings>,
    /// When the brokers the cluster advertises were last found allowed by
    /// the egress policy; `None`: not yet.
    brokers_checked: Mutex<Option<MonoTime>>,
    clock: Arc<dyn Clock>,
    /// Fenced mode: held for the whole of one transaction (a producer has
    /// one open at a time); true once `init_transactions` succeeded.
    pub(crate) transactions: tokio::sync::Mutex<bool>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("servers", &self.settings.get("bootstrap.servers"))
            .finish_non_exhaustive()
    }
}

/// How often the advertised brokers are checked against the egress policy
/// again.
const BROKER_CHECK_INTERVAL: Duration = Duration::from_secs(300);

impl Producer {
    /// Checks the brokers the cluster advertises (which librdkafka connects
    /// to after the bootstrap servers) against `egress`, at most every
    /// [`BROKER_CHECK_INTERVAL`].
    ///
    /// # Errors
    /// `Ok(Err(refusal))`: a broker is forbidden. `Err(reason)`: the
    /// metadata could not be read (the brokers are unreachable: retry).
    pub(crate) async fn check_brokers(
        self: &Arc<Self>,
        topic: &str,
        timeout: Duration,
        egress: &EgressPolicy,
    ) -> Result<Result<(), EgressRefusal>, String> {
        {
            let checked = self
                .brokers_checked
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if checked.is_some_and(|at| self.clock.monotonic().since(at) < BROKER_CHECK_INTERVAL) {
                return Ok(Ok(()));
            }
        }
        let producer = Arc::clone(self);
        let topic = topic.to_string();
        // Blocking: librdkafka waits for the answer on this thread.
        let brokers = tokio::task::spawn_blocking(move || {
            producer
                .inner
                .client()
                .fetch_metadata(Some(&topic), timeout)
                .map(|metadata| {
                    metadata
                        .brokers()
                        .iter()
                        .map(|b| Server {
                            host: b.host().to_string(),
                            port: u16::try_from(b.port()).unwrap_or(0),
                        })
                        .collect::<Vec<_>>()
                })
        })
        .await
        .map_err(|e| format!("kafka: metadata task failed: {e}"))?
        .map_err(|e| format!("kafka: cannot read the cluster's metadata: {e}"))?;
        if let Err(refusal) = check_servers(egress, &brokers).await? {
            return Ok(Err(refusal));
        }
        *self
            .brokers_checked
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(self.clock.monotonic());
        Ok(Ok(()))
    }
}

/// Resolves `servers` and checks every address against `egress`.
///
/// # Errors
/// `Ok(Err(refusal))`: an address is forbidden. `Err(reason)`: a name
/// does not resolve.
pub(crate) async fn check_servers(
    egress: &EgressPolicy,
    servers: &[Server],
) -> Result<Result<(), EgressRefusal>, String> {
    for server in servers {
        if let Ok(ip) = server.host.parse::<std::net::IpAddr>() {
            if let Err(refusal) = egress.check(ip) {
                return Ok(Err(refusal));
            }
            continue;
        }
        let addresses = tokio::net::lookup_host((server.host.as_str(), server.port))
            .await
            .map_err(|e| format!("kafka: cannot resolve {}: {e}", server.host))?;
        for address in addresses {
            if let Err(refusal) = egress.check(address.ip()) {
                return Ok(Err(refusal));
            }
        }
    }
    Ok(Ok(()))
}

/// The shared producers.
#[derive(Debug)]
pub(crate) struct Producers {
    max: usize,
    open: Mutex<Open>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Open {
    tick: u64,
    /// settings → (producer, last use).
    by_settings: HashMap<Arc<Settings>, (Arc<Producer>, u64)>,
}

impl Producers {
    pub(crate) fn new(max: usize, clock: Arc<dyn Clock>) -> Self {
        Producers {
            max: max.max(1),
            open: Mutex::default(),
            clock,
        }
    }

    /// How many producers are open.
    pub(crate) fn len(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_settings
            .len()
    }

    /// The open producer for `settings`, if any.
    pub(crate) fn get(&self, settings: &Arc<Settings>) -> Option<Arc<Producer>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.tick += 1;
        let tick = open.tick;
        let (producer, used) = open.by_settings.get_mut(settings)?;
        *used = tick;
        Some(Arc::clone(producer))
    }

    /// Opens a producer for `settings` (or returns the one another
    /// delivery opened meanwhile), closing the least recently used one
    /// when the cap is reached.
    ///
    /// # Errors
    /// librdkafka refused the settings.
    pub(crate) fn open(&self, settings: Arc<Settings>) -> Result<Arc<Producer>, KafkaError> {
        let mut config = ClientConfig::new();
        for (name, value) in settings.iter() {
            config.set(name, value);
        }
        // librdkafka starts its threads here; it does not wait for brokers.
        let inner: FutureProducer<Context> = config.create_with_context(Context)?;
        let producer = Arc::new(Producer {
            inner,
            settings: Arc::clone(&settings),
            brokers_checked: Mutex::new(None),
            clock: Arc::clone(&self.clock),
            transactions: tokio::sync::Mutex::new(false),
        });
        let evicted = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            open.tick += 1;
            let tick = open.tick;
            if let Some((existing, used)) = open.by_settings.get_mut(&settings) {
                *used = tick;
                let existing = Arc::clone(existing);
                drop(open);
                close(producer);
                return Ok(existing);
            }
            let evicted = if open.by_settings.len() >= self.max {
                open.by_settings
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(key, _)| Arc::clone(key))
                    .and_then(|key| open.by_settings.remove(&key))
                    .map(|(producer, _)| producer)
            } else {
                None
            };
            open.by_settings
                .insert(settings, (Arc::clone(&producer), tick));
            evicted
        };
        tracing::info!(
            target: LOG_TARGET,
            servers = producer.settings.get("bootstrap.servers").map_or("", String::as_str),
            "kafka producer opened"
        );
        if let Some(evicted) = evicted {
            tracing::debug!(target: LOG_TARGET, producer = ?evicted, "closing the least recently used producer");
            close(evicted);
        }
        Ok(producer)
    }

    /// Forgets `producer` (it hit a fatal error): the next delivery opens
    /// a new one.
    pub(crate) fn discard(&self, producer: &Arc<Producer>) {
        let removed = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.by_settings.get(&producer.settings) {
                Some((current, _)) if Arc::ptr_eq(current, producer) => {
                    open.by_settings.remove(&producer.settings)
                }
                _ => None,
            }
        };
        if let Some((removed, _)) = removed {
            close(removed);
        }
    }
}

/// Drops a producer off the async threads: the last reference waits for
/// its queued records (up to their timeout) and its threads to stop.
/// Deliveries still waiting hold their own reference, so this never cuts
/// one short.
fn close(producer: Arc<Producer>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn_blocking(move || drop(producer));
    } else {
        drop(producer);
    }
}
