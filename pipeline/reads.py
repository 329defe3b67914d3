"""Reading a topic's records from the replicas' logs (Cluster.read): which replica serves each
partition, from which offset (the log start, an offset, or a consumer group's committed one with
Kafka's auto.offset.reset) up to which bound (the HW for read_committed, the LEO otherwise)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.control import groups
from pipeline.consume.fetch import check_group, committed_offsets
from pipeline.errors import ErrorCode, ReplogError
from pipeline.storage import views

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["read", "ISOLATION"]

ISOLATION = ("read_committed", "read_uncommitted")


def read(core: "ClusterCore", topic: str, partition: int | None = None, from_offset: int | None = None,
         replica: int | None = None, isolation: str = "read_committed", group: str | None = None,
         auto_offset_reset: str = "latest", leader_epoch: int | None = None) -> DataFrame:
    """The records of `topic` (Cluster.read): checked, then each partition's serving replica from
    its start offset up to its bound."""
    _check_read(core, topic, partition, from_offset, replica, isolation, group, auto_offset_reset, leader_epoch)
    state = core.storage.replica_state().filter(F.col("topic") == topic)
    if replica is None:
        leaders = core.storage.read("partitions").filter(F.col("topic") == topic).select(
            "topic", "partition", F.col("leader").alias("broker"))
        state = state.join(leaders, on=["topic", "partition", "broker"], how="inner")
    else:
        state = state.filter(F.col("broker") == replica)
    if partition is not None:
        state = state.filter(F.col("partition") == partition)
    if from_offset is not None:
        below = state.filter(F.col("log_start_offset") > from_offset).select(
            "partition", "log_start_offset").limit(1).collect()
        if below:
            raise ReplogError(ErrorCode.OFFSET_OUT_OF_RANGE,
                              f"offset {from_offset} is below the log start offset {below[0]['log_start_offset']} "
                              f"of partition {below[0]['partition']} of '{topic}'")
    upper = "high_watermark" if isolation == "read_committed" else "log_end_offset"
    state = state.select("topic", "partition", "broker", "log_start_offset", "high_watermark", "log_end_offset")
    start: Column = F.greatest(F.lit(from_offset or 0), F.col("log_start_offset"))
    if group is not None:
        state = _group_starts(core, state, topic, group, auto_offset_reset)
        start = F.col("start_offset")
    # a replica's read needs only its log; a stopped broker's lost log directory serves nothing
    hosts = [replica] if replica is not None else [
        b for b in core.brokers if core.storage.path_exists(f"{core.storage.log_path(b)}/_delta_log")]
    logs = core.spark.sql(views.logs_sql(core.storage, hosts)).filter(F.col("topic") == topic)
    return (
        logs.join(state, on=["topic", "partition", "broker"], how="inner")
        .filter((F.col("offset") >= start) & (F.col("offset") < F.col(upper)))
        .select("topic", "partition", "offset", "leader_epoch", "timestamp", "key", "value")
    )


def _check_read(core: "ClusterCore", topic: str, partition: int | None, from_offset: int | None, replica: int | None,
                isolation: str, group: str | None, auto_offset_reset: str, leader_epoch: int | None) -> None:
    """Every argument of a read, before any Spark job."""
    if isolation not in ISOLATION:
        raise ValueError(f"isolation must be one of {ISOLATION}, got {isolation!r}")
    if group is not None:
        check_group(group)
        if from_offset is not None:
            raise ValueError("give either group (start at its committed offsets) or from_offset, not both")
        if auto_offset_reset not in groups.AUTO_OFFSET_RESET:
            raise ValueError(f"auto_offset_reset must be one of {groups.AUTO_OFFSET_RESET}, got {auto_offset_reset!r}")
    if core.metadata.topic(topic) is None:
        raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
    if partition is not None:
        core.metadata.partition_count(topic, partition)
    if leader_epoch is not None:
        if partition is None:
            raise ValueError("leader_epoch needs a partition: epochs are per partition")
        current = core.storage.read("partitions").filter(
            (F.col("topic") == topic) & (F.col("partition") == partition)).first()["leader_epoch"]
        if leader_epoch != current:
            code = ErrorCode.FENCED_LEADER_EPOCH if leader_epoch < current else ErrorCode.UNKNOWN_LEADER_EPOCH
            raise ReplogError(code, f"leader epoch {leader_epoch} of {topic}-{partition} is not the current "
                                    f"one ({current}): refresh the metadata")
    if replica is not None and replica not in core.brokers:
        raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {replica!r}")
    if from_offset is not None and (isinstance(from_offset, bool) or not isinstance(from_offset, int)
                                    or from_offset < 0):
        raise ReplogError(ErrorCode.OFFSET_OUT_OF_RANGE, f"from_offset must be an int >= 0, got {from_offset!r}")


def _group_starts(core: "ClusterCore", state: DataFrame, topic: str, group: str, auto_offset_reset: str) -> DataFrame:
    """`state` with each partition's start_offset from the group's committed offsets, where the
    group has none (or one out of range) by auto_offset_reset; NO_OFFSET_FOR_PARTITION for 'none'."""
    committed = committed_offsets(core, group).filter(F.col("topic") == topic)
    if auto_offset_reset == "none":
        missing = groups.partitions_without_offset(state, committed).limit(1).collect()
        if missing:
            raise ReplogError(ErrorCode.NO_OFFSET_FOR_PARTITION,
                              f"group '{group}' has no offset in range for partition {missing[0]['partition']} "
                              f"of '{topic}' (committed: {missing[0]['committed_offset']}) and "
                              "auto_offset_reset is 'none'")
    starts = groups.group_start_offsets(state, committed, auto_offset_reset)
    return state.join(starts.select("topic", "partition", "start_offset"), on=["topic", "partition"])
