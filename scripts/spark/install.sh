#!/usr/bin/env bash
# Install what the Spark engine needs outside Python: a Java 17 runtime (pyspark starts a JVM)
# and Apache Maven (scripts/spark/fetch-jars.sh fetches the Delta jars with it), from Debian's
# packages. Idempotent: does nothing when `java` (17 or later) and `mvn` are already there.
set -euo pipefail

java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local version
  version="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)"
  [ -n "$version" ] && [ "$version" -ge 17 ]
}

missing=()
java_ok || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ "${#missing[@]}" -eq 0 ]; then
  echo "spark: java and mvn already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "spark: ${missing[*]} missing and apt-get is not available: install Java 17 and Maven" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "spark: installed ${missing[*]}"
