"""HTTP/1.1 as the daemon speaks it: the wire format byte by byte (`exporter.web.http`), then the
listener (`exporter.web.server`) in-process on a loopback port with raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import random
import re
from typing import TYPE_CHECKING

import pytest

from exporter.web.http import (
    MAX_BODY,
    BadRequest,
    Body,
    Request,
    Response,
    accepts_gzip,
    encode_head,
    head_end,
    parse_head,
    routed,
)
from exporter.web.server import Connections, Listener

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.timeout(30)


def parsed(data: bytes) -> Request:
    buffer = bytearray(data)
    end = head_end(buffer)
    assert end > 0
    return parse_head(bytes(buffer[: end - 4]))


def _read(data: bytes) -> None:
    """Parse a request and drop its body, as the listener does."""
    buffer = bytearray(data)
    end = head_end(buffer)
    if end > 0:
        request = parse_head(bytes(buffer[: end - 4]))
        del buffer[:end]
        if request.body is not None:
            request.body.consume(buffer)


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
    assert head_end(bytearray(b"GET / HTTP/1.1\r\nHost: x\r\n")) == -1
    with pytest.raises(BadRequest):
        head_end(bytearray(b"GET / HTTP/1.1\r\nX: " + b"a" * 5000))  # no end in sight
    with pytest.raises(BadRequest):
        head_end(bytearray(b"GET / HTTP/1.1\nHost"))


def _trickled(data: bytes, sizes: random.Random) -> tuple[int, str]:
    """`head_end` over `data` arriving in pieces of random sizes, as the listener calls it:
    where the head ends, or the mistake."""
    buffer = bytearray()
    checked = 0
    while data:
        size = sizes.randint(1, 7)
        buffer += data[:size]
        data = data[size:]
        try:
            end = head_end(buffer, checked)
        except BadRequest as error:
            return -2, error.kind
        if end >= 0:
            return end, ""
        checked = len(buffer)
    return -1, ""


@pytest.mark.parametrize("name", [*MALFORMED, "whole"])
def test_a_head_checked_piece_by_piece_is_judged_as_a_whole(name: str) -> None:
    data = MALFORMED[name][0] if name in MALFORMED else b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        whole = (head_end(bytearray(data)), "")
    except BadRequest as error:
        whole = (-2, error.kind)
    sizes = random.Random(name)
    for _ in range(20):
        assert _trickled(data, sizes) == whole


def test_bodies_are_dropped_as_they_arrive() -> None:
    body = Body(5)
    buffer = bytearray(b"abc")
    assert not body.consume(buffer)
    buffer += b"deGET"
    assert body.consume(buffer)
    assert buffer == b"GET"
    chunked = Body()
    buffer = bytearray(b"3;ext=1\r\nab")
    assert not chunked.consume(buffer)
    buffer += b"c\r\n0\r\nTrailer: t\r\n\r\nnext"
    assert chunked.consume(buffer)
    assert buffer == b"next"


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
