//! The envelopes shared by many routes: the two error envelopes and the
//! page of a byte-bounded listing. Every other shape is the view its
//! handler answers with (`ToSchema` next to the handler), so the document
//! cannot drift from the answers; `crates/belfry/tests/openapi_contract.rs`
//! (schemathesis) checks every answer against it.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr};

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

/// The answers every authenticated `/v1` route may give besides its own:
/// no valid key, a key that may not do this, a rate limit or quota, an
/// internal error and an unavailable store, each with [`V1Error`]. Listed
/// once here and named last in each route's `responses(...)`.
pub struct V1Errors;

impl utoipa::IntoResponses for V1Errors {
    fn responses() -> BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        [
            ("401", "No valid key"),
            ("403", "The key may not do this"),
            ("429", "Rate limit or quota"),
            ("500", "Internal error (details only in the log)"),
            (
                "503",
                "Store unavailable, or a key this node has not seen yet while its reads of \
                 unknown keys are at their budget; retry (Retry-After)",
            ),
        ]
        .into_iter()
        .map(|(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("V1Error")))
                .build();
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), response.into())
        })
        .collect()
    }
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
