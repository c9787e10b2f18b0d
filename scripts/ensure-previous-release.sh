#!/usr/bin/env bash
# The previous release's walhook, for the rolling-upgrade test: the commit
# in the first row of RELEASES.md, built once from this repository's git
# history (no lab, no debug info) into ~/.cache/walhook-releases/COMMIT/walhook
# and reused afterwards. Prints the program's path on stdout.
# The first build takes as long as a build of walhook (10-15 minutes on two
# cores); WALHOOK_RELEASES_CACHE moves the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${WALHOOK_RELEASES_CACHE:-$HOME/.cache/walhook-releases}"
commit="$(sed -nE 's/^\| *[^|]+ *\| *([0-9a-f]{40}) *\|.*/\1/p' RELEASES.md | head -n1)"
if [ -z "$commit" ]; then
  echo "RELEASES.md names no release commit (a row: | version | 40-hex commit | …)" >&2
  exit 1
fi
out="$cache/$commit/walhook"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "commit $commit (RELEASES.md) is not in this clone's history: fetch it (git fetch --unshallow, or git fetch origin $commit)" >&2
  exit 1
fi
echo "building the previous release $commit for the rolling-upgrade test (once; cached in $cache)" >&2
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
git archive "$commit" | tar -x -C "$src"
(
  cd "$src"
  CARGO_TARGET_DIR="$cache/target" CARGO_PROFILE_DEV_DEBUG=0 CARGO_INCREMENTAL=0 \
    cargo build --locked --quiet -p walhook --no-default-features
)
mkdir -p "$(dirname "$out")"
cp "$cache/target/debug/walhook" "$out.tmp"
mv "$out.tmp" "$out"
echo "$out"
