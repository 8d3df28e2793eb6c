# Shared settings and helpers of scripts/kafka/*.sh: sourced by them, not run on its own.
#
#   CDCFLOW_KAFKA_HOME             jars, configuration, data, pid files and logs (default ./.kafka)
#   KAFKA_VERSION                  org.apache.kafka artifacts (default 4.3.0, the Kafka that
#                                  Debezium 3.6 is built against)
#   DEBEZIUM_VERSION               io.debezium artifacts (default 3.6.1.Final)
#   SCALA_BINARY                   Scala suffix of the kafka_<scala> broker artifact (default 2.13)
#   LOG4J_VERSION                  log4j2 + its slf4j binding for both JVMs (default 2.25.4, what
#                                  Kafka 4.3.0 depends on)
#   CDCFLOW_KAFKA_PORT             broker PLAINTEXT listener on 127.0.0.1 (default 39092)
#   CDCFLOW_KAFKA_CONTROLLER_PORT  KRaft controller listener on 127.0.0.1 (default 39093)
#   CDCFLOW_CONNECT_PORT           Kafka Connect REST API on 127.0.0.1 (default 38083)
#   JAVA_HOME                      the Java (17+) to use; else `java` from PATH
# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts sourcing this file

KAFKA_VERSION="${KAFKA_VERSION:-4.3.0}"
DEBEZIUM_VERSION="${DEBEZIUM_VERSION:-3.6.1.Final}"
SCALA_BINARY="${SCALA_BINARY:-2.13}"
LOG4J_VERSION="${LOG4J_VERSION:-2.25.4}"
KAFKA_PORT="${CDCFLOW_KAFKA_PORT:-39092}"
CONTROLLER_PORT="${CDCFLOW_KAFKA_CONTROLLER_PORT:-39093}"
CONNECT_PORT="${CDCFLOW_CONNECT_PORT:-38083}"

KHOME="${CDCFLOW_KAFKA_HOME:-./.kafka}"
case "$KHOME" in
  /*) ;;
  *) KHOME="$PWD/${KHOME#./}" ;;
esac
KHOME="${KHOME%/}"
BROKER_LIB="$KHOME/lib/broker"
CONNECT_LIB="$KHOME/lib/connect"
PLUGINS="$KHOME/plugins"
DEBEZIUM_PLUGIN="$PLUGINS/debezium-postgres"

if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA="java"
fi

# What each installed folder must hold (install.sh writes it into <folder>/.installed last)
BROKER_STAMP="kafka_${SCALA_BINARY} ${KAFKA_VERSION} log4j ${LOG4J_VERSION}"
CONNECT_STAMP="connect-runtime ${KAFKA_VERSION} log4j ${LOG4J_VERSION}"
DEBEZIUM_STAMP="debezium-connector-postgres ${DEBEZIUM_VERSION} (no kafka, slf4j, jackson-core)"

installed() {  # installed <folder> <stamp>: are the jars of these versions there?
  [ "$(cat "$1/.installed" 2>/dev/null)" = "$2" ]
}

# pid of the running JVM of a role (kafka|connect) of this CDCFLOW_KAFKA_HOME, else fails.
# The JVMs are started with -Dcdcflow.kafka.role=<role> -Dcdcflow.kafka.home=<home>, so a
# stale pid file (kill -9, reboot) whose pid was reused by another process is not trusted.
role_pid() {
  local pid args
  pid="$(cat "$KHOME/$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  args="$(ps -ww -o args= -p "$pid" 2>/dev/null)" || return 1
  case "$args" in
    *"-Dcdcflow.kafka.role=$1 -Dcdcflow.kafka.home=$KHOME "*) echo "$pid" ;;
    *) return 1 ;;
  esac
}

port_open() {  # port_open <port>: does something accept TCP connections on 127.0.0.1:<port>?
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
