#!/usr/bin/env bash
# Idempotent set-up: checks Java (17, 21 or 25), creates .venv, installs the package with its test extras and
# fetches the Delta Lake jars once into .cache/jars (later runs need no network).
set -euo pipefail
cd "$(dirname "$0")/.."

DELTA_JAR_VERSION=4.4.0      # newest delta-spark_4.2_2.13 on Maven Central; the Python package is 4.4.1
SPARK_BINARY=4.2
SCALA=2.13
MAVEN=https://repo1.maven.org/maven2

# the Java Spark will start: $JAVA_HOME's when set (as PySpark does), else the one on PATH
java_cmd=java
if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
  java_cmd="$JAVA_HOME/bin/java"
fi
if ! command -v "$java_cmd" >/dev/null 2>&1; then
  echo "setup: no 'java' on PATH. Install a Java 17 JDK (Debian: apt-get install openjdk-17-jdk-headless) and run 'make setup' again." >&2
  exit 1
fi
# Java 17 or 21, or 25 from 25.0.3 (Spark 4.2 deprecates earlier 25s); pipeline/runtime/session.py's
# JAVA_RELEASES says the same
java_version=$("$java_cmd" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9.]*\).*/\1/p' | head -n1)
java_major=${java_version%%.*}
java_update=$(echo "$java_version" | cut -s -d. -f3)
if ! { [ "$java_major" = "17" ] || [ "$java_major" = "21" ] || { [ "$java_major" = "25" ] && [ "${java_update:-0}" -ge 3 ]; }; }; then
  echo "setup: Java ${java_version:-unknown} found, but Spark 4.2 with Delta 4.4 runs on Java 17, 21 or 25 (from 25.0.3). Install a Java 17 JDK and put it first on PATH (or set JAVA_HOME)." >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q -e '.[test]'
  touch "$stamp"
fi

mkdir -p .cache/jars
fetch() {  # group-path artifact version
  local dest=".cache/jars/$2-$3.jar"
  [ -s "$dest" ] && return 0
  local url="$MAVEN/$1/$2/$3/$2-$3.jar"
  if ! curl -fsSL --retry 3 -o "$dest.part" "$url" || ! curl -fsSL --retry 3 -o "$dest.sha1" "$url.sha1"; then
    rm -f "$dest.part" "$dest.sha1"
    echo "setup: could not download $2-$3.jar from Maven Central ($url). Check that Maven Central is reachable and run 'make setup' again." >&2
    exit 1
  fi
  if [ "$(sha1sum "$dest.part" | cut -d' ' -f1)" != "$(cut -c1-40 "$dest.sha1")" ]; then
    rm -f "$dest.part" "$dest.sha1"
    echo "setup: checksum mismatch for $2-$3.jar; run 'make setup' again." >&2
    exit 1
  fi
  mv "$dest.part" "$dest" && rm -f "$dest.sha1"
}
fetch io/delta "delta-spark_${SPARK_BINARY}_${SCALA}" "$DELTA_JAR_VERSION"
fetch io/delta delta-storage "$DELTA_JAR_VERSION"
# the driver JVM's class-data-sharing archive (pipeline/runtime/session.py): once per PySpark version and Java, about
# a minute; JVMs start without it when it cannot be made
archive=$(.venv/bin/python -c 'from pipeline.runtime import jvm_archive; print(jvm_archive())')
if [ ! -f "$archive" ]; then
  echo "setup: writing the driver JVM's class-data-sharing archive ($archive)"
  .venv/bin/python scripts/jvm_archive.py >.cache/jvm-archive.log 2>&1 \
    || echo "setup: no class-data-sharing archive (see .cache/jvm-archive.log); JVMs start without it" >&2
fi
echo "setup: ready (.venv, Delta Lake $DELTA_JAR_VERSION jars in .cache/jars, $(basename "$archive"))"
