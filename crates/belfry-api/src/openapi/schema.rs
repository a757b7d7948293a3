//! The envelopes shared by many routes: the two error envelopes, the
//! page of a byte-bounded listing, the named sets of error answers
//! (`IntoResponses`) and the path parameters (`IntoParams`) that handlers
//! list instead of repeating them. Every other shape is the view its
//! handler answers with (`ToSchema` next to the handler), so the document
//! cannot drift from the answers; `crates/belfry/tests/openapi_contract.rs`
//! (schemathesis) checks every answer against it.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{IntoParams, ToSchema};

/// `/v1`'s error envelope.
#[derive(ToSchema)]
#[schema(example = json!({"error": {"code": "tenant_not_found", "message": "tenant \"acme\" is not registered"}}))]
pub struct V1Error {
    pub error: V1ErrorDetail,
}

/// `/v1`'s error: the envelope's content, and the error of one item of a
/// batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct V1ErrorDetail {
    /// Stable machine-readable code (`docs/api.md` lists them).
    pub code: String,
    /// For people; never internal details.
    pub message: String,
}

/// Responses of `schema` (a component's name), one per `(status,
/// description)`, for the `IntoResponses` sets below.
fn error_responses(
    schema: &str,
    rows: &[(&str, &str)],
) -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
    use utoipa::openapi::{ContentBuilder, ResponseBuilder};
    rows.iter()
        .map(|&(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(schema)))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), response.into())
        })
        .collect()
}

/// Defines, for each `Name("Schema") = [rows];`, a unit type whose
/// `IntoResponses` are `rows` with `Schema`'s body, to be named in
/// `responses(...)` instead of repeating the rows.
macro_rules! error_sets {
    ($($(#[$doc:meta])* $name:ident($schema:literal) = $rows:expr;)*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
                error_responses($schema, &$rows)
            }
        }
    )*};
}

const BAD_INPUT: (&str, &str) = ("400", "Bad input");
const NOT_JSON: (&str, &str) = ("415", "Not JSON");
const NO_KEY: (&str, &str) = ("401", "No valid key");
const FORBIDDEN: (&str, &str) = ("403", "The key may not do this");
const RATE_LIMIT: (&str, &str) = ("429", "Rate limit or quota");
const INTERNAL: (&str, &str) = ("500", "Internal error (details only in the log)");
const STORE_DOWN: (&str, &str) = ("503", "Store unavailable; retry");
/// [`V1Errors`]' 503, which also covers a key not seen yet.
const V1_STORE_DOWN: (&str, &str) = (
    "503",
    "Store unavailable, or a key this node has not seen yet while its reads of unknown keys \
     are at their budget; retry (Retry-After)",
);
const V1_UNKNOWN: (&str, &str) = ("404", "Unknown tenant, event, schedule or key");
const TENANT_BODY: [(&str, &str); 3] = [
    ("404", "Unknown tenant"),
    ("413", "Body too large"),
    NOT_JSON,
];

/// [`V1Errors`]' rows, which the sets named with it include.
const V1_ANY_ROUTE: [(&str, &str); 5] = [NO_KEY, FORBIDDEN, RATE_LIMIT, INTERNAL, V1_STORE_DOWN];

/// `rows` followed by [`V1_ANY_ROUTE`].
fn with_v1_errors(rows: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    [rows, &V1_ANY_ROUTE].concat()
}

error_sets! {
    /// The answers every authenticated `/v1` route may give besides its own:
    /// no valid key, a key that may not do this, a rate limit or quota, an
    /// internal error and an unavailable store, each with [`V1Error`].
    /// Listed once here; the sets below marked "with [`V1Errors`]" include
    /// them, and a route naming none of those names this one last.
    V1Errors("V1Error") = V1_ANY_ROUTE;
    /// No valid key (401), a key that may not do this (403) and a rate
    /// limit (429): the gate's answers on routes that reach no store.
    V1GateErrors("V1Error") = [NO_KEY, FORBIDDEN, RATE_LIMIT];
    /// The 401, 429, 500 and 503 of `/v1` routes that list neither
    /// [`V1Errors`] nor a 403.
    V1KeyErrors("V1Error") = [NO_KEY, RATE_LIMIT, INTERNAL, STORE_DOWN];
    /// Bad input (400) and an unknown tenant, event, schedule or key (404),
    /// with [`V1Errors`].
    V1InputErrors("V1Error") = with_v1_errors(&[BAD_INPUT, V1_UNKNOWN]);
    /// [`V1InputErrors`] and those of a JSON body: too large (413), not
    /// JSON (415); with [`V1Errors`].
    V1BodyErrors("V1Error") = with_v1_errors(&[BAD_INPUT, V1_UNKNOWN, ("413", "Body or payload too large"), NOT_JSON]);
    /// An unknown tenant (404) and a JSON body too large (413) or not JSON
    /// (415).
    V1TenantBodyErrors("V1Error") = TENANT_BODY;
    /// [`V1TenantBodyErrors`] with [`V1Errors`].
    V1TenantWriteErrors("V1Error") = with_v1_errors(&TENANT_BODY);
    /// Bad input (400), an unknown tenant or event (404) and not JSON
    /// (415): an action on one event; with [`V1Errors`].
    V1EventActionErrors("V1Error") = with_v1_errors(&[BAD_INPUT, ("404", "Unknown tenant or event"), NOT_JSON]);
    /// The 401, 429, 500 and 503 of the bulk-action reads.
    BulkReadErrors("V1Error") = [NO_KEY, ("429", "Rate limit"), INTERNAL, STORE_DOWN];
    /// [`V1GateErrors`] with [`BigBenError`].
    BigBenGateErrors("BigBenError") = [NO_KEY, FORBIDDEN, RATE_LIMIT];
    /// [`V1KeyErrors`] with [`BigBenError`].
    BigBenErrors("BigBenError") = [NO_KEY, RATE_LIMIT, INTERNAL, STORE_DOWN];
    /// [`BigBenErrors`] and a key that may not do this (403), for BigBen's
    /// writes.
    BigBenWriteErrors("BigBenError") = [NO_KEY, FORBIDDEN, RATE_LIMIT, INTERNAL, STORE_DOWN];
    /// A BigBen body's bad input (400), too large (413) and not JSON (415).
    BigBenBodyErrors("BigBenError") = [BAD_INPUT, ("413", "Body too large"), NOT_JSON];
}

/// The `{tenant}` of a `/v1` path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    /// Tenant name (1 to 200 bytes, no control characters), one percent-encoded segment (`/` as `%2F`)
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    pub tenant: String,
}

/// The `{id}` of a `/v1` event's path (after [`TenantPath`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventIdPath {
    /// Event id (1 to 500 bytes, no control characters), one percent-encoded segment
    #[param(
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]+$"
    )]
    pub id: String,
}

/// The `If-Match` of a `/v1` event's `PUT` or cancel.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IfMatchHeader {
    /// Apply only if the event's version is this one (its `ETag`, quotes optional; or one of a list) or, for `*`, if the event exists; else `412 precondition_failed` and nothing changes. A weak tag never matches. Checked in the same store write as the change.
    #[param(rename = "If-Match")]
    pub if_match: Option<String>,
}

/// The `{id}` of a `/v1` schedule's path (after [`TenantPath`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ScheduleIdPath {
    /// Schedule id (1 to 400 bytes, no control characters, no `@`), one percent-encoded segment
    #[param(
        min_length = 1,
        max_length = 400,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F@]+$"
    )]
    pub id: String,
}

/// The `{id}` of a bulk action's path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BulkActionPath {
    /// Bulk action id, bulk_...
    pub id: String,
}

/// The `{tenant}` and `{id}` of a BigBen cron's path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CronPath {
    /// Tenant name, one percent-encoded segment (`/` as `%2F`); a name that cannot exist has no cron
    pub tenant: String,
    /// Schedule id, one percent-encoded segment
    pub id: String,
}

/// BigBen's error envelope.
#[derive(ToSchema)]
#[schema(example = json!({"message": "tenant must not be null"}))]
pub struct BigBenError {
    pub message: String,
}

/// The schema of a page of listing items `T` under `key`:
/// `{"<key>": [T, ...], "next_cursor": string | null}`, as
/// `answers::Page` writes it.
pub fn list_page_schema<T: ToSchema>(key: &str, description: &str) -> RefOr<Schema> {
    let next_cursor = ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .description(Some(
            "Pass as `cursor` for the next page; `null` on the last",
        ));
    ObjectBuilder::new()
        .description(Some(description))
        .property(
            key,
            ArrayBuilder::new().items(Ref::from_schema_name(T::name())),
        )
        .required(key)
        .property("next_cursor", next_cursor)
        .required("next_cursor")
        .into()
}

/// Implements `ToSchema` for a listing marker (`answers::Listing`): a
/// page of its items, named after the marker.
macro_rules! list_page {
    ($listing:ident, $description:literal) => {
        impl utoipa::PartialSchema for $listing {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                $crate::openapi::schema::list_page_schema::<
                    <$listing as $crate::answers::Listing>::Item<'static>,
                >(<$listing as $crate::answers::Listing>::KEY, $description)
            }
        }

        impl utoipa::ToSchema for $listing {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($listing))
            }

            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                type Item = <$listing as $crate::answers::Listing>::Item<'static>;
                schemas.push((
                    <Item as utoipa::ToSchema>::name().into(),
                    <Item as utoipa::PartialSchema>::schema(),
                ));
                <Item as utoipa::ToSchema>::schemas(schemas);
            }
        }
    };
}
pub(crate) use list_page;
