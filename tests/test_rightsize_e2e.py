"""`gpuscope rightsize` as a user runs it, against a real Prometheus holding known history.

14 days of history for the workloads of `tests/rightsize_scenario.py` are written as OpenMetrics,
backfilled with `promtool tsdb create-blocks-from openmetrics`, and served by a real Prometheus
on loopback; every assertion below is the answer that scenario was built to have.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import yaml
from aiohttp import web

from tests.helpers import ROOT, require_tool
from tests.prometheus_server import free_port, running_prometheus
from tests.rightsize_demo import screenshot as draw
from tests.rightsize_run import rightsize
from tests.rightsize_run import serving as receiving
from tests.rightsize_scenario import CALIBRATION, END, WORKLOADS
from tests.synthetic_history import backfill, write_openmetrics

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DAY = 86400
HOURS = 730.0
PRICES = {"H100 SXM": 6.88, "A100 80GB SXM": 3.43, "A100 40GB SXM": 2.74}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    promtool = require_tool("promtool")
    root = tmp_path_factory.mktemp("rightsize-prometheus")
    openmetrics = root / "history.om"
    with openmetrics.open("w") as out:
        # Scraped every 2 minutes, a little more than the 14-day window.
        write_openmetrics(
            out, WORKLOADS, end=END, duration=14 * DAY + 3600, interval=120, calibration=CALIBRATION
        )
    backfill(promtool, openmetrics, root / "data")
    openmetrics.unlink()
    with running_prometheus(root / "data") as url:
        yield url


def report_json(prometheus: str, *args: str) -> dict[str, Any]:
    result = rightsize("--prometheus", prometheus, f"--end={END}", "--format=json", *args)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_each_workload_gets_the_answer_its_history_was_built_for(prometheus: str) -> None:
    document = report_json(prometheus)
    workloads = {w["workload"]: w for w in document["workloads"]}
    answers = {name: (w["classification"], w["recommended"]) for name, w in workloads.items()}
    assert answers == {
        "notebook-alice": ("idle", "release"),
        "chat-small": ("underused", "A100 80GB SXM MIG 1g.10gb"),
        "embed-finetune": ("memory-bound", "A100 80GB SXM"),
        "llm-pretrain": ("compute-bound", "H100 SXM"),
        "resnet-train": ("input-bound", "A100 40GB SXM"),
        "new-ranker": ("undefined", "-"),
        "tts": ("underused", "A100 80GB SXM MIG 2g.20gb"),
        "asr": ("underused", "A100 80GB SXM MIG 2g.20gb"),
        "rerank": ("underused", "A100 80GB SXM MIG 2g.20gb"),
    }
    # The reasons carry what was measured.
    assert workloads["chat-small"]["demand"]["compute_signal"] == "SM activity"
    assert workloads["chat-small"]["demand"]["roofline_side"] == "memory"
    assert 0.07 < workloads["chat-small"]["usage"]["sm_active_quantile"] < 0.08
    assert workloads["llm-pretrain"]["demand"]["roofline_side"] == "compute"
    assert workloads["llm-pretrain"]["gpus_held"] == pytest.approx(8, abs=0.01)
    assert "memory capacity" in workloads["embed-finetune"]["reason"]
    assert workloads["tts"]["current"]["shared_by"] == 2
    assert workloads["tts"]["demand"]["compute_signal"] == "utilization"
    assert workloads["new-ranker"]["reason"].startswith("not enough data: 2h")
    assert workloads["notebook-alice"]["usage"]["idle_ratio"] == 1.0
    (change,) = workloads["resnet-train"]["cpu_changes"]
    # GPU busy 35% on average against an 80% target: 2.29x the 4-core limit, in half cores.
    assert (change["limit_cores"], change["recommended_limit_cores"]) == (4.0, 9.5)


def test_savings_arithmetic_follows_the_prices(prometheus: str) -> None:
    document = report_json(prometheus)
    workloads = {w["workload"]: w for w in document["workloads"]}

    def month(name: str, share: float = 1.0) -> float:
        return round(PRICES[name] * share * HOURS, 2)

    expected = {
        "notebook-alice": (month("H100 SXM"), 0.0),
        "chat-small": (month("A100 80GB SXM"), month("A100 80GB SXM", 1 / 7)),
        "tts": (month("A100 80GB SXM", 1 / 2), month("A100 80GB SXM", 2 / 7)),
        "asr": (month("A100 80GB SXM", 1 / 2), month("A100 80GB SXM", 2 / 7)),
        "embed-finetune": (month("A100 80GB SXM"), month("A100 80GB SXM")),
        "llm-pretrain": (month("H100 SXM", 8), month("H100 SXM", 8)),
        "resnet-train": (month("A100 40GB SXM"), month("A100 40GB SXM")),
        "rerank": (month("A100 80GB SXM", 3), month("A100 80GB SXM", 3 * 2 / 7)),
    }
    for name, (current, recommended) in expected.items():
        row = workloads[name]
        assert row["cost_current_usd_per_month"] == pytest.approx(current, rel=2e-3), name
        assert row["cost_recommended_usd_per_month"] == pytest.approx(recommended, rel=2e-3), name
        assert row["savings_usd_per_month"] == pytest.approx(
            row["cost_current_usd_per_month"] - row["cost_recommended_usd_per_month"], abs=0.011
        )
    new = workloads["new-ranker"]
    assert new["savings_usd_per_month"] == 0.0
    assert new["cost_current_usd_per_month"] == pytest.approx(
        6.88 * HOURS * 2 / (14 * 24), rel=0.05
    )

    summary = document["summary"]
    assert summary["savings_usd_per_month"] == pytest.approx(
        sum(w["savings_usd_per_month"] for w in workloads.values()), abs=0.05
    )
    assert summary["savings_usd_per_year"] == pytest.approx(
        summary["savings_usd_per_month"] * 12, abs=0.1
    )
    namespaces = {n["namespace"]: n for n in document["namespaces"]}
    assert namespaces["research"]["savings_usd_per_month"] == pytest.approx(
        month("H100 SXM"), rel=2e-3
    )
    assert namespaces["training"]["savings_usd_per_month"] == 0.0
    assert namespaces["serving"]["savings_usd_per_month"] == pytest.approx(
        sum(
            workloads[n]["savings_usd_per_month"]
            for n in ("chat-small", "tts", "asr", "new-ranker", "rerank")
        ),
        abs=0.05,
    )
    consolidation = document["consolidation"]
    # Before: 10 H100s, 6 A100 80GB (one time-sliced by tts and asr, three for rerank's
    # replicas), 1 A100 40GB. After: the idle H100 released; chat-small's 1g.10gb and five
    # 2g.20gb (tts, asr, rerank's three) fit on two A100 80GB, embed-finetune keeps its own.
    assert (consolidation["gpus_before"], consolidation["gpus_after"]) == (17, 13)
    models = {m["model"]: (m["gpus_before"], m["gpus_after"]) for m in consolidation["models"]}
    assert models == {"H100 SXM": (10, 9), "A100 80GB SXM": (6, 3), "A100 40GB SXM": (1, 1)}
    assert consolidation["utilization_after"] > consolidation["utilization_before"]
    assert "fit on 13 GPUs" in summary["business_case"]


def test_calibrated_ceilings_from_prometheus_draw_the_roofline(prometheus: str) -> None:
    rooflines = {r["model"]: r for r in report_json(prometheus)["rooflines"]}
    h100 = rooflines["H100 SXM"]
    assert (h100["peak_flops"], h100["peak_flops_source"]) == (800e12, "calibrated")
    assert h100["memory_bandwidth_bytes_per_second"] == 3.0e12
    (point,) = h100["points"]
    assert point["workload"] == "training/Job/llm-pretrain"
    # tensor 75% of 800 TFLOP/s against DRAM 35% of 3 TB/s.
    assert point["intensity_flop_per_byte"] == pytest.approx(0.75 * 800 / (0.35 * 3.0), rel=0.02)
    assert rooflines["A100 80GB SXM"]["peak_flops_source"] == "datasheet"


def test_namespace_and_label_selector_narrow_the_report(prometheus: str) -> None:
    serving = report_json(prometheus, "--namespace=serving")
    assert {w["workload"] for w in serving["workloads"]} == {
        "chat-small",
        "new-ranker",
        "tts",
        "asr",
        "rerank",
    }
    research = report_json(prometheus, "--selector=team in (research, vision),team!=serving")
    assert {w["workload"] for w in research["workloads"]} == {
        "notebook-alice",
        "embed-finetune",
        "llm-pretrain",
        "resnet-train",
    }
    both = report_json(prometheus, "--namespace=training,research", "--selector=team=vision")
    assert [w["workload"] for w in both["workloads"]] == ["resnet-train"]


def test_min_confidence_leaves_out_what_is_less_trusted(prometheus: str) -> None:
    document = report_json(prometheus, "--min-confidence=high")
    kept = {w["workload"]: w["confidence"] for w in document["workloads"]}
    # Left out: new-ranker (low: 2 hours), chat-small (medium: its memory close to the 1g.10gb's),
    # tts (medium: its compute close to the 2g.20gb's), asr (medium: rising, the last day disagrees).
    assert kept == dict.fromkeys(
        ("notebook-alice", "embed-finetune", "llm-pretrain", "resnet-train", "rerank"), "high"
    )
    assert document["summary"]["left_out_below_min_confidence"] == 4
    assert (
        "4 recommendations below high confidence are left out."
        in (document["summary"]["business_case"])
    )


def test_human_formats_on_the_real_report(prometheus: str, tmp_path: Path) -> None:
    table = rightsize("--prometheus", prometheus, f"--end={END}")
    assert table.returncode == 0, table.stderr
    assert "serving/chat-small" in table.stdout
    assert "A100 80GB SXM MIG 1g.10gb" in table.stdout
    assert "\x1b[" not in table.stdout  # not a terminal: no colour codes
    # 27 over the window, 17 over each shorter term (the last day and week), the check, and
    # OpenCost's prices.
    assert 'msg="report ready" workloads=9 queries=63' in table.stderr
    for name, check in (
        (
            "markdown",
            lambda text: text.startswith("# GPU rightsizing: 14d to 2026-05-28T20:30:00Z"),
        ),
        ("csv", lambda text: text.count("\n") == 10),
        ("yaml", lambda text: yaml.safe_load(text)["summary"]["workloads"] == 9),
    ):
        out = tmp_path / f"report.{name}"
        result = rightsize(
            "--prometheus", prometheus, f"--end={END}", f"--format={name}", f"--output={out}"
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        assert check(out.read_text()), name


def test_html_report_renders_in_headless_chromium(prometheus: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = rightsize(
        "--prometheus", prometheus, f"--end={END}", "--format=html", f"--output={page}"
    )
    assert result.returncode == 0, result.stderr
    screenshot = tmp_path / "report.png"
    draw(page, screenshot, tmp_path)
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 1500)
    # A blank page compresses to a few kB; plots, tables and text do not.
    assert len(data) > 60_000


def test_patches_and_notifications_from_a_run(prometheus: str, tmp_path: Path) -> None:
    """A run writes the patches directory and posts its summary; a webhook that cannot be reached
    is one log line naming it without its secret, and the run still succeeds."""
    secret = "T0000/B0000/run-secret"
    posted: list[tuple[str, Any]] = []

    async def receive(request: web.Request) -> web.Response:
        posted.append((request.path, await request.json()))
        return web.Response(text="ok")

    out = tmp_path / "patches"
    dead = f"http://127.0.0.1:{free_port()}"
    with receiving(receive) as hooks:
        result = rightsize(
            "--prometheus",
            prometheus,
            f"--end={END}",
            "--format=patches",
            f"--output={out}",
            f"--notify=teams+{hooks}/{secret}",
            f"--notify=json+{dead}/{secret}",
            "--notify-timeout=2s",
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert sorted(path.name for path in out.iterdir()) == [
        "apply.sh",
        "research.statefulset.notebook-alice.yaml",
        "serving.deployment.asr.yaml",
        "serving.deployment.chat-small.yaml",
        "serving.deployment.rerank.yaml",
        "serving.deployment.tts.yaml",
        "training.job.resnet-train.yaml",
    ]
    script = (out / "apply.sh").read_text()
    assert script.index("rerank") < script.index("chat-small"), "most saved first"
    assert "# kubectl patch --local --filename=MANIFEST.yaml" in script  # resnet-train, a Job
    ((path, card),) = posted
    assert path == f"/{secret}"
    assert card["attachments"][0]["content"]["type"] == "AdaptiveCard"
    assert 'msg="notification sent" webhook="teams http://127.0.0.1:' in result.stderr
    assert 'msg="notification failed" webhook="json http://127.0.0.1:' in result.stderr
    assert "cannot connect: connection refused" in result.stderr
    assert secret not in result.stderr


class _FakeKubernetes(BaseHTTPRequestHandler):
    """Just enough of the API server for a ConfigMap: PUT (404 until created), POST."""

    stored: ClassVar[dict[str, dict[str, Any]]] = {}
    calls: ClassVar[list[str]] = []

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        return document

    def do_PUT(self) -> None:
        self.calls.append(f"PUT {self.path} {self.headers.get('Authorization')}")
        if self.path not in self.stored:
            self._send(
                404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
            )
            return
        self.stored[self.path] = self._body()
        self._send(200, self.stored[self.path])

    def do_POST(self) -> None:
        self.calls.append(f"POST {self.path}")
        body = self._body()
        self.stored[f"{self.path}/{body['metadata']['name']}"] = body
        self._send(201, body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_configmap_output_creates_then_replaces(prometheus: str, tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeKubernetes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"},
                    }
                ],
                "users": [{"name": "job", "user": {"token": "sa-token"}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "job"}}],
                "current-context": "test",
            }
        )
    )
    env = {"KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}
    try:
        for _ in range(2):
            result = rightsize(
                "--prometheus",
                prometheus,
                f"--end={END}",
                "--format=markdown",
                "--configmap=gpuscope/rightsize-report",
                env=env,
            )
            assert result.returncode == 0, result.stderr
    finally:
        server.shutdown()
    path = "/api/v1/namespaces/gpuscope/configmaps/rightsize-report"
    assert _FakeKubernetes.calls == [
        f"PUT {path} Bearer sa-token",
        "POST /api/v1/namespaces/gpuscope/configmaps",
        f"PUT {path} Bearer sa-token",
    ]
    stored = _FakeKubernetes.stored[path]
    assert stored["data"]["report.md"] == result.stdout
    assert stored["metadata"]["annotations"]["gpuscope.io/generated-at"] == "2026-05-28T20:30:00Z"


def test_unreachable_prometheus_is_one_line_and_status_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = rightsize("--prometheus", url, "--log.level=error")
    assert result.returncode == 1
    assert result.stderr == (
        f"gpuscope rightsize: error: cannot reach Prometheus at {url}: connection refused (4 attempts)\n"
    )


def test_unauthorized_prometheus_is_one_line_and_status_1(tmp_path: Path) -> None:
    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("wrong\n")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        result = rightsize("--prometheus", url, f"--prometheus.bearer-token-file={token}")
    finally:
        server.shutdown()
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        (
            f"gpuscope rightsize: error: Prometheus at {url} refused the request (HTTP 401): check "
            "the bearer token or basic-auth credentials (--prometheus.bearer-token-file, "
            "--prometheus.username)"
        )
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [],
            (
                "invalid --prometheus: required (the flag, GPUSCOPE_RIGHTSIZE_PROMETHEUS or "
                "prometheus in --config.file)"
            ),
        ),
        (
            ["--prometheus=prometheus:9090"],
            "invalid --prometheus: 'prometheus:9090' is not an http:// or https:// URL",
        ),
        (
            ["--window=2w3"],
            "invalid --window: '2w3' is not a duration (missing unit?); use e.g. 500ms, 1s, 5m, 1h30m",
        ),
        (["--step=1s"], "invalid --step: 1s is outside 10s..1d"),
        (["--window=1h", "--step=1h"], "invalid --window: must span at least two steps"),
        (
            ["--format=pdf"],
            "invalid --format: 'pdf' is not one of json, yaml, csv, markdown, table, html, patches",
        ),
        (["--strategy=magic"], "invalid --strategy: 'magic' is not one of simple"),
        (["--percentile=101"], "invalid --percentile: 101% is outside 50..100%"),
        (
            ["--models=h100,l4"],
            "invalid --models: h100 not in the catalog (use keys like h100-sxm, l4)",
        ),
        (
            ["--namespace=Bad_NS"],
            "invalid --namespace: 'Bad_NS' is not a Kubernetes namespace name",
        ),
        (
            ["--selector=tier in (a"],
            "invalid --selector: selector 'tier in (a': unbalanced parentheses",
        ),
        (["--end=yesterday"], "invalid --end: 'yesterday' is neither RFC 3339 nor unix seconds"),
        (
            ["--configmap=report"],
            "invalid --configmap: 'report' is not NAMESPACE/NAME (e.g. gpuscope/gpuscope-rightsize)",
        ),
        (
            ["--prometheus.header=X-Scope-OrgID"],
            (
                "invalid --prometheus.header: header #1 is not 'Name: value' (not shown: it may "
                "be secret)"
            ),
        ),
        (
            ["--prometheus.concurrency=0"],
            "invalid --prometheus.concurrency: '0' is outside 1..32",
        ),
        (
            ["--prometheus.ca-file=/nonexistent.pem"],
            "invalid --prometheus.ca-file: '/nonexistent.pem' is not a readable file",
        ),
        (
            ["--prometheus.bearer-token-file=/nonexistent"],
            "invalid --prometheus.bearer-token-file: '/nonexistent' is not a readable file",
        ),
        (
            ["--prices=/nonexistent.yaml"],
            "invalid --prices: '/nonexistent.yaml' is not a readable file",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], message: str) -> None:
    if not any(a.startswith("--prometheus=") for a in args) and args:
        args = ["--prometheus=http://127.0.0.1:1", *args]
    result = rightsize(*args)
    assert result.returncode == 2
    assert result.stderr == f"gpuscope rightsize: error: {message}\n"


def test_a_password_without_a_user_is_refused() -> None:
    result = rightsize(
        "--prometheus=http://127.0.0.1:1", env={"GPUSCOPE_PROMETHEUS_PASSWORD": "secret"}
    )
    assert result.returncode == 2
    assert result.stderr == (
        "gpuscope rightsize: error: invalid GPUSCOPE_PROMETHEUS_PASSWORD: "
        "a password needs --prometheus.username\n"
    )
    assert "secret" not in result.stderr


def test_bad_price_file_entries_are_named(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  h100-sxm: 4.1\n  tpu-v5: 1.2\n")
    result = rightsize("--prometheus=http://127.0.0.1:1", f"--prices={prices}")
    assert result.returncode == 2
    assert (
        result.stderr
        == f"gpuscope rightsize: error: invalid --prices: {prices}: prices.tpu-v5: no such GPU model in the catalog\n"
    )


def test_price_file_overrides_the_catalog(prometheus: str, tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  NVIDIA H100 80GB HBM3: 2.0\n")
    document = report_json(prometheus, f"--prices={prices}", "--namespace=research")
    (notebook,) = document["workloads"]
    assert notebook["savings_usd_per_month"] == pytest.approx(2.0 * HOURS, rel=2e-3)


def test_the_daemon_never_loads_the_rightsizing_code() -> None:
    probe = (
        "import sys, exporter.cli, exporter.app;"
        "loaded = [m for m in sys.modules if m.startswith('exporter.rightsize')];"
        "print(loaded)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]"


def test_auto_reads_the_daemons_series_where_the_window_has_them(prometheus: str) -> None:
    result = rightsize("--prometheus", prometheus, f"--end={END}", "--format=json", "--source=auto")
    assert result.returncode == 0, result.stderr
    assert "source=gpuscope" in result.stderr
    assert 'why="gpu_allocation_info found"' in result.stderr
    document = json.loads(result.stdout)
    assert document["history_source"] == "gpuscope"
    assert len(document["workloads"]) == 9
    # gpuscope's own series are calibrated and say when a process ran: nothing missing.
    assert document["missing_signals"] == []
