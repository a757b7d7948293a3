//! The one write path of every edge that schedules events: BigBen's `POST
//! /events/schedule`, `/v1`'s `PUT` of one event and batch `POST`, and
//! Kafka ingestion ([`crate::ingest`]).
//!
//! An edge reads its input, checks each item with its own rules (looking
//! tenants up through [`Tenants`]) and pushes one [`Checked`] per item into
//! a [`Pipeline`]; [`Pipeline::write`] then counts quotas, applies every
//! valid item in one durable batch through the engine and answers one
//! [`Outcome`] per item, in input order, which the edge renders in its own
//! format.
//!
//! # Contract
//! - Nothing is applied before the quotas passed ([`QuotaMode`]).
//! - A store failure fails exactly the items it may have hit: a failed
//!   tenant lookup or quota count every item to write, a failed part of a
//!   batch (the embedded store commits in independent parts) the items of
//!   that part. An item answered as applied is on disk.

use std::collections::HashMap;

use belfry_core::{TenantConfig, TenantName};
use belfry_engine::EngineHandle;
use belfry_engine::quotas::{QuotaError, QuotaExceeded};
use belfry_store::{Applied, KeyedCommand, StoreError};

use crate::auth::Principal;
use crate::error::ApiError;

/// Which tenants a writer may schedule for.
pub trait WriteScope: Send + Sync {
    fn may_write(&self, tenant: &TenantName) -> bool;
}

impl WriteScope for Principal {
    fn may_write(&self, tenant: &TenantName) -> bool {
        Principal::may_write(self, tenant)
    }
}

/// The scope of a `/v1` route whose tenant the route table already
/// admitted: that one tenant is all the request can name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted;

impl WriteScope for Admitted {
    fn may_write(&self, _tenant: &TenantName) -> bool {
        true
    }
}

/// How quotas refuse (`[limits]`, see `belfry_engine::quotas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaMode {
    /// HTTP: a request that passes a quota is refused whole (`429`/`413`),
    /// before anything is stored; the client retries it.
    WholeRequest,
    /// Kafka: the records of one poll come from many clients, so only the
    /// items that pass a quota are rejected (code 429 or 413); the others
    /// are stored.
    PerItem,
}

/// Registered tenants, each looked up once per batch, as the writer sees
/// them: a tenant outside its [`WriteScope`] is unknown, exactly like an
/// unregistered one.
pub(crate) struct Tenants<'a> {
    engine: &'a EngineHandle,
    scope: &'a dyn WriteScope,
    /// `None`: not registered.
    known: HashMap<TenantName, Option<TenantConfig>>,
}

impl Tenants<'_> {
    pub(crate) fn may_write(&self, tenant: &TenantName) -> bool {
        self.scope.may_write(tenant)
    }

    /// The tenant's configuration; `None` if it is not registered or not
    /// the writer's.
    ///
    /// # Errors
    /// The lookup failed in the store.
    pub(crate) async fn registered(
        &mut self,
        tenant: &TenantName,
    ) -> Result<Option<&TenantConfig>, StoreError> {
        if !self.scope.may_write(tenant) {
            return Ok(None);
        }
        if !self.known.contains_key(tenant) {
            let found = self.engine.store().get_tenant(tenant).await?;
            self.known.insert(tenant.clone(), found);
        }
        Ok(self.known.get(tenant).and_then(Option::as_ref))
    }
}

/// One item after the edge checked it. `echo` is whatever the edge needs to
/// answer it (its id as sent, a response skeleton, …).
#[derive(Debug)]
pub(crate) enum Checked<E> {
    /// Valid: apply `command` (boxed: a command is much larger than the
    /// other variants).
    Write { echo: E, command: Box<KeyedCommand> },
    /// Answered without a change and without touching the store (e.g. a
    /// BigBen `REMOVE` of a name that cannot exist).
    Unchanged(E),
    /// Bad input; sending it again cannot succeed.
    Rejected { echo: E, error: ApiError },
    /// The store failed while checking it (a tenant lookup).
    StoreFailed { echo: E, error: StoreError },
}

/// What became of one item.
#[derive(Debug)]
pub(crate) enum Outcome<E> {
    /// The store applied it durably.
    Applied {
        echo: E,
        applied: Box<Applied>,
    },
    Unchanged(E),
    /// Bad input, or (in [`QuotaMode::PerItem`]) refused by a quota.
    Rejected {
        echo: E,
        error: ApiError,
    },
    /// It may or may not have been applied; applying it again is safe.
    StoreFailed {
        echo: E,
        error: StoreError,
    },
}

/// The outcomes of a batch, in input order.
#[derive(Debug)]
pub(crate) struct Written<E> {
    pub(crate) outcomes: Vec<Outcome<E>>,
    /// The first store failure, if any item failed because of one.
    pub(crate) store_failure: Option<StoreFailure>,
}

/// A store failure of a batch.
#[derive(Debug, Clone)]
pub(crate) struct StoreFailure {
    /// The first error (never [`StoreError::Partial`]).
    pub(crate) error: StoreError,
    /// The store answered each command on its own (some may be applied);
    /// `false`: every item to write failed with `error`.
    pub(crate) per_command: bool,
}

/// A batch being checked, then written.
pub(crate) struct Pipeline<'a, E> {
    engine: &'a EngineHandle,
    /// For the edge's checks.
    pub(crate) tenants: Tenants<'a>,
    items: Vec<Checked<E>>,
}

/// An item while the batch is written: answered, or waiting for the
/// result of command `index`.
enum Slot<E> {
    Done(Outcome<E>),
    Pending { echo: E, index: usize },
}

impl<'a, E> Pipeline<'a, E> {
    pub(crate) fn new(engine: &'a EngineHandle, scope: &'a dyn WriteScope) -> Self {
        Pipeline {
            engine,
            tenants: Tenants {
                engine,
                scope,
                known: HashMap::new(),
            },
            items: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, item: Checked<E>) {
        self.items.push(item);
    }

    /// Counts quotas, applies the valid items in one durable batch and
    /// answers every item.
    ///
    /// # Errors
    /// Only in [`QuotaMode::WholeRequest`]: the batch passes a quota, or
    /// the count failed; nothing was stored.
    pub(crate) async fn write(self, quota_mode: QuotaMode) -> Result<Written<E>, QuotaError> {
        let engine = self.engine;
        let mut store_failure: Option<StoreFailure> = None;
        let mut commands = Vec::new();
        let mut slots: Vec<Slot<E>> = Vec::with_capacity(self.items.len());
        for item in self.items {
            slots.push(match item {
                Checked::Write { echo, command } => {
                    commands.push(*command);
                    Slot::Pending {
                        echo,
                        index: commands.len() - 1,
                    }
                }
                Checked::Unchanged(echo) => Slot::Done(Outcome::Unchanged(echo)),
                Checked::Rejected { echo, error } => Slot::Done(Outcome::Rejected { echo, error }),
                Checked::StoreFailed { echo, error } => {
                    store_failure.get_or_insert_with(|| whole(error.clone()));
                    Slot::Done(Outcome::StoreFailed { echo, error })
                }
            });
        }

        // Quotas refuse before anything is stored.
        if store_failure.is_none() && !commands.is_empty() {
            match (engine.quotas().check(&commands).await, quota_mode) {
                (Ok(()), _) => {}
                (Err(error), QuotaMode::WholeRequest) => return Err(error),
                (Err(QuotaError::Store(error)), QuotaMode::PerItem) => {
                    store_failure = Some(whole(error));
                }
                (Err(QuotaError::Exceeded(_)), QuotaMode::PerItem) => {
                    match refuse_per_item(engine, commands, slots).await {
                        Ok((kept, replanned)) => {
                            commands = kept;
                            slots = replanned;
                        }
                        Err((error, replanned)) => {
                            store_failure = Some(whole(error));
                            commands = Vec::new();
                            slots = replanned;
                        }
                    }
                }
            }
        }

        // Per command: what the store did, or why it failed.
        let mut results: Vec<Result<Applied, StoreError>> = Vec::new();
        if store_failure.is_none() && !commands.is_empty() {
            match engine.apply(commands).await {
                Ok(applied) => results = applied.into_iter().map(Ok).collect(),
                Err(StoreError::Partial(partial)) => {
                    store_failure = partial.first_error().cloned().map(|error| StoreFailure {
                        error,
                        per_command: true,
                    });
                    results = partial.results;
                }
                Err(error) => store_failure = Some(whole(error)),
            }
        }
        let mut results: Vec<Option<Result<Applied, StoreError>>> =
            results.into_iter().map(Some).collect();
        let outcomes = slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Done(outcome) => outcome,
                Slot::Pending { echo, index } => {
                    match results.get_mut(index).and_then(Option::take) {
                        Some(Ok(applied)) => Outcome::Applied {
                            echo,
                            applied: Box::new(applied),
                        },
                        Some(Err(error)) => Outcome::StoreFailed { echo, error },
                        None => Outcome::StoreFailed {
                            echo,
                            error: match &store_failure {
                                Some(failure) => failure.error.clone(),
                                None => {
                                    tracing::error!("store returned fewer results than commands");
                                    StoreError::Internal(
                                        "store returned fewer results than commands".into(),
                                    )
                                }
                            },
                        },
                    }
                }
            })
            .collect();
        Ok(Written {
            outcomes,
            store_failure,
        })
    }
}

fn whole(error: StoreError) -> StoreFailure {
    StoreFailure {
        error,
        per_command: false,
    }
}

/// [`QuotaMode::PerItem`] after the batch as a whole passed a quota: each
/// command is counted on its own; those that pass a quota are rejected and
/// left out. Returns the commands kept and the slots with their new
/// indexes; a failed count fails every item that was to be applied.
#[allow(clippy::type_complexity)]
async fn refuse_per_item<E>(
    engine: &EngineHandle,
    commands: Vec<KeyedCommand>,
    slots: Vec<Slot<E>>,
) -> Result<(Vec<KeyedCommand>, Vec<Slot<E>>), (StoreError, Vec<Slot<E>>)> {
    let mut refused: Vec<Option<QuotaExceeded>> = Vec::with_capacity(commands.len());
    for command in &commands {
        match engine.quotas().check(std::slice::from_ref(command)).await {
            Ok(()) => refused.push(None),
            Err(QuotaError::Exceeded(exceeded)) => refused.push(Some(exceeded)),
            Err(QuotaError::Store(error)) => {
                let slots = slots
                    .into_iter()
                    .map(|slot| match slot {
                        Slot::Pending { echo, .. } => Slot::Done(Outcome::StoreFailed {
                            echo,
                            error: error.clone(),
                        }),
                        done => done,
                    })
                    .collect();
                return Err((error, slots));
            }
        }
    }
    let mut new_index = Vec::with_capacity(commands.len());
    let mut kept = Vec::new();
    for (command, refusal) in commands.into_iter().zip(&refused) {
        new_index.push(refusal.is_none().then_some(kept.len()));
        if refusal.is_none() {
            kept.push(command);
        }
    }
    let slots = slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Pending { echo, index } => match (new_index[index], &refused[index]) {
                (Some(index), _) => Slot::Pending { echo, index },
                (None, refusal) => Slot::Done(Outcome::Rejected {
                    echo,
                    error: refusal
                        .as_ref()
                        .map(crate::quota::exceeded_error)
                        .unwrap_or_else(ApiError::internal),
                }),
            },
            done => done,
        })
        .collect();
    Ok((kept, slots))
}
