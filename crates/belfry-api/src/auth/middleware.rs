//! The two layers: [`authenticate`] (every request) and [`authorize`]
//! (every matched route, by the table in [`rule`]).

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use belfry_core::TenantName;
use serde_json::json;

use super::{Lookup, Principal, Scope, unauthorized};
use crate::error::{ApiError, BigBenError, V1Error, code};
use crate::extract::{query_pairs, query_value};
use crate::{ApiState, family_error};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Anyone, without a key (`/ping`).
    Public,
    /// Any principal; the handler filters what it answers.
    Any,
    /// Any principal that may write; the handler checks every tenant the
    /// body names.
    AnyWriter,
    /// Admin keys (and open mode) only; others get 403.
    Admin,
    /// The `{tenant}` path segment must be the principal's own tenant
    /// (else the route's own "not found"); `write` routes need a writer.
    PathTenant { write: bool, hide: Hide },
    /// The same for the `tenant` query parameter.
    QueryTenant { write: bool, hide: Hide },
    /// Pull workers: the `{tenant}` path segment must be the principal's
    /// own tenant (else 404) and its key a `worker` one, or an admin.
    PullTenant,
    /// Calls on a lease: `worker` keys and admins; the handler checks the
    /// lease's tenant (another tenant's lease is `409 lease_lost`).
    Worker,
}

/// How a route answers for a tenant that does not exist, so that a
/// foreign tenant looks exactly like one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hide {
    /// `/v1`: 404 `tenant_not_found`.
    V1,
    /// BigBen's `find`/`dryrun`: 404 `{"status": "not found"}`.
    BigBenStatus,
    /// BigBen's `GET /cron/...`: 200 `[]`.
    BigBenEmpty,
    /// BigBen's `DELETE /cron/...`: 404 "no cron".
    BigBenNoCron,
}

/// The route table (`docs/security.md` has it as a table). A route not
/// listed here is admin-only: new routes are closed until decided.
pub(crate) fn rule(method: &Method, path: &str) -> Rule {
    let reads = method == Method::GET || method == Method::HEAD;
    match path {
        public if is_public_path(public) => Rule::Public,
        // Anyone may ask; without a key it tells only whether keys are
        // required (`authenticate` lets it through keyless).
        WHOAMI => Rule::Public,
        "/events/cluster" | "/v1/cluster" | "/v1/audit" | "/v1/keys/{id}" | "/metrics" => {
            Rule::Admin
        }
        "/v1/keys" if reads => Rule::Any,
        "/v1/keys" => Rule::Admin,
        "/events/tenants" | "/v1/tenants" | "/v1/cron/preview" | "/v1/bulk-actions/{id}" => {
            Rule::Any
        }
        "/events/tenant/register"
        | "/events/schedule"
        | "/cron"
        | "/v1/bulk-actions/{id}/cancel" => Rule::AnyWriter,
        "/v1/bulk-actions" if reads => Rule::QueryTenant {
            write: false,
            hide: Hide::V1,
        },
        "/v1/bulk-actions" => Rule::AnyWriter,
        "/events/find" => Rule::QueryTenant {
            write: false,
            hide: Hide::BigBenStatus,
        },
        "/events/dryrun" => Rule::QueryTenant {
            write: true,
            hide: Hide::BigBenStatus,
        },
        "/cron/{tenant}/{id}" => Rule::PathTenant {
            write: false,
            hide: Hide::BigBenEmpty,
        },
        "/cron/{tenant}/{id}/{type}" => Rule::PathTenant {
            write: true,
            hide: Hide::BigBenNoCron,
        },
        "/v1/tenants/{tenant}/leases" | "/v1/tenants/{tenant}/leases/complete" => Rule::PullTenant,
        lease_path if lease_path.starts_with("/v1/leases/{lease_id}/") => Rule::Worker,
        tenant_path if tenant_path.starts_with("/v1/tenants/{tenant}") => Rule::PathTenant {
            write: !reads,
            hide: Hide::V1,
        },
        _ => Rule::Admin,
    }
}

/// Paths that answer without a key, whatever the `Host`: they carry no
/// data, and probes (load balancers, orchestrators) send neither. The
/// console's page and assets are public too: every datum it shows comes
/// from the API, with the key the user enters.
fn is_public_path(path: &str) -> bool {
    matches!(
        path,
        "/ping" | "/health/live" | "/health/ready" | "/openapi.json"
    ) || crate::console::is_console_path(path)
}

/// `GET /v1/whoami`: public, but a key sent with it is checked (and
/// described) as anywhere else.
const WHOAMI: &str = "/v1/whoami";

/// A tenant key with the `worker` role.
fn is_worker(principal: &Principal) -> bool {
    matches!(
        principal.scope,
        Scope::Tenant {
            role: belfry_core::auth::Role::Worker,
            ..
        }
    )
}

fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Turns the request's key into a [`Principal`] (or lets it in open), and
/// refuses what no route may get: a missing, unknown, expired or revoked
/// key (401), a client over its rate (429), a write a browser could have
/// forged (415/403) and, while open, a foreign `Host` (403).
pub(crate) async fn authenticate(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    if is_public_path(request.uri().path()) {
        return next.run(request).await;
    }
    let uri = request.uri().clone();
    // Another node's forward acts for the principal that node signed, or
    // is refused; it is never taken as a client's request.
    if request.headers().contains_key(&crate::peer::FORWARDED) {
        return match crate::peer::admit(&state, request).await {
            Ok(request) => next.run(request).await,
            Err(error) => family_error(&uri, error),
        };
    }
    let auth = state.auth.clone();
    let keyless = auth.options().mode == super::AuthMode::None
        || !request.headers().contains_key(header::AUTHORIZATION);
    let principal = if keyless {
        let open = match auth.open_now().await {
            Ok(open) => open,
            Err(error) => return family_error(&uri, ApiError::from_store(&error)),
        };
        if !open {
            if uri.path() == WHOAMI {
                // Answers "no key" instead of 401, so a sign-in page can
                // ask without logging an error.
                return next.run(request).await;
            }
            return with_challenge(family_error(
                &uri,
                unauthorized("an API key is required: send it as Authorization: Bearer bfy_..."),
            ));
        }
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok());
        if !auth.host_allowed(host) {
            return family_error(
                &uri,
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    code::HOST_NOT_ALLOWED,
                    "this Host is not allowed while the API runs without keys \
                     (see auth.allowed_hosts)",
                ),
            );
        }
        if auth.open_for_lack_of_keys() && through_proxy(&request) {
            return family_error(
                &uri,
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    code::PROXIED_REQUEST_REFUSED,
                    "this request came through a proxy, and the API runs without keys \
                     only for clients on this machine: create a key \
                     (belfry keys create --role admin) to serve it",
                ),
            );
        }
        if let Err(error) = check_browser_write(&request) {
            return family_error(&uri, error);
        }
        Principal::OPEN
    } else {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        let Some(secret) = presented else {
            return with_challenge(family_error(
                &uri,
                unauthorized("the Authorization header must be Bearer bfy_..."),
            ));
        };
        let key = match auth.lookup(secret, state.engine.now()).await {
            Ok(Lookup::Valid(key)) => key,
            Ok(Lookup::Refused(why)) => {
                return with_challenge(family_error(&uri, unauthorized(why)));
            }
            Ok(Lookup::Busy(wait)) => {
                let mut response = family_error(
                    &uri,
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        code::KEY_LOOKUPS_BUSY,
                        "this node cannot check a key it has not seen yet right now; retry shortly",
                    ),
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
                return response;
            }
            Err(error) => return family_error(&uri, ApiError::from_store(&error)),
        };
        if let Err(wait) = auth.limiter.check(&key.id, auth.clock.monotonic()) {
            let seconds = whole_seconds(wait);
            let mut response = family_error(
                &uri,
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    code::RATE_LIMITED,
                    format!("too many requests for this key; retry in {seconds} s"),
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            return response;
        }
        Principal {
            key: Some(key.id),
            scope: match key.tenant {
                Some(tenant) => Scope::Tenant {
                    tenant,
                    role: key.role,
                },
                None => Scope::Admin,
            },
        }
    };
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// A wait as `Retry-After` seconds: rounded up, at least 1.
fn whole_seconds(wait: std::time::Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// Whether a proxy handled the request: it carries a header that proxies
/// add (`Forwarded`, `X-Forwarded-*`, `X-Real-IP`, `Via`), or it is
/// HTTP/1.0, which nginx speaks to its upstreams by default (and curl or a
/// browser never do unless told). Such a request reached loopback, but its
/// client may be anywhere.
fn through_proxy(request: &Request) -> bool {
    request.version() <= axum::http::Version::HTTP_10
        || request.headers().keys().any(|name| {
            let name = name.as_str();
            name == "forwarded"
                || name == "via"
                || name == "x-real-ip"
                || name.starts_with("x-forwarded-")
        })
}

/// `Bearer <token>` (the scheme is case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn with_challenge(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"belfry\""),
    );
    response
}

/// A write without a key must be JSON: a page in a browser can send
/// `text/plain`, form and multipart bodies (and bodiless `POST`s) to any
/// address without asking, but not `application/json` nor an
/// `Authorization` header. A bodiless write from a browser (it sends
/// `Origin` or `Sec-Fetch-*`) is refused too; one from a script (curl)
/// passes.
fn check_browser_write(request: &Request) -> Result<(), ApiError> {
    if !is_write(request.method()) {
        return Ok(());
    }
    let headers = request.headers();
    match headers.get(header::CONTENT_TYPE) {
        Some(value) => {
            let mime = value
                .to_str()
                .unwrap_or_default()
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            let json = mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"));
            if json {
                Ok(())
            } else {
                Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    code::UNSUPPORTED_MEDIA_TYPE,
                    "a write without an API key must have Content-Type: application/json",
                ))
            }
        }
        None => {
            let from_browser = headers.contains_key(header::ORIGIN)
                || headers.contains_key("sec-fetch-site")
                || headers.contains_key("sec-fetch-mode");
            if from_browser {
                Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    code::BROWSER_WRITE_REFUSED,
                    "a write from a browser needs Content-Type: application/json or an API key",
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Checks the principal against the route's [`rule`].
pub(crate) async fn authorize(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let uri = request.uri().clone();
    let Some(path) = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
    else {
        return next.run(request).await;
    };
    let rule = rule(request.method(), &path);
    if rule == Rule::Public {
        return next.run(request).await;
    }
    let Some(principal) = request.extensions().get::<Principal>().cloned() else {
        return with_challenge(family_error(&uri, unauthorized("an API key is required")));
    };
    let forbidden = |message: &str| {
        family_error(
            &uri,
            ApiError::new(StatusCode::FORBIDDEN, code::FORBIDDEN, message),
        )
    };
    let read_only = "this key may only read";
    match rule {
        Rule::Public | Rule::Any => {}
        Rule::AnyWriter if !principal.can_write() => return forbidden(read_only),
        Rule::AnyWriter => {}
        Rule::Admin if !principal.is_admin() => {
            return forbidden("only an admin key may use this route");
        }
        Rule::Admin => {}
        Rule::Worker if !principal.is_admin() && !is_worker(&principal) => {
            return forbidden("only a worker key or an admin key may call leases");
        }
        Rule::Worker => {}
        Rule::PullTenant => {
            let (mut parts, body) = request.into_parts();
            let params = RawPathParams::from_request_parts(&mut parts, &state).await;
            let tenant = params.as_ref().ok().and_then(|p| {
                p.iter()
                    .find(|(key, _)| *key == "tenant")
                    .and_then(|(_, value)| TenantName::new(value).ok())
            });
            if let Some(tenant) = tenant {
                if !principal.sees(&tenant) {
                    return hidden(Hide::V1, &tenant, None, None);
                }
                if !principal.may_pull(&tenant) {
                    return forbidden("only a worker key of this tenant or an admin key may claim");
                }
            }
            return next.run(Request::from_parts(parts, body)).await;
        }
        Rule::PathTenant { write, hide } => {
            let (mut parts, body) = request.into_parts();
            let params = RawPathParams::from_request_parts(&mut parts, &state).await;
            let named = |name: &str| -> Option<String> {
                params.as_ref().ok().and_then(|p| {
                    p.iter()
                        .find(|(key, _)| *key == name)
                        .map(|(_, value)| value.to_string())
                })
            };
            if let Some(tenant) = named("tenant")
                && let Ok(tenant) = TenantName::new(tenant)
            {
                if !principal.sees(&tenant) {
                    let (id, kind) = (named("id"), named("type"));
                    return hidden(hide, &tenant, id.as_deref(), kind.as_deref());
                }
                if write && !principal.can_write() {
                    return forbidden(read_only);
                }
            }
            return next.run(Request::from_parts(parts, body)).await;
        }
        Rule::QueryTenant { write, hide } => {
            let tenant = query_pairs(&uri).ok().and_then(|pairs| {
                query_value(&pairs, "tenant").and_then(|t| TenantName::new(t).ok())
            });
            if let Some(tenant) = tenant {
                if !principal.sees(&tenant) {
                    return hidden(hide, &tenant, None, None);
                }
                if write && !principal.can_write() {
                    return forbidden(read_only);
                }
            }
        }
    }
    next.run(request).await
}

/// What a route answers for a tenant that does not exist.
fn hidden(hide: Hide, tenant: &TenantName, id: Option<&str>, kind: Option<&str>) -> Response {
    match hide {
        Hide::V1 => V1Error(ApiError::not_found(
            code::TENANT_NOT_FOUND,
            format!("tenant {tenant:?} is not registered"),
        ))
        .into_response(),
        Hide::BigBenStatus => crate::bigben::not_found(),
        Hide::BigBenEmpty => axum::Json(json!([])).into_response(),
        Hide::BigBenNoCron => BigBenError(ApiError::not_found(
            code::SCHEDULE_NOT_FOUND,
            format!(
                "no cron {:?} of type {} for tenant {:?}",
                id.unwrap_or_default(),
                kind.unwrap_or_default(),
                tenant.as_str()
            ),
        ))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        assert_eq!(bearer("Bearer bfy_x"), Some("bfy_x"));
        assert_eq!(bearer("bearer  bfy_x "), Some("bfy_x"));
        assert_eq!(bearer("Basic dXNlcg=="), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("bfy_x"), None);
    }

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
}
