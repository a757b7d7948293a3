//! Every body-taking route's body, parsed without HTTP, exactly as the
//! route's extractor parses it: for the fuzz targets (`fuzz/`) and the
//! tests that check answers never name Rust types.

use belfry_core::pull::{ClaimBody, CompleteBody, FailBody, HeartbeatBody, ReleaseBody};
use serde::de::DeserializeOwned;
use utoipa::Path;

use crate::extract::{deserialize_naming_field, parse_json};

/// A route that reads a JSON body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRoute {
    BigBenRegisterTenant,
    BigBenSchedule,
    BigBenCron,
    PutTenant,
    RotateSigningSecret,
    PutEvent,
    EventBatch,
    PutSchedule,
    CreateBulkAction,
    Claim,
    CompleteBatch,
    Heartbeat,
    Complete,
    Fail,
    Release,
    CreateKey,
}

impl BodyRoute {
    pub const ALL: [BodyRoute; 16] = [
        BodyRoute::BigBenRegisterTenant,
        BodyRoute::BigBenSchedule,
        BodyRoute::BigBenCron,
        BodyRoute::PutTenant,
        BodyRoute::RotateSigningSecret,
        BodyRoute::PutEvent,
        BodyRoute::EventBatch,
        BodyRoute::PutSchedule,
        BodyRoute::CreateBulkAction,
        BodyRoute::Claim,
        BodyRoute::CompleteBatch,
        BodyRoute::Heartbeat,
        BodyRoute::Complete,
        BodyRoute::Fail,
        BodyRoute::Release,
        BodyRoute::CreateKey,
    ];

    /// The method and a path of the route (`t` for the tenant, `e` for an
    /// id, `l` for a lease id), the path taken from the handler's
    /// `#[utoipa::path]`, as the router takes it.
    pub fn method_and_path(self) -> (&'static str, String) {
        use crate::{auth, bigben, v1};
        let (method, pattern) = match self {
            BodyRoute::BigBenRegisterTenant => ("POST", bigben::tenants::__path_register::path()),
            BodyRoute::BigBenSchedule => ("POST", bigben::schedule::__path_schedule::path()),
            BodyRoute::BigBenCron => ("POST", bigben::cron::__path_create::path()),
            BodyRoute::PutTenant => ("PUT", v1::tenants::__path_put::path()),
            BodyRoute::RotateSigningSecret => ("POST", v1::signing::__path_rotate::path()),
            BodyRoute::PutEvent => ("PUT", v1::events::__path_put::path()),
            BodyRoute::EventBatch => ("POST", v1::events::__path_batch::path()),
            BodyRoute::PutSchedule => ("PUT", v1::schedules::__path_put::path()),
            BodyRoute::CreateBulkAction => ("POST", v1::bulk::__path_create::path()),
            BodyRoute::Claim => ("POST", v1::leases::__path_claim::path()),
            BodyRoute::CompleteBatch => ("POST", v1::lease_batch::__path_complete_batch::path()),
            BodyRoute::Heartbeat => ("POST", v1::leases::__path_heartbeat::path()),
            BodyRoute::Complete => ("POST", v1::leases::__path_complete::path()),
            BodyRoute::Fail => ("POST", v1::leases::__path_fail::path()),
            BodyRoute::Release => ("POST", v1::leases::__path_release::path()),
            BodyRoute::CreateKey => ("POST", auth::routes::__path_create::path()),
        };
        let path = pattern
            .replace("{tenant}", "t")
            .replace("{id}", "e")
            .replace("{lease_id}", "l");
        (method, path)
    }
}

/// Parses `body` as `route`'s extractor does (and a batch's items one by
/// one, and a lease call's limits, as their handlers do).
///
/// # Errors
/// The message the route would answer.
pub fn check_body(route: BodyRoute, body: &[u8]) -> Result<(), String> {
    fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
        parse_json(body).map_err(|error| error.message)
    }
    fn valid<T>(result: Result<T, belfry_core::pull::PullRequestError>) -> Result<(), String> {
        result.map(drop).map_err(|e| e.to_string())
    }
    match route {
        BodyRoute::BigBenRegisterTenant => {
            parse::<crate::bigben::tenants::ProcessorConfig>(body).map(drop)
        }
        BodyRoute::BigBenSchedule => {
            parse::<Vec<crate::bigben::schedule::EventRequest>>(body).map(drop)
        }
        BodyRoute::BigBenCron => parse::<crate::bigben::cron::CronRequest>(body).map(drop),
        BodyRoute::PutTenant => parse::<crate::v1::tenants::PutTenant>(body).map(drop),
        BodyRoute::RotateSigningSecret => parse::<crate::v1::signing::Rotate>(body).map(drop),
        BodyRoute::PutEvent => parse::<crate::v1::events::PutEvent>(body).map(drop),
        BodyRoute::EventBatch => {
            let batch = parse::<crate::v1::events::Batch>(body)?;
            for item in batch.events {
                deserialize_naming_field::<crate::v1::events::BatchItem, _>(item)?;
            }
            Ok(())
        }
        BodyRoute::PutSchedule => parse::<crate::v1::schedules::PutSchedule>(body).map(drop),
        BodyRoute::CreateBulkAction => parse::<crate::v1::bulk::CreateBulkAction>(body).map(drop),
        BodyRoute::Claim => valid(parse::<ClaimBody>(body)?.validate()),
        BodyRoute::CompleteBatch => {
            parse::<crate::v1::lease_batch::CompleteBatchBody>(body).map(drop)
        }
        BodyRoute::Heartbeat => valid(parse::<HeartbeatBody>(body)?.validate()),
        BodyRoute::Complete => valid(parse::<CompleteBody>(body)?.validate()),
        BodyRoute::Fail => valid(parse::<FailBody>(body)?.validate()),
        BodyRoute::Release => valid(parse::<ReleaseBody>(body)?.validate()),
        BodyRoute::CreateKey => parse::<crate::auth::routes::CreateKey>(body).map(drop),
    }
}

/// Whether `message` (an answer to `input`) names a Rust type or shows
/// serde's parser position, other than by echoing the input: `Some(name)`
/// if it does.
pub fn leaked_rust_name(message: &str, input: &[u8]) -> Option<&'static str> {
    let name = crate::extract::rust_type_name_in(message)?;
    // An answer may quote what the client sent ("unknown field `u64`"),
    // and a field path adds `:` to a quoted name (`alloc:` → `alloc::`).
    let echoed = String::from_utf8_lossy(input).contains(name.trim_end_matches(':'));
    (!echoed).then_some(name)
}
