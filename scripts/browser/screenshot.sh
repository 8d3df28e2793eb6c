#!/usr/bin/env bash
# A full-length PNG of an HTML file (e.g. the report of `cdcflow report`) in headless Chromium,
# offline: scripts/browser/screenshot.sh report.html report.png [WIDTH] [HEIGHT]
# (Chromium from scripts/browser/install.sh; the flags keep it off this machine's closed
# network; 60 s at most.)
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
page="$(realpath "$1")"
out="$(realpath -m "$2")"
width="${3:-1150}"
height="${4:-2900}"
browser="$(bash "$(dirname "$0")/install.sh" | tail -n 1)"
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
timeout 60 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --virtual-time-budget=5000 \
  --window-size="$width,$height" --screenshot="$out" "file://$page" >/dev/null 2>&1
[ -s "$out" ] || { echo "screenshot: $out was not written" >&2; exit 1; }
echo "screenshot: $out"
