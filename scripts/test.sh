#!/usr/bin/env bash
# The whole test suite: unit, property, integration and end-to-end tests
# against real Postgres clusters and HTTP receivers started by the tests.
# Usage: scripts/test.sh [extra cargo-nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/walhook-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

scripts/ensure-postgres.sh

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --profile ci "$@"
else
  echo "cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest)" >&2
  cargo test --workspace "$@"
fi
