"""Writes the driver JVM's class-data-sharing archive (pipeline.runtime.jvm_archive(); `make setup`
runs this once per PySpark version). A JVM started from PySpark runs what a CLI command and a
round do, on a throw-away cluster, and Java (-XX:ArchiveClassesAtExit) archives the classes it
loaded when it exits. Without the archive everything works, only JVMs start slower; so a failure
here is reported and set-up goes on."""

import os
import shutil
import sys
import tempfile

from pyspark import SparkContext

from pipeline import Cluster, ManualClock
from pipeline.runtime import QUIET_CDS_LOG, get_spark, jvm_archive


def workload(spark, root: str) -> None:
    clock = ManualClock(start_ms=1_700_000_000_000)
    cluster = Cluster.create(spark, root, brokers=3, clock=clock)
    cluster.create_topic("t", partitions=2, replication_factor=3)
    cluster.produce("t", [{"value": f"v{i}", "key": f"k{i}"} for i in range(10)], acks="all")
    for _ in range(2):
        clock.advance(500)
        cluster.run_round()
    cluster = Cluster.open(spark, root, clock=clock)  # as every CLI command does
    cluster.describe("t").collect()
    cluster.read("t").collect()
    cluster.produce_results().collect()


def main() -> int:
    target = jvm_archive()
    if target.is_file():
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.unlink(missing_ok=True)
    work = tempfile.mkdtemp(prefix="replog-jvm-archive-")
    try:
        spark = get_spark(app_name="replog-jvm-archive", extra={
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={partial} {QUIET_CDS_LOG}"})
        workload(spark, os.path.join(work, "cluster"))
        spark.stop()
        # the archive is written as the JVM exits, which it does once its stdin closes
        jvm = SparkContext._gateway.proc
        jvm.stdin.close()
        jvm.wait(timeout=600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not partial.is_file() or partial.stat().st_size == 0:
        print("setup: the JVM wrote no class-data-sharing archive; JVMs start without one", file=sys.stderr)
        return 1
    partial.rename(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
