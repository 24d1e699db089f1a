"""One unary gRPC call over a unix socket: HTTP/2 with prior knowledge, spoken with `h2`.

gpuscope makes a single kind of gRPC call — the kubelet's PodResources `List`, every few
seconds — and the gRPC runtime costs far more than that: grpcio adds ~10 MiB of resident memory
and keeps polling threads busy while a channel is open. A unary call is small on the wire: a
HEADERS frame and one length-prefixed message out; response headers, the message, and trailers
carrying `grpc-status` back (or trailers alone when the call fails). The tests hold this client
against a real grpcio server.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Final

import h2.config
import h2.connection
import h2.events
import h2.exceptions

if TYPE_CHECKING:
    from pathlib import Path

STATUS_NAMES: Final = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
"""gRPC status codes by number, named as gRPC names them."""
_PREFIX: Final = 5
"""Each message is framed by a compressed flag (1 byte) and its length (4 bytes, big-endian)."""


class GrpcCallError(Exception):
    """The call failed; `code` is the gRPC status name (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, ...)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code


def unary_call(
    path: Path, method: str, request: bytes, *, timeout: float, max_response_bytes: int
) -> bytearray:
    """Send `request` to `method` (`/package.Service/Method`) on the server listening at the unix
    socket `path`; the serialized response message (the buffer it arrived in, not a copy).
    Raises `GrpcCallError`; `timeout` bounds the whole call, however the server trickles."""
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(str(path))
            return _exchange(connection, method, request, deadline, max_response_bytes)
    except TimeoutError as error:
        raise GrpcCallError("DEADLINE_EXCEEDED", f"no answer within {timeout:g}s") from error
    except OSError as error:
        raise GrpcCallError("UNAVAILABLE", error.strerror or str(error)) from error
    except h2.exceptions.ProtocolError as error:
        raise GrpcCallError("INTERNAL", f"HTTP/2 protocol error: {error}") from error


def _exchange(
    connection: socket.socket, method: str, request: bytes, deadline: float, limit: int
) -> bytearray:
    session = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    session.initiate_connection()
    stream = session.get_next_available_stream_id()
    milliseconds = max(int((deadline - time.monotonic()) * 1000), 1)
    session.send_headers(
        stream,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", f"{milliseconds}m"),
        ],
    )
    session.send_data(stream, b"\0" + len(request).to_bytes(4, "big") + request, end_stream=True)
    connection.sendall(session.data_to_send())

    body = bytearray()
    status: str | None = None
    detail = ""
    while True:
        for event in session.receive_data(_receive(connection, deadline)):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                headers = {
                    bytes(name).decode("latin-1"): bytes(value).decode("utf-8", "replace")
                    for name, value in event.headers
                }
                if headers.get(":status", "200") != "200":
                    raise GrpcCallError("UNAVAILABLE", f"HTTP status {headers[':status']}")
                if "grpc-status" in headers:
                    code = int(headers["grpc-status"])
                    status = STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"
                    detail = headers.get("grpc-message", "")
            elif isinstance(event, h2.events.DataReceived):
                body += event.data
                if len(body) > limit + _PREFIX:
                    raise GrpcCallError("RESOURCE_EXHAUSTED", f"answer over {limit} bytes")
                session.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                raise GrpcCallError("UNAVAILABLE", f"stream reset (error {event.error_code})")
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise GrpcCallError("UNAVAILABLE", "the server ended the connection")
            elif isinstance(event, h2.events.StreamEnded):
                return _message(body, status, detail)
        pending = session.data_to_send()
        if pending:
            connection.sendall(pending)


def _receive(connection: socket.socket, deadline: float) -> bytes:
    """What the server sent next, before `deadline` (a server sending a byte now and then must
    not hold the call for ever)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    connection.settimeout(left)
    data = connection.recv(65536)
    if not data:
        raise GrpcCallError("UNAVAILABLE", "the server closed the connection")
    return data


def _message(body: bytearray, status: str | None, detail: str) -> bytearray:
    if status is None:
        raise GrpcCallError("INTERNAL", "the answer ended without a grpc-status")
    if status != "OK":
        raise GrpcCallError(status, detail)
    if len(body) < _PREFIX:
        raise GrpcCallError("INTERNAL", "the answer carries no message")
    if body[0]:
        raise GrpcCallError("INTERNAL", "a compressed answer, which was not asked for")
    length = int.from_bytes(body[1:_PREFIX], "big")
    if len(body) != _PREFIX + length:
        raise GrpcCallError("INTERNAL", "the answer is not exactly one message")
    del body[:_PREFIX]  # in place: no second copy of an answer of up to 16 MiB
    return body
