"""The produce checks and record sizes the round summarises its inbox with, and the reset of a
replica's fetch state at an election, as DataFrame rules (no I/O). The rules the round runs per
partition (fetches, the ISR, the HW, acks) are in pipeline/control/, vectorised over numpy."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.schemas import ACKS_ALL, NO_LEADER, PARTITION_KEY

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "record_size",
    "validate_produce_requests",
    "reset_replica_state",
]

# Framing bytes counted per record besides key and value (Kafka's v2 record header is up to ~21).
RECORD_OVERHEAD_BYTES = 21


def record_size(key: Column, value: Column) -> Column:
    """Bytes a record counts for in fetch limits and message.max.bytes."""
    return F.coalesce(F.octet_length(key), F.lit(0)) + F.coalesce(F.octet_length(value), F.lit(0)) + RECORD_OVERHEAD_BYTES


def _is_under_min_isr(isr: Column, min_isr: Column) -> Column:
    return F.size(isr) < min_isr


def producer_fields_agree() -> Column:
    """An idempotent record has a producer id, epoch and sequence >= 0 (Kafka's LogValidator refuses
    a client batch with a producer id and a negative sequence); any other has none of the three (a
    Kafka batch has no epoch or sequence without a producer id)."""
    pid, epoch, sequence = F.col("producer_id"), F.col("producer_epoch"), F.col("sequence")
    return F.when(pid.isNull(), epoch.isNull() & sequence.isNull()).otherwise(
        (pid >= 0) & F.coalesce(epoch >= 0, F.lit(False)) & F.coalesce(sequence >= 0, F.lit(False)))


def validate_produce_requests(inbox_df: DataFrame, partitions_df: DataFrame) -> DataFrame:
    """Adds `error_code` per inbox row: the leader's checks on a produce request, per partition.

    partitions_df: topic, partition, leader, leader_epoch, isr, min_isr (the effective one:
    control/partition_health.py), message_max_bytes, compact (cleanup.policy has compact); one row
    per partition.
    An error on any record of a (request, partition) fails that whole part of the request, as a
    Kafka batch fails whole. Where its records fail different checks, the first check in the order
    below names the error (Kafka checks a batch's size before its records' keys and producer fields).
    """
    joined = inbox_df.join(partitions_df, on=PARTITION_KEY, how="left")
    checks = [
        (F.col("leader").isNull(), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (F.col("leader") == NO_LEADER, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        ((F.col("acks") == ACKS_ALL) & _is_under_min_isr(F.col("isr"), F.col("min_isr")), ErrorCode.NOT_ENOUGH_REPLICAS),
        (record_size(F.col("key"), F.col("value")) > F.col("message_max_bytes"), ErrorCode.MESSAGE_TOO_LARGE),
        # Kafka's LogValidator: a compacted topic cannot accept a record without a key
        (F.col("compact") & F.col("key").isNull(), ErrorCode.INVALID_RECORD),
        (~producer_fields_agree(), ErrorCode.INVALID_RECORD),
    ]
    first_failed = F.lit(None).cast("int")
    for rank, (failed, _) in reversed(list(enumerate(checks))):
        first_failed = F.when(failed, F.lit(rank)).otherwise(first_failed)
    # the (few) failing parts of requests, aggregated on their keys alone: the records stay where they are
    part = ["request_id", *PARTITION_KEY]
    failed = (joined.select(*part, first_failed.alias("_check")).filter(F.col("_check").isNotNull())
              .groupBy(*part).agg(F.min("_check").alias("_check")))
    code = F.element_at(F.array(*[F.lit(c) for _, c in checks]), F.col("_check") + 1)
    failed = failed.select(*[F.col(c).alias(f"_f_{c}") for c in part], code.alias("error_code"))
    # (null-safe: a record of an unknown topic may have no partition)
    same_part = [F.col(c).eqNullSafe(F.col(f"_f_{c}")) for c in part]
    return joined.join(failed, on=reduce(Column.__and__, same_part), how="left") \
        .select(*joined.columns, "error_code")


def reset_replica_state(followers_df: DataFrame, now_ms: int, leader_leo: Column) -> DataFrame:
    """The core of Kafka's Replica.resetReplicaState: an ISR member (`isr` holds `broker`) caught
    up and last fetched at `now_ms`, any other replica never (0); the last fetch at `leader_leo`."""
    in_sync = F.array_contains(F.col("isr"), F.col("broker"))
    since = F.when(in_sync, F.lit(now_ms)).otherwise(F.lit(0)).cast("long")
    return (
        followers_df.withColumn("last_caught_up_time_ms", since)
        .withColumn("last_fetch_time_ms", since)
        .withColumn("last_fetch_leader_leo", leader_leo)
    )


