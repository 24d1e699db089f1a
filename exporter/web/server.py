"""The listener: aiohttp's HTTP/1.1 server behind a thin guard that bounds slow and excess clients.

aiohttp closes a connection that stays idle between requests for `IDLE_SECONDS`, but a client
that trickles a request header a byte at a time is not idle, and could hold its connection for as
long as it likes. The guard gives every request `HEADER_SECONDS` from its first byte (or from the
connection's opening) to the end of its header, after which the connection is closed; a TLS
handshake gets `TLS_HANDSHAKE_SECONDS`; at most `MAX_CONNECTIONS` are open at once (more are
closed on arrival); and the request line and headers are capped in size (aiohttp answers 400).
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
    """The open connections' guards, found by transport (the request handler knows only that)."""

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
            guard.request_started()

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        guard = self._open.get(transport) if transport is not None else None
        if guard is not None:
            guard.request_finished()


class _Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's request handler, passing every call through."""

    __slots__ = ("_connections", "_handle", "_in_request", "_inner", "_transport")

    def __init__(self, inner: asyncio.Protocol, connections: Connections) -> None:
        self._inner = inner
        self._connections = connections
        self._transport: asyncio.BaseTransport | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if len(self._connections) >= self._connections.limit:
            self._connections.refused += 1
            transport.close()
            return
        self._connections._open[transport] = self
        self._arm()  # the first request's header must arrive in time too
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._handle is None and not self._in_request:
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if (
            self._transport is not None
            and self._connections._open.pop(self._transport, None) is not None
        ):
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        self._in_request = True
        self._disarm()

    def request_finished(self) -> None:
        self._in_request = False  # the next request's header is timed from its first byte

    def _arm(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(
            self._connections.header_seconds, self._expire
        )

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        if self._transport is not None and not self._in_request:
            self._connections.closed_slow += 1
            self._transport.close()


class GuardedSite(web.BaseSite):
    """`web.TCPSite`, with every connection behind a `_Guard` and a bounded TLS handshake."""

    __slots__ = ("_connections", "_host", "_port")

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
