"""`gpuscope rightsize serve` end to end: the scenario's history in two clusters backfilled into a
real Prometheus, the server refreshing from it while that Prometheus scrapes it, the report, JSON,
patches and metrics it serves, the Rightsizing dashboard's queries on the scraped series, the
notifications a local receiver checks, the page driven in headless Chromium, and a server whose
Prometheus refuses every query behind basic auth."""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import re
import struct
import tarfile
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import bcrypt
import pytest
from aiohttp import web

from dashboards import promql
from dashboards.draw import Source, Window
from dashboards.fit import overlaps
from dashboards.live import Prometheus
from dashboards.render import draw_dashboard
from exporter.rightsize.options import load_serve
from exporter.rightsize.server import Refresher
from tests.dashboard_queries import RANGE_SECONDS, SCRAPE_SECONDS, grafana_values
from tests.helpers import ROOT, assert_promtool_accepts, eventually
from tests.prometheus_server import free_port, running_prometheus
from tests.rightsize_browser import HEIGHT, WIDTH, browser
from tests.rightsize_run import serving as receiving
from tests.rightsize_scenario import END, WORKLOADS
from tests.rightsize_stack import history, serving

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.rightsize_stack import Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "T0000/B0000/server-secret"
PROD = [replace(w, cluster="prod") for w in WORKLOADS]
STAGING = [
    replace(w, cluster="staging") for w in WORKLOADS if w.name in {"notebook-alice", "chat-small"}
]
DASHBOARD = json.loads((ROOT / "dashboards" / "rightsizing.json").read_text(encoding="utf-8"))
QUERIES = [q for q in promql.queries(DASHBOARD) if "gpuscope_simulation" not in q.expr]
"""The replay panels' queries run in tests/test_rightsize_replay_live.py, on a server replaying
known history (this one replays nothing: 14 days of 5-minute steps take a minute to replay)."""
VARIABLES = [v for v in promql.variables(DASHBOARD) if v["type"] == "query"]
WINDOW_SECONDS = 15.0


@dataclass
class Stack:
    prometheus: Prometheus
    server: Server
    posted: list[tuple[str, Any]]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("rightsize-server")
    data = history(root, [*PROD, *STAGING])
    posted: list[tuple[str, Any]] = []

    async def receive(request: web.Request) -> web.Response:
        posted.append((request.path, await request.json()))
        return web.Response(text="ok")

    port = free_port()
    with (
        receiving(receive) as hooks,
        running_prometheus(data, scrape=(f"127.0.0.1:{port}", SCRAPE_SECONDS)) as url,
        serving(
            url,
            port,
            "--cluster-label=cluster",
            "--refresh=1h",
            f"--notify=json+{hooks}/json/{SECRET}",
            f"--notify=slack+{hooks}/services/{SECRET}",
            f"--report-url=http://127.0.0.1:{port}/",
        ) as server,
    ):
        prometheus = Prometheus(url)
        eventually(
            lambda: (
                (
                    prometheus.value(
                        'count_over_time(gpuscope_rightsize_last_refresh_success{job="target"}[1m])'
                    )
                    or 0
                )
                >= 8
            ),
            60,
            "eight scrapes of the server",
        )
        yield Stack(prometheus, server, posted)


def answers(document: dict[str, Any]) -> dict[tuple[str, str], tuple[str, str]]:
    return {
        (w["cluster"], w["workload"]): (w["classification"], w["recommended"])
        for w in document["workloads"]
    }


def test_the_served_report_is_per_cluster(stack: Stack) -> None:
    document = stack.server.json("/api/v1/report")
    found = answers(document)
    assert found == {
        ("prod", "notebook-alice"): ("idle", "release"),
        ("prod", "chat-small"): ("underused", "A100 80GB SXM MIG 1g.10gb"),
        ("prod", "embed-finetune"): ("memory-bound", "A100 80GB SXM"),
        ("prod", "llm-pretrain"): ("compute-bound", "H100 SXM"),
        ("prod", "resnet-train"): ("input-bound", "A100 40GB SXM"),
        ("prod", "new-ranker"): ("undefined", "-"),
        ("prod", "tts"): ("underused", "A100 80GB SXM MIG 2g.20gb"),
        ("prod", "asr"): ("underused", "A100 80GB SXM MIG 2g.20gb"),
        ("prod", "rerank"): ("underused", "A100 80GB SXM MIG 2g.20gb"),
        ("staging", "notebook-alice"): ("idle", "release"),
        ("staging", "chat-small"): ("underused", "A100 80GB SXM MIG 1g.10gb"),
    }
    assert document["cluster_label"] == "cluster"
    assert [c["cluster"] for c in document["clusters"]] == ["prod", "staging"]
    rows = {(w["cluster"], w["workload"]): w for w in document["workloads"]}
    asr = rows[("prod", "asr")]
    assert (asr["trend"], asr["confidence"]) == ("rising", "medium")
    assert "the last 1d alone would recommend keep" in asr["confidence_reason"]
    rerank = rows[("prod", "rerank")]
    assert rerank["replicas"] == 3
    assert rerank["autoscaler"]["name"] == "rerank"
    assert "sized per replica" in rerank["reason"]
    assert rows[("prod", "new-ranker")]["confidence"] == "low"
    assert rows[("staging", "chat-small")]["patch"]["command"].startswith(
        "kubectl --context=staging --namespace=serving patch --type=strategic "
        "--patch-file=staging.serving.deployment.chat-small.yaml -- deployment chat-small"
    )


def test_page_patches_probes(stack: Stack) -> None:
    server = stack.server
    status, page = server.get("/")
    assert status == 200
    assert b"<h1>GPU rightsizing report</h1>" in page
    assert b"made again every 1h" in page
    assert b"href='api/v1/report'" in page
    status, tarball = server.get("/patches.tar.gz")
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        names = set(tar.getnames())
        script = tar.getmember("gpuscope-patches/apply.sh")
        assert script.mode == 0o755
        text = (tar.extractfile(script) or io.BytesIO()).read().decode()
    assert "gpuscope-patches/prod.serving.deployment.chat-small.yaml" in names
    assert "gpuscope-patches/staging.research.statefulset.notebook-alice.yaml" in names
    assert "gpuscope-patches/prod.training.computebound" not in " ".join(names)
    assert "--context=prod --namespace=serving patch --type=strategic" in text
    assert "-- deployment rerank" in text
    assert server.get("/-/healthy") == (200, b"ok\n")
    assert server.get("/-/ready") == (200, b"ok\n")
    assert server.get("/nothing")[0] == 404
    for path in ("/", "/api/v1/report", "/metrics"):
        status, zipped = server.get(path, {"Accept-Encoding": "gzip"})
        assert status == 200
        assert gzip.decompress(zipped).startswith(server.get(path)[1][:64]), path
    assert server.get("/patches.tar.gz", {"Accept-Encoding": "gzip"})[1] == tarball


def _samples(exposition: str, name: str) -> dict[str, float]:
    return {
        match[1]: float(match[2])
        for match in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", exposition, re.MULTILINE)
    }


def test_metrics_are_clean_and_prometheus_has_them(stack: Stack) -> None:
    status, body = stack.server.get("/metrics")
    assert status == 200
    assert_promtool_accepts(body)
    exposition = body.decode()
    savings = _samples(exposition, "gpuscope_recommendation_savings_usd_per_month")
    assert len(savings) == 11
    document = stack.server.json("/api/v1/report")
    rows = {(w["cluster"], w["workload"]): w for w in document["workloads"]}
    chat = rows[("prod", "chat-small")]
    key = (
        'action="move",cluster="prod",confidence="medium",namespace="serving",'
        'workload="chat-small",workload_kind="Deployment"'
    )
    assert savings[key] == pytest.approx(chat["savings_usd_per_month"], abs=0.01)
    assert 'gpuscope_rightsize_refreshes_total{result="success"} 1.0' in exposition
    assert "gpuscope_rightsize_last_refresh_success 1.0" in exposition
    assert (
        'gpuscope_rightsize_notifications_total{result="success",service="slack"} 1.0' in exposition
    )
    scraped = stack.prometheus.value(
        'gpuscope_recommendation_savings_usd_per_month{cluster="prod", workload="chat-small"}'
    )
    assert scraped == pytest.approx(chat["savings_usd_per_month"], abs=0.01)
    gpus = stack.prometheus.value(
        'gpuscope_recommendation_recommended_gpus{cluster="prod", workload="rerank"}'
    )
    assert gpus == pytest.approx(3 * 2 / 7, abs=0.01)


def test_one_summary_per_webhook_and_the_secret_never_logged(stack: Stack) -> None:
    paths = sorted(path for path, _ in stack.posted)
    assert paths == [f"/json/{SECRET}", f"/services/{SECRET}"]
    payloads = dict(stack.posted)
    summary = payloads[f"/json/{SECRET}"]
    assert summary["summary"]["workloads"] == 11
    assert summary["report_url"] == stack.server.url + "/"
    slack = payloads[f"/services/{SECRET}"]
    assert [b["type"] for b in slack["blocks"]][-2:] == ["actions", "context"]
    assert SECRET not in stack.server.text()
    assert "notification sent" in stack.server.text()


@pytest.mark.parametrize("query", QUERIES, ids=[query.name for query in QUERIES])
def test_rightsizing_panel_query_returns_data(stack: Stack, query: promql.PanelQuery) -> None:
    expr = promql.substitute(query.expr, grafana_values(DASHBOARD))
    now = time.time()
    if query.instant:
        answer = stack.prometheus.query(expr, at=now)
    else:
        answer = stack.prometheus.query_range(
            expr, start=now - WINDOW_SECONDS, end=now, step=SCRAPE_SECONDS
        )
    assert answer["status"] == "success", f"{expr}\n{answer.get('error')}"
    assert answer["data"]["result"], f"no data for {expr}"


@pytest.mark.parametrize("variable", VARIABLES, ids=[v["name"] for v in VARIABLES])
def test_rightsizing_variable_finds_values(stack: Stack, variable: dict[str, Any]) -> None:
    selector, label = promql.label_values(variable["query"])
    selector = promql.substitute(selector, grafana_values(DASHBOARD))
    now = time.time()
    answer = stack.prometheus.series(selector, start=now - RANGE_SECONDS, end=now)
    assert answer["status"] == "success", answer.get("error")
    assert {series.get(label) for series in answer["data"]} - {None}


def stat(stack: Stack, title: str, *, cluster: str = ".*") -> float:
    """What the dashboard's stat panel `title` shows now, for the `cluster` variable."""
    (panel,) = [panel for panel in promql.panels(DASHBOARD) if panel["title"] == title]
    values = {**grafana_values(DASHBOARD), "cluster": cluster}
    answer = stack.prometheus.query(promql.substitute(panel["targets"][0]["expr"], values))
    (row,) = answer["data"]["result"]
    return float(row["value"][1])


def test_the_dashboard_counts_the_gpus_the_report_counts(stack: Stack) -> None:
    """The dashboard's GPUs now and after are the report's "17 → 13", not the sum of the
    workloads' time-averaged shares (what the table's GPU share column shows)."""
    consolidation = stack.server.json("/api/v1/report")["consolidation"]
    assert isinstance(consolidation, dict)
    assert stat(stack, "GPUs now, all namespaces") == consolidation["gpus_before"]
    assert stat(stack, "GPUs after, all namespaces") == consolidation["gpus_after"]
    # Staging's idle notebook holds an H100 and chat-small an A100; the notebook should release
    # its GPU and chat-small move to a MIG slice, one GPU for the cluster.
    assert stat(stack, "GPUs now, all namespaces", cluster="staging") == 2
    assert stat(stack, "GPUs after, all namespaces", cluster="staging") == 1


def test_the_dashboards_picture_has_no_text_out_of_place(stack: Stack) -> None:
    end = time.time()
    window = Window(start=end - WINDOW_SECONDS, end=end, step=SCRAPE_SECONDS)
    figure = draw_dashboard(DASHBOARD, Source(stack.prometheus, window, SCRAPE_SECONDS))
    assert overlaps(figure, DASHBOARD) == []


VISIBLE = (
    "Array.from(document.querySelectorAll('#workloads tbody tr'))"
    ".filter(r => !r.hidden).map(r => r.dataset.workload)"
)


def test_the_page_sorts_and_filters_in_a_real_browser(stack: Stack, tmp_path: Path) -> None:
    with browser(tmp_path) as page:
        page.navigate(stack.server.url + "/")
        assert len(page.evaluate(VISIBLE)) == 11
        assert page.evaluate("document.getElementById('shown').textContent").startswith(
            "11 of 11 workloads, $"
        )
        page.choose("#f-cluster", "staging")
        assert page.evaluate(VISIBLE) == [
            "staging: research/notebook-alice",
            "staging: serving/chat-small",
        ]
        assert page.evaluate("location.hash") == "#cluster=staging"
        page.choose("#f-cluster", "")
        page.type("#f-q", "rerank")
        assert page.evaluate(VISIBLE) == ["prod: serving/rerank"]
        page.clear("#f-q")
        page.choose("#f-class", "underused")
        page.choose("#f-confidence", "high")
        assert page.evaluate(VISIBLE) == ["prod: serving/rerank"]
        page.choose("#f-confidence", "")
        underused = page.evaluate(VISIBLE)
        assert len(underused) == 5
        savings = (
            "Array.from(document.querySelectorAll('#workloads tbody tr'))"
            ".filter(r => !r.hidden).map(r => Number(r.dataset.savings))"
        )
        descending = page.evaluate(savings)
        assert descending == sorted(descending, reverse=True)
        page.click("th[data-key='savings']")  # savings were descending: now ascending
        assert sorted(page.evaluate(VISIBLE)) == sorted(underused)
        assert page.evaluate(savings) == sorted(descending)
        assert page.evaluate("location.hash") == "#class=underused&sort=savings&order=asc"
        assert (
            page.evaluate(
                "document.querySelector(\"th[data-key='savings']\").getAttribute('aria-sort')"
            )
            == "ascending"
        )
        # A link with a filtered, sorted view opens as it was left.
        page.navigate(stack.server.url + "/#namespace=training&sort=workload")
        assert page.evaluate("document.getElementById('f-namespace').value") == "training"
        assert page.evaluate(VISIBLE) == [
            "prod: training/embed-finetune",
            "prod: training/llm-pretrain",
            "prod: training/resnet-train",
        ]
        page.navigate(stack.server.url + "/#class=underused")
        page.click("#workloads tbody tr:not([hidden]) details summary")
        assert page.evaluate(
            "document.querySelector('#workloads tbody tr:not([hidden]) details').open"
        )
        shot = tmp_path / "page.png"
        page.screenshot(shot)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (WIDTH, HEIGHT)
    assert len(data) > 60_000, "a page of plots, tables and text, not a blank one"


WIDTHS = (
    "[window.innerWidth, document.documentElement.scrollWidth,"
    " document.getElementById('workloads').scrollWidth,"
    " document.getElementById('workloads').getBoundingClientRect().right]"
)
OPEN_EVERY_DETAIL = (
    "document.querySelectorAll('#workloads details').forEach(d => { d.open = true; })"
)


def test_the_unfiltered_table_fits_a_1400_px_window(stack: Stack, tmp_path: Path) -> None:
    """Every workload of both clusters, every patch and reason opened: the table, and so the
    page, is no wider than the window (a long name breaks, a patch scrolls in its cell)."""
    with browser(tmp_path, width=1400) as page:
        page.navigate(stack.server.url + "/")
        assert len(page.evaluate(VISIBLE)) == 11
        page.evaluate(OPEN_EVERY_DETAIL)
        window, document, table, right = page.evaluate(WIDTHS)
        assert window == 1400
        assert max(document, table, right) <= window, (document, table, right)
        width, _ = page.whole_page_screenshot(tmp_path / "whole-page.png")
    assert width <= 1400


def test_a_failed_refresh_keeps_the_last_report(stack: Stack) -> None:
    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "error", "errorType": "bad_data", "error": "no"}, status=400
        )

    config = load_serve(
        [f"--prometheus={stack.prometheus.url}", f"--end={END}", "--cluster-label=cluster"], {}
    )
    refresher = Refresher(config)

    async def twice(broken: str) -> tuple[bool, bool]:
        first = await refresher.refresh()
        made = refresher.published
        assert made is not None
        for body in (made.page, made.document):  # compressed once, held with the report
            assert gzip.decompress(body.gzipped) == body.plain
        run = config.run
        refresher.config = replace(
            config, run=replace(run, connection=replace(run.connection, url=broken))
        )
        second = await refresher.refresh()
        assert refresher.published is made, "the last report stays"
        return first, second

    try:
        with receiving(refuse) as broken:
            assert asyncio.run(twice(broken)) == (True, False)
    finally:
        refresher.close()
    assert (refresher.successes, refresher.failures, refresher.last_ok) == (1, 1, False)
    families = {family.name: family for family in refresher.families()}
    assert families["gpuscope_rightsize_last_refresh_success"].samples[0].value == 0
    assert refresher.alive() == (True, "ok")


def test_a_server_behind_basic_auth_whose_prometheus_refuses(tmp_path: Path) -> None:
    async def refuse(_request: web.Request) -> web.Response:
        return web.json_response({"status": "error", "error": "no"}, status=400)

    password = "s3cret"
    config = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    config.write_text(f"basic_auth_users:\n  alice: {hashed}\n")
    credentials = {
        "Authorization": "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    }
    with (
        receiving(refuse) as broken,
        serving(broken, free_port(), f"--web.config.file={config}") as server,
    ):
        assert "refresh failed; the last report stays served" in server.text()
        assert server.get("/-/healthy") == (200, b"ok\n"), "probes need no credentials"
        assert server.get("/-/ready") == (503, b"no report yet\n")
        assert server.get("/metrics")[0] == 401
        assert server.get("/")[0] == 401
        status, body = server.get("/metrics", credentials)
        assert status == 200
        assert 'gpuscope_rightsize_refreshes_total{result="failure"} 1.0' in body.decode()
        assert "gpuscope_rightsize_last_refresh_success 0.0" in body.decode()
        assert "gpuscope_recommendation_info" not in body.decode()
        status, page = server.get("/", credentials)
        assert (status, page) == (503, b"the first report is being made; retry in a moment\n")
