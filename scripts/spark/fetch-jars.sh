#!/usr/bin/env bash
# Fetch the Delta Lake jars (and their runtime dependencies) for the Spark engine into
# ./.spark-jars with Maven, so nothing is downloaded when a Spark session starts; with them
# Structured Streaming's Kafka source (spark-sql-kafka-0-10, its token provider, kafka-clients,
# commons-pool2) for `source.type: kafka` (SPARK_KAFKA_VERSION: 4.0.0, the newest of the 4.0
# line served here; the runtime's own Spark, Scala and Hadoop jars are not fetched again).
# Then, into ./.spark-jars/s3a, the S3A connector for tables on S3 (`storage.root: s3://…`,
# docs/objectstore.md): hadoop-aws of the Hadoop that pyspark ships (HADOOP_AWS_VERSION: 3.4.1)
# with the AWS SDK v2 modules it uses (s3, s3-transfer-manager, sts; SDK BOM AWS_SDK_VERSION:
# 2.59.1, the newest served here) instead of the SDK's 500 MB `bundle`; Netty and SLF4J come with
# pyspark. A session loads them only when its storage root is on S3 (engines/spark/session.py).
# Idempotent: does nothing when the jars of these versions are already there.
#
# Usage: scripts/spark/fetch-jars.sh [target-folder]   (default: ./.spark-jars)
set -euo pipefail

DELTA_VERSION="${DELTA_VERSION:-4.0.1}"
SCALA_BINARY="${SCALA_BINARY:-2.13}"
SPARK_KAFKA_VERSION="${SPARK_KAFKA_VERSION:-4.0.0}"
HADOOP_AWS_VERSION="${HADOOP_AWS_VERSION:-3.4.1}"
AWS_SDK_VERSION="${AWS_SDK_VERSION:-2.59.1}"
TARGET="${1:-.spark-jars}"

if [ -f "$TARGET/delta-spark_${SCALA_BINARY}-${DELTA_VERSION}.jar" ] \
    && [ -f "$TARGET/delta-storage-${DELTA_VERSION}.jar" ] \
    && [ -f "$TARGET/spark-sql-kafka-0-10_${SCALA_BINARY}-${SPARK_KAFKA_VERSION}.jar" ] \
    && [ -f "$TARGET/s3a/hadoop-aws-${HADOOP_AWS_VERSION}.jar" ] \
    && [ -f "$TARGET/s3a/s3-${AWS_SDK_VERSION}.jar" ]; then
    echo "Delta ${DELTA_VERSION}, Spark Kafka ${SPARK_KAFKA_VERSION} and S3A" \
      "${HADOOP_AWS_VERSION} jars already in ${TARGET}"
    exit 0
fi

command -v mvn >/dev/null || { echo "mvn (Apache Maven) is required" >&2; exit 1; }
mkdir -p "$TARGET/s3a"
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
cat > "$work/s3a.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdcflow</groupId>
  <artifactId>spark-s3a-jars</artifactId>
  <version>1</version>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>software.amazon.awssdk</groupId>
        <artifactId>bom</artifactId>
        <version>${AWS_SDK_VERSION}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId>
      <artifactId>hadoop-aws</artifactId>
      <version>${HADOOP_AWS_VERSION}</version>
      <exclusions>
        <exclusion><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId></exclusion>
      </exclusions>
    </dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3</artifactId></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3-transfer-manager</artifactId></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>sts</artifactId></dependency>
    <!-- S3A builds its synchronous client on the SDK's Apache HTTP client -->
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>apache-client</artifactId></dependency>
  </dependencies>
</project>
POM
# Maven 3.8 prints colour resets even with -B and style.color=never: its output goes to a log,
# shown (without escape codes) only when it fails
fetch() {  # fetch POM FOLDER [EXCLUDED GROUPS]
  if ! mvn -q -B -Dstyle.color=never -f "$1" dependency:copy-dependencies \
      -DincludeScope=runtime -DexcludeGroupIds="${3:-}" \
      -DoutputDirectory="$(cd "$2" && pwd)" >"$work/mvn.log" 2>&1; then
      sed 's/\x1b\[[0-9;]*m//g' "$work/mvn.log" >&2
      exit 1
  fi
}
fetch "$work/pom.xml" "$TARGET"
# Netty, SLF4J, the Apache HTTP client 4, commons-codec and commons-logging (jcl-over-slf4j)
# come with pyspark
fetch "$work/s3a.xml" "$TARGET/s3a" "io.netty,org.slf4j,org.apache.httpcomponents,commons-codec,commons-logging"
ls "$TARGET" "$TARGET/s3a"
