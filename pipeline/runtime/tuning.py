"""Spark tuning for a round: many small queries over little data, each planned once per round.
The session's defaults (FAST_CONFS) and the blocks that change them for work on many rows; rules
never set any of these themselves."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

from pyspark.sql import DataFrame, SparkSession

__all__ = ["FAST_CONFS", "COMPILED_EXPRESSIONS", "settings_restored", "compiled_expressions", "without_size_estimate"]

FAST_CONFS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # one task per shuffle: a round's shuffles carry its working set, not the log (on a cluster:
    # the executor cores). Every setting's figures: docs/benchmarks.md, "The session's settings"
    "spark.sql.shuffle.partitions": "1",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    "spark.databricks.delta.stats.collect": "true",
    "spark.log.structuredLogging.enabled": "false",
    # A round is many small queries over little data, each planned once per round; what it pays for
    # is planning, not rows:
    # - adaptive execution re-plans each shuffle as a job of its own;
    # - generated code is compiled anew every round, because the round's time and id are literals
    #   in it; interpreted expressions compile nothing;
    # - PySpark's DataFrame debugging sends the call site to the JVM around every functions.* call;
    # - MERGE need not copy its source first: every source a round merges is pinned (deterministic).
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.databricks.delta.merge.materializeSource": "none",
    # Hadoop's local file system, without its native library, forks a `chmod` for every file it
    # creates and a `readlink` for every rename: its raw variant writes no .crc side files and
    # Delta no checksum file, so far fewer of them
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
    # a round's summary query nests every cached step's plan; its explain string (built for the SQL
    # listener) must not grow without bound
    "spark.sql.maxPlanStringLength": "200000",
    "spark.driver.memory": "2g",
}


# Compiled expressions, for work on many rows (FAST_CONFS interprets them: a round's data is small)
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
