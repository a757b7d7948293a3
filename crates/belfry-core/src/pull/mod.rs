//! Pull workers' leases: the pure core of the pull channel.
//!
//! A pull tenant's events are not pushed anywhere: workers claim them once
//! due, hold a *lease* while they run one, heartbeat to keep it, and end it
//! by completing, failing or releasing the event. This module decides
//! everything about that without I/O; `docs/pull.md` describes the
//! behaviour for users and what remains to be wired in the engine and API.
//!
//! # Layout
//! - [`lease_id`]: [`LeaseId`], the opaque name of one lease (event key,
//!   version, attempt, fencing epoch, nonce), and the [`NonceSource`].
//! - [`limits`]: the API's limits as constants and the validation of the
//!   request bodies into typed values.
//! - [`queue`]: [`PullQueue`], one node's share of the pull channel as a
//!   state machine `handle(input, now) -> actions`.
//! - [`announce`]: in a cluster, when a node announces a tenant's
//!   unclaimed ready entries ([`Announcer`]) and which other nodes did
//!   ([`ReadyElsewhere`]), so claims reach entries other nodes hold.
//!
//! # The queue
//! [`PullQueue`] holds, all bounded by [`PullConfig`]:
//! - *ready* entries: fired by their partition core, per tenant and named
//!   queue, due order inside a queue, a tenant's queues in turn;
//! - *waiters*: claims long-polling up to their `wait`, oldest first per
//!   tenant;
//! - *grants* being recorded, and *leases*: active (with their expiry),
//!   cancelled (until their expiry, to answer heartbeats), or expiring
//!   (their failed attempt being recorded); among them *orphans*, leases
//!   another owner (or this node before a restart) granted and never saw
//!   end, which a grant found in the store;
//! - *remembered* outcomes, to answer a repeated call the same way.
//!
//! Every ready entry is an outstanding entry of its partition core from
//! the moment it fired until [`Action::Finish`]: the partition core's
//! outstanding bounds (per tenant and in total) bound the pull channel too,
//! and an entry the queue refuses (its ready bounds reached, or handed over
//! before its instant) goes back to its core as [`crate::fire::Finish::RetryAt`]
//! — it stays in the store and fires again after the pause.
//!
//! # Life of a lease
//! ```text
//! ready ──claim──▶ granting ──recorded──▶ active ──complete/fail/release──▶ ended
//!   ▲                 │ lost/cancelled          │ │ heartbeat (extends)
//!   └─ store down ────┘    ⇒ ended              │ └─ version ended ──▶ cancelled ──expiry──▶ gone
//!                     │                         └─ expiry ──▶ expiring ──recorded──▶ ended
//!                     └─ orphaned ──▶ orphan (calls: lease_lost) ──expiry──▶ expiring
//! ```
//! A grant the store answers [`PersistResult::Orphaned`] found the
//! version's current attempt leased already, by a lease whose owner went
//! away before it ended (a crash or restart of the node, a partition
//! move). The queue holds that orphan instead, with the entry it fired
//! for (the claim waits on), until the orphan's recorded expiry; then it
//! records the expiry as a failed attempt ([`LeaseChange::Expire`], under
//! the epoch it holds the partition in), like any expiry: so every
//! attempt a worker was given counts, and a job that crashes its node is
//! not retried forever. A node that lets a partition go cleanly gives its
//! leases back instead ([`PullQueue::give_back`]: released at their
//! expiries, no attempt counted).
//! Every change is recorded before it is answered: a grant before the
//! worker sees the lease ([`Action::PersistGrants`]), a heartbeat's new
//! expiry, and the end of a lease ([`Action::PersistLease`]), each fenced
//! by the partition's epoch and checked against the stored lease; the store
//! answers [`PersistResult`]. A write in flight on a lease holds back its
//! expiry (the call came in time) and queues later calls on it; after the
//! write, those that came before the expiry are handled in order, and the
//! lease expires at the first that came after it.
//!
//! # Guarantees (checked by the simulation, `tests/pull_simulation.rs`)
//! - Never early: an entry is leased only at or after its due instant
//!   (its instant, its back-off, or the end of a release's delay).
//! - One lease at a time: a version is leased again only after its lease
//!   ended in the store — by its worker, its expiry (an orphan's too), or
//!   a give-back at its expiry. A partition move voids the old epoch's
//!   leases for calls (every call on them answers `lease_lost`) but does
//!   not end them early.
//! - No silent stale success: a call on a lease that expired, ended,
//!   was superseded or moved answers [`PullError::LeaseLost`]; a repeated
//!   complete, fail or release of the same lease answers as the first did.
//! - Claims are answered oldest first per tenant, only with their
//!   tenant's events; a ready entry never waits while a claim of its
//!   tenant waits (unless the node's lease bound or the tenant's share of
//!   it is reached).
//! - Bounded: ready + granting `<= max_ready` (per tenant
//!   `<= max_ready_per_tenant`), leases + granting `<= max_leases` (per
//!   tenant `<= max_leases_per_tenant`),
//!   waiters `<= max_waiters` (per tenant `<= max_waiters_per_tenant`),
//!   remembered `<= max_remembered`, calls queued per lease
//!   `<= MAX_QUEUED_CALLS_PER_LEASE`.

pub mod announce;
pub mod lease_id;
pub mod limits;
pub mod queue;
mod ready;

pub use crate::policy::{DeliveryPolicy, GiveUp};
pub use announce::{AnnounceConfig, Announcer, ReadyElsewhere};
pub use lease_id::{LeaseId, LeaseIdError, LeaseNonce, NonceSource};
pub use limits::{
    ClaimBody, ClaimRequest, CompleteBody, FailBody, FailRequest, HeartbeatBody, PullRequestError,
    ReleaseBody,
};
pub use queue::{
    Action, CallId, GrantedLease, Input, LeaseCall, LeaseChange, LeaseRecord, OpId, PersistResult,
    PullConfig, PullError, PullQueue, PullStats, Reply, Resolution,
};
pub use ready::ReadyEntry;

#[cfg(test)]
mod tests;
