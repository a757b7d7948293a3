//! Instants and durations: RFC 3339 parsing never panics and round-trips
//! through rendering; arithmetic saturates instead of overflowing.
#![no_main]

use std::time::Duration;

use belfry_core::Timestamp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let millis = i64::from_le_bytes(data[..8].try_into().unwrap_or_default());
        let span = u64::from_le_bytes(data[8..16].try_into().unwrap_or_default());
        let at = Timestamp::from_millis(millis);
        let d = Duration::from_millis(span);
        let later = at.plus(d);
        assert!(later >= at);
        assert!(at.minus(d) <= at);
        let _ = at.until(later);
        let _ = later.until(at);
        // Any instant renders, and what renders parses back to itself.
        let text = at.to_rfc3339();
        if let Some(back) = Timestamp::parse_rfc3339(&text) {
            assert_eq!(back, at, "{text} parsed to another instant");
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(at) = Timestamp::parse_rfc3339(text) {
        let rendered = at.to_rfc3339();
        assert_eq!(
            Timestamp::parse_rfc3339(&rendered),
            Some(at),
            "{text:?} rendered as {rendered:?}, which does not parse back"
        );
    }
});
