//! Per-tenant quotas on what clients store: pending events, schedules, and
//! the size of one event's payload (`[limits]` in the node config).
//!
//! # Contract
//! - A request that would take a tenant past a quota is refused whole,
//!   before anything is stored ([`QuotaExceeded`]); the API answers `429
//!   quota_exceeded` (counts) or `413 payload_too_large` (size).
//! - Client writes are checked ([`Quotas::check`] before
//!   [`EngineHandle::apply`], [`crate::schedules::Schedules::put`] for a new
//!   schedule and its payload). A redrive makes a finished event pending
//!   again: it counts like a create.
//! - A schedule's occurrences count against the pending quota when they
//!   are created: those that would pass it are stored `missed`, with the
//!   reason, instead of pending ([`Quotas::refuse_occurrences`]).
//! - A tenant's schedules share a budget of occurrences per minute
//!   ([`belfry_core::schedule::budget`]): a schedule that would take them
//!   past it is refused when created or changed
//!   ([`Quotas::check_schedule_rate`]), and occurrences past it at
//!   fire time are not created.
//! - Dry runs deliver at most `limits.max_dry_runs_per_second` per tenant
//!   and node, and take a token of the tenant's delivery rate when it has
//!   one ([`Quotas::take_dry_run`]).
//! - Updating an event that is already pending does not count against the
//!   pending quota; creating one, or creating one again after it finished,
//!   does.
//!
//! # Precision: an estimate, not a count
//! Counting a tenant's pending events on every write would read an index
//! range per request; a counter row per tenant would serialise every write
//! of a tenant on one row (and one more write per command on the hot
//! path). Instead each node keeps an estimate per tenant:
//! - counted from the store ([`belfry_store::Store::count_events`], index
//!   entries only, stopping at the quota) at the tenant's first write on
//!   this node;
//! - plus the events this node's acknowledged writes created, minus those
//!   they cancelled;
//! - deliveries that finished and other nodes' writes are not seen until
//!   the next count: the estimate is counted again when it is older than
//!   `limits.count_refresh_ms` and above half the quota, and before any
//!   refusal when it is older than [`RECOUNT_BEFORE_REFUSING`].
//!
//! One count per tenant (and kind) runs at a time on a node: requests that
//! need one while it runs wait for it and share its result, so a burst of
//! requests near a quota costs one count, not one each. A count stops at
//! the quota, so its cost is bounded by the quota.
//!
//! So a refusal rests on a count at most about a second old plus this
//! node's own writes since (never on deliveries long finished); a tenant can
//! pass its quota by what other nodes accepted for it since their last
//! count, and by concurrent requests that were all checked before any was
//! acknowledged. Schedules are estimated the same way (counted by listing
//! them, which is cheap for the numbers schedules come in).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_core::config::{ConfigKeys, Problems};
use belfry_core::event::{EventCommand, EventStatus};
use belfry_core::quota::{self, Estimate, TokenBucket};
use belfry_core::schedule::budget::{self, OccurrenceBudget};
use belfry_core::schedule::{Plan, Schedule};
use belfry_core::{TenantName, Timestamp};
use belfry_store::{Applied, CountEventsParams, KeyedCommand, StoreError};
use serde::{Deserialize, Serialize};

use crate::EngineHandle;

/// An estimate older than this is counted again before it refuses a
/// request.
pub const RECOUNT_BEFORE_REFUSING: Duration = quota::RECOUNT_BEFORE_REFUSING;

/// The node's `[limits]` section: per-tenant quotas on what clients store
/// and ask for, and single tenants' own limits (`tenants`), delivery rates
/// included. Zero: no limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsOptions {
    /// Pending (scheduled or retrying) events per tenant; a request that
    /// would pass it is refused whole with `429 quota_exceeded` (an
    /// estimate per node, see `docs/security.md`). `0`: no limit.
    pub max_pending_events_per_tenant: u64,
    /// Schedules per tenant; creating one more is `429 quota_exceeded`.
    /// `0`: no limit.
    pub max_schedules_per_tenant: u64,
    /// Largest payload of one event, in bytes; a request holding a larger
    /// one is refused whole with `413 payload_too_large`. `0`: no limit
    /// (`api.max_body_bytes` still bounds the request).
    pub max_payload_bytes: usize,
    /// How old a tenant's pending-event estimate may grow, once above half
    /// its quota, before it is counted again from the store.
    #[serde(with = "belfry_core::time::serde_millis", rename = "count_refresh_ms")]
    pub count_refresh: Duration,
    /// Dry runs (BigBen's `/events/dryrun`, a delivery now) per tenant and
    /// second on one node, in bursts of up to as many; more are `429
    /// rate_limited`. `0`: no limit.
    pub max_dry_runs_per_second: u32,
    /// Occurrences one tenant's schedules may create per minute, each
    /// schedule counted at its busiest minute (`@every 1s`: 60): creating
    /// or changing a schedule past it is `429 quota_exceeded`; at fire time
    /// occurrences past it (a token bucket per tenant and node) are not
    /// created, only counted in the schedule's `missed.over_budget`. `0`:
    /// no limit.
    pub max_schedule_occurrences_per_minute: u64,
    /// Bulk actions of one tenant running at once (in a cluster: over all
    /// nodes); creating one more is `429 too_many_bulk_actions`. `0`: no
    /// limit.
    pub max_bulk_actions_per_tenant: usize,
    /// Single tenants' own limits, by tenant name
    /// (`[limits.tenants."acme/billing"]`).
    #[config(section)]
    pub tenants: BTreeMap<String, TenantLimits>,
}

/// One tenant's own limits (`[limits.tenants."NAME"]`): its delivery rate
/// and concurrency, and quotas that replace the node-wide ones for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct TenantLimits {
    /// Deliveries the tenant starts per second, at most (bursts of one
    /// second's worth after a pause); the rest wait in its queue, none is
    /// dropped. A dry run takes a token too (none left: `429
    /// rate_limited`).
    pub max_deliveries_per_second: Option<u32>,
    /// Deliveries of the tenant in flight at once, at most
    /// `engine.max_in_flight`.
    #[config(default = "`engine.max_in_flight_per_tenant`")]
    pub max_concurrent_deliveries: Option<usize>,
    /// The tenant's pending-event quota (`0`: none).
    #[config(default = "`limits.max_pending_events_per_tenant`")]
    pub max_pending_events: Option<u64>,
    /// The tenant's schedule quota (`0`: none).
    #[config(default = "`limits.max_schedules_per_tenant`")]
    pub max_schedules: Option<u64>,
    /// The tenant's schedule occurrence budget (`0`: none).
    #[config(default = "`limits.max_schedule_occurrences_per_minute`")]
    pub max_schedule_occurrences_per_minute: Option<u64>,
}

impl LimitsOptions {
    /// `tenant`'s pending-event quota (0: none).
    pub fn pending_limit(&self, tenant: &TenantName) -> u64 {
        self.tenants
            .get(tenant.as_str())
            .and_then(|limits| limits.max_pending_events)
            .unwrap_or(self.max_pending_events_per_tenant)
    }

    /// `tenant`'s schedule quota (0: none).
    pub fn schedules_limit(&self, tenant: &TenantName) -> u64 {
        self.tenants
            .get(tenant.as_str())
            .and_then(|limits| limits.max_schedules)
            .unwrap_or(self.max_schedules_per_tenant)
    }

    /// `tenant`'s schedule occurrences per minute (0: none).
    pub fn occurrence_budget(&self, tenant: &TenantName) -> u64 {
        self.tenants
            .get(tenant.as_str())
            .and_then(|limits| limits.max_schedule_occurrences_per_minute)
            .unwrap_or(self.max_schedule_occurrences_per_minute)
    }

    /// Whether any tenant may have a pending-event quota.
    fn counts_pending(&self) -> bool {
        self.max_pending_events_per_tenant > 0
            || self
                .tenants
                .values()
                .any(|limits| limits.max_pending_events.is_some_and(|limit| limit > 0))
    }

    /// Refuses a zero refresh, invalid tenant names and zero delivery
    /// limits, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("count_refresh_ms", self.count_refresh);
        for (name, limits) in &self.tenants {
            if TenantName::new(name.clone()).is_err() {
                let tenants = problems.key("tenants");
                problems.push(format!("{tenants}: {name:?} is not a valid tenant name"));
            }
            problems.section(&format!("tenants.{name:?}"), |problems| {
                if limits.max_deliveries_per_second == Some(0) {
                    problems.at_least_one("max_deliveries_per_second", 0_u32);
                }
                if limits.max_concurrent_deliveries == Some(0) {
                    problems.at_least_one("max_concurrent_deliveries", 0_usize);
                }
            });
        }
    }
}

impl Default for LimitsOptions {
    fn default() -> Self {
        LimitsOptions {
            max_pending_events_per_tenant: 10_000_000,
            max_schedules_per_tenant: 10_000,
            max_payload_bytes: 256 * 1024,
            count_refresh: Duration::from_secs(10),
            max_dry_runs_per_second: 5,
            max_schedule_occurrences_per_minute: 10_000,
            max_bulk_actions_per_tenant: 2,
            tenants: BTreeMap::new(),
        }
    }
}

impl LimitsOptions {
    /// No quota at all (what an engine built in code gets by default).
    pub fn unlimited() -> Self {
        LimitsOptions {
            max_pending_events_per_tenant: 0,
            max_schedules_per_tenant: 0,
            max_payload_bytes: 0,
            max_dry_runs_per_second: 0,
            max_schedule_occurrences_per_minute: 0,
            max_bulk_actions_per_tenant: 0,
            ..LimitsOptions::default()
        }
    }
}

/// A request refused by a quota; the messages are safe for clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaExceeded {
    #[error(
        "tenant {tenant} would have more than {limit} pending events, its quota; \
         nothing was stored"
    )]
    PendingEvents { tenant: TenantName, limit: u64 },
    #[error("tenant {tenant} has {limit} schedules, its quota; the schedule was not created")]
    Schedules { tenant: TenantName, limit: u64 },
    #[error(
        "tenant {tenant}'s schedules would create up to {rate} occurrences a minute, more than \
         its budget of {limit} (limits.max_schedule_occurrences_per_minute); the schedule was \
         not stored"
    )]
    ScheduleOccurrences {
        tenant: TenantName,
        rate: u64,
        limit: u64,
    },
    #[error(
        "a payload of {size} bytes is larger than the {limit} bytes allowed; nothing was stored"
    )]
    PayloadTooLarge { size: usize, limit: usize },
    #[error(
        "tenant {tenant} may dry-run at most {limit} deliveries per second \
         (limits.max_dry_runs_per_second); retry later"
    )]
    DryRuns { tenant: TenantName, limit: u32 },
    #[error(
        "tenant {tenant} may start at most {limit} deliveries per second, dry runs included \
         (limits.tenants.\"{tenant}\".max_deliveries_per_second); retry later"
    )]
    DeliveryRate { tenant: TenantName, limit: u32 },
    #[error(
        "tenant {tenant} has {limit} bulk actions running, its limit \
         (limits.max_bulk_actions_per_tenant); wait for one to finish or cancel one"
    )]
    BulkActions { tenant: TenantName, limit: usize },
}

/// Why [`Quotas::check`] refused.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error(transparent)]
    Exceeded(#[from] QuotaExceeded),
    /// Counting failed; nothing was checked.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The estimates of one node.
#[derive(Debug)]
pub(crate) struct QuotaState {
    options: LimitsOptions,
    pending: Mutex<HashMap<TenantName, Estimate>>,
    schedules: Mutex<HashMap<TenantName, Estimate>>,
    /// Occurrences per minute the tenant's live schedules reach together
    /// (counted with the schedules).
    schedule_rates: Mutex<HashMap<TenantName, Estimate>>,
    /// Schedule occurrence tokens per tenant.
    occurrence_budgets: Mutex<HashMap<TenantName, OccurrenceBudget>>,
    /// The count in flight per tenant and kind (single flight).
    counting: Mutex<HashMap<(CountKind, TenantName), Arc<Gate>>>,
    /// Dry-run tokens per tenant.
    dry_runs: Mutex<HashMap<TenantName, TokenBucket>>,
    /// Held while a bulk action is checked and created, so two creates on
    /// this node cannot both pass the per-tenant limit.
    pub(crate) bulk_creates: tokio::sync::Mutex<()>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum CountKind {
    Pending,
    Schedules,
}

impl CountKind {
    fn name(self) -> &'static str {
        match self {
            CountKind::Pending => "pending_events",
            CountKind::Schedules => "schedules",
        }
    }
}

/// One tenant's count in flight: whoever holds `turn` counts; `done`
/// tells those who waited that a count finished meanwhile.
#[derive(Debug, Default)]
struct Gate {
    turn: tokio::sync::Mutex<()>,
    done: AtomicU64,
}

/// Dry-run buckets (and occurrence budgets) kept at most; full ones are
/// dropped past it.
const MAX_DRY_RUN_BUCKETS: usize = 10_000;

impl QuotaState {
    pub(crate) fn new(options: LimitsOptions) -> Self {
        QuotaState {
            options,
            pending: Mutex::default(),
            schedules: Mutex::default(),
            schedule_rates: Mutex::default(),
            occurrence_budgets: Mutex::default(),
            counting: Mutex::default(),
            dry_runs: Mutex::default(),
            bulk_creates: tokio::sync::Mutex::new(()),
        }
    }

    /// Adds what acknowledged client writes created and cancelled to the
    /// pending estimates of tenants that have one.
    pub(crate) fn applied(&self, applied: &[Applied]) {
        if !self.options.counts_pending() {
            return;
        }
        let mut estimates = lock(&self.pending);
        for item in applied {
            if item.key.id.is_internal() {
                continue;
            }
            let Some(change) = quota::pending_change(&item.outcome) else {
                continue;
            };
            if let Some(estimate) = estimates.get_mut(&item.key.tenant) {
                estimate.add(change);
            }
        }
    }

    /// A schedule this node created.
    pub(crate) fn schedule_created(&self, tenant: &TenantName) {
        if let Some(estimate) = lock(&self.schedules).get_mut(tenant) {
            estimate.add(1);
        }
    }

    /// A schedule this node deleted.
    pub(crate) fn schedule_deleted(&self, tenant: &TenantName) {
        if let Some(estimate) = lock(&self.schedules).get_mut(tenant) {
            estimate.add(-1);
        }
    }

    /// A schedule this node stored (or deleted) changed the occurrences
    /// per minute of `tenant`'s schedules from `old` to `new`.
    pub(crate) fn schedule_rate_changed(&self, tenant: &TenantName, old: u64, new: u64) {
        if let Some(estimate) = lock(&self.schedule_rates).get_mut(tenant) {
            estimate.add(quota::rate_change(old, new));
        }
    }

    /// Fits a firing's plan into its tenant's occurrence budget on this
    /// node ([`budget::spend`]); returns how many occurrences it removed.
    pub(crate) fn spend_occurrences(
        &self,
        tenant: &TenantName,
        plan: &mut Plan,
        now: Timestamp,
    ) -> u64 {
        let per_minute = self.options.occurrence_budget(tenant);
        if per_minute == 0 {
            return 0;
        }
        let mut budgets = lock(&self.occurrence_budgets);
        if budgets.len() >= MAX_DRY_RUN_BUCKETS && !budgets.contains_key(tenant) {
            // A full budget is the same as none.
            budgets.retain(|_, budget| !budget.is_full(now));
        }
        let budget = budgets
            .entry(tenant.clone())
            .or_insert_with(|| OccurrenceBudget::new(per_minute, now));
        budget::spend(plan, budget, now)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps hold plain numbers: a panic elsewhere leaves them usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The quota checks of an engine ([`EngineHandle::quotas`]).
#[derive(Debug, Clone, Copy)]
pub struct Quotas<'a> {
    pub(crate) engine: &'a EngineHandle,
}

impl Quotas<'_> {
    fn now(&self) -> Timestamp {
        self.engine.now()
    }

    /// Checks client commands against the quotas before
    /// [`EngineHandle::apply`]: payload sizes, then each tenant's pending
    /// events (see the module docs for the precision).
    ///
    /// # Errors
    /// [`QuotaError::Exceeded`]: refuse the whole request.
    /// [`QuotaError::Store`]: the count failed.
    pub async fn check(&self, commands: &[KeyedCommand]) -> Result<(), QuotaError> {
        let quotas = &self.engine.inner.quotas;
        let options = &quotas.options;
        let mut upserts: HashMap<&TenantName, Vec<&KeyedCommand>> = HashMap::new();
        for command in commands {
            let payload = match command.command.unconditional() {
                EventCommand::Upsert { payload, .. }
                | EventCommand::DebouncedUpsert { payload, .. }
                | EventCommand::UpsertIfCurrent { payload, .. } => payload,
                // Pending again: counted like a create.
                EventCommand::Redrive { .. } => &None,
                _ => continue,
            };
            if let Some(payload) = payload
                && options.max_payload_bytes > 0
                && payload.len() > options.max_payload_bytes
            {
                return Err(QuotaExceeded::PayloadTooLarge {
                    size: payload.len(),
                    limit: options.max_payload_bytes,
                }
                .into());
            }
            if !command.key.id.is_internal() {
                upserts
                    .entry(&command.key.tenant)
                    .or_default()
                    .push(command);
            }
        }
        for (tenant, commands) in upserts {
            let limit = options.pending_limit(tenant);
            if limit > 0 {
                self.check_pending(tenant, &commands, limit).await?;
            }
        }
        Ok(())
    }

    async fn check_pending(
        &self,
        tenant: &TenantName,
        commands: &[&KeyedCommand],
        limit: u64,
    ) -> Result<(), QuotaError> {
        let quotas = &self.engine.inner.quotas;
        let now = self.now();
        let known = lock(&quotas.pending).get(tenant).copied();
        let adding = commands.len() as u64;
        let mut estimate = match known {
            Some(estimate) if estimate.usable(now, quotas.options.count_refresh, adding, limit) => {
                estimate
            }
            _ => self.count_pending(tenant, limit).await?,
        };
        if estimate.fits(adding, limit) {
            return Ok(());
        }
        // Would refuse: on a fresh count, and not counting updates of
        // events already pending.
        if estimate.recount_before_refusing(self.now()) {
            estimate = self.count_pending(tenant, limit).await?;
        }
        let keys: Vec<_> = commands.iter().map(|c| c.key.clone()).collect();
        let records = self.engine.inner.env.store.get_events(&keys).await?;
        let mut new_keys = std::collections::HashSet::new();
        for (key, record) in keys.iter().zip(&records) {
            let pending = record.as_ref().is_some_and(|r| {
                matches!(r.status, EventStatus::Scheduled | EventStatus::Retrying)
            });
            if !pending {
                new_keys.insert(key);
            }
        }
        if estimate.fits(new_keys.len() as u64, limit) {
            return Ok(());
        }
        Err(QuotaExceeded::PendingEvents {
            tenant: tenant.clone(),
            limit,
        }
        .into())
    }

    /// Counts `tenant`'s pending events (up to `limit` of each status) and
    /// makes that its estimate.
    async fn count_pending(&self, tenant: &TenantName, limit: u64) -> Result<Estimate, QuotaError> {
        self.single_flight(CountKind::Pending, tenant, || {
            self.count_pending_now(tenant, limit)
        })
        .await
    }

    /// Runs `count` unless a count of `kind` for `tenant` finished while
    /// this one waited for its turn: then that count's estimate is the
    /// answer.
    async fn single_flight<F>(
        &self,
        kind: CountKind,
        tenant: &TenantName,
        count: impl FnOnce() -> F,
    ) -> Result<Estimate, QuotaError>
    where
        F: std::future::Future<Output = Result<Estimate, QuotaError>>,
    {
        let quotas = &self.engine.inner.quotas;
        let key = (kind, tenant.clone());
        let gate = lock(&quotas.counting)
            .entry(key.clone())
            .or_default()
            .clone();
        let seen = gate.done.load(Ordering::Acquire);
        let result = {
            let _turn = gate.turn.lock().await;
            let estimates = match kind {
                CountKind::Pending => &quotas.pending,
                CountKind::Schedules => &quotas.schedules,
            };
            let shared = lock(estimates).get(tenant).copied();
            match shared {
                Some(estimate) if gate.done.load(Ordering::Acquire) != seen => Ok(estimate),
                _ => {
                    belfry_metrics::quota_count(kind.name());
                    let result = count().await;
                    gate.done.fetch_add(1, Ordering::Release);
                    result
                }
            }
        };
        let mut counting = lock(&quotas.counting);
        // Only the map and this call hold it: nobody waits; forget it.
        if Arc::strong_count(&gate) == 2 {
            counting.remove(&key);
        }
        result
    }

    async fn count_pending_now(
        &self,
        tenant: &TenantName,
        limit: u64,
    ) -> Result<Estimate, QuotaError> {
        let counted_at = self.now();
        let mut counted = 0;
        for status in [EventStatus::Scheduled, EventStatus::Retrying] {
            counted += self
                .engine
                .inner
                .env
                .store
                .count_events(CountEventsParams {
                    tenant: tenant.clone(),
                    status,
                    at_most: limit.saturating_add(1),
                })
                .await?;
        }
        let estimate = Estimate::counted(counted, counted_at);
        lock(&self.engine.inner.quotas.pending).insert(tenant.clone(), estimate);
        Ok(estimate)
    }

    /// Before creating a schedule: refused when `tenant` has its quota of
    /// schedules.
    pub(crate) async fn check_schedule_quota(&self, tenant: &TenantName) -> Result<(), QuotaError> {
        let quotas = &self.engine.inner.quotas;
        let limit = quotas.options.schedules_limit(tenant);
        if limit == 0 {
            return Ok(());
        }
        let now = self.now();
        let known = lock(&quotas.schedules).get(tenant).copied();
        let mut estimate = match known {
            Some(estimate) if estimate.is_fresh(now, quotas.options.count_refresh) => estimate,
            _ => self.count_schedules(tenant, limit).await?,
        };
        if estimate.fits(1, limit) {
            return Ok(());
        }
        if estimate.recount_before_refusing(self.now()) {
            estimate = self.count_schedules(tenant, limit).await?;
        }
        if estimate.fits(1, limit) {
            return Ok(());
        }
        Err(QuotaExceeded::Schedules {
            tenant: tenant.clone(),
            limit,
        }
        .into())
    }

    async fn count_schedules(
        &self,
        tenant: &TenantName,
        limit: u64,
    ) -> Result<Estimate, QuotaError> {
        self.single_flight(CountKind::Schedules, tenant, || {
            self.count_schedules_now(tenant, limit)
        })
        .await
    }

    async fn count_schedules_now(
        &self,
        tenant: &TenantName,
        limit: u64,
    ) -> Result<Estimate, QuotaError> {
        let counted_at = self.now();
        // The rates need every schedule; without a rate budget the count
        // stops at the quota.
        let at_most =
            if self.engine.inner.quotas.options.occurrence_budget(tenant) > 0 || limit == 0 {
                usize::MAX
            } else {
                usize::try_from(limit).unwrap_or(usize::MAX)
            };
        let found =
            crate::schedule_scan::live_schedules(self.engine.store(), tenant, None, at_most)
                .await?;
        let rate = found
            .iter()
            .map(|found| schedule_rate(&found.schedule))
            .fold(0u64, u64::saturating_add);
        let estimate = Estimate::counted(found.len() as u64, counted_at);
        lock(&self.engine.inner.quotas.schedules).insert(tenant.clone(), estimate);
        lock(&self.engine.inner.quotas.schedule_rates).insert(
            tenant.clone(),
            Estimate {
                counted: rate,
                ..estimate
            },
        );
        Ok(estimate)
    }

    /// Before storing a schedule that changes its occurrences per minute
    /// from `old` to `new` (0 for none before): refused when the tenant's
    /// schedules would then pass its occurrence budget.
    pub(crate) async fn check_schedule_rate(
        &self,
        tenant: &TenantName,
        old: u64,
        new: u64,
    ) -> Result<(), QuotaError> {
        let quotas = &self.engine.inner.quotas;
        let per_minute = quotas.options.occurrence_budget(tenant);
        if per_minute == 0 || new <= old {
            return Ok(());
        }
        let limit = quotas.options.schedules_limit(tenant);
        let now = self.now();
        let known = lock(&quotas.schedule_rates).get(tenant).copied();
        let mut estimate = match known {
            Some(estimate) if estimate.is_fresh(now, quotas.options.count_refresh) => estimate,
            _ => {
                self.count_schedules(tenant, limit).await?;
                self.schedule_rate_estimate(tenant)
            }
        };
        if budget::fits(estimate.value(), old, new, per_minute) {
            return Ok(());
        }
        if estimate.recount_before_refusing(self.now()) {
            self.count_schedules(tenant, limit).await?;
            estimate = self.schedule_rate_estimate(tenant);
        }
        if budget::fits(estimate.value(), old, new, per_minute) {
            return Ok(());
        }
        Err(QuotaExceeded::ScheduleOccurrences {
            tenant: tenant.clone(),
            rate: estimate.value().saturating_sub(old).saturating_add(new),
            limit: per_minute,
        }
        .into())
    }

    fn schedule_rate_estimate(&self, tenant: &TenantName) -> Estimate {
        lock(&self.engine.inner.quotas.schedule_rates)
            .get(tenant)
            .copied()
            .unwrap_or(Estimate::counted(0, self.now()))
    }

    /// Before storing a schedule: its payload against
    /// `limits.max_payload_bytes` (every occurrence carries it).
    pub(crate) fn check_schedule_payload(
        &self,
        payload: Option<&str>,
    ) -> Result<(), QuotaExceeded> {
        let limit = self.engine.inner.quotas.options.max_payload_bytes;
        match payload {
            Some(payload) if limit > 0 && payload.len() > limit => {
                Err(QuotaExceeded::PayloadTooLarge {
                    size: payload.len(),
                    limit,
                })
            }
            _ => Ok(()),
        }
    }

    /// A schedule's new occurrences against its tenant's quotas: `Ok(None)`
    /// when they fit, else the reason to store them `missed` with.
    ///
    /// # Errors
    /// Counting failed.
    pub(crate) async fn refuse_occurrences(
        &self,
        upserts: &[KeyedCommand],
    ) -> Result<Option<QuotaExceeded>, StoreError> {
        match self.check(upserts).await {
            Ok(()) => Ok(None),
            Err(QuotaError::Exceeded(exceeded)) => Ok(Some(exceeded)),
            Err(QuotaError::Store(error)) => Err(error),
        }
    }

    /// Takes one of `tenant`'s dry-run tokens, then a token of its
    /// delivery rate if it has one.
    ///
    /// # Errors
    /// [`QuotaExceeded::DryRuns`] or [`QuotaExceeded::DeliveryRate`]: none
    /// left now.
    pub fn take_dry_run(&self, tenant: &TenantName) -> Result<(), QuotaExceeded> {
        self.take_dry_run_token(tenant)?;
        self.take_delivery_token(tenant)
    }

    fn take_dry_run_token(&self, tenant: &TenantName) -> Result<(), QuotaExceeded> {
        let limit = self.engine.inner.quotas.options.max_dry_runs_per_second;
        if limit == 0 {
            return Ok(());
        }
        let now = self.now();
        let rate = f64::from(limit);
        let mut buckets = lock(&self.engine.inner.quotas.dry_runs);
        if buckets.len() >= MAX_DRY_RUN_BUCKETS && !buckets.contains_key(tenant) {
            // A full bucket is the same as none.
            buckets.retain(|_, bucket| !bucket.is_full(rate, now));
        }
        let bucket = buckets
            .entry(tenant.clone())
            .or_insert_with(|| TokenBucket::full(rate, now));
        if !bucket.take(rate, now) {
            return Err(QuotaExceeded::DryRuns {
                tenant: tenant.clone(),
                limit,
            });
        }
        Ok(())
    }

    /// Takes a dry run's token of `tenant`'s delivery rate
    /// (`[limits.tenants."NAME"] max_deliveries_per_second`), if it has
    /// one: a dry run is a delivery to the same receiver, which the rate
    /// protects.
    ///
    /// # Errors
    /// [`QuotaExceeded::DeliveryRate`]: no token now.
    fn take_delivery_token(&self, tenant: &TenantName) -> Result<(), QuotaExceeded> {
        let Some(limit) = self
            .engine
            .inner
            .quotas
            .options
            .tenants
            .get(tenant.as_str())
            .and_then(|limits| limits.max_deliveries_per_second)
        else {
            return Ok(());
        };
        if self
            .engine
            .inner
            .fire_path
            .slots
            .take_dry_run_token(tenant, self.now())
        {
            Ok(())
        } else {
            Err(QuotaExceeded::DeliveryRate {
                tenant: tenant.clone(),
                limit,
            })
        }
    }

    /// Before creating a bulk action of `tenant`: refused when it has its
    /// limit of running ones. Hold [`QuotaState::bulk_creates`] from this check
    /// until the action is stored.
    pub(crate) async fn check_bulk_quota(&self, tenant: &TenantName) -> Result<(), QuotaError> {
        let limit = self.engine.inner.quotas.options.max_bulk_actions_per_tenant;
        if limit == 0 {
            return Ok(());
        }
        let mut running = 0;
        let mut after = None;
        loop {
            let page = self
                .engine
                .inner
                .env
                .store
                .running_bulk_actions(belfry_store::RunningBulkActionsParams {
                    after: after.clone(),
                    limit: 100,
                })
                .await?;
            running += page.iter().filter(|a| a.tenant() == tenant).count();
            if running >= limit {
                return Err(QuotaExceeded::BulkActions {
                    tenant: tenant.clone(),
                    limit,
                }
                .into());
            }
            if page.len() < 100 {
                return Ok(());
            }
            after = page.last().map(|action| action.id.clone());
        }
    }
}

/// A stored schedule's occurrences per minute against its tenant's budget
/// (0 when its expression cannot be read: it never fires).
pub(crate) fn schedule_rate(schedule: &Schedule) -> u64 {
    schedule
        .spec()
        .map_or(0, |spec| budget::rate_of(schedule, &spec))
}
