"""The listener: aiohttp's HTTP/1.1 server behind a thin guard that bounds slow and excess clients.

aiohttp closes a connection that stays idle between requests for `IDLE_SECONDS`, but a client
that trickles a request header a byte at a time is not idle, and could hold its connection for as
long as it likes. The guard gives every request `HEADER_SECONDS` from its first byte to the end
of its header, after which the connection is closed (a connection that sends nothing at all is
idle, and closed after `IDLE_SECONDS`); a TLS handshake gets `TLS_HANDSHAKE_SECONDS`; and the
request line and headers are capped in size (aiohttp answers 400).

At most `MAX_CONNECTIONS` are open at once (fewer if the open-file limit cannot be raised to fit
them). A new connection past the cap is not refused: the open connection that has gone longest
without a request being answered on it — idle, or trickling a header — is closed to make room.
So a crowd of idle connections can never shut out the kubelet's probes or Prometheus; only a
connection whose request is being answered is never closed (and those are bounded by
`--web.max-requests`, the probes aside).

A request aiohttp refuses as malformed (400) is the client's mistake, not the server's error: it
is counted, and logged at debug level at most once per `BAD_REQUEST_LOG_SECONDS`, by the kind of
mistake only. aiohttp's own message quotes the request's bytes, an `Authorization` header
included, and is never logged.
The response's own write is bounded in `exporter.web.security`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import resource
import signal
import socket
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

if TYPE_CHECKING:
    import ssl
    from pathlib import Path

    from exporter.settings import ListenAddress
    from exporter.web.security import WebSecurity

log = logging.getLogger(__name__)

HEADER_SECONDS: Final = 10.0
IDLE_SECONDS: Final = 75.0
TLS_HANDSHAKE_SECONDS: Final = 10.0
MAX_CONNECTIONS: Final = 4096
BACKLOG: Final = 1024
"""Connections the kernel holds for the listener to accept: a burst of new connections past it
costs the next one (a probe's, say) a SYN retransmitted a second later. asyncio's default is 100."""
SPARE_FILES: Final = 256
"""Open files kept for everything but client connections (files, the API server, NVML)."""
BAD_REQUEST_LOG_SECONDS: Final = 60.0
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
    least recently answered first; the sweep that closes those whose request header is overdue;
    and the listener's counts. Event loop only, but for the counts, which the sampler thread
    reads (each an int, replaced whole)."""

    def __init__(self, *, header_seconds: float = HEADER_SECONDS, limit: int = MAX_CONNECTIONS):
        self.header_seconds = header_seconds
        self.limit = limit
        self._open: OrderedDict[asyncio.BaseTransport, _Guard] = OrderedDict()
        self._closing: set[asyncio.BaseTransport] = set()
        self.closed_slow = 0
        """Connections closed for taking too long to send a request header."""
        self.evicted = 0
        """Connections closed to make room for a new one when `limit` were open."""
        self.refused = 0
        """Connections closed on arrival: `limit` were open, each with a request being answered."""
        self.bad_requests = 0
        """Requests refused as malformed (400)."""
        self.request_log = RequestLog(self)

    def __len__(self) -> int:
        return len(self._open)

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        guard = self._open.get(transport) if transport is not None else None
        if guard is not None:
            guard.header_since = None
            guard.in_request = True

    def request_finished(self, transport: asyncio.BaseTransport | None) -> None:
        guard = self._open.get(transport) if transport is not None else None
        if transport is not None and guard is not None:
            guard.in_request = False  # the next request's header is timed from its first byte
            self._open.move_to_end(transport)  # the last to make room for a new connection

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
                    self._close(transport)

    def _add(self, transport: asyncio.BaseTransport, guard: _Guard) -> bool:
        if len(self._open) >= self.limit:
            victim = next((t for t, g in self._open.items() if not g.in_request), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            self._close(victim)
        self._open[transport] = guard
        return True

    def _close(self, transport: asyncio.BaseTransport) -> None:
        """Close now; it stops counting against the cap at once, not when the loop gets to
        `connection_lost`."""
        del self._open[transport]
        self._closing.add(transport)
        transport.close()

    def _remove(self, transport: asyncio.BaseTransport) -> bool:
        if self._open.pop(transport, None) is not None:
            return True
        if transport in self._closing:
            self._closing.discard(transport)
            return True
        return False

    def fit_open_files(self) -> None:
        """Raise the open-file limit to what `limit` connections need if the hard limit allows;
        else lower `limit` to fit. Past the open-file limit the listener could not accept at
        all (asyncio stops accepting for a second at EMFILE, the probes' connections too)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = self.limit + SPARE_FILES
        if soft == resource.RLIM_INFINITY or soft >= wanted:
            return
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        if soft < wanted:
            self.limit = max(soft - SPARE_FILES, soft // 2)
            log.warning(
                "open connections capped by the open-file limit (ulimit -n)",
                extra={"max_connections": self.limit, "open_files": soft},
            )


class RequestLog(logging.Logger):
    """aiohttp's server logger for one listener (its request handler's `logger`): requests it
    refuses as malformed are counted, and logged at debug level at most once per
    `BAD_REQUEST_LOG_SECONDS` by the kind of mistake only; everything else goes on to aiohttp's
    own logger, at its level."""

    def __init__(self, connections: Connections) -> None:
        super().__init__("aiohttp.server")
        self.parent = logging.getLogger("aiohttp.server")
        self._connections = connections
        self._logged_at = -math.inf
        self._unlogged = 0

    def isEnabledFor(self, level: int) -> bool:  # noqa: ARG002, N802 - logging's name
        """Every record reaches `handle`, which counts refusals whatever the log level."""
        return True

    def handle(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            self._bad_request(error)
        elif record.levelno >= self.getEffectiveLevel():
            super().handle(record)

    def _bad_request(self, error: HttpProcessingError) -> None:
        self._connections.bad_requests += 1
        self._unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= BAD_REQUEST_LOG_SECONDS:
            log.debug(
                "malformed requests refused (400)",
                extra={"requests": self._unlogged, "last": type(error).__name__},
            )
            self._logged_at, self._unlogged = now, 0


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
        connections.fit_open_files()

        def guarded() -> _Guard:
            handler = server()
            handler.logger = connections.request_log
            return _Guard(handler, connections)

        self._server = await asyncio.get_running_loop().create_server(
            guarded,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=TLS_HANDSHAKE_SECONDS if self._ssl_context else None,
            reuse_address=True,
            backlog=BACKLOG,
        )
        self._sweep = asyncio.create_task(connections.sweep(), name="gpuscope-header-sweep")

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        await super().stop()


class CannotListen(Exception):
    """The server cannot listen where it was told. `status` is the exit status: 2 where the
    address does not resolve (a mistake in the settings), 1 otherwise (the port is taken, or
    not ours to take: the machine's state)."""

    def __init__(self, address: ListenAddress, error: OSError) -> None:
        if isinstance(error, socket.gaierror):
            reason = (error.strerror or "").lower() or "no such host"
            super().__init__(f"cannot listen on {address}: the address does not resolve ({reason})")
            self.status = 2
        else:
            reason = os.strerror(error.errno).lower() if error.errno else str(error)
            super().__init__(f"cannot listen on {address}: {reason}")
            self.status = 1


async def resolve(address: ListenAddress) -> None:
    """Check, before anything starts, that the address resolves. Raises `CannotListen`."""
    try:
        await asyncio.get_running_loop().getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as error:
        raise CannotListen(address, error) from error


async def listen(runner: web.AppRunner, address: ListenAddress, security: WebSecurity) -> str:
    """Start the guarded site of a set-up runner; the addresses it listens on, as one string.
    Raises `CannotListen` (the runner cleaned up)."""
    site = GuardedSite(
        runner,
        address.host,
        address.port,
        connections=security.connections,
        ssl_context=security.ssl_context,
    )
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise CannotListen(address, error) from error
    return ", ".join(_shown(bound) for bound in runner.addresses)


async def serve_until_stopped(
    runner: web.AppRunner,
    security: WebSecurity,
    web_config_file: Path | None,
    logger: logging.Logger,
) -> None:
    """Serve until SIGTERM or SIGINT, reloading the web config file on SIGHUP; then stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    reloads: set[asyncio.Task[bool]] = set()

    def reload() -> None:
        if web_config_file is None:
            logger.info("SIGHUP: no --web.config.file to reload")
            return
        task = asyncio.create_task(security.reload(reason="SIGHUP"))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    await stop.wait()
    logger.info("stopping")
    await runner.cleanup()
    logger.info("stopped")


def _shown(bound: object) -> str:
    if isinstance(bound, tuple) and len(bound) >= 2:  # (host, port, ...)
        host, port = bound[0], bound[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(bound)
