#!/usr/bin/env bash
# Stop the local PostgreSQL started by start.sh (idempotent). CDCFLOW_PG_DATA as for start.sh.
# With --purge, also delete the data folder.
set -euo pipefail

PGBIN="${CDCFLOW_PG_BIN:-/usr/lib/postgresql/15/bin}"
DATA="${CDCFLOW_PG_DATA:-./.pgdata}"
if [ ! -f "$DATA/PG_VERSION" ]; then
  echo "postgres: no data folder at $DATA"
  exit 0
fi
DATA="$(cd "$DATA" && pwd -P)"  # start.sh may have placed it behind a symlink
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}
if as_pg "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  as_pg "$PGBIN/pg_ctl" -D "$DATA" -w -t 60 -m fast stop >/dev/null
  echo "postgres: stopped (data $DATA)"
else
  echo "postgres: not running (data $DATA)"
fi
if [ "${1:-}" = "--purge" ]; then
  rm -rf "$DATA"
  [ -L "${CDCFLOW_PG_DATA:-./.pgdata}" ] && rm -f "${CDCFLOW_PG_DATA:-./.pgdata}"
  echo "postgres: removed $DATA"
fi
