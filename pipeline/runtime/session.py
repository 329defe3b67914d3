"""A SparkSession with Delta Lake configured from the jars `make setup` cached in the checkout."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pipeline.runtime import cache, jvm_lookups
from pipeline.runtime.tuning import FAST_CONFS

__all__ = ["get_spark", "delta_jars", "SparkSetupError", "forget_table_logs", "driver_java_options", "jvm_archive"]

# The driver JVM's class-data-sharing archive (`make setup` writes it: scripts/jvm_archive.py): the
# classes a CLI command and a round load, already parsed and verified. A JVM started from PySpark
# maps it instead of loading those classes from the jars. Named by the PySpark version, whose jars
# it holds; a JVM that cannot use it (another Java build or class path) runs without it, silently.
# It lives in the cache beside the jars (pipeline/runtime/cache.py).
# the archive's warnings (a mismatch) go to stdout, where the CLI prints its answers
QUIET_CDS_LOG = "-Xlog:cds=off -Xlog:cds+dynamic=off"
DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def forget_table_logs(spark: SparkSession) -> None:
    """Drops Delta's in-process cache of table logs (DeltaLog: one entry per table path, with its
    snapshot and their query plans, kept for an hour). A process that makes cluster after cluster
    (the test suite, the soak's replays) calls it when it is done with one: each cluster of a
    test kept ~15 MB of driver heap, and a test worker's 2 GB heap was 88% full at the end of the
    suite. A table used after this is read again from its log; nothing is lost."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


class SparkSetupError(RuntimeError):
    """The machine lacks what Spark needs (Java 17, 21 or 25, the Delta jars)."""


def delta_jars(jars_dir: Path | None = None, fetch: bool = True) -> list[str]:
    """The cached Delta jars (`delta-spark` and `delta-storage`), fetched from Maven Central into
    the cache the first time (pipeline/runtime/cache.py); a clear error when they cannot be."""
    jars_dir = jars_dir or cache.jars_dir()

    def found() -> list[str]:
        jars = sorted(str(p) for p in jars_dir.glob("delta-*.jar"))
        names = " ".join(Path(j).name for j in jars)
        return jars if "delta-spark" in names and "delta-storage" in names else []
    if not found() and fetch:
        try:
            cache.fetch_delta_jars(jars_dir)
        except OSError as err:
            raise SparkSetupError(f"The Delta Lake jars are not in {jars_dir} and could not be fetched from Maven "
                                  f"Central ({err}); check the network, or set REPLOG_CACHE to a directory whose "
                                  "jars/ holds them.") from None
    if not found():
        raise SparkSetupError(f"The Delta Lake jars are not in {jars_dir}; run 'make setup' (it downloads them once "
                              "from Maven Central).")
    return found()


def jvm_archive() -> Path:
    """The class-data-sharing archive of this PySpark's classes for the Java found (an archive
    serves only the JVM release that made it)."""
    import pyspark
    java = _java()
    release = java_release(java)[0] if java else None
    return cache.cache_dir() / "jvm" / f"pyspark-{pyspark.__version__}-java{release}.jsa"


# Java's parallel garbage collector, for a process that makes and forgets many clusters (the test
# suite, CPU bound on its cores: G1's concurrent threads take cycles from the driver). The round
# does not gain from it and the job under load did not either, so the product keeps Java's
# default, G1 (docs/benchmarks.md, "The driver's garbage collector").
PARALLEL_GC = "-XX:+UseParallelGC"


def driver_java_options(short_lived: bool = False, parallel_gc: bool = False) -> str:
    """Options for a driver JVM that PySpark starts: the class-data-sharing archive when `make
    setup` made one; for a short-lived process (one CLI command) the C1 compiler only, which
    compiles sooner and less than C2 (`replog topics --list`: see the README's CLI section); with
    `parallel_gc`, Java's parallel garbage collector (PARALLEL_GC)."""
    archive = jvm_archive()
    # Spark splits these options at whitespace: a checkout whose path has some goes without
    usable = archive.is_file() and not any(c.isspace() for c in str(archive))
    options = [f"-XX:SharedArchiveFile={archive} {QUIET_CDS_LOG}"] if usable else []
    if short_lived:
        options.append("-XX:TieredStopAtLevel=1")
    if parallel_gc:
        options.append(PARALLEL_GC)
    return " ".join(options)


# The Java releases the suite passes on, each with its first accepted update: Spark 4.2's own list
# (17, 21 and 25; it deprecates 25 before 25.0.3, whose G1 corrupted data: SPARK-55852).
JAVA_RELEASES = {17: 0, 21: 0, 25: 3}


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    return shutil.which("java", path=os.path.join(home, "bin")) if home else shutil.which("java")


def parse_java_version(output: str) -> tuple[int | None, int, str]:
    """The feature release and update `java -version` printed (17 and 15 for "17.0.15"; None and 0
    when it names none) and the line that names them. The JVM may print other lines first: "Picked
    up JAVA_TOOL_OPTIONS: ..." when that variable is set."""
    for line in output.splitlines():
        found = re.search(r'version "(\d+)(?:\.(\d+))?(?:\.(\d+))?', line)
        if found:
            return int(found.group(1)), int(found.group(3) or 0), line
    return None, 0, (output.splitlines() or ["unknown"])[-1]


def java_accepted(release: int | None, update: int) -> bool:
    """Whether a Java release and update runs the product: a release of JAVA_RELEASES at or after
    its first accepted update."""
    return release in JAVA_RELEASES and update >= JAVA_RELEASES[release]


@functools.lru_cache(maxsize=None)
def java_release(java: str) -> tuple[int | None, int, str]:
    """parse_java_version of what the `java` executable says."""
    return parse_java_version(subprocess.run([java, "-version"], capture_output=True, text=True).stderr)


def _check_java() -> None:
    java = _java()
    if java is None:
        raise SparkSetupError("No Java found: install a Java 17 JDK (or 21, or 25) and retry.")
    release, update, line = java_release(java)
    if not java_accepted(release, update):
        raise SparkSetupError(f"Spark 4.2 with Delta 4.4 runs on Java 17, 21 or 25 (from 25.0.3); found: {line}.")


def _submitted_conf() -> Any:
    """Under spark-submit (the JVM is already up and PySpark connects to it), the SparkConf it was
    given: its --master, --conf and properties file win over this module's defaults. Else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext
    SparkContext._ensure_initialized()
    return SparkConf()


def get_spark(master: str | None = None, app_name: str = "replog", extra: dict | None = None,
              short_lived: bool = False, remember_lookups: bool = True) -> SparkSession:
    """A SparkSession with the Delta extension, from the cached jars (no network needed).

    >>> spark = get_spark()                           # local[*]
    >>> spark = get_spark(master="spark://host:7077")  # a standalone cluster

    The master is `master`, else spark-submit's --master, else $REPLOG_MASTER, else local[2]; under
    spark-submit, its --conf and properties file win over the defaults set here. A JVM started
    here gets `driver_java_options(short_lived)` unless `extra` sets spark.driver.extraJavaOptions.

    `remember_lookups` switches on this process's Py4J lookup cache (pipeline/runtime/jvm_lookups.py,
    once per process): a session made elsewhere runs the pipeline without it, only slower.
    """
    if remember_lookups:
        jvm_lookups.install()
    active = SparkSession.getActiveSession()
    if active is not None and master is None and not extra:
        return active
    _check_java()
    # Python workers (UDFs) run the same interpreter as the driver, with this package importable
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = _submitted_conf()
    builder = SparkSession.builder.appName(app_name)
    if master or submitted is None or not submitted.contains("spark.master"):
        builder = builder.master(master or os.environ.get("REPLOG_MASTER", "local[2]"))
    confs = {**FAST_CONFS, **DELTA_CONFS, "spark.jars": ",".join(delta_jars())}
    if submitted is not None:  # a job under spark-submit keeps its Spark UI unless its conf turns it off
        confs.pop("spark.ui.enabled", None)
    java_options = driver_java_options(short_lived) if submitted is None else ""
    if java_options:
        confs["spark.driver.extraJavaOptions"] = java_options
    confs.update(extra or {})
    for key, value in confs.items():
        if key in (extra or {}) or submitted is None or not submitted.contains(key):
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # under spark-submit the JVM starts before this runs, so spark.jars set here comes too late and
    # Spark only warns that the extension is missing: say it instead
    if not spark.sparkContext._jvm.org.apache.spark.util.Utils.classIsLoadable(
            "io.delta.sql.DeltaSparkSessionExtension"):
        spark.stop()
        raise SparkSetupError(
            "The Delta Lake classes are not on Spark's classpath: under spark-submit pass "
            "--properties-file conf/spark-defaults.conf from the checkout, or start it with `replog job`.")
    spark.sparkContext.setLogLevel("ERROR")
    return spark
