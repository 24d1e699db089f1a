"""HTTP/1.1 on the wire: requests parsed strictly, responses encoded, a path routed.

The daemon serves four GET endpoints to Prometheus, the kubelet's probes and people; what it
needs of HTTP is small, and a general web framework would cost every GPU node its memory
(aiohttp's package loads its HTTP client with its server: 12 MiB resident). This module is the
wire format only, without I/O, so that it is testable byte by byte; `exporter.web.server` runs
it over the listener's transports (`exporter.web.transport`).

Parsing follows RFC 9112 strictly, as Go's net/http (node_exporter's server) does: every line
ends in CRLF (a bare LF is refused, never guessed at); a header name is a token followed
directly by its colon; obsolete line folding, control characters in a value, a request line or
header line over `MAX_LINE` bytes, more than `MAX_HEADERS` fields, an HTTP/1.1 request without
exactly one Host, a Content-Length that is not one number, and Content-Length together with
Transfer-Encoding are all refused with 400 (`BadRequest`, whose `kind` names the mistake and
never quotes the request's bytes). A body (which no endpoint reads) is read and dropped: up to
`MAX_BODY` bytes by Content-Length or chunked; larger gets 413. HTTP/1.0 and HTTP/1.1 are
served; another version gets 505.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote

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
METHODS: Final = ("GET", "HEAD")
"""What every endpoint answers; another method on a known path gets 405."""

_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET: Final = re.compile(rb"[\x21-\x7e]+")
_VERSION: Final = re.compile(rb"HTTP/([0-9])\.([0-9])")
_FIELD: Final = re.compile(
    rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*"
    rb"((?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?)[ \t]*"
)
_CHUNK_SIZE: Final = re.compile(rb"([0-9A-Fa-f]{1,8})(?:[ \t]*;[\t\x20-\x7e\x80-\xff]*)?")
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


@dataclass(slots=True)
class Body:
    """Reads a request body off the front of a buffer and drops it: `length` bytes, or chunked
    (with its trailer fields). `consume` returns whether the body has ended."""

    length: int | None = None
    """Bytes still to drop, for a Content-Length body; None for a chunked one."""
    _chunk: int = 0
    """Bytes of the current chunk still to drop."""
    _crlf: bool = False
    """Whether the CRLF that ends a chunk's data comes next."""
    _trailer: bool = False
    _read: int = 0
    _fields: int = 0

    def consume(self, buffer: bytearray) -> bool:
        """Drop what of the body `buffer` starts with; raises `BadRequest` for a malformed or
        oversized one."""
        if self.length is not None:
            taken = min(self.length, len(buffer))
            del buffer[:taken]
            self.length -= taken
            return self.length == 0
        while True:
            if not self._chunk_ended(buffer):
                return False
            line = _line(buffer)
            if line is None:
                return False
            if self._trailer:
                if not line:
                    return True
                self._fields += 1
                if self._fields > MAX_HEADERS or _FIELD.fullmatch(line) is None:
                    raise BadRequest("a malformed trailer field")
                continue
            size = _CHUNK_SIZE.fullmatch(line)
            if size is None:
                raise BadRequest("a malformed chunk size")
            length = int(size.group(1), 16)
            self._read += length
            if self._read > MAX_BODY:
                raise BadRequest("a body over 64 KiB", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            if length:
                self._chunk = length
            else:
                self._trailer = True

    def _chunk_ended(self, buffer: bytearray) -> bool:
        """Drop the rest of the current chunk's data and its CRLF; whether they have all come."""
        if self._chunk:
            taken = min(self._chunk, len(buffer))
            del buffer[:taken]
            self._chunk -= taken
            if self._chunk:
                return False
            self._crlf = True
        if self._crlf:
            if len(buffer) < 2:
                return False
            if buffer[:2] != b"\r\n":
                raise BadRequest("a chunk not ended by CRLF")
            del buffer[:2]
            self._crlf = False
        return True


def _line(buffer: bytearray) -> bytes | None:
    """The CRLF-ended line `buffer` starts with, taken off it; None while it is incomplete."""
    end = buffer.find(b"\n")
    if end < 0:
        if len(buffer) > MAX_LINE:
            raise BadRequest("a line over 4 KiB")
        return None
    if end == 0 or buffer[end - 1] != 0x0D:
        raise BadRequest("a line ended by a bare LF")
    if end - 1 > MAX_LINE:
        raise BadRequest("a line over 4 KiB")
    line = bytes(buffer[: end - 1])
    del buffer[: end + 1]
    return line


def head_end(buffer: bytearray, checked: int = 0) -> int:
    """Where the request head at the front of `buffer` ends (the index past its blank line), or
    -1 while it is incomplete. Refuses, as soon as the bytes show it, a head no more bytes can
    mend: a bare LF, a line over `MAX_LINE`, a head over `MAX_HEAD`. `checked`: how much of the
    buffer an earlier call already checked (the new bytes only are scanned, so a head trickled a
    byte at a time costs its length, not its length squared)."""
    end = buffer.find(b"\r\n\r\n", max(checked - 3, 0), MAX_HEAD + 4)
    limit = len(buffer) if end < 0 else end + 4
    if limit > MAX_HEAD + 4:
        raise BadRequest("a request head over 32 KiB")
    previous = buffer.rfind(b"\n", 0, checked)
    found = buffer.find(b"\n", checked, limit)
    while found >= 0:
        if found == 0 or buffer[found - 1] != 0x0D:
            raise BadRequest("a line ended by a bare LF")
        if found - 1 - (previous + 1) > MAX_LINE:
            raise BadRequest("a line over 4 KiB")
        previous = found
        found = buffer.find(b"\n", found + 1, limit)
    if end >= 0:
        return end + 4
    if limit - (previous + 1) > MAX_LINE:
        raise BadRequest("a line over 4 KiB")
    return -1


def parse_head(head: bytes) -> Request:
    """The request a head (up to, without, its blank line) asks; raises `BadRequest`."""
    request_line, *lines = head.split(b"\r\n")
    if any(len(line) > MAX_LINE for line in (request_line, *lines)):
        raise BadRequest("a line over 4 KiB")
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise BadRequest("a request line without method, target and version")
    method, target, version = parts
    if _TOKEN.fullmatch(method) is None:
        raise BadRequest("a malformed method")
    if _TARGET.fullmatch(target) is None:
        raise BadRequest("a malformed request target")
    matched = _VERSION.fullmatch(version)
    if matched is None:
        raise BadRequest("a malformed HTTP version")
    numbers = (int(matched.group(1)), int(matched.group(2)))
    if numbers[0] != 1:
        raise BadRequest("not HTTP/1.x", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED)
    if len(lines) > MAX_HEADERS:
        raise BadRequest("more than 64 header fields")
    headers = Headers()
    hosts = 0
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise BadRequest("a folded header field")
        found = _FIELD.fullmatch(line)
        if found is None:
            raise BadRequest("a malformed header field")
        name = found.group(1).decode("ascii").lower()
        value = found.group(2).decode("latin-1")
        hosts += name == "host"
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if numbers >= (1, 1) and hosts != 1:
        raise BadRequest("an HTTP/1.1 request without exactly one Host")
    path, query = _path(target.decode("ascii"))
    return Request(
        method=method.decode("ascii"),
        path=path,
        query=query,
        version=numbers,
        headers=headers,
        keep_alive=_keep_alive(numbers, headers.get("connection", "")),
        body=_body(numbers, headers),
    )


def _path(target: str) -> tuple[str, str]:
    """The decoded path and the query of an origin-form (`/metrics?x`) or absolute-form
    (`http://node:9455/metrics`) target."""
    if not target.startswith("/"):
        scheme, separator, rest = target.partition("://")
        if not separator or scheme.lower() not in ("http", "https"):
            raise BadRequest("a request target that is not a path or an http URL")
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    path, _, query = target.partition("?")
    return unquote(path, errors="replace"), query


def _keep_alive(version: tuple[int, int], connection: str) -> bool:
    options = {option.strip().lower() for option in connection.split(",")}
    if version >= (1, 1):
        return "close" not in options
    return "keep-alive" in options


def _body(version: tuple[int, int], headers: Headers) -> Body | None:
    encoding = headers.get("transfer-encoding")
    length = headers.get("content-length")
    if encoding is not None:
        if length is not None:
            raise BadRequest("both Content-Length and Transfer-Encoding")
        if version < (1, 1):
            raise BadRequest("Transfer-Encoding in an HTTP/1.0 request")
        if encoding.strip().lower() != "chunked":
            raise BadRequest("a transfer coding other than chunked", HTTPStatus.NOT_IMPLEMENTED)
        return Body()
    if length is None:
        return None
    values = {value.strip() for value in length.split(",")}
    if len(values) != 1 or not (value := values.pop()).isdigit() or not value.isascii():
        raise BadRequest("a malformed Content-Length")
    if len(value) > 12 or int(value) > MAX_BODY:
        raise BadRequest("a body over 64 KiB", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    return Body(int(value)) if int(value) else None


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
