"""The front door: Kafka's protocol served from a cluster (issue 51). `serve(cluster, ...)` starts
the server (pipeline/wire/server.py) with a handler that answers each API from the cluster's
tables through the rules in this package; the replication job may run beside it on the root.

Served so far: ApiVersions, Metadata (v0-v12), ListOffsets (v1-v6), and for consumers that
assign their partitions themselves FindCoordinator (v0-v3), OffsetCommit (v2-v8) and OffsetFetch
(v1-v7) (pipeline/wire/groups.py). A client that asks for any other API has its
connection closed, as Kafka closes one for an API it does not serve.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import ReplogError
from pipeline.wire.groups import (FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, find_coordinator_response,
                                  offset_commit_plan, offset_commit_response, offset_fetch_response)
from pipeline.wire.list_offsets import EARLIEST, LIST_OFFSETS, list_offsets_response, timestamps_asked
from pipeline.wire.metadata import METADATA, metadata_response, requested_topics
from pipeline.wire.protocol import API_VERSIONS, MAX_REQUEST_BYTES, Request
from pipeline.wire.server import WireServer, serve_kafka

__all__ = ["FrontDoor", "serve", "SERVED_APIS"]

# api key -> the versions the door serves (ApiVersions announces them)
SERVED_APIS = {API_VERSIONS: (0, 3), METADATA: (0, 12), LIST_OFFSETS: (1, 6), FIND_COORDINATOR: (0, 3),
               OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 7)}


class FrontDoor:
    """The handler: a request in, its response entity out, from `cluster`'s state. `host` and
    `port`: the address Metadata gives for every broker (the door's own)."""

    def __init__(self, cluster: Any, host: str, port: int):
        self.cluster, self.host, self.port = cluster, host, port

    def __call__(self, request: Request) -> Any:
        if request.api_key == METADATA:
            return self.metadata(request)
        if request.api_key == LIST_OFFSETS:
            return self.list_offsets(request)
        if request.api_key == FIND_COORDINATOR:
            return find_coordinator_response(request.api_version, request.body, self._live(), self.host, self.port)
        if request.api_key == OFFSET_COMMIT:
            return self.offset_commit(request)
        if request.api_key == OFFSET_FETCH:
            return self.offset_fetch(request)
        raise AssertionError(f"API key {request.api_key} is not served")  # (the server admits only SERVED_APIS)

    def metadata(self, request: Request) -> Any:
        requested = requested_topics(request.api_version, request.body)
        rows = self.cluster.describe().select("topic", "partition", "leader", "leader_epoch", "replicas", "isr")
        if requested is not None:
            rows = rows.filter(rows.topic.isin(requested))
        return metadata_response(request.api_version, requested, [r.asDict() for r in rows.collect()], self._live(),
                                 self.cluster.storage.cluster_id, self.host, self.port)


    def _live(self) -> list[int]:
        """The brokers not fenced."""
        return [r["broker"] for r in self.cluster.broker_states().filter("state <> 'fenced'").select("broker").collect()]

    def offset_commit(self, request: Request) -> Any:
        """The partitions that exist are committed (one commit per metadata value); the others
        are answered with their errors."""
        body = request.body
        topics = sorted({t.name for t in body.topics})
        from pyspark.sql import functions as F
        known = {(r["topic"], r["partition"]) for r in self.cluster.describe().filter(
            F.col("topic").isin(topics)).select("topic", "partition").collect()}
        commits, errors = offset_commit_plan(body, known)
        for metadata, offsets in commits.items():
            self.cluster.commit_offsets(body.group_id, offsets, metadata)
        return offset_commit_response(request.api_version, body, errors)

    def offset_fetch(self, request: Request) -> Any:
        committed = {(r["topic"], r["partition"]): (r["committed_offset"], r["metadata"])
                     for r in self.cluster.committed_offsets(request.body.group_id).collect()}
        return offset_fetch_response(request.api_version, request.body, committed)

    def list_offsets(self, request: Request) -> Any:
        """The partitions' offsets from describe(), and for the timestamps asked the first record at
        or after each in the leader's log below the HW (one read per topic asked, off the round)."""
        from pyspark.sql import functions as F
        body = request.body
        topics = sorted({t.name for t in body.topics})
        rows = (self.cluster.describe().filter(F.col("topic").isin(topics))
                .select("topic", "partition", "leader", "leader_epoch", "log_start_offset", "high_watermark").collect())
        partitions = {(r["topic"], r["partition"]): r.asDict() for r in rows}
        asked = [a for a in timestamps_asked(body) if a[:2] in partitions]
        earliest = {(t.name, p.partition_index) for t in body.topics for p in t.partitions if p.timestamp == EARLIEST}
        found, first_epochs = {}, {}
        for topic in sorted({t for t, _ in partitions}):
            try:
                log = self.cluster.read(topic)
            except ReplogError:  # (a partition it cannot read is answered by its error)
                continue
            if any(k[0] == topic for k in earliest):
                first_epochs.update({(topic, r["partition"]): r["epoch"] for r in log.groupBy("partition").agg(
                    F.min_by("leader_epoch", "offset").alias("epoch")).collect()})
            wanted = [(p, ts) for t, p, ts in asked if t == topic]
            if wanted:
                spark = self.cluster.spark
                times = spark.createDataFrame(wanted, "partition int, asked long")
                first = (log.join(times, "partition").filter(F.col("timestamp") >= F.col("asked"))
                         .groupBy("partition", "asked")
                         .agg(F.min_by(F.struct("offset", "timestamp", "leader_epoch"), "offset").alias("r")))
                found.update({(topic, r["partition"], r["asked"]): tuple(r["r"]) for r in first.collect()})
        return list_offsets_response(request.api_version, body, partitions, found, first_epochs)


def serve(cluster: Any, host: str = "127.0.0.1", port: int = 9092,
          max_request_bytes: int = MAX_REQUEST_BYTES) -> WireServer:
    """Starts the front door for `cluster` on host:port (0: a free port); `.shutdown()` stops it."""
    door = FrontDoor(cluster, host, port)
    server = serve_kafka(door, host, port, SERVED_APIS, max_request_bytes)
    door.port = server.port  # (port 0: the one the system gave)
    return server
