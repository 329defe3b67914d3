"""A SparkSession with Delta Lake configured from the jars `make setup` cached in the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from pyspark.sql import DataFrame, SparkSession

from pipeline.jvm_lookups import convert_lists_in_bulk, remember_jvm_lookups, remember_named_columns

__all__ = ["get_spark", "delta_jars", "SparkSetupError", "COMPILED_EXPRESSIONS", "settings_restored", "compiled_expressions",
           "forget_table_logs", "without_size_estimate"]

remember_jvm_lookups()  # every process that imports the pipeline: see jvm_lookups.py
remember_named_columns()
convert_lists_in_bulk()

JARS_DIR = Path(__file__).resolve().parent.parent / ".cache" / "jars"
# The driver JVM's class-data-sharing archive (`make setup` writes it: scripts/jvm_archive.py): the
# classes a CLI command and a round load, already parsed and verified. A JVM started from PySpark
# maps it instead of loading those classes from the jars. Named by the PySpark version, whose jars
# it holds; a JVM that cannot use it (another Java build or class path) runs without it, silently.
JVM_ARCHIVE_DIR = JARS_DIR.parent / "jvm"
# the archive's warnings (a mismatch) go to stdout, where the CLI prints its answers
QUIET_CDS_LOG = "-Xlog:cds=off -Xlog:cds+dynamic=off"
DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
FAST_CONFS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # one task per shuffle: a round's shuffles carry its working set, not the log; measured side by
    # side, a round of 1,000 records into 100 partitions took 3.78 s with 1 and 4.32 s with 2, and
    # a round appending 500,000 records 36.5 s against 32.3 s (on a cluster: the executor cores)
    "spark.sql.shuffle.partitions": "1",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    "spark.databricks.delta.stats.collect": "true",
    "spark.log.structuredLogging.enabled": "false",
    # A round is many small queries over little data, each planned once per round; what it pays for
    # is planning, not rows (jobs/profile_round.py, 100 partitions, 1,000 records a round, 2 cores):
    # - adaptive execution re-plans each shuffle as a job of its own (round 7.9 s -> 6.1 s without);
    # - generated code is compiled anew every round, because the round's time and id are literals
    #   in it (~20 Janino compiles a round, 30-150 ms each); interpreted expressions compile nothing
    #   (0 compiles a round after the first; 6.0 s -> 5.4 s);
    # - PySpark's DataFrame debugging sends the call site to the JVM around every functions.* call
    #   (~6 py4j calls each, ~4,000 a round);
    # - MERGE need not copy its source first: every source a round merges is pinned (deterministic).
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.databricks.delta.merge.materializeSource": "none",
    # Hadoop's local file system, without its native library, forks a `chmod` for every file it
    # creates and a `readlink` for every rename (~340 processes a round, ~3 ms each on 2 cores):
    # its raw variant writes no .crc side files and Delta no checksum file, so far fewer of them
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
    # a round's summary query nests every cached step's plan; its explain string (built for the SQL
    # listener) must not grow without bound
    "spark.sql.maxPlanStringLength": "200000",
    "spark.driver.memory": "2g",
}


# Compiled expressions, for work on many rows (FAST_CONFS interprets them: a round's data is small).
# A produce() of 1,000,000 rows took 25-32 s interpreted and 3-5 s compiled, side by side in one
# process
COMPILED_EXPRESSIONS = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}


@contextmanager
def settings_restored(spark: SparkSession, keys: Iterable[str]) -> Iterator[dict[str, str | None]]:
    """The session's SQL settings `keys` as the block found them (yielded: None for unset), put
    back when it ends, whatever it set meanwhile."""
    before = {k: spark.conf.get(k, None) for k in keys}
    try:
        yield before
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


@contextmanager
def compiled_expressions(spark: SparkSession, when: bool = True) -> Iterator[None]:
    """A block of work on many rows: the session's expressions compiled inside it when `when`
    (COMPILED_EXPRESSIONS), the session's own settings back when it ends, whatever it set."""
    with settings_restored(spark, COMPILED_EXPRESSIONS):
        if when:
            for key, value in COMPILED_EXPRESSIONS.items():
                spark.conf.set(key, value)
        yield


def forget_table_logs(spark: SparkSession) -> None:
    """Drops Delta's in-process cache of table logs (DeltaLog: one entry per table path, with its
    snapshot and their query plans, kept for an hour). A process that makes cluster after cluster
    (the test suite, the soak's replays) calls it when it is done with one: each cluster of a
    test kept ~15 MB of driver heap, and a test worker's 2 GB heap was 88% full at the end of the
    suite. A table used after this is read again from its log; nothing is lost."""
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


class SparkSetupError(RuntimeError):
    """The machine lacks what Spark needs (Java 17, the Delta jars)."""


def delta_jars(jars_dir: Path = JARS_DIR) -> list[str]:
    """The cached Delta jars (`delta-spark` and `delta-storage`); a clear error when missing."""
    jars = sorted(str(p) for p in jars_dir.glob("delta-*.jar"))
    names = " ".join(Path(j).name for j in jars)
    if "delta-spark" not in names or "delta-storage" not in names:
        raise SparkSetupError(
            f"The Delta Lake jars are not in {jars_dir}; run 'make setup' (it downloads them once "
            "from Maven Central)."
        )
    return jars


def jvm_archive() -> Path:
    import pyspark
    return JVM_ARCHIVE_DIR / f"pyspark-{pyspark.__version__}.jsa"


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


def _check_java() -> None:
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get(
        "JAVA_HOME"
    ) else shutil.which("java")
    if java is None:
        raise SparkSetupError("No Java found: install a Java 17 JDK (Spark 4.2 needs it) and retry.")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    if 'version "17' not in out:
        first = out.splitlines()[0] if out else "unknown"
        raise SparkSetupError(f"Spark 4.2 with Delta 4.4 needs Java 17, found: {first}.")


def _submitted_conf() -> Any:
    """Under spark-submit (the JVM is already up and PySpark connects to it), the SparkConf it was
    given: its --master, --conf and properties file win over this module's defaults. Else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext
    SparkContext._ensure_initialized()
    return SparkConf()


def get_spark(master: str | None = None, app_name: str = "replog", extra: dict | None = None,
              short_lived: bool = False) -> SparkSession:
    """A SparkSession with the Delta extension, from the cached jars (no network needed).

    >>> spark = get_spark()                           # local[*]
    >>> spark = get_spark(master="spark://host:7077")  # a standalone cluster

    The master is `master`, else spark-submit's --master, else $REPLOG_MASTER, else local[2]; under
    spark-submit, its --conf and properties file win over the defaults set here. A JVM started
    here gets `driver_java_options(short_lived)` unless `extra` sets spark.driver.extraJavaOptions.
    """
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
            "--properties-file conf/spark-defaults.conf (or --jars with the jars in .cache/jars).")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def without_size_estimate(pinned: DataFrame) -> DataFrame:
    """`pinned` (a localCheckpoint) as a plan that carries no size estimate (Spark's default).
    localCheckpoint keeps the estimate of the plan it pinned, and a join's estimate is the product
    of its sides': a round's output, pinned from a plan over the last round's output joined with
    what was read from it, squared the estimate every round, until estimating a plan
    ran the driver out of memory (a follower catching up ten records a round, the carry kept).
    No Spark job: the pinned blocks are read as they are."""
    jdf = pinned._jdf
    session = pinned.sparkSession
    return DataFrame(session._jsparkSession.internalCreateDataFrame(jdf.queryExecution().toRdd(), jdf.schema(), False),
                     session)
