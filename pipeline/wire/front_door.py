"""The front door: Kafka's protocol served from a cluster (issue 51). `serve(cluster, ...)` starts
the server (pipeline/wire/server.py) with a handler that answers each API from the cluster's
tables through the rules in this package; the replication job may run beside it on the root.

Served so far: ApiVersions, Metadata (v0-v12) and ListOffsets (v1-v6). A client that asks for any other API has its
connection closed, as Kafka closes one for an API it does not serve.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import ReplogError
from pipeline.wire.list_offsets import EARLIEST, LIST_OFFSETS, list_offsets_response, timestamps_asked
from pipeline.wire.metadata import METADATA, metadata_response, requested_topics
from pipeline.wire.protocol import API_VERSIONS, MAX_REQUEST_BYTES, Request
from pipeline.wire.server import WireServer, serve_kafka

__all__ = ["FrontDoor", "serve", "SERVED_APIS"]

# api key -> the versions the door serves (ApiVersions announces them)
SERVED_APIS = {API_VERSIONS: (0, 3), METADATA: (0, 12), LIST_OFFSETS: (1, 6)}


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
        raise AssertionError(f"API key {request.api_key} is not served")  # (the server admits only SERVED_APIS)

    def metadata(self, request: Request) -> Any:
        requested = requested_topics(request.api_version, request.body)
        rows = self.cluster.describe().select("topic", "partition", "leader", "leader_epoch", "replicas", "isr")
        if requested is not None:
            rows = rows.filter(rows.topic.isin(requested))
        live = [r["broker"] for r in self.cluster.broker_states().filter("state <> 'fenced'").select("broker").collect()]
        return metadata_response(request.api_version, requested, [r.asDict() for r in rows.collect()], live,
                                 self.cluster.storage.cluster_id, self.host, self.port)


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
