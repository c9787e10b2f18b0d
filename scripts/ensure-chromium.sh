#!/usr/bin/env bash
# Makes sure headless Chromium and its WebDriver (chromedriver) are on this
# machine. The HTML report test of `reconcile` opens the auditor's page in a
# real browser through chromedriver, measures the funnel chart and takes a
# screenshot; it fails (never skips) without them, unless
# WALHOOK_SKIP_BROWSER=1 says to skip it.
#
# Debian's packages only: the browser is never downloaded from elsewhere.
set -euo pipefail

chromium="${WALHOOK_CHROMIUM:-/usr/bin/chromium}"
chromedriver="${WALHOOK_CHROMEDRIVER:-/usr/bin/chromedriver}"

have_browser() {
  [ -x "$chromium" ] && [ -x "$chromedriver" ]
}

if have_browser; then exit 0; fi

# Root installs directly; anyone else through sudo when it works without a
# password prompt (CI has no terminal to type one into).
sudo=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo="sudo -n"
fi

if { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; } && command -v apt-get >/dev/null 2>&1; then
  echo "Chromium or chromedriver is missing: installing Debian's chromium and chromium-driver packages" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  if have_browser; then
    echo "Chromium is installed: $chromium, $chromedriver" >&2
    exit 0
  fi
fi

cat >&2 <<MSG
Chromium ($chromium) or chromedriver ($chromedriver) was not found.
The HTML report test opens the report in headless Chromium through chromedriver.
Install them, then run this command again:
  Debian:         sudo apt-get install -y chromium chromium-driver
  Ubuntu:         sudo apt-get install -y chromium-browser chromium-chromedriver
  Fedora:         sudo dnf install -y chromium chromedriver
  macOS:          brew install --cask chromium chromedriver
Or point WALHOOK_CHROMIUM and WALHOOK_CHROMEDRIVER at the binaries, or set
WALHOOK_SKIP_BROWSER=1 to skip the browser test (it says so when skipped).
MSG
exit 1
