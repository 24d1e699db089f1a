"""Credentials in `--prometheus` (`http://alice:s3cret@prometheus:9090`) authenticate, and are
`<secret>` — never the password, nor the base64 of the pair — everywhere the URL shows: the
reports of every format, the patches and apply.sh, the notifications, the log, every error, and
the report server's `listening` line, page, JSON and patches tarball (each answer that carries
report data also `Cache-Control: no-store`)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from exporter.rightsize.prometheus import Connection, shown_url
from tests.prometheus_server import free_port
from tests.rightsize_hostile import END, StandIn, held_pod, idle
from tests.rightsize_run import rightsize, serving
from tests.rightsize_stack import serving as serving_report

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

pytestmark = pytest.mark.timeout(180)

USER, PASSWORD = "alice", "s3cret-Pa55"
PAIR = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
SECRETS = (PASSWORD, PAIR, f"{USER}:")


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} shown in: {text[:2000]}"


def authenticated(
    inner: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The stand-in behind basic auth: 401 unless the URL's credentials came as the header."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Basic {PAIR}":
            return web.json_response({"status": "error", "error": "unauthorized"}, status=401)
        return await inner(request)

    return handle


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def test_the_shown_form_hides_any_userinfo() -> None:
    assert shown_url("http://alice:pw@prom:9090/x") == "http://<secret>@prom:9090/x"
    assert shown_url("https://token@[::1]:9090") == "https://<secret>@[::1]:9090"
    assert shown_url("http://a%40b:p%3A@prom") == "http://<secret>@prom"
    assert shown_url("http://prom:9090") == "http://prom:9090"
    assert "pw" not in repr(Connection(url="http://alice:pw@prom", password="pw", headers={}))


def test_every_report_format_patches_notifications_and_the_log_hide_it(tmp_path: Path) -> None:
    posted: list[Any] = []

    async def receive(request: web.Request) -> web.Response:
        posted.append(await request.json())
        return web.Response(text="ok")

    # An idle GPU: a change, so a patch file besides apply.sh.
    stand_in = StandIn([held_pod("idle")], tamper=idle("idle"))
    texts: list[str] = []
    with (
        serving(authenticated(stand_in.handle)) as url,
        serving(receive) as hooks,
    ):
        source = with_credentials(url)
        shown = url.replace("http://", "http://<secret>@")
        for output in ("json", "yaml", "html", "markdown", "csv", "table"):
            result = rightsize(
                f"--prometheus={source}",
                f"--end={END}",
                f"--format={output}",
                "--log.level=debug",
                f"--notify=json+{hooks}/json",
                f"--notify=slack+{hooks}/slack",
                f"--notify=teams+{hooks}/teams",
            )
            assert result.returncode == 0, result.stderr
            texts += [result.stdout, result.stderr]
            if output == "json":
                assert json.loads(result.stdout)["source"] == shown
        patches = tmp_path / "patches"
        result = rightsize(
            f"--prometheus={source}", f"--end={END}", "--format=patches", f"--output={patches}"
        )
        assert result.returncode == 0, result.stderr
    files = {path.name: path.read_text() for path in patches.iterdir()}
    assert len(files) == 2, "apply.sh and the idle GPU's patch"
    assert f"# from {shown};" in files["apply.sh"]
    assert len(posted) == 18
    assert_no_secret(*texts, result.stderr, *files.values(), json.dumps(posted))
    assert any(shown in json.dumps(payload) for payload in posted)


def test_errors_and_warnings_hide_it() -> None:
    async def refuse_one_signal(request: web.Request) -> web.Response:
        query = str((await request.post())["query"])
        if "gpu_allocation_in_use" in query:
            error = {"status": "error", "errorType": "bad_data", "error": "refused"}
            return web.json_response(error, status=400)
        return await StandIn([held_pod("idle")], tamper=idle("idle")).handle(request)

    async def elsewhere(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.2:{free_port()}/api/v1/query")

    outputs = []
    with serving(authenticated(refuse_one_signal)) as url:
        result = rightsize(f"--prometheus={with_credentials(url)}", f"--end={END}")
        assert result.returncode == 0, result.stderr
        assert "optional signal unavailable" in result.stderr
        outputs.append(result)
        wrong = url.replace("http://", f"http://{USER}:wrong-{PASSWORD}@")
        outputs.append(rightsize(f"--prometheus={wrong}", f"--end={END}"))
        assert "refused the request (HTTP 401)" in outputs[-1].stderr
    with serving(elsewhere) as url:
        outputs.append(rightsize(f"--prometheus={with_credentials(url)}", f"--end={END}"))
        assert "redirected the connectivity check query to another origin" in outputs[-1].stderr
    closed = f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}"
    outputs.append(rightsize(f"--prometheus={closed}", f"--end={END}"))
    assert "cannot reach Prometheus at http://<secret>@127.0.0.1" in outputs[-1].stderr
    for bad in (f"ftp://{USER}:{PASSWORD}@host", f"http://{USER}:{PASSWORD}@host:port"):
        outputs.append(rightsize(f"--prometheus={bad}"))
        assert outputs[-1].returncode == 2
        assert "is not an http:// or https:// URL" in outputs[-1].stderr
    outputs.append(rightsize(f"--prometheus={closed}", "--prometheus.username=bob", f"--end={END}"))
    assert outputs[-1].returncode == 2
    assert "choose one" in outputs[-1].stderr
    assert_no_secret(*(output.stderr + output.stdout for output in outputs))


def test_the_report_server_hides_it() -> None:
    stand_in = StandIn([held_pod("idle")], tamper=idle("idle"))
    with (
        serving(authenticated(stand_in.handle)) as url,
        serving_report(with_credentials(url), free_port(), "--refresh=1m") as server,
    ):
        assert "report refreshed" in server.text()
        shown = url.replace("http://", "http://<secret>@")
        document = server.json("/api/v1/report")
        assert document["source"] == shown
        _, page = server.get("/")
        _, tarball = server.get("/patches.tar.gz")
        _, metrics = server.get("/metrics")
        for path in ("/", "/api/v1/report", "/patches.tar.gz", "/metrics"):
            with urllib.request.urlopen(server.url + path, timeout=30) as answer:
                assert answer.headers["Cache-Control"] == "no-store", path
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(tarball))) as tar:
        members = [tar.extractfile(member) for member in tar.getmembers()]
        patches = [member.read().decode() for member in members if member is not None]
    assert any(f"# from {shown};" in text for text in patches)
    assert f"source={shown}" in server.text(), "the listening line"
    assert_no_secret(server.text(), page.decode(), json.dumps(document), metrics.decode(), *patches)


@pytest.mark.parametrize("delimiter", ["/", "?", "#"])
@pytest.mark.parametrize("before", ["9090", "pw"])
def test_a_password_with_an_unencoded_delimiter_is_refused_without_showing_it(
    delimiter: str, before: str
) -> None:
    """Else the userinfo ends at the delimiter: the password shown as a path, and with a number
    before it, the job connects to the user name as a host."""
    url = f"http://{USER}:{before}{delimiter}{PASSWORD}@127.0.0.1:{free_port()}"
    result = rightsize(f"--prometheus={url}", "--format=json")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "percent-encode '/', '?' and '#'" in result.stderr
    assert PASSWORD not in result.stderr


def test_the_shown_form_hides_userinfo_that_ends_at_a_delimiter() -> None:
    for delimiter in "/?#":
        shown = shown_url(f"http://{USER}:9090{delimiter}{PASSWORD}@prom:9090/x")
        assert shown == "http://<secret>@prom:9090/x"
    assert shown_url(f"{USER}:{PASSWORD}@prom") == "<secret>@prom"


def test_a_redirect_carrying_userinfo_is_refused_in_one_line() -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://mallory:{PASSWORD}@{request.host}/elsewhere")

    with serving(redirect) as url:
        result = rightsize(f"--prometheus={with_credentials(url)}", "--format=json")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert "redirected the connectivity check query to a URL carrying credentials" in line
    assert PASSWORD not in result.stderr
