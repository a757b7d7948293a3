//! The API's knobs. The doc comments are the user's configuration reference.

use std::time::Duration;

use belfry_core::config::{ConfigKeys, Problems};
use serde::{Deserialize, Serialize};

/// Limits and BigBen compatibility settings of the HTTP API (`[api]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct ApiOptions {
    /// Largest accepted request body, in bytes; larger bodies are refused
    /// with `413` before they are parsed.
    pub max_body_bytes: usize,
    /// Most events accepted in one request (`POST /events/schedule`, the
    /// `/v1` batch); more is refused with `400` and nothing is stored.
    pub max_batch: usize,
    /// BigBen's lapse offset: an event whose time is before `now +
    /// lapse_offset_ms` is answered `TRIGGERED` by `POST /events/schedule`.
    /// It is still stored and never fired before its own instant.
    #[serde(with = "belfry_core::time::serde_millis", rename = "lapse_offset_ms")]
    pub lapse_offset: Duration,
    /// Page size of listings (`GET /v1/tenants/{tenant}/events`) when
    /// `limit` is not given; at most `max_list_limit`.
    pub default_list_limit: usize,
    /// Largest `limit` accepted by list endpoints; larger is `400`.
    pub max_list_limit: usize,
    /// Most bytes of events one answer holds: a listing page ends before
    /// the event that would pass it (with its `next_cursor`), a pull claim
    /// before the payload that would; always at least one event. At most
    /// `max_answer_bytes_in_flight`.
    pub max_answer_bytes: usize,
    /// Most bytes of such answers the node holds at once, from before
    /// their store reads until their last byte is handed to the client's
    /// connection (slow readers hold theirs longer). A request that finds
    /// it spent waits up to 2 s, then gets `503 answers_busy` with
    /// `Retry-After`.
    pub max_answer_bytes_in_flight: usize,
}

impl ApiOptions {
    /// Refuses zero sizes and limits, and a default page or answer larger
    /// than its bound, naming their keys.
    pub fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("max_body_bytes", self.max_body_bytes);
        problems.at_least_one("max_batch", self.max_batch);
        problems.at_least_one("default_list_limit", self.default_list_limit);
        problems.at_least_one("max_list_limit", self.max_list_limit);
        problems.at_least_one("max_answer_bytes", self.max_answer_bytes);
        problems.at_least_one(
            "max_answer_bytes_in_flight",
            self.max_answer_bytes_in_flight,
        );
        for (smaller, value, bound, bound_value) in [
            (
                "max_answer_bytes",
                self.max_answer_bytes,
                "max_answer_bytes_in_flight",
                self.max_answer_bytes_in_flight,
            ),
            (
                "default_list_limit",
                self.default_list_limit,
                "max_list_limit",
                self.max_list_limit,
            ),
        ] {
            if value > bound_value {
                problems.push(format!(
                    "{} ({value}) must not exceed {} ({bound_value})",
                    problems.key(smaller),
                    problems.key(bound)
                ));
            }
        }
    }
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            max_body_bytes: 1024 * 1024,
            max_batch: 10_000,
            lapse_offset: Duration::ZERO,
            default_list_limit: 100,
            max_list_limit: 1_000,
            max_answer_bytes: 4 * 1024 * 1024,
            max_answer_bytes_in_flight: 256 * 1024 * 1024,
        }
    }
}
