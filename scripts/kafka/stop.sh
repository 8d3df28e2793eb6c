#!/usr/bin/env bash
# Stop the Kafka Connect worker, then the Kafka broker started by scripts/kafka/start.sh
# (idempotent): SIGTERM, then SIGKILL when a JVM has not exited after CDCFLOW_KAFKA_STOP_TIMEOUT
# seconds (default 20). Only the JVMs of this CDCFLOW_KAFKA_HOME are touched (their pid files,
# checked against the JVM's command line).
#
#   CDCFLOW_KAFKA_HOME          as for start.sh (default ./.kafka)
#   CDCFLOW_KAFKA_STOP_TIMEOUT  seconds before SIGKILL (default 20)
#
# Usage: scripts/kafka/stop.sh [--connect] [--purge]
#   --connect  stop only Kafka Connect (e.g. to restart it with other converter settings)
#   --purge    then delete the broker data (topics, KRaft metadata), the Connect offsets and the
#              generated configuration and logs; the jars (lib/, plugins/) are kept
set -euo pipefail
# shellcheck source=scripts/kafka/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

ONLY_CONNECT=0
PURGE=0
for arg in "$@"; do
  case "$arg" in
    --connect) ONLY_CONNECT=1 ;;
    --purge) PURGE=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "kafka: unknown argument $arg (usage: $0 [--connect] [--purge])" >&2; exit 2 ;;
  esac
done
TIMEOUT="${CDCFLOW_KAFKA_STOP_TIMEOUT:-20}"

stop_role() {  # stop_role <role> <label>
  local role=$1 label=$2 pid deadline
  if ! pid="$(role_pid "$role")"; then
    rm -f "$KHOME/$role.pid"  # none, or stale (the JVM was killed, or the machine restarted)
    echo "$label: not running (home $KHOME)"
    return
  fi
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    echo "$label: killed (pid $pid, no exit ${TIMEOUT}s after SIGTERM)"
  else
    echo "$label: stopped (pid $pid)"
  fi
  rm -f "$KHOME/$role.pid"
}

stop_role connect connect
if [ "$ONLY_CONNECT" = 0 ]; then
  stop_role kafka kafka
fi

if [ "$PURGE" = 1 ]; then
  if [ "$ONLY_CONNECT" = 1 ]; then
    rm -rf "$KHOME/connect" "$KHOME/connect.log" "$KHOME/connect.log.1"
    echo "connect: removed the offsets and configuration in $KHOME/connect"
  else
    if role_pid connect >/dev/null || role_pid kafka >/dev/null; then
      echo "kafka: still running, not purging" >&2
      exit 1
    fi
    rm -rf "$KHOME/data" "$KHOME/connect" "$KHOME/config" "$KHOME"/*.log "$KHOME"/*.log.1
    echo "kafka: removed the data, Connect offsets, configuration and logs of $KHOME (kept the jars)"
  fi
fi
