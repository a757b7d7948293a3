//! Kafka records (the value of an ingestion topic's record) in both
//! formats: reading never panics, and a refusal says what is wrong in the
//! API's words, never naming a Rust type.
#![no_main]

use belfry_api::bodies::leaked_rust_name;
use belfry_api::ingest::{parse_bigben, parse_v1};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(message) = parse_bigben(data) {
        assert_eq!(leaked_rust_name(&message, data), None, "{message:?}");
    }
    if let Err(message) = parse_v1(data) {
        assert_eq!(leaked_rust_name(&message, data), None, "{message:?}");
    }
});
