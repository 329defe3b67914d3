"""Produce acknowledgements: when a pending request is answered, and with what."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode

__all__ = ["STATUS_PENDING", "STATUS_ACKED", "STATUS_ERROR", "fail_on_leader_change"]

STATUS_PENDING = "pending"
STATUS_ACKED = "acked"
STATUS_ERROR = "error"


def fail_on_leader_change(pending_df: DataFrame, new_leaders_df: DataFrame) -> DataFrame:
    """Pending acks=-1 requests on a partition whose leader changed: Kafka's DelayedProduce
    completes them with NOT_LEADER_OR_FOLLOWER, since the records they wait for may not be on the
    new leader (a producer retries; an idempotent one without duplicates). Records of theirs that the
    new leader does hold stay at their offsets and become committed with the rest.
    pending_df: result rows with status pending; new_leaders_df: topic, partition."""
    return (pending_df.join(new_leaders_df.select("topic", "partition"), on=["topic", "partition"], how="left_semi")
            .withColumn("status", F.lit(STATUS_ERROR))
            .withColumn("error_code", F.lit(ErrorCode.NOT_LEADER_OR_FOLLOWER)))
