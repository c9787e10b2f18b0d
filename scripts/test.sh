#!/usr/bin/env bash
# The whole test suite: unit, property, integration and end-to-end tests
# against real Postgres clusters and HTTP receivers started by the tests.
# Usage: scripts/test.sh [extra cargo-nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/walhook-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

scripts/ensure-postgres.sh

# Python tools the tests run (schemathesis), in a virtualenv of their own;
# reinstalled only when tests/python-requirements.txt changes. A failed
# install does not stop the suite: the tests that need a tool fail and say
# how to install it.
venv="${WALHOOK_VENV:-$HOME/.cache/walhook-venv}"
requirements=tests/python-requirements.txt
stamp="$venv/.requirements.sha256"
wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "installing $requirements into $venv" >&2
  if python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"; then
    echo "$wanted" > "$stamp"
  else
    echo "could not install $requirements (the tests that need it will say so)" >&2
  fi
fi
export WALHOOK_PYTHON="$venv/bin/python"

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --profile ci "$@"
else
  echo "cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest)" >&2
  cargo test --workspace "$@"
fi
