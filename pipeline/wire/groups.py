"""Kafka's consumer-group offset APIs at the front door, as pure functions: FindCoordinator,
OffsetCommit and OffsetFetch over the cluster's committed offsets (Cluster.commit_offsets and
committed_offsets; the group_offsets table).

The door serves no group membership (JoinGroup, SyncGroup, Heartbeat): consumers assign their
partitions themselves (`consumer.assign(...)`) and commit as a group without members, as Kafka's
group coordinator lets a "simple" group do (GroupCoordinator.handleCommitOffsets): a commit with
generation -1 is stored; one with a generation (a member of a managed group) gets
ILLEGAL_GENERATION, since no such group exists here.

- FindCoordinator: a group's coordinator is the lowest live broker, at the door's address; a
  transaction's (key type 1) is not available (COORDINATOR_NOT_AVAILABLE): the door serves no
  transactions.
- OffsetCommit, per partition: UNKNOWN_TOPIC_OR_PARTITION for one that does not exist,
  OFFSET_METADATA_TOO_LARGE for metadata over offset.metadata.max.bytes (4096); the others are
  stored in one commit per metadata value. An empty group id gets INVALID_GROUP_ID.
- OffsetFetch: each partition asked (every committed one when the topics are null, v2+) with its
  committed offset and metadata, or offset -1 and empty metadata when the group has none.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta, i64

from pipeline.control.groups import OFFSET_METADATA_MAX_BYTES
from pipeline.wire.protocol import build, nested

__all__ = ["FIND_COORDINATOR", "OFFSET_COMMIT", "OFFSET_FETCH", "find_coordinator_response", "offset_commit_plan",
           "offset_commit_response", "offset_fetch_response"]

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
GROUP_KEY = 0


def _throttle() -> Any:
    return i32Timedelta.parse(timedelta(0))


def find_coordinator_response(version: int, body: Any, live: list[int], host: str, port: int) -> Any:
    schema = load_response_schema(FIND_COORDINATOR, version)
    if getattr(body, "key_type", GROUP_KEY) == GROUP_KEY and live:
        return build(schema, throttle_time=_throttle(), error_code=ErrorCode.none, error_message=None,
                     node_id=i32(min(live)), host=host, port=i32(port))
    return build(schema, throttle_time=_throttle(), error_code=ErrorCode.coordinator_not_available,
                 error_message="the front door serves no transactions" if live else "no live broker",
                 node_id=i32(-1), host="", port=i32(-1))


def offset_commit_plan(body: Any, known: set) -> tuple[dict, dict]:
    """What an OffsetCommit request stores and what it refuses: ({metadata: {(topic, partition):
    offset}}, {(topic, partition): ErrorCode}); `known`: the partitions that exist."""
    generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
    commits: dict = {}
    errors: dict = {}
    for topic in body.topics:
        for p in topic.partitions:
            key = (topic.name, p.partition_index)
            metadata = p.committed_metadata
            errors.pop(key, None)  # (a partition named twice: its last entry decides, as in Kafka's map)
            for stored in commits.values():
                stored.pop(key, None)
            if not body.group_id.strip():
                errors[key] = ErrorCode.invalid_group_id
            elif generation >= 0:
                errors[key] = ErrorCode.illegal_generation
            elif key not in known:
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif metadata is not None and len(metadata.encode("utf-8")) > OFFSET_METADATA_MAX_BYTES:
                errors[key] = ErrorCode.offset_metadata_too_large
            else:
                commits.setdefault(metadata, {})[key] = int(p.committed_offset)
    return {m: stored for m, stored in commits.items() if stored}, errors


def offset_commit_response(version: int, body: Any, errors: dict) -> Any:
    schema = load_response_schema(OFFSET_COMMIT, version)
    topic_type = nested(schema, "topics")
    partition_type = nested(topic_type, "partitions")
    return build(schema, throttle_time=_throttle(), topics=tuple(
        build(topic_type, name=t.name, partitions=tuple(
            build(partition_type, partition_index=p.partition_index,
                  error_code=errors.get((t.name, p.partition_index), ErrorCode.none)) for p in t.partitions))
        for t in body.topics))


def offset_fetch_response(version: int, body: Any, committed: dict) -> Any:
    """`committed`: (topic, partition) -> (offset, metadata) of the group."""
    schema = load_response_schema(OFFSET_FETCH, version)
    topic_type = nested(schema, "topics")
    partition_type = nested(topic_type, "partitions")
    if body.topics is None:
        asked: dict = {}
        for topic, partition in sorted(committed):
            asked.setdefault(topic, []).append(partition)
    else:
        asked = {t.name: list(t.partition_indexes) for t in body.topics}

    def partition(topic: str, index: int) -> Any:
        offset, metadata = committed.get((topic, index), (-1, ""))
        return build(partition_type, partition_index=i32(index), committed_offset=i64(offset),
                     committed_leader_epoch=i32(-1), metadata=metadata or "", error_code=ErrorCode.none)

    return build(schema, throttle_time=_throttle(), error_code=ErrorCode.none, topics=tuple(
        build(topic_type, name=name, partitions=tuple(partition(name, i) for i in indexes))
        for name, indexes in asked.items()))
