//! `GET /openapi.json`: the OpenAPI 3.1 document of every route, built from
//! the handlers' `#[utoipa::path]` annotations: each body's schema is the
//! view the handler serializes or the struct it parses (`ToSchema` next to
//! the handler), the shared envelopes are in [`schema`]. Public (no key):
//! it describes the API, it holds no data.
//!
//! Besides what utoipa derives, [`document`] adds the Bearer security
//! scheme (API keys `bfy_…`; optional, since a loopback node without keys
//! runs open) and OpenAPI links from each create to its read and cancel,
//! which clients and stateful testers (schemathesis) follow.

use std::sync::OnceLock;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use utoipa::OpenApi;

use crate::ApiState;

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
    paths(
        crate::health::live,
        crate::health::ready,
        crate::bigben::ping,
        crate::bigben::cluster,
        crate::bigben::tenants::register,
        crate::bigben::tenants::list,
        crate::bigben::schedule::schedule,
        crate::bigben::lookup::find,
        crate::bigben::lookup::dry_run,
        crate::bigben::cron::create,
        crate::bigben::cron::get,
        crate::bigben::cron::delete,
        crate::v1::tenants::list,
        crate::v1::tenants::get,
        crate::v1::tenants::put,
        crate::v1::tenants::delete,
        crate::v1::signing::rotate,
        crate::v1::events::list,
        crate::v1::events::batch,
        crate::v1::events::get,
        crate::v1::events::put,
        crate::v1::events::cancel,
        crate::v1::events::attempts,
        crate::v1::events::redrive,
        crate::v1::events::delete,
        crate::v1::schedules::list,
        crate::v1::schedules::get,
        crate::v1::schedules::put,
        crate::v1::schedules::delete,
        crate::v1::schedules::pause,
        crate::v1::schedules::resume,
        crate::v1::schedules::occurrences,
        crate::v1::schedules::preview,
        crate::v1::bulk::create,
        crate::v1::bulk::list,
        crate::v1::bulk::get,
        crate::v1::bulk::cancel,
        crate::v1::leases::claim,
        crate::v1::leases::heartbeat,
        crate::v1::leases::complete,
        crate::v1::leases::fail,
        crate::v1::leases::release,
        crate::v1::lease_batch::complete_batch,
        crate::cluster_status,
        crate::metrics::scrape,
        crate::auth::routes::list,
        crate::auth::routes::create,
        crate::auth::routes::revoke,
        crate::auth::routes::audit_log,
        crate::auth::routes::whoami,
        crate::console::page,
        crate::console::file,
        openapi_json,
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
struct BelfryApi;

/// The security scheme's name in the document.
const SECURITY_SCHEME: &str = "api_key";

/// The document as JSON, built once.
pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut document = serde_json::to_value(BelfryApi::openapi()).unwrap_or_else(|error| {
            // Only a bug in a schema could get here; answer an empty API
            // rather than fail every request.
            tracing::error!(%error, "the OpenAPI document does not serialize");
            json!({"openapi": "3.1.0", "info": {"title": "Belfry", "version": "0"}, "paths": {}})
        });
        add_security(&mut document);
        add_links(&mut document);
        add_schedule_refusals(&mut document);
        document
    })
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

/// `(path, method, response statuses, [(link name, target operationId,
/// parameters)])`.
type LinksFrom = (
    &'static str,
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
            "/v1/tenants/{tenant}/events/{id}",
            "put",
            &["200", "201"],
            vec![
                ("GetEvent", "get_event", tenant_and_id.clone()),
                ("EventAttempts", "list_attempts", tenant_and_id.clone()),
                ("CancelEvent", "cancel_event", tenant_and_id.clone()),
            ],
        ),
        (
            "/v1/tenants/{tenant}",
            "put",
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
            "/v1/tenants/{tenant}/schedules/{id}",
            "put",
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
            "/v1/bulk-actions",
            "post",
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
            "/v1/keys",
            "post",
            &["201"],
            vec![(
                "RevokeKey",
                "revoke_key",
                json!({ "id": "$response.body#/id" }),
            )],
        ),
        (
            "/events/schedule",
            "post",
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
            "/cron",
            "post",
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
    for (path, method, statuses, targets) in links {
        for status in statuses {
            let response = &mut document["paths"][path][method]["responses"][*status];
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
    let schema = &mut document["paths"]["/events/schedule"]["post"]["responses"]["400"]["content"]
        ["application/json"]["schema"];
    if schema.is_object() {
        *schema = json!({
            "oneOf": [
                { "type": "array", "items": { "$ref": "#/components/schemas/EventResponse" } },
                { "$ref": "#/components/schemas/BigBenError" },
            ]
        });
    }
}

pub(crate) fn routes() -> Router<ApiState> {
    Router::new().route("/openapi.json", axum::routing::get(openapi_json))
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "health",
    operation_id = "openapi_document",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json", body = Object))
)]
pub(crate) async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::Json(document()).into_response().into_body(),
    )
        .into_response()
}
