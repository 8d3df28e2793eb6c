#!/usr/bin/env bash
# Chromium for the report's browser test (tests/test_report.py): Debian's `chromium` package,
# installed with apt-get when /usr/bin/chromium (or $CDCFLOW_CHROMIUM) is missing. Idempotent;
# prints the browser's path on the last line.
set -euo pipefail
BROWSER="${CDCFLOW_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$BROWSER" ]; then
  echo "$BROWSER"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser: $BROWSER missing and apt-get is not available: install Chromium" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
[ -x "$BROWSER" ] || { echo "browser: chromium installed but $BROWSER is missing" >&2; exit 1; }
echo "browser: installed $("$BROWSER" --version 2>/dev/null || echo chromium)" >&2
echo "$BROWSER"
