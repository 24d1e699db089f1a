"""The PromQL API client against a scripted aiohttp stand-in: retries, errors, auth, TLS."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
import ssl
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trustme
from aiohttp import web

from exporter.rightsize.prometheus import (
    BACKOFF_SECONDS,
    Connection,
    PrometheusClient,
    PrometheusQueryError,
    PrometheusUnauthorized,
    PrometheusUnreachable,
    Sample,
)
from tests.prometheus_server import free_port
from tests.rightsize_run import serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.timeout(60)

FAST = (0.01, 0.01, 0.01)
VECTOR = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {"metric": {"pod": "a"}, "value": [1.0, "0.25"]},
            {"metric": {"pod": "b"}, "value": [1.0, "NaN"]},
        ],
    },
}


class Script:
    """Answers queries with the scripted (status, body, headers) in turn, the last one forever."""

    def __init__(self, *answers: tuple[int, Any, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[dict[str, str], dict[str, str]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        self.requests.append(({k: str(v) for k, v in form.items()}, dict(request.headers)))
        status, body, headers = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(body, float):
            await asyncio.sleep(body)
            body = VECTOR
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(
            status=status, text=text, headers=headers, content_type="application/json"
        )


@asynccontextmanager
async def serve(script: Script, *, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/prefix/api/v1/query", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context)
    await site.start()
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}/prefix"
    finally:
        await runner.cleanup()


PROMQL = "max by (pod) (up)"
"""A query as the job sends them: aggregated by the labels it reads (the others are dropped)."""


async def query(url: str, **connection: Any) -> list[Sample]:
    async with PrometheusClient(Connection(url=url, **connection), backoff=FAST) as client:
        return await client.query(PROMQL, at=1700000000.5, name="busy_mean")


async def test_a_vector_comes_back_without_nans_and_the_query_is_posted() -> None:
    script = Script((200, VECTOR, {}))
    async with serve(script) as url:
        samples = await query(url + "/")
    assert samples == [Sample({"pod": "a"}, 0.25)]
    form, _ = script.requests[0]
    assert form == {"query": PROMQL, "time": "1700000000.500"}


async def test_5xx_and_429_are_retried_and_logged_as_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = Script(
        (503, {"status": "error", "error": "overloaded"}, {}),
        (429, "slow down", {"Retry-After": "0"}),
        (200, VECTOR, {}),
    )
    caplog.set_level(logging.WARNING, "exporter.rightsize.prometheus")
    async with serve(script) as url:
        samples = await query(url)
    assert len(samples) == 1
    retries = [r for r in caplog.records if r.getMessage() == "prometheus query failed, retrying"]
    assert [record.__dict__["attempt"] for record in retries] == ["#2/4", "#3/4"]
    assert [record.__dict__["reason"] for record in retries] == ["HTTP 503", "HTTP 429"]


async def test_persistent_5xx_fails_after_the_last_attempt_with_the_servers_reason() -> None:
    script = Script((502, {"status": "error", "errorType": "internal", "error": "store down"}, {}))
    async with serve(script) as url:
        with pytest.raises(PrometheusQueryError) as caught:
            await query(url)
    assert len(script.requests) == 4
    assert str(caught.value) == (
        f"Prometheus at {url} answered HTTP 502 to the busy_mean query (4 attempts): internal: store down"
    )


@pytest.mark.parametrize("status", [401, 403])
async def test_unauthorized_is_final_at_once(status: int) -> None:
    script = Script((status, "denied", {}))
    async with serve(script) as url:
        with pytest.raises(PrometheusUnauthorized) as caught:
            await query(url)
    assert len(script.requests) == 1
    assert str(caught.value).startswith(f"Prometheus at {url} refused the request (HTTP {status})")


async def test_a_bad_query_names_the_signal_and_the_parse_error() -> None:
    script = Script(
        (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, {})
    )
    async with serve(script) as url:
        with pytest.raises(PrometheusQueryError) as caught:
            await query(url)
    assert len(script.requests) == 1
    assert str(caught.value) == (
        f"Prometheus at {url} refused the busy_mean query (HTTP 400): bad_data: parse error at char 3"
    )


async def test_wrong_base_url_and_non_prometheus_answers_are_explained() -> None:
    async with serve(Script((200, "<html>hello</html>", {}))) as url:
        with pytest.raises(PrometheusQueryError, match="not a PromQL API response"):
            await query(url)
        with pytest.raises(
            PrometheusQueryError, match=r"HTTP 404 for /api/v1/query\): give the base URL"
        ):
            await query(url + "/wrong")
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    async with serve(Script((200, matrix, {}))) as url:
        with pytest.raises(
            PrometheusQueryError, match="returned matrix, expected an instant vector"
        ):
            await query(url)


async def test_unreachable_server_is_retried_then_one_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusUnreachable) as caught:
        await query(url)
    assert str(caught.value) == f"cannot reach Prometheus at {url}: connection refused (4 attempts)"


async def test_a_slow_server_times_out_per_attempt() -> None:
    async with serve(Script((200, 2.0, {}))) as url:
        with pytest.raises(PrometheusUnreachable) as caught:
            await query(url, timeout_seconds=0.2)
    assert "did not answer the busy_mean query within 0.2s (4 attempts)" in str(caught.value)


async def test_bearer_token_basic_auth_and_extra_headers_are_sent() -> None:
    script = Script((200, VECTOR, {}))
    async with serve(script) as url:
        await query(url, bearer_token="s3cret", headers={"X-Scope-OrgID": "team-a"})
        await query(url, username="alice", password="pw")
    (_, first), (_, second) = script.requests
    assert first["Authorization"] == "Bearer s3cret"
    assert first["X-Scope-OrgID"] == "team-a"
    assert second["Authorization"] == "Basic YWxpY2U6cHc="


async def test_concurrency_is_bounded() -> None:
    in_flight = 0
    highest = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal in_flight, highest
        in_flight += 1
        highest = max(highest, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return web.json_response(VECTOR)

    app = web.Application()
    app.router.add_post("/api/v1/query", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        connection = Connection(url=f"http://127.0.0.1:{port}", concurrency=2)
        async with PrometheusClient(connection) as client:
            await asyncio.gather(*(client.query("up", at=0) for _ in range(8)))
    finally:
        await runner.cleanup()
    assert highest == 2


async def test_tls_with_a_ca_file_and_with_verification_off() -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)
    async with serve(Script((200, VECTOR, {})), ssl_context=server_context) as url:
        assert len(await query(url, ca_certificates=authority.cert_pem.bytes().decode())) == 1
        assert len(await query(url, insecure_skip_verify=True)) == 1
        with pytest.raises(PrometheusUnreachable) as caught:
            await query(url)
    assert "TLS certificate not trusted" in str(caught.value)
    assert "--prometheus.ca-file" in str(caught.value)


async def test_an_answer_is_limited_after_decompression() -> None:
    """A gzip bomb: 64 MiB of JSON in 64 KiB on the wire is refused past the limit, as it
    arrives, not after it has all been inflated."""
    inflated = b'{"status":"success","data":' + b" " * (64 << 20) + b"}"

    async def bomb(request: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(inflated),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )

    with serving(bomb) as url, pytest.raises(PrometheusQueryError) as caught:
        await query(url, max_response_bytes=1 << 20)
    assert str(caught.value).startswith(
        f"Prometheus at {url} answered the busy_mean query with more than 1 MiB (the limit, "
        "--prometheus.max-response-size)"
    )


async def test_an_answer_within_the_limit_is_read_whole() -> None:
    script = Script((200, VECTOR, {}))
    async with serve(script) as url:
        samples = await query(url, max_response_bytes=len(json.dumps(VECTOR)))
    assert samples == [Sample({"pod": "a"}, 0.25)]


# -- a server that does not answer, one that cannot be reached ------------------------------------


@asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """Accepts connections and reads requests, and never answers; yields its URL and the
    requests' first lines."""
    seen: list[bytes] = []

    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readline())
        await reader.read()  # until the client gives up

    server = await asyncio.start_server(never, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()


async def test_a_server_that_never_answers_fails_at_once_after_a_trivial_query() -> None:
    async with silent_server() as (url, seen):
        started = asyncio.get_running_loop().time()
        with pytest.raises(PrometheusUnreachable) as caught:
            await query(url, read_timeout_seconds=0.3)
        took = asyncio.get_running_loop().time() - started
    assert str(caught.value) == (
        f"Prometheus at {url} did not answer: no answer to the busy_mean query within 0.3s, nor "
        "to a trivial query within 0.3s more (--prometheus.read-timeout); is it up, and is "
        "--prometheus its address?"
    )
    assert seen == [b"POST /api/v1/query HTTP/1.1\r\n"] * 2, "the query once, then vector(1)"
    assert took < 10, "not retried: the trivial query was the second chance"


async def test_a_slow_query_of_a_server_that_answers_keeps_its_time() -> None:
    """Silence is not enough to give up: a server evaluating a heavy query says nothing until
    it is done, and answers a trivial one meanwhile."""
    asked: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        query = str((await request.post())["query"])
        asked.append(query)
        if query != "vector(1)":
            await asyncio.sleep(1.0)
        return web.json_response(VECTOR)

    with serving(handle) as url:
        samples = await query(url, read_timeout_seconds=0.2)
    assert samples == [Sample({"pod": "a"}, 0.25)]
    assert asked == [PROMQL, "vector(1)"]


async def test_a_connection_that_does_not_open_is_retried_then_says_so() -> None:
    """A listening socket whose accept queue is full drops the SYNs: connecting hangs, as to a
    firewalled port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = socket.create_connection(listener.getsockname())
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(PrometheusUnreachable) as caught:
            await query(url, connect_timeout_seconds=0.2)
    finally:
        queued.close()
        listener.close()
    assert str(caught.value) == (
        f"cannot reach Prometheus at {url}: no connection within 0.2s "
        "(--prometheus.connect-timeout; 4 attempts)"
    )


async def test_a_host_that_does_not_resolve_is_named() -> None:
    url = "http://no-such-host.invalid:9090"
    with pytest.raises(PrometheusUnreachable) as caught:
        await query(url)
    assert str(caught.value).startswith(
        f"cannot reach Prometheus at {url}: no-such-host.invalid does not resolve: "
    )
    assert str(caught.value).endswith(" (4 attempts)")
    assert "unknown error" not in str(caught.value).lower()


def test_by_default_a_server_that_cannot_be_reached_or_never_answers_fails_within_a_minute() -> (
    None
):
    """The defaults' worst cases, from the policy: every attempt's connection timing out, and a
    silent server (the query's read timeout, then the trivial query's)."""
    defaults = Connection(url="http://prometheus:9090")
    connecting = 4 * defaults.connect_timeout_seconds + sum(BACKOFF_SECONDS)
    silent = 2 * defaults.read_timeout_seconds
    assert len(BACKOFF_SECONDS) + 1 == 4
    assert connecting < 60
    assert silent < 60
