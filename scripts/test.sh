#!/usr/bin/env bash
# The whole test suite: unit, property, integration and end-to-end tests
# against real Postgres clusters and HTTP receivers started by the tests, and
# signatures checked by the official customer libraries (Python).
# Usage: scripts/test.sh [extra cargo-nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/walhook-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

scripts/ensure-postgres.sh
# The S3-compatible server of the object-store and archive tests (s3s-fs,
# built once into $HOME/.cache/walhook-tools). The tests fail without it.
scripts/ensure-s3.sh
export WALHOOK_S3S_FS="${WALHOOK_S3S_FS:-$HOME/.cache/walhook-tools/bin/s3s-fs}"
# Headless Chromium and chromedriver (Debian's packages) for the browser test
# of the reconciliation's HTML report. The test fails without them.
scripts/ensure-chromium.sh
# The previous release (the first row of RELEASES.md) for the rolling-upgrade
# test, built once from git history into ~/.cache/walhook-releases (the
# first time takes as long as a build of walhook). The test fails without it.
if [ -z "${WALHOOK_PREVIOUS_RELEASE:-}" ]; then
  WALHOOK_PREVIOUS_RELEASE="$(scripts/ensure-previous-release.sh)"
  export WALHOOK_PREVIOUS_RELEASE
fi
# A Fluvio cluster for the scale-out tests: no registry serves the Fluvio
# server, so the tests start one (one or three SPUs, plain or TLS) from the
# programs built from Fluvio's source (bin/fluvio-run, bin/fluvio) in
# $WALHOOK_FLUVIO_TOOLS, else shared/tools/fluvio beside the checkout or
# beside a folder above it; or they use the cluster named by
# WALHOOK_FLUVIO_ENDPOINT. Where the tools are found the tests must run
# (WALHOOK_FLUVIO_REQUIRED=1); elsewhere they print that they were skipped.
if [ -z "${WALHOOK_FLUVIO_TOOLS:-}" ]; then
  d="$(dirname "$PWD")"
  while :; do
    if [ -x "$d/shared/tools/fluvio/bin/fluvio-run" ] && [ -x "$d/shared/tools/fluvio/bin/fluvio" ]; then
      export WALHOOK_FLUVIO_TOOLS="$d/shared/tools/fluvio"
      break
    fi
    [ "$d" = / ] && break
    d="$(dirname "$d")"
  done
fi
if [ -n "${WALHOOK_FLUVIO_TOOLS:-}" ] || [ -n "${WALHOOK_FLUVIO_ENDPOINT:-}" ]; then
  export WALHOOK_FLUVIO_REQUIRED=1
else
  echo "no Fluvio tools found (set WALHOOK_FLUVIO_TOOLS or WALHOOK_FLUVIO_ENDPOINT): the Fluvio tests will say they were skipped" >&2
fi

# The PyPI packages `standardwebhooks` and `svix`, in a virtualenv of their
# own, reinstalled only when tests/python-requirements.txt changes. The
# end-to-end tests find it through WALHOOK_PYTHON and fail (never skip)
# without it.
ensure_python_libs() {
  local venv="${WALHOOK_VENV:-$HOME/.cache/walhook-venv}"
  local reqs="tests/python-requirements.txt"
  local stamp="$venv/.walhook-requirements.sha256"
  local want
  want="$(sha256sum "$reqs" | cut -d' ' -f1)"
  if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is needed to verify signatures with the official libraries:" >&2
    echo "  Debian/Ubuntu: sudo apt-get install -y python3 python3-venv" >&2
    exit 1
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "creating the Python virtualenv $venv" >&2
    python3 -m venv "$venv" || {
      echo "cannot create a virtualenv: install python3-venv (Debian/Ubuntu: sudo apt-get install -y python3-venv)" >&2
      exit 1
    }
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
     || ! "$venv/bin/python" -c "import standardwebhooks, svix, schemathesis" 2>/dev/null; then
    echo "installing $reqs into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
    echo "$want" > "$stamp"
  fi
  export WALHOOK_PYTHON="$venv/bin/python"
}
ensure_python_libs

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --profile ci "$@"
else
  echo "cargo-nextest not found; using cargo test (install it with: cargo install cargo-nextest)" >&2
  cargo test --workspace "$@"
fi
