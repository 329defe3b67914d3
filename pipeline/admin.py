"""Kafka's admin requests on the metadata tables: CreateTopics, DeleteRecords, ElectLeaders,
AlterPartitionReassignments, broker registration and decommissioning. Each checks everything
before it writes anything; the next round acts on what it wrote. Configs and client quotas are in
configs.py."""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING, Any, Mapping

from pyspark.sql import functions as F

from pipeline import brokers as broker_ops
from pipeline.control import controller
from pipeline.control.assignment import assign_replicas
from pipeline.config import to_json, validate_topic_config
from pipeline.errors import ErrorCode, ReplogError
from pipeline.metadata_cache import broker_state
from pipeline.schemas import (ADMIN_SCHEMA, BROKERS_SCHEMA, NO_LEADER, PARTITIONS_SCHEMA, REPLICA_STATE_SCHEMA,
                              TOPICS_SCHEMA)
from pipeline.storage import views
from pipeline.storage.locations import check_locations

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["create_topic", "delete_records", "elect_preferred_leaders", "reassign_partitions", "add_broker",
           "decommission_broker", "producer_id_block", "PRODUCER_ID_BLOCK_SIZE"]

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def _validate_topic_name(name: Any) -> None:
    if not isinstance(name, str) or not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise ReplogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                          f"topic name {name!r} is invalid: use 1 to 249 of [a-zA-Z0-9._-], not '.' or '..'")


def create_topic(core: "ClusterCore", topic: str, partitions: int = 1, replication_factor: int = 1,
                 config: Mapping[str, Any] | None = None, validate_only: bool = False) -> None:
    """A topic with Kafka's replica assignment (Cluster.create_topic); `validate_only`: every check,
    nothing written."""
    _validate_topic_name(topic)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ReplogError(ErrorCode.INVALID_PARTITIONS, f"partitions must be an int >= 1, got {partitions!r}")
    rf = replication_factor
    if isinstance(rf, bool) or not isinstance(rf, int) or not 1 <= rf <= len(core.brokers):
        raise ReplogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                          f"replication factor must be between 1 and the broker count {len(core.brokers)}, got {rf!r}")
    overrides = validate_topic_config(config, rf)
    if core.metadata.topic(topic) is not None:
        raise ReplogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic '{topic}' already exists")
    placeable = core.metadata.placeable_brokers()
    if rf > len(placeable):
        raise ReplogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                          f"replication factor {rf} is more than the {len(placeable)} brokers that take new "
                          f"replicas ({len(core.brokers) - len(placeable)} being decommissioned)")
    if validate_only:
        return
    now = core.admin_now_ms()
    start = len(core.metadata.topics()) % len(placeable)
    assignment = assign_replicas(placeable, partitions, rf, start_index=start)
    round_id, spark = core.round_id, core.spark
    core.storage.append_all([
        (spark.createDataFrame([(topic, p, r[0], 0, 0, r, r, 0, round_id, [], [])
                                for p, r in enumerate(assignment)], PARTITIONS_SCHEMA),
         core.storage.path("partitions")),
        (spark.createDataFrame([(topic, p, b, 0, 0, 0, 0, now, 0, now, 0, 0, 0, -1, -1, 0, round_id)
                                for p, r in enumerate(assignment) for b in r], REPLICA_STATE_SCHEMA),
         core.storage.path("replica_state"))], None)
    # the topic row last: a topic is visible to producers only once all its partitions are
    core.storage.append_table(spark.createDataFrame(
        [(topic, partitions, rf, to_json(overrides), now)], TOPICS_SCHEMA), "topics")


def _admin_request(core: "ClusterCore", rows: list[tuple]) -> None:
    """Admin requests for the next round: (kind, topic, partition, offset, replicas) each."""
    now = core.clock.now_ms()
    core.storage.append_table(core.spark.createDataFrame(
        [(str(uuid.uuid4()), kind, topic, partition, offset, now, replicas)
         for kind, topic, partition, offset, replicas in rows], ADMIN_SCHEMA), "admin")


def delete_records(core: "ClusterCore", topic: str, partition: int, before_offset: int) -> int:
    """Kafka's DeleteRecords (Cluster.delete_records); returns the log start offset to be."""
    meta = core.metadata.topic(topic)
    if meta is None or isinstance(partition, bool) or not isinstance(partition, int) \
            or not 0 <= partition < meta["partitions"]:
        raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {partition!r} of topic {topic!r}")
    partitions = core.spark.sql(views.partitions_sql(core.storage, core.config["min.insync.replicas"]))
    leader = partitions.filter((F.col("topic") == topic) & (F.col("partition") == partition)).first()
    hw, start = leader["high_watermark"], leader["log_start_offset"]
    _refuse_a_down_leader(core, topic, partition, leader["leader"])
    if before_offset == -1 and not isinstance(before_offset, bool):
        before_offset = hw
    if isinstance(before_offset, bool) or not isinstance(before_offset, int) or not 0 <= before_offset <= hw:
        raise ReplogError(ErrorCode.OFFSET_OUT_OF_RANGE,
                          f"before_offset must be -1 or between 0 and the high watermark {hw}, got {before_offset!r}")
    _admin_request(core, [("delete_records", topic, partition, before_offset, None)])
    return max(start, before_offset)


def _refuse_a_down_leader(core: "ClusterCore", topic: str, partition: int, leader: int) -> None:
    """LEADER_NOT_AVAILABLE when the partition has no leader, or its leader is down (stopped, or
    halted for a failed log directory, and not fenced yet): Kafka's admin client sends
    DeleteRecords to the leader, which must be up to move its log start offset. Retriable: once
    the controller fences the broker and elects another leader, or it restarts."""
    if leader == NO_LEADER:
        raise ReplogError(ErrorCode.LEADER_NOT_AVAILABLE, f"partition {topic}-{partition} has no leader (offline)")
    state = broker_state(core.metadata.broker_row(leader))
    if state in controller.DOWN:
        raise ReplogError(ErrorCode.LEADER_NOT_AVAILABLE,
                          f"the leader of {topic}-{partition}, broker {leader}, is {state}: retry once it restarts "
                          "or the controller, fencing it, elects another leader")


def elect_preferred_leaders(core: "ClusterCore", topic: str | None = None, partition: int | None = None) -> None:
    """Kafka's preferred leader election (Cluster.elect_preferred_leaders), at the next round."""
    if topic is None:
        if partition is not None:
            raise ValueError("give a topic with a partition")
        topics = sorted(core.metadata.topics())
    else:
        if partition is None:
            if core.metadata.topic(topic) is None:
                raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        else:
            core.metadata.partition_count(topic, partition)
        topics = [topic]
    if topics:
        _admin_request(core, [("elect_preferred", t, -1 if partition is None else partition, -1, None) for t in topics])


def reassign_partitions(core: "ClusterCore", assignment: Mapping[tuple[str, int], Any]) -> None:
    """Kafka's AlterPartitionReassignments (Cluster.reassign_partitions): every entry checked
    (UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT), then one admin commit."""
    if not isinstance(assignment, Mapping) or not assignment:
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                          "give a non-empty mapping {(topic, partition): [broker, ...]}")
    placeable = set(core.metadata.placeable_brokers())
    rows = []
    for key, target in assignment.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{key!r} is not a (topic, partition) pair")
        topic, partition = key
        core.metadata.partition_count(topic, partition)
        rows.append(("reassign", topic, partition, -1, _check_target(core, f"{topic}-{partition}", target, placeable)))
    _admin_request(core, rows)


def _check_target(core: "ClusterCore", where: str, target: Any, placeable: set[int]) -> list[int]:
    if isinstance(target, (str, bytes)) or not hasattr(target, "__iter__"):
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: replicas must be a list of broker ids")
    target = list(target)
    if not target:
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: the replica list is empty")
    if any(isinstance(b, bool) or not isinstance(b, int) for b in target):
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: broker ids must be ints, got {target!r}")
    if len(set(target)) != len(target):
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: duplicate brokers in {target}")
    unknown = [b for b in target if b not in core.brokers]
    if unknown:
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                          f"{where}: unknown brokers {unknown} (registered: {core.brokers})")
    leaving = [b for b in target if b not in placeable]
    if leaving:
        raise ReplogError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: brokers {leaving} are being decommissioned")
    return target


def add_broker(core: "ClusterCore", dir: str | None = None) -> int:
    """Registers a new, empty broker (Cluster.add_broker); its location is checked first."""
    core.metadata.broker_rows()
    broker = max(core.brokers) + 1
    storage = core.storage
    taken = {b: storage.broker_root(b) for b in core.brokers}
    given = check_locations(storage, {broker: dir if dir is not None else storage.default_broker_root(broker)}, taken)
    now = core.admin_now_ms()
    storage.broker_dirs.update(given)
    storage.create_log(broker)  # the log first: a registered broker always has one
    storage.append_table(core.spark.createDataFrame(
        [(broker, storage.stored_location(broker), False, None, now, controller.RUNNING, now, False, False, None)],
        BROKERS_SCHEMA), "brokers")
    core.metadata.broker_rows()
    return broker


def decommission_broker(core: "ClusterCore", broker: int) -> dict[tuple[str, int], list[int]]:
    """Moves every replica off `broker` (Cluster.decommission_broker), each to the placeable broker
    with the fewest replicas; INVALID_REPLICATION_FACTOR when a partition has nowhere to go."""
    if isinstance(broker, bool) or not isinstance(broker, int) or broker not in core.brokers:
        raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {broker!r}")
    others = [b for b in core.metadata.placeable_brokers() if b != broker]
    rows = core.storage.read("partitions").select("topic", "partition", "replicas", "removing_replicas").collect()
    targets = {(r["topic"], r["partition"]): [b for b in r["replicas"] if b not in (r["removing_replicas"] or [])]
               for r in rows}
    load = {b: 0 for b in others}
    for replicas in targets.values():
        for b in replicas:
            if b in load:
                load[b] += 1
    plan = {}
    for key in sorted(k for k, replicas in targets.items() if broker in replicas):
        replicas = targets[key]
        free = [b for b in others if b not in replicas]
        if not free:
            raise ReplogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                              f"broker {broker} cannot be decommissioned: {key[0]}-{key[1]} has replicas {replicas} "
                              f"and no other broker to move to (its replication factor would drop)")
        to = min(free, key=lambda b: (load[b], b))
        load[to] += 1
        plan[key] = [to if b == broker else b for b in replicas]
    broker_ops.set_broker(core, broker, decommissioned=True)
    if plan:
        reassign_partitions(core, plan)
    return plan


# Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE: the controller hands producer ids to brokers in blocks of 1000
PRODUCER_ID_BLOCK_SIZE = 1000
PRODUCER_ID_CLAIM_PROPERTY = "replog.producerIds.claim"


def producer_id_block(core: "ClusterCore", attempts: int = 20) -> range:
    """A block of producer ids no other caller gets (Kafka's AllocateProducerIds): a claim is one
    commit to the cluster table (a table property naming the claim), and the block is that commit's
    version times PRODUCER_ID_BLOCK_SIZE, so two claims never share a block. A claim that conflicts
    with another writer's commit is retried."""
    storage = core.storage
    for _ in range(attempts):
        claim = str(uuid.uuid4())
        if not storage.set_cluster_property(PRODUCER_ID_CLAIM_PROPERTY, claim):
            continue
        history = core.spark.sql(f"DESCRIBE HISTORY delta.`{storage.path('cluster')}` LIMIT 50")
        found = (history.filter(F.col("operationParameters")["properties"].contains(claim))
                 .select("version").collect())
        if found:
            start = found[0]["version"] * PRODUCER_ID_BLOCK_SIZE
            return range(start, start + PRODUCER_ID_BLOCK_SIZE)
    raise ReplogError(ErrorCode.UNKNOWN_SERVER_ERROR,
                      f"no producer id block after {attempts} claims on the cluster table; try again")
