"""Kafka's Fetch for consumers at the front door, as pure functions: which records each partition
of a Fetch request gets, and the response.

A consumer reads committed records only: from its fetch offset up to the partition's high watermark
on the leader (Kafka bounds every consumer fetch by the HW; with no transactions here, the last
stable offset is the HW too, so read_committed and read_uncommitted read the same records). Per
partition, as Kafka's ReplicaManager.readFromLog answers:
- a partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION; one without a leader:
  NOT_LEADER_OR_FOLLOWER;
- a current leader epoch (KIP-320, v9+) older than the leader's: FENCED_LEADER_EPOCH; newer:
  UNKNOWN_LEADER_EPOCH;
- a fetch offset below the log start offset or above the log end offset: OFFSET_OUT_OF_RANGE
  (the consumer resets by its auto.offset.reset);
- otherwise the records from the fetch offset below the HW, up to partition_max_bytes (and the
  request's max_bytes over all partitions), but always the first record when there is one
  (KIP-74), with the HW, last stable offset and log start offset.

Sessions (KIP-227, pipeline/wire/fetch_sessions.py) decide which partitions a request reads and
which its response carries; the functions here take those partitions as `Wanted` values.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterable

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta, i64

from pipeline.wire.fetch_sessions import Answer, Wanted
from pipeline.wire.protocol import build, nested

__all__ = ["FETCH", "fetch_ranges", "answers", "fetch_response", "RECORD_OVERHEAD"]

FETCH = 1
# bytes a record takes in a batch beyond its key and value (length, attributes, deltas, header
# count), for partition_max_bytes
RECORD_OVERHEAD = 12


def fetch_ranges(wanted: Iterable[Wanted], partitions: dict[tuple[str, int], dict]) -> tuple[dict, dict]:
    """({(topic, partition): (from_offset, high_watermark, partition_max_bytes)} of the partitions
    with records to read, {(topic, partition): error name} of those refused). `partitions`: the
    describe() rows (leader, leader_epoch, log_start_offset, high_watermark, log_end_offset) of the
    topics asked."""
    ranges, errors = {}, {}
    for w in wanted:
        key = w.key
        row = partitions.get(key)
        asked_epoch, offset = w.leader_epoch, w.fetch_offset
        if row is None:
            errors[key] = "UNKNOWN_TOPIC_OR_PARTITION"
        elif row["leader"] is None or row["leader"] < 0:
            errors[key] = "NOT_LEADER_OR_FOLLOWER"
        elif asked_epoch >= 0 and asked_epoch < row["leader_epoch"]:
            errors[key] = "FENCED_LEADER_EPOCH"
        elif asked_epoch > row["leader_epoch"]:
            errors[key] = "UNKNOWN_LEADER_EPOCH"
        elif offset < row["log_start_offset"] or offset > row["log_end_offset"]:
            errors[key] = "OFFSET_OUT_OF_RANGE"
        elif offset < row["high_watermark"]:
            ranges[key] = (offset, row["high_watermark"], w.max_bytes)
    return ranges, errors


def answers(wanted: Iterable[Wanted], partitions: dict[tuple[str, int], dict], errors: dict,
            records: dict[tuple[str, int], bytes]) -> dict[tuple[str, int], Answer]:
    """What each partition's response holds (the values a session compares with what it sent)."""
    out = {}
    for w in wanted:
        error = errors.get(w.key)
        row = partitions.get(w.key) or {}
        out[w.key] = Answer(-1 if error else row.get("high_watermark", -1), -1 if error else row.get("log_start_offset", -1),
                            len(records.get(w.key, b"")), error)
    return out


def fetch_response(version: int, carried: Iterable[tuple[str, int]], answered: dict[tuple[str, int], Answer],
                   records: dict[tuple[str, int], bytes], session_id: int = 0, error: str | None = None) -> Any:
    """FetchResponse: the `carried` partitions in their order, each with its error, or its HW, log
    start offset and `records` (record batches, absent: none); `session_id` (v7+: 0 for none) and
    a top-level `error`, which carries no partitions (a session's error)."""
    schema = load_response_schema(FETCH, version)
    topic_entity = nested(schema, "responses")
    part_entity = nested(topic_entity, "partitions")
    topics: dict[str, list] = {}
    for key in carried:  # (consecutive partitions of a topic share its entry, as Kafka's response builder does)
        a = answered[key]
        code = ErrorCode.none if a.error is None else ErrorCode[a.error.lower()]
        entry = build(part_entity, partition_index=i32(key[1]), error_code=code, high_watermark=i64(a.high_watermark),
                      last_stable_offset=i64(a.high_watermark), log_start_offset=i64(a.log_start_offset),
                      aborted_transactions=(), preferred_read_replica=i32(-1), records=records.get(key, b""))
        if topics and list(topics)[-1][0] == key[0]:
            topics[list(topics)[-1]].append(entry)
        else:
            topics[(key[0], len(topics))] = [entry]
    responses = tuple(build(topic_entity, topic=t, partitions=tuple(parts)) for (t, _), parts in topics.items())
    return build(schema, throttle_time=i32Timedelta.parse(timedelta(0)),
                 error_code=ErrorCode.none if error is None else ErrorCode[error.lower()],
                 session_id=i32(session_id), responses=responses)
