"""`--prometheus.header` (a Mimir or Cortex tenant, a gateway's token): sent with every query,
refused at start when malformed, and its value never in an error or a log line."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from tests.rightsize_run import rightsize, serving

pytestmark = pytest.mark.timeout(120)

SECRET = "tenant-7f3a9c-secret"


@pytest.mark.parametrize(
    "header",
    [
        f"X-Scope-OrgID {SECRET}",  # no colon
        f"X Scope: {SECRET}",  # not a header name
        f"X-Scope-OrgID: {SECRET}\x07",  # a control character
        f"X-Scope-OrgID: {SECRET}{'x' * 9000}",  # longer than a server takes
    ],
)
def test_a_bad_header_is_one_line_and_exit_2_without_its_value(header: str) -> None:
    result = rightsize("--prometheus=http://127.0.0.1:9", f"--prometheus.header={header}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--prometheus.header" in lines[0]
    assert SECRET not in result.stderr + result.stdout


def test_every_query_carries_the_tenant_header_and_the_log_does_not() -> None:
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-Scope-OrgID"))
        vector = {"resultType": "vector", "result": []}
        return web.json_response({"status": "success", "data": vector})

    with serving(handler) as url:
        result = rightsize(
            f"--prometheus={url}",
            f"--prometheus.header=X-Scope-OrgID: {SECRET}",
            "--format=json",
            "--log.level=debug",
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["workloads"] == []
    assert seen
    assert set(seen) == {SECRET}
    assert SECRET not in result.stderr


def test_a_redirect_to_another_origin_gets_neither_credentials_nor_headers() -> None:
    """Refused, naming where it led: the tenant header and the token stay with the origin the
    user named (another port of the same host is another origin)."""
    reached: list[dict[str, str]] = []

    async def elsewhere(request: web.Request) -> web.Response:
        reached.append(dict(request.headers))
        return web.json_response({"status": "success", "data": {"resultType": "vector"}})

    with serving(elsewhere) as other:

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(f"{other}/api/v1/query")

        with serving(redirect) as url:
            result = rightsize(
                f"--prometheus={url}",
                f"--prometheus.header=X-Scope-OrgID: {SECRET}",
                env={"GPUSCOPE_PROMETHEUS_BEARER_TOKEN": SECRET},
            )
    assert result.returncode == 1
    assert reached == []
    assert f"redirected the connectivity check query to another origin, {other}" in result.stderr
    assert SECRET not in result.stderr


def test_a_redirect_within_the_origin_is_followed_with_the_headers() -> None:
    seen: list[tuple[str, str | None, str | None]] = []

    async def handler(request: web.Request) -> web.Response:
        if request.path.startswith("/old/"):
            raise web.HTTPPermanentRedirect("/new" + request.path.removeprefix("/old"))
        form = await request.post()
        seen.append(
            (
                str(form["query"]),
                request.headers.get("X-Scope-OrgID"),
                request.headers.get("Authorization"),
            )
        )
        vector = {"resultType": "vector", "result": []}
        return web.json_response({"status": "success", "data": vector})

    with serving(handler) as url:
        result = rightsize(
            f"--prometheus={url}/old",
            f"--prometheus.header=X-Scope-OrgID: {SECRET}",
            "--format=json",
            env={"GPUSCOPE_PROMETHEUS_BEARER_TOKEN": "t0ken"},
        )
    assert result.returncode == 0, result.stderr
    assert seen[0] == ("vector(1)", SECRET, "Bearer t0ken"), "posted again, headers and all"
    assert {(tenant, token) for _, tenant, token in seen} == {(SECRET, "Bearer t0ken")}
