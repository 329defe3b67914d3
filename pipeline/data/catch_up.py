"""A lagging follower's fetch (DESIGN.md, "Round v2", 4): a follower behind its leader's LEO before
the round reads a range of the leader's log, from its LEO, within `replica.fetch.max.bytes` (the
first record always goes, KIP-74). The read happens before the control job, which takes what each
lagging follower received as its first response (`with_reads`): its follow-up fetch then proves
its new LEO in the same round. Only such followers read a leader's log back; the range's partition
and offsets let Delta skip the rest."""

from __future__ import annotations

from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.replication import record_size
from pipeline.schemas import LOG_SCHEMA, PARTITION_KEY

__all__ = ["lagging_ranges", "read_lagging_ranges", "with_reads"]


def lagging_ranges(state_df: DataFrame, fetching: tuple[int, ...], ineligible: tuple[int, ...]) -> DataFrame:
    """The fetches of the partition state's followers behind their leader's LEO: topic, partition,
    leader, broker (the follower), from_offset (its LEO), to_offset (the leader's). Only followers
    whose fetcher runs (`fetching`), of leaders that serve (not `ineligible`)."""
    replicas = (state_df.select(*PARTITION_KEY, "leader", F.explode(F.arrays_zip("replicas", "log_end_offset")).alias("r"))
                .select(*PARTITION_KEY, "leader", F.col("r.replicas").alias("broker"),
                        F.col("r.log_end_offset").alias("from_offset")))
    leaders = replicas.filter(F.col("broker") == F.col("leader")).select(*PARTITION_KEY,
                                                                        F.col("from_offset").alias("to_offset"))
    return (replicas.filter((F.col("broker") != F.col("leader")) & F.col("broker").isin(*fetching)
                            & ~F.col("leader").isin(*ineligible, -1))
            .join(leaders, on=PARTITION_KEY, how="inner")
            .filter(F.col("from_offset") < F.col("to_offset")))


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


def with_reads(state_df: DataFrame, read_df: DataFrame) -> DataFrame:
    """The partition state with what each lagging follower read (`read_df`: log rows with `broker`
    the follower), as arrays in replica order: `read_to` (one past the last offset read; 0: none)
    and `read_records` (records read), the first response the control job gives it."""
    read = (read_df.groupBy(*PARTITION_KEY, "broker").agg((F.max("offset") + 1).alias("to"),
                                                          F.count(F.lit(1)).alias("n"))
            .groupBy(*PARTITION_KEY).agg(F.map_from_entries(F.collect_list(F.struct("broker", "to"))).alias("_to"),
                                         F.map_from_entries(F.collect_list(F.struct("broker", "n"))).alias("_n")))

    def by_replica(gathered: str):
        return F.transform("replicas", lambda broker: F.coalesce(F.element_at(F.col(gathered), broker),
                                                                 F.lit(0).cast("long")))
    return (state_df.join(read, on=PARTITION_KEY, how="left")
            .withColumns({"read_to": by_replica("_to"), "read_records": by_replica("_n")})
            .drop("_to", "_n"))
