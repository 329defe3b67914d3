"""A lagging follower's fetch (DESIGN.md, "Round v2", 4): a follower behind its leader's LEO before
the round reads a range of the leader's log, from its LEO, as far as its fetch's response and its
follow-up's can carry. The read happens before the control job, whose responses take what their
limits allow of it (`with_reads`), as they take this round's batches: the follow-up fetch then
proves the follower's new LEO in the same round. Only such followers read a leader's log back; the range's partition
and offsets let Delta skip the rest."""

from __future__ import annotations

from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.control.replication import record_size
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
    """The records each lagging follower may take this round: its leader's log rows in
    [from_offset, to_offset), as far as two responses can carry (its fetch's and its follow-up's),
    each at most `partition_max_bytes` of the partition or its first record when that is larger
    (KIP-74). The control job decides what the responses take within their limits. Log rows with
    `broker` the follower."""
    def from_leader(leader: int) -> DataFrame:
        # the ranges are the side to broadcast (a row per lagging follower), never the log: Spark
        # sizes a Delta table by its compressed files, so a log of well-compressed values can look
        # small enough to broadcast when it holds gigabytes of rows (5,000,000 repeated 100-byte
        # values in 100 partitions failed a round with "Not enough memory to build and broadcast
        # the table"), and a pinned ranges DataFrame has no size estimate, so it is never picked
        wanted = F.broadcast(ranges_df.filter(F.col("leader") == leader).drop("leader"))
        return (read_log(leader).join(wanted, on=PARTITION_KEY, how="inner")
                .filter((F.col("offset") >= F.col("from_offset")) & (F.col("offset") < F.col("to_offset"))))
    candidates = reduce(DataFrame.unionByName, [from_leader(leader) for leader in leaders])
    in_range = Window.partitionBy("broker", *PARTITION_KEY).orderBy("offset")
    size = record_size(F.col("key"), F.col("value"))
    # the first response carries at most `first` bytes; the follow-up starts at the next record and
    # carries at most partition_max_bytes more, or that record alone
    first = F.greatest(F.lit(partition_max_bytes), F.first(size).over(in_range))
    through = F.sum(size).over(in_range)
    taken = (through - size <= first) | (through <= first + partition_max_bytes)
    return candidates.withColumn("_taken", taken).filter(F.col("_taken")).select(*LOG_SCHEMA.fieldNames(), "broker")


def with_reads(state_df: DataFrame, read_df: DataFrame) -> DataFrame:
    """The partition state with what each lagging follower read (`read_df`: log rows with `broker`
    the follower), in replica order: `read_bytes` (each record's size, in offset order) and
    `read_ends` (each record's offset + 1), empty for a replica that read nothing. The control job
    gives the follower's responses what their limits let them take of it."""
    records = F.sort_array(F.collect_list(F.struct(F.col("offset"), record_size(F.col("key"), F.col("value"))
                                                   .cast("long").alias("size"))))
    read = (read_df.groupBy(*PARTITION_KEY, "broker").agg(records.alias("_r"))
            .groupBy(*PARTITION_KEY).agg(F.map_from_entries(F.collect_list(F.struct("broker", "_r"))).alias("_read")))
    none = F.array().cast("array<struct<offset:bigint,size:bigint>>")

    def by_replica(field: Callable):
        return F.transform("replicas", lambda broker: F.transform(
            F.coalesce(F.element_at(F.col("_read"), broker), none), field))
    return (state_df.join(read, on=PARTITION_KEY, how="left")
            .withColumns({"read_bytes": by_replica(lambda r: r["size"]),
                          "read_ends": by_replica(lambda r: r["offset"] + 1)})
            .drop("_read"))
