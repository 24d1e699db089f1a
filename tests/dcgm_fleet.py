"""dcgm-exporter's series of the golden fleet, and reading DCGM expositions back.

`dcgm_exposition()` samples tests/fixtures/fleets/golden.yaml — the fleet behind
tests/golden/metrics.prom — with `--compat.dcgm` and pods on it, for five cycles on a manual
clock, so every value is fixed: a trainer alone on the H100, two pods sharing the L4 through MPS,
a notebook holding the RTX 6000 Ada idle, a pod on a MIG instance, processes outside Kubernetes
on the other instances. tests/test_dcgm_golden.py compares it with tests/golden/metrics-dcgm.prom;
tests/test_dcgm.py checks what it says.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import yaml

from exporter.config import ServeConfig
from exporter.metrics.families import BuildInfo
from exporter.simulator.fleet import parse_fleet
from tests.helpers import FLEETS
from tests.simulated_node import sampled_node

if TYPE_CHECKING:
    from exporter.dcgm_counters import CountersFile
    from exporter.metrics.exposition import Exposition
    from exporter.simulator.fleet import Fleet

NODE: Final = "golden-node"
GOLDEN_PODS: Final[list[dict[str, Any]]] = [
    {
        "name": "trainer-0",
        "namespace": "train",
        "workload": {"kind": "StatefulSet", "name": "trainer"},
        "gpus": [0],
    },
    {
        "name": "embed-7d9c8b6f5-aaaaa",
        "namespace": "serving",
        "workload": {"kind": "Deployment", "name": "embed"},
        "containers": ["server"],
        "gpus": [1],
        "shared": True,
    },
    {
        "name": "rank-7d9c8b6f5-bbbbb",
        "namespace": "serving",
        "workload": {"kind": "Deployment", "name": "rank"},
        "containers": ["server"],
        "gpus": [1],
        "shared": True,
    },
    {"name": "notebook", "namespace": "lab", "containers": ["jupyter"], "gpus": [2]},
    {
        "name": "llm-0",
        "namespace": "serving",
        "workload": {"kind": "StatefulSet", "name": "llm"},
        "gpus": [{"gpu": 4, "mig_instance": 0}],
    },
]
POD_OF: Final = {
    501: "train/trainer-0",
    502: "serving/embed-7d9c8b6f5-aaaaa",
    503: "serving/rank-7d9c8b6f5-bbbbb",
    504: "lab/notebook",
    505: "serving/llm-0",
}
"""Which pod each of the golden fleet's processes runs in; 506 and 507 run outside Kubernetes."""


def golden_fleet_with_pods() -> Fleet:
    document = yaml.safe_load((FLEETS / "golden.yaml").read_text(encoding="utf-8"))
    document["pods"] = GOLDEN_PODS
    for process in document["processes"]:
        if process["pid"] in POD_OF:
            process["pod"] = POD_OF[process["pid"]]
    return parse_fleet(document)


async def dcgm_exposition(
    counters: CountersFile | None = None, *, version: str = "4.8"
) -> Exposition:
    """The golden fleet with pods after five deterministic cycles, under `--compat.dcgm` (and
    `--compat.dcgm-version=version`)."""
    config = replace(
        ServeConfig(),
        compat_dcgm=True,
        dcgm_counters=counters,
        dcgm_version=version,
        collector_nvlink=True,  # off by default; NVLink bandwidth's total is made from its links
    )
    async with sampled_node(
        golden_fleet_with_pods(),
        config,
        node=NODE,
        build=BuildInfo(version="0.0.0+golden", python_version="3.11.0"),
    ) as (sampling, clock):
        for _ in range(5):
            exposition = sampling.cycle()
            clock.advance(1.0)
    return exposition


_LINE: Final = re.compile(
    r"(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)"
)
_LABEL: Final = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def dcgm_series(text: str, name: str | None = None) -> list[tuple[str, dict[str, str], float]]:
    """Every `DCGM_FI_*` sample of a text exposition (or those of one field): (name, labels,
    value), labels as written (empty ones included), in the exposition's order."""
    found: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith("DCGM_FI_"):
            continue
        match = _LINE.fullmatch(line)
        assert match is not None, line
        if name is not None and match["name"] != name:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        found.append((match["name"], labels, float(match["value"])))
    return found


def declared_types(text: str) -> dict[str, str]:
    """`# TYPE` of every `DCGM_FI_*` family of an exposition."""
    return {
        parts[2]: parts[3]
        for line in text.splitlines()
        if line.startswith("# TYPE DCGM_FI_") and len(parts := line.split()) == 4
    }
