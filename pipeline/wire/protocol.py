"""Kafka's wire protocol at the front door (issue 51): a request frame read into its header and
body, a response written into its frame, and which APIs and versions the door serves.

The message types and their versions come from `kio`, which is generated from Kafka's own message
schemas (clients/src/main/resources/common/message/*.json): nothing here encodes a field by hand.
A frame is a 4-byte big-endian size and that many bytes; a request's header starts with its API
key, API version and correlation id, whatever the header's version, so those three are read
before the schema is known.

What the door does with a request it cannot serve follows Kafka's broker (SocketServer and
KafkaApis):
- a frame larger than `socket.request.max.bytes` (Kafka's default 104857600) or of a negative
  size: the connection is closed before its bytes are read (Kafka's InvalidReceiveException);
- an API key Kafka does not define, or one the door does not serve: the connection is closed;
- ApiVersions in a version the door does not know: an ApiVersions v0 response with
  UNSUPPORTED_VERSION and the versions it serves (KIP-511: the client retries with one of them);
- any other API in a version outside the range the door announced, or a body that does not
  parse: the connection is closed. Bytes after a body that parsed are left unread, as Kafka's
  generated readers leave them (librdkafka's Metadata v12 requests carry three).
"""

from __future__ import annotations

import io
import struct
import sys
import typing
from dataclasses import dataclass, fields, is_dataclass
from datetime import timedelta
from typing import Any

from kio.index import UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

__all__ = ["MAX_REQUEST_BYTES", "API_VERSIONS", "SERVED", "ProtocolError", "Request", "read_size", "parse_request",
           "encode_response", "build", "nested", "api_versions_response", "unsupported_api_versions_response"]

# socket.request.max.bytes: Kafka's default (KafkaConfig)
MAX_REQUEST_BYTES = 104_857_600

API_VERSIONS = 18

# the APIs the door serves: api key -> (min version, max version), as ApiVersions announces them
SERVED: dict[int, tuple[int, int]] = {
    API_VERSIONS: (0, 3),
}


class ProtocolError(Exception):
    """A request the door answers by closing the connection (the message says why, for the log)."""


@dataclass(frozen=True)
class Request:
    """A parsed request: its header's fields and its body (a kio request entity)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def read_size(prefix: bytes, max_bytes: int = MAX_REQUEST_BYTES) -> int:
    """The size a frame's 4-byte prefix gives; ProtocolError when it is negative or above `max_bytes`."""
    (size,) = struct.unpack(">i", prefix)
    if size < 0 or size > max_bytes:
        raise ProtocolError(f"a request of {size} bytes, above socket.request.max.bytes ({max_bytes})"
                            if size > 0 else f"a request frame of size {size}")
    return size


def parse_request(frame: bytes, served: dict[int, tuple[int, int]] = SERVED) -> Request:
    """A request frame (without its size prefix) read into a Request. ProtocolError for what
    closes the connection; an ApiVersions request in a version the door does not serve comes back
    with `body` None (the caller answers with unsupported_api_versions_response)."""
    if len(frame) < 8:
        raise ProtocolError(f"a request frame of {len(frame)} bytes, shorter than a request header")
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame, 0)
    if api_key not in api_key_map:
        raise ProtocolError(f"unknown API key {api_key}")
    if api_key not in served:
        raise ProtocolError(f"API key {api_key} ({api_key_map[api_key]}) is not served here")
    low, high = served[api_key]
    if not low <= api_version <= high:
        if api_key == API_VERSIONS:
            return Request(api_key, api_version, correlation_id, None, None)
        raise ProtocolError(f"{api_key_map[api_key]} v{api_version} is not served here (v{low}-v{high})")
    try:
        schema = load_request_schema(api_key, api_version)
        header, offset = entity_reader(schema.__header_schema__)(frame, 0)  # (a reader gives the bytes it read)
        body, _ = entity_reader(schema)(frame, offset)
    except UnknownEntity as err:
        raise ProtocolError(f"{api_key_map[api_key]} v{api_version}: {err}") from None
    except Exception as err:  # noqa: BLE001 - whatever a malformed body raises in the reader
        raise ProtocolError(f"a malformed {api_key_map[api_key]} v{api_version} request: {err!r}") from None
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A response entity in its frame: size, the response header its version takes, the body."""
    header = response.__header_schema__(correlation_id=i32(correlation_id))
    buffer = io.BytesIO()
    entity_writer(type(header))(buffer, header)
    entity_writer(type(response))(buffer, response)
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def build(schema: type, **values: Any) -> Any:
    """An entity of `schema` (one version's dataclass) from `values`, keeping the fields this
    version has (a field added in a later version is left out, one with a default may be omitted)."""
    names = {f.name for f in fields(schema)}
    return schema(**{k: v for k, v in values.items() if k in names})


def api_versions_response(version: int, served: dict[int, tuple[int, int]] = SERVED,
                          error: ErrorCode = ErrorCode.none) -> Any:
    """ApiVersionsResponse in `version`: the APIs the door serves, each with its version range."""
    schema = load_response_schema(API_VERSIONS, version)
    entry = nested(schema, "api_keys")
    keys = tuple(entry(api_key=i16(k), min_version=i16(low), max_version=i16(high))
                 for k, (low, high) in sorted(served.items()))
    return build(schema, error_code=error, api_keys=keys, throttle_time=i32Timedelta.parse(timedelta(0)))


def unsupported_api_versions_response(served: dict[int, tuple[int, int]] = SERVED) -> Any:
    """The answer to ApiVersions in a version the door does not serve (KIP-511): v0, with
    UNSUPPORTED_VERSION and the versions it does serve."""
    return api_versions_response(0, served, ErrorCode.unsupported_version)


def nested(schema: type, field_name: str) -> type:
    """The entity type of a schema's tuple field (`api_keys` -> ApiVersion), from its module."""
    hint = typing.get_type_hints(schema, vars(sys.modules[schema.__module__]))[field_name]
    (inner, _) = typing.get_args(hint)
    assert is_dataclass(inner)
    return inner
