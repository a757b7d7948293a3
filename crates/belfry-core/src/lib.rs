//! The pure core of Belfry: everything that can be decided without a clock
//! read, a socket or a disk.
//!
//! Cargo enforces the purity: this crate depends on no async runtime, no
//! database and no HTTP stack, so every rule here is testable with plain unit
//! and property tests.
//!
//! # Layout
//! - [`cron`]: recurring-schedule expressions (UNIX, Quartz, Spring, cron4j,
//!   `@every`), next fire across DST, descriptions, occurrence ids.
//! - [`time`]: [`Timestamp`] (milliseconds since the UNIX epoch),
//!   [`MonoTime`] (monotonic readings) and the injected [`Clock`] (wall
//!   time, monotonic time, sleeps) with its [`ManualClock`] for tests; the
//!   system clock adapter lives in the `belfry-clock` crate.
//! - [`ids`]: validated names: [`TenantName`], [`EventId`] (the client's id),
//!   [`EventKey`] (`(tenant, id)`), [`EventVersion`] (BigBen's `eventId`).
//! - [`partition`]: the stable hash of `(tenant, id)` onto a fixed number of
//!   partitions.
//! - [`tenant`]: where a tenant's events are delivered ([`SinkConfig`]).
//! - [`event`]: the event record and its state machine
//!   (`(state, command, now) → (state, effects)`).
//! - [`retry`]: the retry policy and the one delivery classification
//!   ([`Verdict`]: delivered, retry, permanent).
//! - [`breaker`]: the circuit breaker of each tenant endpoint
//!   ([`breaker::Breakers`]: consecutive transient failures open it, events
//!   then wait; one probe per growing cool-down closes it).
//! - [`policy`]: an event's attempts on every channel
//!   ([`policy::DeliveryPolicy`]: the event's settings, else its tenant's,
//!   else the node's; the next attempt after the back-off or the
//!   receiver's `Retry-After`, never past the expiry).
//! - [`timer`]: the due order ([`DueCursor`]).
//! - [`fire`]: the fire path of one partition as a pure state machine
//!   ([`fire::PartitionCore`]: window, read-ahead, claims, retry timers,
//!   repairs), the delivery slot policy ([`fire::DeliverySlots`]), and the
//!   fire-time decisions on a fired entry's record ([`fire::decide`]:
//!   still due, look-back expiry, route to the planner, pull or push).
//! - [`schedule`]: recurring schedules as control events, the pure
//!   planner of their occurrences and misfires, and what a fired control
//!   event stores ([`schedule::firing`]).
//! - [`quota`]: per-tenant quota estimates and rate-limit token buckets.
//! - [`ownership`]: a partition's firing window (whether this node may
//!   fire it now, and until when).
//! - [`pull`]: pull workers' leases: lease ids, the lease API's limits and
//!   request validation, and one node's pull queue as a pure state machine
//!   ([`pull::PullQueue`]: ready entries, long-polling claims, fenced
//!   leases, heartbeats, expiry, retries).
//! - [`assignment`]: how the cluster leader spreads partitions over nodes.
//! - [`liveness`]: when a cluster node counts as crashed before its leases
//!   run out ([`liveness::CrashWatch`] over its presence lock and heartbeat).
//! - [`auth`]: API key secrets (format, checksum, hash), roles, audit entries.
//! - [`config`]: what option structs share: the checks' [`config::Problems`]
//!   and the derived reference of their keys ([`config::ConfigKeys`]).
//! - [`bulk`]: bulk actions (cancel, redrive, pause, resume over a filter):
//!   the record, its progress and the claim rule of its runners.

// The derived `ConfigKeys` impls name `::belfry_core`, also inside it.
extern crate self as belfry_core;

pub mod assignment;
pub mod auth;
pub mod breaker;
pub mod bulk;
pub mod config;
pub mod cron;
pub mod event;
pub mod fire;
pub mod ids;
pub mod liveness;
pub mod notice;
pub mod ownership;
pub mod partition;
pub mod policy;
pub mod pull;
pub mod quota;
pub mod retry;
pub mod schedule;
pub mod tenant;
pub mod time;
pub mod timer;

pub use cron::{CronError, CronKind, CronSpec, OccurrenceId};
pub use event::{
    Attempt, AttemptReport, CommandOutcome, Debounce, DeliveryOption, Effect, EventCommand,
    EventRecord, EventSettings, EventStatus, Precondition, PreviousDelivery, Replaced, Transition,
    TransitionContext,
};
pub use ids::{EventId, EventKey, EventVersion, IdError, QueueName, TenantName, WorkerId};
pub use partition::{PartitionCount, PartitionId, partition_ranges};
pub use policy::DeliveryPolicy;
pub use retry::{Backoff, RetryPolicy, Verdict};
pub use schedule::{MisfirePolicy, Schedule, ScheduleError, ScheduleId, ScheduleStatus};
pub use tenant::{
    DeliveryDefaults, NotifyTarget, SigningSecrets, SinkConfig, TenantConfig, TenantPause,
};
pub use time::{Clock, ManualClock, MonoTime, Timestamp};
pub use timer::DueCursor;
