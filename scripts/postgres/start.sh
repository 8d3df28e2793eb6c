#!/usr/bin/env bash
# Start a local PostgreSQL 15 for the cdcflow demo and tests (idempotent).
#
#   CDCFLOW_PG_DATA   data folder (default ./.pgdata, created by initdb on first start)
#   CDCFLOW_PG_PORT   TCP port on 127.0.0.1 (default 55432)
#   CDCFLOW_PG_DB     database to create (default cdcflow)
#
# Configured for logical decoding (wal_level=logical, replication slots, wal2json available).
# Local TCP connections use trust authentication: a throw-away demo/test server, never a real one.
# The server runs as the `postgres` OS user when started by root (PostgreSQL refuses to run as
# root). Prints the DSN on the last line.
set -euo pipefail

PGBIN="${CDCFLOW_PG_BIN:-/usr/lib/postgresql/15/bin}"
DATA="${CDCFLOW_PG_DATA:-./.pgdata}"
PORT="${CDCFLOW_PG_PORT:-55432}"
DB="${CDCFLOW_PG_DB:-cdcflow}"
mkdir -p "$DATA"
DATA="$(cd "$DATA" && pwd -P)"
if [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -x "$(dirname "$DATA")"; then
  # the postgres user cannot reach the folder (e.g. a checkout under a private `mktemp -d`):
  # keep the data where it can, and leave a symlink at the requested path
  alt="/var/tmp/cdcflow-pgdata-$(printf '%s' "$DATA" | sha1sum | cut -c1-12)"
  mkdir -p "$alt"
  rmdir "$DATA"
  ln -s "$alt" "$DATA"
  DATA="$alt"
fi

if [ ! -x "$PGBIN/pg_ctl" ]; then
  echo "postgres: $PGBIN/pg_ctl not found; run scripts/postgres/install.sh first" >&2
  exit 1
fi
if [ ! -f /usr/lib/postgresql/15/lib/wal2json.so ] && [ ! -f "$PGBIN/../lib/wal2json.so" ]; then
  echo "postgres: the wal2json plugin is missing; run scripts/postgres/install.sh first" >&2
  exit 1
fi

as_pg() {  # from / : the postgres user may not be allowed into the current folder
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

if [ "$(id -u)" -eq 0 ]; then
  chown postgres:postgres "$DATA"
  chmod 700 "$DATA"
fi

if [ ! -f "$DATA/PG_VERSION" ]; then
  as_pg "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  cat >>"$DATA/postgresql.conf" <<CONF
# --- cdcflow (scripts/postgres/start.sh) ---
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DATA'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 16
max_connections = 100
fsync = off
full_page_writes = off
CONF
fi

if as_pg "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  echo "postgres: already running (data $DATA)"
else
  as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 -o "-p $PORT" start >/dev/null
  echo "postgres: started on 127.0.0.1:$PORT (data $DATA)"
fi

if ! as_pg "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
  as_pg "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -qc "CREATE DATABASE \"$DB\""
fi
echo "postgresql://postgres@127.0.0.1:$PORT/$DB"
