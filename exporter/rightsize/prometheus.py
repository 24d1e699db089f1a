"""A small client for the PromQL HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

`POST /api/v1/query` (instant queries; the policy replay's per-step history alone asks
`/api/v1/query_range`): every statistic the job needs is aggregated inside
Prometheus, so no raw series cross the network. Retries follow a policy written as data —
timeouts, connection failures, 5xx and 429 are retried after the delays in `BACKOFF_SECONDS`,
logged as "attempt #2/4"; any other 4xx is final at once.

Three time limits. A connection must open (TCP and TLS) within `connect_timeout_seconds`. A
query's answer must be complete within `timeout_seconds`: a PromQL server says nothing until it
has evaluated the query, and a heavy one over a long window may take a minute. So silence alone
does not tell a slow query from a server that will never answer; when a query has had no answer
for `read_timeout_seconds`, the client asks the server a trivial query (`vector(1)`) on a
connection of its own: a server that answers that within `read_timeout_seconds` too is working,
and the query keeps its time; one that does not is not answering, and the query fails at once,
not retried, saying so. With the defaults a server that accepts connections and never answers
fails the job in 30 s, not in four attempts of two minutes each. An answer is read in chunks and
refused as soon as it passes `Connection.max_response_bytes`, so a server streaming without end
costs that much memory and no more. Every failure is a `PrometheusError` whose `str()` is one
complete line for the user; after a redirect it names where the request was sent.

The server is not trusted to answer sanely (its series can be forged through a PodMonitor with
`honorLabels` or remote write):

- the answer is read by `answer.py`, a value at a time and never built whole: elements the
  caller did not ask for (`keep`) and labels the query does not group by are dropped as read;
  warnings and errors are read only as far as they are shown; a malformed element, or one whose
  value is NaN, infinite or outside the signal's `Bounds`, is dropped with one warning per query
  naming the first such series — one bad series never fails a query;
- credentials in the URL's userinfo (`http://alice:pw@prometheus:9090`) authenticate, and every
  place that shows the URL shows `shown_url`'s form (`http://<secret>@prometheus:9090`);
- a redirect is followed only within the URL's origin (scheme, host and port): the credentials
  and `--prometheus.header` values are never sent to another origin, and a redirect to one is
  an error naming where it led.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import aiohttp
from yarl import URL

from exporter.documents import size_text
from exporter.rightsize.answer import (
    ANY_FINITE,
    Bounds,
    Sample,
    Vector,
    answer_labels,
    cut,
    read_answer,
)
from exporter.rightsize.matrix import Columns

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping, Sequence
    from types import TracebackType

    from exporter.rightsize.matrix import Matrix

__all__ = [
    "ANY_FINITE",
    "BACKOFF_SECONDS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "Bounds",
    "Connection",
    "PrometheusClient",
    "PrometheusError",
    "PrometheusQueryError",
    "PrometheusUnauthorized",
    "PrometheusUnreachable",
    "Sample",
    "after_authority",
    "shown_url",
    "url_credentials",
]
"""`Sample` and `Bounds` are the answer reader's (`answer.py`), named here too: the callers of a
query know this module only."""

log = logging.getLogger("exporter.rightsize.prometheus")

BACKOFF_SECONDS: Final = (1.0, 2.0, 4.0)
"""Delays before the 2nd, 3rd and 4th attempt of a query that failed transiently."""
RETRIED_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS: Final = 10
MAX_RETRY_AFTER_SECONDS: Final = 30.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024
"""The largest answer read by default. The job's answers hold one element (about 275 bytes) per
device a pod held: 32 MiB is some 120,000 of them, a hundred times what 1,000 workloads need.
No answer is built whole (`answer.py`): one at the limit, whatever its shape, costs the job at
most about 400 MiB in all, within the CronJob's 512 MiB; a server answering without end costs at
most `concurrency` times the limit."""
READ_CHUNK_BYTES: Final = 256 * 1024
REDACTED: Final = "<secret>"
"""What a URL's userinfo is shown as."""
MAX_WARNED: Final = 10_000
"""Series remembered as warned about (beyond them, a series may be named again)."""


class PrometheusError(Exception):
    """The PromQL API could not answer. `str()` is a complete one-line explanation."""


class PrometheusUnreachable(PrometheusError):
    """No HTTP answer at all (DNS, refused connection, TLS failure, timeouts, a silent server)."""


class PrometheusUnauthorized(PrometheusError):
    """401 or 403: the credentials are missing or wrong."""


class PrometheusQueryError(PrometheusError):
    """The server answered but refused the query or did not speak the PromQL API."""


def shown_url(url: str) -> str:
    """The URL as logs, errors, reports and notifications show it: userinfo (`alice:pw@`) as
    `<secret>@`, the rest as given. The one place a `--prometheus` URL is made fit to show.

    Whatever it is given: everything between the scheme and the last `@` is hidden, so a
    password holding an unencoded `/`, `?` or `#` (which ends the authority early) is hidden
    too; a URL with an `@` past its host shows less than it could, never a secret."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    return f"{scheme}{separator}{REDACTED}@{rest.rpartition('@')[2]}"


def after_authority(url: str) -> str:
    """What follows a URL's authority: its path, query and fragment."""
    rest = url.partition("://")[2]
    ends = [at for at in map(rest.find, "/?#") if at >= 0]
    return rest[min(ends) :] if ends else ""


def _without_userinfo(parts: SplitResult) -> str:
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def url_credentials(url: str) -> tuple[str, str] | None:
    """The (user, password) of a URL's userinfo, percent-decoded; None without userinfo."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the PromQL API is and how to talk to it. `repr()` shows no secret."""

    url: str = field(repr=False)
    """Base URL; `/api/v1/query` is appended (e.g. `http://thanos-query:10902`,
    `https://mimir.example/prometheus`). Userinfo in it (`http://alice:pw@...`) is basic auth:
    it is never sent in the URL nor shown (`shown`)."""
    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_certificates: str | None = None
    """PEM text of the CA certificates that verify the server (None: the system's)."""
    insecure_skip_verify: bool = False
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Extra request headers, e.g. `X-Scope-OrgID` for a multi-tenant Mimir or Cortex."""
    timeout_seconds: float = 120.0
    """Per attempt of one query: to connect, be answered and read the whole answer."""
    connect_timeout_seconds: float = 10.0
    """To open a connection: TCP, and TLS for https."""
    read_timeout_seconds: float = 15.0
    """How long a query may go without an answer before the server is asked whether it answers
    at all (a trivial query, given as long again)."""
    concurrency: int = 4
    """Queries in flight at once."""
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    """An answer past this many bytes fails its query."""

    @property
    def shown(self) -> str:
        """The base URL as it may be shown: its userinfo as `<secret>`."""
        return shown_url(self.url)

    @property
    def address(self) -> str:
        """The base URL requests go to: without its userinfo."""
        return _without_userinfo(urlsplit(self.url))

    def authorization(self) -> str | None:
        """The `Authorization` header: the bearer token, else basic auth from
        `--prometheus.username` or, failing that, the URL's userinfo."""
        if self.bearer_token is not None:
            return f"Bearer {self.bearer_token}"
        pair = (
            (self.username, self.password or "")
            if self.username is not None
            else url_credentials(self.url)
        )
        if pair is None:
            return None
        joined = f"{pair[0]}:{pair[1]}".encode()
        return "Basic " + base64.b64encode(joined).decode("ascii")


class PrometheusClient:
    """`async with PrometheusClient(connection) as client: await client.query(...)`."""

    def __init__(
        self, connection: Connection, *, backoff: Sequence[float] = BACKOFF_SECONDS
    ) -> None:
        self.connection = connection
        self._backoff = tuple(backoff)
        self._endpoint = connection.address.rstrip("/") + "/api/v1/query"
        self._shown_endpoint = connection.shown.rstrip("/") + "/api/v1/query"
        self._semaphore = asyncio.Semaphore(connection.concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        """A connection of its own for the trivial query, which must not wait for one of the
        queries' connections (all of them may be held by silent queries)."""
        self._probe: asyncio.Task[bool] | None = None
        """The last trivial query; shared by the queries that wait on a silent server at once."""
        self._probed_at = -math.inf
        self._warned: set[tuple[str, str]] = set()
        """The (signal, series) a warning named already."""
        self.queries_sent = 0

    async def __aenter__(self) -> PrometheusClient:
        headers = dict(self.connection.headers)
        authorization = self.connection.authorization()
        if authorization is not None:
            headers["Authorization"] = authorization
        context = _ssl_context(self.connection)
        connect = self.connection.connect_timeout_seconds
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=self.connection.timeout_seconds, sock_connect=connect
            ),
            connector=aiohttp.TCPConnector(ssl=context, limit=self.connection.concurrency),
        )
        self._probe_session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=self.connection.read_timeout_seconds, sock_connect=connect
            ),
            connector=aiohttp.TCPConnector(ssl=context, limit=1),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()
        self._session = self._probe_session = None

    async def query(
        self,
        promql: str,
        *,
        at: float,
        name: str = "query",
        keep: Callable[[Mapping[str, str]], bool] | None = None,
        bounds: Bounds = ANY_FINITE,
        signal: str | None = None,
    ) -> list[Sample]:
        """The instant vector `promql` evaluates to at unix time `at`.

        `name` says which signal this is, for log lines and error messages. Elements whose
        labels `keep` refuses are dropped as they are read (no warning: a server may answer
        more than asked), and of those kept, the labels `promql` does not group by
        (`answer_labels`); elements that are malformed or whose value is NaN, infinite or
        outside `bounds` are dropped with one warning naming the first, once per `signal`
        (default: `name`) and series: the same signal asked over each term or batch warns once.
        """
        form = {"query": promql, "time": f"{at:.3f}"}
        vector = Vector(keep, bounds, answer_labels(promql))
        return (await self._asked(form, name, vector, signal=signal)).samples

    async def query_matrix(
        self,
        promql: str,
        *,
        start: float,
        end: float,
        step: float,
        name: str = "query",
        keep: Callable[[Mapping[str, str]], bool] | None = None,
        bounds: Bounds = ANY_FINITE,
        signal: str | None = None,
    ) -> Matrix:
        """The matrix `promql` evaluates to at `start`, `start + step`, ... up to `end` (unix
        times, `POST /api/v1/query_range`), as columns (`matrix.Matrix`: each series' labels
        once, its times and values as arrays, never an object per sample): every sample read
        and checked as `query` reads and checks an element."""
        form = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        columns = Columns(keep, bounds, answer_labels(promql))
        read = await self._asked(form, name, columns, signal=signal)
        assert isinstance(read, Columns)  # `fresh` copies keep their class
        return read.matrix()

    async def _asked(
        self, form: dict[str, str], name: str, vector: Vector, *, signal: str | None
    ) -> Vector:
        async with self._semaphore:
            vector = await self._with_retries(form, name, vector)
        vector.finish()
        warned = (signal or name, vector.first_bad)
        first_time = vector.bad > 0 and warned not in self._warned
        if first_time and len(self._warned) < MAX_WARNED:
            self._warned.add(warned)
        vector.report(name, warn=first_time)
        return vector

    async def _with_retries(self, form: dict[str, str], name: str, vector: Vector) -> Vector:
        attempts = len(self._backoff) + 1
        for attempt in range(1, attempts + 1):
            try:
                return await self._attempt(form, name, vector.fresh())
            except _Transient as problem:
                if attempt == attempts:
                    raise problem.final(attempts) from problem.__cause__
                delay = max(self._backoff[attempt - 1], problem.retry_after)
                log.warning(
                    "prometheus query failed, retrying",
                    extra={
                        "query": name,
                        "attempt": f"#{attempt + 1}/{attempts}",
                        "in_seconds": delay,
                        "reason": problem.reason,
                    },
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _attempt(self, form: dict[str, str], name: str, vector: Vector) -> Vector:
        if self._session is None:
            raise RuntimeError("PrometheusClient used outside `async with`")
        self.queries_sent += 1
        redirects: list[str] = []
        try:
            status, body, retry_after = await self._unless_silent(
                self._post(self._session, form, redirects, name, range_query="start" in form),
                name,
            )
        except aiohttp.ConnectionTimeoutError as error:
            url = self._where(redirects)
            connect = self.connection.connect_timeout_seconds
            raise _Transient(
                f"no connection within {connect:g}s",
                lambda n: PrometheusUnreachable(
                    f"cannot reach Prometheus at {url}: no connection within {connect:g}s "
                    f"(--prometheus.connect-timeout; {n} attempts)"
                ),
            ) from error
        except TimeoutError as error:
            url = self._where(redirects)
            raise _Transient(
                f"no answer within {self.connection.timeout_seconds:g}s",
                lambda n: PrometheusUnreachable(
                    f"Prometheus at {url} did not answer the {name} query within "
                    f"{self.connection.timeout_seconds:g}s ({n} attempts); raise "
                    "--prometheus.timeout or shorten --window"
                ),
            ) from error
        except aiohttp.ClientConnectorCertificateError as error:
            url = self._where(redirects)
            raise PrometheusUnreachable(
                f"cannot reach Prometheus at {url}: TLS certificate not trusted "
                f"({error.certificate_error}); pass --prometheus.ca-file"
            ) from error
        except aiohttp.ClientError as error:
            url = self._where(redirects)
            reason = _connection_reason(error)
            raise _Transient(
                reason,
                lambda n: PrometheusUnreachable(
                    f"cannot reach Prometheus at {url}: {reason} ({n} attempts)"
                ),
            ) from error
        return _answer(
            self._where(redirects), name, status, body, retry_after=retry_after, vector=vector
        )

    async def _unless_silent(
        self, post: Coroutine[object, object, tuple[int, bytearray, str]], name: str
    ) -> tuple[int, bytearray, str]:
        """What `post` returns, unless it has no answer within the read timeout and the server
        then does not answer a trivial query either: `PrometheusUnreachable`, final."""
        task = asyncio.ensure_future(post)
        try:
            read = self.connection.read_timeout_seconds
            done, _ = await asyncio.wait({task}, timeout=read)
            if not done:
                probe = self._answering()
                await asyncio.wait({task, probe}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done() and not probe.result():
                    raise PrometheusUnreachable(
                        f"Prometheus at {self.connection.shown} did not answer: no answer to the "
                        f"{name} query within {read:g}s, nor to a trivial query within {read:g}s "
                        "more (--prometheus.read-timeout); is it up, and is --prometheus its "
                        "address?"
                    )
            return await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _answering(self) -> asyncio.Task[bool]:
        """Whether the server answers a trivial query within the read timeout: one such query
        at a time, and its answer believed for as long again."""
        now = asyncio.get_running_loop().time()
        stale = now - self._probed_at > self.connection.read_timeout_seconds
        if self._probe is None or (self._probe.done() and stale):
            self._probed_at = now
            self._probe = asyncio.create_task(self._answers_trivially())
        return self._probe

    async def _answers_trivially(self) -> bool:
        """Any HTTP answer to `vector(1)` counts: the server is working (what it thinks of the
        query, or of the credentials, the query itself will tell)."""
        if self._probe_session is None:
            raise RuntimeError("PrometheusClient used outside `async with`")
        form = {"query": "vector(1)"}
        try:
            async with self._probe_session.post(self._endpoint, data=form, allow_redirects=False):
                return True
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def _post(
        self,
        session: aiohttp.ClientSession,
        form: dict[str, str],
        redirects: list[str],
        name: str,
        *,
        range_query: bool = False,
    ) -> tuple[int, bytearray, str]:
        """Post the query, following redirects within the base URL's origin only (the query
        posted again); the status, the body (bounded) and the Retry-After header."""
        target = URL(self._endpoint + ("_range" if range_query else ""))
        origin = target.origin()
        for _ in range(MAX_REDIRECTS + 1):
            async with session.post(target, data=form, allow_redirects=False) as response:
                location = response.headers.get("Location")
                if response.status in REDIRECT_STATUSES and location is not None:
                    try:
                        target = target.join(URL(location))
                        elsewhere = target.origin() != origin
                    except ValueError:
                        redirects.append(shown_url(location))
                        raise PrometheusQueryError(
                            f"Prometheus at {self._where(redirects)} redirected the {name} "
                            "query to a URL that cannot be read"
                        ) from None
                    redirects.append(shown_url(str(target)))
                    if target.user is not None or target.password is not None:
                        # Credentials come from --prometheus alone, never from an answer (and
                        # aiohttp refuses userinfo beside an Authorization header anyway).
                        raise PrometheusQueryError(
                            f"Prometheus at {self.connection.shown} redirected the {name} query "
                            f"to a URL carrying credentials, {shown_url(str(target))}: refused; "
                            "credentials are taken from --prometheus and its flags only"
                        )
                    if elsewhere:
                        raise PrometheusQueryError(
                            f"Prometheus at {self.connection.shown} redirected the {name} query "
                            f"to another origin, {shown_url(str(target))}: credentials and "
                            "--prometheus.header values are never sent to another origin; give "
                            "that server as --prometheus if it is the one to ask"
                        )
                    continue
                body = await _bounded_body(response, self.connection.max_response_bytes)
                if body is None:
                    raise PrometheusQueryError(
                        f"Prometheus at {self._where(redirects)} answered the {name} query with "
                        f"more than {size_text(self.connection.max_response_bytes)} (the limit, "
                        "--prometheus.max-response-size): narrow the report with --namespace "
                        "or --selector, or raise the limit"
                    )
                return response.status, body, response.headers.get("Retry-After", "")
        raise PrometheusQueryError(
            f"cannot follow the redirects of Prometheus at {self._where(redirects)}: too many "
            "redirects"
        )

    def _where(self, redirects: list[str]) -> str:
        """The base URL, or where its redirects led (as shown: no userinfo)."""
        if not redirects:
            return self.connection.shown
        return f"{redirects[-1]} (redirected from {self._shown_endpoint})"


async def _bounded_body(response: aiohttp.ClientResponse, limit: int) -> bytearray | None:
    """The whole body, or None as soon as it passes `limit` bytes (at once when its declared
    length does)."""
    if response.content_length is not None and response.content_length > limit:
        return None
    body = bytearray()
    async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            return None
    return body


class _Transient(Exception):
    """A failure worth another attempt; `final(n)` is the error to raise after n attempts."""

    def __init__(
        self,
        reason: str,
        final: Callable[[int], PrometheusError],
        *,
        retry_after: float = 0.0,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.final = final
        self.retry_after = retry_after


def _answer(
    url: str, name: str, status: int, body: bytearray, *, retry_after: str, vector: Vector
) -> Vector:
    answer = read_answer(body, vector)
    if status in {401, 403}:
        raise PrometheusUnauthorized(
            f"Prometheus at {url} refused the request (HTTP {status}): check the bearer token or "
            "basic-auth credentials (--prometheus.bearer-token-file, --prometheus.username)"
        )
    if status in RETRIED_STATUSES:
        detail = (answer and answer.error_text()) or cut(body[:200].decode("utf-8", "replace"))
        raise _Transient(
            f"HTTP {status}",
            lambda n: PrometheusQueryError(
                f"Prometheus at {url} answered HTTP {status} to the {name} query "
                f"({n} attempts): {detail}"
            ),
            retry_after=_retry_after_seconds(retry_after),
        )
    if status == 404:
        raise PrometheusQueryError(
            f"no PromQL API at {url} (HTTP 404 for /api/v1/query): give the base URL "
            "(e.g. http://prometheus:9090, http://thanos-query:10902, https://mimir/prometheus)"
        )
    if answer is None or answer.status is None:
        raise PrometheusQueryError(
            f"{url} answered HTTP {status} to the {name} query with something that is not a "
            "PromQL API response"
        )
    if answer.status != "success":
        raise PrometheusQueryError(
            f"Prometheus at {url} refused the {name} query (HTTP {status}): "
            f"{answer.error_text() or 'no reason given'}"
        )
    for warning in answer.warnings:
        log.warning("prometheus warning", extra={"query": name, "warning": warning})
    if answer.more_warnings:
        log.warning("prometheus warnings not shown", extra={"query": name})
    if answer.result_type != vector.kind:
        shown = answer.result_type or f"no {vector.kind}"
        expected = "an instant vector" if vector.kind == "vector" else "a range matrix"
        raise PrometheusQueryError(f"the {name} query returned {shown}, expected {expected}")
    return vector


def _retry_after_seconds(header: str) -> float:
    try:
        seconds = float(header)
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS) if math.isfinite(seconds) else 0.0


def _connection_reason(error: aiohttp.ClientError) -> str:
    if isinstance(error, aiohttp.ClientConnectorError):
        cause = error.os_error
        if isinstance(cause, socket.gaierror):
            # The resolver's own codes (EAI_*), negative: os.strerror has no text for them.
            return f"{error.host} does not resolve: {cause.strerror or 'no address'}"
        if cause.errno:
            return os.strerror(cause.errno).lower()
        return str(cause)
    return str(error) or type(error).__name__


def _ssl_context(connection: Connection) -> ssl.SSLContext | bool:
    if connection.insecure_skip_verify:
        return False
    context = ssl.create_default_context()
    if connection.ca_certificates is not None:
        context.load_verify_locations(cadata=connection.ca_certificates)
    return context
