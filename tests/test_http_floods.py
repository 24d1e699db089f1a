"""The listener's memory and room under connection floods (issue 27's adversarial pass): half-open
TLS handshakes, heads trickled and never finished (plain and TLS), and clients that pipeline
requests and never read the answers. Each runs an in-process `Listener` and counts what it holds
(connections, bytes of buffers, TLS states); the resident memory of a whole daemon under the same
floods at 4,096 connections is `benchmarks/web_floods.py`'s."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
from typing import TYPE_CHECKING

import pytest
import trustme

from exporter.web.http import Request, RequestReader, Response, routed
from exporter.web.server import Connections, Listener, _Connection
from exporter.web.transport import MAX_HANDSHAKES, PLAIN_SIZE, READ_SIZE, Stream, _Tls
from tests.helpers import eventually_async

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.timeout(60)

BIG = bytes(2**20)
HEAD = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 4000 + b"\r\n"
"""The start of a head that never ends."""


async def _ok(_request: Request) -> Response:
    return Response.text("ok\n")


async def _big(_request: Request) -> Response:
    return Response(body=BIG, content_type="application/octet-stream")


@pytest.fixture
def pki() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context and a client context that trusts it."""
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


@pytest.fixture
async def listen() -> AsyncIterator[Callable[..., Awaitable[tuple[Listener, int]]]]:
    listeners: list[Listener] = []

    async def start(
        connections: Connections, server: ssl.SSLContext | None = None
    ) -> tuple[Listener, int]:
        listener = Listener(routed({"/": _ok, "/big": _big}), connections, server)
        await listener.start("127.0.0.1", 0)
        listeners.append(listener)
        return listener, listener.addresses[0][1]

    yield start
    for listener in listeners:
        await listener.stop(1.0)


def _connect(port: int, client: ssl.SSLContext | None, *, receive: int = 0) -> socket.socket:
    """A blocking connection (TLS: handshaken); `receive`: a small receive buffer."""
    sock = socket.socket()
    if receive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive)
    sock.connect(("127.0.0.1", port))
    if client is None:
        return sock
    return client.wrap_socket(sock, server_hostname="localhost")


def _ask(port: int, client: ssl.SSLContext | None) -> bytes:
    """A whole request on a new connection: the answer's status line."""
    with _connect(port, client) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(4096):
                answer += chunk
    return answer.partition(b"\r\n")[0]


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (what it sent before is read past)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True  # reset
    return True


def _held(connections: Connections) -> int:
    """Bytes of requests not answered yet the open connections buffer."""
    return sum(len(connection._buffer) for connection in connections._open.values())


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_closed_connections_leave_nothing_to_the_cycle_collector(  # type: ignore[no-untyped-def]
    listen, pki, tls: bool
) -> None:
    """Connections that trickled part of a head and left are freed as they close: nothing of
    them (connection, stream, parser, TLS state, buffer) waits for the cycle collector, which in
    a mostly idle daemon runs minutes later (279 MiB were still resident 60 s after a flood)."""
    server, client = pki
    connections = Connections()
    _, port = await listen(connections, server if tls else None)
    gc.collect()
    gc.disable()
    try:

        def trickle() -> list[socket.socket]:
            socks = [_connect(port, client if tls else None) for _ in range(20)]
            for sock in socks:
                sock.sendall(HEAD)
            return socks

        socks = await asyncio.to_thread(trickle)
        await eventually_async(
            lambda: _held(connections) == 20 * len(HEAD), 10, "every head buffered"
        )
        for sock in socks:
            sock.close()
        await eventually_async(lambda: len(connections) == 0, 10, "every connection closed")
        await asyncio.sleep(0)  # connection_lost runs a pass after the close
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = (_Connection, Stream, RequestReader, _Tls, ssl.SSLObject)
        left = [type(found).__name__ for found in gc.garbage if isinstance(found, kinds)]
        heads = [found for found in gc.garbage if isinstance(found, bytearray) and found]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
    assert heads == []


async def test_unfinished_heads_are_held_within_a_budget_oldest_closed_first(listen) -> None:  # type: ignore[no-untyped-def]
    """Past `max_buffered` bytes of unfinished requests (a head being read counts twice: its
    bytes and its fields parsed so far), the connection whose head began longest ago is closed:
    the bytes held stay within the budget (4,096 heads of up to 32 KiB would be 128 MiB, twice),
    and a whole request is served meanwhile."""
    connections = Connections()
    connections.max_buffered = 20 * len(HEAD)
    _, port = await listen(connections)
    socks = []
    for number in range(30):
        sock = await asyncio.to_thread(_connect, port, None)
        sock.sendall(HEAD)
        socks.append(sock)
        # Each head counted before the next (held, or freed by closing an older one).
        sent = (number + 1) * len(HEAD)
        await eventually_async(
            lambda: _held(connections) + connections.evicted * len(HEAD) == sent,  # noqa: B023
            10,
            "the head buffered",
        )
    assert _held(connections) <= connections.max_buffered
    assert connections.buffered <= connections.max_buffered
    closed = [_closed_by_server(sock) for sock in socks]
    kept = closed.count(False)
    assert closed == [True] * (30 - kept) + [False] * kept, "the oldest heads closed"
    assert 0 < kept < 30
    assert await asyncio.to_thread(_ask, port, None) == b"HTTP/1.1 200 OK"
    for sock in socks:
        sock.close()
    await eventually_async(lambda: len(connections) == 0, 10, "every connection closed")
    assert connections.buffered == 0


async def test_half_open_tls_handshakes_are_capped_oldest_closed_first(listen, pki) -> None:  # type: ignore[no-untyped-def]
    """Clients that send a ClientHello and never finish hold OpenSSL's mid-handshake state
    (about 48 KiB each): at most `MAX_HANDSHAKES` are under way, the oldest closed for a new one,
    and a real client's handshake still succeeds."""
    server, client = pki
    connections = Connections()
    _, port = await listen(connections, server)
    flood = MAX_HANDSHAKES + 40

    def hellos() -> list[socket.socket]:
        socks = []
        for _ in range(flood):
            outgoing = ssl.MemoryBIO()
            session = client.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
            with contextlib.suppress(ssl.SSLWantReadError):
                session.do_handshake()
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(outgoing.read())
            socks.append(sock)
        return socks

    def under_way() -> int:
        return sum(
            stream._tls is not None and not stream._tls.handshaken for stream in connections._open
        )

    socks = await asyncio.to_thread(hellos)
    await eventually_async(
        lambda: under_way() + connections.evicted == flood, 20, "every ClientHello read"
    )
    assert under_way() == MAX_HANDSHAKES
    closed = await asyncio.to_thread(lambda: [_closed_by_server(sock) for sock in socks])
    assert closed == [True] * 40 + [False] * MAX_HANDSHAKES, "the oldest closed"
    assert await asyncio.to_thread(_ask, port, client) == b"HTTP/1.1 200 OK"
    for sock in socks:
        sock.close()
    await eventually_async(lambda: len(connections.handshakes) == 0, 10, "every handshake ended")


def _stall(port: int, client: ssl.SSLContext | None, requests: bytes) -> socket.socket:
    """A connection that pipelines `requests` and never reads."""
    sock = _connect(port, client, receive=4096)
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError, ssl.SSLWantWriteError):
        sock.sendall(requests)
    return sock


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_stalled_readers_filling_the_cap_never_shut_out_a_probe(  # type: ignore[no-untyped-def]
    listen, pki, tls: bool
) -> None:
    """Connections whose answers wait for clients that never read fill the cap: a new
    connection (the kubelet's probe) closes the one stalled longest, past a short grace, instead
    of being closed on arrival."""
    server, client = pki
    connections = Connections(limit=12)
    connections.stalled_seconds = 0.2
    _, port = await listen(connections, server if tls else None)
    requests = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 50
    socks = [
        await asyncio.to_thread(_stall, port, client if tls else None, requests) for _ in range(12)
    ]
    await eventually_async(
        lambda: (
            len(connections) == 12
            and all(c.in_request and c._paused_writing for c in connections._open.values())
        ),
        20,
        "every answer waiting on its reader",
    )
    await asyncio.sleep(0.3)  # past the grace: each of them is fair game now
    for _ in range(5):
        assert await asyncio.to_thread(_ask, port, client if tls else None) == b"HTTP/1.1 200 OK"
    assert connections.refused == 0
    assert connections.evicted == 1, "one stalled connection closed; each probe then left"
    for sock in socks:
        sock.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_connection_being_answered_holds_at_most_one_read(  # type: ignore[no-untyped-def]
    listen, pki, tls: bool
) -> None:
    """Reading pauses as soon as a request is whole: a client pipelining 64 KiB of requests
    and never reading leaves at most one read of them in the connection's buffer (before, the
    next reads were appended too: up to 48 KiB). Over TLS, one read is what one decryption gives
    (4 KiB; the rest of the record waits in OpenSSL's read buffer, which holds it anyway)."""
    server, client = pki
    connections = Connections()
    _, port = await listen(connections, server if tls else None)
    request = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"
    requests = request * (64 * 1024 // len(request))
    socks = [
        await asyncio.to_thread(_stall, port, client if tls else None, requests) for _ in range(8)
    ]
    await eventually_async(
        lambda: (
            len(connections) == 8
            and all(c.in_request and c._paused_writing for c in connections._open.values())
        ),
        20,
        "every answer waiting on its reader",
    )
    await asyncio.sleep(0.2)  # what else the listener would read, it reads now
    held = [len(connection._buffer) for connection in connections._open.values()]
    assert max(held) <= (PLAIN_SIZE if tls else READ_SIZE), held
    for sock in socks:
        sock.close()


async def test_a_new_connection_among_stalled_readers_is_not_the_next_to_go(listen) -> None:  # type: ignore[no-untyped-def]
    """Past the cap, the connection that has waited longest goes: a probe that just came (not
    read yet, so not being answered) outlasts the stalled readers when more of them arrive."""
    connections = Connections(limit=12)
    connections.stalled_seconds = 0.2
    _, port = await listen(connections)
    requests = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 50
    socks = [await asyncio.to_thread(_stall, port, None, requests) for _ in range(12)]
    await eventually_async(
        lambda: (
            len(connections) == 12
            and all(c.in_request and c._paused_writing for c in connections._open.values())
        ),
        20,
        "every answer waiting on its reader",
    )
    await asyncio.sleep(0.3)  # past the grace
    probe = await asyncio.to_thread(_connect, port, None)
    await eventually_async(lambda: connections.evicted == 1, 10, "room made for the probe")
    socks += [await asyncio.to_thread(_stall, port, None, requests) for _ in range(3)]
    await eventually_async(lambda: connections.evicted == 4, 10, "room made for each")
    probe.settimeout(10)
    probe.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await asyncio.to_thread(probe.recv, 4096)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    for sock in [probe, *socks]:
        sock.close()


async def test_the_budget_held_by_answers_not_evictable_yet_closes_each_head_once(  # type: ignore[no-untyped-def]
    listen, caplog
) -> None:
    """Over the budget with stalled answers inside their grace (not evictable yet), a head that
    comes is closed, once, and nothing else: no error, and the stalled answers go on until
    their clients leave."""
    connections = Connections()
    connections.max_buffered = 1000
    connections.stalled_seconds = 60.0
    _, port = await listen(connections)
    requests = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 600
    with caplog.at_level(logging.DEBUG):
        socks = [await asyncio.to_thread(_stall, port, None, requests) for _ in range(2)]
        await eventually_async(
            lambda: len(connections) == 2 and connections.buffered > 1000,
            20,
            "the pipelined requests held",
        )
        heads = []
        for _ in range(3):
            sock = await asyncio.to_thread(_connect, port, None)
            sock.sendall(HEAD)
            heads.append(sock)
        await eventually_async(lambda: connections.evicted == 3, 10, "each head closed")
        assert len(connections) == 2
        for sock in [*socks, *heads]:
            sock.close()
        await eventually_async(lambda: len(connections) == 0, 10, "every connection closed")
        await asyncio.sleep(0.1)
        gc.collect()  # a pending task dropped would say so now
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert connections.buffered == 0


class _Holding:
    """A connection as the budget sees one: `size` bytes held, uncounted when it is let go."""

    def __init__(self, connections: Connections, size: int) -> None:
        self.connections = connections
        self.size = size
        connections.hold(size)

    def let_go(self) -> None:
        self.connections.hold(-self.size)
        self.size = 0

    def close(self) -> None:
        """Nothing to close: the budget's eviction only calls it."""


def test_the_budget_closes_thousands_of_connections_in_one_pass() -> None:
    """A budget overrun that takes thousands of connections to undo closes them one after the
    other: each closed connection uncounting its bytes does not start another pass (which
    recursed, one level per connection, to Python's recursion limit)."""
    connections = Connections()
    held = [_Holding(connections, 10) for _ in range(3000)]
    for holding in held:
        connections._open[holding] = holding  # type: ignore[index,assignment]
        connections.head_began(holding)  # type: ignore[arg-type]
    connections.max_buffered = 10
    connections.hold(0)
    assert connections.evicted == 2999
    assert connections.buffered == 10
    assert [holding.size for holding in held] == [0] * 2999 + [10], "the oldest closed"
