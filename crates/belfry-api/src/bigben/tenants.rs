//! `POST /events/tenant/register` and `GET /events/tenants`, in BigBen's
//! `ProcessorConfig` shape:
//! `{"tenant": "...", "type": "HTTP" | "MESSAGING" | "CUSTOM_CLASS", "props": {...}}`,
//! and Belfry's own `"PULL"` (`props`: `{"max_attempts"?}`) for pull tenants.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use belfry_core::Backoff;
use belfry_core::auth::AuditAction;
use belfry_core::tenant::{BuiltinTarget, HttpTarget, KafkaKey, KafkaTarget};
use belfry_core::{SinkConfig, TenantConfig, TenantName};
use belfry_sinks::Sinks;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::ApiState;
use crate::auth::Principal;
use crate::auth::routes::audit;
use crate::error::{ApiError, BigBenError, Code};
use crate::extract::BigBenJson;
use crate::v1::tenants::{DeliverySpec, PullSpec, pull_target};

/// BigBen's `ProcessorConfig`; fields optional so that a missing one gets
/// BigBen's message instead of a parser error, and plain JSON so that a
/// wrong type gets a message naming the field (not serde's "invalid type:
/// integer, expected a string").
#[derive(Debug, Deserialize, ToSchema)]
#[serde(expecting = "a ProcessorConfig object")]
#[schema(example = json!({"tenant": "shop/orders", "type": "HTTP", "props": {"url": "http://127.0.0.1:9000/hook"}}))]
pub(crate) struct ProcessorConfig {
    /// 1 to 200 bytes, no control characters.
    #[schema(value_type = String, required = true, min_length = 1, max_length = 200, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$")]
    tenant: Option<Value>,
    /// `HTTP`, `MESSAGING`, `CUSTOM_CLASS` or Belfry's `PULL`.
    #[serde(rename = "type")]
    #[schema(value_type = String, required = true, pattern = "^(HTTP|MESSAGING|CUSTOM_CLASS|PULL)$")]
    kind: Option<Value>,
    /// `HTTP`: `url`, `headers`?, `timeout_ms`?; `MESSAGING`: `topic` and
    /// producer settings; `CUSTOM_CLASS`: `eventProcessorClass`; `PULL`:
    /// `max_attempts`?, `backoff`?, `queues`?.
    #[schema(value_type = Object, required = true)]
    props: Option<Value>,
}

/// A tenant in BigBen's `ProcessorConfig` shape.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ProcessorConfigView)]
pub(crate) struct ConfigView {
    tenant: String,
    /// `HTTP`, `MESSAGING`, `CUSTOM_CLASS` or `PULL`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// By type, see `Props`.
    #[schema(value_type = Object)]
    props: Props,
}

/// A `ProcessorConfig`'s `props` by type; write-only values answer as
/// `****`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Props {
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// `topic` and the producer settings.
    Messaging(BTreeMap<String, String>),
    CustomClass {
        #[serde(rename = "eventProcessorClass")]
        event_processor_class: String,
    },
    Pull {
        max_attempts: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        backoff: Option<Backoff>,
        #[serde(skip_serializing_if = "Option::is_none")]
        queues: Option<Vec<belfry_core::QueueName>>,
    },
}

/// Tenant name → its `ProcessorConfig`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(transparent)]
pub(crate) struct Tenants(BTreeMap<String, ConfigView>);

/// Registers (or replaces) a tenant; answers every tenant's config the
/// key may see (masked). A tenant key registers only its own tenant:
/// another one answers as if it did not exist.
///
/// A tenant without a webhook signing secret gets one, answered this once
/// in the [`SIGNING_SECRET_HEADER`] response header: BigBen's body (a map
/// of tenant → `ProcessorConfig`) keeps its exact shape, so no BigBen
/// client can trip over a new field.
#[utoipa::path(
    post,
    path = "/events/tenant/register",
    tag = "bigben",
    operation_id = "bigben_register_tenant",
    summary = "Register or replace a tenant (BigBen ProcessorConfig)",
    request_body(content = ProcessorConfig, content_type = "application/json"),
    responses(
        (status = 200, description = "Every tenant the key may see; a new signing secret in the webhook-signing-secret header", body = Tenants),
        (status = 404, description = "Not found", body = crate::openapi::schema::BigBenError),
        crate::openapi::schema::BigBenWriteErrors,
        crate::openapi::schema::BigBenBodyErrors
    )
)]
pub(crate) async fn register(
    State(state): State<ApiState>,
    principal: Principal,
    BigBenJson(config): BigBenJson<ProcessorConfig>,
) -> Result<Response, BigBenError> {
    let mut tenant = parse_config(config).map_err(BigBenError)?;
    let name = tenant.name.clone();
    if !principal.may_write(&name) {
        return Err(BigBenError(ApiError::tenant_not_found(name.as_str())));
    }
    state
        .engine
        .sinks()
        .check_egress(&tenant.sink)
        .await
        .map_err(|message| BigBenError(invalid(message)))?;
    let store = state.engine.store();
    let existing = store.get_tenant(&name).await?;
    let existed = existing.is_some();
    let (secrets, new_secret) = crate::v1::signing::for_registration(existing.as_ref());
    tenant.signing = Some(secrets);
    // BigBen clients re-register at every start and know no notice target:
    // the one set through `/v1` stays.
    tenant.notify = existing.and_then(|existing| existing.notify);
    state.engine.tenants().put(tenant).await?;
    tracing::info!(tenant = %name, "tenant registered (BigBen API)");
    let action = if existed {
        AuditAction::TenantChanged
    } else {
        AuditAction::TenantRegistered
    };
    audit(&state, &principal, action, Some(&name), None).await;
    let answer = list(State(state), principal).await?;
    Ok(match new_secret.map(HeaderValue::try_from) {
        Some(Ok(secret)) => ([(SIGNING_SECRET_HEADER, secret)], answer).into_response(),
        // A generated secret is base64: always a valid header value.
        Some(Err(_)) | None => answer.into_response(),
    })
}

/// The response header of a BigBen registration that generated the
/// tenant's webhook signing secret.
pub const SIGNING_SECRET_HEADER: HeaderName = HeaderName::from_static("webhook-signing-secret");

/// Every tenant the key may see → its config (masked).
#[utoipa::path(
    get,
    path = "/events/tenants",
    tag = "bigben",
    operation_id = "bigben_list_tenants",
    summary = "Every tenant the key may see",
    responses(
        (status = 200, description = "Tenant to ProcessorConfig", body = Tenants),
        crate::openapi::schema::BigBenErrors
    )
)]
pub(crate) async fn list(
    State(state): State<ApiState>,
    principal: Principal,
) -> Result<Json<Tenants>, BigBenError> {
    let tenants = state.engine.store().list_tenants().await?;
    Ok(Json(Tenants(
        tenants
            .iter()
            .filter(|t| principal.sees(&t.name))
            .map(|t| (t.name.as_str().to_string(), render(t)))
            .collect(),
    )))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(Code::InvalidSink, message)
}

fn parse_config(config: ProcessorConfig) -> Result<TenantConfig, ApiError> {
    let text = |value: Option<Value>, field: &str| match value {
        None | Some(Value::Null) => Err(invalid(format!("{field} must not be null"))),
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(invalid(format!("{field} must be a string"))),
    };
    let tenant_text = text(config.tenant, "tenant")?;
    let name = TenantName::new(tenant_text)
        .map_err(|e| ApiError::new(Code::InvalidName, e.to_string()))?;
    let kind = text(config.kind, "type")?;
    let mut props = match config.props {
        None | Some(Value::Null) => return Err(invalid("props must not be null")),
        Some(Value::Object(props)) => props,
        Some(_) => return Err(invalid("props must be an object")),
    };
    let sink = match kind.as_str() {
        "HTTP" => {
            let url = take_string(&mut props, "url")?
                .ok_or_else(|| invalid("props.url is required for type HTTP"))?;
            let headers = match props.remove("headers") {
                None | Some(Value::Null) => BTreeMap::new(),
                Some(Value::Object(map)) => map
                    .into_iter()
                    .map(|(name, value)| Ok((name, scalar_text(value, "props.headers")?)))
                    .collect::<Result<_, ApiError>>()?,
                Some(_) => return Err(invalid("props.headers must be an object")),
            };
            let timeout_ms = match props.remove("timeout_ms") {
                None | Some(Value::Null) => None,
                Some(value) => Some(
                    crate::extract::whole::u64_of(&value)
                        .ok_or_else(|| invalid("props.timeout_ms must be a whole number"))?,
                ),
            };
            SinkConfig::Http(HttpTarget {
                url,
                headers,
                timeout_ms,
                delivery: Default::default(),
            })
        }
        "MESSAGING" => {
            let topic = take_string(&mut props, "topic")?
                .ok_or_else(|| invalid("props.topic is required for type MESSAGING"))?;
            let settings = props
                .into_iter()
                .map(|(name, value)| Ok((name, scalar_text(value, "props")?)))
                .collect::<Result<_, ApiError>>()?;
            SinkConfig::Kafka(KafkaTarget {
                topic,
                props: settings,
                key: KafkaKey::EventId,
                transactional: false,
                delivery: Default::default(),
            })
        }
        "CUSTOM_CLASS" => {
            let processor = take_string(&mut props, "eventProcessorClass")?.ok_or_else(|| {
                invalid("props.eventProcessorClass is required for type CUSTOM_CLASS")
            })?;
            SinkConfig::Builtin(BuiltinTarget { processor })
        }
        "PULL" => {
            // Belfry's own pull fields; BigBen's contract has no delivery
            // policy beyond them (no `max_age_ms` here).
            let spec = PullSpec {
                delivery: DeliverySpec {
                    max_attempts: props.remove("max_attempts"),
                    backoff: props.remove("backoff"),
                    max_age_ms: None,
                },
                queues: props.remove("queues"),
            };
            if let Some(name) = props.keys().next() {
                return Err(invalid(format!("props.{name} does not apply to type PULL")));
            }
            SinkConfig::Pull(pull_target(spec, "props.").map_err(invalid)?)
        }
        other => {
            return Err(invalid(format!(
                "unknown type {other:?}; expected HTTP, MESSAGING, CUSTOM_CLASS or PULL"
            )));
        }
    };
    sink.validate().map_err(|e| invalid(e.to_string()))?;
    Sinks::check_supported(&sink)
        .map_err(|message| ApiError::new(Code::UnsupportedSink, message))?;
    Sinks::check_settings(&sink).map_err(invalid)?;
    Ok(TenantConfig {
        name,
        sink,
        signing: None,
        notify: None,
    })
}

fn take_string(props: &mut Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match props.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(invalid(format!("props.{name} must be a string"))),
    }
}

/// Producer settings and header values are strings; numbers and booleans
/// are accepted as their JSON text (`"acks": 1` → `"1"`).
fn scalar_text(value: Value, what: &str) -> Result<String, ApiError> {
    match value {
        Value::String(text) => Ok(text),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(invalid(format!(
            "{what} values must be strings, numbers or booleans"
        ))),
    }
}

/// A tenant in BigBen's `ProcessorConfig` shape, write-only secrets
/// masked ([`crate::auth::mask`]).
pub(crate) fn render(tenant: &TenantConfig) -> ConfigView {
    let (kind, props) = match crate::auth::mask::sink(&tenant.sink) {
        SinkConfig::Http(target) => (
            "HTTP",
            Props::Http {
                url: target.url,
                headers: target.headers,
                timeout_ms: target.timeout_ms,
            },
        ),
        SinkConfig::Kafka(target) => {
            let mut props = target.props;
            props.insert("topic".into(), target.topic);
            ("MESSAGING", Props::Messaging(props))
        }
        SinkConfig::Builtin(target) => (
            "CUSTOM_CLASS",
            Props::CustomClass {
                event_processor_class: target.processor,
            },
        ),
        // BigBen has no pull type: shown under Belfry's own name.
        SinkConfig::Pull(target) => (
            "PULL",
            Props::Pull {
                max_attempts: target
                    .delivery
                    .max_attempts
                    .unwrap_or(belfry_core::tenant::DEFAULT_MAX_ATTEMPTS),
                backoff: target.delivery.backoff,
                queues: target.queues,
            },
        ),
    };
    ConfigView {
        tenant: tenant.name.as_str().to_string(),
        kind,
        props,
    }
}
