"""`gpuscope rightsize --simulate` against a real Prometheus holding history with known answers
(`tests/replay_history.py`, backfilled with promtool): eight services whose peaks never meet,
the same eight peaking together on three time-sliced GPUs, and memory-bound workloads. Every
figure a placement reports is recomputed here from the levels the series were written from.

`gpuscope rightsize serve --simulate` on the same history, scraped by that Prometheus: the
Rightsizing dashboard's replay panels show what it replayed, and its page draws the replay in
headless Chromium. (tests/test_rightsize_server.py's stack replays nothing: on its 14 days of
5-minute steps the replay's queries take a minute.)"""

from __future__ import annotations

import json
import struct
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from dashboards import promql
from dashboards.live import Prometheus
from tests.dashboard_queries import SCRAPE_SECONDS, grafana_values
from tests.helpers import ROOT, eventually, require_tool
from tests.prometheus_server import free_port, running_prometheus
from tests.replay_history import Service, write
from tests.rightsize_browser import HEIGHT, WIDTH, browser
from tests.rightsize_run import rightsize
from tests.rightsize_stack import serving
from tests.synthetic_history import backfill

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.rightsize_stack import Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

END = 1_779_998_400
"""A multiple of the step, in the past."""
STEP = 600
PERIOD = 48
"""Steps per period: eight slots of six steps."""
STEPS = 2 * PERIOD
BASE, PEAK = 0.15, 0.39
A100_80GB_PER_MONTH = 3.43 * 730
POLICIES = "current,exclusive,mig,timeslice,binpack"


def _staggered(slot: int) -> Any:
    return lambda k: PEAK if (k % PERIOD) // 6 == slot else BASE


def _together(k: int) -> float:
    return PEAK if k % PERIOD < 8 else BASE


SERVICES = [
    *(Service("staggered", f"svc-{i}", _staggered(i), 10) for i in range(8)),
    *(
        Service("together", f"svc-{i}", _together, 10, shared_uuid=f"GPU-shared-{i // 3}")
        for i in range(8)
    ),
    *(Service("memory", f"db-{i}", lambda _k: 0.05, 50, kind="StatefulSet") for i in range(4)),
]
LEVELS = {(s.namespace, s.name): s.level for s in SERVICES}
MEMORY = {(s.namespace, s.name): s.memory_gib for s in SERVICES}


@pytest.fixture(scope="module")
def server_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, server_port: int) -> Iterator[str]:
    """The history, and scraping where `server` listens (refused until a test starts it)."""
    promtool = require_tool("promtool")
    root = tmp_path_factory.mktemp("replay-prometheus")
    openmetrics = root / "history.om"
    with openmetrics.open("w") as out:
        write(out, SERVICES, end=END, steps=STEPS, step=STEP)
    backfill(promtool, openmetrics, root / "data")
    openmetrics.unlink()
    with running_prometheus(
        root / "data", scrape=(f"127.0.0.1:{server_port}", SCRAPE_SECONDS)
    ) as url:
        yield url


def _run(prometheus: str, namespace: str, output: str = "json") -> str:
    result = rightsize(
        "--prometheus",
        prometheus,
        f"--end={END}",
        f"--window={STEPS * STEP}s",
        f"--step={STEP}s",
        f"--namespace={namespace}",
        "--models=a100-sxm4-80gb",
        f"--simulate={POLICIES}",
        f"--format={output}",
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _simulation(prometheus: str, namespace: str) -> dict[str, dict[str, Any]]:
    document = json.loads(_run(prometheus, namespace))
    return {entry["policy"]: entry for entry in document["simulation"]}


def _recomputed(namespace: str, placements: list[dict[str, Any]]) -> tuple[float, float, float]:
    """From the levels the series were written from: the highest per-step demand on a shared
    GPU, the share of steps some shared GPU is asked for more than all of it, and the most
    memory (GiB) placed on one GPU."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for placement in placements:
        assert placement["namespace"] == namespace
        if placement["group"] is not None:
            groups[placement["group"]].append((namespace, placement["workload"]))
    highest, contended, memory = 0.0, set(), max(MEMORY.values())
    for members in groups.values():
        memory = max(memory, sum(MEMORY[key] for key in members))
        for k in range(STEPS):
            load = sum(LEVELS[key](k) for key in members)
            highest = max(highest, load)
            if load > 1:
                contended.add(k)
    return highest, len(contended) / STEPS, memory


def test_staggered_peaks_fit_three_time_sliced_gpus(prometheus: str) -> None:
    results = _simulation(prometheus, "staggered")
    assert list(results) == POLICIES.split(",")
    assert {policy: r["gpus"]["max"] for policy, r in results.items()} == {
        "current": 8,
        "exclusive": 8,
        "mig": 4,
        "timeslice": 3,
        "binpack": 3,
    }
    busy = PEAK + 7 * BASE
    assert results["current"]["utilization_mean"] == pytest.approx(busy / 8, abs=1e-3)
    assert results["timeslice"]["utilization_mean"] == pytest.approx(busy / 3, abs=1e-3)
    assert results["current"]["cost_usd_per_month"] == pytest.approx(8 * A100_80GB_PER_MONTH)
    assert results["timeslice"]["cost_usd_per_month"] == pytest.approx(3 * A100_80GB_PER_MONTH)
    for result in results.values():
        assert result["contention_share"] == 0
        assert result["memory_overcommit_steps"] == 0
        assert len(result["placements"]) == 8
    placements = results["timeslice"]["placements"]
    assert placements[0] == {
        "namespace": "staggered",
        "kind": "Deployment",
        "workload": "svc-0",
        "gpu_model": "A100 80GB SXM",
        "mig_profile": None,
        "group": placements[0]["group"],
    }
    assert len({p["group"] for p in placements}) == 3
    highest, contention, memory = _recomputed("staggered", placements)
    assert highest <= 0.8 + 1e-9
    assert contention == results["timeslice"]["contention_share"] == 0
    assert memory <= 80
    assert {p["mig_profile"] for p in results["mig"]["placements"]} == {"3g.40gb"}


def test_the_same_services_peaking_together_contend_on_three_and_need_four(
    prometheus: str,
) -> None:
    results = _simulation(prometheus, "together")
    current = results["current"]
    assert current["gpus"] == {"p50": 3, "p95": 3, "max": 3}
    _, contention, _ = _recomputed("together", current["placements"])
    assert contention == pytest.approx(1 / 6)
    assert current["contention_share"] == pytest.approx(contention, abs=1e-4)
    assert results["timeslice"]["gpus"]["max"] == 4
    assert results["binpack"]["gpus"]["max"] == 4
    highest, contention, memory = _recomputed("together", results["timeslice"]["placements"])
    assert highest <= 0.8 + 1e-9
    assert contention == results["timeslice"]["contention_share"] == 0
    assert memory <= 80


def test_memory_bound_workloads_never_share(prometheus: str) -> None:
    results = _simulation(prometheus, "memory")
    for policy in ("exclusive", "mig", "timeslice", "binpack"):
        assert results[policy]["gpus"]["max"] == 4, policy
        assert results[policy]["memory_overcommit_steps"] == 0
    assert {p["group"] for p in results["timeslice"]["placements"]} == {None}
    assert {p["group"] for p in results["binpack"]["placements"]} == {None}
    assert {p["mig_profile"] for p in results["mig"]["placements"]} == {"7g.80gb"}
    assert len({p["group"] for p in results["mig"]["placements"]}) == 4


def test_markdown_and_table_say_it_in_a_line_per_policy_and_a_sentence(prometheus: str) -> None:
    markdown = _run(prometheus, "staggered", "markdown")
    sentence = (
        "time-slicing the serving workloads: 8 → 3 A100 80GB SXM GPUs, utilization 18% → 48%, "
        "no step over 80%, $12,520 a month less."
    )
    assert sentence in markdown
    assert "| timeslice | 3/3/3 | 48% | 0.0% of steps | $7,512 | $12,520 |" in markdown
    table = _run(prometheus, "staggered", "table")
    assert "Policy replay" in table
    assert "time-slicing the serving workloads: 8 → 3" in table


# -- the report server, its page and the dashboard ------------------------------------------------

DASHBOARD = json.loads((ROOT / "dashboards" / "rightsizing.json").read_text(encoding="utf-8"))
REPLAY_PANELS = [
    panel
    for panel in promql.panels(DASHBOARD)
    if "gpuscope_simulation" in json.dumps(panel.get("targets", []))
]


@pytest.fixture(scope="module")
def server(prometheus: str, server_port: int) -> Iterator[Server]:
    """The report server replaying every policy for the staggered services, until Prometheus
    has scraped its replay's series."""
    with serving(
        prometheus,
        server_port,
        f"--window={STEPS * STEP}s",
        f"--step={STEP}s",
        "--namespace=staggered",
        "--models=a100-sxm4-80gb",
        f"--simulate={POLICIES}",
        "--refresh=1h",
        end=END,
    ) as running:
        scraped = Prometheus(prometheus)
        eventually(
            lambda: scraped.value("count(gpuscope_simulation_gpus)") == len(POLICIES.split(",")),
            60,
            "Prometheus to scrape the server's replay",
        )
        yield running


def test_the_dashboards_replay_panels_show_what_the_server_replayed(
    prometheus: str, server: Server
) -> None:
    simulation = server.json("/api/v1/report")["simulation"]
    assert isinstance(simulation, list)
    expected = {
        "GPUs each policy needs": {e["policy"]: e["gpus"]["max"] for e in simulation},
        "Utilization under each policy": {e["policy"]: e["utilization_mean"] for e in simulation},
    }
    assert sorted(panel["title"] for panel in REPLAY_PANELS) == sorted(expected)
    assert expected["GPUs each policy needs"]["timeslice"] == 3
    scraped = Prometheus(prometheus)
    for panel in REPLAY_PANELS:
        (target,) = panel["targets"]
        expr = promql.substitute(target["expr"], grafana_values(DASHBOARD))
        answer = scraped.query(expr, at=time.time())
        assert answer["status"] == "success", answer
        shown = {
            row["metric"]["policy"]: float(row["value"][1]) for row in answer["data"]["result"]
        }
        assert shown == pytest.approx(expected[panel["title"]], abs=1e-4), panel["title"]


LEGEND_BOXES = (
    "Array.from(document.querySelectorAll('figure.replay svg text'))"
    ".map(t => { const r = t.getBoundingClientRect();"
    " return [t.textContent, r.left, r.top, r.right, r.bottom]; })"
)


def test_the_served_page_draws_the_replay_in_a_browser(server: Server, tmp_path: Path) -> None:
    """The page's replay chart, scrolled into view: every GPUs line, no text over another or
    out of the chart, and the picture taken."""
    with browser(tmp_path) as page:
        page.navigate(server.url + "/")
        page.evaluate("document.querySelector('figure.replay').scrollIntoView()")
        lines = page.evaluate(
            "Array.from(document.querySelectorAll('figure.replay polyline[data-series=gpus]'))"
            ".map(l => l.dataset.policy)"
        )
        assert sorted(lines) == sorted(POLICIES.split(","))
        chart = page.evaluate(
            "(() => { const r = document.querySelector('figure.replay svg')"
            ".getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })()"
        )
        assert chart[2] <= page.evaluate("window.innerWidth")
        boxes = page.evaluate(LEGEND_BOXES)
        for text, left, top, right, bottom in boxes:
            assert chart[0] <= left, text
            assert right <= chart[2], text
            assert chart[1] <= top, text
            assert bottom <= chart[3], text
        for number, (text, left, top, right, bottom) in enumerate(boxes):
            for other, o_left, o_top, o_right, o_bottom in boxes[number + 1 :]:
                apart = right <= o_left or o_right <= left or bottom <= o_top or o_bottom <= top
                assert apart, (text, other)
        shot = tmp_path / "replay.png"
        page.screenshot(shot)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (WIDTH, HEIGHT)


def test_the_patches_directory_holds_the_winning_placement(prometheus: str, tmp_path: Path) -> None:
    result = rightsize(
        "--prometheus",
        prometheus,
        f"--end={END}",
        f"--window={STEPS * STEP}s",
        f"--step={STEP}s",
        "--namespace=staggered",
        "--models=a100-sxm4-80gb",
        "--simulate=current,timeslice",
        "--format=patches",
        f"--output={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    script = tmp_path / "apply-placement.sh"
    assert script.stat().st_mode & 0o100
    assert "8 pods of 8 workloads on 3 GPUs, 3 per GPU" in script.read_text()
    configmap = yaml.safe_load((tmp_path / "placement.device-plugin-config.yaml").read_text())
    [config] = configmap["data"].values()
    slicing = yaml.safe_load(config)["sharing"]["timeSlicing"]
    assert slicing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 3}]
    assert len(list(tmp_path.glob("placement.staggered.deployment.svc-*.yaml"))) == 8
