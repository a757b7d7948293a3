//! The OpenAPI 3.1 document's own parts: its info and tags
//! ([`BelfryApi`]), the shapes in [`schema`], and [`finish`]. The paths
//! come from the route table's handlers (their `#[utoipa::path]`
//! annotations), which also serves the document at `GET /openapi.json`.
//!
//! Besides what utoipa derives, [`finish`] adds the Bearer security
//! scheme (API keys `bfy_…`; optional, since a loopback node without keys
//! runs open) and OpenAPI links from each create to its read and cancel,
//! which clients and stateful testers (schemathesis) follow.

use serde_json::{Value, json};
use utoipa::OpenApi;

pub mod schema;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Belfry",
        description = "Durable, multi-tenant scheduler for time-based events: Walmart BigBen's HTTP \
                       API unchanged plus Belfry's own /v1 API. Names in paths are one \
                       percent-encoded segment (`/` as `%2F`). See docs/api.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "bigben", description = "Walmart BigBen's API at its original paths; errors are `{\"message\"}`"),
        (name = "tenants", description = "/v1 tenants; errors are `{\"error\": {\"code\", \"message\"}}`"),
        (name = "events", description = "/v1 one-shot events"),
        (name = "schedules", description = "/v1 recurring schedules"),
        (name = "bulk-actions", description = "/v1 bulk actions: cancel, redrive, pause or resume everything a filter matches, in the background"),
        (name = "leases", description = "/v1 pull workers: claim a pull tenant's due events, heartbeat, complete, fail or release leases (docs/pull.md)"),
        (name = "keys", description = "/v1 API keys and the audit log"),
        (name = "cluster", description = "Cluster view"),
        (name = "health", description = "Probes and this document; no key needed"),
        (name = "console", description = "The web console's page and files; no key needed to load them (the page asks for one)"),
    )
)]
pub(crate) struct BelfryApi;

/// The security scheme's name in the document.
const SECURITY_SCHEME: &str = "api_key";

/// The document of `api` (the info and tags of [`BelfryApi`] with the
/// route table's paths) as JSON, with the security scheme, links and
/// answer shapes utoipa's annotations cannot say.
pub(crate) fn finish(api: &utoipa::openapi::OpenApi) -> Value {
    let mut document = serde_json::to_value(api).unwrap_or_else(|error| {
        // Only a bug in a schema could get here; answer an empty API
        // rather than fail every request.
        tracing::error!(%error, "the OpenAPI document does not serialize");
        json!({"openapi": "3.1.0", "info": {"title": "Belfry", "version": "0"}, "paths": {}})
    });
    add_security(&mut document);
    add_links(&mut document);
    add_schedule_refusals(&mut document);
    document
}

/// Bearer API keys, optional (`{}`) because a node without keys on
/// loopback, or with `auth.mode = "none"`, runs open. Operations that
/// declare `security: [{}]` (probes, `/ping`, this document) keep theirs.
fn add_security(document: &mut Value) {
    document["components"]["securitySchemes"][SECURITY_SCHEME] = json!({
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "bfy_<30 base62 characters><checksum>",
        "description": "An API key (`belfry keys create`, `POST /v1/keys`), sent as \
                        `Authorization: Bearer bfy_...`. See docs/security.md.",
    });
    document["security"] = json!([{ SECURITY_SCHEME: [] }, {}]);
}

/// `(source operationId, response statuses, [(link name, target
/// operationId, parameters)])`.
type LinksFrom = (
    &'static str,
    &'static [&'static str],
    Vec<(&'static str, &'static str, Value)>,
);

/// Links from operations that create something to those that read,
/// change or remove it, with the parameters taken from the request path
/// (or the answer, for keys).
fn add_links(document: &mut Value) {
    let from_path = |names: &[&str]| -> Value {
        names
            .iter()
            .map(|name| (name.to_string(), json!(format!("$request.path.{name}"))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let tenant_and_id = from_path(&["tenant", "id"]);
    let tenant = from_path(&["tenant"]);
    let links: Vec<LinksFrom> = vec![
        (
            "put_event",
            &["200", "201"],
            vec![
                ("GetEvent", "get_event", tenant_and_id.clone()),
                ("EventAttempts", "list_attempts", tenant_and_id.clone()),
                ("CancelEvent", "cancel_event", tenant_and_id.clone()),
            ],
        ),
        (
            "put_tenant",
            &["200", "201"],
            vec![
                ("GetTenant", "get_tenant", tenant.clone()),
                // The id is the client's to choose: only the tenant is linked.
                ("PutEvent", "put_event", tenant.clone()),
                ("ScheduleEvents", "schedule_events", tenant.clone()),
                ("PutSchedule", "put_schedule", tenant.clone()),
                ("ListEvents", "list_events", tenant.clone()),
                ("ListSchedules", "list_schedules", tenant.clone()),
                (
                    "RotateSigningSecret",
                    "rotate_signing_secret",
                    tenant.clone(),
                ),
            ],
        ),
        (
            "put_schedule",
            &["200", "201"],
            vec![
                ("GetSchedule", "get_schedule", tenant_and_id.clone()),
                (
                    "ScheduleOccurrences",
                    "list_occurrences",
                    tenant_and_id.clone(),
                ),
                ("PauseSchedule", "pause_schedule", tenant_and_id.clone()),
                ("ResumeSchedule", "resume_schedule", tenant_and_id.clone()),
                ("DeleteSchedule", "delete_schedule", tenant_and_id.clone()),
            ],
        ),
        (
            "create_bulk_action",
            &["202"],
            vec![
                (
                    "GetBulkAction",
                    "get_bulk_action",
                    json!({ "id": "$response.body#/id" }),
                ),
                (
                    "CancelBulkAction",
                    "cancel_bulk_action",
                    json!({ "id": "$response.body#/id" }),
                ),
            ],
        ),
        (
            "create_key",
            &["201"],
            vec![(
                "RevokeKey",
                "revoke_key",
                json!({ "id": "$response.body#/id" }),
            )],
        ),
        (
            "bigben_schedule",
            // Not 206: its first item may be a rejected one, echoed as sent
            // (an empty or invalid id).
            &["200"],
            vec![
                (
                    "FindEvent",
                    "bigben_find",
                    json!({ "tenant": "$response.body#/0/tenant", "id": "$response.body#/0/id" }),
                ),
                (
                    "DryRunEvent",
                    "bigben_dry_run",
                    json!({ "tenant": "$response.body#/0/tenant", "id": "$response.body#/0/id" }),
                ),
            ],
        ),
        (
            "bigben_create_cron",
            &["200"],
            vec![
                (
                    "GetCron",
                    "bigben_get_cron",
                    json!({ "tenant": "$response.body#/cron/tenant", "id": "$response.body#/cron/id" }),
                ),
                (
                    "DeleteCron",
                    "bigben_delete_cron",
                    json!({
                        "tenant": "$response.body#/cron/tenant",
                        "id": "$response.body#/cron/id",
                        "type": "$response.body#/cron/type",
                    }),
                ),
            ],
        ),
    ];
    for (source, statuses, targets) in links {
        let Some(operation) = operation_mut(document, source) else {
            continue;
        };
        for status in statuses {
            let response = &mut operation["responses"][*status];
            if !response.is_object() {
                continue;
            }
            for (name, operation_id, parameters) in &targets {
                response["links"][*name] = json!({
                    "operationId": operation_id,
                    "parameters": parameters,
                });
            }
        }
    }
}

/// BigBen's schedule answers 400 in two shapes: the per-item answers when
/// every item was REJECTED (as BigBen did), or `{"message"}` when the
/// request as a whole is refused. utoipa's annotation takes one body per
/// status, so the second shape is added here.
fn add_schedule_refusals(document: &mut Value) {
    let Some(operation) = operation_mut(document, "bigben_schedule") else {
        return;
    };
    let schema = &mut operation["responses"]["400"]["content"]["application/json"]["schema"];
    if schema.is_object() {
        *schema = json!({
            "oneOf": [
                { "type": "array", "items": { "$ref": "#/components/schemas/EventResponse" } },
                { "$ref": "#/components/schemas/BigBenError" },
            ]
        });
    }
}

/// The operation whose `operationId` is `id`.
fn operation_mut<'a>(document: &'a mut Value, id: &str) -> Option<&'a mut Value> {
    document["paths"]
        .as_object_mut()?
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .find(|operation| operation["operationId"] == id)
}
