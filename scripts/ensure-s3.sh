#!/usr/bin/env bash
# Makes sure the S3-compatible test server `s3s-fs` is on this machine.
# The object-store contract suite and the archive tests start it on a free
# loopback port; they find it through WALHOOK_S3S_FS or in
# $HOME/.cache/walhook-tools/bin, and fail (never skip) without it.
#
# 0.14.1 is pinned: 0.17 needs a newer rustc than the project's toolchain.
set -euo pipefail

root="$HOME/.cache/walhook-tools"
bin="$root/bin/s3s-fs"
version="0.14.1"

if [ -n "${WALHOOK_S3S_FS:-}" ] && "$WALHOOK_S3S_FS" --help >/dev/null 2>&1; then
  echo "s3s-fs is installed: $WALHOOK_S3S_FS (WALHOOK_S3S_FS)" >&2
  exit 0
fi
if [ -x "$bin" ] && "$bin" --help >/dev/null 2>&1; then
  echo "s3s-fs is installed: $bin" >&2
  exit 0
fi

echo "installing s3s-fs $version into $root (cargo install; this compiles for a few minutes)" >&2
# A target directory of its own keeps this build out of the workspace's.
CARGO_TARGET_DIR="$root/target" cargo install s3s-fs \
  --version "$version" --features binary --locked --root "$root"
rm -rf "$root/target"

if ! "$bin" --help >/dev/null 2>&1; then
  echo "s3s-fs was installed to $bin but does not run" >&2
  exit 1
fi
echo "s3s-fs is installed: $bin" >&2
