"""A lagging follower's fetch (DESIGN.md, "Round v2", 4): a follower behind its leader's LEO before
the round reads a range of the leader's log, from its LEO, within `replica.fetch.max.bytes` (the
first record always goes, KIP-74), and its replica's offsets move by what it read. Only such
followers read a leader's log back; the range's partition and offsets let Delta skip the rest."""

from __future__ import annotations

from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.replication import record_size
from pipeline.schemas import LOG_SCHEMA, PARTITION_KEY

__all__ = ["lagging_ranges", "read_lagging_ranges", "with_ranges_read"]


def lagging_ranges(control_df: DataFrame) -> DataFrame:
    """The control job's fetches that read the leader's log: topic, partition, leader, broker (the
    follower), from_offset, to_offset."""
    return (control_df.select(*PARTITION_KEY, "leader", F.explode("fetches").alias("f"))
            .filter(~F.col("f.from_batch"))
            .select(*PARTITION_KEY, "leader", F.col("f.broker").alias("broker"), "f.from_offset", "f.to_offset"))


def read_lagging_ranges(ranges_df: DataFrame, leaders: list[int], read_log: Callable[[int], DataFrame],
                        partition_max_bytes: int) -> DataFrame:
    """The records each lagging follower takes: its leader's log rows in [from_offset, to_offset), the
    longest prefix within `partition_max_bytes` and at least the first. Log rows with `broker` the
    follower."""
    def from_leader(leader: int) -> DataFrame:
        wanted = ranges_df.filter(F.col("leader") == leader).drop("leader")
        return (read_log(leader).join(wanted, on=PARTITION_KEY, how="inner")
                .filter((F.col("offset") >= F.col("from_offset")) & (F.col("offset") < F.col("to_offset"))))
    candidates = reduce(DataFrame.unionByName, [from_leader(leader) for leader in leaders])
    in_range = Window.partitionBy("broker", *PARTITION_KEY).orderBy("offset")
    taken = (F.sum(record_size(F.col("key"), F.col("value"))).over(in_range) <= partition_max_bytes) \
        | (F.row_number().over(in_range) == 1)
    return candidates.withColumn("_taken", taken).filter(F.col("_taken")).select(*LOG_SCHEMA.fieldNames(), "broker")


def with_ranges_read(control_df: DataFrame, read_df: DataFrame, round_id: int) -> DataFrame:
    """The control job's partition rows after the lagging followers appended what they read: each
    one's LEO one past its last record, its HW min(the leader's HW, that LEO), its last data round
    this one; the records counted as replicated."""
    moved = (read_df.groupBy(*PARTITION_KEY, "broker").agg(F.max("offset").alias("last"), F.count(F.lit(1)).alias("n"))
             .groupBy(*PARTITION_KEY).agg(F.map_from_entries(F.collect_list(F.struct("broker", F.col("last") + 1)))
                                          .alias("_leo"), F.sum("n").alias("_read")))

    def moved_to(column: str, value):
        return F.transform(column, lambda current, i: F.coalesce(
            value(F.element_at(F.col("_leo"), F.element_at(F.col("replicas"), i + 1))), current))

    return (control_df.join(moved, on=PARTITION_KEY, how="left")
            .withColumns({
                "log_end_offset": moved_to("log_end_offset", lambda leo: leo),
                "replica_high_watermark": moved_to("replica_high_watermark",
                                                   lambda leo: F.least(leo, F.col("high_watermark"))),
                "last_data_round": moved_to("last_data_round",
                                            lambda leo: F.when(leo.isNotNull(), F.lit(round_id).cast("long"))),
                "records_replicated": F.col("records_replicated") + F.coalesce(F.col("_read"), F.lit(0)),
                "is_changed": F.col("is_changed") | F.col("_read").isNotNull()})
            .drop("_leo", "_read"))
