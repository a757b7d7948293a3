//! The route table: every route once, with who may call it.
//!
//! Each entry is a handler, whose `#[utoipa::path]` gives its path and
//! method, and its [`Rule`]. The axum router, the rules that
//! [`authorize`](crate::gate::authorize) applies and the
//! OpenAPI paths are all built from [`table`], so none of them can miss a
//! route or disagree on its path.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use axum::http::{Method, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Extension, Router};
use serde_json::{Value, json};
use tower_http::catch_panic::CatchPanicLayer;
use utoipa::OpenApi;
use utoipa::openapi::path::PathItem;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use crate::auth::rules::{Hide, Keys, Rule, RuleBook};
use crate::error::{ApiError, Code, family_error};
use crate::gate::Gate;
use crate::{ApiState, answers, auth, bigben, cluster, console, health, metrics, openapi, v1};

/// The whole HTTP API: BigBen's routes at their original paths and the
/// native API under `/v1`, behind authentication (every request) and
/// authorization (every route, by its [`Rule`]).
pub fn router(state: ApiState) -> Router {
    use axum::middleware::from_fn_with_state;
    let Table { api, book } = table();
    let (routes, _) = api.split_for_parts();
    let gate = Gate {
        state: state.clone(),
        rules: Arc::new(book),
    };
    routes
        .route_layer(from_fn_with_state(gate.clone(), crate::gate::authorize))
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(from_fn_with_state(gate, crate::gate::authenticate))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(from_fn_with_state(state.clone(), metrics::record_request))
        .layer(Extension(answers::AnswerBudget::new(&state.options)))
        .with_state(state)
}

/// Every route, each with its rule. A `{tenant}` path's reads and writes
/// differ only in whether the key must be a writer.
fn table() -> Table {
    let tenant_read = Rule::PathTenant {
        write: false,
        hide: Hide::V1,
    };
    let tenant_write = Rule::PathTenant {
        write: true,
        hide: Hide::V1,
    };
    Table::default()
        // Probes, this document and the console: no key.
        .route(routes!(health::live), Rule::Public)
        .route(
            routes!(health::ready).map(|route| route.layer(health::probe())),
            Rule::Public,
        )
        .route(routes!(openapi_json), Rule::Public)
        .route(routes!(console::page), Rule::Public)
        .undocumented(
            console::PAGE_WITH_SLASH,
            Method::GET,
            axum::routing::get(console::page),
            Rule::Public,
        )
        .route(routes!(console::file), Rule::Public)
        // BigBen's API.
        .route(routes!(bigben::ping), Rule::Public)
        .route(routes!(bigben::cluster), Rule::Admin)
        .route(routes!(bigben::tenants::register), Rule::AnyWriter)
        .route(routes!(bigben::tenants::list), Rule::Any)
        .route(routes!(bigben::schedule::schedule), Rule::AnyWriter)
        .route(
            routes!(bigben::lookup::find),
            Rule::QueryTenant {
                write: false,
                hide: Hide::BigBenStatus,
            },
        )
        .route(
            routes!(bigben::lookup::dry_run),
            Rule::QueryTenant {
                write: true,
                hide: Hide::BigBenStatus,
            },
        )
        .route(routes!(bigben::cron::create), Rule::AnyWriter)
        .route(
            routes!(bigben::cron::get),
            Rule::PathTenant {
                write: false,
                hide: Hide::BigBenEmpty,
            },
        )
        .route(
            routes!(bigben::cron::delete),
            Rule::PathTenant {
                write: true,
                hide: Hide::BigBenNoCron,
            },
        )
        // Tenants.
        .route(routes!(v1::tenants::list), Rule::Any)
        .route(routes!(v1::tenants::get), tenant_read)
        .route(routes!(v1::tenants::put), tenant_write)
        .route(routes!(v1::tenants::delete), tenant_write)
        .route(routes!(v1::signing::rotate), tenant_write)
        .route(routes!(v1::pause::pause), tenant_write)
        .route(routes!(v1::pause::resume), tenant_write)
        // Events.
        .route(routes!(v1::events::list), tenant_read)
        .route(routes!(v1::events::batch), tenant_write)
        .route(routes!(v1::events::get), tenant_read)
        .route(routes!(v1::events::put), tenant_write)
        .route(routes!(v1::events::cancel), tenant_write)
        .route(routes!(v1::events::attempts), tenant_read)
        .route(routes!(v1::events::redrive), tenant_write)
        .route(routes!(v1::events::delete), tenant_write)
        // Another node's question (a signed forward only; see its module).
        .undocumented(
            v1::previous::PATH,
            Method::POST,
            axum::routing::post(v1::previous::delivery_started),
            tenant_write,
        )
        // Schedules.
        .route(routes!(v1::schedules::list), tenant_read)
        .route(routes!(v1::schedules::get), tenant_read)
        .route(routes!(v1::schedules::put), tenant_write)
        .route(routes!(v1::schedules::delete), tenant_write)
        .route(routes!(v1::schedules::pause), tenant_write)
        .route(routes!(v1::schedules::resume), tenant_write)
        .route(routes!(v1::schedules::occurrences), tenant_read)
        .route(routes!(v1::schedules::preview), Rule::Any)
        // Bulk actions.
        .route(
            routes!(v1::bulk::list),
            Rule::QueryTenant {
                write: false,
                hide: Hide::V1,
            },
        )
        .route(routes!(v1::bulk::create), Rule::AnyWriter)
        .route(routes!(v1::bulk::get), Rule::Any)
        .route(routes!(v1::bulk::cancel), Rule::AnyWriter)
        // Pull workers.
        .route(routes!(v1::leases::claim), Rule::PullTenant)
        .route(routes!(v1::lease_batch::complete_batch), Rule::PullTenant)
        .route(routes!(v1::leases::heartbeat), Rule::Worker)
        .route(routes!(v1::leases::complete), Rule::Worker)
        .route(routes!(v1::leases::fail), Rule::Worker)
        .route(routes!(v1::leases::release), Rule::Worker)
        // Keys, audit, cluster, metrics.
        .route(routes!(auth::routes::list), Rule::Any)
        .route(routes!(auth::routes::create), Rule::Admin)
        .route(routes!(auth::routes::revoke), Rule::Admin)
        .route(routes!(auth::routes::audit_log), Rule::Admin)
        .route_with_keys(routes!(auth::routes::whoami), Rule::Public, Keys::Optional)
        .route(routes!(cluster::status), Rule::Admin)
        .route(routes!(metrics::scrape), Rule::Admin)
}

/// The routes as they are being collected.
#[derive(Default)]
struct Table {
    api: OpenApiRouter<ApiState>,
    book: RuleBook,
}

impl Table {
    /// A documented route; `Public` ones read no key.
    fn route(self, route: UtoipaMethodRouter<ApiState>, rule: Rule) -> Self {
        let keys = if rule == Rule::Public {
            Keys::Ignored
        } else {
            Keys::Required
        };
        self.route_with_keys(route, rule, keys)
    }

    fn route_with_keys(
        mut self,
        route: UtoipaMethodRouter<ApiState>,
        rule: Rule,
        keys: Keys,
    ) -> Self {
        for (path, item) in &route.1.paths {
            for method in methods(item) {
                self.book.add(path, method, rule, keys);
            }
        }
        self.api = self.api.routes(route);
        self
    }

    /// A route the OpenAPI document leaves out (another spelling of a
    /// documented one).
    fn undocumented(
        mut self,
        path: &str,
        method: Method,
        route: MethodRouter<ApiState, Infallible>,
        rule: Rule,
    ) -> Self {
        let keys = if rule == Rule::Public {
            Keys::Ignored
        } else {
            Keys::Required
        };
        self.book.add(path, method, rule, keys);
        self.api = self.api.route(path, route);
        self
    }
}

/// The methods a documented path item answers.
fn methods(item: &PathItem) -> Vec<Method> {
    [
        (&item.get, Method::GET),
        (&item.put, Method::PUT),
        (&item.post, Method::POST),
        (&item.delete, Method::DELETE),
        (&item.options, Method::OPTIONS),
        (&item.head, Method::HEAD),
        (&item.patch, Method::PATCH),
        (&item.trace, Method::TRACE),
    ]
    .into_iter()
    .filter_map(|(operation, method)| operation.is_some().then_some(method))
    .collect()
}

/// The OpenAPI document of every route of [`table`], as JSON, built once.
pub fn openapi_document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut api = openapi::BelfryApi::openapi();
        api.merge(table().api.into_openapi());
        openapi::finish(&api)
    })
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
        axum::Json(openapi_document()).into_response().into_body(),
    )
        .into_response()
}

async fn unknown_route(method: Method, uri: Uri) -> Response {
    family_error(
        &uri,
        ApiError::new(
            Code::NotFound,
            format!("no route for {method} {}", uri.path()),
        ),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    family_error(
        &uri,
        ApiError::new(
            Code::MethodNotAllowed,
            format!("method {method} is not allowed on {}", uri.path()),
        ),
    )
}

/// A panicking handler is a bug: log it, answer a generic 500 that reads
/// as an error in both envelopes (the path is not known here).
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("non-string panic payload");
    tracing::error!(panic = detail, "request handler panicked");
    let error = ApiError::internal();
    let body = json!({
        "message": error.message,
        "error": { "code": error.code, "message": error.message },
    });
    (error.status(), axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(method: &Method, path: &str) -> Rule {
        table().book.rule(method, path)
    }

    fn is_public_path(path: &str) -> bool {
        table().book.keys(path) == Keys::Ignored
    }

    const WHOAMI: &str = "/v1/whoami";

    #[test]
    fn the_console_and_whoami_are_public() {
        for path in ["/ui", "/ui/", "/ui/{asset}"] {
            assert_eq!(rule(&Method::GET, path), Rule::Public, "{path}");
            assert!(is_public_path(path), "{path}");
        }
        assert_eq!(rule(&Method::GET, WHOAMI), Rule::Public);
        // Public to route, but authenticated: a key sent is checked.
        assert!(!is_public_path(WHOAMI));
        assert_eq!(rule(&Method::GET, "/uix"), Rule::Admin);
    }

    #[test]
    fn unknown_routes_are_admin_only() {
        assert_eq!(rule(&Method::GET, "/v1/new-thing"), Rule::Admin);
        assert_eq!(rule(&Method::GET, "/ping"), Rule::Public);
        assert_eq!(
            rule(&Method::GET, "/v1/tenants/{tenant}/events"),
            Rule::PathTenant {
                write: false,
                hide: Hide::V1
            }
        );
        assert_eq!(
            rule(&Method::POST, "/v1/tenants/{tenant}/schedules/{id}/pause"),
            Rule::PathTenant {
                write: true,
                hide: Hide::V1
            }
        );
    }

    #[test]
    fn bulk_actions_are_written_by_writers_and_read_per_tenant() {
        assert_eq!(rule(&Method::POST, "/v1/bulk-actions"), Rule::AnyWriter);
        assert_eq!(
            rule(&Method::GET, "/v1/bulk-actions"),
            Rule::QueryTenant {
                write: false,
                hide: Hide::V1
            }
        );
        assert_eq!(rule(&Method::GET, "/v1/bulk-actions/{id}"), Rule::Any);
        assert_eq!(
            rule(&Method::POST, "/v1/bulk-actions/{id}/cancel"),
            Rule::AnyWriter
        );
    }

    #[test]
    fn the_probes_and_the_document_read_no_key() {
        for path in ["/ping", "/health/live", "/health/ready", "/openapi.json"] {
            assert!(is_public_path(path), "{path}");
        }
        assert!(!is_public_path("/v1/tenants"));
    }
}
