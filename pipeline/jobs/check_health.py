"""Fail when any partition is offline or under its min ISR: the check an Airflow task runs after the
replication job.

    spark-submit --properties-file conf/spark-defaults.conf jobs/check_health.py --root PATH

It asks `replog.partitions` with Spark SQL, prints each unhealthy partition (at most --show of them)
in Kafka's describe format, and exits 1 if there are any, 0 if none, 2 when the cluster cannot be
opened. Under-replicated partitions that still have min.insync.replicas in sync are reported, but
they do not fail the check: acks=all writes still succeed. Each term is pipeline/control/
partition_health.py's definition, the one the round's gauges and `replog topics` use.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_health.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.environ.get("REPLOG_ROOT"), help="cluster root (default $REPLOG_ROOT)")
    parser.add_argument("--show", type=int, default=100, help="print at most this many unhealthy partitions")
    args = parser.parse_args(argv)
    if not args.root:
        parser.error("--root is required (or set REPLOG_ROOT)")
    if importlib.util.find_spec("pipeline") is None:  # a checkout whose package is not installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from pipeline import Cluster, get_spark
    from pipeline.cli import describe_line
    from pipeline.errors import ReplogError
    from pipeline.control.partition_health import SQL
    from pipeline.runtime import SparkSetupError

    try:
        spark = get_spark(app_name="replog-check-health")
        Cluster.open(spark, args.root)  # registers the replog.* views for this root
    except (ReplogError, SparkSetupError) as err:
        print(f"check_health: {err}", file=sys.stderr)
        return 2
    counts = spark.sql(f"""
        SELECT count_if({SQL['offline']}) AS offline, count_if({SQL['under_min_isr']}) AS under_min_isr,
               count_if({SQL['under_replicated']}) AS under_replicated, count(*) AS partitions
        FROM replog.partitions""").first()
    unhealthy = f"({SQL['offline']}) OR ({SQL['under_min_isr']})"
    bad = spark.sql(f"SELECT * FROM replog.partitions WHERE {unhealthy} ORDER BY topic, partition LIMIT {args.show}")
    for r in bad.toLocalIterator():
        print(f"{describe_line(r)}\tMinIsr: {r['min_isr']}")
    summary = (f"{counts['partitions']} partitions: {counts['offline']} offline, {counts['under_min_isr']} under "
               f"min ISR, {counts['under_replicated']} under-replicated")
    if counts["offline"] or counts["under_min_isr"]:
        print(f"check_health: UNHEALTHY: {summary}", file=sys.stderr)
        return 1
    print(f"check_health: healthy: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
