#!/usr/bin/env bash
# Runs Belfry's whole test suite: formatting, lints, every crate's tests
# (store conformance, API, delivery, crash tests against the real binary,
# the web console in headless Chromium) and a smoke run of belfry-bench.
# Needs the Rust toolchain (1.95); installs cargo-nextest (from crates.io,
# pinned) and PostgreSQL (apt) when they are missing, for the tests that start throwaway database servers, Chromium
# and its WebDriver (apt: chromium, chromium-driver) for the console's
# browser tests, and python3 with a venv holding PyPI's standardwebhooks
# (the independent signature verifier), confluent-kafka (the independent
# Kafka client), schemathesis (the OpenAPI contract fuzzer) and
# openapi-python-client (a client generated from the OpenAPI document). The Kafka tests run against `belfry-kafka-mock`, librdkafka's
# mock cluster in its own process, or against a real broker named by
# BELFRY_TEST_KAFKA_BOOTSTRAP. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "==> import circles"
# No two modules of a product crate may import each other, directly or
# around a loop (scripts/check_module_cycles.py says how it draws edges).
python3 scripts/check_module_cycles.py

# Installs Debian packages with apt-get, as root or through sudo.
# Usage: apt_install WHAT HINT PACKAGE... (WHAT and HINT for the messages).
apt_install() {
  local what="$1" hint="$2"
  shift 2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "error: $what is missing and this user can neither install it (not root, no sudo)." >&2
      echo "Install the package(s) $*${hint:+, $hint}." >&2
      exit 1
    fi
  fi
  if ! { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; }; then
    echo "error: installing $what with apt-get failed; install the package(s) $* by hand${hint:+, $hint}." >&2
    exit 1
  fi
}

echo "==> PostgreSQL binaries"
# The PostgreSQL tests start their own throwaway servers from these binaries
# (or use BELFRY_TEST_DATABASE_URL when it is set).
if ! command -v pg_config >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt_install PostgreSQL "or set BELFRY_TEST_DATABASE_URL to a server" postgresql
fi

echo "==> Patroni and etcd"
# The database failover tests (crates/belfry/tests/db_failover.rs) run a
# PostgreSQL primary and its synchronous standby under Patroni, with etcd
# as its store (crates/belfry-testkit/src/patroni.rs).
if ! command -v patroni >/dev/null 2>&1 || ! command -v patronictl >/dev/null 2>&1; then
  apt_install Patroni "" patroni
fi
if ! command -v etcd >/dev/null 2>&1; then
  apt_install etcd "" etcd-server
fi
if ! command -v etcdctl >/dev/null 2>&1; then
  apt_install "etcd's client" "" etcd-client
fi

echo "==> Chromium and chromedriver"
# The console's browser tests (crates/belfry/tests/console.rs) drive
# Debian's headless Chromium through chromedriver (or the binaries named by
# BELFRY_TEST_CHROMIUM and BELFRY_TEST_CHROMEDRIVER).
if [ ! -x "${BELFRY_TEST_CHROMIUM:-/usr/bin/chromium}" ] || [ ! -x "${BELFRY_TEST_CHROMEDRIVER:-/usr/bin/chromedriver}" ]; then
  apt_install Chromium "" chromium chromium-driver
fi

echo "==> Python clients (standardwebhooks, confluent-kafka, prometheus-client, schemathesis, openapi-python-client)"
# The end-to-end tests check Belfry with independent clients from PyPI
# (webhook signatures with `standardwebhooks`, Kafka with `confluent-kafka`,
# `/metrics` with Prometheus's own parser from `prometheus-client`, the API
# against its OpenAPI document with `schemathesis`, the README's tour with a
# client that `openapi-python-client` generates from that document),
# in a venv under target/ (pinned there). Make sure python3 and its venv module exist.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  apt_install "python3 (with venv)" "" python3 python3-venv
fi
venv="${CARGO_TARGET_DIR:-target}/belfry-test-venv"
if ! "$venv/bin/python" -c "import standardwebhooks, confluent_kafka, prometheus_client, schemathesis, openapi_python_client" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "standardwebhooks==1.1.0" "confluent-kafka==2.12.2" "prometheus-client==0.21.1" "schemathesis==4.32.5" "openapi-python-client==0.29.1"
fi
export BELFRY_TEST_PYTHON="$PWD/$venv/bin/python"
case "$venv" in /*) export BELFRY_TEST_PYTHON="$venv/bin/python" ;; esac

echo "==> cargo-nextest"
# The suite runs under nextest everywhere, never a `cargo test` fallback:
# `.config/nextest.toml` serializes the tests that start several processes
# and ends a hung test long before CI's limit, and plain `cargo test` would
# do neither. A machine without it builds the pinned version from crates.io
# once (about five minutes on two cores).
nextest_version="0.9.143"
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked "cargo-nextest@$nextest_version" --no-default-features --features default-no-update
fi

echo "==> cargo test"
# The binaries are built first so tests that spawn them find them up to date.
cargo build -p belfry -p belfry-kafka-mock --bins
cargo nextest run --workspace --all-features --no-fail-fast
# nextest does not run doctests.
cargo test --workspace --all-features --doc

echo "==> cargo fuzz (bounded)"
# The parsers of untrusted input (fuzz/README.md) each run briefly against
# their seeds and the corpus kept under fuzz/corpus: a crash or a slow input
# fails the suite. `--sanitizer none` keeps cargo-fuzz on the stable
# toolchain. A machine without it builds the pinned version once (about a
# minute on two cores); the first instrumented build of the targets takes
# about ten.
fuzz_version="0.13.2"
if ! cargo fuzz --version 2>/dev/null | grep -q "$fuzz_version"; then
  cargo install --locked "cargo-fuzz@$fuzz_version"
fi
fuzz_seconds="${BELFRY_TEST_FUZZ_SECONDS:-25}"
for target in $(cargo fuzz list --fuzz-dir fuzz); do
  mkdir -p "fuzz/corpus/$target"
  cargo fuzz run --fuzz-dir fuzz --sanitizer none "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
