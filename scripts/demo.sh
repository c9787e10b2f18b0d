#!/usr/bin/env bash
# Runs the walhook demo on the embedded defaults: a throwaway Postgres, the
# embedded log and local receivers. Usage: scripts/demo.sh [walhook demo flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/walhook-target}"
scripts/ensure-postgres.sh
cargo build --release -q -p walhook
exec "$CARGO_TARGET_DIR/release/walhook" demo "$@"
