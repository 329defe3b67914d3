"""Kafka's ListOffsets answer (KafkaApis.handleListOffsetRequest, Partition.fetchOffsetForTimestamp),
a pure function of the partitions' state and the records found for the timestamps asked.

For each partition asked, by its `timestamp`:
- LATEST (-1): the offset a consumer reads up to, the high watermark (a consumer's
  read_uncommitted stops there, and read_committed at the last stable offset, which is the HW
  without transactions), with no timestamp and the partition's leader epoch;
- EARLIEST (-2): the log start offset, with the leader epoch of the record there (the partition's
  epoch when the log holds none);
- any other: the first record below the HW whose timestamp is at or after it (offset, timestamp,
  its leader epoch), or offset and timestamp -1 when there is none.

Errors, per partition: UNKNOWN_TOPIC_OR_PARTITION for one that does not exist,
NOT_LEADER_OR_FOLLOWER for one without a leader (no broker of the door leads it), and with a
`current_leader_epoch` (v4+, KIP-320) FENCED_LEADER_EPOCH when it is older than the partition's and
UNKNOWN_LEADER_EPOCH when newer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta, i64

from pipeline.schemas import NO_LEADER
from pipeline.wire.protocol import build, nested

__all__ = ["LIST_OFFSETS", "LATEST", "EARLIEST", "timestamps_asked", "list_offsets_response"]

LIST_OFFSETS = 2
LATEST, EARLIEST = -1, -2


def timestamps_asked(body: Any) -> list[tuple[str, int, int]]:
    """(topic, partition, timestamp) of every partition a request asks about by a timestamp (not
    LATEST or EARLIEST): the records the door must look up."""
    return [(t.name, p.partition_index, p.timestamp) for t in body.topics for p in t.partitions
            if p.timestamp not in (LATEST, EARLIEST)]


def list_offsets_response(version: int, body: Any, partitions: dict, found: dict, first_epochs: dict) -> Any:
    """ListOffsetsResponse in `version` for request `body`. `partitions`: (topic, partition) ->
    a row with leader, leader_epoch, log_start_offset, high_watermark; `found`: (topic, partition,
    timestamp) -> (offset, timestamp, leader_epoch) of the first record at or after the timestamp
    below the HW (absent: none); `first_epochs`: (topic, partition) -> the leader epoch of the
    record at the log start offset (absent: the log holds none)."""
    schema = load_response_schema(LIST_OFFSETS, version)
    topic_type = nested(schema, "topics")
    partition_type = nested(topic_type, "partitions")

    def answer(topic: str, asked: Any) -> Any:
        key = (topic, asked.partition_index)
        row = partitions.get(key)
        error = _error(row, getattr(asked, "current_leader_epoch", -1))
        values: dict[str, Any] = {"partition_index": i32(asked.partition_index), "error_code": error,
                                  "timestamp": i64(-1), "offset": i64(-1), "leader_epoch": i32(-1)}
        if error == ErrorCode.none:
            if asked.timestamp == LATEST:
                values.update(offset=i64(row["high_watermark"]), leader_epoch=i32(row["leader_epoch"]))
            elif asked.timestamp == EARLIEST:
                values.update(offset=i64(row["log_start_offset"]),
                              leader_epoch=i32(first_epochs.get(key, row["leader_epoch"])))
            elif (*key, asked.timestamp) in found:
                offset, timestamp, epoch = found[(*key, asked.timestamp)]
                values.update(offset=i64(offset), timestamp=i64(timestamp), leader_epoch=i32(epoch))
        return build(partition_type, **values)

    return build(schema, throttle_time=i32Timedelta.parse(timedelta(0)),
                 topics=tuple(build(topic_type, name=t.name, partitions=tuple(answer(t.name, p) for p in t.partitions))
                              for t in body.topics))


def _error(row: dict | None, current_leader_epoch: int) -> ErrorCode:
    if row is None:
        return ErrorCode.unknown_topic_or_partition
    if row["leader"] == NO_LEADER:
        return ErrorCode.not_leader_or_follower
    if current_leader_epoch != -1 and current_leader_epoch < row["leader_epoch"]:
        return ErrorCode.fenced_leader_epoch
    if current_leader_epoch != -1 and current_leader_epoch > row["leader_epoch"]:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.none
