"""A lagging follower's read of its leader's log (pipeline/data/catch_up.py), on a real Delta log."""

from pyspark.sql import functions as F

from pipeline.data.catch_up import read_lagging_ranges
from pipeline.schemas import LOG_SCHEMA


def test_a_lagging_follower_reads_its_range_and_the_ranges_are_broadcast_not_the_log(spark, tmp_path):
    log = str(tmp_path / "log")
    spark.createDataFrame([("t", p, offset, 0, 1000 + offset, None, b"v" * 100, None, None, None)
                           for p in range(2) for offset in range(20)], LOG_SCHEMA) \
        .write.format("delta").save(log)
    ranges = spark.createDataFrame([("t", 0, 0, 2, 5, 9), ("t", 1, 0, 1, 18, 20)],
                                   "topic string, partition int, leader int, broker int, from_offset long, "
                                   "to_offset long").localCheckpoint()
    # a log Spark would think small enough to broadcast (its files are a few kilobytes, and a
    # well-compressed log of gigabytes can be tens of megabytes): the ranges are broadcast anyway
    key, before = "spark.sql.autoBroadcastJoinThreshold", spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set(key, str(1 << 30))
    try:
        read = read_lagging_ranges(ranges, [0], lambda broker: spark.read.format("delta").load(log), 1 << 20)
        plan = read._jdf.queryExecution().executedPlan().toString()
        rows = sorted((r["partition"], r["offset"], r["broker"]) for r in read.collect())
    finally:
        spark.conf.set(key, before)
    assert rows == [(0, o, 2) for o in range(5, 9)] + [(1, 18, 1), (1, 19, 1)]
    joins = [line for line in plan.splitlines() if "BroadcastHashJoin" in line]
    assert joins and all("BuildRight" in line for line in joins), plan  # (the log is the join's left side)
    assert read.filter(F.col("value") != F.lit(b"v" * 100)).count() == 0
