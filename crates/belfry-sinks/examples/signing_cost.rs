//! CPU cost of signing one delivery (Standard Webhooks), per body size and
//! number of live secrets. Run with
//! `cargo run --release -p belfry-sinks --example signing_cost`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests time real work on the system clock"
)]

use std::hint::black_box;
use std::time::Instant;

use belfry_core::{SigningSecrets, Timestamp};
use belfry_sinks::signing::{Signer, generate_secret};

fn main() {
    let one = Signer::new(&SigningSecrets::new(generate_secret())).expect("a valid secret");
    let two = Signer::new(
        &SigningSecrets::new(generate_secret())
            .rotated(generate_secret(), Timestamp::from_millis(i64::MAX)),
    )
    .expect("valid secrets");
    let now = Timestamp::from_millis(0);
    for size in [350usize, 4_096, 65_536] {
        let body = vec![b'x'; size];
        for (label, signer) in [("1 secret ", &one), ("2 secrets", &two)] {
            let rounds = 200_000 * 350 / size.max(350);
            let started = Instant::now();
            for _ in 0..rounds {
                black_box(signer.signature(
                    black_box("0193a7c2-version"),
                    black_box("1764000000"),
                    black_box(&body),
                    now,
                ));
            }
            let per = started.elapsed().as_nanos() / rounds as u128;
            println!("body {size:>6} B, {label}: {per:>6} ns per delivery");
        }
    }
}
