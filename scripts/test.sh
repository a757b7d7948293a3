#!/usr/bin/env bash
# Runs Belfry's whole test suite: formatting, lints, every crate's tests
# (store conformance, API, delivery, crash tests against the real binary)
# and a smoke run of belfry-bench. Needs the Rust toolchain (1.95); installs
# PostgreSQL (apt) when it is missing, for the tests that start throwaway
# database servers. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "==> PostgreSQL binaries"
# The PostgreSQL tests start their own throwaway servers from these binaries
# (or use BELFRY_TEST_DATABASE_URL when it is set).
if ! command -v pg_config >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "error: PostgreSQL is not installed and this user can neither install it (not root, no sudo)." >&2
    echo "Install the 'postgresql' package, or set BELFRY_TEST_DATABASE_URL to a server." >&2
    exit 1
  fi
  if ! { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }; then
    echo "error: installing PostgreSQL with apt-get failed; install the 'postgresql' package by hand." >&2
    exit 1
  fi
fi

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
