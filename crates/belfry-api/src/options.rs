//! The API's knobs. The doc comments are the user's configuration reference.

use serde::{Deserialize, Serialize};

/// Limits and BigBen compatibility settings of the HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiOptions {
    /// Largest accepted request body, in bytes; larger bodies are refused
    /// with `413` before they are parsed. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Most events accepted in one request (`POST /events/schedule`, the
    /// `/v1` batch); more is refused with `400` and nothing is stored.
    /// Default 10,000.
    pub max_batch: usize,
    /// BigBen's lapse offset, in milliseconds: an event whose time is
    /// before `now + lapse_offset_ms` is answered `TRIGGERED` by
    /// `POST /events/schedule`. It is still stored and never fired before
    /// its own instant. Default 0.
    pub lapse_offset_ms: u64,
    /// Page size of `GET /v1/tenants/{tenant}/events` when `limit` is not
    /// given. Default 100.
    pub default_list_limit: usize,
    /// Largest `limit` accepted by list endpoints; larger is `400`.
    /// Default 1,000.
    pub max_list_limit: usize,
    /// Most bytes of items one answer holds (event listings): a page stops
    /// before the item that would pass it and answers its `next_cursor`
    /// as usual; it always holds at least one item. Default 4 MiB.
    pub max_answer_bytes: usize,
    /// Most bytes of such answers the node holds at once, from before
    /// their store reads until their last byte is handed to the client's
    /// connection (slow readers hold theirs longer). A request that finds
    /// it spent waits up to 2 s, then gets `503 answers_busy` with
    /// `Retry-After`. Default 256 MiB.
    pub max_answer_bytes_in_flight: usize,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            max_body_bytes: 1024 * 1024,
            max_batch: 10_000,
            lapse_offset_ms: 0,
            default_list_limit: 100,
            max_list_limit: 1_000,
            max_answer_bytes: 4 * 1024 * 1024,
            max_answer_bytes_in_flight: 256 * 1024 * 1024,
        }
    }
}
