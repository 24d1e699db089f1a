"""The two scrapes of the dcgm-exporter compatibility tests (tests/test_dcgm_live.py for 4.8's
shapes, tests/test_dcgm_live_49.py for 4.9's): the demo node scraped as a ServiceMonitor would,
with and without `honor_labels`, and the helpers their queries share."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any, Final

import pytest
import yaml

from dashboards.live import LiveStack, Prometheus
from tests.helpers import ROOT, require_tool

HONOR: Final = "gpuscope"
PLAIN: Final = "dcgm-plain"
INSTANCE: Final = "sim-a:9455"
EXPORTER_POD: Final = {"namespace": "gpuscope", "pod": "gpuscope-7xk2p", "container": "gpuscope"}
"""The labels a ServiceMonitor's target carries: the gpuscope pod's own."""
WINDOW: Final = "30s"
MIB: Final = 2**20
SHARED_GPU: Final = "1"
SHARING_PODS: Final = {"chat-api-6b9f7c5d4-7xq2m", "embedder-5c8d9f7b6-k4t8p"}


def chart_relabelings() -> list[dict[str, Any]]:
    """The ServiceMonitor's metricRelabelings the chart renders for `compat.dcgmExportedLabels`,
    in prometheus.yml's spelling."""
    rendered = subprocess.run(
        [
            require_tool("helm"),
            "template",
            "gpuscope",
            str(ROOT / "helm" / "gpuscope"),
            "--set",
            "compat.dcgm=true,compat.dcgmExportedLabels=true,serviceMonitor.enabled=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    (monitor,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceMonitor"]
    spelled = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [
        {spelled.get(key, key): value for key, value in rule.items()}
        for rule in monitor["spec"]["endpoints"][0]["metricRelabelings"]
    ]


@dataclass
class TwoScrapes(LiveStack):
    """The demo node scraped by two jobs, as described above."""

    relabelings: tuple[dict[str, Any], ...] = ()

    def config(self) -> dict[str, Any]:
        (port,) = self.ports.values()

        def job(name: str, instance: str, *, honor: bool) -> dict[str, Any]:
            scrape: dict[str, Any] = {
                "job_name": name,
                "honor_labels": honor,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        "labels": {"node": "sim-a", "instance": instance, **EXPORTER_POD},
                    }
                ],
            }
            if honor:
                scrape["metric_relabel_configs"] = list(self.relabelings)
            return scrape

        return {
            "global": {"scrape_interval": self.interval, "scrape_timeout": self.interval},
            "scrape_configs": [
                job(HONOR, INSTANCE, honor=True),
                job(PLAIN, "sim-a-plain:9455", honor=False),
            ],
        }


@dataclass(frozen=True)
class Scraped:
    """The Prometheus, and an instant at which every query runs: the last scrape that had
    every series (while NVML re-initialises after the demo node's lost GPU, GPM series skip a
    cycle, and Prometheus marks them stale)."""

    prometheus: Prometheus
    at: float

    def query(self, expr: str) -> dict[str, Any]:
        return self.prometheus.query(expr, at=self.at)

    def series(self, selector: str) -> dict[str, Any]:
        return self.prometheus.series(selector, start=self.at - 300, end=self.at)


def results(prometheus: Scraped, expr: str) -> list[tuple[dict[str, str], float]]:
    answer = prometheus.query(expr)
    assert answer["status"] == "success", f"{expr}\n{answer.get('error')}"
    found = [(item["metric"], float(item["value"][1])) for item in answer["data"]["result"]]
    assert found, f"no data for {expr}"
    return found


def by(prometheus: Scraped, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
    found: dict[tuple[str, ...], float] = {}
    for metric, number in results(prometheus, expr):
        key = tuple(metric.get(label, "") for label in labels)
        assert key not in found, (expr, key)
        found[key] = number
    return found


def substitute(expr: str, gpus: str) -> str:
    return expr.replace("$instance", INSTANCE).replace("$gpu", gpus)


def own_series(gpus: str) -> dict[str, str]:
    """gpuscope's own series for each panel of NVIDIA's dashboard, in gpuscope's units: each
    version's test scales them to the units its dashboard shows."""
    own = f'{{instance="{INSTANCE}",gpu=~"{gpus}",gpu_instance=""}}'
    at = 'and on (gpu) gpu_up{instance="' + INSTANCE + '",gpu_instance=""} == 1'
    return {
        "GPU Temperature": f"gpu_temperature_celsius{own}",
        "GPU Avg. Temp": f"avg(gpu_temperature_celsius{own} {at})",
        "GPU Power Usage": f"gpu_power_watts{own}",
        "GPU Power Total": f"sum(gpu_power_watts{own} {at})",
        "GPU SM Clocks": f'gpu_clock_hertz{{clock="sm",{own[1:-1]}}}',
        "GPU Utilization": f"gpu_utilization_ratio{own}",
        "GPU Framebuffer Mem Used": f"gpu_memory_used_bytes{own}",
        "Tensor Core Utilization": f"gpu_tensor_active_ratio{own}",
    }


def assert_panel_shows(prometheus: Scraped, panel: str, expr: str, expected: str) -> None:
    """The panel's query `expr` shows the numbers of gpuscope's `expected`: one number for the
    node, or per GPU, the shared GPU's lines (a line per pod and one for the rest) adding up to
    the device's."""
    if "(" in expr.split("{", maxsplit=1)[0]:  # one number for the node
        (got,) = by(prometheus, expr).values()
        (want,) = by(prometheus, expected).values()
        assert got == pytest.approx(want, rel=1e-6), panel
        return
    shown = results(prometheus, expr)
    summed: dict[str, float] = {}
    for metric, number in shown:
        if "GPU_I_ID" not in metric:
            summed[metric["gpu"]] = summed.get(metric["gpu"], 0.0) + number
    want = by(prometheus, expected, "gpu")
    assert set(summed) == {gpu for (gpu,) in want}, panel
    for (gpu,), number in want.items():
        assert summed[gpu] == pytest.approx(number, rel=1e-6, abs=1e-6), (panel, gpu)
    per_gpu = [metric["gpu"] for metric, _ in shown if "GPU_I_ID" not in metric]
    if panel in {"GPU Utilization", "GPU Framebuffer Mem Used"}:
        assert per_gpu.count(SHARED_GPU) == len(SHARING_PODS) + 1
        pods = {m.get("pod", "") for m, _ in shown if m["gpu"] == SHARED_GPU}
        assert pods == SHARING_PODS | {""}, "the rest carries no pod, not the gpuscope pod"
    else:
        assert len(per_gpu) == len(set(per_gpu)), "one line per GPU"
