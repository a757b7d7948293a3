//! The two layers: [`authenticate`] (every request) and [`authorize`]
//! (every matched route, by its [`Rule`] in the route table).

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use belfry_core::TenantName;
use serde_json::json;

use crate::ApiState;
use crate::auth::rules::{Hide, Keys, Rule, RuleBook};
use crate::auth::{AuthMode, Lookup, Principal, Scope, unauthorized};
use crate::error::{ApiError, BigBenError, Code, V1Error, family_error};
use crate::extract::{is_json_media_type, query_pairs, query_value};

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
    State(Gate { state, rules }): State<Gate>,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = rules.keys(request.uri().path());
    if keys == Keys::Ignored {
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
    let keyless = auth.options().mode == AuthMode::None
        || !request.headers().contains_key(header::AUTHORIZATION);
    let principal = if keyless {
        let open = match auth.open_now().await {
            Ok(open) => open,
            Err(error) => return family_error(&uri, ApiError::from_store(&error)),
        };
        if !open {
            if keys == Keys::Optional {
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
                    Code::HostNotAllowed,
                    "this Host is not allowed while the API runs without keys \
                     (see auth.allowed_hosts)",
                ),
            );
        }
        if auth.open_for_lack_of_keys() && through_proxy(&request) {
            return family_error(
                &uri,
                ApiError::new(
                    Code::ProxiedRequestRefused,
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
                        Code::KeyLookupsBusy,
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
                    Code::RateLimited,
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
        Some(value) if is_json_media_type(value) => Ok(()),
        Some(_) => Err(ApiError::new(
            Code::UnsupportedMediaType,
            "a write without an API key must have Content-Type: application/json",
        )),
        None => {
            let from_browser = headers.contains_key(header::ORIGIN)
                || headers.contains_key("sec-fetch-site")
                || headers.contains_key("sec-fetch-mode");
            if from_browser {
                Err(ApiError::new(
                    Code::BrowserWriteRefused,
                    "a write from a browser needs Content-Type: application/json or an API key",
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// What the two layers read: the API's state and the route table's
/// rules.
#[derive(Clone)]
pub(crate) struct Gate {
    pub(crate) state: ApiState,
    pub(crate) rules: Arc<RuleBook>,
}

/// Checks the principal against the route's [`Rule`].
pub(crate) async fn authorize(
    State(Gate { state, rules }): State<Gate>,
    request: Request,
    next: Next,
) -> Response {
    let Some(rule) = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| rules.rule(request.method(), path.as_str()))
    else {
        return next.run(request).await;
    };
    let uri = request.uri().clone();
    if rule == Rule::Public {
        return next.run(request).await;
    }
    let Some(principal) = request.extensions().get::<Principal>().cloned() else {
        return with_challenge(family_error(&uri, unauthorized("an API key is required")));
    };
    let forbidden = |message: &str| family_error(&uri, ApiError::new(Code::Forbidden, message));
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
        Hide::V1 => V1Error(ApiError::tenant_not_found(tenant.as_str())).into_response(),
        Hide::BigBenStatus => crate::bigben::not_found(),
        Hide::BigBenEmpty => axum::Json(json!([])).into_response(),
        Hide::BigBenNoCron => BigBenError(ApiError::new(
            Code::ScheduleNotFound,
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
}
