#!/usr/bin/env bash
# Run a command (the test suite) with the services its tests need, set up on the way:
#
#   PostgreSQL 15 + wal2json   installed when missing (scripts/postgres/install.sh), started when
#                              not running (scripts/postgres/start.sh), and afterwards stopped if
#                              this script started it — its data folder removed too when this
#                              script created it (it may live under /var/tmp, see start.sh).
#
# The server's port is exported as CDCFLOW_PG_PORT: the running server's, else 55432, else the
# next free port when another server already listens on 55432. When PostgreSQL cannot be
# installed or started, the command still runs (every other test is worth running) and the
# PostgreSQL tests fail with the reason.
#
#   Kafka + Kafka Connect      (scripts/kafka: a KRaft broker, Connect standalone with the
#                              Debezium PostgreSQL plugin, jars from Maven) installed when missing
#                              and started when not running, stopped afterwards if this script
#                              started them; when they cannot start, the Kafka tests fail with
#                              the reason (their fixtures try again).
#
#   Chromium                   (Debian's package, scripts/browser/install.sh) installed when
#                              missing, for the report's browser test; its path is exported as
#                              CDCFLOW_CHROMIUM; when it cannot be installed, that test fails
#                              with the reason.
#
# Usage: scripts/with-services.sh COMMAND [ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."

DATA="${CDCFLOW_PG_DATA:-./.pgdata}"
export CDCFLOW_PG_DATA="$DATA"

listening() {  # something accepts TCP connections on 127.0.0.1:$1
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

if [ -z "${CDCFLOW_PG_PORT:-}" ]; then
  port=""
  if [ -f "$DATA/postmaster.pid" ] && [ -e "/proc/$(head -n 1 "$DATA/postmaster.pid")" ]; then
    port="$(sed -n 4p "$DATA/postmaster.pid")"  # this checkout's server is already up
  else
    for candidate in $(seq 55432 55499); do
      if ! listening "$candidate"; then port="$candidate"; break; fi
    done
  fi
  export CDCFLOW_PG_PORT="${port:-55432}"
fi

stops=()
created=0
[ -f "$DATA/PG_VERSION" ] || created=1
stop_args=()
[ "$created" -eq 1 ] && stop_args=(--purge)
if ! bash scripts/postgres/install.sh; then
  echo "postgres: PostgreSQL 15 + wal2json could not be installed (see above):" \
    "the PostgreSQL tests will fail" >&2
elif ! out="$(bash scripts/postgres/start.sh)"; then
  echo "postgres: the server did not start (see above): the PostgreSQL tests will fail" >&2
else
  printf '%s\n' "$out" | sed '$d'
  if grep -q '^postgres: started' <<<"$out"; then
    stops+=('bash scripts/postgres/stop.sh "${stop_args[@]}"')
  fi
fi

# Kafka's ports (exported for the tests): the given ones; else, when this checkout's broker is
# not running, the first free pair from 39092 (broker, controller) and the first free port from
# 38083 (Connect) — another checkout's stack may hold the defaults
if [ -z "${CDCFLOW_KAFKA_PORT:-}" ] && ! (. scripts/kafka/env.sh && role_pid kafka >/dev/null); then
  for candidate in $(seq 39092 2 39190); do
    if ! listening "$candidate" && ! listening $((candidate + 1)); then
      export CDCFLOW_KAFKA_PORT="$candidate" CDCFLOW_KAFKA_CONTROLLER_PORT=$((candidate + 1))
      break
    fi
  done
fi
if [ -z "${CDCFLOW_CONNECT_PORT:-}" ] && ! (. scripts/kafka/env.sh && role_pid connect >/dev/null); then
  for candidate in $(seq 38083 38183); do
    if ! listening "$candidate"; then export CDCFLOW_CONNECT_PORT="$candidate"; break; fi
  done
fi
if ! kafka_out="$(bash scripts/kafka/start.sh --connect 2>&1)"; then
  printf '%s\n' "$kafka_out" >&2
  echo "kafka: the broker or Connect did not start (see above): the Kafka tests will fail" >&2
else
  printf '%s\n' "$kafka_out" | grep -E '^(kafka|connect):' || true
  if grep -qE '^(kafka|connect): started' <<<"$kafka_out"; then
    stops=('bash scripts/kafka/stop.sh' "${stops[@]}")
  fi
fi
if browser="$(bash scripts/browser/install.sh)"; then
  export CDCFLOW_CHROMIUM="$(printf '%s\n' "$browser" | tail -n 1)"
else
  echo "browser: Chromium could not be installed (see above): the report's browser test will" \
    "fail" >&2
fi

if [ "${#stops[@]}" -gt 0 ]; then
  trap 'for stop in "${stops[@]}"; do eval "$stop"; done' EXIT
  trap 'exit 130' INT TERM
fi

"$@"
