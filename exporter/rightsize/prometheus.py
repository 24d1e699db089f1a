"""A small client for the PromQL HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

Only `POST /api/v1/query` (instant queries): every statistic the job needs is aggregated inside
Prometheus, so no raw series cross the network. Retries follow a policy written as data —
timeouts, connection failures, 5xx and 429 are retried after the delays in `BACKOFF_SECONDS`,
logged as "attempt #2/4"; any other 4xx is final at once. An answer is read in chunks and
refused as soon as it passes `Connection.max_response_bytes`, so a server streaming without end
costs that much memory and no more. Every failure is a `PrometheusError` whose `str()` is one
complete line for the user; after a redirect it names where the request was sent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from yarl import URL

from exporter.documents import size_text

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import SimpleNamespace, TracebackType

log = logging.getLogger("exporter.rightsize.prometheus")

BACKOFF_SECONDS: Final = (1.0, 2.0, 4.0)
"""Delays before the 2nd, 3rd and 4th attempt of a query that failed transiently."""
RETRIED_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS: Final = 30.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024
"""The largest answer read by default. The job's answers hold one element (about 275 bytes) per
device a pod held: 32 MiB is some 120,000 of them, a hundred times what 1,000 workloads need.
Parsed, an answer takes about 6.5 times its size: one at the limit still fits the CronJob's
512 MiB, and a server answering without end costs at most `concurrency` times the limit."""
READ_CHUNK_BYTES: Final = 256 * 1024


class PrometheusError(Exception):
    """The PromQL API could not answer. `str()` is a complete one-line explanation."""


class PrometheusUnreachable(PrometheusError):
    """No HTTP answer at all (DNS, refused connection, TLS failure, timeouts)."""


class PrometheusUnauthorized(PrometheusError):
    """401 or 403: the credentials are missing or wrong."""


class PrometheusQueryError(PrometheusError):
    """The server answered but refused the query or did not speak the PromQL API."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector: its labels and its value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the PromQL API is and how to talk to it."""

    url: str
    """Base URL; `/api/v1/query` is appended (e.g. `http://thanos-query:10902`,
    `https://mimir.example/prometheus`)."""
    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    ca_certificates: str | None = None
    """PEM text of the CA certificates that verify the server (None: the system's)."""
    insecure_skip_verify: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra request headers, e.g. `X-Scope-OrgID` for a multi-tenant Mimir or Cortex."""
    timeout_seconds: float = 120.0
    """Per attempt of one query."""
    concurrency: int = 4
    """Queries in flight at once."""
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    """An answer past this many bytes fails its query."""


class PrometheusClient:
    """`async with PrometheusClient(connection) as client: await client.query(...)`."""

    def __init__(
        self, connection: Connection, *, backoff: Sequence[float] = BACKOFF_SECONDS
    ) -> None:
        self.connection = connection
        self._backoff = tuple(backoff)
        self._endpoint = connection.url.rstrip("/") + "/api/v1/query"
        self._semaphore = asyncio.Semaphore(connection.concurrency)
        self._session: aiohttp.ClientSession | None = None
        self.queries_sent = 0

    async def __aenter__(self) -> PrometheusClient:
        headers = dict(self.connection.headers)
        if self.connection.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.connection.bearer_token}"
        if self.connection.username is not None:
            pair = f"{self.connection.username}:{self.connection.password or ''}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.connection.timeout_seconds),
            connector=aiohttp.TCPConnector(
                ssl=_ssl_context(self.connection), limit=self.connection.concurrency
            ),
            trace_configs=[_redirect_trace()],
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query(self, promql: str, *, at: float, name: str = "query") -> list[Sample]:
        """The instant vector `promql` evaluates to at unix time `at` (NaN elements dropped).

        `name` says which signal this is, for log lines and error messages.
        """
        async with self._semaphore:
            data = await self._with_retries(promql, at, name)
        return _vector(data, name)

    async def _with_retries(self, promql: str, at: float, name: str) -> Any:
        attempts = len(self._backoff) + 1
        for attempt in range(1, attempts + 1):
            try:
                return await self._attempt(promql, at, name)
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

    async def _attempt(self, promql: str, at: float, name: str) -> Any:
        if self._session is None:
            raise RuntimeError("PrometheusClient used outside `async with`")
        self.queries_sent += 1
        redirects: list[str] = []
        url = self.connection.url
        try:
            async with self._session.post(
                self._endpoint,
                data={"query": promql, "time": f"{at:.3f}"},
                trace_request_ctx=redirects,
            ) as response:
                url = self._where(redirects)
                body = await _bounded_body(response, self.connection.max_response_bytes)
                if body is None:
                    raise PrometheusQueryError(
                        f"Prometheus at {url} answered the {name} query with more than "
                        f"{size_text(self.connection.max_response_bytes)} (the limit, "
                        "--prometheus.max-response-size): narrow the report with --namespace "
                        "or --selector, or raise the limit"
                    )
                status = response.status
                retry_after = response.headers.get("Retry-After", "")
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
        except (aiohttp.TooManyRedirects, aiohttp.RedirectClientError) as error:
            raise PrometheusQueryError(
                f"cannot follow the redirects of Prometheus at {self._where(redirects)}: "
                f"{'too many redirects' if isinstance(error, aiohttp.TooManyRedirects) else error}"
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
        return _answer(url, name, status, body, retry_after)

    def _where(self, redirects: list[str]) -> str:
        """The base URL, or where its redirects led."""
        if not redirects:
            return self.connection.url
        return f"{redirects[-1]} (redirected from {self._endpoint})"


def _redirect_trace() -> aiohttp.TraceConfig:
    """Records in a request's `trace_request_ctx` (a list) each URL it is redirected to."""

    async def redirected(
        _session: aiohttp.ClientSession,
        context: SimpleNamespace,
        params: aiohttp.TraceRequestRedirectParams,
    ) -> None:
        location = params.response.headers.get("Location")
        if location is not None and isinstance(context.trace_request_ctx, list):
            try:
                context.trace_request_ctx.append(str(params.url.join(URL(location))))
            except ValueError:
                context.trace_request_ctx.append(location)

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(redirected)
    return trace


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


def _answer(url: str, name: str, status: int, body: bytearray, retry_after: str) -> Any:
    document = _json(body)
    if status in {401, 403}:
        raise PrometheusUnauthorized(
            f"Prometheus at {url} refused the request (HTTP {status}): check the bearer token or "
            "basic-auth credentials (--prometheus.bearer-token-file, --prometheus.username)"
        )
    if status in RETRIED_STATUSES:
        detail = _error_text(document) or body[:200].decode("utf-8", "replace").strip()
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
    if not isinstance(document, dict) or "status" not in document:
        raise PrometheusQueryError(
            f"{url} answered HTTP {status} to the {name} query with something that is not a "
            "PromQL API response"
        )
    if document["status"] != "success":
        raise PrometheusQueryError(
            f"Prometheus at {url} refused the {name} query (HTTP {status}): "
            f"{_error_text(document) or 'no reason given'}"
        )
    for warning in document.get("warnings") or ():
        log.warning("prometheus warning", extra={"query": name, "warning": str(warning)})
    return document.get("data")


def _json(body: bytearray) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _error_text(document: Any) -> str:
    if isinstance(document, dict) and document.get("error"):
        kind = document.get("errorType")
        return f"{kind}: {document['error']}" if kind else str(document["error"])
    return ""


def _retry_after_seconds(header: str) -> float:
    try:
        seconds = float(header)
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS) if math.isfinite(seconds) else 0.0


def _connection_reason(error: aiohttp.ClientError) -> str:
    if isinstance(error, aiohttp.ClientConnectorError):
        cause = error.os_error
        if cause.errno:
            return os.strerror(cause.errno).lower()
        return str(cause)
    return str(error) or type(error).__name__


def _vector(data: Any, name: str) -> list[Sample]:
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PrometheusQueryError(f"the {name} query returned {kind}, expected an instant vector")
    samples = []
    for element in data.get("result") or ():
        try:
            value = float(element["value"][1])
            labels = element["metric"]
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise PrometheusQueryError(
                f"the {name} query returned a malformed vector element"
            ) from error
        if math.isfinite(value):
            samples.append(Sample({str(k): str(v) for k, v in labels.items()}, value))
    return samples


def _ssl_context(connection: Connection) -> ssl.SSLContext | bool:
    if connection.insecure_skip_verify:
        return False
    context = ssl.create_default_context()
    if connection.ca_certificates is not None:
        context.load_verify_locations(cadata=connection.ca_certificates)
    return context
