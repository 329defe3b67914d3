"""Produce acknowledgements: when a pending request is answered, and with what."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.schemas import ACKS_ALL

__all__ = ["STATUS_PENDING", "STATUS_ACKED", "STATUS_ERROR", "status_after_append", "resolve_pending_acks",
           "fail_on_leader_change"]

STATUS_PENDING = "pending"
STATUS_ACKED = "acked"
STATUS_ERROR = "error"


def status_after_append(acks_col):
    """acks=0 never waits, acks=1 is answered once the leader appended, acks=-1 waits for the HW."""
    return F.when(acks_col == ACKS_ALL, F.lit(STATUS_PENDING)).otherwise(F.lit(STATUS_ACKED))


def resolve_pending_acks(pending_df: DataFrame, partitions_df: DataFrame) -> DataFrame:
    """Pending acks=-1 requests that are now answered (Kafka's DelayedProduce).

    Acked once the HW passed the request's last offset; NOT_ENOUGH_REPLICAS_AFTER_APPEND once the
    ISR is below min.insync.replicas, since the HW then cannot pass it.
    pending_df: result rows with status pending; partitions_df: topic, partition, high_watermark,
    isr, min_isr. Returns the answered rows with their new status and error_code.
    """
    joined = pending_df.drop("status", "error_code").join(
        partitions_df.select("topic", "partition", "high_watermark", "isr", "min_isr"),
        on=["topic", "partition"], how="inner")
    reached = F.col("high_watermark") > F.col("last_offset")
    under_min_isr = F.size(F.col("isr")) < F.col("min_isr")
    return (
        joined.filter(reached | under_min_isr)
        .withColumn("status", F.when(reached & ~under_min_isr, F.lit(STATUS_ACKED)).otherwise(F.lit(STATUS_ERROR)))
        .withColumn("error_code", F.when(reached & ~under_min_isr, F.lit(None).cast("string"))
                    .otherwise(F.lit(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)))
        .drop("high_watermark", "isr", "min_isr")
    )


def fail_on_leader_change(pending_df: DataFrame, new_leaders_df: DataFrame) -> DataFrame:
    """Pending acks=-1 requests on a partition whose leader changed: Kafka's DelayedProduce
    completes them with NOT_LEADER_OR_FOLLOWER, since the records they wait for may not be on the
    new leader (a producer retries; an idempotent one without duplicates). Records of theirs that the
    new leader does hold stay at their offsets and become committed with the rest.
    pending_df: result rows with status pending; new_leaders_df: topic, partition."""
    return (pending_df.join(new_leaders_df.select("topic", "partition"), on=["topic", "partition"], how="left_semi")
            .withColumn("status", F.lit(STATUS_ERROR))
            .withColumn("error_code", F.lit(ErrorCode.NOT_LEADER_OR_FOLLOWER)))
