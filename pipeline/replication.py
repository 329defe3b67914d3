"""Kafka's replication rules as pure DataFrame transformations (no I/O).

The frames are keyed by (topic, partition) and, for replica rows, broker. A reader who knows
Kafka finds each rule by its name: leader append (offset assignment), the follower fetch state the
leader keeps (Replica.updateFetchState), the leader high watermark (Partition.maybeIncrementLeaderHW),
the fetch response, and the follower's append and high watermark.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.errors import ErrorCode
from pipeline.isr import is_caught_up
from pipeline.schemas import ACKS_ALL, NO_LEADER, PARTITION_KEY
from pipeline.spark import small_side

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "record_size",
    "validate_produce_requests",
    "assign_offsets",
    "with_effective_fetch_state",
    "reset_follower_state_on_restart",
    "reset_replica_state",
    "update_follower_fetch_state",
    "maybe_increment_leader_hw",
    "fetch_response_records",
    "follower_log_end",
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

    partitions_df: topic, partition, leader, leader_epoch, isr, min_isr, message_max_bytes, compact
    (cleanup.policy has compact); one row per partition (broadcast in a bulk round: spark.small_side).
    An error on any record of a (request, partition) fails that whole part of the request, as a
    Kafka batch fails whole. Where its records fail different checks, the first check in the order
    below names the error (Kafka checks a batch's size before its records' keys and producer fields).
    """
    joined = inbox_df.join(small_side(partitions_df), on=PARTITION_KEY, how="left")
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
    return joined.join(small_side(failed), on=reduce(Column.__and__, same_part), how="left") \
        .select(*joined.columns, "error_code")


def assign_offsets(valid_df: DataFrame, leader_df: DataFrame) -> DataFrame:
    """Leader append: offsets per partition from the leader's LEO, in produce order.

    valid_df: accepted inbox rows with `_commit_version`; leader_df: topic, partition, leader,
    leader_epoch, leader_leo. Returns log rows plus `leader`, `request_id`, `acks`.
    """
    order = Window.partitionBy(*PARTITION_KEY).orderBy("_commit_version", "request_id", "record_index")
    return (
        valid_df.join(small_side(leader_df.select(*PARTITION_KEY, "leader", "leader_epoch", "leader_leo")),
                      on=PARTITION_KEY, how="inner")
        .withColumn("offset", F.col("leader_leo") + F.row_number().over(order) - 1)
        .select(*PARTITION_KEY, "offset", F.col("leader_epoch").cast("int"), "timestamp", "key", "value",
                "producer_id", "producer_epoch", "sequence", F.col("leader").alias("broker"),
                "request_id", "acks")
    )


def with_effective_fetch_state(followers_df: DataFrame) -> DataFrame:
    """The fetch state of a follower whose row was not rewritten since its broker last fetched.

    A partition whose leader LEO and follower LEO did not change is not rewritten each round;
    its follower kept fetching (unless paused) at the leader's unchanged LEO, so Kafka's rule gives
    last_fetch_time = last_caught_up = the broker's last fetch (`broker_last_fetch_ms`).
    """
    quiescent = (F.col("fetch_offset") >= F.col("leader_leo_before")) & F.col("broker_last_fetch_ms").isNotNull()
    later = F.greatest(F.col("last_fetch_time_ms"), F.col("broker_last_fetch_ms"))
    return (
        followers_df
        .withColumn("last_fetch_time_ms", F.when(quiescent, later).otherwise(F.col("last_fetch_time_ms")))
        .withColumn("last_caught_up_time_ms",
                    F.when(quiescent, F.greatest(F.col("last_caught_up_time_ms"), later))
                    .otherwise(F.col("last_caught_up_time_ms")))
        .withColumn("last_fetch_leader_leo",
                    F.when(quiescent, F.col("leader_leo_before")).otherwise(F.col("last_fetch_leader_leo")))
    )


def reset_follower_state_on_restart(followers_df: DataFrame, now_ms: int) -> DataFrame:
    """Kafka's Replica.resetReplicaState for a leader that takes leadership again (isNewLeader =
    false), applied when a process starts replicating a cluster: no round ran while it was down, so
    no follower could fetch, and that time must not count against them.

    An ISR follower is caught up and last fetched at `now_ms`; one outside the ISR has both times
    0 (it returns by its LEO reaching the HW, never by time). Both keep their LEO and log start
    offset and remember the leader's LEO (`leader_leo_before`) as of their last fetch.
    followers_df: follower rows with broker, isr, leader_leo_before and the fetch-state columns.
    """
    return reset_replica_state(followers_df, now_ms, F.col("leader_leo_before"))


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


def update_follower_fetch_state(fetch_df: DataFrame, now_ms: int) -> DataFrame:
    """Kafka's Replica.updateFetchState: the leader's view of a follower after a fetch at `now_ms`.

    fetch_df: follower rows with `fetch_offset` (the offset requested, i.e. the follower's LEO),
    `leader_leo` (the leader's LEO when the fetch arrives), and the previous last_fetch_time_ms,
    last_fetch_leader_leo, last_caught_up_time_ms.
    """
    now = F.lit(now_ms).cast("long")
    caught_up_to_now = F.col("fetch_offset") >= F.col("leader_leo")
    caught_up_to_last_fetch = F.col("fetch_offset") >= F.col("last_fetch_leader_leo")
    last_caught_up = (
        F.when(caught_up_to_now, F.greatest(F.col("last_caught_up_time_ms"), now))
        .when(caught_up_to_last_fetch, F.greatest(F.col("last_caught_up_time_ms"), F.col("last_fetch_time_ms")))
        .otherwise(F.col("last_caught_up_time_ms"))
    )
    # (one projection: each new value is computed from the values before the fetch)
    return fetch_df.withColumns({"last_caught_up_time_ms": last_caught_up,
                                 "last_fetch_leader_leo": F.col("leader_leo"), "last_fetch_time_ms": now})


def maybe_increment_leader_hw(replicas_df: DataFrame, now_ms: int, ineligible_brokers: list[int] | tuple = ()) -> DataFrame:
    """Kafka's Partition.maybeIncrementLeaderHW, per partition.

    replicas_df: one row per replica with is_leader, leader_leo, fetch_offset (followers: the LEO the
    leader last saw), isr, replicas, min_isr, lag_time_max_ms, last_caught_up_time_ms and the
    partition's `high_watermark` before. The new HW is the minimum LEO over the leader, the ISR and
    caught-up replicas that may join it; it never moves back, and it does not move while the ISR is
    smaller than min(min.insync.replicas, replication factor). A replica on a broker that may not
    join the ISR (`ineligible_brokers`: stopped or fenced, Kafka's isReplicaIsrEligible) is not
    waited for unless it is in the ISR.
    Returns topic, partition, high_watermark, hw_changed.
    """
    replica_leo = F.when(F.col("is_leader"), F.col("leader_leo")).otherwise(F.col("fetch_offset"))
    counts = (
        F.col("is_leader")
        | F.array_contains(F.col("isr"), F.col("broker"))
        | (is_caught_up(F.col("fetch_offset"), F.col("leader_leo"), F.col("last_caught_up_time_ms"),
                        F.lit(now_ms), F.col("lag_time_max_ms"))
           & ~F.col("broker").isin(*[int(b) for b in ineligible_brokers]))
    )
    per_partition = replicas_df.groupBy(*PARTITION_KEY).agg(
        F.min(F.when(counts, replica_leo)).alias("candidate"),
        F.max(F.when(F.col("is_leader"), F.col("high_watermark"))).alias("old_hw"),
        F.first("isr").alias("isr"),
        F.first("replicas").alias("replicas"),
        F.first("min_isr").alias("min_isr"),
    )
    frozen = F.size(F.col("isr")) < F.least(F.col("min_isr"), F.size(F.col("replicas")))
    new_hw = F.when(frozen, F.col("old_hw")).otherwise(F.greatest(F.col("old_hw"), F.col("candidate")))
    return per_partition.select(
        *PARTITION_KEY,
        new_hw.alias("high_watermark"),
        (new_hw != F.col("old_hw")).alias("hw_changed"),
    )


def fetch_response_records(fetch_df: DataFrame, leader_records_df: DataFrame) -> DataFrame:
    """Records a leader returns to one fetch request (a follower broker and a leader broker),
    Kafka's ReplicaManager.readFromLog: partitions in the request's order (`fetch_order`, then
    topic and partition: a follower moves partitions that returned records to the back, so none
    starves); each from its fetch offset, at most `partition_max_bytes`, while the response stays
    within `response_max_bytes`. The first record of the first partition with records always goes
    (KIP-74), so a record larger than the limits still moves. The partition that does not fit whole
    gets the records that fit, and the response ends there (Kafka also reads later partitions into
    the bytes left, which differs only when a later partition's first record is smaller than them).

    Replication quotas (KIP-73), when fetch_df has the columns: a partition flagged
    `leader_throttled` draws on its leader broker's `leader_budget` (bytes, shared by every request
    that leader answers this round), one flagged `follower_throttled` on its follower broker's
    `follower_budget` (null: unlimited). A throttled partition's records go only while the bytes of
    the throttled partitions before it (in the leader's, or the follower's, order of requests) and
    its own stay within the budget, with no first-record exception: over the quota, Kafka leaves
    throttled partitions out of the response. The flags and the leader then stay in the output.

    fetch_df: broker (the follower), leader, topic, partition, fetch_offset, partition_max_bytes,
    response_max_bytes, fetch_order; leader_records_df: log rows of the leaders. Returns log rows
    with broker = the follower.
    """
    throttled = "leader_throttled" in fetch_df.columns
    quota = ["leader_throttled", "follower_throttled", "leader_budget", "follower_budget"] if throttled else []
    in_partition = Window.partitionBy("broker", *PARTITION_KEY).orderBy("offset")
    in_request = Window.partitionBy("broker", "leader").orderBy("fetch_order", *PARTITION_KEY)
    earlier = in_request.rowsBetween(Window.unboundedPreceding, -1)
    # the limits are decided on each record's offset and size alone; the records themselves (keys
    # and values) are joined once, to the offsets chosen, so no sort or shuffle carries them
    candidates = (
        leader_records_df.select(*PARTITION_KEY, "offset", record_size(F.col("key"), F.col("value")).alias("_size"))
        .join(small_side(fetch_df.select("broker", "leader", *PARTITION_KEY, "fetch_offset", "partition_max_bytes",
                                          "response_max_bytes", "fetch_order", *quota)), on=PARTITION_KEY, how="inner")
        .filter(F.col("offset") >= F.col("fetch_offset"))
        .withColumns({"_bytes": F.sum("_size").over(in_partition),
                      "_first": F.row_number().over(in_partition) == 1})
    )
    within_partition = F.col("_bytes") <= F.col("partition_max_bytes")
    partitions = (
        candidates.groupBy("broker", "leader", *PARTITION_KEY, "fetch_order", *quota[:2])
        .agg(F.sum(F.when(within_partition, F.col("_size")).otherwise(0)).alias("_fits"),
             F.max(F.when(F.col("_first"), F.col("_size"))).alias("_first_size"))
        .withColumn("_rank", F.row_number().over(in_request))
        # the first partition's first record goes even when it is over the limits
        .withColumn("_taken", F.when(F.col("_rank") == 1, F.greatest("_fits", "_first_size"))
                    .otherwise(F.col("_fits")))
        .withColumn("_before", F.coalesce(F.sum("_taken").over(earlier), F.lit(0)))
    )
    if throttled:  # the throttled bytes before each partition, per leader and per follower broker
        for side, by, then in (("leader", "leader", "broker"), ("follower", "broker", "leader")):
            order = Window.partitionBy(by).orderBy(then, "fetch_order", *PARTITION_KEY) \
                .rowsBetween(Window.unboundedPreceding, -1)
            partitions = partitions.withColumn(f"_{side}_before", F.coalesce(F.sum(
                F.when(F.col(f"{side}_throttled"), F.col("_fits"))).over(order), F.lit(0)))
    partitions = partitions.drop("fetch_order", "_first_size", "_taken", *quota[:2])
    first_of_response = (F.col("_rank") == 1) & F.col("_first")
    fits = within_partition & (F.col("_before") + F.col("_bytes") <= F.col("response_max_bytes"))
    if throttled:
        def within_quota(side: str):
            return ~F.col(f"{side}_throttled") | F.col(f"{side}_budget").isNull() \
                | (F.col(f"_{side}_before") + F.col("_bytes") <= F.col(f"{side}_budget"))
        exempt = ~F.col("leader_throttled") & ~F.col("follower_throttled")
        allowed = ((first_of_response & exempt) | fits) & within_quota("leader") & within_quota("follower")
    else:
        allowed = first_of_response | fits
    kept = ["leader", "leader_throttled", "follower_throttled"] if throttled else []
    # every condition above holds for a prefix of a partition's records (the sums only grow), so
    # what a follower gets of a partition is its records from the fetch offset to the last allowed
    chosen = (
        candidates.join(small_side(partitions), on=["broker", "leader", *PARTITION_KEY], how="inner")
        .filter(allowed)
        .groupBy("broker", *PARTITION_KEY, "fetch_offset", *kept).agg(F.max("offset").alias("_last"))
    )
    return (
        leader_records_df.drop("broker").join(F.broadcast(chosen), on=PARTITION_KEY, how="inner")
        .filter(F.col("offset").between(F.col("fetch_offset"), F.col("_last")))
        .drop("fetch_offset", "_last")
    )


def follower_log_end(fetch_df: DataFrame, response_df: DataFrame, hw_df: DataFrame) -> DataFrame:
    """The follower after appending a response: LEO = one past the last record received (the fetch
    offset when none);
    HW = min(leader HW in the response, own LEO).

    fetch_df: broker, topic, partition, fetch_offset, ...; response_df: records per follower;
    hw_df: topic, partition, high_watermark (the leader's, after this fetch).
    """
    received = response_df.groupBy("broker", *PARTITION_KEY).agg(F.count(F.lit(1)).alias("records_received"),
                                                                 F.max("offset").alias("_last_offset"))
    # past the last record received: a compacted log has gaps, so not fetch offset + count
    log_end = F.greatest(F.col("fetch_offset"), F.col("_last_offset") + 1)
    return (
        fetch_df.join(received, on=["broker", *PARTITION_KEY], how="left")
        .join(hw_df.select(*PARTITION_KEY, F.col("high_watermark").alias("_response_hw")),
              on=PARTITION_KEY, how="left")
        .withColumns({"records_received": F.coalesce(F.col("records_received"), F.lit(0)).cast("long"),
                      "log_end_offset": log_end, "high_watermark": F.least(F.col("_response_hw"), log_end)})
        .drop("_response_hw", "_last_offset")
    )
