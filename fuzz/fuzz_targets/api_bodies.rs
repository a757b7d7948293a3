//! Request bodies of every body-taking route of both APIs (BigBen's and
//! `/v1`): parsing never panics, and a refusal says what is wrong in the
//! API's words, never naming a Rust type. The first byte picks the route.
#![no_main]

use belfry_api::bodies::{BodyRoute, check_body, leaked_rust_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let route = BodyRoute::ALL[usize::from(selector) % BodyRoute::ALL.len()];
    if let Err(message) = check_body(route, body) {
        assert_eq!(
            leaked_rust_name(&message, body),
            None,
            "{route:?} answered {message:?}"
        );
    }
});
