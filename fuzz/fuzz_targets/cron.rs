//! Cron expressions of every kind, in a zone: parsing never panics, and a
//! parsed expression's next occurrences are strictly increasing and its
//! description renders.
#![no_main]

use belfry_core::{CronKind, CronSpec, Timestamp};
use libfuzzer_sys::fuzz_target;

const KINDS: [CronKind; 5] = [
    CronKind::Unix,
    CronKind::Quartz,
    CronKind::Spring,
    CronKind::Cron4j,
    CronKind::Every,
];
const ZONES: [Option<&str>; 4] = [
    None,
    Some("Europe/Berlin"),
    Some("America/New_York"),
    Some("Australia/Lord_Howe"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let kind = KINDS[usize::from(selector) % KINDS.len()];
    // The upper bits pick a zone, or (when the text has a '|') the part
    // after the bar is the zone name itself, unchecked.
    let (expression, zone) = match text.split_once('|') {
        Some((expression, zone)) if selector & 0x80 != 0 => (expression, Some(zone)),
        _ => (text, ZONES[usize::from(selector >> 3) % ZONES.len()]),
    };
    let Ok(spec) = CronSpec::parse(expression, kind, zone) else {
        return;
    };
    let _ = spec.describe();
    let mut after = Timestamp::from_millis(1_700_000_000_000);
    for _ in 0..4 {
        match spec.next_after(after) {
            Some(next) => {
                assert!(
                    next > after,
                    "next occurrence {next:?} is not after {after:?}"
                );
                after = next;
            }
            None => break,
        }
    }
});
