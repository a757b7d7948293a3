//! `/v1/tenants`: register, read, replace and remove tenants.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use belfry_core::auth::AuditAction;
use belfry_core::tenant::{
    BuiltinTarget, DeliveryDefaults, HttpTarget, KafkaKey, KafkaTarget, PullTarget,
};
use belfry_core::{
    EventKey, NotifyTarget, QueueName, SinkConfig, TenantConfig, TenantName, TenantPause,
};
use belfry_sinks::Sinks;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::auth::routes::audit;
use crate::error::{ApiError, Code, V1Error};
use crate::extract::{V1Json, V1Path, deserialize_naming_field};
use crate::v1::signing;
use crate::v1::views::{BackoffBody, TenantView};
use crate::v1::{tenant_name, tenant_not_found};

/// The path of one tenant (get, put, delete).
const TENANT: &str = "/v1/tenants/{tenant}";

/// Body of `PUT /v1/tenants/{tenant}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a tenant object")]
#[schema(example = json!({"sink": {"type": "http", "url": "http://127.0.0.1:9000/hook"}}))]
pub(crate) struct PutTenant {
    /// `{"type": "http", "url", "headers"?, "timeout_ms"?}`,
    /// `{"type": "builtin", "processor": "log"}` or
    /// `{"type": "kafka", "topic", "props", "key"?, "transactional"?}` or
    /// `{"type": "pull", "queues"?}`; http, kafka and pull sinks take the
    /// delivery policy defaults `max_attempts`, `backoff` and `max_age_ms`.
    sink: SinkSpec,
    /// Where the tenant's notices go (failed, expired and missed events,
    /// pauses and resumes, circuit changes): `{"url": "https://..."}` or
    /// `{"kafka_topic": "..."}` (where Kafka is supported); omitted: no
    /// notices.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    notify: Option<Value>,
}

/// The notice target of a `PUT` body, checked like a sink's URL or topic.
fn notify_target(value: Option<Value>, sink: &SinkConfig) -> Result<Option<NotifyTarget>, V1Error> {
    let fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(invalid_sink("notify must be an object")),
    };
    let mut fields = fields.into_iter();
    let target = match (fields.next(), fields.next()) {
        (Some((name, Value::String(url))), None) if name == "url" => NotifyTarget::Url { url },
        (Some((name, Value::String(topic))), None) if name == "kafka_topic" => {
            NotifyTarget::KafkaTopic { kafka_topic: topic }
        }
        _ => {
            return Err(invalid_sink(
                "notify must hold exactly one string field: url or kafka_topic",
            ));
        }
    };
    target
        .validate()
        .map_err(|e| invalid_sink(format!("notify: {e}")))?;
    Sinks::check_supported(&target.sink(sink))
        .map_err(|message| V1Error(ApiError::new(Code::UnsupportedSink, message)))?;
    Ok(Some(target))
}

/// Every tenant the key may see, by name.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TenantList<'a> {
    pub tenants: Vec<TenantView<'a>>,
}

/// A sink as clients write it: `{"type": "http", "url": ..., "headers":
/// {...}, "timeout_ms": ...}` or `{"type": "builtin", "processor": "log"}`
/// (or `{"type": "kafka", "topic": ..., "props": {...}, "key": "event_id"}`
/// where supported; `key` is `event_id` (default), `tenant_event_id` or
/// `none`; `"transactional": true` is the fenced mode), or `{"type":
/// "pull", "max_attempts": 20, "backoff": {...}, "queues": [...]}`
/// (workers claim the events).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, expecting = "a sink object")]
#[schema(as = Sink)]
struct SinkSpec {
    /// `http`, `builtin`, `kafka` or `pull`; the other fields apply to
    /// one type each.
    #[serde(rename = "type")]
    #[schema(value_type = String, pattern = "^(http|builtin|kafka|pull)$")]
    kind: Value,
    // Every field as plain JSON, checked below: a wrong type gets a
    // message naming the field, not serde's (`expected u64`).
    /// `http`: where events are POSTed.
    #[schema(value_type = Option<String>)]
    url: Option<Value>,
    /// `http`: headers sent with each delivery (write-only: answered
    /// `****`).
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    headers: Option<Value>,
    /// `http`: the delivery's timeout.
    #[schema(value_type = Option<u64>, maximum = 18446744073709551615.0)]
    timeout_ms: Option<Value>,
    /// `builtin`: the processor (`log`).
    #[schema(value_type = Option<String>)]
    processor: Option<Value>,
    /// `kafka`: the topic.
    #[schema(value_type = Option<String>)]
    topic: Option<Value>,
    /// `kafka`: producer properties (write-only: answered `****`).
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    props: Option<Value>,
    /// `kafka`: `event_id` (default), `tenant_event_id` or `none`.
    #[schema(value_type = Option<String>)]
    key: Option<Value>,
    /// `kafka`: the fenced, transactional mode.
    #[schema(value_type = Option<bool>)]
    transactional: Option<Value>,
    /// `http`, `kafka`, `pull`: attempts after which an event fails
    /// (default: pull 20, push until the node's backlog limit); an event's
    /// own `max_attempts` comes first.
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    max_attempts: Option<Value>,
    /// `http`, `kafka`, `pull`: the back-off of events that set none
    /// (default: the node's retry policy); read as each attempt comes due.
    #[schema(value_type = Option<BackoffBody>)]
    backoff: Option<Value>,
    /// `http`, `kafka`, `pull`: an event not delivered this long after its
    /// instant ends `expired` (default: no expiry); an event's own
    /// `max_age_ms` and `expire_at` come first.
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 31622400000_u64)]
    max_age_ms: Option<Value>,
    /// `pull` only: the queues its events, schedules and claims may name
    /// (1 to 32 names of 1–64 letters, digits, `_`, `.`, `-`; no repeats),
    /// besides `default`, which is always allowed; omitted: any queue name.
    #[schema(value_type = Option<Vec<String>>, min_items = 1, max_items = 32)]
    queues: Option<Value>,
}

/// A sink's delivery policy defaults (`max_attempts`, `backoff`,
/// `max_age_ms`) as plain JSON.
#[derive(Debug, Default)]
pub(crate) struct DeliverySpec {
    pub max_attempts: Option<Value>,
    pub backoff: Option<Value>,
    pub max_age_ms: Option<Value>,
}

/// A pull sink's fields (the delivery defaults and `queues`) as plain
/// JSON, read by [`pull_target`] for `/v1` and BigBen registrations alike.
#[derive(Debug)]
pub(crate) struct PullSpec {
    pub delivery: DeliverySpec,
    pub queues: Option<Value>,
}

/// Whether a JSON field was given (`null` is as good as left out).
fn given(value: Option<&Value>) -> bool {
    value.is_some_and(|v| !v.is_null())
}

/// A pull sink from its fields (see [`delivery_defaults`]). The queue
/// count and duplicates are checked by [`SinkConfig::validate`]
/// afterwards.
///
/// # Errors
/// A field of the wrong type or out of its range, named.
pub(crate) fn pull_target(spec: PullSpec, prefix: &str) -> Result<PullTarget, String> {
    let delivery = delivery_defaults(spec.delivery, prefix)?;
    let queues = match spec.queues {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .into_iter()
                .map(|item| match item {
                    Value::String(name) => QueueName::new(name)
                        .map_err(|e| format!("{prefix}queues: invalid queue name: {e}")),
                    _ => Err(format!("{prefix}queues must be an array of queue names")),
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(format!("{prefix}queues must be an array of queue names")),
    };
    Ok(PullTarget { delivery, queues })
}

/// A sink's delivery defaults from their fields, each checked as an
/// event's field of the same name is (`backoff` through the same parsing;
/// omitted back-off fields take the same defaults). `prefix` names where
/// the fields are (`sink.` for `/v1`, `props.` for BigBen) in the
/// messages. The ranges are checked by [`SinkConfig::validate`]
/// afterwards.
///
/// # Errors
/// A field of the wrong type, named.
pub(crate) fn delivery_defaults(
    spec: DeliverySpec,
    prefix: &str,
) -> Result<DeliveryDefaults, String> {
    let whole = |value: Option<Value>, field: &str| match value {
        None | Some(Value::Null) => Ok(None),
        Some(value) => crate::extract::whole::u64_of(&value)
            .map(Some)
            .ok_or_else(|| format!("{prefix}{field} must be a whole number")),
    };
    let max_attempts = match spec.max_attempts {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            crate::extract::whole::u64_of(&value)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{prefix}max_attempts must be a whole number"))?,
        ),
    };
    let backoff = match spec.backoff {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            deserialize_naming_field::<BackoffBody, _>(value)
                .map_err(|e| format!("{prefix}backoff: {e}"))?
                .into_backoff()
                .map_err(|e| format!("{prefix}{e}"))?,
        ),
    };
    Ok(DeliveryDefaults {
        max_attempts,
        backoff,
        max_age_ms: whole(spec.max_age_ms, "max_age_ms")?,
    })
}

/// `value` as a string, or a message naming `field`.
fn string_field(value: Option<Value>, field: &str) -> Result<Option<String>, V1Error> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(invalid_sink(format!("{field} must be a string"))),
    }
}

/// `value` as an object of strings, or a message naming `field`.
fn string_map(
    value: Option<Value>,
    field: &str,
) -> Result<Option<BTreeMap<String, String>>, V1Error> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => map
            .into_iter()
            .map(|(name, value)| match value {
                Value::String(text) => Ok((name, text)),
                _ => Err(invalid_sink(format!("{field} values must be strings"))),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(invalid_sink(format!(
            "{field} must be an object of strings"
        ))),
    }
}

/// The delivery policy defaults every delivering sink type takes.
const DELIVERY_FIELDS: &[&str] = &["max_attempts", "backoff", "max_age_ms"];

fn invalid_sink(message: impl Into<String>) -> V1Error {
    V1Error(ApiError::new(Code::InvalidSink, message))
}

impl SinkSpec {
    fn into_config(self) -> Result<SinkConfig, V1Error> {
        let SinkSpec {
            kind,
            url,
            headers,
            timeout_ms,
            processor,
            topic,
            props,
            key,
            transactional,
            max_attempts,
            backoff,
            max_age_ms,
            queues,
        } = self;
        let delivery_given = [
            ("max_attempts", given(max_attempts.as_ref())),
            ("backoff", given(backoff.as_ref())),
            ("max_age_ms", given(max_age_ms.as_ref())),
        ];
        let queues_given = given(queues.as_ref());
        let delivery = DeliverySpec {
            max_attempts,
            backoff,
            max_age_ms,
        };
        let kind = string_field(Some(kind), "sink.type")?.unwrap_or_default();
        let url = string_field(url, "sink.url")?;
        let headers = string_map(headers, "sink.headers")?;
        let timeout_ms = match timeout_ms {
            None | Some(Value::Null) => None,
            Some(value) => Some(crate::extract::whole::u64_of(&value).ok_or_else(|| {
                invalid_sink("sink.timeout_ms must be a whole number of milliseconds")
            })?),
        };
        let processor = string_field(processor, "sink.processor")?;
        let topic = string_field(topic, "sink.topic")?;
        let props = string_map(props, "sink.props")?;
        let key = match string_field(key, "sink.key")? {
            None => None,
            Some(text) => Some(KafkaKey::parse(&text).ok_or_else(|| {
                invalid_sink("sink.key must be event_id, tenant_event_id or none")
            })?),
        };
        let transactional = match transactional {
            None | Some(Value::Null) => None,
            Some(Value::Bool(on)) => Some(on),
            Some(_) => return Err(invalid_sink("sink.transactional must be true or false")),
        };
        let given = [
            ("url", url.is_some()),
            ("headers", headers.is_some()),
            ("timeout_ms", timeout_ms.is_some()),
            ("processor", processor.is_some()),
            ("topic", topic.is_some()),
            ("props", props.is_some()),
            ("key", key.is_some()),
            ("transactional", transactional.is_some()),
        ]
        .into_iter()
        .chain(delivery_given)
        .chain([("queues", queues_given)]);
        let given: Vec<_> = given.collect();
        // Refuses the first field given that `kind` does not use (one not
        // in `allowed`).
        let only = |allowed: &[&str]| -> Result<(), V1Error> {
            let stray = given
                .iter()
                .find(|(name, present)| *present && !allowed.contains(name))
                .map(|(name, _)| *name);
            match stray {
                Some(name) => Err(invalid_sink(format!(
                    "field {name} does not apply to sink type {kind}"
                ))),
                None => Ok(()),
            }
        };
        let sink = match kind.as_str() {
            "http" => {
                only(&[&["url", "headers", "timeout_ms"], DELIVERY_FIELDS].concat())?;
                SinkConfig::Http(HttpTarget {
                    url: url.ok_or_else(|| invalid_sink("sink.url is required for type http"))?,
                    headers: headers.unwrap_or_default(),
                    timeout_ms,
                    delivery: delivery_defaults(delivery, "sink.").map_err(invalid_sink)?,
                })
            }
            "builtin" => {
                only(&["processor"])?;
                SinkConfig::Builtin(BuiltinTarget {
                    processor: processor.ok_or_else(|| {
                        invalid_sink("sink.processor is required for type builtin")
                    })?,
                })
            }
            "kafka" => {
                only(&[&["topic", "props", "key", "transactional"], DELIVERY_FIELDS].concat())?;
                SinkConfig::Kafka(KafkaTarget {
                    topic: topic
                        .ok_or_else(|| invalid_sink("sink.topic is required for type kafka"))?,
                    props: props.unwrap_or_default(),
                    key: key.unwrap_or_default(),
                    transactional: transactional.unwrap_or(false),
                    delivery: delivery_defaults(delivery, "sink.").map_err(invalid_sink)?,
                })
            }
            "pull" => {
                only(&[DELIVERY_FIELDS, &["queues"]].concat())?;
                let spec = PullSpec { delivery, queues };
                SinkConfig::Pull(pull_target(spec, "sink.").map_err(invalid_sink)?)
            }
            other => {
                return Err(invalid_sink(format!(
                    "unknown sink type {other:?}; expected http, builtin, kafka or pull"
                )));
            }
        };
        sink.validate().map_err(|e| invalid_sink(e.to_string()))?;
        Sinks::check_supported(&sink)
            .map_err(|message| V1Error(ApiError::new(Code::UnsupportedSink, message)))?;
        Sinks::check_settings(&sink).map_err(invalid_sink)?;
        Ok(sink)
    }
}

/// Every tenant for admins; a tenant key sees its own tenant only.
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "tenants",
    operation_id = "list_tenants",
    summary = "Every tenant the key may see",
    responses(
        (status = 200, description = "Tenants by name", body = TenantList),
        (status = 400, description = "Bad input", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1KeyErrors
    )
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    principal: Principal,
) -> Result<Response, V1Error> {
    let store = state.engine.store();
    let tenants = store.list_tenants().await?;
    let pauses: BTreeMap<TenantName, TenantPause> =
        store.list_tenant_pauses().await?.into_iter().collect();
    let tenants = tenants
        .iter()
        .filter(|t| principal.sees(&t.name))
        .map(|t| TenantView::of(t, pauses.get(&t.name)).with_circuit(t, &state.engine))
        .collect();
    Ok(Json(TenantList { tenants }).into_response())
}

#[utoipa::path(
    get,
    path = TENANT,
    tag = "tenants",
    operation_id = "get_tenant",
    summary = "A tenant",
    params(crate::openapi::schema::TenantPath),
    responses(
        (status = 200, description = "The tenant", body = TenantView),
        crate::openapi::schema::V1InputErrors
    )
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    V1Path(tenant): V1Path<String>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let store = state.engine.store();
    let Some(tenant) = store.get_tenant(&name).await? else {
        return Err(tenant_not_found(&name));
    };
    let pause = store.get_tenant_pause(&name).await?;
    let view = TenantView::of(&tenant, pause.as_ref()).with_circuit(&tenant, &state.engine);
    Ok(Json(view).into_response())
}

/// Registers (201) or replaces (200) a tenant. A tenant without signing
/// secrets gets one, answered this once as `signing_secret`.
#[utoipa::path(
    put,
    path = TENANT,
    tag = "tenants",
    operation_id = "put_tenant",
    summary = "Register (201) or replace (200) a tenant",
    params(crate::openapi::schema::TenantPath),
    request_body(content = PutTenant, content_type = "application/json"),
    responses(
        (status = 201, description = "Registered; the answer carries signing_secret once", body = TenantView),
        (status = 200, description = "Replaced", body = TenantView),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn put(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(tenant): V1Path<String>,
    V1Json(body): V1Json<PutTenant>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let sink = body.sink.into_config()?;
    let notify = notify_target(body.notify, &sink)?;
    state
        .engine
        .sinks()
        .check_egress(&sink)
        .await
        .map_err(invalid_sink)?;
    if let Some(target) = &notify {
        state
            .engine
            .sinks()
            .check_egress(&target.sink(&sink))
            .await
            .map_err(|e| invalid_sink(format!("notify: {e}")))?;
    }
    let store = state.engine.store();
    let existing = store.get_tenant(&name).await?;
    let existed = existing.is_some();
    let (secrets, new_secret) = signing::for_registration(existing.as_ref());
    let tenant = TenantConfig {
        name: name.clone(),
        sink,
        signing: Some(secrets),
        notify,
    };
    state.engine.tenants().put(tenant.clone()).await?;
    // A replaced tenant keeps its pause: the answer shows it.
    let pause = match existed {
        true => store.get_tenant_pause(&name).await?,
        false => None,
    };
    tracing::info!(tenant = %name, replaced = existed, "tenant registered");
    let action = if existed {
        AuditAction::TenantChanged
    } else {
        AuditAction::TenantRegistered
    };
    audit(&state, &principal, action, Some(&name), None).await;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let answer = TenantView {
        signing_secret: new_secret,
        ..TenantView::of(&tenant, pause.as_ref()).with_circuit(&tenant, &state.engine)
    };
    Ok((status, Json(answer)).into_response())
}

/// Removes a tenant, and revokes the API keys scoped to it, so that a new
/// tenant of the same name starts empty and no old key works for it.
///
/// Refused (`409 tenant_not_empty`) while the tenant holds any event
/// record or schedule: they would otherwise outlive it and belong to the
/// next tenant of that name. Emptying a tenant is bounded work done by
/// bulk actions (cancel, then delete) and schedule deletes, not by one
/// request.
#[utoipa::path(
    delete,
    path = TENANT,
    tag = "tenants",
    operation_id = "delete_tenant",
    summary = "Remove an empty tenant and revoke its keys",
    params(crate::openapi::schema::TenantPath),
    responses(
        (status = 204, description = "Removed; its keys are revoked"),
        (status = 409, description = "tenant_not_empty: it still holds events or schedules", body = crate::openapi::schema::V1Error),
        crate::openapi::schema::V1BodyErrors
    )
)]
pub(crate) async fn delete(
    State(state): State<ApiState>,
    principal: Principal,
    V1Path(tenant): V1Path<String>,
) -> Result<Response, V1Error> {
    let name = tenant_name(tenant)?;
    let store = state.engine.store();
    let Some(config) = store.get_tenant(&name).await? else {
        return Err(tenant_not_found(&name));
    };
    // Deleted schedules leave finished engine-internal records; they go
    // first, so that nothing of this tenant outlives it.
    let records = leftovers(&state, &name).await?;
    if !records.is_empty() {
        store.delete_finished(&records).await?;
    }
    if !state.engine.tenants().delete(&name).await? {
        return Err(tenant_not_found(&name));
    }
    // A write that passed its tenant check just before the delete may land
    // after it; such an event would belong to the next tenant of this
    // name, so the tenant is put back and the delete refused.
    match leftovers(&state, &name).await {
        Ok(left) if left.is_empty() => {}
        Ok(_) => {
            state.engine.tenants().put(config).await?;
            return Err(not_empty(&name));
        }
        Err(refusal) => {
            state.engine.tenants().put(config).await?;
            return Err(refusal);
        }
    }
    let revoked = revoke_keys(&state, &name).await?;
    tracing::info!(tenant = %name, revoked_keys = revoked.len(), "tenant removed");
    audit(
        &state,
        &principal,
        AuditAction::TenantDeleted,
        Some(&name),
        None,
    )
    .await;
    for key in revoked {
        audit(
            &state,
            &principal,
            AuditAction::KeyRevoked,
            Some(&name),
            Some(key),
        )
        .await;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Most records read per page while checking that a tenant is empty.
const EMPTY_CHECK_PAGE: usize = 500;

/// The finished engine-internal records of `name` (what deleted schedules
/// leave), or `409 tenant_not_empty` if it holds any client event (of any
/// status) or a live schedule. Internal ids sort before client ids, so a
/// tenant with events is refused after one page at most.
async fn leftovers(state: &ApiState, name: &TenantName) -> Result<Vec<EventKey>, V1Error> {
    let mut leftovers = Vec::new();
    let mut after = None;
    loop {
        let page = state
            .engine
            .store()
            .list_events(belfry_store::ListEventsParams {
                tenant: name.clone(),
                status: None,
                from: None,
                to: None,
                after: after.take(),
                limit: EMPTY_CHECK_PAGE,
            })
            .await?;
        for record in &page {
            if !record.key.id.is_internal() || record.status.is_pending() {
                return Err(not_empty(name));
            }
            leftovers.push(record.key.clone());
        }
        if page.len() < EMPTY_CHECK_PAGE {
            return Ok(leftovers);
        }
        after = page.last().map(|record| record.key.id.clone());
    }
}

fn not_empty(name: &TenantName) -> V1Error {
    V1Error(ApiError::new(
        Code::TenantNotEmpty,
        format!(
            "tenant {name} still holds events or schedules; cancel its pending events and \
             delete its finished ones (bulk actions cancel, then delete) and delete its \
             schedules first"
        ),
    ))
}

/// Deletes every API key scoped to `name`; answers their ids.
async fn revoke_keys(state: &ApiState, name: &TenantName) -> Result<Vec<String>, V1Error> {
    let store = state.engine.store();
    let mut revoked = Vec::new();
    for key in store.list_api_keys().await? {
        if key.tenant.as_ref() != Some(name) {
            continue;
        }
        if let Some(removed) = store.delete_api_key(&key.id).await? {
            state.auth.key_revoked(&removed);
            revoked.push(key.id.to_string());
        }
    }
    Ok(revoked)
}
