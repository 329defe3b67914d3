"""In-sync replica rules: Kafka's Replica.isCaughtUp, the out-of-sync replicas Partition.maybeShrinkIsr
removes, and the followers Partition.maybeExpandIsr adds."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.schemas import PARTITION_KEY

__all__ = ["is_caught_up", "out_of_sync_followers", "maybe_expand_isr", "isr_in_replica_order"]


def is_caught_up(follower_leo: Column, leader_leo: Column, last_caught_up_time_ms: Column,
                 now_ms: Column, lag_time_max_ms: Column) -> Column:
    """Kafka's isCaughtUp: at the leader's LEO, or caught up within the last `lag_time_max_ms`."""
    return (follower_leo == leader_leo) | ((now_ms - last_caught_up_time_ms) <= lag_time_max_ms)


def out_of_sync_followers(replicas_df: DataFrame, now_ms: int) -> DataFrame:
    """ISR followers that are not caught up (Kafka's getOutOfSyncReplicas): broker, topic, partition.

    replicas_df: replica rows with is_leader, isr, fetch_offset, leader_leo, last_caught_up_time_ms,
    lag_time_max_ms.
    """
    caught_up = is_caught_up(F.col("fetch_offset"), F.col("leader_leo"), F.col("last_caught_up_time_ms"),
                             F.lit(now_ms), F.col("lag_time_max_ms"))
    return replicas_df.filter(
        ~F.col("is_leader") & F.array_contains(F.col("isr"), F.col("broker")) & ~caught_up
    ).select("broker", *PARTITION_KEY)


def isr_in_replica_order(replicas: Column, members: Column) -> Column:
    """The ISR listed in replica order (as `kafka-topics --describe` shows it)."""
    return F.filter(replicas, lambda r: F.array_contains(members, r))


def maybe_expand_isr(replicas_df: DataFrame) -> DataFrame:
    """Followers that may join the ISR: fetch offset >= the leader's HW and >= the start offset of the
    leader's current epoch (KAFKA-7128). Returns broker, topic, partition.

    replicas_df: replica rows with is_leader, isr, fetch_offset, high_watermark (the leader's),
    leader_epoch_start_offset.
    """
    joins = (
        ~F.col("is_leader")
        & ~F.array_contains(F.col("isr"), F.col("broker"))
        & (F.col("fetch_offset") >= F.col("leader_hw"))
    )
    return replicas_df.filter(joins & (F.col("fetch_offset") >= F.col("leader_epoch_start_offset"))).select(
        "broker", *PARTITION_KEY
    )
