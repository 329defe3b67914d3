"""When a produce request is answered (Kafka's DelayedProduce): acks=0 and acks=1 once the leader
appended, acks=all once the HW passed the request's last offset, or with
NOT_ENOUGH_REPLICAS_AFTER_APPEND once the ISR fell under min.insync.replicas (request_status);
and a pending request whose partition's leader changed (fail_on_leader_change)."""

from __future__ import annotations

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.schemas import ACKS_ALL

__all__ = ["STATUS_PENDING", "STATUS_ACKED", "STATUS_ERROR", "request_status", "fail_on_leader_change"]

STATUS_PENDING = "pending"
STATUS_ACKED = "acked"
STATUS_ERROR = "error"


def request_status(error: np.ndarray, acks: np.ndarray, last_offset: np.ndarray, high_watermark: np.ndarray,
                   isr_size: np.ndarray, min_isr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Status and error code of each request after the round (per request; the partition's
    `high_watermark`, `isr_size` and `min_isr` given per request). `min_isr`: the
    effective min ISR (control/partition_health.py)."""
    refused = error != None  # noqa: E711 (element-wise)
    waits = acks == ACKS_ALL
    under_min_isr = isr_size < min_isr
    reached = high_watermark > last_offset
    status = np.where(refused | (waits & under_min_isr), STATUS_ERROR,
                      np.where(~waits | reached, STATUS_ACKED, STATUS_PENDING)).astype(object)
    code = np.where(refused, error, np.where(waits & under_min_isr & ~refused,
                                             ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, None)).astype(object)
    return status, code


def fail_on_leader_change(pending_df: DataFrame, new_leaders_df: DataFrame) -> DataFrame:
    """Pending acks=-1 requests on a partition whose leader changed: Kafka's DelayedProduce
    completes them with NOT_LEADER_OR_FOLLOWER, since the records they wait for may not be on the
    new leader (a producer retries; an idempotent one without duplicates). Records of theirs that the
    new leader does hold stay at their offsets and become committed with the rest.
    pending_df: result rows with status pending; new_leaders_df: topic, partition."""
    return (pending_df.join(new_leaders_df.select("topic", "partition"), on=["topic", "partition"], how="left_semi")
            .withColumn("status", F.lit(STATUS_ERROR))
            .withColumn("error_code", F.lit(ErrorCode.NOT_LEADER_OR_FOLLOWER)))
