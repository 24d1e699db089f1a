"""HTTP/1.1 on the wire: requests parsed by llhttp, responses encoded, a path routed.

The daemon serves four GET endpoints to Prometheus, the kubelet's probes and people. What parses
requests is llhttp, the parser of Node.js (and of uvicorn), through `httptools`, in its strict mode:
no leniency is switched on. llhttp refuses a bare LF, a control character or DEL in a header value,
obsolete line folding, a header name that is not a token (a space before its colon among them), a
malformed method, target or version, a Content-Length that is not one decimal number or is given
twice, Content-Length together with Transfer-Encoding, and a malformed chunk. `RequestReader`
adds what llhttp leaves to the server, and only that: the size limits (a request line or header
line over `MAX_LINE` bytes, more than `MAX_HEADERS` fields, a head over `MAX_HEAD`: 400; a body
over `MAX_BODY`: 413), exactly one Host in an HTTP/1.1 request, and where llhttp is laxer than Go's
net/http (node_exporter's server): a request line with its parts not one space apart or without a
version (HTTP/0.9's), Transfer-Encoding in an HTTP/1.0 request, a transfer coding other than
chunked (501; llhttp takes `gzip, chunked`), an Upgrade request with a body (llhttp would leave
the body unread, for a protocol this server never switches to). HTTP/1.0 and HTTP/1.1 are served;
another version gets 505. A refusal is a `BadRequest`, whose `kind` names the mistake (llhttp's
reason, or ours) and never quotes the request's bytes. A body, which no endpoint reads, is parsed
by llhttp as it arrives (a view of the connection's buffer) and dropped.

llhttp is handed a connection's bytes only as far as the request being read can reach — its
head's blank line, its Content-Length, a chunk's size line or data — so it never parses past that
request: pipelined requests wait in the connection's buffer as bytes, not as parsed requests, and
the listener reads no more of them while one is answered (`exporter.web.server`). This module is
the wire format only, without I/O, so that it is testable byte by byte; `exporter.web.server` runs
it over the listener's transports (`exporter.web.transport`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote

import httptools

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Mapping

MAX_LINE: Final = 4096
"""A request line or header line longer than this (without its CRLF) is refused."""
MAX_HEADERS: Final = 64
MAX_HEAD: Final = MAX_LINE * 8
"""A request head (request line and header fields) larger than this is refused, however its
lines are split."""
MAX_BODY: Final = 64 * 1024
"""A request body larger than this gets 413; a smaller one is read and dropped."""
FIELD_BYTES: Final = 130
"""What a parsed header field costs besides its name and value: two bytes objects' headers, a
tuple and its place in the list (CPython, 64-bit)."""
METHODS: Final = ("GET", "HEAD")
"""What every endpoint answers; another method on a known path gets 405."""

_SERVED_VERSIONS: Final = ("1.0", "1.1")
_NOT_READ_OR_SERVED: Final = ("0.0", "0.9", *_SERVED_VERSIONS)
"""What llhttp reports as the version when a request it refused did not name one it cannot serve:
0.0 before it read one, 0.9 for a request line that has none (which is malformed, not old)."""
_DAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS: Final = (
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "May",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Oct",
    "Nov",
    "Dec",
)


class BadRequest(Exception):
    """A request refused before it reaches a handler. `kind` names the mistake (for the debug
    log: never the request's bytes); `status` is the answer (400, 413, 417, 501 or 505)."""

    def __init__(self, kind: str, status: int = 400) -> None:
        super().__init__(kind)
        self.kind = kind
        self.status = status


class Headers(dict[str, str]):
    """A request's header fields by lower-case name; a field sent more than once is one value,
    its values joined by ", " (RFC 9110 5.3)."""

    __slots__ = ()


@dataclass(slots=True, eq=False)
class Request:
    """One parsed request head. `transport` is the connection's (its peer, its TLS session);
    `remote` the client's address."""

    method: str
    path: str
    """The target's path, percent-decoded; the query apart."""
    query: str
    version: tuple[int, int]
    headers: Headers
    keep_alive: bool
    body: Body | None = None
    """How the body that follows the head is framed, when there is one."""
    transport: asyncio.Transport | None = None
    remote: str = ""

    def header(self, name: str, default: str = "") -> str:
        """A field's value by its name in any case."""
        return self.headers.get(name.lower(), default)


class Response:
    """A whole response: status, header fields and body. `close` ends the connection after it.
    The listener writes `body` by reference, never copying it: the same bytes may be handed to
    every client (a rendered exposition), and must not change once handed over."""

    __slots__ = ("body", "close", "headers", "status")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        *,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.headers: dict[str, str] = dict(headers or {})
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        self.close = close

    @classmethod
    def text(
        cls,
        text: str,
        status: int = 200,
        *,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> Response:
        return cls(
            status,
            text.encode(),
            content_type="text/plain; charset=utf-8",
            headers=headers,
            close=close,
        )


Handler = Callable[[Request], Awaitable[Response]]
"""What answers a request."""


@dataclass(frozen=True, slots=True)
class Body:
    """How the body that follows a request's head is framed: `length` bytes (Content-Length), or
    chunked (None)."""

    length: int | None = None


class RequestReader:
    """One connection's requests, parsed by llhttp as their bytes arrive: `head` gives a request
    once its head is whole, then `body` drops its body. Each takes what llhttp parsed off the front
    of the connection's buffer, and raises `BadRequest` for a request to refuse (after which the
    connection ends: the reader is not used again). Event loop only.

    llhttp calls this object's `on_*` methods as it parses (httptools' protocol); they collect the
    head, and `on_headers_complete` checks it as a whole — inside the parse, so that its refusal
    comes before any llhttp would make of the body (a transfer coding other than chunked is 501
    here, 400 to llhttp)."""

    __slots__ = (
        "_buffer",
        "_chunked_read",
        "_complete",
        "_fed",
        "_fields",
        "_left",
        "_parser",
        "_refusal",
        "_request",
        "_sized",
        "_stop",
        "_trailers",
        "_url",
        "parsed",
    )

    def __init__(self) -> None:
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        """llhttp, which holds this reader's callbacks; None once closed."""
        self._buffer = bytearray()
        """The buffer being parsed: the head's own checks read it."""
        self._fed = 0
        """Bytes at the front of the buffer llhttp already parsed: of the head, or of a chunked
        body's line, not whole yet."""
        self._stop = 0
        """Where in the buffer the bytes being parsed end."""
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._request: Request | None = None
        """The request whose head was parsed, until its body ended."""
        self._refusal: BadRequest | None = None
        """The refusal a callback stopped llhttp for."""
        self._left = 0
        """Bytes of a Content-Length body, or of a chunk's data and its CRLF, still to come."""
        self._sized = False
        """llhttp has just parsed a chunk's size line."""
        self._chunked_read = 0
        self._trailers = 0
        self._complete = False
        self.parsed = 0
        """Bytes the head being read holds as parsed fields: until it is whole, its bytes are
        held twice, in the buffer and here."""

    def close(self) -> None:
        """Let go of llhttp and of the buffer: llhttp holds this reader's callbacks, and the
        reference cycle would otherwise keep both (the connection's buffer with them) until the
        cycle collector runs, which in a mostly idle daemon may be minutes away."""
        self._parser = None
        self._buffer = bytearray()

    def head(self, buffer: bytearray) -> Request | None:
        """The request whose head `buffer` starts with, taken off it once the head is whole; None
        while more bytes are needed. Blank lines before a request are dropped (RFC 9112 2.2)."""
        if not self._fed:
            while buffer[:2] == b"\r\n":
                del buffer[:2]
            # A CR alone waits: the next byte says whether it begins a blank line.
            if not buffer or buffer == b"\r":
                return None
        while True:
            # A head ends at a blank line: llhttp gets no byte past the next one. Only the bytes
            # that came since the last call are searched (a head trickled in costs its length,
            # not its length squared).
            end = buffer.find(b"\r\n\r\n", max(self._fed - 3, 0), MAX_HEAD + 4)
            stop = len(buffer) if end < 0 else end + 4
            if stop > MAX_HEAD + 4:
                raise BadRequest("a request head over 32 KiB")
            self._parse(buffer, self._fed, stop)
            self._fed = stop
            request = self._request
            if request is not None:
                del buffer[:stop]
                self._fed = 0
                return request
            if stop == len(buffer):
                if stop - (buffer.rfind(b"\n", 0, stop) + 1) > MAX_LINE:  # no end in sight
                    raise BadRequest("a line over 4 KiB")
                return None

    def body(self, buffer: bytearray) -> bool:
        """Drop the body of the request `head` gave, as far as `buffer` holds it; whether the
        request has ended (the next `head` may follow)."""
        while not self._complete:
            if self._left:
                taken = min(self._left, len(buffer))
                if not taken:
                    return False
                self._parse(buffer, 0, taken)
                del buffer[:taken]
                self._left -= taken
                continue
            # A chunked body's next line: a chunk's size, a trailer field, or the blank line that
            # ends it. Only a line is handed to llhttp, so that a size is read before its data.
            newline = buffer.find(b"\n", self._fed)
            stop = len(buffer) if newline < 0 else newline + 1
            if (stop if newline < 0 else newline - 1) > MAX_LINE:
                raise BadRequest("a line over 4 KiB")
            self._parse(buffer, self._fed, stop)
            if newline < 0:
                self._fed = stop
                return False
            if self._sized:
                self._sized = False
                self._chunk(int(buffer[:stop].partition(b";")[0], 16))  # llhttp checked it: hex
            del buffer[:stop]
            self._fed = 0
        self._request = None
        self._complete = False
        self._chunked_read = self._trailers = 0
        return True

    def _chunk(self, size: int) -> None:
        self._chunked_read += size
        if self._chunked_read > MAX_BODY:
            raise BadRequest("a body over 64 KiB", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        if size:
            self._left = size + 2  # its data and the CRLF after it

    def _parse(self, buffer: bytearray, start: int, stop: int) -> None:
        """Hand llhttp the buffer's bytes from `start` to `stop`: a view, never a copy."""
        parser = self._parser
        assert parser is not None, "a closed reader is not used again"
        self._buffer = buffer
        self._stop = stop
        try:
            with memoryview(buffer) as whole, whole[start:stop] as piece:
                parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            # llhttp stops after a request asking to switch protocols (Upgrade, CONNECT). This
            # server never switches (RFC 9110 7.8 lets it ignore Upgrade): the request is
            # answered as any other, and llhttp reads on from the next one.
            pass
        except httptools.HttpParserCallbackError:
            if self._refusal is None:
                raise  # a bug in a callback, not the client's mistake
            raise self._refusal from None
        except httptools.HttpParserError as error:
            if parser.get_http_version() not in _NOT_READ_OR_SERVED:
                raise BadRequest("not HTTP/1.x", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED) from None
            raise BadRequest(f"llhttp: {error}") from None

    # -- llhttp's callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._fields = []
        self.parsed = 0

    def on_url(self, url: bytes) -> None:
        self._url += url  # in pieces when the request line arrives in pieces
        self.parsed += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._request is None:
            self._fields.append((name, value))
            self.parsed += len(name) + len(value) + FIELD_BYTES
            return
        # A trailer field after a chunked body: checked by llhttp, counted, dropped.
        self._trailers += 1
        if self._trailers > MAX_HEADERS:
            self._refusal = BadRequest("more than 64 trailer fields")
            raise self._refusal

    def on_headers_complete(self) -> None:
        try:
            request = self._checked_request()
        except BadRequest as refusal:
            self._refusal = refusal
            raise
        self._request = request
        self._left = (request.body.length or 0) if request.body is not None else 0

    def on_chunk_header(self) -> None:
        self._sized = True

    def on_message_complete(self) -> None:
        self._complete = True

    def _checked_request(self) -> Request:
        """The request whose head llhttp parsed, with what llhttp leaves to the server checked."""
        parser = self._parser
        assert parser is not None  # called by llhttp itself
        start = 0
        while self._buffer.startswith(b"\r\n", start):  # blank lines trickled in before it
            start += 2
        lines = bytes(self._buffer[start : self._stop]).split(b"\r\n")
        if any(len(line) > MAX_LINE for line in lines):
            raise BadRequest("a line over 4 KiB")
        method = parser.get_method()
        # llhttp takes several spaces between the parts, and a line without a version (HTTP/0.9):
        # the line must be exactly what it parsed, one space apart.
        if len(lines[0]) != len(method) + len(self._url) + len(" HTTP/1.1") + 1:
            raise BadRequest("a request line not of method, target and version one space apart")
        version = parser.get_http_version()
        if version not in _SERVED_VERSIONS:
            raise BadRequest("not HTTP/1.x", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED)
        numbers = (1, int(version[-1]))
        if len(self._fields) > MAX_HEADERS:
            raise BadRequest("more than 64 header fields")
        headers = Headers()
        hosts = 0
        for raw_name, raw_value in self._fields:
            name = raw_name.decode("latin-1").lower()  # a token (ASCII): llhttp checked it
            value = raw_value.rstrip(b" \t").decode("latin-1")  # llhttp drops leading blanks only
            hosts += name == "host"
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if numbers >= (1, 1) and hosts != 1:
            raise BadRequest("an HTTP/1.1 request without exactly one Host")
        path, query = _path(self._url)
        body = _body(numbers, headers)
        if body is not None and parser.should_upgrade():
            raise BadRequest("an Upgrade request with a body")
        return Request(
            method=method.decode("ascii"),
            path=path,
            query=query,
            version=numbers,
            headers=headers,
            keep_alive=parser.should_keep_alive(),
            body=body,
        )


def _path(target: bytes) -> tuple[str, str]:
    """The decoded path and the query of an origin-form (`/metrics?x`) or absolute-form
    (`http://node:9455/metrics`) target."""
    text = target.decode("latin-1")  # ASCII: llhttp refuses any other byte in a target
    if not text.startswith("/"):
        scheme, separator, rest = text.partition("://")
        if not separator or scheme.lower() not in ("http", "https"):
            raise BadRequest("a request target that is not a path or an http URL")
        slash = rest.find("/")
        text = rest[slash:] if slash >= 0 else "/"
    path, _, query = text.partition("?")
    return unquote(path, errors="replace"), query


def _body(version: tuple[int, int], headers: Headers) -> Body | None:
    """How the body is framed; llhttp already refused Content-Length with Transfer-Encoding, and
    a Content-Length that is not one decimal number."""
    encoding = headers.get("transfer-encoding")
    if encoding is not None:
        if version < (1, 1):
            raise BadRequest("Transfer-Encoding in an HTTP/1.0 request")
        if encoding.lower() != "chunked":
            raise BadRequest("a transfer coding other than chunked", HTTPStatus.NOT_IMPLEMENTED)
        return Body()
    length = headers.get("content-length")
    if length is None:
        return None
    size = int(length)
    if size > MAX_BODY:
        raise BadRequest("a body over 64 KiB", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    return Body(size) if size else None


def expects_continue(request: Request) -> bool:
    """Whether the client waits for 100 Continue before it sends the body; raises
    `BadRequest` (417) for an expectation other than that one."""
    expect = request.header("expect").strip().lower()
    if not expect or request.version < (1, 1):
        return False
    if expect != "100-continue":
        raise BadRequest("an Expect other than 100-continue", HTTPStatus.EXPECTATION_FAILED)
    return request.body is not None


class _Date:
    """The Date field's value (RFC 9110 5.6.7), formatted once a second. Event loop only."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            t = time.gmtime(second)
            cls.value = (
                f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
            ).encode()
            cls.second = second
        return cls.value


def encode_head(response: Response, request: Request | None, *, close: bool) -> bytes:
    """The status line and header fields of `response` to `request` (None for one refused
    before it was parsed), with Content-Length, Date and Connection."""
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {response.status} {reason}".encode()]
    lines.extend(f"{name}: {value}".encode("latin-1") for name, value in response.headers.items())
    lines.append(b"Content-Length: %d" % len(response.body))
    lines.append(b"Date: " + _Date.now())
    if close:
        lines.append(b"Connection: close")
    elif request is not None and request.version < (1, 1):
        lines.append(b"Connection: keep-alive")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def routed(routes: Mapping[str, Handler]) -> Handler:
    """A handler that answers each path with its route: 404 for a path without one, 405 (with
    `Allow`) for a method other than GET or HEAD."""

    async def route(request: Request) -> Response:
        handler = routes.get(request.path)
        if handler is None:
            return Response.text("404: Not Found\n", HTTPStatus.NOT_FOUND)
        if request.method not in METHODS:
            return Response.text(
                "405: Method Not Allowed\n",
                HTTPStatus.METHOD_NOT_ALLOWED,
                headers={"Allow": ", ".join(METHODS)},
            )
        return await handler(request)

    return route


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value allows gzip (or any coding) with a weight above 0."""
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in {"gzip", "*"}:
            quality = params.replace(" ", "").lower().removeprefix("q=")
            try:
                return not params or float(quality) > 0
            except ValueError:
                return True
    return False
