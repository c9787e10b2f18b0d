#!/usr/bin/env bash
# A production build of walhook: without the lab (demo, bench, chaos and the
# throwaway clusters of walhook-devkit), its debug info moved into
# dist/walhook.debug (with the symbol table), and a stripped dist/walhook that names that file
# (.gnu_debuglink), so gdb and symbolizers find it when it is beside the
# binary or under /usr/lib/debug.
#   scripts/release.sh            # builds into $CARGO_TARGET_DIR (release profile)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/walhook-target}"
command -v objcopy >/dev/null || { echo "objcopy is needed (Debian/Ubuntu: sudo apt-get install -y binutils)" >&2; exit 1; }
cargo build --release --no-default-features -p walhook
mkdir -p dist
built="$CARGO_TARGET_DIR/release/walhook"
objcopy --only-keep-debug "$built" dist/walhook.debug
objcopy --strip-all --add-gnu-debuglink=dist/walhook.debug "$built" dist/walhook
ls -l dist/walhook dist/walhook.debug
dist/walhook --version
