//! Engine configuration.

use std::time::Duration;

use belfry_core::RetryPolicy;
use serde::{Deserialize, Serialize};

/// The engine's knobs. Defaults follow BigBen where BigBen had one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineOptions {
    /// How far ahead each partition loads events into memory.
    #[serde(with = "belfry_core::time::serde_millis", rename = "window_ms")]
    pub window: Duration,
    /// Upper bound on events held in memory over all partitions (BigBen's
    /// "max events in memory").
    pub max_events_in_memory: usize,
    /// Deliveries in flight at once, over all tenants.
    pub max_in_flight: usize,
    /// Deliveries in flight at once for one tenant, so a slow tenant cannot
    /// take every slot.
    pub max_in_flight_per_tenant: usize,
    /// Events that came due while the node was down fire at start if they
    /// are at most this late; older ones end as `missed`.
    #[serde(with = "belfry_core::time::serde_millis", rename = "lookback_ms")]
    pub lookback: Duration,
    pub retry: RetryPolicy,
    /// How long finished events and their attempt history are kept.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "history_retention_ms"
    )]
    pub history_retention: Duration,
    /// How often the retention sweep runs.
    #[serde(with = "belfry_core::time::serde_millis", rename = "purge_interval_ms")]
    pub purge_interval: Duration,
    /// How long the recorder collects delivery outcomes before writing
    /// them as one batch. Longer means fewer fsyncs per delivery (they
    /// dominated the CPU at steady rates); it is also the extra window in
    /// which a crash causes a duplicate delivery. Delivery itself never
    /// waits for it.
    #[serde(with = "belfry_core::time::serde_millis", rename = "record_linger_ms")]
    pub record_linger: Duration,
    /// How long shutdown waits for in-flight deliveries.
    #[serde(with = "belfry_core::time::serde_millis", rename = "shutdown_grace_ms")]
    pub shutdown_grace: Duration,
    /// Recurring schedules create each occurrence this long before it is
    /// due, so it fires with the lateness of a one-off event.
    #[serde(with = "belfry_core::time::serde_millis", rename = "schedule_lead_ms")]
    pub schedule_lead: Duration,
    /// An occurrence a schedule reaches more than this late (e.g. after
    /// downtime) is *missed* and handled by its misfire policy; one less
    /// late is simply delivered late.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "schedule_misfire_threshold_ms"
    )]
    pub schedule_misfire_threshold: Duration,
    /// Most missed occurrences stored one by one per schedule firing; the
    /// rest are counted in the schedule's missed summary.
    pub schedule_max_missed_recorded: usize,
    /// How long before their instant the records of due entries are read
    /// (in one batch, off the delivery path; a round starts once an entry
    /// is due within half of it). A store stall shorter than that half
    /// delays no delivery: the embedded store blocks reads of a keyspace
    /// while a compaction installs its result, up to a second on a busy
    /// node. Zero reads each record when its entry fires, which a cluster
    /// needs: a cancel acknowledged by another node is then seen however
    /// late its wake-up arrives.
    #[serde(with = "belfry_core::time::serde_millis", rename = "read_ahead_ms")]
    pub read_ahead: Duration,
    /// How often each partition reconciles a page of its window with the
    /// store, arming what a lost wake-up left out. Zero disables it.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "repair_interval_ms"
    )]
    pub repair_interval: Duration,
    /// Items a bulk action handles per page: one store read, one batch
    /// of writes and one progress save each (`docs/api.md`).
    pub bulk_page_size: usize,
    /// How long a node's claim on a bulk action lasts unless renewed (every
    /// page renews it): after a node dies, another takes its actions over
    /// this long after its last page.
    #[serde(with = "belfry_core::time::serde_millis", rename = "bulk_lease_ms")]
    pub bulk_lease: Duration,
    /// A pause between two pages of one bulk action, to spread a large
    /// action's writes out. Zero: none.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "bulk_page_pause_ms"
    )]
    pub bulk_page_pause: Duration,
    /// Per-tenant quotas; the node sets them from its `[limits]` section
    /// (not an `engine.*` key). Default here: none.
    #[serde(skip)]
    pub quotas: crate::quotas::QuotaOptions,
    /// The pull queue's bounds; the node sets them from its `[pull]`
    /// section (not an `engine.*` key).
    #[serde(skip)]
    pub pull: crate::pull::PullOptions,
}

impl EngineOptions {
    /// The schedule planner's limits.
    pub fn plan_limits(&self) -> belfry_core::schedule::PlanLimits {
        belfry_core::schedule::PlanLimits {
            lead: self.schedule_lead,
            misfire_threshold: self.schedule_misfire_threshold,
            max_missed_recorded: self.schedule_max_missed_recorded,
            ..Default::default()
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            window: Duration::from_secs(60),
            max_events_in_memory: 1_000_000,
            max_in_flight: 1_024,
            max_in_flight_per_tenant: 256,
            lookback: Duration::from_secs(24 * 3600),
            retry: RetryPolicy::default(),
            history_retention: Duration::from_secs(7 * 24 * 3600),
            purge_interval: Duration::from_secs(60),
            record_linger: Duration::from_millis(10),
            shutdown_grace: Duration::from_secs(10),
            schedule_lead: Duration::from_secs(5),
            schedule_misfire_threshold: Duration::from_secs(60),
            schedule_max_missed_recorded: 100,
            read_ahead: Duration::from_secs(3),
            repair_interval: Duration::from_secs(5),
            bulk_page_size: 200,
            bulk_lease: Duration::from_secs(15),
            bulk_page_pause: Duration::ZERO,
            quotas: crate::quotas::QuotaOptions::unlimited(),
            pull: crate::pull::PullOptions::default(),
        }
    }
}
