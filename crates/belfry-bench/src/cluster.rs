//! The `cluster` scenario: N real `belfry serve --database-url` processes
//! on one fresh PostgreSQL database.
//!
//! 1. The database: a throwaway server (`PgServer::launch`, fsync=off), or
//!    a fresh database on `--database-url`'s server, dropped at the end.
//! 2. The nodes start one after the other; the run waits until every node
//!    shows N members with one Master (`/events/cluster`) and every
//!    partition owned (`/v1/cluster`).
//! 3. The tenant is registered through the first node; request `n` of the
//!    ingest goes to node `n mod N`.
//! 4. The events come due; with `--kill-leader-after-ms T` the Master (with
//!    `--kill-follower-after-ms T` another node) is killed with SIGKILL `T`
//!    ms after the first due instant, and a watcher times how long the
//!    survivors take to show a Master other than the killed node and own
//!    every partition.
//!
//! CPU is sampled per phase (scheduling, delivery) for the nodes, for
//! PostgreSQL (its backends of this database and its WAL writer,
//! checkpointer and background writer, every 500 ms so backends of a killed
//! node are not lost) and for the whole machine, since they all share it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use belfry_core::{EventId, EventKey, PartitionCount, TenantName};
use belfry_testkit::{BelfryLaunch, BelfryProcess, Receiver};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::cli::ClusterArgs;
use crate::database::{Database, PostgresCpu, minus};
use crate::deliveries::analyze_workload;
use crate::failover::{self, Kill};
use crate::load;
use crate::node::Node;
use crate::report::{ClusterNodeReport, ClusterReport, Report};
use crate::scenarios::{
    FAR_FUTURE_MS, Load, await_deliveries, ingest_warnings, load_params, merge, own_cpu_since,
    own_sample,
};
use crate::stats::{CpuSplit, MachineSample, ProcessSample, load_average};
use crate::workload::{Workload, ms_from_now, now_ms};

/// How long the cluster may take to settle (start, or after a kill).
const SETTLE_DEADLINE: Duration = Duration::from_secs(90);

/// How often cluster views are polled.
const POLL: Duration = Duration::from_millis(100);

/// How to start a cluster's nodes (the `cluster` scenario's arguments,
/// or `pull --nodes`).
pub(crate) struct Launch<'a> {
    pub(crate) belfry_bin: Option<&'a std::path::PathBuf>,
    pub(crate) nodes: u16,
    pub(crate) node_args: &'a [String],
    pub(crate) node_env: &'a [(String, String)],
}

/// The nodes under test.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<BelfryProcess>,
    /// Each node's (unused) data dir; deleted at the end.
    _dirs: Vec<TempDir>,
}

/// One `/events/cluster` + `/v1/cluster` reading.
pub(crate) struct View {
    members: usize,
    master: Option<String>,
    /// Advertised address → partitions it owns.
    partitions: HashMap<String, Vec<u16>>,
}

impl View {
    fn owned(&self) -> usize {
        self.partitions.values().map(Vec::len).sum()
    }
}

/// `GET url` as JSON; `None` on any failure (the node may be down).
pub(crate) async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    client.get(url).send().await.ok()?.json().await.ok()
}

async fn read_view(client: &reqwest::Client, base_url: &str) -> Option<View> {
    let members = get_json(client, &format!("{base_url}/events/cluster")).await?;
    let members = members.as_object()?;
    let master = members
        .iter()
        .filter(|(_, role)| *role == "Master")
        .map(|(address, _)| address.clone())
        .collect::<Vec<_>>();
    let detail = get_json(client, &format!("{base_url}/v1/cluster")).await?;
    let partitions = detail["nodes"]
        .as_array()?
        .iter()
        .filter_map(|node| {
            let address = node["address"].as_str()?.to_string();
            let owned = node["partitions"]
                .as_array()?
                .iter()
                .filter_map(|p| p["partition"].as_u64().and_then(|p| u16::try_from(p).ok()))
                .collect();
            Some((address, owned))
        })
        .collect();
    Some(View {
        members: members.len(),
        master: (master.len() == 1).then(|| master[0].clone()),
        partitions,
    })
}

/// `127.0.0.1:PORT` of `http://127.0.0.1:PORT`.
fn address_of(base_url: &str) -> &str {
    base_url.trim_start_matches("http://")
}

impl Cluster {
    pub(crate) async fn start(args: &Launch<'_>, database_url: &str) -> anyhow::Result<Cluster> {
        let binary = match args.belfry_bin {
            Some(path) => path.clone(),
            None => crate::node::default_binary()?,
        };
        if !binary.is_file() {
            bail!(
                "no belfry binary at {} (build it with `cargo build --release -p belfry`, or pass --belfry-bin)",
                binary.display()
            );
        }
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for _ in 0..args.nodes {
            let dir = tempfile::Builder::new()
                .prefix("belfry-bench-node-")
                .tempdir()
                .context("create a node dir")?;
            let mut launch = BelfryLaunch::new(&binary, dir.path().join("unused"))
                .arg("--database-url")
                .arg(database_url);
            for arg in args.node_args {
                launch = launch.arg(arg);
            }
            for (key, value) in args.node_env {
                launch = launch.env(key, value);
            }
            let node = BelfryProcess::start(launch)
                .await
                .with_context(|| format!("start {}", binary.display()))?;
            nodes.push(node);
            dirs.push(dir);
        }
        Ok(Cluster { nodes, _dirs: dirs })
    }

    fn alive(&self) -> impl Iterator<Item = &BelfryProcess> {
        self.nodes.iter().filter(|n| n.pid().is_some())
    }

    /// Polls until every live node shows `size` members, one Master, and
    /// every partition owned; returns the first node's view then.
    pub(crate) async fn wait_settled(
        &self,
        client: &reqwest::Client,
        size: usize,
        partitions: usize,
    ) -> anyhow::Result<View> {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        'poll: loop {
            if Instant::now() > deadline {
                let logs = self
                    .nodes
                    .first()
                    .map(|n| n.logs_tail(20))
                    .unwrap_or_default();
                bail!(
                    "the cluster did not settle at {size} nodes and {partitions} owned partitions within {SETTLE_DEADLINE:?}\n{logs}"
                );
            }
            tokio::time::sleep(POLL).await;
            let mut first = None;
            for node in self.alive() {
                let Some(view) = read_view(client, &node.base_url()).await else {
                    continue 'poll;
                };
                if view.members != size || view.master.is_none() || view.owned() != partitions {
                    continue 'poll;
                }
                first.get_or_insert(view);
            }
            if let Some(view) = first {
                return Ok(view);
            }
        }
    }
}

/// CPU of each node (by index) at one moment; a dead node keeps its last
/// sample.
pub(crate) fn sample_nodes(
    cluster: &Cluster,
    previous: &[Option<ProcessSample>],
) -> Vec<Option<ProcessSample>> {
    cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            node.pid()
                .and_then(ProcessSample::read)
                .or_else(|| previous.get(i).copied().flatten())
        })
        .collect()
}

pub(crate) fn sum_between(
    before: &[Option<ProcessSample>],
    after: &[Option<ProcessSample>],
) -> CpuSplit {
    before
        .iter()
        .zip(after)
        .filter_map(|(b, a)| Some(a.as_ref()?.cpu_since(b.as_ref()?)))
        .fold(CpuSplit::default(), |sum, split| sum + split)
}

/// Default time from scheduling to the first due instant: room to ingest
/// at 10k events/s (near events notify their owner), plus 5 s.
fn default_lead_ms(count: usize) -> u64 {
    5_000 + count as u64 / 10
}

/// What the failover watcher saw after the kill.
#[derive(Default, Clone, Copy)]
struct Takeover {
    new_master_after_ms: Option<f64>,
    partitions_owned_after_ms: Option<f64>,
}

/// Polls the survivors until one shows a new Master and every partition
/// owned by a survivor.
async fn watch_takeover(
    client: reqwest::Client,
    survivors: Vec<String>,
    killed: String,
    killed_at: Instant,
    partitions: usize,
) -> Takeover {
    let mut takeover = Takeover::default();
    let deadline = killed_at + SETTLE_DEADLINE;
    while Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        for base_url in &survivors {
            let Some(view) = read_view(&client, base_url).await else {
                continue;
            };
            let elapsed = killed_at.elapsed().as_secs_f64() * 1000.0;
            if takeover.new_master_after_ms.is_none()
                && view.master.as_ref().is_some_and(|m| *m != killed)
            {
                takeover.new_master_after_ms = Some(elapsed);
            }
            let settled = view.members == survivors.len()
                && !view.partitions.contains_key(&killed)
                && view.owned() == partitions;
            if settled && takeover.new_master_after_ms.is_some() {
                takeover.partitions_owned_after_ms = Some(elapsed);
                return takeover;
            }
        }
    }
    takeover
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<Report> {
    let load = Load::from(&args.load);
    let nodes = usize::from(args.nodes);
    let load_before = load_average();
    let database = Database::create(args.database_url.as_deref()).await?;
    let started = Instant::now();
    let launch = Launch {
        belfry_bin: args.belfry_bin.as_ref(),
        nodes: args.nodes,
        node_args: &args.node_args,
        node_env: &args.node_env,
    };
    let mut cluster = Cluster::start(&launch, &database.url).await?;
    let client = load::client(load.concurrency)?;
    let view = cluster
        .wait_settled(&client, nodes, usize::from(args.partitions))
        .await?;
    let settle_ms = started.elapsed().as_secs_f64() * 1000.0;
    let partition_count =
        PartitionCount::new(args.partitions).context("--partitions must be at least 1")?;

    let receiver = Receiver::start_lean().await;
    let tenant = args
        .tenant
        .clone()
        .unwrap_or_else(|| format!("bench-{}", now_ms()));
    let first_node = Node::Running {
        base_url: cluster.nodes[0].base_url(),
        pid: None,
    };
    first_node
        .register_tenant(&client, &tenant, &receiver.url("/hook"))
        .await
        .with_context(|| cluster.nodes[0].logs_tail(20))?;

    let lead_ms = args.lead_ms.unwrap_or_else(|| default_lead_ms(args.count));
    let first_due = if args.ingest_only {
        now_ms() + FAR_FUTURE_MS
    } else {
        ms_from_now(lead_ms)
    };
    let workload = Workload::uniform(
        &tenant,
        args.count,
        first_due,
        args.spread_ms,
        load.payload_bytes,
    );
    let bodies = load::Bodies::prebuilt(workload.request_bodies(load.batch));
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.url("/events/schedule"))
        .collect();

    let pg_cpu = PostgresCpu::start(&database.url).await;
    let mut warnings = Vec::new();
    if pg_cpu.is_none() {
        warnings.push("PostgreSQL's CPU could not be sampled".to_string());
    }
    let nodes_t0 = sample_nodes(&cluster, &[]);
    let pg_t0 = match &pg_cpu {
        Some(pg) => Some(pg.total().await),
        None => None,
    };
    let machine_t0 = MachineSample::read();
    let bench_before = own_sample();

    let ingest = load::run(
        &client,
        &urls,
        bodies,
        load.batch,
        load.concurrency,
        "cluster",
    )
    .await;
    warnings.extend(ingest_warnings(&ingest));

    let nodes_t1 = sample_nodes(&cluster, &nodes_t0);
    let pg_t1 = match &pg_cpu {
        Some(pg) => Some(pg.total().await),
        None => None,
    };
    let machine_t1 = MachineSample::read();

    let mut delivery = None;
    let mut failover = None;
    let mut killed_index = None;
    let mut nodes_t2 = nodes_t1.clone();
    if !args.ingest_only {
        if ingest.finished_at_ms > first_due {
            warnings.push(format!(
                "ingest finished {} ms after the first due instant: lateness includes ingest (raise --lead-ms)",
                ingest.finished_at_ms - first_due
            ));
        }
        let mut kill = None;
        let mut watcher = None;
        let kill_after = match (args.kill_leader_after_ms, args.kill_follower_after_ms) {
            (Some(after_ms), _) => Some((after_ms, true)),
            (None, Some(after_ms)) => Some((after_ms, false)),
            (None, None) => None,
        };
        if let Some((after_ms, leader)) = kill_after {
            let kill_at = first_due + i64::try_from(after_ms).unwrap_or(i64::MAX);
            let wait = kill_at - now_ms();
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
            } else {
                warnings.push(format!(
                    "the kill came {} ms later than asked (ingest still running)",
                    -wait
                ));
            }
            let view = read_view(&client, &cluster.nodes[0].base_url())
                .await
                .context("read the cluster view before the kill")?;
            let master = view
                .master
                .clone()
                .context("no single Master before the kill")?;
            let index = cluster
                .nodes
                .iter()
                .position(|n| (address_of(&n.base_url()) == master) == leader)
                .context("no node to kill among the started nodes")?;
            let victim = address_of(&cluster.nodes[index].base_url()).to_string();
            let owned: Vec<u16> = view.partitions.get(&victim).cloned().unwrap_or_default();
            // The killed node's CPU up to its death.
            nodes_t2 = sample_nodes(&cluster, &nodes_t1);
            cluster.nodes[index].kill_9();
            let killed_at = Instant::now();
            let killed_at_ms = now_ms();
            killed_index = Some(index);
            let survivors = cluster.alive().map(BelfryProcess::base_url).collect();
            watcher = Some(tokio::spawn(watch_takeover(
                client.clone(),
                survivors,
                victim.clone(),
                killed_at,
                usize::from(args.partitions),
            )));
            let tenant_name = TenantName::new(tenant.clone()).context("tenant name")?;
            let moved = (0..workload.len())
                .map(|n| {
                    let id = EventId::new(format!("e{n}")).map_err(|e| anyhow::anyhow!("{e}"))?;
                    let partition =
                        partition_count.partition_of(&EventKey::new(tenant_name.clone(), id));
                    Ok(owned.contains(&partition.0))
                })
                .collect::<anyhow::Result<Vec<bool>>>()?;
            kill = Some(Kill {
                address: victim,
                leader,
                at_ms: killed_at_ms,
                moved,
                partitions_moved: owned.len(),
                new_master_after_ms: None,
                partitions_owned_after_ms: None,
            });
        }
        let label = "cluster delivery";
        let records = await_deliveries(&receiver, &workload, args.grace_ms, label).await;
        delivery = Some(analyze_workload(&records, &workload));
        if let (Some(mut kill), Some(watcher)) = (kill, watcher) {
            let takeover = watcher.await.unwrap_or_default();
            kill.new_master_after_ms = takeover.new_master_after_ms;
            kill.partitions_owned_after_ms = takeover.partitions_owned_after_ms;
            failover = Some(failover::analyze(&records, &workload, kill));
        }
        nodes_t2 = sample_nodes(&cluster, &nodes_t2);
    }
    let pg_t2 = match &pg_cpu {
        Some(pg) => Some(pg.total().await),
        None => None,
    };
    let machine_t2 = MachineSample::read();
    let bench_cpu = own_cpu_since(bench_before);
    let load_after = load_average();

    let node_cpu_ingest = sum_between(&nodes_t0, &nodes_t1);
    let node_cpu_delivery = sum_between(&nodes_t1, &nodes_t2);
    let delivered = delivery.as_ref().map_or(0, |d| d.delivered);
    let per_node = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let address = address_of(&node.base_url()).to_string();
            ClusterNodeReport {
                partitions_at_start: view.partitions.get(&address).map_or(0, Vec::len),
                address,
                peak_rss_bytes: nodes_t2[i].map(|s| s.peak_rss_bytes),
                cpu: sum_between(&nodes_t0[i..=i], &nodes_t2[i..=i]),
                killed: killed_index == Some(i),
            }
        })
        .collect();
    let busy = |a: Option<MachineSample>, b: Option<MachineSample>| {
        a.zip(b).map(|(a, b)| b.busy_percent_since(&a))
    };
    let report = ClusterReport {
        nodes,
        database: database.describe().to_string(),
        settle_ms,
        load_average_before: load_before,
        load_average_after: load_after,
        node_cpu_ingest,
        node_cpu_delivery,
        node_cpu_per_event_ingest_us: node_cpu_ingest.total_s() * 1e6
            / ingest.acknowledged_events.max(1) as f64,
        node_cpu_per_event_delivery_us: (!args.ingest_only)
            .then(|| node_cpu_delivery.total_s() * 1e6 / delivered.max(1) as f64),
        postgres_cpu_ingest: pg_t0.zip(pg_t1).map(|(a, b)| minus(b, a)),
        postgres_cpu_delivery: (!args.ingest_only)
            .then(|| pg_t1.zip(pg_t2).map(|(a, b)| minus(b, a)))
            .flatten(),
        machine_busy_ingest_percent: busy(machine_t0, machine_t1),
        machine_busy_delivery_percent: (!args.ingest_only)
            .then(|| busy(machine_t1, machine_t2))
            .flatten(),
        per_node,
        failover,
    };
    drop(pg_cpu);
    drop(cluster);
    database.drop_external().await;

    Ok(Report {
        scenario: "cluster",
        params: merge(
            load_params(load),
            json!({
                "nodes": nodes,
                "count": args.count,
                "spread_ms": args.spread_ms,
                "lead_ms": (!args.ingest_only).then_some(lead_ms),
                "grace_ms": args.grace_ms,
                "ingest_only": args.ingest_only,
                "kill_leader_after_ms": args.kill_leader_after_ms,
                "kill_follower_after_ms": args.kill_follower_after_ms,
                "database": database.describe(),
            }),
        ),
        warnings,
        ingest: Some(ingest),
        delivery,
        cluster: Some(report),
        bench_cpu,
        ..Report::default()
    })
}
