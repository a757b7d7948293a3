#!/usr/bin/env bash
# Runs Belfry's whole test suite: formatting, lints, every crate's tests
# (store conformance, API, delivery, crash tests against the real binary)
# and a smoke run of belfry-bench. Needs the Rust toolchain (1.95); installs
# PostgreSQL (apt) when it is missing, for the tests that start throwaway
# database servers, and python3 with a venv holding PyPI's standardwebhooks
# (the independent signature verifier), confluent-kafka (the independent
# Kafka client) and schemathesis (the OpenAPI contract fuzzer). The Kafka tests run against `belfry-kafka-mock`, librdkafka's
# mock cluster in its own process, or against a real broker named by
# BELFRY_TEST_KAFKA_BOOTSTRAP. Usage: scripts/test.sh
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

echo "==> Python clients (standardwebhooks, confluent-kafka, prometheus-client, schemathesis)"
# The end-to-end tests check Belfry with independent clients from PyPI
# (webhook signatures with `standardwebhooks`, Kafka with `confluent-kafka`,
# `/metrics` with Prometheus's own parser from `prometheus-client`, the API
# against its OpenAPI document with `schemathesis`),
# in a venv under target/ (pinned there). Make sure python3 and its venv module exist.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=""
  elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
  else
    echo "error: python3 (with venv) is missing and this user cannot install it (not root, no sudo)." >&2
    exit 1
  fi
  if ! { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv; }; then
    echo "error: installing python3 with apt-get failed; install 'python3' and 'python3-venv' by hand." >&2
    exit 1
  fi
fi
venv="${CARGO_TARGET_DIR:-target}/belfry-test-venv"
if ! "$venv/bin/python" -c "import standardwebhooks, confluent_kafka, prometheus_client, schemathesis" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "standardwebhooks==1.1.0" "confluent-kafka==2.12.2" "prometheus-client==0.21.1" "schemathesis==4.32.5"
fi
export BELFRY_TEST_PYTHON="$PWD/$venv/bin/python"
case "$venv" in /*) export BELFRY_TEST_PYTHON="$venv/bin/python" ;; esac

echo "==> cargo test"
# The binaries are built first so tests that spawn them find them up to date.
cargo build -p belfry -p belfry-kafka-mock --bins
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast
  # nextest does not run doctests.
  cargo test --workspace --all-features --doc
else
  cargo test --workspace --all-features --no-fail-fast
fi
