"""Kafka's Metadata answer from the cluster's state (KafkaApis.handleTopicMetadataRequest and
the metadata cache's rules), a pure function of the brokers and partition rows it is given.

- Which topics: a v0 request's empty list means every topic; from v1 a null list means every
  topic and an empty one none. A topic asked for that does not exist gets
  UNKNOWN_TOPIC_OR_PARTITION and no partitions (replog creates no topic on a Metadata request:
  `auto.create.topics.enable` is not a key of this cluster).
- Brokers: the live ones (not fenced), each at the front door's address: every broker of the
  cluster is served through the door, so a client's connection to "broker 2" reaches the same
  server, which answers for it. The controller id is the lowest live broker (a client only uses
  it to send admin requests, which the door answers itself).
- A partition without a leader gets LEADER_NOT_AVAILABLE and leader -1; replicas on brokers
  that are not live are its offline replicas (v5+).
- Topic ids (v10+): replog keeps none, so each topic gets one derived from the cluster id and its
  name (uuid5), the same on every answer.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, Iterable

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from pipeline.schemas import NO_LEADER
from pipeline.wire.protocol import build, nested

__all__ = ["METADATA", "metadata_response", "requested_topics", "topic_id"]

METADATA = 3


def topic_id(cluster_id: str, topic: str) -> uuid.UUID:
    """The id a topic has in Metadata responses: stable for the cluster and the name."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"replog:{cluster_id}/{topic}")


def requested_topics(version: int, body: Any) -> list[str] | None:
    """The topic names a Metadata request asks for; None for every topic."""
    if body.topics is None or (version == 0 and not body.topics):
        return None
    return [t.name for t in body.topics]


def metadata_response(version: int, requested: list[str] | None, partitions: Iterable[dict], live: Iterable[int],
                      cluster_id: str, host: str, port: int) -> Any:
    """MetadataResponse in `version`. `partitions`: rows with topic, partition, leader,
    leader_epoch, replicas, isr (every partition of every topic); `live`: the brokers not fenced."""
    schema = load_response_schema(METADATA, version)
    broker_type, topic_type = nested(schema, "brokers"), nested(schema, "topics")
    partition_type = nested(topic_type, "partitions")
    live = sorted(set(live))
    by_topic: dict[str, list[dict]] = {}
    for row in partitions:
        by_topic.setdefault(row["topic"], []).append(row)
    names = sorted(by_topic) if requested is None else list(dict.fromkeys(requested))

    def partition(row: dict) -> Any:
        leader = row["leader"]
        return build(partition_type,
                     error_code=ErrorCode.none if leader != NO_LEADER else ErrorCode.leader_not_available,
                     partition_index=i32(row["partition"]), leader_id=i32(leader),
                     leader_epoch=i32(row["leader_epoch"]), replica_nodes=tuple(i32(b) for b in row["replicas"]),
                     isr_nodes=tuple(i32(b) for b in row["isr"]),
                     offline_replicas=tuple(i32(b) for b in row["replicas"] if b not in live))

    def topic(name: str) -> Any:
        rows = sorted(by_topic.get(name, []), key=lambda r: r["partition"])
        return build(topic_type, error_code=ErrorCode.none if rows else ErrorCode.unknown_topic_or_partition,
                     name=name, topic_id=topic_id(cluster_id, name) if rows else uuid.UUID(int=0),
                     is_internal=False, partitions=tuple(partition(r) for r in rows))

    return build(schema, throttle_time=i32Timedelta.parse(timedelta(0)),
                 brokers=tuple(build(broker_type, node_id=i32(b), host=host, port=i32(port), rack=None) for b in live),
                 cluster_id=cluster_id, controller_id=i32(live[0] if live else -1),
                 topics=tuple(topic(n) for n in names))
