"""HTTP/1.1 as the daemon speaks it: the wire format byte by byte (`exporter.web.http`), then the
listener (`exporter.web.server`) in-process on a loopback port with raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import gzip
import logging
import os
import random
import re
import socket
import ssl
import struct
import tracemalloc
from typing import TYPE_CHECKING

import pytest
import trustme

from exporter.web.http import (
    MAX_BODY,
    BadRequest,
    Request,
    RequestReader,
    Response,
    accepts_gzip,
    encode_head,
    routed,
)
from exporter.web.server import Connections, Listener
from exporter.web.transport import Acceptor
from tests.helpers import eventually_async

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

pytestmark = pytest.mark.timeout(30)


def parsed(data: bytes) -> Request:
    request = RequestReader().head(bytearray(data))
    assert request is not None
    return request


def _read(data: bytes) -> None:
    """Parse a request and drop its body, as the listener does."""
    reader = RequestReader()
    buffer = bytearray(data)
    if reader.head(buffer) is not None:
        reader.body(buffer)


def refused(data: bytes) -> BadRequest:
    with pytest.raises(BadRequest) as raised:
        _read(data)
    return raised.value


# -- the wire format ------------------------------------------------------------------------------


def test_a_request_head() -> None:
    request = parsed(
        b"GET /m%65trics?x=1 HTTP/1.1\r\nHost: node:9455\r\nAccept: a\r\naccept:  b \r\n"
        b"Authorization: Basic eA==\r\n\r\n"
    )
    assert (request.method, request.path, request.query) == ("GET", "/metrics", "x=1")
    assert request.version == (1, 1)
    assert request.keep_alive
    assert request.header("ACCEPT") == "a, b"
    assert request.header("authorization") == "Basic eA=="
    assert request.body is None


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n", False),
        (b"GET / HTTP/1.0\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n", True),
    ],
)
def test_keep_alive(head: bytes, keep_alive: bool) -> None:
    assert parsed(head + b"\r\n").keep_alive is keep_alive


def test_an_absolute_target_is_its_path() -> None:
    assert parsed(b"GET http://node:9455/-/ready HTTP/1.1\r\nHost: node\r\n\r\n").path == "/-/ready"
    assert parsed(b"GET https://node HTTP/1.1\r\nHost: node\r\n\r\n").path == "/"


MALFORMED = {
    "no version": (b"GET /metrics\r\n\r\n", 400),
    "HTTP/0.9": (b"GET /metrics HTTP/0.9\r\n\r\n", 505),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    "a lowercase version": (b"GET / http/1.1\r\nHost: x\r\n\r\n", 400),
    "two spaces": (b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "non-ASCII target": (b"GET /m\xc3\xa9trics HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "a target that is not a path": (b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "a bad method": (b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "bare LF": (b"GET / HTTP/1.1\nHost: x\n\n", 400),
    "bare LF in one line": (b"GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", 400),
    "a control character": (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x01\r\n\r\n", 400),
    "a space before the colon": (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
    "a folded field": (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400),
    "a line over 4 KiB": (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 4100 + b"\r\n\r\n", 400),
    "65 fields": (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 64 + b"\r\n", 400),
    "no Host": (b"GET / HTTP/1.1\r\n\r\n", 400),
    "two Hosts": (b"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    "a bad Content-Length": (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    "Content-Lengths that differ": (
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\nab",
        400,
    ),
    "a signed Content-Length": (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\na", 400),
    "Content-Length and chunked": (
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        400,
    ),
    "chunked in HTTP/1.0": (b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    "a coding other than chunked": (
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        501,
    ),
    "a body over 64 KiB": (
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1),
        413,
    ),
    "chunks over 64 KiB": (
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10001\r\n",
        413,
    ),
    "a bad chunk size": (
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        400,
    ),
    "a chunk without its CRLF": (
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc\r\n",
        400,
    ),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_heads_are_refused_with_their_status(name: str) -> None:
    data, status = MALFORMED[name]
    error = refused(data)
    assert error.status == status


def test_an_incomplete_head_waits_and_a_hopeless_one_is_refused_early() -> None:
    assert RequestReader().head(bytearray(b"GET / HTTP/1.1\r\nHost: x\r\n")) is None
    with pytest.raises(BadRequest):
        RequestReader().head(bytearray(b"GET / HTTP/1.1\r\nX: " + b"a" * 5000))  # no end in sight
    with pytest.raises(BadRequest):
        RequestReader().head(bytearray(b"GET / HTTP/1.1\nHost"))


def judged(pieces: Iterable[bytes]) -> str:
    """How a request arriving in `pieces` is judged, read as the listener reads it: "whole" once
    it ended, the mistake if refused, "" while more is needed."""
    reader = RequestReader()
    buffer = bytearray()
    request = None
    try:
        for piece in pieces:
            buffer += piece
            if request is None:
                request = reader.head(buffer)
            if request is not None and reader.body(buffer):
                return "whole"
    except BadRequest as error:
        return error.kind
    return ""


def _trickled(data: bytes, sizes: random.Random) -> str:
    """`judged` over `data` arriving in pieces of random sizes."""
    pieces = []
    while data:
        size = sizes.randint(1, 7)
        pieces.append(data[:size])
        data = data[size:]
    return judged(pieces)


@pytest.mark.parametrize("name", [*MALFORMED, "whole"])
def test_a_head_checked_piece_by_piece_is_judged_as_a_whole(name: str) -> None:
    data = MALFORMED[name][0] if name in MALFORMED else b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    whole = judged([data])
    sizes = random.Random(name)
    for _ in range(20):
        assert _trickled(data, sizes) == whole


def test_bodies_are_dropped_as_they_arrive() -> None:
    reader = RequestReader()
    buffer = bytearray(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabc")
    assert reader.head(buffer) is not None
    assert not reader.body(buffer)
    buffer += b"deGET"
    assert reader.body(buffer)
    assert buffer == b"GET"
    buffer = bytearray(
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nab"
    )
    assert reader.head(buffer) is not None
    assert not reader.body(buffer)
    buffer += b"c\r\n0\r\nTrailer: t\r\n\r\nnext"
    assert reader.body(buffer)
    assert buffer == b"next"


def test_llhttp_is_handed_no_byte_past_the_request_being_read() -> None:
    """Pipelined requests wait as bytes: a malformed one behind a good one is not parsed (nor
    refused) until the good one has been read, nor is its Content-Length body."""
    reader = RequestReader()
    second = b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n"
    buffer = bytearray(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi" + second)
    request = reader.head(buffer)
    assert request is not None
    assert buffer == b"hi" + second
    assert reader.body(buffer)
    assert buffer == second
    with pytest.raises(BadRequest):
        reader.head(buffer)


def test_an_upgrade_is_ignored_and_one_with_a_body_refused() -> None:
    """The server never switches protocols: an Upgrade request is answered as any other and the
    next request read; one with a body is refused (llhttp would leave the body unread)."""
    reader = RequestReader()
    upgrade = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
    buffer = bytearray(upgrade + b"\r\nGET /-/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    first = reader.head(buffer)
    assert first is not None
    assert first.keep_alive
    assert reader.body(buffer)
    second = reader.head(buffer)
    assert second is not None
    assert second.path == "/-/ready"
    assert refused(upgrade + b"Content-Length: 2\r\n\r\nhi").status == 400


STRICTER = {
    "a method llhttp does not know": b"FOO /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "a lowercase method": b"get /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "HTTP/1.2": b"GET / HTTP/1.2\r\nHost: x\r\n\r\n",
    "Content-Length twice, equal": b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
    b"Content-Length: 1\r\n\r\na",
    "Content-Lengths listed, equal": b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 1\r\n\r\na",
}
"""What llhttp refuses that the parser before it took (answering 404 or 405, or serving it):
nothing a scraper, a probe or a browser sends."""


@pytest.mark.parametrize("name", STRICTER)
def test_llhttp_refuses_more_than_the_parser_before_it(name: str) -> None:
    assert refused(STRICTER[name]).status == (505 if name == "HTTP/1.2" else 400)


def test_a_response_head() -> None:
    request = parsed(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    head = encode_head(Response.text("ok\n", headers={"X-A": "b"}), request, close=False)
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    assert b"X-A: b" in lines
    assert b"Content-Length: 3" in lines
    assert b"Connection: keep-alive" in lines
    assert any(line.startswith(b"Date: ") and line.endswith(b" GMT") for line in lines)
    assert head.endswith(b"\r\n\r\n")
    closing = encode_head(Response(418), None, close=True)
    assert closing.startswith(b"HTTP/1.1 418 ")
    assert b"Connection: close" in closing


@pytest.mark.parametrize(
    ("header", "gzip_ok"),
    [
        ("", False),
        ("gzip", True),
        ("deflate, gzip", True),
        ("gzip;q=0", False),
        ("br", False),
        ("*", True),
        ("gzip;q=0.5", True),
    ],
)
def test_gzip_negotiation(header: str, gzip_ok: bool) -> None:
    assert accepts_gzip(header) is gzip_ok


# -- the listener ---------------------------------------------------------------------------------


async def _ok(_request: Request) -> Response:
    return Response.text("ok\n")


BIG = bytes(range(256)) * 4096  # 1 MiB: written in chunks


async def _big(_request: Request) -> Response:
    return Response(body=BIG, content_type="application/octet-stream")


async def _broken(_request: Request) -> Response:
    raise RuntimeError("a bug")


@pytest.fixture
async def listen() -> AsyncIterator[Callable[..., Awaitable[tuple[Listener, int]]]]:
    listeners: list[Listener] = []

    async def start(
        routes: dict[str, Callable[[Request], Awaitable[Response]]] | None = None,
        connections: Connections | None = None,
    ) -> tuple[Listener, int]:
        handler = routed(routes or {"/": _ok, "/big": _big, "/broken": _broken})
        listener = Listener(handler, connections if connections is not None else Connections())
        await listener.start("127.0.0.1", 0)
        listeners.append(listener)
        return listener, listener.addresses[0][1]

    yield start
    for listener in listeners:
        await listener.stop(1.0)


async def exchange(port: int, data: bytes, *, half_close: bool = True) -> bytes:
    """Send `data`, then read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    if half_close:
        writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def statuses(answer: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"^HTTP/1\.1 (\d{3}) ", answer, re.MULTILINE)]


async def test_pipelined_requests_are_answered_in_order(listen) -> None:  # type: ignore[no-untyped-def]
    _, port = await listen()
    answer = await exchange(
        port,
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
        b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # after close: never answered
    )
    assert statuses(answer) == [404, 405, 200, 200, 200]
    assert answer.endswith(b"Connection: close\r\n\r\nok\n")
    assert answer.count(b"ok\n") == 2, "HEAD has no body"


async def test_a_large_response_survives_a_slow_reader(listen) -> None:  # type: ignore[no-untyped-def]
    _, port = await listen()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
    writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"Content-Length: %d" % len(BIG) in head
    received = bytearray()
    while len(received) < len(BIG):
        received += await reader.read(4096)
        await asyncio.sleep(0)
    assert bytes(received) == BIG
    writer.close()


async def test_expect_100_continue(listen) -> None:  # type: ignore[no-untyped-def]
    _, port = await listen()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hi")
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
    writer.close()
    assert statuses(
        await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n")
    ) == [417]


async def test_a_failing_handler_gets_500_and_the_connection_goes_on(  # type: ignore[no-untyped-def]
    listen, caplog
) -> None:
    _, port = await listen()
    with caplog.at_level(logging.ERROR, logger="exporter.web.server"):
        answer = await exchange(
            port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
        )
    assert statuses(answer) == [500, 200]
    assert "a request handler failed" in caplog.text


async def test_malformed_requests_are_counted_and_closed(listen) -> None:  # type: ignore[no-untyped-def]
    connections = Connections()
    _, port = await listen(connections=connections)
    for data, status in MALFORMED.values():
        answer = await exchange(port, data)
        assert statuses(answer)[0] == status, data
        assert b"Connection: close" in answer
    assert connections.bad_requests == len(MALFORMED)


async def test_a_refused_request_is_answered_though_the_client_sends_more(listen) -> None:  # type: ignore[no-untyped-def]
    """The server closes after a refusal, reading what still comes, so the client that keeps
    sending gets the answer, not a reset."""
    _, port = await listen()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 5000)
    await writer.drain()
    writer.write(b"a" * 100_000 + b"\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    assert statuses(answer) == [400]
    writer.close()


async def test_idle_connections_are_closed(listen) -> None:  # type: ignore[no-untyped-def]
    connections = Connections(header_seconds=0.2)
    connections.idle_seconds = 0.4
    _, port = await listen(connections=connections)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200")
    assert await asyncio.wait_for(reader.read(), 5) == b"", "closed once idle"
    assert connections.closed_slow == 0, "idleness is no slowness"
    writer.close()


async def test_stopping_lets_a_request_being_answered_finish(listen) -> None:  # type: ignore[no-untyped-def]
    gate = asyncio.Event()

    async def slow(_request: Request) -> Response:
        await gate.wait()
        return Response.text("done\n")

    listener, port = await listen({"/slow": slow, "/": _ok})
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    pending = asyncio.create_task(exchange(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"))
    await asyncio.sleep(0.2)
    stopping = asyncio.create_task(listener.stop(5.0))
    assert await asyncio.wait_for(idle_reader.read(), 5) == b"", "an idle connection closes"
    gate.set()
    answer = await pending
    assert statuses(answer) == [200]
    assert b"Connection: close" in answer
    await stopping
    idle_writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_gzipped_bodies_are_what_the_handler_gave(listen) -> None:  # type: ignore[no-untyped-def]
    body = gzip.compress(b"metrics\n")

    async def zipped(_request: Request) -> Response:
        return Response(body=body, headers={"Content-Encoding": "gzip"})

    _, port = await listen({"/": zipped})
    answer = await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert gzip.decompress(answer.partition(b"\r\n\r\n")[2]) == b"metrics\n"


async def test_a_response_that_cannot_be_written_ends_only_its_connection(  # type: ignore[no-untyped-def]
    listen, caplog
) -> None:
    async def unencodable(_request: Request) -> Response:
        return Response.text("x", headers={"X-Name": "\u2603"})  # not Latin-1

    _, port = await listen({"/bad": unencodable, "/": _ok})
    with caplog.at_level(logging.ERROR, logger="exporter.web.server"):
        answer = await exchange(port, b"GET /bad HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer == b"", "aborted without an answer"
    assert "a response could not be written" in caplog.text
    assert statuses(await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")) == [200]


# -- the listener's own transports (exporter.web.transport) ----------------------------------------


@pytest.fixture
def pki() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context and a client context that trusts it."""
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


async def test_tls_pipelined_requests_and_a_large_response(listen, pki) -> None:  # type: ignore[no-untyped-def]
    """Over TLS as in plain: pipelined requests answered in order, a 1 MiB response intact to a
    reader that takes it 4 KiB at a time (encrypted a record at a time as the kernel takes it)."""
    server, client = pki
    listener = Listener(routed({"/": _ok, "/big": _big}), Connections(), server)
    await listener.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1",
            listener.addresses[0][1],
            ssl=client,
            server_hostname="localhost",
            limit=4096,
        )
        writer.write(
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /big HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = bytearray()
        while chunk := await asyncio.wait_for(reader.read(4096), 10):
            answer += chunk
        writer.close()
    finally:
        await listener.stop(1.0)
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3  # (the third starts right after BIG)
    assert BIG in answer
    assert answer.endswith(b"Connection: close\r\n\r\nok\n")


async def test_a_silent_tls_connection_counts_and_its_handshake_times_out(listen, pki) -> None:  # type: ignore[no-untyped-def]
    """A TLS connection that sends nothing holds no TLS state, counts against the cap at once,
    and is closed when the handshake deadline passes."""
    server, client = pki
    connections = Connections(header_seconds=0.2)
    connections.handshake_seconds = 0.3
    listener = Listener(routed({"/": _ok}), connections, server)
    await listener.start("127.0.0.1", 0)
    port = listener.addresses[0][1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await eventually_async(lambda: len(connections) == 1, 5, "the connection counted")
        (stream,) = connections._open
        assert stream.get_extra_info("ssl_object") is None, "no TLS state before a byte"
        assert await asyncio.wait_for(reader.read(), 5) == b"", "closed at the deadline"
        assert connections.closed_slow == 1
        writer.close()
        # a handshake that finishes in time is a connection like any
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="localhost"
        )
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert statuses(await asyncio.wait_for(reader.read(), 5)) == [200]
        writer.close()
    finally:
        await listener.stop(1.0)


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


MID = bytes(60 * 1024)


async def _mid(_request: Request) -> Response:
    return Response(body=MID)


async def test_clients_that_reset_are_no_error(listen, caplog) -> None:  # type: ignore[no-untyped-def]
    """Resets before, during and after a closing answer: nothing at info level or above, and
    the listener goes on."""
    _, port = await listen({"/mid": _mid, "/": _ok})
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.DEBUG):
        for number in range(60):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            close = b"Connection: close\r\n" if number % 3 == 0 else b""
            await loop.sock_sendall(sock, b"GET /mid HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n")
            if number % 3 != 2:
                await loop.sock_recv(sock, 100)
            _reset(sock)
        await asyncio.sleep(0.5)
        gc.collect()  # a task whose exception nobody retrieved says so when it is collected
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert statuses(await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")) == [200]


HUGE = bytes(16 * 2**20)  # more than the kernel's send buffer takes (4 MiB at most)


async def _huge(_request: Request) -> Response:
    return Response(body=HUGE, content_type="application/octet-stream")


async def test_a_response_is_written_by_reference(listen) -> None:  # type: ignore[no-untyped-def]
    """A client that stops reading holds a view of the handler's bytes, never a copy: a hundred
    of them waiting on the same 16 MiB body cost far less than one copy."""
    listener, port = await listen({"/huge": _huge})
    stalled = []
    for _ in range(100):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        stalled.append(sock)
    await asyncio.sleep(0.2)
    for sock in stalled:
        sock.send(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")
    tracemalloc.start()
    try:
        await eventually_async(
            lambda: sum(c.in_request for c in listener.connections._open.values()) == 100,
            10,
            "every response waiting on its reader",
        )
        await asyncio.sleep(0.2)
        traced, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        for sock in stalled:
            sock.close()
    assert traced < len(HUGE) // 4, f"{traced / 2**20:.1f} MiB traced"


class _FailingSocket:
    """A listening socket whose accept() fails `failures` times with `error`, then has nothing."""

    def __init__(self, real: socket.socket, error: int, failures: int) -> None:
        self.real = real
        self.error = error
        self.failures = failures
        self.accepts = 0

    def fileno(self) -> int:
        return self.real.fileno()

    def settimeout(self, value: float) -> None:
        self.real.settimeout(value)

    def close(self) -> None:
        self.real.close()

    def accept(self) -> tuple[socket.socket, object]:
        self.accepts += 1
        if self.failures:
            self.failures -= 1
            raise OSError(self.error, os.strerror(self.error))
        raise BlockingIOError


async def test_out_of_descriptors_makes_room_else_backs_off_with_one_line(caplog) -> None:
    """EMFILE: an idle connection closed makes room if there is one; else accepting pauses, 5 ms
    doubling, with one log line however often it happens."""
    real = socket.create_server(("127.0.0.1", 0))
    rooms = [True, True]
    failing = _FailingSocket(real, errno.EMFILE, 12)
    acceptor = Acceptor([failing], lambda _: None, lambda: bool(rooms) and rooms.pop())  # type: ignore[list-item]
    acceptor.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="exporter.web.transport"):
            # The socket never becomes readable by itself: poke accept as the loop would.
            for _ in range(12):
                acceptor._accept(failing)  # type: ignore[arg-type]
                await asyncio.sleep(0.06)
        assert failing.failures == 0
        assert acceptor.paused >= 3, "backed off once no idle connection was left"
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "too many open files (EMFILE)" in str(warnings[0].__dict__["error"])
    finally:
        acceptor.close()
