#!/usr/bin/env bash
# Start a local one-node Apache Kafka (KRaft combined mode: broker + controller, node.id 1) for
# the cdcflow demo and tests, and with --connect a Kafka Connect standalone worker with the
# Debezium PostgreSQL connector plugin (idempotent: what already runs is left alone).
#
#   CDCFLOW_KAFKA_HOME             jars, config, data, logs and pid files (default ./.kafka);
#                                  the jars are fetched by scripts/kafka/install.sh when missing
#   CDCFLOW_KAFKA_PORT             broker PLAINTEXT listener on 127.0.0.1 (default 39092)
#   CDCFLOW_KAFKA_CONTROLLER_PORT  KRaft controller listener on 127.0.0.1 (default 39093)
#   CDCFLOW_KAFKA_HEAP             broker JVM heap options (default "-Xms128m -Xmx512m")
#   CDCFLOW_KAFKA_LOG_LEVEL        root log level of both JVMs (default INFO)
#   CDCFLOW_KAFKA_START_TIMEOUT    seconds to wait for each JVM to answer (default 60)
#   CDCFLOW_KAFKA_CONNECT=1        same as --connect
#   CDCFLOW_CONNECT_PORT           Connect REST API on 127.0.0.1 (default 38083)
#   CDCFLOW_CONNECT_HEAP           Connect JVM heap options (default "-Xms128m -Xmx512m")
#   CDCFLOW_CONNECT_SCHEMAS        JsonConverter value.converter.schemas.enable (default true:
#                                  each message is {"schema": ..., "payload": ...})
#   CDCFLOW_CONNECT_KEY_SCHEMAS    key.converter.schemas.enable (default: CDCFLOW_CONNECT_SCHEMAS)
#   CDCFLOW_CONNECT_PLUGIN_DISCOVERY  Connect plugin.discovery (default service_load: the plugins
#                                  found through their META-INF/services, no slow class scan)
#   KAFKA_VERSION, DEBEZIUM_VERSION, ...  see scripts/kafka/install.sh
#
# Files under $CDCFLOW_KAFKA_HOME: config/server.properties (rewritten at each broker start),
# data/ (the log dirs and KRaft metadata, formatted once with a generated cluster id by
# kafka.tools.StorageTool, its output in format.log), kafka.log, kafka.pid;
# connect/worker.properties (rewritten at each Connect start), connect/offsets.dat, connect.log,
# connect.pid. The JVMs run detached (setsid): stop them with scripts/kafka/stop.sh.
# The previous run's log is kept as kafka.log.1 / connect.log.1.
#
# The broker counts as up once its log says "Kafka Server started" (it is then unfenced) and its
# port answers; with a Python that has confluent-kafka (CDCFLOW_PYTHON, default
# ./.venv/bin/python) also once a metadata request succeeds. Connect is up once GET /connectors
# answers.
#
# Connectors are registered through the REST API, e.g. with scripts/kafka/connector.sh. A
# standalone worker does not keep them across its own restarts (only their offsets, in
# connect/offsets.dat): register them again after a restart of Connect, they resume where they
# were. A changed CDCFLOW_CONNECT_SCHEMAS needs such a restart: scripts/kafka/stop.sh --connect.
#
# Usage: scripts/kafka/start.sh [--connect]
# Prints the bootstrap servers (127.0.0.1:<port>) on the last line.
set -euo pipefail
# shellcheck source=scripts/kafka/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

WITH_CONNECT="${CDCFLOW_KAFKA_CONNECT:-0}"
for arg in "$@"; do
  case "$arg" in
    --connect) WITH_CONNECT=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "kafka: unknown argument $arg (usage: $0 [--connect])" >&2; exit 2 ;;
  esac
done
TIMEOUT="${CDCFLOW_KAFKA_START_TIMEOUT:-60}"
LOG_LEVEL="${CDCFLOW_KAFKA_LOG_LEVEL:-INFO}"
BOOTSTRAP="127.0.0.1:$KAFKA_PORT"

# one start at a time per CDCFLOW_KAFKA_HOME (test workers may start the stack together): a
# second caller waits, then finds it running
mkdir -p "$KHOME"
exec 9>"$KHOME/.start.lock"
flock 9

if ! installed "$BROKER_LIB" "$BROKER_STAMP" \
    || { [ "$WITH_CONNECT" = 1 ] && ! { installed "$CONNECT_LIB" "$CONNECT_STAMP" \
                                         && installed "$DEBEZIUM_PLUGIN" "$DEBEZIUM_STAMP"; }; }; then
  bash "$(dirname "${BASH_SOURCE[0]}")/install.sh"
fi
command -v "$JAVA" >/dev/null || { echo "kafka: java (17+) is required" >&2; exit 1; }
java_major="$("$JAVA" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -1)"
if [ "${java_major:-0}" -lt 17 ]; then
  echo "kafka: Java 17+ is required, $JAVA is version ${java_major:-unknown}" >&2
  exit 1
fi
mkdir -p "$KHOME/config" "$KHOME/data" "$KHOME/connect"

log4j_config() {  # log4j2 configuration: everything to stdout, which goes to the role's log file
  cat <<CONF
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $LOG_LEVEL
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
CONF
}

launch() {  # launch <role> <log> <heap options> <classpath> <main class> [args...]
  local role=$1 log=$2 heap=$3 cp=$4
  shift 4
  [ -f "$log" ] && mv -f "$log" "$log.1"
  # setsid: in its own session, so that the caller's Ctrl-C or process group kill leaves it alone.
  # The two -Dcdcflow.kafka.* properties come first: stop.sh and role_pid recognise the JVM by them.
  # shellcheck disable=SC2086  # $heap is a list of JVM options
  setsid nohup "$JAVA" "-Dcdcflow.kafka.role=$role" "-Dcdcflow.kafka.home=$KHOME" \
    -server $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExplicitGCInvokesConcurrent \
    -Djava.awt.headless=true "-Dlog4j2.configurationFile=$KHOME/config/log4j2.properties" \
    -cp "$cp" "$@" >"$log" 2>&1 </dev/null 9>&- &  # 9>&-: the JVM must not hold the start lock
  echo $! >"$KHOME/$role.pid"
}

wait_for() {  # wait_for <role> <log> <check command...>: until the check passes, the JVM dies or TIMEOUT
  local role=$1 log=$2 pid deadline
  shift 2
  pid="$(cat "$KHOME/$role.pid")"
  deadline=$((SECONDS + TIMEOUT))
  until "$@"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "kafka: the $role JVM (pid $pid) exited; the end of $log:" >&2
      tail -n 40 "$log" >&2
      rm -f "$KHOME/$role.pid"
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "kafka: the $role (pid $pid) does not answer after ${TIMEOUT}s (left running; see $log," \
        "stop it with scripts/kafka/stop.sh); the end of its log:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    sleep 0.5
  done
}

# A Python with confluent-kafka (the project's .venv) makes the broker check a real metadata request
PY="${CDCFLOW_PYTHON:-$PWD/.venv/bin/python}"
if ! { [ -x "$PY" ] && "$PY" -c 'import confluent_kafka' 2>/dev/null; }; then
  PY=""
fi

broker_ready() {
  port_open "$KAFKA_PORT" || return 1
  if [ -f "$KHOME/kafka.log" ] && ! grep -q "Kafka Server started" "$KHOME/kafka.log"; then
    return 1  # listening, but not unfenced yet
  fi
  [ -z "$PY" ] && return 0
  "$PY" - "$BOOTSTRAP" <<'PY' 2>/dev/null
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=5)
sys.exit(0 if md.brokers else 1)
PY
}

elapsed() {  # seconds since an $EPOCHREALTIME, one decimal
  local now=$EPOCHREALTIME
  awk -v a="$1" -v b="$now" 'BEGIN { printf "%.1f", b - a }'
}

connect_ready() {
  curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:$CONNECT_PORT/connectors" 2>/dev/null
}

# --- the broker -----------------------------------------------------------------------------
if pid="$(role_pid kafka)"; then
  wait_for kafka "$KHOME/kafka.log" broker_ready
  echo "kafka: already running on $BOOTSTRAP (pid $pid, home $KHOME)"
else
  rm -f "$KHOME/kafka.pid"
  for port in "$KAFKA_PORT" "$CONTROLLER_PORT"; do
    if port_open "$port"; then
      echo "kafka: 127.0.0.1:$port is used by another process (not the broker of $KHOME);" \
        "set CDCFLOW_KAFKA_PORT / CDCFLOW_KAFKA_CONTROLLER_PORT" >&2
      exit 1
    fi
  done
  log4j_config >"$KHOME/config/log4j2.properties"
  cat >"$KHOME/config/server.properties" <<CONF
# generated by scripts/kafka/start.sh at each start: edits are lost
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$KHOME/data
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# after a kill -9 the controller only accepts the restarted broker once the old registration's
# session has expired (9 s by default): a shorter session makes restarts faster
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
log.retention.hours=168
CONF
  if [ ! -f "$KHOME/data/meta.properties" ]; then
    # a Kafka cluster id: 16 random bytes, base64url without padding (kafka-storage random-uuid),
    # not starting with "-" (Kafka avoids those too: they look like options on a command line)
    cluster_id="-"
    while [ "${cluster_id:0:1}" = "-" ]; do
      cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    done
    if ! "$JAVA" "-Dlog4j2.configurationFile=$KHOME/config/log4j2.properties" \
        -cp "$BROKER_LIB/*" kafka.tools.StorageTool format -t "$cluster_id" \
        -c "$KHOME/config/server.properties" >"$KHOME/format.log" 2>&1; then
      cat "$KHOME/format.log" >&2
      echo "kafka: formatting $KHOME/data failed" >&2
      exit 1
    fi
    echo "kafka: formatted $KHOME/data (cluster id $cluster_id)"
  fi
  started=$EPOCHREALTIME
  # shellcheck disable=SC2086
  launch kafka "$KHOME/kafka.log" "${CDCFLOW_KAFKA_HEAP:--Xms128m -Xmx512m}" "$BROKER_LIB/*" \
    kafka.Kafka "$KHOME/config/server.properties"
  wait_for kafka "$KHOME/kafka.log" broker_ready
  echo "kafka: started on $BOOTSTRAP in $(elapsed "$started")s (pid $(cat "$KHOME/kafka.pid"), home $KHOME)"
fi

# --- Kafka Connect ---------------------------------------------------------------------------
if [ "$WITH_CONNECT" = 1 ]; then
  command -v curl >/dev/null || { echo "kafka: curl is required for Kafka Connect" >&2; exit 1; }
  if pid="$(role_pid connect)"; then
    wait_for connect "$KHOME/connect.log" connect_ready
    echo "connect: already running on http://127.0.0.1:$CONNECT_PORT (pid $pid)"
  else
    rm -f "$KHOME/connect.pid"
    if port_open "$CONNECT_PORT"; then
      echo "connect: 127.0.0.1:$CONNECT_PORT is used by another process; set CDCFLOW_CONNECT_PORT" >&2
      exit 1
    fi
    log4j_config >"$KHOME/config/log4j2.properties"
    schemas="${CDCFLOW_CONNECT_SCHEMAS:-true}"
    cat >"$KHOME/connect/worker.properties" <<CONF
# generated by scripts/kafka/start.sh at each start of Connect: edits are lost
bootstrap.servers=$BOOTSTRAP
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=${CDCFLOW_CONNECT_KEY_SCHEMAS:-$schemas}
value.converter.schemas.enable=$schemas
offset.storage.file.filename=$KHOME/connect/offsets.dat
offset.flush.interval.ms=1000
plugin.path=$PLUGINS
plugin.discovery=${CDCFLOW_CONNECT_PLUGIN_DISCOVERY:-service_load}
listeners=http://127.0.0.1:$CONNECT_PORT
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$CONNECT_PORT
CONF
    started=$EPOCHREALTIME
    launch connect "$KHOME/connect.log" "${CDCFLOW_CONNECT_HEAP:--Xms128m -Xmx512m}" "$CONNECT_LIB/*" \
      org.apache.kafka.connect.cli.ConnectStandalone "$KHOME/connect/worker.properties"
    wait_for connect "$KHOME/connect.log" connect_ready
    echo "connect: started on http://127.0.0.1:$CONNECT_PORT in $(elapsed "$started")s" \
      "(pid $(cat "$KHOME/connect.pid"), value.converter.schemas.enable=$schemas)"
  fi
fi
echo "$BOOTSTRAP"
