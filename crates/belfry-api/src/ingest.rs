//! Ingestion without HTTP: the validation and write path of `POST
//! /events/schedule` and of `/v1` event writes, for edges that receive
//! requests some other way (the Kafka consumer in `belfry-kafka-ingest`).
//!
//! Nothing here is validated or written twice: BigBen requests go through
//! the same checks as the HTTP route ([`schedule_bigben`]), `/v1` records
//! through the same field checks as `PUT /v1/tenants/{t}/events/{id}`
//! ([`schedule_v1`]), and both through the write pipeline every HTTP write
//! route uses. Every item is answered; the [`Verdict`] of each tells
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

use belfry_core::{CommandOutcome, EventCommand, EventId, EventKey, TenantName, Timestamp};
use belfry_engine::EngineHandle;
use belfry_sinks::body::{BigBenStatus, EventResponse};
use belfry_store::{Applied, KeyedCommand};
use serde::Deserialize;
use serde_json::{Value, json};

pub use crate::bigben::schedule::EventRequest;
use crate::bigben::schedule::schedule_items;
use crate::error::{ApiError, Code};
pub use crate::pipeline::WriteScope;
use crate::pipeline::{Checked, Outcome, Pipeline, QuotaMode, Tenants};
use crate::v1::events::{DebounceBody, SettingsFields, When};
use crate::v1::views::BackoffBody;
use crate::v1::views::Delivery;

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

/// A BigBen request's answer, and what it means for the record.
#[derive(Debug, Clone)]
pub struct BigBenAnswer {
    pub response: EventResponse,
    pub verdict: Verdict,
}

/// Schedules BigBen requests exactly as `POST /events/schedule` does (the
/// same checks, messages and answers), except that quotas refuse per item.
/// `lapse_offset` is `api.lapse_offset_ms`.
pub async fn schedule_bigben(
    engine: &EngineHandle,
    lapse_offset: std::time::Duration,
    scope: &dyn WriteScope,
    requests: Vec<EventRequest>,
) -> Vec<BigBenAnswer> {
    let count = requests.len();
    match schedule_items(engine, lapse_offset, scope, requests, QuotaMode::PerItem).await {
        Ok(scheduled) => scheduled
            .responses
            .into_iter()
            .zip(scheduled.refusals)
            .map(|(response, refusal)| BigBenAnswer {
                verdict: bigben_verdict(&response, refusal),
                response,
            })
            .collect(),
        // `PerItem` answers quota refusals per item; this is a bug.
        Err(error) => {
            tracing::error!(%error, "per-item quota mode refused a whole batch");
            let response = EventResponse::default()
                .with_status(BigBenStatus::Error)
                .with_error(500, "internal error");
            vec![
                BigBenAnswer {
                    verdict: bigben_verdict(&response, None),
                    response,
                };
                count
            ]
        }
    }
}

/// The [`Verdict`] of a BigBen answer; `refusal` is the code that refused
/// it, when one did.
fn bigben_verdict(response: &EventResponse, refusal: Option<Code>) -> Verdict {
    match response.event_status {
        Some(BigBenStatus::Error) => Verdict::StoreFailed,
        Some(BigBenStatus::Rejected) => {
            let (status, message) = response
                .error
                .as_ref()
                .map(|e| (e.code, e.message.clone()))
                .unwrap_or((400, String::new()));
            let code = match (refusal, status) {
                (Some(Code::UnknownTenant), _) => Code::UnknownTenant,
                (_, 429) => Code::QuotaExceeded,
                (_, 413) => Code::PayloadTooLarge,
                _ => {
                    return Verdict::Rejected {
                        code: "rejected".to_string(),
                        message,
                    };
                }
            };
            Verdict::Rejected {
                code: code.as_str().to_string(),
                message,
            }
        }
        _ => Verdict::Done,
    }
}

/// One `/v1` event write as a record: the body of `PUT
/// /v1/tenants/{tenant}/events/{id}` (the delivery policy fields and pull
/// tenants' `queue` included) plus its tenant and id, or a cancel.
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
    delay_ms: Option<u64>,
    debounce: Option<DebounceBody>,
    payload: Option<String>,
    delivery: Option<Delivery>,
    queue: Option<String>,
    max_attempts: Option<u32>,
    backoff: Option<BackoffBody>,
    attempt_timeout_ms: Option<u64>,
    expire_at: Option<String>,
    max_age_ms: Option<u64>,
    #[serde(default)]
    cancel: bool,
}

impl V1Record {
    /// Whether it carries any field of a write (a cancel carries none).
    fn has_write_fields(&self) -> bool {
        self.deliver_at.is_some()
            || self.delay_ms.is_some()
            || self.debounce.is_some()
            || self.payload.is_some()
            || self.delivery.is_some()
            || self.queue.is_some()
            || self.max_attempts.is_some()
            || self.backoff.is_some()
            || self.attempt_timeout_ms.is_some()
            || self.expire_at.is_some()
            || self.max_age_ms.is_some()
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
        rejected(None, None, &ApiError::new(Code::InvalidJson, message))
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
    let count = records.len();
    let mut pipeline = Pipeline::new(engine, scope);
    let now = engine.now();
    for record in records {
        let checked = check_v1(record, now, &mut pipeline.tenants).await;
        pipeline.push(checked);
    }
    let written = match pipeline.write(QuotaMode::PerItem).await {
        Ok(written) => written,
        // `PerItem` answers quota refusals per item; this is a bug.
        Err(error) => {
            tracing::error!(%error, "per-item quota mode refused a whole batch");
            let failed = V1Answer {
                verdict: Verdict::StoreFailed,
                body: json!({ "outcome": "error" }),
            };
            return vec![failed; count];
        }
    };
    if let Some(failure) = &written.store_failure {
        tracing::warn!(error = %failure.error, "an ingested batch failed in the store");
    }
    written
        .outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Outcome::Applied { applied, .. } => v1_applied(&applied),
            // Nothing is answered unchanged without the store.
            Outcome::Unchanged((tenant, id)) => {
                rejected(Some(&tenant), Some(&id), &ApiError::internal())
            }
            Outcome::Rejected {
                echo: (tenant, id),
                error,
            } => rejected(Some(&tenant), Some(&id), &error),
            Outcome::StoreFailed {
                echo: (tenant, id), ..
            } => store_failed(&tenant, &id),
        })
        .collect()
}

/// Checks one record as `PUT` (or `DELETE`) of its event would; the echo is
/// its tenant and id as sent.
/// `now` is when the node accepted the record (its `delay_ms` counts from
/// it).
async fn check_v1(
    record: V1Record,
    now: Timestamp,
    tenants: &mut Tenants<'_>,
) -> Checked<(String, String)> {
    let names = (
        TenantName::new(record.tenant.clone()),
        EventId::new(record.id.clone()),
    );
    let has_write_fields = record.has_write_fields();
    let echo = (record.tenant, record.id);
    let reject = |echo, error| Checked::Rejected { echo, error };
    let (tenant, id) = match names {
        (Ok(tenant), Ok(id)) => (tenant, id),
        (Err(e), _) | (_, Err(e)) => {
            return reject(echo, ApiError::new(Code::InvalidName, e.to_string()));
        }
    };
    let not_found = |tenant: &str| {
        ApiError::new(
            Code::TenantNotFound,
            format!("tenant {tenant:?} is not registered"),
        )
    };
    if !tenants.may_write(&tenant) {
        let error = not_found(&echo.0);
        return reject(echo, error);
    }
    let command = if record.cancel {
        if has_write_fields {
            return reject(
                echo,
                ApiError::new(Code::InvalidRequest, "a cancel carries only tenant and id"),
            );
        }
        EventCommand::Cancel
    } else {
        let settings = SettingsFields {
            queue: record.queue,
            max_attempts: record.max_attempts,
            backoff: record.backoff,
            attempt_timeout_ms: record.attempt_timeout_ms,
            expire_at: record.expire_at,
            max_age_ms: record.max_age_ms,
        };
        let when = When {
            deliver_at: record.deliver_at,
            delay_ms: record.delay_ms,
            debounce: record.debounce,
        };
        let command =
            match crate::v1::events::upsert(when, now, record.payload, record.delivery, settings) {
                Ok(command) => command,
                Err(error) => return reject(echo, error),
            };
        // Writes need a registered tenant; cancels do not (events outlive
        // their tenant's registration).
        let admitted = match tenants.registered(&tenant).await {
            Ok(Some(config)) => crate::v1::events::admit_command(config, &command),
            Ok(None) => Err(not_found(&echo.0)),
            Err(error) => return Checked::StoreFailed { echo, error },
        };
        if let Err(error) = admitted {
            return reject(echo, error);
        }
        command
    };
    Checked::Write {
        echo,
        command: Box::new(KeyedCommand {
            key: EventKey::new(tenant, id),
            command,
            fence: None,
        }),
    }
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

fn store_failed(tenant: &str, id: &str) -> V1Answer {
    V1Answer {
        verdict: Verdict::StoreFailed,
        body: json!({ "tenant": tenant, "id": id, "outcome": "error",
                      "version": null, "error": { "code": Code::StoreUnavailable.as_str(),
                      "message": "the store failed; the change may or may not have been made" } }),
    }
}
