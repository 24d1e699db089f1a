"""`gpuscope rightsize`'s settings (one table: flags, variables, `--config.file`) and what it does
with hostile or broken input: each a subprocess as a user runs it, one line on stderr, the
stated exit status, within seconds and bounded memory."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
import trustme
from aiohttp import web

from exporter.rightsize.cli import write_file
from exporter.rightsize.options import RIGHTSIZE, load
from exporter.rightsize.prometheus import DEFAULT_MAX_RESPONSE_BYTES
from exporter.settings import ConfigError
from tests.rightsize_run import measured, rightsize, serving

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(120)

EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}
ERROR = "gpuscope rightsize: error: "


# -- the settings table -------------------------------------------------------------------------


def test_settings_come_from_flags_then_environment_then_the_config_file(tmp_path: Path) -> None:
    file = tmp_path / "rightsize.yaml"
    file.write_text(
        "prometheus:\n  url: http://thanos:10902\n  timeout: 1m\n  header: ['X-Scope-OrgID: a']\n"
        "window: 7d\nstep: 10m\npercentile: 99\nmodels: [l4, h100-sxm]\nlog: {level: debug}\n"
    )
    environ = {"GPUSCOPE_RIGHTSIZE_CONFIG_FILE": str(file), "GPUSCOPE_RIGHTSIZE_STEP": "15m"}
    config = load(["--window=3d", "--namespace=a,b", "--namespace=c"], environ)
    assert config.connection.url == "http://thanos:10902"  # file
    assert config.connection.timeout_seconds == 60
    assert config.connection.headers == {"X-Scope-OrgID": "a"}
    assert config.window == 3 * 86400  # flag beats file
    assert config.step == 900  # environment beats file
    assert config.settings.percentile == pytest.approx(0.99)
    assert config.settings.models == ("l4", "h100-sxm")
    assert config.selection.namespaces == ("a", "b", "c")
    assert config.log_level == "debug"
    assert load(["--prometheus=http://p:9090"], environ).connection.url == "http://p:9090"


def test_defaults_and_names_keep_the_contract() -> None:
    config = load(["--prometheus=http://prometheus:9090"], {})
    assert (config.window, config.step, config.strategy) == (14 * 86400, 300, "simple")
    assert config.output_format == "table"
    assert abs(config.end - time.time()) < 60
    connection = config.connection
    assert (connection.timeout_seconds, connection.concurrency) == (120, 4)
    assert (connection.connect_timeout_seconds, connection.read_timeout_seconds) == (10, 15)
    assert connection.max_response_bytes == DEFAULT_MAX_RESPONSE_BYTES == 32 * 1024 * 1024
    assert config.settings.percentile == 0.95
    variables = {setting.flag: setting.env for setting in RIGHTSIZE.settings}
    assert variables["--prometheus.bearer-token-file"] == (
        "GPUSCOPE_RIGHTSIZE_PROMETHEUS_BEARER_TOKEN_FILE"
    )
    assert variables["--min-history"] == "GPUSCOPE_RIGHTSIZE_MIN_HISTORY"


def test_the_secret_variables_keep_their_names(tmp_path: Path) -> None:
    url = "--prometheus=http://prometheus:9090"
    token = load([url], {"GPUSCOPE_PROMETHEUS_BEARER_TOKEN": "t0ken"}).connection
    assert token.bearer_token == "t0ken"
    environ = {"GPUSCOPE_PROMETHEUS_PASSWORD": "pw"}
    basic = load([url, "--prometheus.username=alice"], environ).connection
    assert (basic.username, basic.password) == ("alice", "pw")
    file = tmp_path / "token"
    file.write_text("from-file\n")
    connection = load(
        [url, f"--prometheus.bearer-token-file={file}"],
        {"GPUSCOPE_PROMETHEUS_BEARER_TOKEN": "t0ken"},
    ).connection
    assert connection.bearer_token == "from-file"


def test_header_values_keep_their_commas() -> None:
    config = load(
        [
            "--prometheus=http://p:9090",
            "--prometheus.header=Accept: application/json, text/plain",
            "--prometheus.header=X-Scope-OrgID: a|b",
        ],
        {},
    )
    assert config.connection.headers == {
        "Accept": "application/json, text/plain",
        "X-Scope-OrgID": "a|b",
    }


def test_the_ca_file_is_read_and_checked_at_start(tmp_path: Path) -> None:
    authority = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    config = load(["--prometheus=https://p:9090", f"--prometheus.ca-file={ca_file}"], {})
    assert config.connection.ca_certificates == authority.cert_pem.bytes().decode()
    ca_file.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"^invalid --prometheus.ca-file: .*ca.pem: no PEM"):
        load(["--prometheus=https://p:9090", f"--prometheus.ca-file={ca_file}"], {})


# -- hostile and broken input, as a user meets it -----------------------------------------------


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(ERROR), stderr
    return lines[0].removeprefix(ERROR)


@pytest.fixture
def empty_prometheus() -> Iterator[tuple[str, list[str]]]:
    """A PromQL API answering every query with an empty vector; and the queries it was sent."""
    queries: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        queries.append(str((await request.post()).get("query")))
        return web.json_response(EMPTY)

    with serving(answer) as url:
        yield url, queries


def test_an_endless_answer_stops_at_the_limit_in_bounded_memory() -> None:
    """A server streaming JSON without end (1 GiB at most here) costs the job the limit, not
    the stream: it stops reading past 32 MiB and says so."""
    element = b'{"metric":{"pod":"p","namespace":"n"},"value":[1,"1"]},' * 4096

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        sent = 0
        try:
            while sent < 1 << 30:
                await response.write(element)
                sent += len(element)
        except ConnectionError:
            pass
        return response

    with serving(endless) as url:
        result = measured("--prometheus", url, "--log.level=error", timeout=60)
    assert result.returncode == 1, result.stderr
    assert _one_line(result.stderr) == (
        f"Prometheus at {url} answered the connectivity check query with more than 32 MiB "
        "(the limit, --prometheus.max-response-size): narrow the report with --namespace or "
        "--selector, or raise the limit"
    )
    assert result.peak_rss_bytes < 256 * 1024 * 1024, result.peak_rss_bytes


def test_a_declared_length_past_the_limit_is_refused_before_reading() -> None:
    async def large(request: web.Request) -> web.Response:
        return web.Response(body=b" " * (2 << 20), content_type="application/json")

    with serving(large) as url:
        result = rightsize(
            "--prometheus", url, "--prometheus.max-response-size=1MiB", "--log.level=error"
        )
    assert result.returncode == 1
    assert "with more than 1 MiB (the limit" in _one_line(result.stderr)


@pytest.mark.parametrize(
    ("end", "problem"),
    [
        ("1e20", "'1e20' is in the future (more than 5m ahead of this machine's clock)"),
        ("inf", "'inf' is not a moment in time"),
        ("nan", "'nan' is not a moment in time"),
        ("-1", "'-1' is before 1970"),
        ("9999-12-31T23:59:59Z", "is in the future (more than 5m ahead"),
        ("tomorrow", "is in the future (more than 5m ahead"),
        ("0001-01-01T00:00:00+01:00", "is before 1970"),
        ("1969-12-31T23:59:59Z", "is before 1970"),
        ("2026-05-28T20:30:00", "needs a time zone (e.g. Z)"),
    ],
)
def test_an_end_out_of_range_is_refused_before_any_query(
    empty_prometheus: tuple[str, list[str]], end: str, problem: str
) -> None:
    url, queries = empty_prometheus
    if end == "tomorrow":
        end = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    started = time.monotonic()
    result = rightsize("--prometheus", url, f"--end={end}", timeout=30)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert line.startswith("invalid --end: ")
    assert problem in line
    assert queries == []
    assert time.monotonic() - started < 20


def test_an_end_a_little_ahead_of_the_clock_is_accepted(
    empty_prometheus: tuple[str, list[str]],
) -> None:
    url, queries = empty_prometheus
    result = rightsize("--prometheus", url, f"--end={time.time() + 60:.0f}", "--format=json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["workloads"] == 0
    assert queries


def test_a_redirect_names_where_it_led() -> None:
    """Within the origin (another origin is refused: test_rightsize_headers.py)."""

    async def redirect(request: web.Request) -> web.Response:
        if request.path == "/api/v1/query":
            raise web.HTTPFound("/moved/api/v1/query")
        return web.Response(status=404)

    with serving(redirect) as url:
        result = rightsize("--prometheus", url, "--log.level=error", timeout=60)
    assert result.returncode == 1
    assert _one_line(result.stderr) == (
        f"no PromQL API at {url}/moved/api/v1/query (redirected from {url}/api/v1/query) "
        "(HTTP 404 for /api/v1/query): give the base URL (e.g. http://prometheus:9090, "
        "http://thanos-query:10902, https://mimir/prometheus)"
    )


def _alias_bomb(key: str) -> bytes:
    """`key` holding ten lists of ten lists ... eight deep: 10^8 values in 300 bytes. Walking
    it (a check, or an error message quoting it) would take that many values' time and memory."""
    lines = [f"a0: &a0 [{', '.join('x' * 10)}]"]
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 8)]
    return "\n".join([*lines, f"{key}: {{h100-sxm: *a7}}", ""]).encode()


def _bad_documents(key: str, limit: int) -> dict[str, tuple[bytes, str]]:
    """Files that must be refused at once: (content, what the error says)."""
    return {
        "bomb": (_alias_bomb(key), "expands to more than 100,000 values"),
        "binary": (os.urandom(4096), "not UTF-8 text"),
        "nul": (b"prices:\x00\x01\x02\n", "not valid YAML"),
        "twice": (b"prices: {l4: 1}\nprices: {l4: 2}\n", "key 'prices' appears twice"),
        "huge": (b"#" * (limit + 1), "(the limit)"),
    }


@pytest.mark.parametrize("kind", ["bomb", "binary", "nul", "twice", "huge"])
def test_a_bad_price_file_is_one_line_and_status_2(tmp_path: Path, kind: str) -> None:
    content, problem = _bad_documents("prices", 256 * 1024)[kind]
    prices = tmp_path / "prices.yaml"
    prices.write_bytes(content)
    started = time.monotonic()
    result = rightsize("--prometheus=http://127.0.0.1:1", f"--prices={prices}", timeout=30)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert line.startswith(f"invalid --prices: {prices}: ")
    assert problem in line
    assert len(line) < 400
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("kind", ["bomb", "binary", "nul", "twice", "huge"])
def test_a_bad_config_file_is_one_line_and_status_2(tmp_path: Path, kind: str) -> None:
    content, problem = _bad_documents("prometheus", 1024 * 1024)[kind]
    config = tmp_path / "rightsize.yaml"
    config.write_bytes(content)
    result = rightsize("--prometheus=http://127.0.0.1:1", f"--config.file={config}", timeout=30)
    assert result.returncode == 2
    line = _one_line(result.stderr)
    assert line.startswith(f"invalid --config.file: {config}: ")
    assert problem in line


def test_an_unknown_config_file_key_is_named(tmp_path: Path) -> None:
    config = tmp_path / "rightsize.yaml"
    config.write_text("prometheus:\n  url: http://p:9090\n  tiemout: 1m\n")
    result = rightsize(f"--config.file={config}")
    assert result.returncode == 2
    assert _one_line(result.stderr) == (
        f"invalid --config.file: {config}: prometheus.tiemout: unknown setting"
    )


def test_secret_and_certificate_files_are_read_bounded(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_bytes(b"x" * (64 * 1024 + 1))
    result = rightsize("--prometheus=http://127.0.0.1:1", f"--prometheus.bearer-token-file={token}")
    assert result.returncode == 2
    assert _one_line(result.stderr) == (
        f"invalid --prometheus.bearer-token-file: {token}: larger than 64 KiB (the limit)"
    )
    password = tmp_path / "password"
    password.write_bytes(b"s3cret\x00\xff")
    result = rightsize(
        "--prometheus=http://127.0.0.1:1",
        "--prometheus.username=alice",
        f"--prometheus.password-file={password}",
    )
    assert result.returncode == 2
    assert _one_line(result.stderr) == (
        f"invalid --prometheus.password-file: {password}: not UTF-8 text"
    )
    assert "s3cret" not in result.stderr
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-" * (4 * 1024 * 1024 + 1))
    result = rightsize("--prometheus=https://127.0.0.1:1", f"--prometheus.ca-file={ca}")
    assert result.returncode == 2
    assert _one_line(result.stderr) == (
        f"invalid --prometheus.ca-file: {ca}: larger than 4 MiB (the limit)"
    )


# -- gpuscope rightsize serve -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--web.listen-address=9456"],
            (
                "invalid --web.listen-address: '9456' is not host:port (e.g. :9456, "
                "127.0.0.1:9456, [::1]:9456)"
            ),
        ),
        (
            ["--web.listen-address=no-such-host.invalid:9999"],
            "cannot listen on no-such-host.invalid:9999: the address does not resolve",
        ),
        (["--refresh=10s"], "invalid --refresh: 10s is outside 1m..30d"),
        (
            ["--cluster-label=namespace"],
            "invalid --cluster-label: 'namespace' is one of the daemon's own labels",
        ),
        (
            ["--web.max-requests=-1"],
            "invalid --web.max-requests: '-1' is not a whole number",
        ),
    ],
)
def test_bad_server_settings_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = rightsize("serve", "--prometheus=http://127.0.0.1:1", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpuscope rightsize serve: error: {message}")
    assert result.stderr.count("\n") == 1


def test_a_port_in_use_is_status_1() -> None:
    async def never(_request: web.Request) -> web.Response:
        return web.Response(status=500)

    with serving(never) as url:
        taken = url.removeprefix("http://")
        result = rightsize(
            "serve", "--prometheus=http://127.0.0.1:1", f"--web.listen-address={taken}"
        )
    assert result.returncode == 1
    assert result.stderr == (
        f"gpuscope rightsize serve: error: cannot listen on {taken}: address already in use\n"
    )


def test_patches_need_a_directory_and_no_configmap(tmp_path: Path) -> None:
    base = ("--prometheus=http://127.0.0.1:1", "--format=patches")
    assert rightsize(*base).stderr == (
        f"{ERROR}invalid --format: patches writes a directory: give --output DIR\n"
    )
    file = tmp_path / "file"
    file.write_text("")
    assert rightsize(*base, f"--output={file}").stderr == (
        f"{ERROR}invalid --output: '{file}' is not a directory (patches)\n"
    )
    result = rightsize(*base, f"--output={tmp_path}", "--configmap=gpuscope/report")
    assert result.stderr == (
        f"{ERROR}invalid --configmap: keeps one text, not a patches directory\n"
    )


@pytest.mark.slow
def test_with_the_defaults_a_server_that_never_answers_fails_the_job_within_a_minute() -> None:
    """It accepts the connection and reads the request, and says nothing (as a hung Prometheus
    does); the job gives up once a trivial query has had no answer either: 30 s with the
    defaults. Before connect and read timeouts it took four attempts of two minutes."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    started = time.monotonic()
    try:
        result = rightsize(f"--prometheus={url}", timeout=90)
    finally:
        listener.close()
        for connection in held:
            connection.close()
    took = time.monotonic() - started
    assert result.returncode == 1
    said = result.stderr.splitlines()[-1]
    assert said.startswith(f"{ERROR}Prometheus at {url} did not answer: no answer to the ")
    assert said.endswith(
        " query within 15s, nor to a trivial query within 15s more (--prometheus.read-timeout); "
        "is it up, and is --prometheus its address?"
    )
    assert took < 60, f"took {took:.0f}s"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source=dcgm"], "invalid --source: 'dcgm' is not one of gpuscope, dcgm-exporter, auto"),
        (
            ["--source=dcgm-exporter", "--selector=team=ml"],
            "invalid --selector: matches the pod labels gpuscope's daemon exports",
        ),
    ],
)
def test_a_bad_source_is_refused_before_any_query(
    empty_prometheus: tuple[str, list[str]], args: list[str], message: str
) -> None:
    url, queries = empty_prometheus
    result = rightsize("--prometheus", url, *args, timeout=30)
    assert result.returncode == 2
    assert _one_line(result.stderr).startswith(message)
    assert queries == []


def test_the_source_is_a_setting_like_any_other() -> None:
    assert load(["--prometheus=http://p:9090"], {}).source == "gpuscope"
    environ = {"GPUSCOPE_RIGHTSIZE_SOURCE": "auto"}
    assert load(["--prometheus=http://p:9090"], environ).source == "auto"
    flagged = load(["--prometheus=http://p:9090", "--source=dcgm-exporter"], environ)
    assert flagged.source == "dcgm-exporter"


def test_with_an_empty_store_auto_falls_back_to_gpuscope_and_says_why(
    empty_prometheus: tuple[str, list[str]],
) -> None:
    url, queries = empty_prometheus
    result = rightsize("--prometheus", url, "--source=auto", "--format=json", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "neither gpuscope's nor dcgm-exporter's series" in result.stderr
    assert json.loads(result.stdout)["history_source"] == "gpuscope"
    assert any("gpu_allocation_info" in query for query in queries[:3])


@pytest.mark.parametrize("output_format", ["json", "html"])
def test_a_fifo_as_the_output_file_is_refused_at_start(tmp_path: Path, output_format: str) -> None:
    """It held the job for ever after "report ready" (no reader ever came)."""
    fifo = tmp_path / "report"
    os.mkfifo(fifo)

    async def empty(request: web.Request) -> web.Response:
        return web.json_response(EMPTY)

    with serving(empty) as url:
        result = rightsize(
            f"--prometheus={url}", f"--format={output_format}", f"--output={fifo}", timeout=60
        )
    assert result.returncode == 2
    assert result.stderr == f"{ERROR}invalid --output: '{fifo}' is not a regular file\n"


def test_a_fifo_made_at_the_output_path_after_the_start_is_not_written_through(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="No such device or address"):
        write_file(fifo, "{}")
    regular = tmp_path / "old.json"
    regular.write_text("a longer text of an earlier report")
    write_file(regular, "{}")
    assert regular.read_text() == "{}"
