//! Ingestion without HTTP: the validation and write path of `POST
//! /events/schedule` and of `/v1` event writes, for edges that receive
//! requests some other way (the Kafka consumer in `belfry-kafka-ingest`).
//!
//! Nothing here is validated twice: BigBen requests go through the same
//! function as the HTTP route ([`schedule_bigben`]), `/v1` records through
//! the same field checks as `PUT /v1/tenants/{t}/events/{id}`
//! ([`schedule_v1`]). Every item is answered; the [`Verdict`] of each tells
//! the caller whether it is done (stored, or answered without a change),
//! rejected (bad input: it will never succeed), or failed in the store
//! (retry it).
//!
//! # Contract
//! - Items are applied in their order, in one durable batch (the engine's
//!   group commit): an item answered as stored is on disk.
//! - A quota refuses only the items that pass it (they are rejected with
//!   code 429 or 413), never the whole batch.
//! - Who may write for which tenant is the caller's [`WriteScope`]; a
//!   tenant outside it is answered exactly like an unregistered one.

use std::collections::HashMap;

use belfry_core::{CommandOutcome, EventCommand, EventKey, TenantConfig, TenantName};
use belfry_engine::EngineHandle;
use belfry_engine::quotas::QuotaError;
use belfry_sinks::body::{BigBenStatus, EventResponse};
use belfry_store::{Applied, KeyedCommand, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};

pub use crate::bigben::schedule::EventRequest;
use crate::bigben::schedule::{QuotaMode, schedule_items};
use crate::error::{ApiError, code};
use crate::v1::events::{BackoffBody, PullFields};
use crate::v1::views::Delivery;

/// Which tenants a writer may schedule for.
pub trait WriteScope: Send + Sync {
    fn may_write(&self, tenant: &TenantName) -> bool;
}

impl WriteScope for crate::Principal {
    fn may_write(&self, tenant: &TenantName) -> bool {
        crate::Principal::may_write(self, tenant)
    }
}

/// The tenants listed, or every registered tenant when the list is
/// exactly `["*"]`. Nothing is allowed by default: whoever may write a
/// topic would otherwise schedule for every tenant.
#[derive(Debug, Clone)]
pub struct TenantAllowList {
    /// `None`: every tenant (`["*"]`).
    allowed: Option<Vec<TenantName>>,
}

impl TenantAllowList {
    /// The list that allows every tenant.
    pub const EVERY_TENANT: &str = "*";

    /// # Errors
    /// An empty list (it must say whom it allows), `*` beside names, or a
    /// name that is not a valid tenant name.
    pub fn new(names: &[String]) -> Result<Self, String> {
        if names.is_empty() {
            return Err(format!(
                "must list the tenants records may schedule for, or be [\"{}\"] for every \
                 registered tenant",
                Self::EVERY_TENANT
            ));
        }
        if names.iter().any(|name| name == Self::EVERY_TENANT) {
            if names.len() > 1 {
                return Err(format!(
                    "\"{}\" (every tenant) cannot be combined with tenant names",
                    Self::EVERY_TENANT
                ));
            }
            return Ok(TenantAllowList { allowed: None });
        }
        let allowed = names
            .iter()
            .map(|name| TenantName::new(name.clone()).map_err(|e| format!("{name:?}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(TenantAllowList {
            allowed: Some(allowed),
        })
    }
}

impl WriteScope for TenantAllowList {
    fn may_write(&self, tenant: &TenantName) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|allowed| allowed.contains(tenant))
    }
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Stored durably, or answered without a change (a `REMOVE` of an
    /// unknown event).
    Done,
    /// Bad input; sending it again cannot succeed. `code` is stable
    /// (`invalid_json`, `unknown_tenant`, `rejected`, `quota_exceeded`, …).
    Rejected { code: String, message: String },
    /// The store failed; the item may or may not have been applied.
    /// Applying it again is safe.
    StoreFailed,
}

/// Reads one BigBen `EventRequest` from JSON.
///
/// # Errors
/// Not JSON, or not an `EventRequest` object: the reason.
pub fn parse_bigben(bytes: &[u8]) -> Result<EventRequest, String> {
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    let request = crate::extract::deserialize_naming_field(&mut parser)?;
    parser.end().map_err(|e| crate::extract::syntax_error(&e))?;
    Ok(request)
}

/// The `REJECTED` answer to a record that is not an `EventRequest` at all.
pub fn bigben_unreadable(message: &str) -> EventResponse {
    EventResponse::default()
        .with_status(BigBenStatus::Rejected)
        .with_error(400, message)
}

/// Schedules BigBen requests exactly as `POST /events/schedule` does (the
/// same checks, messages and answers), except that quotas refuse per item.
/// `lapse_offset_ms` is `api.lapse_offset_ms`.
pub async fn schedule_bigben(
    engine: &EngineHandle,
    lapse_offset_ms: u64,
    scope: &dyn WriteScope,
    requests: Vec<EventRequest>,
) -> Vec<EventResponse> {
    let count = requests.len();
    match schedule_items(engine, lapse_offset_ms, scope, requests, QuotaMode::PerItem).await {
        Ok(scheduled) => scheduled.responses,
        // `PerItem` answers quota refusals per item; this is a bug.
        Err(error) => {
            tracing::error!(%error, "per-item quota mode refused a whole batch");
            vec![
                EventResponse::default()
                    .with_status(BigBenStatus::Error)
                    .with_error(500, "internal error");
                count
            ]
        }
    }
}

/// The [`Verdict`] of a BigBen answer.
pub fn bigben_verdict(response: &EventResponse) -> Verdict {
    match response.event_status {
        Some(BigBenStatus::Error) => Verdict::StoreFailed,
        Some(BigBenStatus::Rejected) => {
            let (status, message) = response
                .error
                .as_ref()
                .map(|e| (e.code, e.message.clone()))
                .unwrap_or((400, String::new()));
            let code = match status {
                429 => code::QUOTA_EXCEEDED,
                413 => code::PAYLOAD_TOO_LARGE,
                _ if message.starts_with(crate::bigben::schedule::TENANT_UNKNOWN) => {
                    "unknown_tenant"
                }
                _ => "rejected",
            };
            Verdict::Rejected {
                code: code.to_string(),
                message,
            }
        }
        _ => Verdict::Done,
    }
}

/// One `/v1` event write as a record: the body of `PUT
/// /v1/tenants/{tenant}/events/{id}` (pull tenants' `queue`,
/// `max_attempts` and `backoff` included) plus its tenant and id, or a
/// cancel.
///
/// ```json
/// {"tenant": "acme", "id": "order-42", "deliver_at": "2030-01-31T04:00:30Z",
///  "payload": "{\"orderId\":42}", "delivery": "full_event"}
/// {"tenant": "jobs", "id": "mail-7", "deliver_at": "2030-01-31T04:00:30Z",
///  "queue": "emails", "max_attempts": 5, "backoff": {"initial_delay_ms": 500}}
/// {"tenant": "acme", "id": "order-42", "cancel": true}
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an event object")]
pub struct V1Record {
    tenant: String,
    id: String,
    deliver_at: Option<String>,
    payload: Option<String>,
    delivery: Option<Delivery>,
    queue: Option<String>,
    max_attempts: Option<u32>,
    backoff: Option<BackoffBody>,
    #[serde(default)]
    cancel: bool,
}

impl V1Record {
    /// Whether it carries any field of a write (a cancel carries none).
    fn has_write_fields(&self) -> bool {
        self.deliver_at.is_some()
            || self.payload.is_some()
            || self.delivery.is_some()
            || self.queue.is_some()
            || self.max_attempts.is_some()
            || self.backoff.is_some()
    }
}

/// Reads one [`V1Record`] from JSON.
///
/// # Errors
/// Not JSON, or not a `/v1` event object: the reason.
pub fn parse_v1(bytes: &[u8]) -> Result<V1Record, String> {
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    let record = crate::extract::deserialize_naming_field(&mut parser)?;
    parser.end().map_err(|e| crate::extract::syntax_error(&e))?;
    Ok(record)
}

/// The answer to one [`V1Record`]: `{"tenant", "id", "outcome", "version",
/// "error"}` with `outcome` one of `created`, `updated`, `cancelled`,
/// `not_found`, `already_finished`, `rejected`, `error` (`error` is `null`
/// or `{"code", "message"}`, the codes of the HTTP API).
#[derive(Debug, Clone)]
pub struct V1Answer {
    pub verdict: Verdict,
    pub body: Value,
}

impl V1Answer {
    /// The answer to a record that is not a `/v1` event object at all.
    pub fn unreadable(message: &str) -> V1Answer {
        rejected(
            None,
            None,
            &ApiError::bad_request(code::INVALID_JSON, message),
        )
    }
}

fn rejected(tenant: Option<&str>, id: Option<&str>, error: &ApiError) -> V1Answer {
    V1Answer {
        verdict: Verdict::Rejected {
            code: error.code.to_string(),
            message: error.message.clone(),
        },
        body: json!({ "tenant": tenant, "id": id, "outcome": "rejected", "version": null,
                      "error": { "code": error.code, "message": error.message } }),
    }
}

/// Schedules (or cancels) `/v1` records with the checks of `PUT
/// /v1/tenants/{t}/events/{id}` and `DELETE …`, in one durable batch.
pub async fn schedule_v1(
    engine: &EngineHandle,
    scope: &dyn WriteScope,
    records: Vec<V1Record>,
) -> Vec<V1Answer> {
    // The tenants looked up so far (`None`: not registered).
    let mut known: HashMap<TenantName, Option<TenantConfig>> = HashMap::new();
    let mut answers: Vec<Option<V1Answer>> = Vec::with_capacity(records.len());
    // (answer slot, command), in record order.
    let mut planned: Vec<(usize, KeyedCommand)> = Vec::new();
    let mut failed = false;
    for record in records {
        let slot = answers.len();
        let names = (
            TenantName::new(record.tenant.clone()),
            belfry_core::EventId::new(record.id.clone()),
        );
        let (tenant, id) = match names {
            (Ok(tenant), Ok(id)) => (tenant, id),
            (Err(e), _) | (_, Err(e)) => {
                let error = ApiError::bad_request(code::INVALID_NAME, e.to_string());
                answers.push(Some(rejected(
                    Some(&record.tenant),
                    Some(&record.id),
                    &error,
                )));
                continue;
            }
        };
        let not_found = || {
            ApiError::not_found(
                code::TENANT_NOT_FOUND,
                format!("tenant {:?} is not registered", record.tenant),
            )
        };
        if !scope.may_write(&tenant) {
            answers.push(Some(rejected(
                Some(&record.tenant),
                Some(&record.id),
                &not_found(),
            )));
            continue;
        }
        let command = if record.cancel {
            if record.has_write_fields() {
                let error = ApiError::bad_request(
                    code::INVALID_REQUEST,
                    "a cancel carries only tenant and id",
                );
                answers.push(Some(rejected(
                    Some(&record.tenant),
                    Some(&record.id),
                    &error,
                )));
                continue;
            }
            EventCommand::Cancel
        } else {
            let Some(deliver_at) = record.deliver_at.as_deref() else {
                let error = ApiError::bad_request(code::INVALID_REQUEST, "deliver_at is required");
                answers.push(Some(rejected(
                    Some(&record.tenant),
                    Some(&record.id),
                    &error,
                )));
                continue;
            };
            let pull = PullFields {
                queue: record.queue,
                max_attempts: record.max_attempts,
                backoff: record.backoff,
            };
            match crate::v1::events::upsert(deliver_at, record.payload, record.delivery, pull) {
                Ok(command) => command,
                Err(error) => {
                    answers.push(Some(rejected(
                        Some(&record.tenant),
                        Some(&record.id),
                        &error,
                    )));
                    continue;
                }
            }
        };
        // Writes need a registered tenant; cancels do not (events outlive
        // their tenant's registration).
        if !record.cancel {
            if !known.contains_key(&tenant) {
                match engine.store().get_tenant(&tenant).await {
                    Ok(found) => {
                        known.insert(tenant.clone(), found);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "tenant lookup failed during ingestion");
                        failed = true;
                    }
                }
            }
            // After a failed lookup the tenant is unknown here; every
            // planned item is answered as a store failure below.
            let checked = match known.get(&tenant) {
                Some(None) => Err(not_found()),
                Some(Some(config)) => crate::v1::events::admit_command(config, &command),
                None => Ok(()),
            };
            if let Err(error) = checked {
                answers.push(Some(rejected(
                    Some(&record.tenant),
                    Some(&record.id),
                    &error,
                )));
                continue;
            }
        }
        answers.push(None);
        planned.push((
            slot,
            KeyedCommand {
                key: EventKey::new(tenant, id),
                command,
                fence: None,
            },
        ));
    }
    if failed {
        for (slot, command) in &planned {
            answers[*slot] = Some(store_failed(&command.key));
        }
        planned.clear();
    }
    // Quotas: the batch as a whole, then (only if it passes one) per item.
    if !planned.is_empty() {
        let commands: Vec<KeyedCommand> = planned.iter().map(|(_, c)| c.clone()).collect();
        if engine.quotas().check(&commands).await.is_err() {
            let mut kept = Vec::with_capacity(planned.len());
            for (slot, command) in planned {
                match engine.quotas().check(std::slice::from_ref(&command)).await {
                    Ok(()) => kept.push((slot, command)),
                    Err(QuotaError::Exceeded(exceeded)) => {
                        let error = crate::quota::exceeded_error(&exceeded);
                        answers[slot] = Some(rejected(
                            Some(command.key.tenant.as_str()),
                            Some(command.key.id.as_str()),
                            &error,
                        ));
                    }
                    Err(QuotaError::Store(_)) => answers[slot] = Some(store_failed(&command.key)),
                }
            }
            planned = kept;
        }
    }
    if !planned.is_empty() {
        let (slots, commands): (Vec<usize>, Vec<KeyedCommand>) = planned.into_iter().unzip();
        let keys: Vec<EventKey> = commands.iter().map(|c| c.key.clone()).collect();
        let results: Vec<Option<Applied>> = match engine.apply(commands).await {
            Ok(applied) => applied.into_iter().map(Some).collect(),
            Err(StoreError::Partial(partial)) => {
                tracing::warn!(error = %partial, "part of an ingested batch failed in the store");
                partial.results.into_iter().map(Result::ok).collect()
            }
            Err(error) => {
                tracing::warn!(%error, "an ingested batch failed in the store");
                Vec::new()
            }
        };
        for (index, (slot, key)) in slots.into_iter().zip(keys).enumerate() {
            answers[slot] = Some(match results.get(index).and_then(Option::as_ref) {
                Some(applied) => v1_applied(applied),
                None => store_failed(&key),
            });
        }
    }
    answers
        .into_iter()
        .map(|answer| answer.unwrap_or_else(store_failed_unknown))
        .collect()
}

fn v1_applied(applied: &Applied) -> V1Answer {
    let outcome = match &applied.outcome {
        CommandOutcome::Created => "created",
        CommandOutcome::Updated { .. } => "updated",
        CommandOutcome::Cancelled => "cancelled",
        CommandOutcome::AlreadyFinished(_) => "already_finished",
        _ => "not_found",
    };
    V1Answer {
        verdict: Verdict::Done,
        body: json!({
            "tenant": applied.key.tenant.as_str(),
            "id": applied.key.id.as_str(),
            "outcome": outcome,
            "version": applied.record.as_ref().map(|r| r.version.as_str()),
            "error": null,
        }),
    }
}

fn store_failed(key: &EventKey) -> V1Answer {
    V1Answer {
        verdict: Verdict::StoreFailed,
        body: json!({ "tenant": key.tenant.as_str(), "id": key.id.as_str(), "outcome": "error",
                      "version": null, "error": { "code": code::STORE_UNAVAILABLE,
                      "message": "the store failed; the change may or may not have been made" } }),
    }
}

fn store_failed_unknown() -> V1Answer {
    tracing::error!("an ingested record was left without an answer");
    V1Answer {
        verdict: Verdict::StoreFailed,
        body: json!({ "outcome": "error" }),
    }
}
