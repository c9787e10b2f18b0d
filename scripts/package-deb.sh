#!/usr/bin/env bash
# Debian packages of walhook, built with dpkg-deb from a walhook binary:
#   dist/walhook_VERSION_ARCH.deb      /usr/bin/walhook (stripped), the
#       configuration /etc/walhook/walhook.toml (a conffile, from
#       walhook.example.toml), the systemd units walhook.service and
#       walhook-dispatch.service, the docs under /usr/share/doc/walhook
#   dist/walhook-dbg_VERSION_ARCH.deb  the debug info, as
#       /usr/lib/debug/usr/bin/walhook.debug (gdb finds it through the
#       binary's .gnu_debuglink)
# VERSION is the crate's version and the commit (`walhook --version`).
# Usage:
#   scripts/package-deb.sh            # the production build (scripts/release.sh)
#   scripts/package-deb.sh BINARY     # any build, e.g. the tests' (CI does)
# Install: sudo dpkg -i dist/walhook_*.deb; then docs/operations.md,
# "Installing the Debian package".
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/walhook-target}"
for tool in dpkg-deb objcopy; do
  command -v "$tool" >/dev/null || { echo "$tool is needed (Debian/Ubuntu: sudo apt-get install -y dpkg-dev binutils)" >&2; exit 1; }
done

mkdir -p dist
if [ $# -ge 1 ]; then
  built="$1"
else
  scripts/release.sh >/dev/null
  built="$CARGO_TARGET_DIR/release/walhook"
fi
[ -x "$built" ] || { echo "$built: no such program (build walhook first)" >&2; exit 1; }

# "walhook 0.1.0 (commit 1fd1a3c2598d, schema version 26)" -> 0.1.0+g1fd1a3c2598d
stamp="$("$built" --version)"
version="$(sed -E 's/^walhook ([^ ]+) \(commit ([0-9a-z-]+).*/\1+g\2/; s/-/./g' <<<"$stamp")"
case "$version" in
  [0-9]*) ;;
  *) echo "cannot read a version from: $stamp" >&2; exit 1 ;;
esac
arch="$(dpkg --print-architecture)"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
main="$stage/walhook"
dbg="$stage/walhook-dbg"
install -d "$main/DEBIAN" "$main/usr/bin" "$main/etc/walhook" "$main/lib/systemd/system" \
  "$main/usr/share/doc/walhook" "$dbg/DEBIAN" "$dbg/usr/lib/debug/usr/bin" "$dbg/usr/share/doc"
objcopy --only-keep-debug "$built" "$dbg/usr/lib/debug/usr/bin/walhook.debug"
chmod 0644 "$dbg/usr/lib/debug/usr/bin/walhook.debug"
objcopy --strip-all --add-gnu-debuglink="$dbg/usr/lib/debug/usr/bin/walhook.debug" "$built" "$main/usr/bin/walhook"
chmod 0755 "$main/usr/bin/walhook"
install -m 0644 walhook.example.toml "$main/etc/walhook/walhook.toml"
install -m 0644 packaging/systemd/walhook.service packaging/systemd/walhook-dispatch.service \
  "$main/lib/systemd/system/"
install -m 0644 README.md docs/operations.md "$main/usr/share/doc/walhook/"
install -m 0644 packaging/debian/copyright "$main/usr/share/doc/walhook/copyright"
ln -s walhook "$dbg/usr/share/doc/walhook-dbg"
for script in postinst prerm postrm; do
  install -m 0755 "packaging/debian/$script" "$main/DEBIAN/$script"
done
echo /etc/walhook/walhook.toml > "$main/DEBIAN/conffiles"

size_kib() { du -sk --exclude=DEBIAN "$1" | cut -f1; }
cat > "$main/DEBIAN/control" <<CONTROL
Package: walhook
Version: $version
Architecture: $arch
Maintainer: walhook developers <walhook@users.noreply.github.com>
Section: net
Priority: optional
Depends: libc6, libgcc-s1
Recommends: postgresql-client
Installed-Size: $(size_kib "$main")
Homepage: https://github.com/walhook/walhook
Description: committed Postgres changes as signed webhooks
 walhook tails a Postgres database's WAL through logical replication, turns
 committed row changes into events, fans each out to the subscribed HTTPS
 endpoints and sends Standard-Webhooks-signed attempts with retries,
 fairness and SSRF-safe egress; cold history is archived to Parquet and
 every stage is reconciled. Units: walhook.service (every stage) and
 walhook-dispatch.service (a standalone dispatcher node).
CONTROL
cat > "$dbg/DEBIAN/control" <<CONTROL
Package: walhook-dbg
Version: $version
Architecture: $arch
Maintainer: walhook developers <walhook@users.noreply.github.com>
Section: debug
Priority: optional
Depends: walhook (= $version)
Installed-Size: $(size_kib "$dbg")
Homepage: https://github.com/walhook/walhook
Description: debug info of walhook
 The symbols and DWARF of /usr/bin/walhook, for gdb and symbolizers.
CONTROL

# The build date and owner must not vary the package: root-owned files,
# times from the commit.
epoch="$(git log -1 --format=%ct 2>/dev/null || date +%s)"
find "$stage" -exec touch -h -d "@$epoch" {} +
for pkg in walhook walhook-dbg; do
  out="dist/${pkg}_${version}_${arch}.deb"
  SOURCE_DATE_EPOCH="$epoch" dpkg-deb --root-owner-group -Zgzip -z6 --build "$stage/$pkg" "$out" >/dev/null
  echo "$out ($(du -h "$out" | cut -f1))"
done
