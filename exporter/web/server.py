"""The listener: aiohttp's HTTP/1.1 server behind a thin guard that bounds slow and excess clients.

aiohttp closes a connection that stays idle between requests for `IDLE_SECONDS`, but a client
that trickles a request header a byte at a time is not idle, and could hold its connection for as
long as it likes. The guard gives every request `HEADER_SECONDS` from its first byte to the end
of its header, after which the connection is closed (a connection that sends nothing at all is
idle, and closed after `IDLE_SECONDS`); a TLS handshake gets `TLS_HANDSHAKE_SECONDS`; at most
`MAX_CONNECTIONS` are open at once (more are closed on arrival); and the request line and
headers are capped in size (aiohttp answers 400).
The response's own write is bounded in `exporter.web.security`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from yarl import URL

if TYPE_CHECKING:
    import ssl

HEADER_SECONDS: Final = 10.0
IDLE_SECONDS: Final = 75.0
TLS_HANDSHAKE_SECONDS: Final = 10.0
MAX_CONNECTIONS: Final = 4096
RUNNER_LIMITS: Final[dict[str, Any]] = {
    "keepalive_timeout": IDLE_SECONDS,
    "max_line_size": 4096,
    "max_field_size": 4096,
    "max_headers": 64,
    "lingering_time": 2.0,
}
"""aiohttp's own limits, passed to `web.AppRunner`."""


class Connections:
    """The open connections' guards, found by transport (the request handler knows only that),
    and the sweep that closes those whose request header is overdue."""

    def __init__(self, *, header_seconds: float = HEADER_SECONDS, limit: int = MAX_CONNECTIONS):
        self.header_seconds = header_seconds
        self.limit = limit
        self._open: dict[asyncio.BaseTransport, _Guard] = {}
        self.closed_slow = 0
        """Connections closed for taking too long to send a request header."""
        self.refused = 0
        """Connections closed on arrival because `limit` were open."""

    def __len__(self) -> int:
        return len(self._open)

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        guard = self._open.get(transport) if transport is not None else None
        if guard is not None:
            guard.header_since = None
            guard.in_request = True

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        guard = self._open.get(transport) if transport is not None else None
        if guard is not None:
            guard.in_request = False  # the next request's header is timed from its first byte

    async def sweep(self) -> None:
        """Close connections whose header is overdue, a few times per `header_seconds`: one
        timestamp per request instead of a timer per request on the scrape path."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.header_seconds / 4)
            overdue = loop.time() - self.header_seconds
            for transport, guard in list(self._open.items()):
                since = guard.header_since
                if since is not None and since < overdue and not guard.in_request:
                    self.closed_slow += 1
                    guard.header_since = None
                    transport.close()

    def _add(self, transport: asyncio.BaseTransport, guard: _Guard) -> bool:
        if len(self._open) >= self.limit:
            self.refused += 1
            return False
        self._open[transport] = guard
        return True

    def _remove(self, transport: asyncio.BaseTransport) -> bool:
        return self._open.pop(transport, None) is not None


class _Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's request handler, passing every call through,
    and notes when a request's first byte arrived."""

    __slots__ = ("_connections", "_inner", "_loop", "_transport", "header_since", "in_request")

    def __init__(self, inner: asyncio.Protocol, connections: Connections) -> None:
        self._inner = inner
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.BaseTransport | None = None
        self.header_since: float | None = None
        self.in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if not self._connections._add(transport, self):
            transport.close()
            return
        self._inner.connection_made(transport)  # idle until the first byte: aiohttp's timeout

    def data_received(self, data: bytes) -> None:
        if self.header_since is None and not self.in_request:
            self.header_since = self._loop.time()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None and self._connections._remove(self._transport):
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """`web.TCPSite`, with every connection behind a `_Guard` and a bounded TLS handshake."""

    __slots__ = ("_connections", "_host", "_port", "_sweep")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        connections: Connections,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._connections = connections
        self._sweep: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return str(URL.build(scheme=scheme, host=self._host or "0.0.0.0", port=self._port))  # noqa: S104 - a name, not a bind

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        connections = self._connections
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guard(server(), connections),
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=TLS_HANDSHAKE_SECONDS if self._ssl_context else None,
            reuse_address=True,
        )
        self._sweep = asyncio.create_task(connections.sweep(), name="gpuscope-header-sweep")

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        await super().stop()
