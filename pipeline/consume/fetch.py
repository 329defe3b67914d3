"""The consumer's side of the facade: incremental fetches through KIP-227 sessions under the
client's consumer_byte_rate quota (consumer.py has the sessions' rules and I/O), and consumer
groups' committed offsets (Kafka's OffsetCommit and OffsetFetch; groups.py has the rules)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.consume import sessions as consumer
from pipeline.control import groups
from pipeline.control import quotas
from pipeline.errors import ErrorCode, ReplogError
from pipeline.produce import check_client
from pipeline.control.replication import record_size
from pipeline.round.driver import round_sessions
from pipeline.schemas import GROUP_OFFSETS_SCHEMA

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["fetch_incremental", "check_group", "commit_offsets", "committed_offsets"]


def fetch_incremental(core: "ClusterCore", consumer_id: str, topic: str, client_id: str | None = None,
                      user: str | None = None) -> consumer.Fetched:
    """A consumer's incremental fetch, positions not yet moved (Cluster.fetch_incremental). Under a
    consumer_byte_rate quota the fetch's bytes are recorded (this process measures its consumers,
    as each Kafka broker measures its own); a fetch while the client still waits serves nothing."""
    if not isinstance(consumer_id, str) or not consumer_id:
        raise ValueError(f"consumer_id must be a non-empty str, got {consumer_id!r}")
    client_id, user = check_client(client_id, user)
    client_id = consumer_id if client_id is None else client_id
    if core.metadata.topic(topic) is None:
        raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
    now = core.clock.now_ms()
    core.reload_config()
    found = None  # (the quota's sensor key, the quota) of this client's consumer_byte_rate quota
    if core.quota_sensors("consumer_byte_rate", now) is not None:  # (brings the sensors' windows up to date)
        found = quotas.quota_for(core.metadata.quota_entries(), "consumer_byte_rate", user, client_id)
    quota_key, quota = found if found is not None else (None, None)
    sensors = core.sensors["consumer_byte_rate"]
    waits = sensors.remaining_ms(quota_key, now) if quota_key else 0
    if waits:
        fetched = consumer.throttled_fetch(core.storage, waits)
    else:
        fetched = consumer.fetch_incremental(
            core.storage, core.brokers, round_sessions(core)[0], consumer_id, topic, now,
            core.config["max.incremental.fetch.session.cache.slots"], core.rng)
        if quota_key is not None:
            size = fetched.records.agg(F.sum(record_size(F.col("key"), F.col("value")))).first()[0] or 0
            fetched = replace(fetched, throttle_time_ms=sensors.record(quota_key, quota, int(size), now))
    core.consumer_requests[consumer_id] = fetched.contexts
    core.fetch_throttles[consumer_id] = fetched.throttle_time_ms
    return fetched


def check_group(group: Any) -> None:
    if not isinstance(group, str) or not group.strip():
        raise ReplogError(ErrorCode.INVALID_GROUP_ID, f"a group id must be a non-empty string, got {group!r}")


def commit_offsets(core: "ClusterCore", group: str, offsets: Mapping[tuple[str, int], int],
                   metadata: str | None = None) -> None:
    """Kafka's OffsetCommit (Cluster.commit_offsets): every entry checked, then one commit."""
    check_group(group)
    if not isinstance(offsets, Mapping) or not offsets:
        raise ValueError("offsets must be a non-empty mapping {(topic, partition): offset}")
    if metadata is not None and len(metadata.encode("utf-8")) > groups.OFFSET_METADATA_MAX_BYTES:
        raise ReplogError(ErrorCode.OFFSET_METADATA_TOO_LARGE,
                          f"metadata is over offset.metadata.max.bytes ({groups.OFFSET_METADATA_MAX_BYTES})")
    rows = []
    for key, offset in offsets.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(f"offsets keys are (topic, partition), got {key!r}")
        topic, partition = key
        core.metadata.partition_count(topic, partition)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"the offset of {topic}-{partition} must be an int >= 0, got {offset!r}")
        rows.append((group, topic, partition, offset, metadata, core.clock.now_ms()))
    core.storage.upsert(core.spark.createDataFrame(rows, GROUP_OFFSETS_SCHEMA), "group_offsets",
                        ["group_id", "topic", "partition"])


def committed_offsets(core: "ClusterCore", group: str) -> DataFrame:
    """Kafka's OffsetFetch: topic, partition, committed_offset, metadata, commit_ms of `group`."""
    check_group(group)
    return core.storage.read("group_offsets").filter(F.col("group_id") == group).drop("group_id")
