"""The front door's TCP server: Kafka's framing over asyncio, in a thread of its own.

Each connection is served in order, as Kafka serves one (its SocketServer mutes a connection while
a request of it is in flight; a client matches responses by correlation id, in the order it sent
them): a frame is read, parsed (pipeline/wire/protocol.py), handed to the handler, and its response
written before the next frame is read. Handlers run in a thread pool, not on the event loop, so a
request that waits (a Produce with acks=all waits for a round; a Fetch for max.wait.ms) holds only
its own connection. What protocol.py says closes a connection closes it, with a log line; an error inside a
handler closes that connection too, never the server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from pipeline.wire.protocol import (API_VERSIONS, MAX_REQUEST_BYTES, SERVED, ProtocolError, Request,
                                    api_versions_response, encode_response, parse_request, read_size,
                                    unsupported_api_versions_response)

__all__ = ["WireServer", "serve_kafka", "Handler"]

LOG = logging.getLogger("replog.wire")

# requests handled at once (each connection has at most one in flight)
HANDLER_THREADS = 32

# a request in, its response entity out (None: no response, as for a Produce with acks=0)
Handler = Callable[[Request], Any]


class WireServer:
    """A running server: `port` it listens on, `shutdown()` to stop it (connections close)."""

    def __init__(self, handler: Handler, host: str, port: int, served: dict[int, tuple[int, int]],
                 max_request_bytes: int, on_shutdown: Callable[[], None] | None = None):
        self.handler, self.served, self.max_request_bytes = handler, served, max_request_bytes
        self.on_shutdown = on_shutdown
        self.connections: set[asyncio.Task] = set()
        self.pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="replog-wire-handler")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="replog-wire", daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, host, port), self.loop).result()
        self.host, self.port = self.server.sockets[0].getsockname()[:2]

    def shutdown(self) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()  # (releases handlers that wait)

        async def stop() -> None:
            self.server.close()
            for task in list(self.connections):
                task.cancel()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            while True:
                try:
                    prefix = await reader.readexactly(4)
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection
                size = read_size(prefix, self.max_request_bytes)
                frame = await reader.readexactly(size)
                request = parse_request(frame, self.served)
                response = await self.loop.run_in_executor(self.pool, self._respond, request)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
        except ProtocolError as err:
            LOG.warning("closing the connection from %s: %s", peer, err)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away mid-frame
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - a handler's failure ends its connection, not the server
            LOG.exception("closing the connection from %s after an error", peer)
        finally:
            self.connections.discard(task)
            writer.close()

    def _respond(self, request: Request) -> bytes | None:
        if request.api_key == API_VERSIONS:
            body = (unsupported_api_versions_response(self.served) if request.body is None
                    else api_versions_response(request.api_version, self.served))
        else:
            body = self.handler(request)
        return None if body is None else encode_response(request.correlation_id, body)


def serve_kafka(handler: Handler, host: str = "127.0.0.1", port: int = 9092,
                served: dict[int, tuple[int, int]] | None = None,
                max_request_bytes: int = MAX_REQUEST_BYTES, on_shutdown: Callable[[], None] | None = None) -> WireServer:
    """Starts a server for Kafka's protocol on host:port (0: a free port) that answers ApiVersions
    itself and hands every other served request to `handler`; `on_shutdown` runs first when it
    stops."""
    return WireServer(handler, host, port, dict(SERVED if served is None else served), max_request_bytes,
                      on_shutdown)
