"""The front door: Kafka's protocol served from a cluster (issue 51). `serve(cluster, ...)` starts
the server (pipeline/wire/server.py) with a handler that answers each API from the cluster's
tables through the rules in this package; the replication job may run beside it on the root.

Served so far: ApiVersions and Metadata (v0-v12). A client that asks for any other API has its
connection closed, as Kafka closes one for an API it does not serve.
"""

from __future__ import annotations

from typing import Any

from pipeline.wire.metadata import METADATA, metadata_response, requested_topics
from pipeline.wire.protocol import API_VERSIONS, MAX_REQUEST_BYTES, Request
from pipeline.wire.server import WireServer, serve_kafka

__all__ = ["FrontDoor", "serve", "SERVED_APIS"]

# api key -> the versions the door serves (ApiVersions announces them)
SERVED_APIS = {API_VERSIONS: (0, 3), METADATA: (0, 12)}


class FrontDoor:
    """The handler: a request in, its response entity out, from `cluster`'s state. `host` and
    `port`: the address Metadata gives for every broker (the door's own)."""

    def __init__(self, cluster: Any, host: str, port: int):
        self.cluster, self.host, self.port = cluster, host, port

    def __call__(self, request: Request) -> Any:
        if request.api_key == METADATA:
            return self.metadata(request)
        raise AssertionError(f"API key {request.api_key} is not served")  # (the server admits only SERVED_APIS)

    def metadata(self, request: Request) -> Any:
        requested = requested_topics(request.api_version, request.body)
        rows = self.cluster.describe().select("topic", "partition", "leader", "leader_epoch", "replicas", "isr")
        if requested is not None:
            rows = rows.filter(rows.topic.isin(requested))
        live = [r["broker"] for r in self.cluster.broker_states().filter("state <> 'fenced'").select("broker").collect()]
        return metadata_response(request.api_version, requested, [r.asDict() for r in rows.collect()], live,
                                 self.cluster.storage.cluster_id, self.host, self.port)


def serve(cluster: Any, host: str = "127.0.0.1", port: int = 9092,
          max_request_bytes: int = MAX_REQUEST_BYTES) -> WireServer:
    """Starts the front door for `cluster` on host:port (0: a free port); `.shutdown()` stops it."""
    door = FrontDoor(cluster, host, port)
    server = serve_kafka(door, host, port, SERVED_APIS, max_request_bytes)
    door.port = server.port  # (port 0: the one the system gave)
    return server
