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
use axum::http::{StatusCode, Uri, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::ApiState;
use crate::error::{ApiError, BigBenError, V1Error, code};

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
                Err(V1Error(ApiError::bad_request(
                    code::INVALID_NAME,
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
            Err(ApiError::bad_request(
                code::INVALID_QUERY,
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
            StatusCode::PAYLOAD_TOO_LARGE,
            code::BODY_TOO_LARGE,
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
            return Err(ApiError::bad_request(
                code::INVALID_REQUEST,
                "the request body could not be read",
            ));
        }
    };
    Ok(bytes)
}

/// Parses a JSON body; a wrong shape names the field.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let error = match serde_json::from_slice(bytes) {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    let wrong_shape = |message: String| {
        ApiError::bad_request(
            code::INVALID_REQUEST,
            format!("request body has the wrong shape: {message}"),
        )
    };
    if error.is_data() {
        let mut parser = serde_json::Deserializer::from_slice(bytes);
        return Err(wrong_shape(
            field_error::<T, _>(&mut parser).unwrap_or_else(|| error.to_string()),
        ));
    }
    // serde_json reports some type mismatches (a number where an enum's
    // string belongs) as syntax errors; if the body is valid JSON, it is
    // a shape problem, and the tree-based parse names it better.
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(tree) => Err(wrong_shape(
            field_error::<T, _>(tree).unwrap_or_else(|| error.to_string()),
        )),
        Err(_) => Err(ApiError::bad_request(
            code::INVALID_JSON,
            format!("request body is not valid JSON: {error}"),
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
    let inner = error.into_inner();
    if path == "." {
        inner.to_string()
    } else {
        format!("{path}: {inner}")
    }
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
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let mime = value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json")) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        ))
    }
}
