#!/usr/bin/env bash
# Register (create or update: PUT /connectors/<name>/config, idempotent) a Debezium PostgreSQL
# source connector in the Kafka Connect worker of scripts/kafka/start.sh --connect, and wait until
# the connector and its task are RUNNING; or show / delete one.
#
#   CDCFLOW_CONNECT_PORT     Connect REST API on 127.0.0.1 (default 38083)
#   CDCFLOW_PG_HOST          database.hostname (default 127.0.0.1)
#   CDCFLOW_PG_PORT          database.port (default 55432)
#   CDCFLOW_PG_USER          database.user (default postgres)
#   CDCFLOW_PG_PASSWORD      database.password (default: none, scripts/postgres trusts local TCP)
#   CDCFLOW_PG_DB            database.dbname (default cdcflow)
#   CDCFLOW_DBZ_NAME         connector name (default cdcflow-postgres)
#   CDCFLOW_DBZ_TOPIC_PREFIX topic.prefix (default cdcflow): topics are <prefix>.<schema>.<table>
#   CDCFLOW_DBZ_TABLES       table.include.list, e.g. public.customers,public.orders (default: none,
#                            i.e. every table)
#   CDCFLOW_DBZ_SLOT         slot.name (default: the connector name, lowercased, [^a-z0-9_] -> _)
#   CDCFLOW_DBZ_PUBLICATION  publication.name (default <slot>_pub)
#   CDCFLOW_DBZ_TIMEOUT      seconds to wait for RUNNING (default 60)
#
# The options override the environment. The configuration: connector.class PostgresConnector,
# tasks.max 1, plugin.name pgoutput, publication.autocreate.mode filtered (the publication holds
# the included tables only), snapshot.mode initial (snapshot once, then stream), everything else
# Debezium's defaults (decimal.handling.mode precise: numeric -> the Decimal logical type, i.e.
# base64 big-endian unscaled bytes + a "scale" schema parameter with JsonConverter;
# time.precision.mode adaptive: date -> io.debezium.time.Date (days since the epoch),
# timestamptz -> io.debezium.time.ZonedTimestamp (ISO-8601 string in UTC)). Any other connector
# setting can be given as key=value arguments, which win over the defaults (e.g.
# value.converter.schemas.enable=false, snapshot.mode=no_data).
#
# Usage:
#   scripts/kafka/connector.sh [--name N] [--tables LIST] [--prefix P] [--slot S]
#                              [--publication P] [--db DB] [--pg-port PORT] [key=value ...]
#   scripts/kafka/connector.sh --status [NAME]       print the status JSON
#   scripts/kafka/connector.sh --list                print the connector names (JSON)
#   scripts/kafka/connector.sh --delete [NAME] [--drop-slot]
#       delete the connector. The replication slot, the publication and the Connect offsets stay:
#       registering it again resumes where it stopped (and the slot keeps WAL meanwhile). With
#       --drop-slot, also reset its offsets, drop the slot and the publication (needs psql): the
#       next registration starts over with a snapshot.
# Prints the connector status JSON on the last line.
set -euo pipefail

CONNECT_PORT="${CDCFLOW_CONNECT_PORT:-38083}"
URL="http://127.0.0.1:$CONNECT_PORT"
NAME="${CDCFLOW_DBZ_NAME:-cdcflow-postgres}"
PG_HOST="${CDCFLOW_PG_HOST:-127.0.0.1}"
PG_PORT="${CDCFLOW_PG_PORT:-55432}"
PG_USER="${CDCFLOW_PG_USER:-postgres}"
PG_DB="${CDCFLOW_PG_DB:-cdcflow}"
PREFIX="${CDCFLOW_DBZ_TOPIC_PREFIX:-cdcflow}"
TABLES="${CDCFLOW_DBZ_TABLES:-}"
SLOT="${CDCFLOW_DBZ_SLOT:-}"
PUBLICATION="${CDCFLOW_DBZ_PUBLICATION:-}"
TIMEOUT="${CDCFLOW_DBZ_TIMEOUT:-60}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

MODE=register
DROP_SLOT=0
EXTRA=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --name|--tables|--prefix|--slot|--publication|--db|--pg-port)
      [ "$#" -ge 2 ] || { echo "connector: $1 needs a value" >&2; exit 2; } ;;
  esac
  case "$1" in
    --name) NAME="$2"; shift ;;
    --tables) TABLES="$2"; shift ;;
    --prefix) PREFIX="$2"; shift ;;
    --slot) SLOT="$2"; shift ;;
    --publication) PUBLICATION="$2"; shift ;;
    --db) PG_DB="$2"; shift ;;
    --pg-port) PG_PORT="$2"; shift ;;
    --status|--delete)
      MODE="${1#--}"
      if [ "$#" -gt 1 ] && [ "${2#-}" = "$2" ] && [ "${2#*=}" = "$2" ]; then NAME="$2"; shift; fi ;;
    --list) MODE=list ;;
    --drop-slot) DROP_SLOT=1 ;;
    -h|--help) usage; exit 0 ;;
    *=*) EXTRA+=("$1") ;;
    *) echo "connector: unknown argument $1 (see $0 --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$SLOT" ]; then
  SLOT="$(printf '%s' "$NAME" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9_' '_' | cut -c1-63)"
fi
PUBLICATION="${PUBLICATION:-${SLOT}_pub}"
command -v curl >/dev/null || { echo "connector: curl is required" >&2; exit 1; }

# http <method> <path> [json body]: sets HTTP_CODE and HTTP_BODY (the response body)
http() {
  local out
  out="$(curl -sS --max-time 30 -X "$1" -H 'Content-Type: application/json' \
    -w '\n%{http_code}' ${3:+--data-binary "$3"} "$URL$2")" || {
    echo "connector: no Kafka Connect at $URL (scripts/kafka/start.sh --connect)" >&2
    exit 1
  }
  HTTP_CODE="${out##*$'\n'}"
  HTTP_BODY="${out%$'\n'*}"
}

json_str() {  # a JSON string literal
  local s=$1
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\n'/\\n}"
  s="${s//$'\t'/\\t}"
  printf '"%s"' "$s"
}

json_field() {  # json_field <key> <flat JSON object>: a string value, without unescaping
  printf '%s' "$2" | grep -o "\"$1\" *: *\"[^\"]*\"" | head -1 | sed 's/.*: *"\(.*\)"$/\1/'
}

# states <status JSON>: the connector's state, then the tasks' states, one per line
states() {
  printf '%s' "$1" | grep -o '"state" *: *"[A-Z_]*"' | sed 's/.*"\([A-Z_]*\)"$/\1/'
}

status_json() {
  http GET "/connectors/$NAME/status"
  if [ "$HTTP_CODE" != 200 ]; then
    echo "connector: $NAME: HTTP $HTTP_CODE $HTTP_BODY" >&2
    return 1
  fi
  printf '%s\n' "$HTTP_BODY"
}

wait_state() {  # wait_state <state>: until the connector and all its tasks (at least one) are in it
  local want=$1 body st deadline=$((SECONDS + TIMEOUT))
  while :; do
    http GET "/connectors/$NAME/status"
    body="$HTTP_BODY"
    if [ "$HTTP_CODE" = 200 ]; then
      st="$(states "$body")"
      if [ "$(printf '%s\n' "$st" | head -1)" = "$want" ] && [ "$(printf '%s\n' "$st" | wc -l)" -ge 2 ] \
          && ! printf '%s\n' "$st" | sed 1d | grep -vqx "$want"; then
        printf '%s\n' "$body"
        return 0
      fi
      if [ "$want" = STOPPED ] && [ "$(printf '%s\n' "$st" | head -1)" = STOPPED ]; then
        printf '%s\n' "$body"  # a stopped connector has no tasks
        return 0
      fi
      if printf '%s\n' "$st" | grep -qx FAILED; then
        echo "connector: $NAME FAILED:" >&2
        printf '%s\n' "$body" | sed 's/\\n/\n/g; s/\\t/\t/g' >&2
        return 1
      fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "connector: $NAME not $want after ${TIMEOUT}s: HTTP $HTTP_CODE $body" >&2
      return 1
    fi
    sleep 0.5
  done
}

case "$MODE" in
  list)
    http GET /connectors
    printf '%s\n' "$HTTP_BODY"
    exit 0 ;;
  status)
    status_json
    exit 0 ;;
  delete)
    http GET "/connectors/$NAME/config"
    config="$HTTP_BODY"
    if [ "$HTTP_CODE" = 404 ]; then
      echo "connector: $NAME is not registered"
      [ "$DROP_SLOT" = 0 ] && exit 0
      config=""
    elif [ "$HTTP_CODE" != 200 ]; then
      echo "connector: $NAME: HTTP $HTTP_CODE $config" >&2
      exit 1
    fi
    if [ -n "$config" ] && [ "$DROP_SLOT" = 1 ]; then
      # stop it (its task releases the slot), then reset its offsets (KIP-875), then delete it
      http PUT "/connectors/$NAME/stop"
      wait_state STOPPED >/dev/null
      http DELETE "/connectors/$NAME/offsets"
      case "$HTTP_CODE" in
        2??) echo "connector: $NAME offsets reset" ;;
        *) echo "connector: resetting the offsets of $NAME failed: HTTP $HTTP_CODE $HTTP_BODY" >&2; exit 1 ;;
      esac
    fi
    if [ -n "$config" ]; then
      http DELETE "/connectors/$NAME"
      case "$HTTP_CODE" in
        2??) echo "connector: $NAME deleted" ;;
        *) echo "connector: deleting $NAME failed: HTTP $HTTP_CODE $HTTP_BODY" >&2; exit 1 ;;
      esac
    fi
    if [ "$DROP_SLOT" = 1 ]; then
      # the registered configuration's coordinates, else those of the environment / options
      if [ -n "$config" ]; then
        v="$(json_field slot.name "$config")"; SLOT="${v:-$SLOT}"
        v="$(json_field publication.name "$config")"; PUBLICATION="${v:-dbz_publication}"
        v="$(json_field database.hostname "$config")"; PG_HOST="${v:-$PG_HOST}"
        v="$(json_field database.port "$config")"; PG_PORT="${v:-$PG_PORT}"
        v="$(json_field database.user "$config")"; PG_USER="${v:-$PG_USER}"
        v="$(json_field database.dbname "$config")"; PG_DB="${v:-$PG_DB}"
      fi
      PSQL="$(command -v psql || echo /usr/lib/postgresql/15/bin/psql)"
      psql_q() {
        PGPASSWORD="${CDCFLOW_PG_PASSWORD:-}" PGOPTIONS="-c client_min_messages=warning" "$PSQL" -X -q -t -A -v ON_ERROR_STOP=1 \
          -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" -c "$1"
      }
      deadline=$((SECONDS + TIMEOUT))
      # the slot stays active for a moment after the task stopped
      until [ -z "$(psql_q "SELECT 1 FROM pg_replication_slots WHERE slot_name = '$SLOT' AND active")" ]; do
        if [ "$SECONDS" -ge "$deadline" ]; then
          echo "connector: slot $SLOT still active after ${TIMEOUT}s" >&2
          exit 1
        fi
        sleep 0.5
      done
      dropped="$(psql_q "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$SLOT'" | wc -l)"
      psql_q "DROP PUBLICATION IF EXISTS \"$PUBLICATION\""
      if [ "$dropped" -gt 0 ]; then
        echo "connector: dropped slot $SLOT and publication $PUBLICATION (database $PG_DB on $PG_HOST:$PG_PORT)"
      else
        echo "connector: no slot $SLOT (dropped publication $PUBLICATION if any) in $PG_DB on $PG_HOST:$PG_PORT"
      fi
    fi
    exit 0 ;;
esac

# --- register --------------------------------------------------------------------------------
KEYS=()
declare -A CONF=()
set_conf() {
  [ -n "${CONF[$1]+x}" ] || KEYS+=("$1")
  CONF[$1]="$2"
}
set_conf connector.class io.debezium.connector.postgresql.PostgresConnector
set_conf tasks.max 1
set_conf database.hostname "$PG_HOST"
set_conf database.port "$PG_PORT"
set_conf database.user "$PG_USER"
[ -n "${CDCFLOW_PG_PASSWORD:-}" ] && set_conf database.password "$CDCFLOW_PG_PASSWORD"
set_conf database.dbname "$PG_DB"
set_conf topic.prefix "$PREFIX"
[ -n "$TABLES" ] && set_conf table.include.list "$TABLES"
set_conf plugin.name pgoutput
set_conf slot.name "$SLOT"
set_conf publication.name "$PUBLICATION"
set_conf publication.autocreate.mode filtered
set_conf snapshot.mode initial
for kv in "${EXTRA[@]}"; do
  set_conf "${kv%%=*}" "${kv#*=}"
done
body="{"
sep=""
for k in "${KEYS[@]}"; do
  body+="$sep$(json_str "$k"): $(json_str "${CONF[$k]}")"
  sep=", "
done
body+="}"

pairs() {  # the "key":"value" pairs of a flat JSON object, sorted, one a line
  printf '%s' "$1" | grep -o '"[^"]*" *: *"[^"]*"' | sed 's/" *: *"/":"/' | LC_ALL=C sort
}
http GET "/connectors/$NAME/config"
if [ "$HTTP_CODE" = 200 ] \
    && [ "$(pairs "$HTTP_BODY")" = "$(pairs "${body%\}}, $(json_str name): $(json_str "$NAME")}")" ]; then
  # a PUT would restart the connector even with the same configuration: leave it alone, but
  # restart what failed
  echo "connector: $NAME already registered with this configuration"
  http GET "/connectors/$NAME/status"
  if printf '%s' "$HTTP_BODY" | grep -q '"state" *: *"FAILED"'; then
    http POST "/connectors/$NAME/restart?includeTasks=true&onlyFailed=true"
    echo "connector: restarting the failed connector/tasks of $NAME (HTTP $HTTP_CODE)"
  fi
  wait_state RUNNING
  exit
fi
http PUT "/connectors/$NAME/config" "$body"
case "$HTTP_CODE" in
  201) echo "connector: $NAME created" ;;
  200) echo "connector: $NAME configuration updated" ;;
  *) echo "connector: registering $NAME failed: HTTP $HTTP_CODE" >&2
     printf '%s\n' "$HTTP_BODY" | sed 's/\\n/\n/g; s/\\t/\t/g' >&2
     # Connect 4.3 standalone answers an invalid configuration with a NullPointerException:
     # the validation endpoint tells what is wrong
     http PUT "/connector-plugins/${CONF[connector.class]}/config/validate" \
       "${body%\}}, $(json_str name): $(json_str "$NAME")}"
     printf '%s' "$HTTP_BODY" | grep -o '"name":"[^"]*","value":[^{}]*"errors":\["[^]]*\]' \
       | sed 's/^"name":"\([^"]*\)".*"errors":\[\(.*\)\]$/  \1: \2/' >&2 || true
     exit 1 ;;
esac
echo "connector: $NAME: topics ${PREFIX}.<schema>.<table>${TABLES:+ for $TABLES}, slot $SLOT, publication $PUBLICATION"
wait_state RUNNING
