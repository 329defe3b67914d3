"""Kafka's Produce and InitProducerId at the front door, as pure functions: a Produce request read
into the inbox requests the door appends (one per topic, through Cluster.produce) and the
partitions it refuses, and the response built from the round's results (produce_results).

What a partition of a Produce request gets, as Kafka's broker answers it (ReplicaManager.appendRecords
and DelayedProduce):
- acks other than 0, 1 and -1: INVALID_REQUIRED_ACKS for every partition, nothing appended;
- a topic or partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION (the door creates no topic
  on produce);
- records the door does not take (pipeline/wire/records.py): their error;
- with acks=0 there is no response: a request with any of these errors has its connection
  closed instead (KafkaApis.handleProduceRequest), so the client refreshes its metadata;
- otherwise the result of the round that appended them: the base offset, or the round's error
  (NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, OUT_OF_ORDER_SEQUENCE_NUMBER,
  INVALID_PRODUCER_EPOCH, NOT_LEADER_OR_FOLLOWER, ...). A retried batch of an idempotent producer
  that the leader still holds is answered with its original offsets. acks=1 is answered once the
  leader appended, acks=-1 once the HW passed the records (or the ISR fell under
  min.insync.replicas), and a request still waiting after its timeout gets REQUEST_TIMED_OUT (its
  records may still be appended, as in Kafka).

InitProducerId: an idempotent producer (no transactional id) gets a new producer id and epoch 0,
as Kafka's broker gives one whatever id the request names; a transactional id is NOT_COORDINATOR,
since the door serves no transactions. Ids come from blocks the cluster hands out
(Cluster.producer_id_block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i32Timedelta, i64

from pipeline.wire.protocol import build, nested
from pipeline.wire.records import RecordsRefused, read_produced

__all__ = ["PRODUCE", "INIT_PRODUCER_ID", "ProducePlan", "produce_plan", "produce_response", "wire_error",
           "init_producer_id_response", "result_of"]

PRODUCE, INIT_PRODUCER_ID = 0, 22
ACKS = (0, 1, -1)


def wire_error(name: str | None) -> ErrorCode:
    """Kafka's error code for an error name (pipeline.errors.ErrorCode's names are Kafka's)."""
    if not name or name == "NONE":
        return ErrorCode.none
    try:
        return ErrorCode[name.lower()]
    except KeyError:
        return ErrorCode.unknown_server_error


@dataclass
class ProducePlan:
    """records: topic -> the records to append (Cluster.produce's dicts, each with its partition);
    partitions: topic -> the partitions appended; errors: (topic, partition) -> (error name, message)."""

    acks: int
    records: dict[str, list[dict]] = field(default_factory=dict)
    partitions: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)


def produce_plan(body: Any, partition_counts: dict[str, int]) -> ProducePlan:
    """What a Produce request appends and refuses; `partition_counts`: each existing topic's
    partitions (the topics asked that exist)."""
    acks = int(body.acks)
    plan = ProducePlan(acks)
    for topic in body.topic_data:
        for part in topic.partition_data:
            index = int(part.index)
            key = (topic.name, index)
            if acks not in ACKS:
                plan.errors[key] = ("INVALID_REQUIRED_ACKS", f"acks must be 0, 1 or -1, got {acks}")
                continue
            count = partition_counts.get(topic.name)
            if count is None or not 0 <= index < count:
                plan.errors[key] = ("UNKNOWN_TOPIC_OR_PARTITION",
                                    f"no partition {index} of topic '{topic.name}'")
                continue
            try:
                records = read_produced(part.records, index)
            except RecordsRefused as err:
                plan.errors[key] = (err.error, str(err))
                continue
            plan.records.setdefault(topic.name, []).extend(records)
            plan.partitions.setdefault(topic.name, []).append(index)
    return plan


def result_of(rows: list[dict]) -> tuple[str | None, int | None] | None:
    """A partition's answer from its produce_results rows (none, or its newest): (error name or None,
    base offset), or None while the request still waits (not yet read by a round, held by a client
    quota, or an acks=-1 request whose HW has not passed it)."""
    if not rows or rows[0]["status"] in ("throttled", "pending"):
        return None
    row = rows[0]
    return row["error_code"], row["base_offset"]


def produce_response(version: int, body: Any, plan: ProducePlan,
                     answers: dict[tuple[str, int], tuple[str | None, int | None]],
                     log_start: dict[tuple[str, int], int]) -> Any:
    """ProduceResponse: each partition of the request with its error or base offset. `answers`:
    (topic, partition) -> (error name or None, base offset) of the appended ones (one missing: its
    request timed out); `log_start`: their log start offsets."""
    schema = load_response_schema(PRODUCE, version)
    topic_entity = nested(schema, "responses")
    part_entity = nested(topic_entity, "partition_responses")
    topics = []
    for topic in body.topic_data:
        parts = []
        for part in topic.partition_data:
            key = (topic.name, int(part.index))
            if key in plan.errors:
                error, message, base = plan.errors[key][0], plan.errors[key][1], None
            elif key in answers:
                error, base = answers[key]
                message = None
            else:
                error, message, base = "REQUEST_TIMED_OUT", "the records were not answered within the request's timeout", None
            code = wire_error(error)
            parts.append(build(part_entity, index=i32(key[1]), error_code=code,
                               base_offset=i64(base if base is not None and code == ErrorCode.none else -1),
                               log_append_time=None, log_start_offset=i64(log_start.get(key, -1)),
                               record_errors=(), error_message=message))
        topics.append(build(topic_entity, name=topic.name, partition_responses=tuple(parts)))
    return build(schema, responses=tuple(topics), throttle_time=i32Timedelta.parse(timedelta(0)))


def init_producer_id_response(version: int, body: Any, producer_id: int | None) -> Any:
    """InitProducerIdResponse: `producer_id` with epoch 0, or NOT_COORDINATOR for a transactional
    id (`producer_id` None)."""
    schema = load_response_schema(INIT_PRODUCER_ID, version)
    throttle = i32Timedelta.parse(timedelta(0))
    if body.transactional_id is not None or producer_id is None:
        return build(schema, throttle_time=throttle, error_code=ErrorCode.not_coordinator,
                     producer_id=i64(-1), producer_epoch=i16(-1))
    return build(schema, throttle_time=throttle, error_code=ErrorCode.none, producer_id=i64(producer_id),
                 producer_epoch=i16(0))
