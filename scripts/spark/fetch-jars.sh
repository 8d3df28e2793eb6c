#!/usr/bin/env bash
# Fetch the Delta Lake jars (and their runtime dependencies) for the Spark engine into
# ./.spark-jars with Maven, so nothing is downloaded when a Spark session starts; with them
# Structured Streaming's Kafka source (spark-sql-kafka-0-10, its token provider, kafka-clients,
# commons-pool2) for `source.type: kafka` (SPARK_KAFKA_VERSION: 4.0.0, the newest of the 4.0
# line served here; the runtime's own Spark, Scala and Hadoop jars are not fetched again).
# Idempotent: does nothing when the jars of this version are already there.
#
# Usage: scripts/spark/fetch-jars.sh [target-folder]   (default: ./.spark-jars)
set -euo pipefail

DELTA_VERSION="${DELTA_VERSION:-4.0.1}"
SCALA_BINARY="${SCALA_BINARY:-2.13}"
SPARK_KAFKA_VERSION="${SPARK_KAFKA_VERSION:-4.0.0}"
TARGET="${1:-.spark-jars}"

if [ -f "$TARGET/delta-spark_${SCALA_BINARY}-${DELTA_VERSION}.jar" ] \
    && [ -f "$TARGET/delta-storage-${DELTA_VERSION}.jar" ] \
    && [ -f "$TARGET/spark-sql-kafka-0-10_${SCALA_BINARY}-${SPARK_KAFKA_VERSION}.jar" ]; then
    echo "Delta ${DELTA_VERSION} and Spark Kafka ${SPARK_KAFKA_VERSION} jars already in ${TARGET}"
    exit 0
fi

command -v mvn >/dev/null || { echo "mvn (Apache Maven) is required" >&2; exit 1; }
mkdir -p "$TARGET"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdcflow</groupId>
  <artifactId>spark-jars</artifactId>
  <version>1</version>
  <dependencies>
    <dependency>
      <groupId>io.delta</groupId>
      <artifactId>delta-spark_${SCALA_BINARY}</artifactId>
      <version>${DELTA_VERSION}</version>
      <!-- Spark itself comes with pyspark: only Delta's own jars are needed -->
      <exclusions>
        <exclusion><groupId>org.apache.spark</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.scala-lang</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_${SCALA_BINARY}</artifactId>
      <version>${SPARK_KAFKA_VERSION}</version>
      <!-- what pyspark's own jars already hold -->
      <exclusions>
        <exclusion><groupId>org.apache.spark</groupId><artifactId>spark-sql_${SCALA_BINARY}</artifactId></exclusion>
        <exclusion><groupId>org.apache.spark</groupId><artifactId>spark-tags_${SCALA_BINARY}</artifactId></exclusion>
        <exclusion><groupId>org.apache.hadoop</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.scala-lang</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.scala-lang.modules</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.slf4j</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.xerial.snappy</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>org.lz4</groupId><artifactId>*</artifactId></exclusion>
        <exclusion><groupId>com.google.code.findbugs</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>
  </dependencies>
</project>
POM
# Maven 3.8 prints colour resets even with -B and style.color=never: its output goes to a log,
# shown (without escape codes) only when it fails
if ! mvn -q -B -Dstyle.color=never -f "$work/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$(cd "$TARGET" && pwd)" >"$work/mvn.log" 2>&1; then
    sed 's/\x1b\[[0-9;]*m//g' "$work/mvn.log" >&2
    exit 1
fi
ls "$TARGET"
