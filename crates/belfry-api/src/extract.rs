//! Request extractors whose rejections are ours.
//!
//! axum's own `Json`, `Path` and `Query` reject with plain-text bodies that
//! name Rust types; these wrappers read the same inputs and fail with an
//! [`ApiError`] in the route family's envelope instead.
//!
//! # Body rules (both API families)
//! - `Content-Type` must be JSON (`application/json`, or any `…+json`) when
//!   present; a missing `Content-Type` is accepted as JSON so that `curl -d`
//!   works. Anything else is `415`.
//! - Bodies over [`crate::ApiOptions::max_body_bytes`] are `413`, checked on
//!   `Content-Length` first and enforced while reading.
//! - Unparseable JSON is `400 invalid_json`; well-formed JSON of the wrong
//!   shape is `400 invalid_request`.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Uri, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::ApiState;
use crate::error::{ApiError, BigBenError, Code, V1Error};

/// A JSON body for the native API.
#[derive(Debug)]
pub struct V1Json<T>(pub T);

impl<T: DeserializeOwned> FromRequest<ApiState> for V1Json<T> {
    type Rejection = V1Error;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Self::Rejection> {
        read_json(req, state.options.max_body_bytes)
            .await
            .map(V1Json)
            .map_err(V1Error)
    }
}

/// A JSON body for the native API that may also be left out: an empty
/// body or `null` reads as `T::default()`.
#[derive(Debug)]
pub struct V1JsonOrEmpty<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<ApiState> for V1JsonOrEmpty<T> {
    type Rejection = V1Error;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Self::Rejection> {
        let bytes = read_body(req, state.options.max_body_bytes)
            .await
            .map_err(V1Error)?;
        if bytes.trim_ascii().is_empty() {
            return Ok(V1JsonOrEmpty(T::default()));
        }
        parse_json::<Option<T>>(&bytes)
            .map(|body| V1JsonOrEmpty(body.unwrap_or_default()))
            .map_err(V1Error)
    }
}

/// A JSON body for the native API, and its bytes as they came (to forward
/// the request to another node unchanged).
#[derive(Debug)]
pub struct V1JsonBytes<T>(pub T, pub bytes::Bytes);

impl<T: DeserializeOwned> FromRequest<ApiState> for V1JsonBytes<T> {
    type Rejection = V1Error;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Self::Rejection> {
        let bytes = read_body(req, state.options.max_body_bytes)
            .await
            .map_err(V1Error)?;
        let value = parse_json(&bytes).map_err(V1Error)?;
        Ok(V1JsonBytes(value, bytes))
    }
}

/// A JSON body for BigBen's routes.
#[derive(Debug)]
pub struct BigBenJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<ApiState> for BigBenJson<T> {
    type Rejection = BigBenError;

    async fn from_request(req: Request, state: &ApiState) -> Result<Self, Self::Rejection> {
        read_json(req, state.options.max_body_bytes)
            .await
            .map(BigBenJson)
            .map_err(BigBenError)
    }
}

/// Path parameters of the native API, percent-decoded (`%2F` → `/`).
#[derive(Debug)]
pub struct V1Path<T>(pub T);

impl<T, S> FromRequestParts<S> for V1Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = V1Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(V1Path(value)),
            Err(rejection) => {
                tracing::debug!(%rejection, "path parameters rejected");
                Err(V1Error(ApiError::new(
                    Code::InvalidName,
                    "a path segment is not valid percent-encoded UTF-8",
                )))
            }
        }
    }
}

/// The query string as ordered `(name, value)` pairs, percent-decoded.
///
/// # Errors
/// A query string that cannot be decoded (`invalid_query`).
pub fn query_pairs(uri: &Uri) -> Result<Vec<(String, String)>, ApiError> {
    match Query::<Vec<(String, String)>>::try_from_uri(uri) {
        Ok(Query(pairs)) => Ok(pairs),
        Err(rejection) => {
            tracing::debug!(%rejection, "query string rejected");
            Err(ApiError::new(
                Code::InvalidQuery,
                "the query string cannot be decoded",
            ))
        }
    }
}

/// The last value of query parameter `name`, if any.
pub fn query_value<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

/// Reads and parses a JSON body under the rules in the module docs.
async fn read_json<T: DeserializeOwned>(req: Request, limit: usize) -> Result<T, ApiError> {
    parse_json(&read_body(req, limit).await?)
}

/// Reads a JSON body's bytes (content type and size checked).
async fn read_body(req: Request, limit: usize) -> Result<bytes::Bytes, ApiError> {
    check_content_type(&req)?;
    let too_large = || {
        ApiError::new(
            Code::BodyTooLarge,
            format!("request body is larger than {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large());
    }
    let body = Limited::new(req.into_body(), limit);
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(too_large());
        }
        Err(error) => {
            tracing::debug!(%error, "reading a request body failed");
            return Err(ApiError::new(
                Code::InvalidRequest,
                "the request body could not be read",
            ));
        }
    };
    Ok(bytes)
}

/// Parses a JSON body; a wrong shape names the field.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let error = match serde_json::from_slice(bytes) {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    let wrong_shape = |message: String| {
        ApiError::new(
            Code::InvalidRequest,
            format!("request body has the wrong shape: {message}"),
        )
    };
    if error.is_data() {
        let mut parser = serde_json::Deserializer::from_slice(bytes);
        return Err(wrong_shape(
            field_error::<T, _>(&mut parser).unwrap_or_else(|| in_api_words(&error)),
        ));
    }
    // serde_json reports some type mismatches (a number where an enum's
    // string belongs) as syntax errors; if the body is valid JSON, it is
    // a shape problem, and the tree-based parse names it better.
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(tree) => Err(wrong_shape(
            field_error::<T, _>(tree).unwrap_or_else(|| in_api_words(&error)),
        )),
        Err(_) => Err(ApiError::new(
            Code::InvalidJson,
            format!("request body is not valid JSON: {}", syntax_error(&error)),
        )),
    }
}

/// Deserializes `T` again tracking where it fails: the error prefixed
/// with the field's path (`error.code: ...`), so the client is told which
/// field is wrong. `None` if it does not fail this time.
fn field_error<'de, T: DeserializeOwned, D>(input: D) -> Option<String>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    let error = serde_path_to_error::deserialize::<_, T>(input).err()?;
    Some(describe(error))
}

/// A deserialization error prefixed with the field's path.
fn describe(error: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = error.path().to_string();
    let inner = in_api_words(error.inner());
    if path == "." {
        inner
    } else {
        format!("{path}: {inner}")
    }
}

/// A JSON syntax error with its position, in our words (serde's ends in
/// `at line 1 column 5`).
pub(crate) fn syntax_error(error: &serde_json::Error) -> String {
    let message = bare_message(error);
    if error.line() == 0 {
        message
    } else {
        format!(
            "{message} (line {}, column {})",
            error.line(),
            error.column()
        )
    }
}

/// serde's message without the position it appends.
fn bare_message(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    match text.strip_suffix(&position) {
        Some(bare) => bare.to_string(),
        None => text,
    }
}

/// A wrong-shape error in the API's words: what JSON was expected and what
/// came, never serde's names of Rust types (`expected u64`, `struct
/// PutEvent`) nor its parser position (the caller names the field).
pub(crate) fn in_api_words(error: &serde_json::Error) -> String {
    let message = bare_message(error);
    if let Some(rest) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        && let Some((found, expected)) = rest.split_once(", expected ")
    {
        return format!(
            "expected {}, found {}",
            expected_in_api_words(expected),
            found_in_api_words(found)
        );
    }
    if let Some(rest) = message.strip_prefix("invalid length ")
        && let Some((length, expected)) = rest.split_once(", expected ")
    {
        return format!(
            "expected {}, found an array of {length} items",
            expected_in_api_words(expected)
        );
    }
    if message.starts_with("data did not match any variant") {
        return "not one of the accepted forms".to_string();
    }
    if rust_type_name_in(&message).is_some() {
        return "not a valid value".to_string();
    }
    message
}

/// serde's `expected …` (a `Visitor`'s words, often a Rust type) as the
/// JSON a client should send.
fn expected_in_api_words(expected: &str) -> String {
    let words = match expected {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" => "a whole number from 0 to 4294967295",
        "u64" | "u128" | "usize" => "a whole number of 0 or more",
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" | "a borrowed string" | "a character" | "a char" => "a string",
        "a sequence" | "a tuple" => "an array",
        "a map" => "an object",
        "unit" => "null",
        other if other.starts_with("struct ") || other.starts_with("map") => "an object",
        other if other.starts_with("tuple") || other.starts_with("a tuple of size") => "an array",
        other if other.contains("enum") => "one of the accepted values",
        other if rust_type_name_in(other).is_none() => other,
        _ => "a valid value",
    };
    words.to_string()
}

/// serde's `Unexpected` (what came) in JSON's words.
fn found_in_api_words(found: &str) -> String {
    match found {
        "sequence" => "an array".to_string(),
        "map" => "an object".to_string(),
        "unit value" | "null" => "null".to_string(),
        other => match other.strip_prefix("floating point ") {
            Some(number) => format!("number {number}"),
            None if other.starts_with("integer ")
                || other.starts_with("string ")
                || other.starts_with("boolean ") =>
            {
                other.to_string()
            }
            None => "a value of another kind".to_string(),
        },
    }
}

/// The first Rust type name or serde parser position in `text`, if any:
/// what an answer must never show (`u64`, `struct`, `line 1 column 5`).
pub fn rust_type_name_in(text: &str) -> Option<&'static str> {
    const NAMES: [&str; 20] = [
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
        "f32", "f64", "struct", "enum", "Option", "Vec", "String", "HashMap",
    ];
    let words: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
        .collect();
    if let Some(name) = NAMES.iter().find(|name| words.contains(name)) {
        return Some(name);
    }
    // A Rust path (`alloc::string::String`, `belfry_core::ids::IdError`).
    if let Some(prefix) = ["std::", "core::", "alloc::", "serde::", "belfry_"]
        .into_iter()
        .find(|prefix| text.contains(prefix))
    {
        return Some(prefix);
    }
    // serde_json's position: `line 3 column 7`.
    let serde_position = text.match_indices("line ").any(|(at, _)| {
        let rest = text[at + "line ".len()..].trim_start_matches(|c: char| c.is_ascii_digit());
        rest.len() < text.len() - at - "line ".len() && rest.starts_with(" column ")
    });
    serde_position.then_some("line N column M")
}

/// `input` (a JSON tree, or a parser over bytes) as a `T`; a wrong shape
/// is described with the field's path (`max_attempts: invalid type …`),
/// as request bodies are. For items read one by one (a batch's, a Kafka
/// record's).
///
/// # Errors
/// Not JSON, or not a `T`: the reason.
pub(crate) fn deserialize_naming_field<'de, T, D>(input: D) -> Result<T, String>
where
    T: serde::Deserialize<'de>,
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    serde_path_to_error::deserialize(input).map_err(describe)
}

fn check_content_type(req: &Request) -> Result<(), ApiError> {
    match req.headers().get(header::CONTENT_TYPE) {
        Some(value) if !is_json_media_type(value) => Err(ApiError::new(
            Code::UnsupportedMediaType,
            "Content-Type must be application/json",
        )),
        _ => Ok(()),
    }
}

/// Whether a `Content-Type` names JSON: `application/json` or
/// `application/*+json`, any case, parameters ignored.
pub(crate) fn is_json_media_type(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    let end = bytes.iter().position(|&b| b == b';').unwrap_or(bytes.len());
    let mime = bytes[..end].trim_ascii();
    let prefix = b"application/";
    let Some((kind, subtype)) = mime.split_at_checked(prefix.len()) else {
        return false;
    };
    kind.eq_ignore_ascii_case(prefix)
        && (subtype.eq_ignore_ascii_case(b"json")
            || subtype.len() > b"+json".len()
                && subtype[subtype.len() - b"+json".len()..].eq_ignore_ascii_case(b"+json"))
}

/// Whole numbers as JSON Schema reads them: `2.0` is the integer 2, so a
/// client written against the OpenAPI document may send it so. Integer
/// fields of request bodies are [`whole::Whole`]s; a wrong value gets the
/// same message as a plain integer field would.
pub(crate) mod whole {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};
    use serde_json::Value;

    /// `value` as a `u64`: an unsigned integer, or a float with no
    /// fraction in range.
    pub(crate) fn u64_of(value: &Value) -> Option<u64> {
        value.as_u64().or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .and_then(|f| u64::try_from(f as u128).ok())
        })
    }

    /// An integer type read as [`Whole`]; `NAME` is what serde's own
    /// messages call it, so that [`crate::extract::in_api_words`] words
    /// them the same.
    pub(crate) trait Integer: TryFrom<u64> + Sized {
        const NAME: &'static str;
    }

    impl Integer for u32 {
        const NAME: &'static str = "u32";
    }

    impl Integer for u64 {
        const NAME: &'static str = "u64";
    }

    /// An integer written as an integer or as a whole float.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Whole<T>(pub T);

    impl<T> Whole<T> {
        pub(crate) fn get(self) -> T {
            self.0
        }
    }

    struct WholeVisitor<T>(PhantomData<T>);

    impl<T: Integer> WholeVisitor<T> {
        fn in_range<E: de::Error>(&self, value: u64, unexpected: Unexpected<'_>) -> Result<T, E> {
            T::try_from(value).map_err(|_| E::invalid_value(unexpected, self))
        }
    }

    impl<'de, T: Integer> Visitor<'de> for WholeVisitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::NAME)
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
            self.in_range(value, Unexpected::Unsigned(value))
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
            let unsigned = u64::try_from(value)
                .map_err(|_| E::invalid_value(Unexpected::Signed(value), &self))?;
            self.in_range(unsigned, Unexpected::Signed(value))
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<T, E> {
            match u64_of(&Value::from(value)) {
                Some(whole) => self.in_range(whole, Unexpected::Float(value)),
                None if value.fract() == 0.0 => {
                    Err(E::invalid_value(Unexpected::Float(value), &self))
                }
                None => Err(E::invalid_type(Unexpected::Float(value), &self)),
            }
        }
    }

    impl<'de, T: Integer> Deserialize<'de> for Whole<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer
                .deserialize_u64(WholeVisitor(PhantomData))
                .map(Whole)
        }
    }

    /// A required `u32` field read as a [`Whole`] (`deserialize_with`).
    pub(crate) fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        Ok(Whole::<u32>::deserialize(d)?.0)
    }

    #[cfg(test)]
    mod tests {
        use serde::Deserialize;

        use super::Whole;
        use crate::extract::in_api_words;

        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            small: Option<Whole<u32>>,
            large: Option<Whole<u64>>,
        }

        fn read(json: &str) -> Result<Body, String> {
            serde_json::from_str(json).map_err(|e| in_api_words(&e))
        }

        #[test]
        fn whole_floats_read_as_integers_and_the_rest_as_before() {
            let body = read(r#"{"small": 2.0, "large": 351464.0}"#).unwrap();
            assert_eq!(
                (body.small, body.large),
                (Some(Whole(2)), Some(Whole(351_464)))
            );
            let body = read(r#"{"small": null}"#).unwrap();
            assert_eq!((body.small, body.large), (None, None));
            // An object is not an array: a short one is refused, as before.
            assert!(read("[null]").is_err());
            assert_eq!(
                read(r#"{"small": 1.5}"#).unwrap_err(),
                "expected a whole number from 0 to 4294967295, found number `1.5`"
            );
            assert_eq!(
                read(r#"{"small": 5000000000}"#).unwrap_err(),
                "expected a whole number from 0 to 4294967295, found integer `5000000000`"
            );
            assert_eq!(
                read(r#"{"large": -1}"#).unwrap_err(),
                "expected a whole number of 0 or more, found integer `-1`"
            );
            assert_eq!(
                read(r#"{"large": "7"}"#).unwrap_err(),
                "expected a whole number of 0 or more, found string \"7\""
            );
        }
    }
}
