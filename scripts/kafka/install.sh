#!/usr/bin/env bash
# Fetch, with Maven from Maven Central, everything scripts/kafka/start.sh runs (idempotent):
#
#   $CDCFLOW_KAFKA_HOME/lib/broker               kafka_2.13 (the KRaft broker/controller, kafka.Kafka,
#                                                and the storage tool, kafka.tools.StorageTool) with
#                                                its runtime dependencies and log4j2 + slf4j binding
#   $CDCFLOW_KAFKA_HOME/lib/connect              connect-runtime + connect-json (ConnectStandalone,
#                                                JsonConverter), same logging jars
#   $CDCFLOW_KAFKA_HOME/plugins/debezium-postgres  the Debezium PostgreSQL connector plugin: the
#                                                connector and its dependencies, without the jars
#                                                Connect provides (org.apache.kafka:*, slf4j,
#                                                jackson-core/-databind), which would clash across
#                                                the plugin class loader
#
# Each folder is only fetched when it does not already hold the jars of the pinned versions (its
# .installed file); a changed version replaces the whole folder. Needs mvn and a Java (17+).
#
#   CDCFLOW_KAFKA_HOME  target folder (default ./.kafka)
#   KAFKA_VERSION       default 4.3.0     DEBEZIUM_VERSION  default 3.6.1.Final
#   SCALA_BINARY        default 2.13      LOG4J_VERSION     default 2.25.4
#   (more in scripts/kafka/env.sh; Maven's own settings, e.g. MAVEN_OPTS=-Dmaven.repo.local=...,
#   apply as usual)
#
# Usage: scripts/kafka/install.sh
set -euo pipefail
# shellcheck source=scripts/kafka/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if installed "$BROKER_LIB" "$BROKER_STAMP" && installed "$CONNECT_LIB" "$CONNECT_STAMP" \
    && installed "$DEBEZIUM_PLUGIN" "$DEBEZIUM_STAMP"; then
  echo "kafka: Kafka ${KAFKA_VERSION} and Debezium ${DEBEZIUM_VERSION} already in $KHOME"
  exit 0
fi

command -v mvn >/dev/null || { echo "kafka: mvn (Apache Maven) is required" >&2; exit 1; }
mkdir -p "$KHOME/lib" "$PLUGINS"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

dep() {  # dep <groupId> <artifactId> <version> [exclusion groupIds...]
  local g=$1 a=$2 v=$3 x
  shift 3
  printf '    <dependency><groupId>%s</groupId><artifactId>%s</artifactId><version>%s</version>' "$g" "$a" "$v"
  if [ "$#" -gt 0 ]; then
    printf '\n      <exclusions>\n'
    for x in "$@"; do
      printf '        <exclusion><groupId>%s</groupId><artifactId>*</artifactId></exclusion>\n' "$x"
    done
    printf '      </exclusions>\n    '
  fi
  printf '</dependency>\n'
}

LOGGING="$(
  # log4j2 (Kafka 4 logs with it) and the binding of slf4j 1.7, which Kafka's own code uses.
  # Declared directly so that the three log4j jars are always of one version.
  dep org.apache.logging.log4j log4j-api "$LOG4J_VERSION"
  dep org.apache.logging.log4j log4j-core "$LOG4J_VERSION"
  dep org.apache.logging.log4j log4j-slf4j-impl "$LOG4J_VERSION"
)"

fetch() {  # fetch <name> <folder> <stamp> <dependencies xml>
  local name=$1 dest=$2 stamp=$3 deps=$4 stage
  if installed "$dest" "$stamp"; then
    echo "kafka: $stamp already in $dest"
    return
  fi
  mkdir -p "$work/$name"
  cat >"$work/$name/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdcflow</groupId>
  <artifactId>kafka-$name</artifactId>
  <version>1</version>
  <dependencies>
$deps
  </dependencies>
</project>
POM
  # into a staging folder first: an interrupted fetch never leaves a half-filled folder behind
  stage="$(dirname "$dest")/.$(basename "$dest").tmp"
  rm -rf "$stage"
  mkdir -p "$stage"
  # Maven 3.8 prints colour resets even with -B and style.color=never: its output goes to a log,
  # shown (without escape codes) only when it fails
  if ! mvn -q -B -Dstyle.color=never -f "$work/$name/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$stage" >"$work/$name/mvn.log" 2>&1; then
    sed 's/\x1b\[[0-9;]*m//g' "$work/$name/mvn.log" >&2
    rm -rf "$stage"
    echo "kafka: fetching $stamp failed (pom: see above)" >&2
    exit 1
  fi
  printf '%s\n' "$stamp" >"$stage/.installed"
  rm -rf "$dest"
  mv "$stage" "$dest"
  echo "kafka: fetched $stamp into $dest ($(find "$dest" -name '*.jar' | wc -l) jars, $(du -sh "$dest" | cut -f1))"
}

fetch broker "$BROKER_LIB" "$BROKER_STAMP" "$(
  dep org.apache.kafka "kafka_${SCALA_BINARY}" "$KAFKA_VERSION"
  printf '%s\n' "$LOGGING"
)"

fetch connect "$CONNECT_LIB" "$CONNECT_STAMP" "$(
  dep org.apache.kafka connect-runtime "$KAFKA_VERSION"
  dep org.apache.kafka connect-json "$KAFKA_VERSION"
  printf '%s\n' "$LOGGING"
)"

# The plugin gets no Kafka jar (kafka-clients, connect-api and their compression libraries), no
# slf4j and no jackson-core/-databind/-annotations: Connect's class loader provides them (in
# KAFKA_VERSION, not in the one Debezium's poms name). A second copy of jackson-databind in the
# plugin breaks io.debezium.converters.CloudEventsConverter, which looks up JsonConverter's methods
# taking Connect's JsonNode class ("Failed to discover Converter ... NoSuchMethodException").
fetch debezium "$DEBEZIUM_PLUGIN" "$DEBEZIUM_STAMP" "$(
  dep io.debezium debezium-connector-postgres "$DEBEZIUM_VERSION" \
    org.apache.kafka org.slf4j com.fasterxml.jackson.core
)"
