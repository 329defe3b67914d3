"""Configs at run time (kafka-configs: Kafka's DescribeConfigs and IncrementalAlterConfigs) and
client quotas (AlterClientQuotas, DescribeClientQuotas; quotas.py has the rules): validated as at
creation, nothing written on an error; the next round, in a running job too, uses them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from pyspark.sql import functions as F

from pipeline.control import quotas
from pipeline.config import CLUSTER_KEYS, TOPIC_KEYS, to_json, validate_cluster_config, validate_topic_config
from pipeline.errors import ErrorCode, ReplogError
from pipeline.schemas import CLIENT_QUOTAS_SCHEMA, CLUSTER_SCHEMA, TOPICS_SCHEMA

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["describe_configs", "alter_configs", "alter_client_quotas", "describe_client_quotas"]


def _deletes(delete: Any) -> list:
    return [delete] if isinstance(delete, str) else list(delete or [])


def alter_client_quotas(core: "ClusterCore", entity: Mapping[str, str | None], set: Mapping[str, Any] | None = None,
                        delete: Any = ()) -> dict[str, int]:
    """Kafka's AlterClientQuotas (Cluster.alter_client_quotas); the entity's quotas after it."""
    key = quotas.check_entity(entity)
    delete = _deletes(delete)
    values = quotas.check_quota_values(dict(set or {}), delete)
    if not values and not delete:
        raise ReplogError(ErrorCode.INVALID_REQUEST, f"nothing to alter for {dict(entity)}: give a quota to set "
                                                     "or to delete")
    entries = dict(core.metadata.quota_entries())
    after = {k: v for k, v in entries.get(key, {}).items() if k not in delete}
    after.update(values)
    entries[key] = after
    now = core.clock.now_ms()
    rows = [(u, c, q.get("producer_byte_rate"), q.get("consumer_byte_rate"), now)
            for (u, c), q in sorted(entries.items(), key=lambda e: (str(e[0][0]), str(e[0][1]))) if q]
    core.storage.overwrite_table(core.spark.createDataFrame(rows, CLIENT_QUOTAS_SCHEMA), "client_quotas")
    return after


def describe_client_quotas(core: "ClusterCore") -> list[dict[str, Any]]:
    """Kafka's DescribeClientQuotas (Cluster.describe_client_quotas)."""
    out = []
    entries = core.metadata.quota_entries()
    for (user, client), values in sorted(entries.items(), key=lambda e: (str(e[0][0]), str(e[0][1]))):
        entity = {kind: (None if name == quotas.DEFAULT else name)
                  for kind, name in zip(quotas.ENTITY_TYPES, (user, client)) if name is not None}
        out.append({"entity": entity, "quotas": dict(values)})
    return out


def _client_entity(entity_type: str, name: Any) -> dict[str, Any] | None:
    """kafka-configs' --entity-type users|clients with a name (None: --entity-default)."""
    kind = {"users": "user", "clients": "client-id"}.get(entity_type)
    return None if kind is None else {kind: name}


def _topic_row(core: "ClusterCore", name: Any) -> Any:
    row = core.metadata.topic(name)
    if row is None:
        raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
    return row


def describe_configs(core: "ClusterCore", entity_type: str, name: str | None = None) -> dict[str, Any]:
    """kafka-configs --describe (Cluster.describe_configs)."""
    if entity_type == "topics":
        return json.loads(_topic_row(core, name)["config"])
    entity = _client_entity(entity_type, name)
    if entity is not None:
        return dict(core.metadata.quota_entries().get(quotas.check_entity(entity), {}))
    _check_broker_entity(entity_type, name)
    core.reload_config()
    return dict(core.config)


def alter_configs(core: "ClusterCore", entity_type: str, name: str | None = None, set: Mapping[str, Any] | None = None,
                  delete: Any = ()) -> dict[str, Any]:
    """kafka-configs --alter (Cluster.alter_configs); the entity's config after the change."""
    set, delete = dict(set or {}), _deletes(delete)
    if entity_type == "topics":
        return _alter_topic(core, name, set, delete)
    entity = _client_entity(entity_type, name)
    if entity is not None:  # --entity-type users|clients: client quotas
        return alter_client_quotas(core, entity, set, delete)
    _check_broker_entity(entity_type, name)
    _check_deletes(delete, CLUSTER_KEYS, "cluster")
    core.reload_config()
    current = {k: v for k, v in core.config.items() if k not in delete}
    full = validate_cluster_config({**current, **set})
    row = core.storage.read("cluster").first()
    core.storage.upsert(core.spark.createDataFrame(
        [(row["cluster_id"], row["brokers"], to_json(full), row["created_ms"])], CLUSTER_SCHEMA),
        "cluster", ["cluster_id"])
    core.reload_config()
    return full


def _alter_topic(core: "ClusterCore", name: Any, set: dict, delete: list) -> dict[str, Any]:
    """A topic's overrides: a deleted key falls back to the cluster's value; min.insync.replicas
    is checked against the topic's smallest replica set outside a reassignment's removals."""
    row = _topic_row(core, name)
    _check_deletes(delete, TOPIC_KEYS, "topic")
    current = {k: v for k, v in json.loads(row["config"]).items() if k not in delete}
    replication = (core.storage.read("partitions").filter(F.col("topic") == name)
                   .agg(F.min(F.size("replicas") - F.size(F.coalesce(
                       "removing_replicas", F.array().cast("array<int>"))))).first()[0])
    overrides = validate_topic_config({**current, **set}, replication)
    core.storage.upsert(core.spark.createDataFrame(
        [(name, row["partitions"], row["replication_factor"], to_json(overrides), row["created_ms"])],
        TOPICS_SCHEMA), "topics", ["topic"])
    return overrides


def _check_deletes(delete: list, keys: Mapping[str, Any], scope: str) -> None:
    unknown = [k for k in delete if k not in keys]
    if unknown:
        raise ReplogError(ErrorCode.INVALID_CONFIG, f"unknown {scope} config keys {unknown}")


def _check_broker_entity(entity_type: str, name: Any) -> None:
    if entity_type != "brokers":
        raise ReplogError(ErrorCode.INVALID_CONFIG,
                          f"entity type must be 'topics', 'brokers', 'users' or 'clients', got {entity_type!r}")
    if name is not None:
        raise ReplogError(ErrorCode.INVALID_CONFIG,
                          f"configs are kept cluster-wide (kafka-configs --entity-default), not for broker {name!r}")
