"""The listener's sockets: accepting connections, and each connection's bytes in and out, TLS
included — without asyncio's own server, SSL and socket transports.

Each of those cost the daemon something a hostile or careless client could drive:

- asyncio's TLS (`asyncio.sslproto`) gives every accepted connection 256 KiB of buffers before it
  sends a byte, and a handshake under way is no connection to the server's code, so no cap can
  count it: 550 silent connections to the TLS port took the daemon from 35 to 198 MiB.
- its accept loop meets `EMFILE` by logging an error and retrying once per pass over its backlog
  (18,353 lines for a burst of 3,000 connections under `ulimit -n 1024`).
- its `write_eof()` raises on a connection the client reset, and its write buffer copies every
  byte a slow reader has not taken yet.

So, here:

- **No buffer of a connection's own until it sends.** Every read goes into one buffer the whole
  listener shares (`Scratch`): the protocol copies what it keeps, and asyncio's loop runs one
  callback at a time, so no read can overwrite what another connection has not copied yet.
- **TLS over memory BIOs** (`SSLContext.wrap_bio`), begun when the client's first bytes arrive:
  a silent connection to the TLS port is a socket and a few small objects (no `SSLObject` at all),
  and it counts against the connection cap and is evicted like any idle connection; the
  handshake has its deadline (`handshake_since`, which the listener's sweep checks). A handshake
  under way holds about 48 KiB of OpenSSL's state (key share, transcript, buffers), so at most
  `MAX_HANDSHAKES` are under way at once (`Handshakes`): past it, the one begun longest ago is
  closed for the new one, and a crowd of clients that send a ClientHello and never finish costs
  a few MiB, not 48 KiB per connection up to the cap. OpenSSL never touches the socket, so a TLS
  call can only ever want more bytes to read, never to write: what it produced is flushed after
  each call, and the state machine stays small. OpenSSL's own record buffers are released while a
  connection is idle (CPython sets `SSL_MODE_RELEASE_BUFFERS`). (The alternative, a non-blocking
  `SSLSocket` on the descriptor, saves one copy per record but lets a read want a write and a
  write want a read, with data pending inside OpenSSL whenever reading pauses.)
- **Writes by reference.** `write()` keeps a view of the bytes it was given (never a copy: the
  responses are immutable `bytes`, a rendered exposition shared by every scraper), so a
  connection whose client stopped reading holds a reference, not a buffer. TLS encrypts one
  record at a time, only once the kernel took the last one: a stalled TLS connection holds one
  record of ciphertext at most.
- **No reference cycle.** A closed stream lets go of its protocol once it told it (the protocol
  points back at the stream), so a closed connection's buffers are freed at once, not at the
  cycle collector's next full pass.
- **A client that leaves is no error.** A reset, a broken pipe, a shutdown on a socket already
  gone: the connection is closed and the protocol told, with nothing above debug level.
- **Accepting backs off** (`Acceptor`) when the process or the system is out of descriptors or
  buffers (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`): first it asks the listener to close the
  connection idle longest (the descriptor it frees takes the new connection, as the cap does),
  and if there is none, it stops accepting for 5 ms, doubling to 1 s, then tries again, as Go's
  `net/http` and nginx do; one log line a minute at most says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import socket
import ssl
from collections import OrderedDict, deque
from itertools import islice
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

READ_SIZE: Final = 16 * 1024
"""Bytes read from a socket at a time, into the shared buffer."""
PLAIN_SIZE: Final = 4 * 1024
"""Bytes decrypted at a time: what a record holds past them stays in OpenSSL's read buffer (which
holds the record anyway), so a connection that pauses reading once a request is whole has copied
at most this much of the requests pipelined after it."""
TLS_RECORD: Final = 16 * 1024
"""Plaintext encrypted at a time: TLS's largest record."""
MAX_HANDSHAKES: Final = 256
"""TLS handshakes under way at once on a listener (about 48 KiB each): a real client's handshake
takes a round trip or two, so this many are only ever under way in a flood."""
SEND_VECTORS: Final = 64
"""Buffers handed to one sendmsg() call at most."""
BACKLOG: Final = 1024
"""Connections the kernel holds for the listener to accept: a burst of new connections past it
costs the next one (a probe's, say) a SYN retransmitted a second later. asyncio's default is 100."""
ACCEPTS_PER_WAKE: Final = 128
"""Connections accepted per readiness of a listening socket, before the loop runs other work."""
BACKOFF_FIRST: Final = 0.005
BACKOFF_MAX: Final = 1.0
ACCEPT_LOG_SECONDS: Final = 60.0
OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""Accept errors that more time (or a descriptor freed) can mend."""
CLIENT_GONE: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN})
"""Accept errors about one connection only (it went away before it was accepted)."""


class Scratch:
    """The listener's read buffers, shared by every connection on one event loop: raw bytes
    from sockets, and plaintext out of TLS."""

    __slots__ = ("plain", "plain_view", "raw")

    def __init__(self) -> None:
        self.raw = memoryview(bytearray(READ_SIZE))
        self.plain = bytearray(READ_SIZE)
        self.plain_view = memoryview(self.plain)


class Receiver(Protocol):
    """What a `Stream` tells: asyncio's `Protocol`, but for `data_received`, which is given a
    view of the shared `Scratch`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def data_received(self, data: memoryview) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


_CLOSED: Final = cast("Receiver", asyncio.Protocol())
"""What a closed `Stream` tells instead of its protocol: asyncio's base protocol does nothing."""


class Handshakes:
    """The TLS handshakes under way on a listener's streams, at most `limit`: one more closes
    the one begun longest ago (a real client's finishes within a round trip or two, so the oldest
    is the likeliest to be a client that never will). Event loop only."""

    def __init__(self, limit: int = MAX_HANDSHAKES) -> None:
        self.limit = limit
        self._under_way: OrderedDict[Stream, None] = OrderedDict()
        self.evicted = 0
        """Handshakes closed to make room for a new one."""

    def __len__(self) -> int:
        return len(self._under_way)

    def begin(self, stream: Stream) -> None:
        while len(self._under_way) >= self.limit and self._under_way:
            oldest, _ = self._under_way.popitem(last=False)
            self.evicted += 1
            oldest.abort()
        self._under_way[stream] = None

    def end(self, stream: Stream) -> None:
        self._under_way.pop(stream, None)


class _Tls:
    """One connection's TLS state, made from its first bytes."""

    __slots__ = ("handshaken", "incoming", "outgoing", "session")

    def __init__(self, context: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.session = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.handshaken = False


class Stream(asyncio.Transport):
    """One accepted connection as an asyncio transport for `protocol`, over a non-blocking socket,
    plain or TLS (`tls`: the listener's context; `handshakes`: the listener's handshakes under
    way, which this one's joins).

    `data_received` is given a view of the shared `Scratch`, valid until it returns: a protocol
    copies what it keeps. `write` keeps a reference to the bytes it is given (pass immutable ones)
    until the kernel took them; the protocol's `pause_writing` is called while anything waits and
    `resume_writing` once all of it went out. `write_eof` half-closes once what was written went
    out (after TLS's close_notify), and from then on what the client sends is read and dropped.
    `close` and `abort` both end the connection at once; `connection_lost` follows on the next
    pass of the loop, after which the stream no longer holds the protocol."""

    __slots__ = (
        "_closed",
        "_context",
        "_eof_asked",
        "_eof_sent",
        "_fd",
        "_handshakes",
        "_loop",
        "_paused_protocol",
        "_peer",
        "_plaintext",
        "_protocol",
        "_reading",
        "_scratch",
        "_sock",
        "_tls",
        "_waiting",
        "_want_reading",
        "_writing",
        "handshake_since",
    )

    def __init__(
        self,
        sock: socket.socket,
        protocol: Receiver,
        *,
        scratch: Scratch,
        tls: ssl.SSLContext | None = None,
        handshakes: Handshakes | None = None,
    ) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._scratch = scratch
        self._context = tls
        self._handshakes = handshakes if handshakes is not None else Handshakes()
        self._tls: _Tls | None = None
        self.handshake_since: float | None = self._loop.time() if tls is not None else None
        """When the TLS handshake began (the connection was accepted); None once it is done, and
        for a plain connection."""
        self._peer: Any = None
        with contextlib.suppress(OSError):
            self._peer = sock.getpeername()
        self._waiting: deque[memoryview] = deque()
        """Bytes for the wire the kernel has not taken yet: views, never copies."""
        self._plaintext: deque[memoryview] = deque()
        """TLS: bytes written and not encrypted yet."""
        self._want_reading = True
        self._reading = False
        self._writing = False
        self._paused_protocol = False
        self._eof_asked = False
        self._eof_sent = False
        self._closed = False

    def start(self) -> None:
        """Hand the connection to its protocol and start reading."""
        self._protocol.connection_made(self)
        if not self._closed and self._want_reading:
            self._read_on()

    # -- asyncio.Transport --------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        found: Any
        if name in ("ssl_object", "peercert", "cipher"):
            tls = self._tls
            if tls is None or not tls.handshaken:
                return default
            session = tls.session
            answers: dict[str, Callable[[], Any]] = {
                "ssl_object": lambda: session,
                "peercert": session.getpeercert,
                "cipher": session.cipher,
            }
            found = answers[name]()
        else:
            found = {"peername": self._peer, "socket": self._sock, "sslcontext": self._context}
            found = found.get(name)
        return default if found is None else found

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End the connection now: what the kernel has not taken yet is dropped (TLS: after a
        close_notify, if the kernel takes it at once)."""
        if self._closed:
            return
        tls = self._tls
        if tls is not None and tls.handshaken and not self._eof_sent and not self._waiting:
            self._close_notify(tls)
        self._end(None)

    def abort(self) -> None:
        self._end(None)

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._want_reading = False
        self._read_off()

    def resume_reading(self) -> None:
        if self._want_reading or self._closed:
            return
        self._want_reading = True
        if self._tls is not None and self._tls.handshaken:
            # Records already read may hold requests: decrypt them before waiting for more.
            self._loop.call_soon(self._decrypt)
        self._read_on()

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._waiting)) + sum(map(len, self._plaintext))

    def can_write_eof(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writelines((data,))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._closed or self._eof_asked:
            return  # the client left, or the connection is closing: nothing to send it
        views = [view for data in list_of_data if (view := memoryview(data).cast("B"))]
        if not views:
            return
        if self._context is None:
            self._send(views)
        else:
            self._plaintext.extend(views)
            self._encrypt()
        self._check_paused()

    def write_eof(self) -> None:
        if self._closed or self._eof_asked:
            return
        self._eof_asked = True
        if not self._waiting and not self._plaintext:
            self._shut_write()

    # -- reading --------------------------------------------------------------------------------

    def _read_on(self) -> None:
        if not self._reading and not self._closed:
            self._loop.add_reader(self._fd, self._readable)
            self._reading = True

    def _read_off(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _readable(self) -> None:
        scratch = self._scratch.raw
        try:
            count = self._sock.recv_into(scratch, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._gone(error)
            return
        if count == 0:
            self._input_ended()
            return
        if self._eof_sent:
            return  # lingering after our half-close: read and dropped
        if self._context is None:
            self._protocol.data_received(scratch[:count])
            return
        tls = self._tls
        if tls is None:
            self._handshakes.begin(self)
            try:
                tls = self._tls = _Tls(self._context)
            except ssl.SSLError as error:  # OpenSSL out of memory, say: this connection only
                log.debug("a TLS connection could not begin", extra={"error": str(error)})
                self._end(error)
                return
        tls.incoming.write(scratch[:count])
        if not tls.handshaken:
            self._handshake(tls)
        if tls.handshaken:
            self._decrypt()

    def _handshake(self, tls: _Tls) -> None:
        try:
            tls.session.do_handshake()
        except ssl.SSLWantReadError:
            self._flush_tls(tls)
            return
        except ssl.SSLError as error:
            # Not TLS, an unverifiable client certificate, a protocol version refused: the
            # client's doing; OpenSSL's alert goes out if the kernel takes it.
            self._flush_tls(tls)
            log.debug("a TLS handshake failed", extra={"error": str(error)})
            self._end(None)
            return
        tls.handshaken = True
        self.handshake_since = None
        self._handshakes.end(self)
        self._flush_tls(tls)

    def _decrypt(self) -> None:
        """Hand the protocol the plaintext of the records read, while it wants to read."""
        tls = self._tls
        if tls is None or self._closed:
            return
        plain = self._scratch.plain
        while self._want_reading and not self._closed and not self._eof_sent:
            try:
                count = cast("int", tls.session.read(PLAIN_SIZE, plain))  # into `plain`: a count
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as error:
                self._flush_tls(tls)
                log.debug("a TLS connection failed", extra={"error": str(error)})
                self._end(None)
                return
            if count == 0:  # the client's close_notify
                self._input_ended()
                return
            self._protocol.data_received(self._scratch.plain_view[:count])
        if not self._closed:
            self._flush_tls(tls)  # a key update or a session ticket OpenSSL answers
            self._encrypt()  # a write that waited for the handshake's end

    def _input_ended(self) -> None:
        self._read_off()
        if self._closed:
            return
        if self._eof_sent or not self._protocol.eof_received():
            self.close()  # over TLS, the client's close_notify answered with ours

    # -- writing --------------------------------------------------------------------------------

    def _send(self, views: list[memoryview]) -> None:
        """Send now what the kernel takes; keep (by reference) the rest for when it can."""
        if not self._waiting:
            try:
                sent = self._sock.sendmsg(views) if len(views) > 1 else self._sock.send(views[0])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as error:
                self._gone(error)
                return
            views = _after(views, sent)
            if not views:
                return
        self._waiting.extend(views)
        if not self._writing:
            self._loop.add_writer(self._fd, self._writable)
            self._writing = True

    def _writable(self) -> None:
        waiting = self._waiting
        while waiting:
            views = list(islice(waiting, SEND_VECTORS))
            try:
                sent = self._sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                self._gone(error)
                return
            left = _after(views, sent)
            for _ in views:
                waiting.popleft()
            waiting.extendleft(reversed(left))
            if left:
                return
        self._writing = False
        self._loop.remove_writer(self._fd)
        if self._plaintext:
            self._encrypt()
        self._check_paused()
        if not self._waiting and not self._plaintext and self._eof_asked and not self._eof_sent:
            self._shut_write()

    def _encrypt(self) -> None:
        """Encrypt the next record once the kernel took the last one, so that a client that
        stopped reading holds one record of ciphertext, not the whole response."""
        tls = self._tls
        plaintext = self._plaintext
        if tls is None or not tls.handshaken:
            return
        while plaintext and not self._waiting and not self._closed:
            first = plaintext[0]
            piece = first[:TLS_RECORD]
            try:
                tls.session.write(piece)
            except ssl.SSLWantReadError:  # a renegotiation waits for the client's next records
                return
            except ssl.SSLError as error:
                log.debug("a TLS connection failed", extra={"error": str(error)})
                self._end(None)
                return
            if len(first) > TLS_RECORD:
                plaintext[0] = first[TLS_RECORD:]
            else:
                plaintext.popleft()
            self._flush_tls(tls)
        if not plaintext and not self._waiting and self._eof_asked and not self._eof_sent:
            self._shut_write()

    def _flush_tls(self, tls: _Tls) -> None:
        data = tls.outgoing.read()
        if data and not self._closed:
            self._send([memoryview(data)])

    def _check_paused(self) -> None:
        busy = bool(self._waiting or self._plaintext)
        if busy and not self._paused_protocol and not self._closed:
            self._paused_protocol = True
            self._protocol.pause_writing()
        elif not busy and self._paused_protocol:
            self._paused_protocol = False
            self._protocol.resume_writing()

    def _shut_write(self) -> None:
        """Half-close: TLS's close_notify, then the socket's write side."""
        self._eof_sent = True
        self._plaintext.clear()
        tls = self._tls
        if tls is not None and tls.handshaken:
            self._close_notify(tls)
        if self._waiting:
            return  # the kernel did not take the close_notify: the linger's close drops it
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as error:
            self._gone(error)

    def _close_notify(self, tls: _Tls) -> None:
        with contextlib.suppress(ssl.SSLError):
            tls.session.unwrap()
        self._flush_tls(tls)

    # -- the end --------------------------------------------------------------------------------

    def _gone(self, error: OSError) -> None:
        """The client reset the connection or went away: its end, never an error of ours."""
        log.debug("a client connection failed", extra={"error": error.strerror or str(error)})
        self._end(error)

    def _end(self, error: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._read_off()
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False
        self._waiting.clear()
        self._plaintext.clear()
        self._tls = None
        self._handshakes.end(self)
        self._sock.close()
        protocol, self._protocol = self._protocol, _CLOSED  # it points back at this stream
        self._loop.call_soon(protocol.connection_lost, error)


def _after(views: list[memoryview], sent: int) -> list[memoryview]:
    """What of `views` is left once `sent` bytes of them went out."""
    for index, view in enumerate(views):
        if sent < len(view):
            return [view[sent:], *views[index + 1 :]]
        sent -= len(view)
    return []


class Acceptor:
    """Accepts connections on listening sockets and hands each (non-blocking, TCP_NODELAY) to
    `accepted`; when the process or the system runs out of descriptors or buffers, asks
    `make_room` to close an idle connection, and if it cannot, pauses accepting with backoff."""

    def __init__(
        self,
        sockets: list[socket.socket],
        accepted: Callable[[socket.socket], None],
        make_room: Callable[[], bool],
    ) -> None:
        self.sockets = sockets
        self._accepted = accepted
        self._make_room = make_room
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backoff = 0.0
        self._resume: asyncio.TimerHandle | None = None
        self._listening = False
        self._failures = 0
        """Accept failures for lack of resources since the last log line."""
        self._logged_at = -math.inf
        self.paused = 0
        """Times accepting paused."""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sock in self.sockets:
            sock.settimeout(0.0)  # non-blocking
        self._listen()

    def close(self) -> None:
        """Stop accepting and close the listening sockets."""
        self._unlisten()
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        for sock in self.sockets:
            sock.close()

    def _listen(self) -> None:
        assert self._loop is not None
        self._resume = None
        if not self._listening:
            for sock in self.sockets:
                self._loop.add_reader(sock.fileno(), self._accept, sock)
            self._listening = True

    def _unlisten(self) -> None:
        if self._listening and self._loop is not None:
            for sock in self.sockets:
                self._loop.remove_reader(sock.fileno())
        self._listening = False

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                connection, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in CLIENT_GONE:
                    continue
                if error.errno in OUT_OF_RESOURCES and self._make_room():
                    self._note(error)
                    continue  # the descriptor it freed takes the next connection
                self._pause(error)
                return
            self._backoff = 0.0
            try:
                connection.settimeout(0.0)  # non-blocking
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._accepted(connection)
            except OSError as error:  # gone already: one connection's problem
                log.debug("a new connection failed", extra={"error": str(error)})
                connection.close()
            except Exception:
                # A bug must not end accepting for good: this connection only.
                log.exception("a new connection could not be served")
                connection.close()

    def _pause(self, error: OSError) -> None:
        """Stop accepting for a while: 5 ms after the first failure, doubling to 1 s."""
        assert self._loop is not None
        self._backoff = min(BACKOFF_MAX, self._backoff * 2 or BACKOFF_FIRST)
        self.paused += 1
        self._note(error)
        self._unlisten()
        self._resume = self._loop.call_later(self._backoff, self._listen)

    def _note(self, error: OSError) -> None:
        """One line a minute at most, with how often it happened since the last."""
        assert self._loop is not None
        self._failures += 1
        now = self._loop.time()
        if now - self._logged_at < ACCEPT_LOG_SECONDS:
            return
        name = errno.errorcode.get(error.errno or 0, "")
        log.warning(
            "cannot accept connections: closing idle ones, else pausing (5 ms doubling to 1 s)",
            extra={
                "error": f"{(error.strerror or str(error)).lower()} ({name})",
                "failures": self._failures,
            },
        )
        self._logged_at, self._failures = now, 0


async def bind(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for every address `host` resolves to (every interface when None or
    empty), as asyncio's `create_server` binds them (`Acceptor.start` makes them non-blocking).
    Raises OSError (`socket.gaierror` when it does not resolve)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # a family this machine does not have (IPv6 switched off)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(errno.EADDRNOTAVAIL, f"no address to listen on for {host}")
    return sockets
