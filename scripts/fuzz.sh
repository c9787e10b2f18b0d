#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a short while (coverage-guided,
# libFuzzer), as CI does after the tests.
#
# Usage: scripts/fuzz.sh [seconds per target, default $WALHOOK_FUZZ_SECONDS or 20]
#
# Needs a nightly toolchain (`rustup toolchain install nightly`); without
# one it says so and exits 0, because the stable property tests cover the
# same properties in `scripts/test.sh`. cargo-fuzz itself is not needed: the
# targets are built with the same coverage flags it passes. For long runs
# use cargo-fuzz directly: `cd fuzz && cargo +nightly fuzz run pgoutput`.
#
# The corpus persists in ~/.cache/walhook-fuzz-corpus/<target>, so every run
# starts where the last one stopped. A crash stops the script with the
# input's path, to replay with `<target binary> <crash file>`.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-${WALHOOK_FUZZ_SECONDS:-20}}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "scripts/fuzz.sh: seconds per target must be a positive whole number, got '$seconds'" >&2
  exit 2
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzzing skipped: no nightly toolchain (install one with: rustup toolchain install nightly)"
  exit 0
fi

# A lock file that no longer matches the workspace is walhook's mistake, not
# the toolchain's: it fails, never skips.
if ! cargo metadata --locked --format-version 1 >/dev/null 2>&1; then
  echo "fuzz/Cargo.lock does not match the workspace: run 'cd fuzz && cargo update --workspace' and commit it" >&2
  exit 1
fi
host="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR="${WALHOOK_FUZZ_TARGET_DIR:-$HOME/.cache/walhook-fuzz-target}"
# The flags cargo-fuzz passes (without a sanitizer: the code under test is
# safe Rust, so panics and aborts are what there is to find).
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
if ! cargo +nightly build --release --locked --bins --target "$host" -q; then
  # Nightly moves under us; a toolchain that cannot build the targets is
  # not a finding about walhook. Say so loudly and let the stable tests
  # stand.
  echo "fuzzing skipped: the fuzz targets did not build with $(cargo +nightly --version) (see above)" >&2
  exit 0
fi

corpus_root="${WALHOOK_FUZZ_CORPUS:-$HOME/.cache/walhook-fuzz-corpus}"
crashes="$(mktemp -d "${TMPDIR:-/tmp}/walhook-fuzz-crashes.XXXXXX")"
for bin in fuzz_targets/*.rs; do
  target="$(basename "$bin" .rs)"
  mkdir -p "$corpus_root/$target"
  echo "== fuzz $target for ${seconds}s (corpus $corpus_root/$target)"
  if ! "$CARGO_TARGET_DIR/$host/release/$target" \
      -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$crashes/$target-" -print_final_stats=1 \
      "$corpus_root/$target" 2>"$crashes/$target.log"; then
    tail -40 "$crashes/$target.log" >&2
    echo "fuzz target $target failed; the input is in $crashes (replay: $CARGO_TARGET_DIR/$host/release/$target <file>)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$crashes/$target.log" | sed 's/^/  /'
done
rm -rf "$crashes"
