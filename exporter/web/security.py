"""The endpoint's security, as the web config file says, and its limits, around every handler.

`WebSecurity.load(path)` reads the file at start (a bad one raises `WebConfigError`: exit status
2). The daemon then re-checks it every `CHECK_SECONDS` — the file and every file it names (the
certificate, key and client CA), following symlinks as a mounted Secret needs — and on SIGHUP.
A changed file is parsed and loaded in full before anything is replaced: a bad one is logged in
one line (once per version of the files) and the previous config stays in force. Switching TLS on
or off needs a restart (the listening socket is plain or TLS from its start). Every file is read
by `documents.read_bounded` (regular files only: a FIFO or a device is refused without blocking),
and all the blocking work — stat calls, reads, OpenSSL's loads — runs in a daemon thread under
`READ_SECONDS` (`FileWork`): a file that never answers (a hung network mount) is abandoned to its
thread, later versions still apply, and the process still stops.

Per request (the listener has refused what is not HTTP/1.x), in order: health probes
(`/-/healthy`, `/-/ready`) pass without any check; then the credentials, before anything a valid
client needs is spent: a client certificate where one is required (403), its allowed SANs (the
connection is closed), basic auth (401 with `WWW-Authenticate`); then the rate limit (429) and
the concurrent request limit (503). Credentials cached as valid are answered on the event loop;
others wait for bcrypt without holding a request slot, shared fairly between client addresses
(`exporter.web.auth.CredentialChecks`). A request holds its slot while its handler runs; the
response is then handed to the connection, which writes it by reference under the listener's
write deadline, so a client that stops reading holds no slot. The configured headers go on every
response. Nothing secret is logged: not a password, a hash or a key, nor the YAML around them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from exporter.documents import Invalid, read_bounded
from exporter.supervise import DaemonExecutor
from exporter.web.auth import BasicAuth, CredentialChecks, credentials
from exporter.web.config import (
    MAX_BYTES,
    RateLimit,
    WebConfig,
    WebConfigError,
    parse_web_config,
)
from exporter.web.counters import CLOSES, REFUSALS, WebCounts
from exporter.web.http import Handler, Request, Response
from exporter.web.server import Connections
from exporter.web.tls import LiveTls, server_context

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable
    from concurrent.futures import Future
    from pathlib import Path

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECK_SECONDS: Final = 1.0
HEALTH_PATHS: Final = frozenset({"/-/healthy", "/-/ready"})
"""Always reachable (over TLS when TLS is on): the kubelet's probes send no credentials."""
READ_SECONDS: Final = 10.0
"""A reading of the web config's files (or a check of them) not done within this is abandoned."""
MAX_STUCK: Final = 2
"""Abandoned readings whose threads have not returned yet, at most; past it no new one starts."""

_Signature = tuple[tuple[str, int, int, int, int] | tuple[str, str], ...]


class Stuck(Exception):
    """File work that did not finish in time (or could not start: too many stuck already)."""


class FileWork:
    """Blocking work on the web config's files (stat calls, reads, OpenSSL's loads), one job at a
    time in a daemon thread. A job not done within `seconds` is abandoned to its thread and the
    next job gets a thread of its own, so a file that never answers neither holds up later
    versions nor keeps the process from exiting; at most `MAX_STUCK` threads are left stuck.
    Event loop only."""

    def __init__(self, *, seconds: float = READ_SECONDS) -> None:
        self._seconds = seconds
        self._thread: DaemonExecutor | None = None
        self._stuck: list[Future[Any]] = []

    async def run(self, job: Callable[[], T]) -> T:
        """`job()`'s result (or its exception); raises `Stuck`."""
        self._stuck = [future for future in self._stuck if not future.done()]
        thread = self._thread
        if thread is None:
            if len(self._stuck) >= MAX_STUCK:
                raise Stuck(f"{len(self._stuck)} earlier readings of its files never returned")
            thread = self._thread = DaemonExecutor("gpuscope-web-files")
        future = thread.submit(job)
        answer = asyncio.wrap_future(future)
        # An abandoned job's late answer (or error) is nobody's: marked retrieved, not logged.
        answer.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            async with asyncio.timeout(self._seconds):
                return await asyncio.shield(answer)
        except TimeoutError:
            self._abandon(thread, future)
            raise Stuck(f"reading its files took over {self._seconds:g} s; abandoned") from None
        except asyncio.CancelledError:
            if not future.done():
                self._abandon(thread, future)
            raise

    def _abandon(self, thread: DaemonExecutor, future: Future[T]) -> None:
        """Leave `thread` to its job; later jobs get a new one. (A job that waited behind a stuck
        one on a thread already left needs nothing more.)"""
        if self._thread is thread:
            self._stuck.append(future)
            thread.shutdown(wait=False)  # the thread ends when the job returns, if it ever does
            self._thread = None

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None


class RateLimiter:
    """A token bucket: `burst` requests at once, then one per `interval_seconds`."""

    def __init__(self, limit: RateLimit, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = limit.interval_seconds
        self._burst = float(limit.burst)
        self._tokens = self._burst
        self._clock = clock
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class _Active:
    """One version of the config and what was built from it; replaced whole on reload."""

    config: WebConfig
    auth: BasicAuth | None
    limiter: RateLimiter | None

    @property
    def guarded(self) -> bool:
        """Whether requests need checking at all: client certificates or basic auth."""
        tls = self.config.tls
        return self.auth is not None or (tls is not None and tls.verifies_clients)


@dataclass(frozen=True, slots=True)
class _Version:
    """One reading of the files: what to watch next (and how it looked), and the config built,
    or why not."""

    watched: tuple[Path, ...]
    signature: _Signature
    config: WebConfig | None = None
    context: ssl.SSLContext | None = None
    error: str | None = None


def _active(config: WebConfig) -> _Active:
    return _Active(
        config,
        BasicAuth(config.basic_auth_users) if config.basic_auth_users else None,
        RateLimiter(config.rate_limit) if config.rate_limit is not None else None,
    )


def _read(path: Path) -> WebConfig:
    """Parse the file (blocking)."""
    try:
        text = read_bounded(path, MAX_BYTES)
    except Invalid as problem:
        raise WebConfigError(str(problem)) from None
    return parse_web_config(text, directory=path.parent)


def _signature(paths: tuple[Path, ...]) -> _Signature:
    found: list[tuple[str, int, int, int, int] | tuple[str, str]] = []
    for path in paths:
        try:
            status = os.stat(path)  # follows symlinks: a Secret's files are ..data/ symlinks
        except OSError as error:
            found.append((str(path), error.strerror or "unreadable"))
            continue
        found.append((str(path), status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size))
    return tuple(found)


class WebSecurity:
    """The web config in force, the TLS it serves, and the checks (`guard`) that apply both."""

    def __init__(
        self,
        path: Path | None,
        config: WebConfig | None = None,
        *,
        max_requests: int = 0,
        connections: Connections | None = None,
    ) -> None:
        config = config or WebConfig()
        self._path = path
        self._active = _active(config)
        self._tls = LiveTls(config.tls) if config.tls is not None else None
        self._watched = self._paths(config)
        self._signature = _signature(self._watched)
        self._max_requests = max_requests
        self._in_flight = 0
        self._reloading = asyncio.Lock()
        self._files = FileWork()
        self._unanswered = False
        """The last check of the files did not answer (logged once until one does)."""
        self._checks = CredentialChecks()
        self._refused = dict.fromkeys(REFUSALS, 0)
        self.connections = connections if connections is not None else Connections()

    @classmethod
    def load(
        cls, path: Path | None, *, max_requests: int = 0, connections: Connections | None = None
    ) -> WebSecurity:
        """From the file at start; raises `WebConfigError` (with the reason) if it is unusable."""
        config = _read(path) if path is not None else WebConfig()
        return cls(path, config, max_requests=max_requests, connections=connections)

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The listener's context; None serves plain HTTP."""
        return self._tls.listener if self._tls is not None else None

    @property
    def config(self) -> WebConfig:
        return self._active.config

    def describe(self) -> dict[str, object]:
        """Log fields: what is on, never what the secrets are."""
        config = self._active.config
        return {
            "tls": config.tls is not None,
            "client_auth": config.tls.client_auth_type if config.tls else "NoClientCert",
            "basic_auth_users": len(config.basic_auth_users),
            "rate_limit": config.rate_limit is not None,
            "max_requests": self._max_requests,
        }

    # -- reloading --------------------------------------------------------------------------

    def _paths(self, config: WebConfig) -> tuple[Path, ...]:
        return (self._path, *config.files()) if self._path is not None else ()

    def changed(self) -> bool:
        """Whether the file or a file it names changed since it was last read. Blocking (a few
        stat calls)."""
        return self._seen() is not None

    def _seen(self) -> _Signature | None:
        """How the files look now, if that differs from when they were last read. Blocking."""
        if self._path is None:
            return None
        now = _signature(self._watched)
        return now if now != self._signature else None

    def _prepare(self) -> _Version:
        """Read the file and build everything from it. Blocking (files, OpenSSL): a thread's."""
        assert self._path is not None
        watched = self._watched
        try:
            config = _read(self._path)
            watched = self._paths(config)
            if (config.tls is None) != (self._tls is None):
                raise WebConfigError("switching TLS on or off needs a restart")
            context = server_context(config.tls) if config.tls is not None else None
        except WebConfigError as error:
            return _Version(watched, _signature(watched), error=str(error))
        return _Version(watched, _signature(watched), config, context)

    async def reload(self, *, reason: str, seen: _Signature | None = None) -> bool:
        """Read the file again and put it in force if it is usable; else keep the config in
        force and log why. Files are read and contexts built in a daemon thread (`FileWork`);
        the new config is installed on the event loop. `seen`: how the watch saw the files (a
        reading that never returns is then not tried again for the same version). True when
        the new config is in force."""
        if self._path is None:
            return False
        async with self._reloading:
            try:
                version = await self._files.run(self._prepare)
            except Stuck as stuck:
                version = _Version(self._watched, seen or self._signature, error=str(stuck))
            self._watched, self._signature = version.watched, version.signature
            if version.config is None:
                log.error(
                    "web config rejected; the previous one stays in force",
                    extra={"file": str(self._path), "reason": reason, "error": version.error},
                )
                return False
            tls = version.config.tls
            if self._tls is not None and tls is not None and version.context is not None:
                self._tls.install(tls, version.context)
            self._active = _active(version.config)
        log.info(
            "web config reloaded",
            extra={"file": str(self._path), "reason": reason, **self.describe()},
        )
        return True

    async def watch(self) -> None:
        """Reload whenever the files change; runs until cancelled."""
        while self._path is not None:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                seen = await self._files.run(self._seen)
            except Stuck as stuck:
                if not self._unanswered:
                    log.warning(
                        "the web config's files do not answer; the config in force stays",
                        extra={"file": str(self._path), "error": str(stuck)},
                    )
                self._unanswered = True
                continue
            self._unanswered = False
            if seen is not None:
                await self.reload(reason="file changed", seen=seen)

    def close(self) -> None:
        self._checks.close()
        self._files.close()

    # -- per request ------------------------------------------------------------------------

    def counts(self) -> WebCounts:
        """The endpoint's counts now. Any thread: each count is an int the loop replaces whole,
        and the refusals' dict never changes size."""
        connections = self.connections
        closed = (connections.closed_slow, connections.evicted, connections.refused)
        return WebCounts(
            connections_open=len(connections),
            connections_max=connections.limit,
            closed=tuple(zip(CLOSES, closed, strict=True)),
            bad_requests=connections.bad_requests,
            refused=tuple(dict(self._refused).items()),
        )

    def guard(self, handler: Handler) -> Handler:
        """`handler` behind the web config's checks and the request limit."""

        async def guarded(request: Request) -> Response:
            return await self._guarded(request, handler)

        return guarded

    async def _guarded(self, request: Request, handler: Handler) -> Response:
        active = self._active
        if request.path in HEALTH_PATHS:
            return self._headed(await handler(request), active)
        if active.guarded:
            # Credentials first: a client without valid ones takes no request slot and no rate
            # limit token from one with them.
            refusal = await self._refusal(request, active)
            if refusal is not None:
                return self._headed(refusal, active)
        if active.limiter is not None and not active.limiter.allow():
            self._refused["rate_limited"] += 1
            return self._headed(Response.text("Too Many Requests\n", 429), active)
        if self._max_requests and self._in_flight >= self._max_requests:
            self._refused["busy"] += 1
            return self._headed(
                Response.text(
                    f"{self._in_flight} requests in flight (--web.max-requests); retry\n", 503
                ),
                active,
            )
        self._in_flight += 1
        try:
            # The slot is the handler's work only: the connection writes the response after,
            # by reference, so a client that stops reading holds no slot.
            return self._headed(await handler(request), active)
        finally:
            self._in_flight -= 1

    async def _refusal(self, request: Request, active: _Active) -> Response | None:
        tls = active.config.tls
        if tls is not None and tls.verifies_clients:
            transport = request.transport
            peer = transport.get_extra_info("peercert") if transport is not None else None
            if not peer and tls.requires_client_cert:
                self._refused["forbidden"] += 1
                return Response.text("a client certificate is required\n", 403)
            if peer and tls.client_allowed_sans and not _allowed(peer, tls.client_allowed_sans):
                self._refused["forbidden"] += 1
                if transport is not None:
                    transport.abort()  # as the toolkit: end the connection, answer nothing
                return Response(403)
        if active.auth is None:
            return None
        given = credentials(request.headers.get("authorization"))
        answer = None if given is None else active.auth.cached(*given)
        if given is not None and answer is None:
            answer = await self._checks.check(request.remote or "", active.auth, *given)
            if answer is None:
                self._refused["auth_busy"] += 1
                return Response.text(
                    "too many credential checks at once; retry\n",
                    429,
                    headers={"Retry-After": "1"},
                )
        if answer:
            return None
        self._refused["unauthorized"] += 1
        return Response.text(
            "Unauthorized\n",
            401,
            headers={"WWW-Authenticate": 'Basic realm="gpuscope", charset="UTF-8"'},
        )

    @staticmethod
    def _headed(response: Response, active: _Active) -> Response:
        for name, value in active.config.headers:
            response.headers[name] = value
        return response


def _allowed(peer: dict[str, object], sans: tuple[str, ...]) -> bool:
    """Whether the verified client certificate names one of `sans` (DNS, IP, e-mail or URI)."""
    names = peer.get("subjectAltName") or ()
    values = {str(entry[1]) for entry in names if isinstance(entry, tuple) and len(entry) == 2}  # type: ignore[attr-defined]
    return any(san in values for san in sans)
