"""The log start offset (Kafka's UnifiedLog.logStartOffset): delete_records and time or size
retention move a leader's, never back and never past its high watermark; a follower takes its
leader's from each fetch response (ReplicaFetcherThread.processPartitionData); the offsets
time and size retention allow (retention_log_start_offsets, over the leaders' logs)."""

from __future__ import annotations

import numpy as np
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.control.replication import record_size
from pipeline.schemas import PARTITION_KEY

__all__ = ["maybe_increment_log_start_offset", "follower_log_start_offset", "retention_log_start_offsets"]

UNLIMITED = -1


def maybe_increment_log_start_offset(current: np.ndarray, high_watermark: np.ndarray,
                                     requested: np.ndarray) -> np.ndarray:
    """The leader's log start offset after a request to move it to `requested` (negative: none):
    it only moves forward, and no further than the high watermark."""
    return np.maximum(current, np.minimum(high_watermark, np.where(requested >= 0, requested, current)))


def follower_log_start_offset(own: np.ndarray, leader: np.ndarray) -> np.ndarray:
    """A follower's log start offset after a fetch response carrying its leader's `leader`."""
    return np.maximum(own, leader)


def retention_log_start_offsets(leader_log_df: DataFrame, now_ms: int) -> DataFrame:
    """Per partition, the log start offset that `retention.ms` and `retention.bytes` allow.

    leader_log_df: the leaders' records at or above their log start offset, with `log_end_offset`
    (the leader's), `retention_ms` and `retention_bytes` (-1 = unlimited). Time: the longest prefix of
    records all older than now - retention.ms goes. Size: the oldest records go while the rest is
    larger than retention.bytes. Returns topic, partition, retention_start_offset.
    """
    cutoff = F.lit(now_ms) - F.col("retention_ms")
    newest_first = Window.partitionBy(*PARTITION_KEY).orderBy(F.col("offset").desc())
    by_time = F.when(F.col("retention_ms") != UNLIMITED,
                     F.min(F.when(F.col("timestamp") >= cutoff, F.col("offset"))))
    suffix_bytes = F.sum(record_size(F.col("key"), F.col("value"))).over(newest_first)
    by_size = F.when(F.col("retention_bytes") != UNLIMITED,
                     F.min(F.when(F.col("_suffix_bytes") <= F.col("retention_bytes"), F.col("offset"))))
    return (
        leader_log_df.withColumn("_suffix_bytes", suffix_bytes)
        .groupBy(*PARTITION_KEY, "log_end_offset", "retention_ms", "retention_bytes")
        .agg(by_time.alias("_by_time"), by_size.alias("_by_size"),
             F.max(F.when(F.col("timestamp") < cutoff, F.lit(True))).alias("_has_old"))
        .select(*PARTITION_KEY, F.greatest(
            # every record too old (no record newer than the cutoff): all of them go
            F.when((F.col("retention_ms") != UNLIMITED) & F.col("_has_old"),
                   F.coalesce(F.col("_by_time"), F.col("log_end_offset"))),
            F.when(F.col("retention_bytes") != UNLIMITED, F.coalesce(F.col("_by_size"), F.col("log_end_offset"))),
        ).alias("retention_start_offset"))
    )


