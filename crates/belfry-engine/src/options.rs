//! Engine configuration: the `[engine]` section. Each field's doc comment
//! is the user reference.

use std::time::Duration;

use belfry_core::RetryPolicy;
use belfry_core::breaker::BreakerPolicy;
use belfry_core::config::{ConfigKeys, Problems};
use serde::{Deserialize, Serialize};

/// The engine's knobs. Defaults follow BigBen where BigBen had one.
#[derive(Debug, Clone, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct EngineOptions {
    /// How far ahead each partition holds events in memory.
    #[serde(with = "belfry_core::time::serde_millis", rename = "window_ms")]
    pub window: Duration,
    /// Cap on events held in memory over all partitions (BigBen's "max
    /// events in memory").
    pub max_events_in_memory: usize,
    /// Deliveries in flight at once, over all tenants.
    pub max_in_flight: usize,
    /// … for one tenant, reached by a slow start (16 at first, one more per
    /// answered attempt; a tenant idle for a minute starts over); besides,
    /// the last quarter of the slots goes only to tenants below their share
    /// of it, so hung tenants cannot take every slot. At most
    /// `engine.max_in_flight`; lowering `engine.max_in_flight` below it
    /// lowers the default along.
    pub max_in_flight_per_tenant: usize,
    /// Events that came due while the node was down fire at start if they
    /// are at most this late; older ones end `missed` (counted from the
    /// event's last change: one submitted past-due fires at once). `0`:
    /// nothing late fires.
    #[serde(with = "belfry_core::time::serde_millis", rename = "lookback_ms")]
    pub lookback: Duration,
    /// Retries of failed deliveries.
    #[config(section)]
    pub retry: RetryPolicy,
    /// The circuit breaker of each tenant's HTTP or Kafka endpoint, per
    /// node (`docs/api.md`, circuit breaker).
    #[config(section)]
    pub circuit_breaker: BreakerPolicy,
    /// How long finished events and their attempt history are kept; `0`:
    /// purged at the next sweep.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "history_retention_ms"
    )]
    pub history_retention: Duration,
    /// How often the retention sweep runs.
    #[serde(with = "belfry_core::time::serde_millis", rename = "purge_interval_ms")]
    pub purge_interval: Duration,
    /// How long delivery outcomes are collected before they are written as
    /// one batch. Longer means fewer fsyncs per delivery; it is also the
    /// extra window in which a crash causes a duplicate delivery. Delivery
    /// itself never waits for it. `0`: each outcome is written at once.
    #[serde(with = "belfry_core::time::serde_millis", rename = "record_linger_ms")]
    pub record_linger: Duration,
    /// How long shutdown waits for in-flight deliveries; `0`: it does not
    /// wait (they are retried after the restart).
    #[serde(with = "belfry_core::time::serde_millis", rename = "shutdown_grace_ms")]
    pub shutdown_grace: Duration,
    /// Recurring schedules create each occurrence this long before it is
    /// due, so it fires with the lateness of a one-off event. It and
    /// `schedule_misfire_threshold_ms` must not both be `0`.
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
    /// Single node: records of entries due this soon are read in one batch
    /// ahead of their instant, each at least half this long before it (a
    /// store stall shorter than that, such as a compaction installing its
    /// result, delays no delivery). Cluster nodes read at fire time, so a
    /// cancel acknowledged by another node is seen however late its
    /// wake-up arrives. `0`: read each record when it fires.
    #[serde(with = "belfry_core::time::serde_millis", rename = "read_ahead_ms")]
    pub read_ahead: Duration,
    /// How often each partition reconciles a page (128 entries) of its
    /// window with the store, arming what a lost wake-up left out. `0`:
    /// never.
    #[serde(
        with = "belfry_core::time::serde_millis",
        rename = "repair_interval_ms"
    )]
    pub repair_interval: Duration,
    /// Items a bulk action handles per page: one store read, one batch of
    /// writes and one progress save each (`docs/api.md`).
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
    /// Per-tenant limits: not an `engine.*` key, the node passes its
    /// `[limits]` section. Default here: none.
    #[serde(skip)]
    pub limits: crate::quotas::LimitsOptions,
    /// The pull queue's bounds: not an `engine.*` key, the node passes its
    /// `[pull]` section.
    #[serde(skip)]
    pub pull: belfry_core::pull::PullConfig,
}

impl EngineOptions {
    /// Refuses zero windows, intervals and limits where zero means nothing,
    /// and contradictory values, naming their keys. `limits` and `pull`
    /// are their own sections.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("window_ms", self.window);
        problems.at_least_one("max_events_in_memory", self.max_events_in_memory);
        problems.at_least_one("max_in_flight", self.max_in_flight);
        problems.at_least_one("max_in_flight_per_tenant", self.max_in_flight_per_tenant);
        problems.at_least_one("purge_interval_ms", self.purge_interval);
        problems.section("retry", |problems| self.retry.validate(problems));
        problems.section("circuit_breaker", |problems| {
            self.circuit_breaker.validate(problems);
        });
        if self.max_in_flight_per_tenant > self.max_in_flight {
            problems.push(format!(
                "{} ({}) must not exceed {} ({})",
                problems.key("max_in_flight_per_tenant"),
                self.max_in_flight_per_tenant,
                problems.key("max_in_flight"),
                self.max_in_flight
            ));
        }
        if self.schedule_lead.is_zero() && self.schedule_misfire_threshold.is_zero() {
            problems.push(format!(
                "{} and {} must not both be 0 (every occurrence would be reached late, and \
                 so missed)",
                problems.key("schedule_lead_ms"),
                problems.key("schedule_misfire_threshold_ms")
            ));
        }
    }

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
            circuit_breaker: BreakerPolicy::default(),
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
            limits: crate::quotas::LimitsOptions::unlimited(),
            pull: belfry_core::pull::PullConfig::default(),
        }
    }
}
