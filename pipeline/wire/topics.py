"""Kafka's CreateTopics at the front door, as pure functions: what each topic of a request asks
for (Cluster.create_topic's arguments) and the response.

As Kafka's controller answers (ControllerApis.createTopics):
- a name given twice in one request: INVALID_REQUEST for it, and it is not created;
- num_partitions and replication_factor -1 take the broker defaults (num.partitions 1 and
  default.replication.factor 1, Kafka's defaults);
- a manual replica assignment: INVALID_REQUEST (the door places replicas by Kafka's rack-unaware
  assignment only);
- otherwise Cluster.create_topic's errors: INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS,
  INVALID_REPLICATION_FACTOR, INVALID_CONFIG, TOPIC_ALREADY_EXISTS, with their messages;
- validate_only: every check, nothing created.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kio.index import load_response_schema
from kio.static.primitive import i16, i32, i32Timedelta

from pipeline.wire.produce import wire_error
from pipeline.wire.protocol import build, nested

__all__ = ["CREATE_TOPICS", "TopicAsked", "topics_asked", "create_topics_response", "DEFAULT_PARTITIONS",
           "DEFAULT_REPLICATION_FACTOR"]

CREATE_TOPICS = 19
# num.partitions and default.replication.factor: Kafka's defaults (ServerLogConfigs, ReplicationConfigs)
DEFAULT_PARTITIONS = 1
DEFAULT_REPLICATION_FACTOR = 1


@dataclass(frozen=True)
class TopicAsked:
    """One topic of a CreateTopics request: what to create, or `error` (name, message) up front."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str | None]
    error: tuple[str, str] | None = None


def topics_asked(body: Any) -> list[TopicAsked]:
    """The topics of a CreateTopics request, in its order."""
    counts = Counter(t.name for t in body.topics)
    out = []
    for t in body.topics:
        partitions = int(t.num_partitions)
        rf = int(t.replication_factor)
        partitions = DEFAULT_PARTITIONS if partitions == -1 else partitions
        rf = DEFAULT_REPLICATION_FACTOR if rf == -1 else rf
        error = None
        if counts[t.name] > 1:
            error = ("INVALID_REQUEST", f"topic '{t.name}' is named more than once in the request")
        elif t.assignments:
            error = ("INVALID_REQUEST", "manual replica assignments are not taken; give num_partitions and "
                                        "replication_factor")
        out.append(TopicAsked(t.name, partitions, rf, {c.name: c.value for c in t.configs}, error))
    return out


def create_topics_response(version: int, asked: list[TopicAsked], outcomes: dict[str, tuple[str, str] | None]) -> Any:
    """CreateTopicsResponse: each topic asked with its error (name, message) or none; a created
    topic's partitions and replication factor (v5+)."""
    schema = load_response_schema(CREATE_TOPICS, version)
    entity = nested(schema, "topics")
    results = []
    seen = set()
    for topic in asked:
        if topic.name in seen:
            continue
        seen.add(topic.name)
        error = topic.error or outcomes.get(topic.name)
        results.append(build(
            entity, name=topic.name, topic_id=None, error_code=wire_error(error[0] if error else None),
            error_message=error[1] if error else None, topic_config_error_code=i16(0),
            num_partitions=i32(-1 if error else topic.partitions),
            replication_factor=i16(-1 if error else topic.replication_factor), configs=None if error else ()))
    return build(schema, throttle_time=i32Timedelta.parse(timedelta(0)), topics=tuple(results))
