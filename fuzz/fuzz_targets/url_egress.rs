//! Webhook URLs and the egress check: validation never panics; a valid URL,
//! rendered, validates again to the same URL; the egress check of an IP
//! host never panics and maps IPv4-mapped and NAT64 addresses consistently.
#![no_main]

use std::net::IpAddr;

use belfry_core::tenant::validate_url;
use belfry_sinks::egress::{EgressMode, EgressOptions, EgressPolicy, canonical};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let internal = EgressPolicy::new(EgressOptions::default());
    let public_only = EgressPolicy::new(EgressOptions {
        policy: EgressMode::PublicOnly,
        ..EgressOptions::default()
    });
    // The text itself as an address (what a resolver could return).
    if let Ok(address) = text.parse::<IpAddr>() {
        check_address(&internal, &public_only, address);
    }
    let _ = text.parse::<belfry_sinks::egress::Cidr>();
    let Ok(url) = validate_url(text) else {
        return;
    };
    let again = validate_url(url.as_str())
        .unwrap_or_else(|e| panic!("{text:?} validated as {url}, which does not: {e}"));
    assert_eq!(again, url);
    let address = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return,
    };
    check_address(&internal, &public_only, address);
});

fn check_address(internal: &EgressPolicy, public_only: &EgressPolicy, address: IpAddr) {
    let mapped = canonical(address);
    assert_eq!(canonical(mapped), mapped, "canonical is not idempotent");
    // The check sees through the mapping: both forms get the same answer.
    assert_eq!(
        internal.check(address).is_ok(),
        internal.check(mapped).is_ok()
    );
    assert_eq!(
        public_only.check(address).is_ok(),
        public_only.check(mapped).is_ok()
    );
    // public-only never allows what internal refuses.
    if public_only.check(address).is_ok() {
        assert!(internal.check(address).is_ok());
    }
}
