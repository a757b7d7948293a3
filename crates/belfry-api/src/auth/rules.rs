//! Who may call a route: the [`Rule`] and [`Keys`] each entry of the route
//! table carries, collected into a [`RuleBook`] that the two layers read.

use std::collections::HashMap;

use axum::http::Method;

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

/// Whether a path reads the request's key at all. Decided on the raw path,
/// before routing, since authentication answers unknown routes too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys {
    /// Not authenticated, whatever the `Host`: probes, this API's
    /// description and the console's files carry no data, and probes send
    /// no key.
    Ignored,
    /// A key sent is checked as anywhere else; without one (and keys
    /// required) the route answers anyway (`whoami`, for a sign-in page).
    Optional,
    /// A key, or open mode.
    Required,
}

/// The rules of every route of the table, by matched path and method.
/// Read on every request, so neither lookup allocates.
#[derive(Debug, Default)]
pub(crate) struct RuleBook {
    /// By the path as the router has it, each method's rule.
    rules: HashMap<String, Vec<(Method, Rule)>>,
    /// Path patterns whose keys are not [`Keys::Required`], by their first
    /// segment (`""` when that segment is a `{name}`).
    keyless: HashMap<String, Vec<(Vec<String>, Keys)>>,
}

impl RuleBook {
    /// Records the route `method path` (`path` as the router has it).
    pub(crate) fn add(&mut self, path: &str, method: Method, rule: Rule, keys: Keys) {
        self.rules
            .entry(path.to_string())
            .or_default()
            .push((method, rule));
        if keys != Keys::Required {
            let pattern = segments(path);
            let first = pattern.get(1).filter(|s| !is_name(s)).cloned();
            self.keyless
                .entry(first.unwrap_or_default())
                .or_default()
                .push((pattern, keys));
        }
    }

    /// The rule of a matched route. `HEAD` is answered by `GET`'s handler,
    /// so it has `GET`'s rule. A route not in the table is admin-only: new
    /// routes are closed until decided.
    pub(crate) fn rule(&self, method: &Method, path: &str) -> Rule {
        let Some(methods) = self.rules.get(path) else {
            return Rule::Admin;
        };
        let of = |wanted: &Method| {
            methods
                .iter()
                .find(|(m, _)| m == wanted)
                .map(|(_, rule)| *rule)
        };
        of(method)
            .or_else(|| (method == Method::HEAD).then(|| of(&Method::GET)).flatten())
            .unwrap_or(Rule::Admin)
    }

    /// What the request path `path` (raw, before routing) does with keys.
    /// The console's whole prefix is keyless, so that its unknown files
    /// answer 404 as its known ones answer 200.
    pub(crate) fn keys(&self, path: &str) -> Keys {
        if crate::console::is_console_path(path) {
            return Keys::Ignored;
        }
        let first = path.split('/').nth(1).unwrap_or_default();
        [first, ""]
            .iter()
            .filter_map(|segment| self.keyless.get(*segment))
            .flatten()
            .find(|(pattern, _)| matches(pattern, path))
            .map_or(Keys::Required, |(_, keys)| *keys)
    }
}

/// A `{name}` segment of a route path.
fn is_name(segment: &str) -> bool {
    segment.starts_with('{') && segment.ends_with('}')
}

fn segments(path: &str) -> Vec<String> {
    path.split('/').map(str::to_string).collect()
}

/// Whether `path` matches `pattern`, a `{name}` segment matching any one
/// segment.
fn matches(pattern: &[String], path: &str) -> bool {
    let mut parts = path.split('/');
    let same = pattern.iter().all(|want| {
        parts
            .next()
            .is_some_and(|part| want == part || (is_name(want) && !part.is_empty()))
    });
    same && parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyless_patterns_match_whole_segments() {
        let mut book = RuleBook::default();
        book.add("/a/{x}", Method::GET, Rule::Public, Keys::Ignored);
        book.add("/b", Method::GET, Rule::Public, Keys::Optional);
        book.add("/c", Method::GET, Rule::Any, Keys::Required);
        assert_eq!(book.keys("/a/1"), Keys::Ignored);
        assert_eq!(book.keys("/a/"), Keys::Required);
        assert_eq!(book.keys("/a/1/2"), Keys::Required);
        assert_eq!(book.keys("/b"), Keys::Optional);
        assert_eq!(book.keys("/bb"), Keys::Required);
        assert_eq!(book.keys("/c"), Keys::Required);
        assert_eq!(book.rule(&Method::HEAD, "/c"), Rule::Any);
        assert_eq!(book.rule(&Method::POST, "/c"), Rule::Admin);
    }
}
