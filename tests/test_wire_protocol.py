"""The front door's protocol layer (pipeline/wire/, issue 51), over real sockets on 127.0.0.1:
ApiVersions in every version it serves, what a future client's version gets (KIP-511), and the
requests that close a connection (too large, unknown API, not served, malformed) without
stopping the server. Requests are written with kio's encoders, and the negotiation is also done by
kafka-python's own client."""

import io
import socket
import struct

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from pipeline.wire.protocol import MAX_REQUEST_BYTES, ProtocolError, read_size
from pipeline.wire.server import serve_kafka


@pytest.fixture
def server():
    running = serve_kafka(lambda request: None, port=0, max_request_bytes=1024)
    yield running
    running.shutdown()


def frame(api_key, version, correlation_id, **body):
    """A request frame written by kio: the header its version takes, then the body."""
    schema = load_request_schema(api_key, version)
    header = schema.__header_schema__(request_api_key=i16(api_key), request_api_version=i16(version),
                                      correlation_id=i32(correlation_id), client_id="test")
    buffer = io.BytesIO()
    entity_writer(type(header))(buffer, header)
    entity_writer(schema)(buffer, schema(**body))
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def exchange(port, data):
    """Sends `data`, returns the response frame's payload (b"" when the server closed instead)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        return _read_frame(conn)


def _read_frame(conn):
    prefix = _read_exactly(conn, 4)
    if len(prefix) < 4:
        return b""
    return _read_exactly(conn, struct.unpack(">i", prefix)[0])


def _read_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def api_versions(payload, version):
    schema = load_response_schema(18, version)
    header, offset = entity_reader(schema.__header_schema__)(payload, 0)
    body, _ = entity_reader(schema)(payload, offset)
    return header.correlation_id, body


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_api_versions_answers_in_the_version_asked_with_the_apis_served(server, version):
    body = {"client_software_name": "test", "client_software_version": "1"} if version >= 3 else {}
    correlation, response = api_versions(exchange(server.port, frame(18, version, 7 + version, **body)), version)
    assert correlation == 7 + version and response.error_code == ErrorCode.none
    assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [(18, 0, 3)]


def test_a_future_clients_api_versions_gets_v0_unsupported_version_and_the_versions_served(server):
    # KIP-511: the header of a version the server does not know cannot be read; its first fields can
    request = struct.pack(">hhi", 18, 9, 41) + b"\x00\x04test\x00\x00\x00"
    correlation, response = api_versions(exchange(server.port, struct.pack(">i", len(request)) + request), 0)
    assert correlation == 41 and response.error_code == ErrorCode.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [(18, 0, 3)]


def test_requests_it_cannot_serve_close_their_connection_and_the_server_goes_on(server):
    ok = frame(18, 3, 1, client_software_name="test", client_software_version="1")
    metadata = frame(3, 1, 2, topics=None)
    closes = {
        "too large": struct.pack(">i", 1025) + b"\x00" * 1025,  # over socket.request.max.bytes (1024 here)
        "negative size": struct.pack(">i", -1),
        "unknown API key": struct.pack(">ihhi", 8, 999, 0, 3),
        "not served (Metadata)": metadata,
        "shorter than a header": struct.pack(">i", 3) + b"\x00\x12\x00",
        "malformed body": ok[:4 + 10].replace(ok[:4], struct.pack(">i", 10)),
    }
    for why, data in closes.items():
        assert exchange(server.port, data) == b"", why
    # the same connection answers in order until a request closes it
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(ok + ok + metadata + ok)
        assert [api_versions(_read_frame(conn), 3)[0] for _ in range(2)] == [1, 1]
        assert _read_frame(conn) == b""
    assert api_versions(exchange(server.port, ok), 3)[1].error_code == ErrorCode.none


def test_the_size_limit_is_kafkas_socket_request_max_bytes_by_default():
    assert MAX_REQUEST_BYTES == 104_857_600
    assert read_size(struct.pack(">i", MAX_REQUEST_BYTES)) == MAX_REQUEST_BYTES
    with pytest.raises(ProtocolError, match="above socket.request.max.bytes"):
        read_size(struct.pack(">i", MAX_REQUEST_BYTES + 1))


def test_kafka_pythons_client_negotiates_the_versions_served(server):
    from kafka.net.compat import KafkaNetClient
    client = KafkaNetClient(bootstrap_servers=f"127.0.0.1:{server.port}")
    with pytest.raises(Exception):  # (its bootstrap asks for Metadata next, which is not served yet)
        client.check_version(timeout_ms=1500)
    assert client._manager.broker_version_data.api_versions == {18: (0, 3)}
