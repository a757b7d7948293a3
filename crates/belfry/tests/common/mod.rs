//! Helpers shared by the process-level tests.

// Each test binary compiles this module and uses a subset of it.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the UNIX epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// `ms` as RFC 3339 UTC with milliseconds (`2030-01-31T04:00:30.250Z`).
pub fn rfc3339(ms: i64) -> String {
    belfry_core::Timestamp::from_millis(ms).to_rfc3339()
}
