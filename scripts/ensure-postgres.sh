#!/usr/bin/env bash
# Makes sure PostgreSQL server binaries (initdb, postgres) are on this machine.
# walhook's demo, benchmarks and tests start throwaway clusters from them.
set -euo pipefail

have_pg() {
  if [ -n "${WALHOOK_PG_BIN:-}" ] && [ -x "$WALHOOK_PG_BIN/initdb" ]; then return 0; fi
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
  done
  command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1
}

if have_pg; then exit 0; fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL server binaries are missing: installing Debian's postgresql package" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-client >/dev/null
  have_pg && exit 0
fi

cat >&2 <<'MSG'
PostgreSQL server binaries (initdb, postgres) were not found.
Install them, then run this command again:
  Debian/Ubuntu:  sudo apt-get install -y postgresql
  Fedora:         sudo dnf install -y postgresql-server
  macOS:          brew install postgresql@16
Or point WALHOOK_PG_BIN at the directory that holds initdb.
MSG
exit 1
