"""The listener: HTTP/1.1 (`exporter.web.http`: requests parsed by llhttp) over the listener's own
sockets (`exporter.web.transport`: accepting, TLS, writes by reference), bounding slow and excess
clients.

Every request gets `HEADER_SECONDS` from its first byte to the end of its head and body, after
which the connection is closed; a connection that sends nothing between requests is idle, and
closed after `IDLE_SECONDS`; a TLS handshake gets `TLS_HANDSHAKE_SECONDS` from the connection's
arrival; a response must be written within `WRITE_SECONDS` (a client that stops reading is cut
off). One sweep a few times per `HEADER_SECONDS` checks the deadlines: a timestamp per request
on the scrape path, never a timer.

At most `MAX_CONNECTIONS` are open at once (fewer if the open-file limit cannot be raised to fit
them), TLS handshakes under way and connections lingering after their last answer included. A
new connection past the cap is not refused: a lingering connection, else the open connection that
has gone longest without a request being answered on it — idle, in its handshake, or trickling a
header — else the one whose answer has waited longest, at least `STALLED_SECONDS`, for a client
that does not read it, is closed to make room. So neither a crowd of idle connections nor one of
clients that ask and never read can shut out the kubelet's probes or Prometheus; only a request
being answered, or an answer being taken, is never closed for room. The same eviction frees a
descriptor when accepting fails for want of one (`EMFILE`). At most `MAX_HANDSHAKES` TLS
handshakes are under way at once (`exporter.web.transport.Handshakes`): one more closes the
oldest.

The bytes connections hold of requests not answered yet — a head trickling in, pipelined requests
waiting — are at most `MAX_BUFFERED` together: past it, the connection whose head began longest
ago is closed (else the one whose answer has waited longest for its reader), so a crowd trickling
heads of up to 32 KiB each costs a few MiB, not 32 KiB per connection up to the cap.

A request refused as malformed is the client's mistake, not the server's error: it is counted,
and logged at debug level at most once per `BAD_REQUEST_LOG_SECONDS`, by the kind of mistake
only — never its bytes, which may hold an `Authorization` header. The connection is then closed
after the answer, reading (and dropping) what the client still sends for up to `LINGER_SECONDS`
so that the answer is not lost to a reset. A client that resets or leaves is no error at all.

Requests on one connection are answered in order, one at a time: once a request is whole, the
socket is not read past what is already buffered until it is answered (pipelined requests wait in
the kernel), so a connection holds at most one read of requests, as bytes: the parser is handed
no byte past the request being read. A response is written by reference — the handler's bytes,
never a copy — so a client that stops reading holds a reference until the write deadline (TLS:
one record of ciphertext besides). A handler's exception is logged and answered 500; the
connection and the server go on.

Memory: a connection costs a socket and a few small objects until it sends, and its parser (an
llhttp state, about 1 KiB) only while it has a request to read: made at its first byte, dropped
once it is idle. A closed connection lets go of its buffer and parser at once, and its transport
of it (no reference cycle), so a flood's memory is freed as its connections close, not at the
cycle collector's next full pass. After a flood of connections closed (`TRIM_AFTER` fewer than
at the peak), the sweep hands the freed pages back to the system (`exporter.malloc.trim`), which
glibc would otherwise keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
from collections import OrderedDict
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

from exporter import malloc
from exporter.supervise import background_task
from exporter.web.http import (
    BadRequest,
    Handler,
    Request,
    RequestReader,
    Response,
    encode_head,
    expects_continue,
)
from exporter.web.transport import Acceptor, Handshakes, Scratch, Stream, bind

if TYPE_CHECKING:
    import socket
    import ssl


log = logging.getLogger(__name__)

HEADER_SECONDS: Final = 10.0
IDLE_SECONDS: Final = 75.0
TLS_HANDSHAKE_SECONDS: Final = 10.0
WRITE_SECONDS: Final = 30.0
LINGER_SECONDS: Final = 2.0
MAX_CONNECTIONS: Final = 4096
MAX_BUFFERED: Final = 8 * 2**20
"""Bytes of requests not answered yet the connections hold together (a real head is under 1 KiB)."""
STALLED_SECONDS: Final = 2.0
"""How long an answer waits for a client that does not read it before its connection may be
closed to make room (a reader that keeps up never waits this long)."""
SPARE_FILES: Final = 256
"""Open files kept for everything but client connections (files, the API server, NVML)."""
BAD_REQUEST_LOG_SECONDS: Final = 60.0
TRIM_AFTER: Final = 256
"""Connections gone since the peak after which the sweep trims the heap."""


class Connections:
    """The open connections, found by transport, least recently answered first; the sweep that
    closes those whose request or handshake is overdue or whose idleness ran out; and the
    listener's counts. Event loop only, but for the counts, which the sampler thread reads (each
    an int, replaced whole)."""

    def __init__(self, *, header_seconds: float = HEADER_SECONDS, limit: int = MAX_CONNECTIONS):
        self.header_seconds = header_seconds
        self.handshake_seconds = TLS_HANDSHAKE_SECONDS
        self.idle_seconds = IDLE_SECONDS
        self.limit = limit
        self.max_buffered = MAX_BUFFERED
        self.stalled_seconds = STALLED_SECONDS
        self.handshakes = Handshakes()
        self.buffered = 0
        """Bytes of requests not answered yet the connections hold."""
        self._shedding = False
        """`hold` is closing connections to get back under `max_buffered`."""
        self._open: OrderedDict[Stream, _Connection] = OrderedDict()
        self._lingering: OrderedDict[Stream, _Connection] = OrderedDict()
        """Half-closed after their last answer, dropping what the client still sends."""
        self._answering_now: set[Stream] = set()
        """Those of `_open` with a request being answered: past the cap, room is looked for
        among the others only while there are others (4,096 stalled readers, say, are not
        walked for each new connection)."""
        self._heads: OrderedDict[Stream, None] = OrderedDict()
        """Connections reading a request's head or body, the one begun longest ago first."""
        self._stalled: OrderedDict[Stream, float] = OrderedDict()
        """Connections whose answer waits for the client to read, since when, longest first."""
        self.stopping = False
        """The listener is stopping: every response closes its connection."""
        self._quiet = asyncio.Event()
        """Set, while stopping, once no request is being answered."""
        self.closed_slow = 0
        """Connections closed for taking too long to send a request (or finish a handshake)."""
        self._evicted = 0
        """Connections closed to make room for a new one, or to bring `buffered` back under
        `max_buffered`."""
        self.refused = 0
        """Connections closed on arrival: `limit` were open, each with a request being answered."""
        self.bad_requests = 0
        """Requests refused as malformed (400 and the like)."""
        self._logged_at = -math.inf
        self._unlogged = 0
        self._peak = 0
        """The most connections open since the heap was last trimmed."""

    def __len__(self) -> int:
        return len(self._open) + len(self._lingering)

    @property
    def evicted(self) -> int:
        """Connections closed to make room: for a new one past `limit`, a handshake past
        `handshakes.limit`, or bytes past `max_buffered`."""
        return self._evicted + self.handshakes.evicted

    def bad_request(self, kind: str) -> None:
        """Count a malformed request; log the count at debug level at most once per
        `BAD_REQUEST_LOG_SECONDS`, with the kind of the last one (never its bytes)."""
        self.bad_requests += 1
        self._unlogged += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= BAD_REQUEST_LOG_SECONDS:
            log.debug(
                "malformed requests refused (400)",
                extra={"requests": self._unlogged, "last": kind},
            )
            self._logged_at, self._unlogged = now, 0

    def request_began(self, transport: Stream) -> None:
        self._answering_now.add(transport)

    def request_finished(self, transport: Stream) -> None:
        self._answering_now.discard(transport)
        if transport in self._open:
            self._open.move_to_end(transport)  # the last to make room for a new connection
        self._check_quiet()

    def _check_quiet(self) -> None:
        if self.stopping and not self._answering():
            self._quiet.set()

    async def sweep(self) -> None:
        """Close connections whose request or handshake is overdue, or idle for too long, a few
        times per `header_seconds`; trim the heap after a flood."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(self.header_seconds, self.idle_seconds) / 4)
            try:
                self._sweep_once(loop.time())
                if self._peak - len(self) >= TRIM_AFTER:
                    self._peak = len(self)
                    await asyncio.to_thread(malloc.trim)
            except Exception:  # a bug here must not end the deadlines for good
                log.exception("the connection sweep failed; it goes on")

    def _sweep_once(self, now: float) -> None:
        for transport, connection in list(self._open.items()):
            if connection.in_request or transport not in self._open:
                continue
            handshake = transport.handshake_since
            if handshake is not None:
                if handshake < now - self.handshake_seconds:
                    self.closed_slow += 1
                    self._close(transport)
                continue
            since = connection.header_since
            if since is not None:
                if since < now - self.header_seconds:
                    self.closed_slow += 1
                    self._close(transport)
            elif connection.idle_since < now - self.idle_seconds:
                self._close(transport)

    def _add(self, transport: Stream, connection: _Connection) -> bool:
        if len(self) >= self.limit and not self.make_room():
            self.refused += 1
            return False
        self._open[transport] = connection
        self._peak = max(self._peak, len(self))
        return True

    def make_room(self) -> bool:
        """Close a lingering connection, else whichever has waited longer: the open one answered
        longest ago that has no request being answered (idle, in its handshake, or trickling a
        head), or the one whose answer has waited longest for its reader (at least
        `stalled_seconds`). So a connection that just came — the kubelet's probe among stalled
        readers — is not the first to go. Whether there was one."""
        victim = next(iter(self._lingering), None)
        if victim is not None:
            victim.abort()
            self._lingering.pop(victim)
            self._evicted += 1
            return True
        idle = None
        if len(self._answering_now) < len(self._open):
            idle = next(((t, c) for t, c in self._open.items() if not c.in_request), None)
        victim = self._longest_stalled()
        if idle is not None and (victim is None or idle[1].idle_since <= self._stalled[victim]):
            victim = idle[0]
        if victim is None:
            return False
        self._evicted += 1
        self._close(victim)
        return True

    def _longest_stalled(self) -> Stream | None:
        """The connection whose answer has waited longest for its reader, if that is at least
        `stalled_seconds`."""
        first = next(iter(self._stalled.items()), None)
        if first is None or first[1] > asyncio.get_running_loop().time() - self.stalled_seconds:
            return None
        return first[0]

    def hold(self, change: int) -> None:
        """A connection holds `change` more bytes of requests not answered yet; past
        `max_buffered`, close the connection whose head began longest ago, else the one whose
        answer has waited longest for its reader, until back under it (or none is left)."""
        self.buffered += change
        if self._shedding:
            return  # a connection closed below, uncounting its bytes: the loop below goes on
        self._shedding = True
        try:
            while self.buffered > self.max_buffered:
                victim = next(iter(self._heads), None)
                if victim is None:
                    victim = self._longest_stalled()
                if victim is None:
                    return
                self._evicted += 1
                self._close(victim)
        finally:
            self._shedding = False

    def head_began(self, transport: Stream) -> None:
        self._heads[transport] = None

    def head_ended(self, transport: Stream) -> None:
        self._heads.pop(transport, None)

    def stalled(self, transport: Stream) -> None:
        self._stalled[transport] = asyncio.get_running_loop().time()

    def unstalled(self, transport: Stream) -> None:
        self._stalled.pop(transport, None)

    def _close(self, transport: Stream) -> None:
        """Close now: its descriptor is freed at once, so it stops counting at once, and its
        buffer with it."""
        connection = self._open.pop(transport)
        self._forget(transport)
        connection.let_go()
        transport.close()

    def _forget(self, transport: Stream) -> None:
        """No longer a candidate for room or budget (before its bytes are uncounted, which may
        look for one)."""
        self._answering_now.discard(transport)
        self._heads.pop(transport, None)
        self._stalled.pop(transport, None)

    def _release(self, transport: Stream) -> None:
        """A connection lingering after its last answer: the first to make room."""
        connection = self._open.pop(transport, None)
        if connection is not None:
            self._lingering[transport] = connection

    def _remove(self, transport: Stream) -> None:
        self._open.pop(transport, None)
        self._lingering.pop(transport, None)
        self._forget(transport)
        self._check_quiet()

    def _answering(self) -> int:
        return sum(connection.in_request for connection in self._open.values())

    def _close_idle(self) -> None:
        for transport, connection in list(self._open.items()):
            if not connection.in_request:
                self._close(transport)

    def _abort_all(self) -> None:
        for transport, connection in [*self._open.items(), *self._lingering.items()]:
            connection.cancel()
            transport.abort()
        self._open.clear()
        self._lingering.clear()
        self._answering_now.clear()

    def fit_open_files(self) -> None:
        """Raise the open-file limit to what `limit` connections need if the hard limit allows;
        else lower `limit` to fit, so that accepting meets the cap (and evicts) before it meets
        the open-file limit."""
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


class _Connection(asyncio.Protocol):
    """One client connection: its requests parsed as they arrive, each answered by the handler
    in a task of its own, one at a time, the response written by reference under the write
    deadline."""

    __slots__ = (
        "_buffer",
        "_close_after",
        "_connections",
        "_handler",
        "_held",
        "_loop",
        "_paused_reading",
        "_paused_writing",
        "_reader",
        "_request",
        "_task",
        "_transport",
        "_writable",
        "header_since",
        "idle_since",
        "in_request",
        "lingering",
    )

    def __init__(self, handler: Handler, connections: Connections) -> None:
        self._handler = handler
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self._transport: Stream | None = None
        self._buffer = bytearray()
        self._held = 0
        """What `Connections.buffered` counts of this connection (`_account`)."""
        self._reader: RequestReader | None = None
        """The requests' parser, while the connection has one to read."""
        self._request: Request | None = None
        """A request whose body is still being read."""
        self._task: asyncio.Task[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused_writing = False
        self._paused_reading = False
        self._close_after = False
        self.header_since: float | None = None
        """When the first byte of the request being read arrived; None between requests."""
        self.idle_since = self._loop.time()
        self.in_request = False
        """A request is being answered: the connection is neither overdue nor evictable."""
        self.lingering = False

    # -- the transport's calls ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, Stream)
        self._transport = transport
        if not self._connections._add(transport, self):
            transport.close()

    def data_received(self, data: bytes | bytearray | memoryview) -> None:
        """`data` is the transport's shared buffer: it is copied into the connection's own. (No
        read comes while a request is answered: reading pauses once one is whole.)"""
        if self.lingering or self._transport is None:
            return
        if self.header_since is None:
            self._head_begins(self._loop.time())
        self._buffer += data
        self._advance()
        self._account()

    def eof_received(self) -> bool:
        """The client sent all it will (a FIN, or TLS's close_notify): the connection closes.
        It is read only while no request is being answered (reading pauses meanwhile), and every
        request it sent whole was answered already."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002 - asyncio's signature
        self._wake_writer()  # first: a response waiting to be written ends with the connection
        if self._transport is not None:
            self._connections._remove(self._transport)
        self.let_go()
        self._transport = None  # the transport points at this connection: no cycle

    def pause_writing(self) -> None:
        self._paused_writing = True
        if self.in_request and self._transport is not None:
            self._connections.stalled(self._transport)

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._transport is not None:
            self._connections.unstalled(self._transport)
        self._wake_writer()

    def let_go(self) -> None:
        """The connection is closed (and no longer a candidate for room or budget): free its
        buffer and parser now, and stop counting them."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._request = None
        self._buffer.clear()
        self._account()

    # -- requests -------------------------------------------------------------------------------

    def _account(self) -> None:
        """Count the buffer's bytes, and those of the head being read as parsed so far, in
        `Connections.buffered` (which may close connections, this one included, to stay under
        its budget)."""
        held = len(self._buffer)
        if self._reader is not None and self.header_since is not None:
            held += self._reader.parsed
        if held != self._held:
            change, self._held = held - self._held, held
            self._connections.hold(change)

    def _head_begins(self, now: float) -> None:
        self.header_since = now
        if self._transport is not None:
            self._connections.head_began(self._transport)

    def _head_ends(self) -> None:
        self.header_since = None
        if self._transport is not None:
            self._connections.head_ended(self._transport)

    def cancel(self) -> None:
        """Stop answering (the listener is stopping)."""
        if self._task is not None:
            self._task.cancel()

    def _advance(self) -> None:
        """Parse what the buffer holds; answer the first whole request."""
        transport = self._transport
        buffer = self._buffer
        if transport is None or transport.is_closing():
            return
        request = self._request
        reader = self._reader
        if reader is None:
            reader = self._reader = RequestReader()
        try:
            if request is None:
                request = reader.head(buffer)
                if request is None:
                    if not buffer:  # blank lines only, which come before a request: idle still
                        self._head_ends()
                        reader.close()
                        self._reader = None
                    return
                if expects_continue(request):
                    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self._request = request
            if not reader.body(buffer):
                return
        except BadRequest as error:
            self._refuse(error, request)
            return
        self._request = None
        self._answer(request)

    def _refuse(self, error: BadRequest, request: Request | None) -> None:
        """Answer a malformed request and close the connection."""
        self._connections.bad_request(error.kind)
        status = HTTPStatus(error.status)
        text = (
            "HTTP/1.0 or HTTP/1.1 requests only\n"
            if status == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED
            else f"{status.value} {status.phrase}\n"
        )
        response = Response.text(text, status)
        assert self._transport is not None
        self._transport.writelines((encode_head(response, request, close=True), response.body))
        self._linger()

    def _answer(self, request: Request) -> None:
        transport = self._transport
        assert transport is not None
        self.in_request = True
        self._connections.request_began(transport)
        self._head_ends()
        # The next request waits until this one is answered: read no more of them meanwhile.
        if not self._paused_reading:
            self._paused_reading = True
            transport.pause_reading()
        peer = transport.get_extra_info("peername")
        request.transport = transport
        request.remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._task = self._loop.create_task(self._respond(request))

    async def _respond(self, request: Request) -> None:
        try:
            try:
                response = await self._handler(request)
            except Exception:
                log.exception("a request handler failed", extra={"path": request.path})
                response = Response.text(
                    "500 Internal Server Error\n", HTTPStatus.INTERNAL_SERVER_ERROR
                )
            await self._send(request, response)
        except Exception:
            log.exception("a response could not be written", extra={"path": request.path})
            if self._transport is not None:
                self._transport.abort()
        self._finished()

    async def _send(self, request: Request, response: Response) -> None:
        """Write `response` within `WRITE_SECONDS`: the transport keeps a reference to its body
        until the kernel took it all."""
        transport = self._transport
        if transport is None:
            return
        self._close_after = (
            self._close_after
            or response.close
            or not request.keep_alive
            or self._connections.stopping
        )
        if transport.is_closing():
            return
        head = encode_head(response, request, close=self._close_after)
        body = b"" if request.method == "HEAD" else response.body
        deadline = self._loop.call_later(WRITE_SECONDS, transport.abort)
        try:
            transport.writelines((head, body))
            await self._drained()
        finally:
            deadline.cancel()

    def _finished(self) -> None:
        """The response is written: close, or read the next request."""
        transport = self._transport
        self._task = None
        self.in_request = False
        self.idle_since = self._loop.time()
        if transport is None or transport.is_closing():
            return
        self._connections.unstalled(transport)
        self._connections.request_finished(transport)
        if self._close_after:
            self._linger()
            return
        if self._buffer:
            self._head_begins(self.idle_since)
            self._advance()
            self._account()
        elif self._reader is not None:
            self._reader.close()  # idle: its parser is made again at the next request's first byte
            self._reader = None
        if self._paused_reading and not (
            self.in_request or transport.is_closing() or self.lingering
        ):
            self._paused_reading = False
            transport.resume_reading()

    def _linger(self) -> None:
        """Close after what was written: half-close, and drop what the client still sends until
        it closes too or `LINGER_SECONDS` pass, so that the answer is not lost to a reset."""
        transport = self._transport
        assert transport is not None
        self.lingering = True
        self._head_ends()
        self._buffer.clear()
        self._account()
        self._connections._release(transport)
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        transport.write_eof()
        self._loop.call_later(LINGER_SECONDS, transport.close)

    async def _drained(self) -> None:
        while self._paused_writing and self._transport is not None:
            if self._transport.is_closing():
                return
            self._writable = self._loop.create_future()
            await self._writable

    def _wake_writer(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)


class Listener:
    """The listening sockets, their connections and the sweep."""

    def __init__(
        self,
        handler: Handler,
        connections: Connections,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._handler = handler
        self.connections = connections
        self._ssl_context = ssl_context
        self._acceptor: Acceptor | None = None
        self._scratch = Scratch()
        self._sweep: asyncio.Task[None] | None = None

    async def start(self, host: str | None, port: int) -> None:
        """Listen; raises OSError when the address cannot be bound."""
        connections = self.connections
        connections.fit_open_files()
        sockets = await bind(host, port)
        self._acceptor = Acceptor(sockets, self._accepted, connections.make_room)
        self._acceptor.start()
        self._sweep = background_task(connections.sweep(), name="gpuscope-connection-sweep")

    def _accepted(self, sock: socket.socket) -> None:
        connection = _Connection(self._handler, self.connections)
        Stream(
            sock,
            connection,
            scratch=self._scratch,
            tls=self._ssl_context,
            handshakes=self.connections.handshakes,
        ).start()

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Where it listens: (host, port) per socket."""
        if self._acceptor is None:
            return []
        return [bound.getsockname()[:2] for bound in self._acceptor.sockets]

    def shown(self) -> str:
        """The addresses as one string for the log."""
        return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.addresses)

    async def stop(self, grace: float) -> None:
        """Stop accepting; close idle connections; give requests being answered `grace`
        seconds to finish; then close the rest."""
        if self._acceptor is None:
            return
        connections = self.connections
        connections.stopping = True
        self._acceptor.close()
        self._acceptor = None
        connections._close_idle()
        connections._check_quiet()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await connections._quiet.wait()
        connections._abort_all()
        if self._sweep is not None:
            self._sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweep
