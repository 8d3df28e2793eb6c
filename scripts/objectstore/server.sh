#!/usr/bin/env bash
# The local object-store servers of the object-storage tests and demo, from their packages:
#
#   s3       moto's S3-compatible server (PyPI moto[server], the s3-server extra in .venv)
#   azurite  the Azure Storage emulator, blob service (npm azurite, installed into
#            .objectstore/azurite when missing)
#
# Usage: scripts/objectstore/server.sh start|stop|status s3|azurite
#   start   starts the server when it is not running (idempotent) and prints one line:
#           "<kind>: http://127.0.0.1:<port>"; the port is CDCFLOW_S3_PORT /
#           CDCFLOW_AZURITE_PORT, else the first free one from 59100 / 59200.
#   stop    stops a server this checkout started.
# State (pid, port, log, Azurite's data) lives under ./.objectstore/<kind>/.
set -euo pipefail
cd "$(dirname "$0")/../.."

action="${1:?usage: server.sh start|stop|status s3|azurite}"
kind="${2:?usage: server.sh start|stop|status s3|azurite}"
state=".objectstore/$kind"
mkdir -p "$state"

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running() {  # the recorded server is alive and listening
  [ -f "$state/pid" ] && [ -f "$state/port" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null \
    && listening "$(cat "$state/port")"
}

free_port() {
  local p
  for p in $(seq "$1" $(($1 + 99))); do
    if ! listening "$p"; then echo "$p"; return 0; fi
  done
  echo "objectstore: no free port from $1" >&2
  return 1
}

install_azurite() {
  local bin=".objectstore/azurite/node_modules/.bin/azurite-blob"
  if [ ! -x "$bin" ]; then
    command -v npm >/dev/null || { echo "azurite: npm is missing (apt-get install npm)" >&2; return 1; }
    (cd .objectstore/azurite && npm install --no-audit --no-fund --loglevel=error azurite@3.35.0 >&2)
  fi
  echo "$bin"
}

launch() {  # start the server on port $1 (in the background); record its pid and port
  local port="$1"
  case "$kind" in
    s3)
      [ -x .venv/bin/moto_server ] || { echo "s3: .venv/bin/moto_server missing (make bootstrap)" >&2; return 1; }
      nohup .venv/bin/moto_server -H 127.0.0.1 -p "$port" >"$state/log" 2>&1 &
      ;;
    azurite)
      mkdir -p "$state/data"
      nohup "$azurite_bin" --blobHost 127.0.0.1 --blobPort "$port" --location "$state/data" \
        --skipApiVersionCheck --loose --silent >"$state/log" 2>&1 &
      ;;
  esac
  echo $! >"$state/pid"
  echo "$port" >"$state/port"
}

start() {
  if running; then echo "$kind: http://127.0.0.1:$(cat "$state/port")"; return 0; fi
  local port base fixed=""
  case "$kind" in
    s3) base=59100; fixed="${CDCFLOW_S3_PORT:-}" ;;
    azurite) base=59200; fixed="${CDCFLOW_AZURITE_PORT:-}"; azurite_bin="$(install_azurite)" ;;
    *) echo "objectstore: unknown server $kind (s3 or azurite)" >&2; return 2 ;;
  esac
  # another checkout (or a test's copy) may take the same free port at the same moment: a
  # server that dies at start is retried on the next free port
  for _attempt in 1 2 3 4 5; do
    port="${fixed:-$(free_port "$base")}"
    launch "$port"
    for _ in $(seq 1 100); do
      if listening "$port" && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
        echo "$kind: http://127.0.0.1:$port"
        return 0
      fi
      kill -0 "$(cat "$state/pid")" 2>/dev/null || break
      sleep 0.2
    done
    [ -n "$fixed" ] && break
    kill "$(cat "$state/pid")" 2>/dev/null || true
    base=$((port + 1))
  done
  echo "$kind: the server did not start (log: $state/log):" >&2
  tail -n 20 "$state/log" >&2 || true
  return 1
}

stop() {
  if [ -f "$state/pid" ]; then
    kill "$(cat "$state/pid")" 2>/dev/null || true
    rm -f "$state/pid" "$state/port"
  fi
}

case "$action" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "$kind: http://127.0.0.1:$(cat "$state/port")"; else echo "$kind: stopped"; exit 1; fi ;;
  *) echo "usage: server.sh start|stop|status s3|azurite" >&2; exit 2 ;;
esac
