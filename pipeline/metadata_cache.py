"""What the driver keeps of the metadata tables between calls (Kafka's MetadataCache): each table
is re-read only when its Delta version moved, which costs no Spark job. One MetadataCache per
open cluster; its entries are O(brokers), O(topics) or O(brokers^2), never per partition."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from pipeline.consume import sessions as consumer
from pipeline.control import controller
from pipeline.control import quotas
from pipeline.errors import ErrorCode, ReplogError
from pipeline.round.reads import fetch_pair_counts

if TYPE_CHECKING:
    from pipeline.core import ClusterCore

__all__ = ["MetadataCache", "broker_state"]


def broker_state(broker_row: Any) -> str:
    """A broker's state from its row in the brokers table (a row from before states: running)."""
    return broker_row["state"] or controller.RUNNING


class MetadataCache:
    """The brokers, topics, fetch pairs, consumers' sessions and client quotas, each by the
    version of its table."""

    def __init__(self, core: "ClusterCore"):
        self.core = core
        self._brokers: tuple[int, list] | None = None  # (brokers table version, its rows)
        self._topics: tuple[int, dict] | None = None  # (topics table version, its rows by topic)
        self._pairs: tuple[int, tuple] | None = None  # (partitions version, (fetch pairs, reassigning))
        self._clients: tuple[int, consumer.ClientSessions] | None = None  # (version, consumers' sessions)
        self._quotas: tuple[int, dict] | None = None  # (client_quotas version, entries)

    # -- brokers -------------------------------------------------------------------------------
    def broker_rows(self) -> list:
        """The brokers table (O(brokers) rows), re-read only when it changed; a broker another
        process added (add_broker) joins the cluster's brokers here."""
        core = self.core
        version = core.storage.version("brokers")
        if self._brokers is None or self._brokers[0] != version:
            self._brokers = (version, core.storage.read("brokers").collect())
            core.storage.set_broker_dirs((r["broker"], r["path"]) for r in self._brokers[1])
            registered = sorted(r["broker"] for r in self._brokers[1])
            if registered != core.brokers:
                core.brokers = registered
                core.register_views(force=True)
        return self._brokers[1]

    def broker_row(self, broker: int) -> Any:
        """One broker's row; BROKER_NOT_AVAILABLE when there is no such broker."""
        if broker not in self.core.brokers:
            raise ReplogError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker {broker!r}")
        return next(r for r in self.broker_rows() if r["broker"] == broker)

    def placeable_brokers(self) -> list[int]:
        """Brokers new replicas may go to: every registered one not being decommissioned."""
        return [r["broker"] for r in sorted(self.broker_rows(), key=lambda r: r["broker"]) if not r["decommissioned"]]

    def fetch_states(self) -> tuple[dict[int, int | None], dict[int, int]]:
        """(brokers that do not fetch -> their last fetch, throttles): a paused fetcher, and a
        broker that is down (stopped or fenced), which last fetched at its last heartbeat."""
        rows = self.broker_rows()
        paused = {r["broker"]: r["changed_ms"] for r in rows if r["fetcher_paused"]}
        paused.update({r["broker"]: r["last_heartbeat_ms"] for r in rows
                       if broker_state(r) in controller.DOWN})
        throttles = {r["broker"]: r["fetch_max_bytes_per_round"] for r in rows
                     if r["fetch_max_bytes_per_round"] is not None}
        return paused, throttles

    # -- topics and partitions -----------------------------------------------------------------
    def topics(self) -> dict[str, Any]:
        """The topics table's rows by topic (O(topics) rows), re-read only when its version changed:
        produce() asks on every call."""
        version = self.core.storage.version("topics")
        if self._topics is None or self._topics[0] != version:
            self._topics = (version, {r["topic"]: r for r in self.core.storage.read("topics").collect()})
        return self._topics[1]

    def topic(self, topic: Any) -> Any:
        """The topic's row; None when there is no such topic (or `topic` is not a str)."""
        return self.topics().get(topic) if isinstance(topic, str) else None

    def partition_count(self, topic: Any, partition: Any) -> int:
        """The topic's partition count, once `partition` is checked to be one of them:
        UNKNOWN_TOPIC_OR_PARTITION otherwise."""
        meta = self.topic(topic)
        if meta is None:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic!r}")
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < meta["partitions"]:
            raise ReplogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic '{topic}' has no partition {partition!r}")
        return meta["partitions"]

    def fetch_pairs(self, partitions_version: int) -> dict[tuple[int, int], int]:
        """(follower, leader) -> partitions the follower fetches from that leader: the fetch
        requests of a round (O(brokers^2) values, recounted only when the metadata changes)."""
        return self._summary(partitions_version)[0]

    def reassigning(self, partitions_version: int) -> bool:
        """Whether a partition has a reassignment in progress (KIP-455)."""
        return self._summary(partitions_version)[1]

    def _summary(self, partitions_version: int) -> tuple[dict[tuple[int, int], int], bool]:
        """(fetch pairs, reassigning), from one aggregation of the partitions table, re-run only
        when its version changed."""
        if self._pairs is None or self._pairs[0] != partitions_version:
            partitions = self.core.storage.read("partitions")
            rows = (fetch_pair_counts(partitions)
                    .unionByName(partitions.filter(controller.reassignment_in_progress(
                        F.col("adding_replicas"), F.col("removing_replicas")))
                        .select(F.lit(-1).alias("follower"), F.lit(-1).alias("leader"), F.lit(1).cast("long").alias("count"))
                        .limit(1))
                    .collect())
            self._pairs = (partitions_version, ({(r["follower"], r["leader"]): r["count"] for r in rows
                                                 if r["follower"] != -1},
                                                any(r["follower"] == -1 for r in rows)))
        return self._pairs[1]

    # -- consumers and quotas ------------------------------------------------------------------
    def client_sessions(self) -> consumer.ClientSessions:
        """Consumers' sessions (client_sessions table), re-read only when the table changed."""
        storage = self.core.storage
        storage.ensure("client_sessions")
        version = storage.version("client_sessions")
        if self._clients is None or self._clients[0] != version:
            self._clients = (version, consumer.load_client_sessions(storage))
        return self._clients[1]

    def quota_entries(self) -> dict[tuple[str | None, str | None], dict[str, int]]:
        """The client_quotas table as (user entity, client-id entity) -> quotas set, re-read only
        when its version moved (O(entities))."""
        storage = self.core.storage
        version = storage.version("client_quotas")
        if self._quotas is None or self._quotas[0] != version:
            entries = {} if storage.unwritten("client_quotas", version) else {
                (r["user"], r["client_id"]): {k: r[k] for k in quotas.QUOTA_KEYS if r[k] is not None}
                for r in storage.read("client_quotas").collect()}
            self._quotas = (version, entries)
        return self._quotas[1]
