"""The two scrapes of the dcgm-exporter compatibility tests (tests/test_dcgm_live.py for 4.8's
shapes, tests/test_dcgm_live_49.py for 4.9's): the demo node scraped as a ServiceMonitor would,
with and without `honor_labels`, and the helpers their queries share."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any, Final

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
