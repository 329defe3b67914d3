"""Consumer groups' committed offsets (Kafka's OffsetCommit / OffsetFetch and the consumer's
auto.offset.reset), as rules over DataFrames; the I/O sits in consume.py and reads.py."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.schemas import PARTITION_KEY

__all__ = ["AUTO_OFFSET_RESET", "OFFSET_METADATA_MAX_BYTES", "group_start_offsets", "partitions_without_offset"]

# the consumer's auto.offset.reset (default latest) and the broker's offset.metadata.max.bytes
AUTO_OFFSET_RESET = ("latest", "earliest", "none")
OFFSET_METADATA_MAX_BYTES = 4096


def _has_valid_offset() -> Column:
    """A committed offset the group can continue from: present and not below the log start
    (records deleted since) nor above the log end (Kafka: out of range, so reset)."""
    return (F.col("committed_offset").isNotNull() & (F.col("committed_offset") >= F.col("log_start_offset"))
            & (F.col("committed_offset") <= F.col("log_end_offset")))


def group_start_offsets(state_df: DataFrame, committed_df: DataFrame, reset: str) -> DataFrame:
    """Where a group's read starts in each partition: its committed offset when that is in range,
    else by `reset`: `earliest` the log start offset, `latest` the high watermark (the end a
    consumer sees). `none` leaves no start (see partitions_without_offset).

    state_df: the serving replica per partition (topic, partition, log_start_offset,
    high_watermark, log_end_offset); committed_df: (topic, partition, committed_offset).
    Returns topic, partition, start_offset, reset (null when the committed offset was used).
    """
    reset_to = {"earliest": F.col("log_start_offset"), "latest": F.col("high_watermark")}.get(reset, F.lit(None))
    return (
        state_df.join(committed_df.select(*PARTITION_KEY, "committed_offset"), on=PARTITION_KEY, how="left")
        .select(*PARTITION_KEY,
                F.when(_has_valid_offset(), F.col("committed_offset")).otherwise(reset_to).cast("long")
                .alias("start_offset"),
                F.when(_has_valid_offset(), F.lit(None)).otherwise(F.lit(reset)).cast("string").alias("reset"))
    )


def partitions_without_offset(state_df: DataFrame, committed_df: DataFrame) -> DataFrame:
    """Partitions where a group has no usable committed offset (none, or out of range): with
    auto.offset.reset=none, the consumer's NoOffsetForPartition / OffsetOutOfRange errors."""
    return (
        state_df.join(committed_df.select(*PARTITION_KEY, "committed_offset"), on=PARTITION_KEY, how="left")
        .filter(~_has_valid_offset()).select(*PARTITION_KEY, "committed_offset")
    )
