"""The log cleaner: Kafka's log compaction (design 4.8) on the broker logs.

A compacted topic (cleanup.policy `compact` or `compact,delete`) keeps at least the last record of
every key, at its offset. A pass of the cleaner, per compacted partition:

- `cleanable_offsets` (Kafka's LogCleanerManager.cleanableOffsets and LogToClean): the dirty part
  runs from the last clean's end (the checkpoint) to the first uncleanable offset, the least of the
  high watermark (nothing at or above it is touched), the log's last offset (the newest record
  stays: it is the head a follower fetches up to) and the first record younger than
  min.compaction.lag.ms. The partition is cleaned when its dirty bytes are more than
  min.cleanable.dirty.ratio of its bytes, or its oldest dirty record is older than
  max.compaction.lag.ms (then its compaction delay is how much older).
- `next_cleaner_state`: the checkpoint moves to the end of this clean. Tombstones follow KIP-534:
  one goes only delete.retention.ms after a clean first compacted past it. The horizon is kept per
  partition, not per batch, as generations: a generation records (end, time) of one clean, and once
  delete.retention.ms has passed since it, tombstones below its end may go and a new generation
  starts. So a tombstone lives between delete.retention.ms and about twice that after its first
  clean, never less.
- `compacted_away`: the records below the first uncleanable offset that the clean removes from one
  replica: those whose key appears again later in that range, those without a key (Kafka's cleaner
  drops them too), and tombstones below the horizon. Two records always stay: the first record of
  each leader epoch in the log (this log's leader-epoch cache is made from those, where Kafka keeps
  a separate checkpoint file), and a tombstone with such a kept record of its key before it (so a
  reader never sees a value its deletion hid).

Every replica of a partition is cleaned with the same bounds and horizon: the leader, and each
follower whose log is a validated prefix of the leader's that reaches the first uncleanable offset.
Records below the high watermark are the same on those, so the same records stay: the replicas keep
identical offsets below it. A follower not there yet is cleaned by a later pass; what it fetches
meanwhile is the leader's compacted log. Offsets never change, and a read from a removed offset
starts at the next record present.

`run_cleaner` is the pass (I/O): one Delta commit per broker log with records to remove, then the
checkpoints, then a row of cleaner_runs (the cleaner gauges of replog.metrics).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import reduce
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.config import compacted, effective_topic_config
from pipeline.control.replication import record_size
from pipeline.schemas import CLEANER_RUNS_SCHEMA, CLEANER_SCHEMA, PARTITION_KEY, REPLICA_KEY
from pipeline.storage import Storage

__all__ = ["cleanable_offsets", "next_cleaner_state", "compacted_away", "CleanerReport", "run_cleaner",
           "CLEANER_TAG"]

CLEANER_TAG = "replog-cleaner"


def cleanable_offsets(leaders_df: DataFrame, now_ms: int) -> DataFrame:
    """Per compacted partition, what a clean now would cover and whether it is due.

    leaders_df: the leader's records at or above its log start offset (topic, partition, offset,
    timestamp, key, value) with the partition's log_start_offset, high_watermark, log_end_offset
    (the leader's), checkpoint (the first dirty offset of the last clean; null: never cleaned),
    min_compaction_lag_ms, max_compaction_lag_ms, min_cleanable_dirty_ratio.
    Returns topic, partition, first_dirty_offset, first_uncleanable_offset, clean_bytes, dirty_bytes,
    cleanable_ratio, max_compaction_delay_ms, cleanable.
    """
    now = F.lit(now_ms)
    in_partition = Window.partitionBy(*PARTITION_KEY)
    too_young = (F.col("min_compaction_lag_ms") > 0) & (F.col("timestamp") > now - F.col("min_compaction_lag_ms"))
    first_young = F.min(F.when(too_young, F.col("offset"))).over(in_partition)
    end = F.greatest(F.col("log_start_offset"),
                     F.least(F.col("high_watermark"), F.col("log_end_offset") - 1,
                             F.coalesce(first_young, F.col("log_end_offset"))))
    first_dirty = F.least(F.greatest(F.coalesce(F.col("checkpoint"), F.col("log_start_offset")),
                                     F.col("log_start_offset")), F.col("_end"))
    dirty = (F.col("offset") >= F.col("_first_dirty")) & (F.col("offset") < F.col("_end"))
    per_partition = (
        leaders_df.withColumn("_end", end).withColumn("_first_dirty", first_dirty)
        .withColumn("_size", record_size(F.col("key"), F.col("value")))
        .groupBy(*PARTITION_KEY, "_first_dirty", "_end", "max_compaction_lag_ms", "min_cleanable_dirty_ratio")
        .agg(F.sum(F.when(F.col("offset") < F.col("_first_dirty"), F.col("_size")).otherwise(0)).alias("clean_bytes"),
             F.sum(F.when(dirty, F.col("_size")).otherwise(0)).alias("dirty_bytes"),
             F.min(F.when(dirty, F.col("timestamp"))).alias("_earliest_dirty"))
    )
    # Kafka's max compaction delay: how far the oldest dirty record is past max.compaction.lag.ms
    # (the default, Long.MaxValue, never: checked before subtracting, so nothing overflows)
    lag = F.col("max_compaction_lag_ms")
    clean_until = now - lag
    delay = (F.when((lag < now) & (F.col("_earliest_dirty") < clean_until), clean_until - F.col("_earliest_dirty"))
             .otherwise(F.lit(0)).cast("long"))
    total = F.col("clean_bytes") + F.col("dirty_bytes")
    ratio = F.when(total > 0, F.col("dirty_bytes") / total).otherwise(F.lit(0.0))
    return per_partition.select(
        *PARTITION_KEY, F.col("_first_dirty").alias("first_dirty_offset"),
        F.col("_end").alias("first_uncleanable_offset"),
        F.col("clean_bytes").cast("long").alias("clean_bytes"), F.col("dirty_bytes").cast("long").alias("dirty_bytes"),
        ratio.alias("cleanable_ratio"), delay.alias("max_compaction_delay_ms"),
        ((F.col("dirty_bytes") > 0) & ((delay > 0) | (ratio > F.col("min_cleanable_dirty_ratio")))).alias("cleanable"),
    )


def next_cleaner_state(plan_df: DataFrame, now_ms: int) -> DataFrame:
    """The checkpoint after cleaning each partition of `plan_df` now, with the tombstone horizon
    this clean uses.

    plan_df: topic, partition, first_uncleanable_offset, delete_retention_ms and the partition's
    last state (generation_end_offset, generation_ms, tombstone_horizon_offset: null when never
    cleaned). Returns the cleaner table's columns.
    """
    now = F.lit(now_ms).cast("long")
    due = F.col("generation_ms").isNull() | (now - F.col("generation_ms") >= F.col("delete_retention_ms"))
    horizon = F.coalesce(F.col("tombstone_horizon_offset"), F.lit(0).cast("long"))
    return plan_df.select(
        *PARTITION_KEY,
        F.col("first_uncleanable_offset").alias("first_dirty_offset"),
        F.when(due, F.col("first_uncleanable_offset")).otherwise(F.col("generation_end_offset"))
        .alias("generation_end_offset"),
        F.when(due, now).otherwise(F.col("generation_ms")).alias("generation_ms"),
        F.when(F.col("generation_ms").isNotNull() & due, F.greatest(horizon, F.col("generation_end_offset")))
        .otherwise(horizon).alias("tombstone_horizon_offset"),
        now.alias("last_clean_ms"),
    )


def compacted_away(records_df: DataFrame, plan_df: DataFrame) -> DataFrame:
    """The records one clean removes from each replica.

    records_df: the replicas' records at or above their log start offset (topic, partition, broker,
    offset, leader_epoch, key, value); plan_df: topic, partition, first_uncleanable_offset,
    tombstone_horizon_offset. Returns topic, partition, broker, offset.
    """
    epoch = Window.partitionBy(*REPLICA_KEY, "leader_epoch")
    same_key = Window.partitionBy(*REPLICA_KEY, "key")
    earlier_same_key = same_key.orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    has_key = F.col("key").isNotNull()
    in_range = (
        records_df.withColumn("_first_of_epoch", F.col("offset") == F.min("offset").over(epoch))  # over the whole log
        .join(plan_df.select(*PARTITION_KEY, "first_uncleanable_offset", "tombstone_horizon_offset"), on=PARTITION_KEY)
        .filter(F.col("offset") < F.col("first_uncleanable_offset"))
    )
    # keys are compared within the cleaned range only, as Kafka's offset map of the dirty part
    marked = (in_range
              .withColumn("_superseded", has_key & (F.max("offset").over(same_key) > F.col("offset")))
              .withColumn("_kept_before", F.coalesce(
                  F.max(F.col("_first_of_epoch").cast("int")).over(earlier_same_key), F.lit(0)) == 1))
    expired_tombstone = (has_key & F.col("value").isNull()
                         & (F.col("offset") < F.col("tombstone_horizon_offset")) & ~F.col("_kept_before"))
    return (marked.filter(~F.col("_first_of_epoch") & (~has_key | F.col("_superseded") | expired_tombstone))
            .select(*REPLICA_KEY, "offset"))


# -- the pass (I/O) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CleanerReport:
    """One cleaner pass, as its cleaner_runs row."""

    run_id: int
    now_ms: int
    compacted_partitions: int
    partitions_cleaned: int
    replicas_cleaned: int
    records_removed: int
    clean_time_ms: int
    max_compaction_delay_ms: int
    max_dirty_percent: int
    uncleanable_partitions: int


def _compacted_topics(spark: SparkSession, storage: Storage, cluster_config: dict[str, Any]) -> DataFrame | None:
    """topic, min_compaction_lag_ms, max_compaction_lag_ms, min_cleanable_dirty_ratio,
    delete_retention_ms of every compacted topic (None: there is none). O(topics) on the driver."""
    rows = []
    for topic in storage.read("topics").select("topic", "config").collect():
        config = effective_topic_config(cluster_config, json.loads(topic["config"]))
        if compacted(config["cleanup.policy"]):
            rows.append((topic["topic"], config["min.compaction.lag.ms"], config["max.compaction.lag.ms"],
                         float(config["min.cleanable.dirty.ratio"]), config["delete.retention.ms"]))
    if not rows:
        return None
    return spark.createDataFrame(rows, "topic string, min_compaction_lag_ms long, max_compaction_lag_ms long, "
                                       "min_cleanable_dirty_ratio double, delete_retention_ms long")


def run_cleaner(spark: SparkSession, storage: Storage, brokers: list[int], cluster_config: dict[str, Any],
                now_ms: int, down: set[int], log_readable: Callable[[int], bool],
                before_commit: Callable[[], None]) -> CleanerReport | None:
    """One pass over every compacted partition (see the module's text). `down`: brokers that are
    not running (skipped); a broker whose log cannot be read (`log_readable`) is skipped too, and
    its replicas count as uncleanable. `before_commit` runs before each commit (the one-writer
    lease). None when no topic is compacted (nothing is written)."""
    started = time.monotonic()
    topics = _compacted_topics(spark, storage, cluster_config)
    if topics is None:
        return None
    storage.ensure("cleaner")
    storage.ensure("cleaner_runs")
    run_id = (storage.read("cleaner_runs").agg(F.max("run_id")).first()[0] or 0) + 1
    unreadable = {b for b in brokers if b not in down and not log_readable(b)}
    names = F.broadcast(topics.select("topic"))
    parts = (storage.read("partitions").join(names, on="topic")
             .select(*PARTITION_KEY, "leader", "leader_epoch", "replicas"))
    state = storage.replica_state().join(names, on="topic").select(
        *REPLICA_KEY, "log_start_offset", "log_end_offset", "high_watermark", "validated_leader_epoch")
    checkpoints = storage.read("cleaner")
    skipped = down | unreadable
    readable = [b for b in brokers if b not in skipped]
    if not readable:
        return None

    def log(broker: int) -> DataFrame:
        return storage.read_log(broker).join(names, on="topic").withColumn("broker", F.lit(broker))

    logs = reduce(DataFrame.unionByName, [log(b) for b in readable])
    leaders = (parts.filter(F.col("leader") >= 0)
               .join(state.withColumnRenamed("broker", "leader"), on=[*PARTITION_KEY, "leader"])
               .join(F.broadcast(topics), on="topic")
               .join(checkpoints.select(*PARTITION_KEY, F.col("first_dirty_offset").alias("checkpoint")),
                     on=PARTITION_KEY, how="left"))
    leader_records = (logs.join(leaders.withColumnRenamed("leader", "broker"), on=REPLICA_KEY)
                      .filter(F.col("offset") >= F.col("log_start_offset")))
    offsets = cleanable_offsets(leader_records, now_ms).localCheckpoint()
    plan = (offsets.filter("cleanable")
            .join(F.broadcast(topics.select("topic", "delete_retention_ms")), on="topic")
            .join(checkpoints.drop("first_dirty_offset", "last_clean_ms"), on=PARTITION_KEY, how="left"))
    new_state = next_cleaner_state(plan, now_ms).localCheckpoint()
    cleaned = (state.join(parts, on=PARTITION_KEY)
               .join(new_state.select(*PARTITION_KEY, F.col("first_dirty_offset").alias("first_uncleanable_offset"),
                                      "tombstone_horizon_offset"), on=PARTITION_KEY)
               .filter((F.col("broker") == F.col("leader"))
                       | ((F.coalesce(F.col("validated_leader_epoch"), F.lit(0)) >= F.col("leader_epoch"))
                          & (F.col("log_end_offset") >= F.col("first_uncleanable_offset"))))
               .filter(~F.col("broker").isin(*sorted(skipped)))
               ).localCheckpoint()
    removed_total = 0
    tag = f"{CLEANER_TAG}={run_id}"
    for broker in readable:
        mine = cleaned.filter(F.col("broker") == broker)
        records = (log(broker).join(mine.select(*REPLICA_KEY, "log_start_offset"), on=REPLICA_KEY)
                   .filter(F.col("offset") >= F.col("log_start_offset")))
        removed = compacted_away(records, mine).select(*PARTITION_KEY, "offset").localCheckpoint()
        count = removed.count()
        if count:
            before_commit()
            storage.delete_log_records(broker, removed, tag)
            removed_total += count
    summary = offsets.agg(F.count(F.lit(1)).alias("n"), F.max("max_compaction_delay_ms").alias("delay"),
                          F.max("cleanable_ratio").alias("ratio")).first()
    partitions_cleaned = new_state.count()
    replicas_cleaned = cleaned.count()
    uncleanable = 0
    if unreadable:
        uncleanable = (storage.replica_state().join(names, on="topic")
                       .filter(F.col("broker").isin(*sorted(unreadable))).count())
    before_commit()
    if partitions_cleaned:
        storage.upsert(new_state.select(*CLEANER_SCHEMA.fieldNames()), "cleaner", PARTITION_KEY)
    report = CleanerReport(run_id, now_ms, summary["n"], partitions_cleaned, replicas_cleaned, removed_total,
                           int((time.monotonic() - started) * 1000), summary["delay"] or 0,
                           int(100 * (summary["ratio"] or 0.0)), uncleanable)
    storage.append_table(spark.createDataFrame([tuple(report.__dict__.values())], CLEANER_RUNS_SCHEMA),
                         "cleaner_runs")
    return report
