//! `belfry serve`: one complete node.
//!
//! Start order: logs → listener (bound; TLS certificate loaded) → store (open, recover) → sinks → engine (partitions
//! load their windows; what came due while down fires at once) → Kafka
//! ingestion (`[kafka.ingest]`) → HTTP.
//! Shutdown on SIGINT/SIGTERM runs it backwards: stop accepting requests,
//! finish in-flight ones; stop Kafka ingestion (store the batch in hand,
//! commit its offsets, leave the group); in cluster mode hand every partition over (stop
//! firing it, record the outcomes of its deliveries in flight, release its
//! lease in the database and leave, so the next owners fire at once); stop
//! the engine (let remaining deliveries finish and record them), close the
//! store (flush), exit 0.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use belfry_api::{ApiState, ClusterView, SingleNode};
use belfry_clock::SystemClock;
use belfry_core::{Clock, PartitionCount};
use belfry_engine::Engine;
use belfry_sinks::Sinks;
use belfry_store::{EmbeddedOptions, EmbeddedStore, SharedStore, StoreError};
use tracing_subscriber::EnvFilter;

use crate::config::Config;

pub fn run(config: Config) -> ExitCode {
    init_logs(&config.log_format);
    // Two runtimes: the engine (timers, dispatch, deliveries, recording) on
    // one, the API's connections on the other. On one runtime a request
    // that parses and validates a 1,000-event batch holds a worker thread
    // for milliseconds, and a timer or delivery task queued behind it on
    // that worker waits: lateness. As separate threads, the kernel's
    // scheduler preempts the busy API thread when a fire-path thread wakes.
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name(name)
            .build()
    };
    let runtimes = runtime("belfry-engine").and_then(|engine| Ok((engine, runtime("belfry-api")?)));
    let (engine_runtime, api_runtime) = match runtimes {
        Ok(runtimes) => runtimes,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let outcome = engine_runtime.block_on(serve(config, api_runtime.handle().clone()));
    // Connections still open after the graceful drain are cut here.
    api_runtime.shutdown_background();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logs(format: &str) {
    // The storage engine logs its internal housekeeping at info; by default
    // keep only its warnings so Belfry's own events stay readable.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,fjall=warn,lsm_tree=warn"));
    // Logs go to stdout (the fmt layer's default writer).
    let ansi = use_ansi(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Colour codes only for a person at a terminal: in a file, a pipe or a
/// log collector they are noise (`ESC[2m…`). `NO_COLOR` set to anything but
/// the empty string turns them off everywhere (<https://no-color.org>).
fn use_ansi(writes_to_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    writes_to_terminal && no_color.is_none_or(|value| value.is_empty())
}

async fn serve(config: Config, api_runtime: tokio::runtime::Handle) -> anyhow::Result<()> {
    // First: everything after this records into it.
    let metrics =
        belfry_metrics::install().map_err(|e| anyhow::anyhow!("cannot install metrics: {e}"))?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let upkeep = {
        let (metrics, clock) = (metrics.clone(), clock.clone());
        tokio::spawn(async move {
            loop {
                metrics.run_upkeep();
                clock.sleep(belfry_metrics::UPKEEP_INTERVAL).await;
            }
        })
    };
    let _stop_upkeep = AbortOnDrop(upkeep);
    let partitions = PartitionCount::new(config.partitions)
        .ok_or_else(|| anyhow::anyhow!("partitions must be at least 1"))?;
    let sinks = Sinks::build_with_clock(
        config.http.clone(),
        config.egress.clone(),
        config.sinks.kafka.clone(),
        clock.clone(),
    )
    .map_err(|e| anyhow::anyhow!("cannot build the webhook client: {e}"))?;
    let egress = Arc::clone(sinks.egress());
    // Bind before joining a cluster, so the advertised address works as soon
    // as other nodes can see this one.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    // Before anything else starts: a bad certificate refuses the start.
    let tls = match &config.tls.cert_file {
        Some(_) => Some(crate::tls::Tls::start(&config.tls, clock.clone())?),
        None => None,
    };
    let address = config
        .advertise
        .clone()
        .unwrap_or(listener.local_addr()?.to_string());

    let (stop_cluster, cluster_stopped) = tokio::sync::oneshot::channel::<()>();
    let (engine, cluster_view, membership_task) = match &config.database_url {
        None => {
            let store = EmbeddedStore::open(EmbeddedOptions {
                clock: clock.clone(),
                ..EmbeddedOptions::new(config.data_dir.clone(), partitions)
            })
            .map_err(|e| match e {
                // Already says which directory and who holds it.
                StoreError::Unavailable(in_use) => anyhow::anyhow!(in_use),
                e => anyhow::anyhow!(
                    "cannot open the store in {}: {e}",
                    config.data_dir.display()
                ),
            })?;
            let store: SharedStore = Arc::new(store);
            let engine = Engine::start(config.engine.clone(), store, sinks, clock.clone());
            let view: Arc<dyn ClusterView> = Arc::new(SingleNode {
                address: address.clone(),
            });
            tracing::info!(data_dir = %config.data_dir.display(), "single node on the embedded store");
            (engine, view, None)
        }
        Some(url) => {
            let (engine, view, task) = crate::cluster::start(
                &config,
                url,
                partitions,
                sinks,
                &address,
                clock.clone(),
                async {
                    let _ = cluster_stopped.await;
                },
            )
            .await?;
            (engine, view, Some(task))
        }
    };

    // API keys: the bootstrap key is stored, then the start-up rule applies
    // (no key and a non-loopback listener: refuse to serve).
    let store = engine.handle().store().clone();
    let checked = async {
        belfry_api::auth::seed_bootstrap_key(&config.auth, &store, engine.handle().now()).await?;
        belfry_api::auth::check_startup(&config.auth, &store, config.listen).await
    }
    .await;
    if let Err(refusal) = checked {
        let _ = stop_cluster.send(());
        if let Some(task) = membership_task {
            let _ = task.await;
        }
        engine.shutdown().await;
        return Err(anyhow::anyhow!(refusal));
    }
    let _stop_egress_watch = watch_open_egress(&config, &store, egress, clock.clone()).await;
    let auth = Arc::new(belfry_api::Auth::new(
        config.auth.clone(),
        store,
        config.listen,
        clock.clone(),
    ));
    if let Err(error) = auth.load_known_keys().await {
        // Not fatal: each key is then read at its first use.
        tracing::warn!(%error, "could not read the API keys ahead of their first use");
    }
    let state = ApiState {
        engine: engine.handle(),
        options: config.api.clone(),
        cluster: cluster_view,
        auth,
        metrics: Some(metrics),
    };
    #[cfg(feature = "kafka")]
    let ingest = match &config.kafka.ingest {
        Some(options) => {
            // Kafka ingestion parses and validates batches as the API does,
            // so its task runs on the API's runtime, off the engine's.
            let _on_api_runtime = api_runtime.enter();
            Some(
                belfry_kafka_ingest::Ingest::start(
                    options.clone(),
                    engine.handle(),
                    config.api.lapse_offset_ms,
                )
                .map_err(|e| anyhow::anyhow!("kafka.ingest: {e}"))?,
            )
        }
        None => None,
    };
    let app = belfry_api::router(state);
    // The listener moves to the API runtime's reactor, so its connections
    // and every request's work run on that runtime's threads.
    let listener = listener.into_std()?;
    let server = config.server.clone();
    let serving = api_runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        match tls {
            Some(tls) => {
                tracing::info!(%address, "belfry is serving HTTPS");
                crate::listener::serve(listener, app, &server, tls, clock, shutdown_signal()).await
            }
            None => {
                tracing::info!(%address, "belfry is serving");
                let plain = crate::listener::Plain;
                crate::listener::serve(listener, app, &server, plain, clock, shutdown_signal())
                    .await
            }
        }
    });
    serving
        .await
        .map_err(|e| anyhow::anyhow!("the API server task failed: {e}"))??;
    tracing::info!("stopped accepting requests");
    #[cfg(feature = "kafka")]
    if let Some(ingest) = ingest {
        // The batch in hand is stored and its offsets committed before the
        // engine stops.
        ingest.shutdown().await;
    }
    if let Some(task) = membership_task {
        // The membership loop stops renewing, hands its partitions over
        // (engine release, then lease release) and leaves; only then does
        // the engine stop.
        tracing::info!("handing partitions over");
        let _ = stop_cluster.send(());
        let _ = task.await;
    }
    tracing::info!("stopping the engine");
    engine.shutdown().await;
    tracing::info!("belfry stopped");
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    tracing::info!("shutdown requested");
}

/// Aborts a background task when the serving function returns.
/// Under `egress.policy = "auto"`, a node that starts open (`auth.mode =
/// "keys"`, a loopback listener, no key stored) lets webhooks reach
/// loopback, as its operator is its only user; the first key (made here,
/// by the CLI or by another node) ends that for good, seen within a
/// second, as the API itself closes. `None` when there is nothing to
/// watch.
async fn watch_open_egress(
    config: &Config,
    store: &SharedStore,
    egress: Arc<belfry_sinks::egress::EgressPolicy>,
    clock: Arc<dyn Clock>,
) -> Option<AbortOnDrop> {
    let watched = config.egress.policy == belfry_sinks::egress::EgressMode::Auto
        && config.auth.mode == belfry_api::AuthMode::Keys
        && belfry_api::auth::is_loopback(config.listen);
    if !watched
        || !store
            .list_api_keys()
            .await
            .is_ok_and(|keys| keys.is_empty())
    {
        return None;
    }
    egress.set_open(true);
    tracing::info!(
        "egress.policy = \"auto\": webhooks may reach loopback while the node has no API keys"
    );
    let store = Arc::clone(store);
    Some(AbortOnDrop(tokio::spawn(async move {
        loop {
            clock.sleep(std::time::Duration::from_secs(1)).await;
            if store
                .list_api_keys()
                .await
                .is_ok_and(|keys| !keys.is_empty())
            {
                egress.set_open(false);
                tracing::info!(
                    "API keys exist: webhooks may no longer reach loopback (egress.policy = \"auto\")"
                );
                return;
            }
        }
    })))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::use_ansi;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_ansi(true, None));
        assert!(
            use_ansi(true, Some("".into())),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_ansi(true, Some("1".into())));
        assert!(!use_ansi(false, None), "a file or a pipe gets no colour");
        assert!(!use_ansi(false, Some("1".into())));
    }
}
