//! Per-tenant quotas on what clients store: pending events, schedules, and
//! the size of one event's payload (`[limits]` in the node config).
//!
//! # Contract
//! - A request that would take a tenant past a quota is refused whole,
//!   before anything is stored ([`QuotaExceeded`]); the API answers `429
//!   quota_exceeded` (counts) or `413 payload_too_large` (size).
//! - Only client writes are checked ([`EngineHandle::check_quotas`] before
//!   [`EngineHandle::apply`], [`EngineHandle::put_schedule`] for a new
//!   schedule). The occurrences a schedule creates are not refused: the
//!   schedules quota bounds them.
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
//! So a refusal rests on a count at most about a second old plus this
//! node's own writes since (never on deliveries long finished); a tenant can
//! pass its quota by what other nodes accepted for it since their last
//! count, and by concurrent requests that were all checked before any was
//! acknowledged. Schedules are estimated the same way (counted by listing
//! them, which is cheap for the numbers schedules come in).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use belfry_core::event::{CommandOutcome, EventCommand, EventStatus};
use belfry_core::{TenantName, Timestamp};
use belfry_store::{Applied, CountEventsParams, KeyedCommand, StoreError};
use serde::{Deserialize, Serialize};

use crate::EngineHandle;

/// An estimate older than this is counted again before it refuses a
/// request.
pub const RECOUNT_BEFORE_REFUSING: Duration = Duration::from_secs(1);

/// Per-tenant quotas (`[limits]`). Zero: no limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaOptions {
    /// Most pending (scheduled or retrying) events per tenant; a request
    /// that would pass it is refused whole with `429 quota_exceeded`.
    /// Approximate (see `docs/security.md`). Default 10,000,000; 0: none.
    pub max_pending_events_per_tenant: u64,
    /// Most schedules per tenant; creating one more is refused with `429
    /// quota_exceeded`. Default 10,000; 0: none.
    pub max_schedules_per_tenant: u64,
    /// Largest payload of one event, in bytes; a request holding a larger
    /// one is refused whole with `413 payload_too_large`. Default 256 KiB;
    /// 0: none (`api.max_body_bytes` still bounds the request).
    pub max_payload_bytes: usize,
    /// How old a tenant's estimate may grow, once above half its quota,
    /// before it is counted again from the store. Default 10 s.
    #[serde(with = "belfry_core::time::serde_millis", rename = "count_refresh_ms")]
    pub count_refresh: Duration,
    /// Delivery limits of single tenants, by tenant name
    /// (`[limits.tenants."acme/billing"]`). Deliveries past them wait in
    /// their tenant's queue; none is dropped.
    pub tenants: BTreeMap<String, TenantDeliveryLimits>,
}

/// One tenant's own limits (`[limits.tenants."NAME"]`): its delivery rate
/// and concurrency, and quotas that replace the node-wide ones for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantDeliveryLimits {
    /// Deliveries started per second, at most (bursts up to one second's
    /// worth after a pause). None: no rate limit.
    pub max_deliveries_per_second: Option<u32>,
    /// Deliveries in flight at once (instead of
    /// `engine.max_in_flight_per_tenant`, at most `engine.max_in_flight`).
    pub max_concurrent_deliveries: Option<usize>,
    /// This tenant's pending-event quota instead of
    /// `limits.max_pending_events_per_tenant` (0: none).
    pub max_pending_events: Option<u64>,
    /// This tenant's schedule quota instead of
    /// `limits.max_schedules_per_tenant` (0: none).
    pub max_schedules: Option<u64>,
}

impl QuotaOptions {
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

    /// Whether any tenant may have a pending-event quota.
    fn counts_pending(&self) -> bool {
        self.max_pending_events_per_tenant > 0
            || self
                .tenants
                .values()
                .any(|limits| limits.max_pending_events.is_some_and(|limit| limit > 0))
    }

    /// Problems with the per-tenant limits, naming their keys.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, limits) in &self.tenants {
            if TenantName::new(name.clone()).is_err() {
                problems.push(format!(
                    "limits.tenants: {name:?} is not a valid tenant name"
                ));
            }
            if limits.max_deliveries_per_second == Some(0) {
                problems.push(format!(
                    "limits.tenants.{name:?}.max_deliveries_per_second must be at least 1, not 0"
                ));
            }
            if limits.max_concurrent_deliveries == Some(0) {
                problems.push(format!(
                    "limits.tenants.{name:?}.max_concurrent_deliveries must be at least 1, not 0"
                ));
            }
        }
        problems
    }
}

impl Default for QuotaOptions {
    fn default() -> Self {
        QuotaOptions {
            max_pending_events_per_tenant: 10_000_000,
            max_schedules_per_tenant: 10_000,
            max_payload_bytes: 256 * 1024,
            count_refresh: Duration::from_secs(10),
            tenants: BTreeMap::new(),
        }
    }
}

impl QuotaOptions {
    /// No quota at all (what an engine built in code gets by default).
    pub fn unlimited() -> Self {
        QuotaOptions {
            max_pending_events_per_tenant: 0,
            max_schedules_per_tenant: 0,
            max_payload_bytes: 0,
            ..QuotaOptions::default()
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
        "a payload of {size} bytes is larger than the {limit} bytes allowed; nothing was stored"
    )]
    PayloadTooLarge { size: usize, limit: usize },
}

/// Why [`EngineHandle::check_quotas`] refused.
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
pub(crate) struct Quotas {
    options: QuotaOptions,
    pending: Mutex<HashMap<TenantName, Estimate>>,
    schedules: Mutex<HashMap<TenantName, Estimate>>,
}

#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// The store's count, at `counted_at`.
    counted: u64,
    counted_at: Timestamp,
    /// This node's acknowledged creates minus cancels since.
    delta: i64,
}

impl Estimate {
    fn value(&self) -> u64 {
        self.counted.saturating_add_signed(self.delta)
    }

    fn age(&self, now: Timestamp) -> Duration {
        Duration::from_millis(
            u64::try_from(now.as_millis().saturating_sub(self.counted_at.as_millis())).unwrap_or(0),
        )
    }
}

impl Quotas {
    pub(crate) fn new(options: QuotaOptions) -> Self {
        Quotas {
            options,
            pending: Mutex::default(),
            schedules: Mutex::default(),
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
            let delta = match item.outcome {
                CommandOutcome::Created => 1,
                CommandOutcome::Cancelled => -1,
                _ => continue,
            };
            if let Some(estimate) = estimates.get_mut(&item.key.tenant) {
                estimate.delta += delta;
            }
        }
    }

    /// A schedule this node created.
    pub(crate) fn schedule_created(&self, tenant: &TenantName) {
        if let Some(estimate) = lock(&self.schedules).get_mut(tenant) {
            estimate.delta += 1;
        }
    }

    /// A schedule this node deleted.
    pub(crate) fn schedule_deleted(&self, tenant: &TenantName) {
        if let Some(estimate) = lock(&self.schedules).get_mut(tenant) {
            estimate.delta -= 1;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps hold plain numbers: a panic elsewhere leaves them usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl EngineHandle {
    /// Checks client commands against the quotas before
    /// [`EngineHandle::apply`]: payload sizes, then each tenant's pending
    /// events (see the module docs for the precision).
    ///
    /// # Errors
    /// [`QuotaError::Exceeded`]: refuse the whole request.
    /// [`QuotaError::Store`]: the count failed.
    pub async fn check_quotas(&self, commands: &[KeyedCommand]) -> Result<(), QuotaError> {
        let quotas = &self.inner.quotas;
        let options = &quotas.options;
        let mut upserts: HashMap<&TenantName, Vec<&KeyedCommand>> = HashMap::new();
        for command in commands {
            let payload = match &command.command {
                EventCommand::Upsert { payload, .. }
                | EventCommand::UpsertIfCurrent { payload, .. } => payload,
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
        let quotas = &self.inner.quotas;
        let now = self.now();
        let known = lock(&quotas.pending).get(tenant).copied();
        let adding = commands.len() as u64;
        let mut estimate = match known {
            Some(estimate)
                if estimate.age(now) < quotas.options.count_refresh
                    || estimate.value().saturating_add(adding) <= limit / 2 =>
            {
                estimate
            }
            _ => self.count_pending(tenant, limit).await?,
        };
        if estimate.value().saturating_add(adding) <= limit {
            return Ok(());
        }
        // Would refuse: on a fresh count, and not counting updates of
        // events already pending.
        if estimate.age(self.now()) >= RECOUNT_BEFORE_REFUSING {
            estimate = self.count_pending(tenant, limit).await?;
        }
        let keys: Vec<_> = commands.iter().map(|c| c.key.clone()).collect();
        let records = self.inner.store.get_events(&keys).await?;
        let mut new_keys = std::collections::HashSet::new();
        for (key, record) in keys.iter().zip(&records) {
            let pending = record.as_ref().is_some_and(|r| {
                matches!(r.status, EventStatus::Scheduled | EventStatus::Retrying)
            });
            if !pending {
                new_keys.insert(key);
            }
        }
        if estimate.value().saturating_add(new_keys.len() as u64) <= limit {
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
        let counted_at = self.now();
        let mut counted = 0;
        for status in [EventStatus::Scheduled, EventStatus::Retrying] {
            counted += self
                .inner
                .store
                .count_events(CountEventsParams {
                    tenant: tenant.clone(),
                    status,
                    at_most: limit.saturating_add(1),
                })
                .await?;
        }
        let estimate = Estimate {
            counted,
            counted_at,
            delta: 0,
        };
        lock(&self.inner.quotas.pending).insert(tenant.clone(), estimate);
        Ok(estimate)
    }

    /// Before creating a schedule: refused when `tenant` has its quota of
    /// schedules.
    pub(crate) async fn check_schedule_quota(&self, tenant: &TenantName) -> Result<(), QuotaError> {
        let quotas = &self.inner.quotas;
        let limit = quotas.options.schedules_limit(tenant);
        if limit == 0 {
            return Ok(());
        }
        let now = self.now();
        let known = lock(&quotas.schedules).get(tenant).copied();
        let mut estimate = match known {
            Some(estimate) if estimate.age(now) < quotas.options.count_refresh => estimate,
            _ => self.count_schedules(tenant, limit).await?,
        };
        if estimate.value() < limit {
            return Ok(());
        }
        if estimate.age(self.now()) >= RECOUNT_BEFORE_REFUSING {
            estimate = self.count_schedules(tenant, limit).await?;
        }
        if estimate.value() < limit {
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
        let counted_at = self.now();
        let at_most = usize::try_from(limit).unwrap_or(usize::MAX);
        let counted = match self.list_schedules(tenant, None, at_most).await {
            Ok(found) => found.len() as u64,
            Err(crate::schedules::ScheduleOpError::Store(error)) => return Err(error.into()),
            // Listing raises nothing else.
            Err(_) => 0,
        };
        let estimate = Estimate {
            counted,
            counted_at,
            delta: 0,
        };
        lock(&self.inner.quotas.schedules).insert(tenant.clone(), estimate);
        Ok(estimate)
    }
}
