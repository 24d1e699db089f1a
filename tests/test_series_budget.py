"""The series budget: a default node of 8 GPUs, 64 processes and 200 pods stays within
`BUDGET_SERIES`; the collectors off by default are the ones that would take it past; the chart's
profiles are the flags `PROFILES` declares."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest
import yaml

from exporter import config
from exporter.cli import build_parser
from exporter.config import (
    BUDGET_SERIES,
    COLLECTORS,
    OFF_BY_DEFAULT,
    PROFILES,
    ConfigError,
    ServeConfig,
)
from exporter.metrics.exposition import OPENMETRICS
from exporter.metrics.families import BuildInfo
from exporter.simulator.fleet import parse_fleet
from tests.helpers import ROOT, require_tool
from tests.simulated_node import sampled_node

pytestmark = pytest.mark.timeout(120)

NODE = "budget-node"
GPUS, PROCESSES, PODS = 8, 64, 200


def budget_fleet() -> dict[str, Any]:
    """benchmarks/series.py's node: 8 H100s, 64 processes each in a pod of its own (time-sliced,
    8 per GPU), and pods without GPUs making 200 in all."""
    processes = [
        {"pid": 100_000 + n, "gpu": n % GPUS, "memory": "8GiB", "pod": f"ml/gpu-{n}"}
        for n in range(PROCESSES)
    ]
    pods: list[dict[str, Any]] = [
        {"name": f"gpu-{n}", "namespace": "ml", "gpus": [n % GPUS], "shared": True}
        for n in range(PROCESSES)
    ]
    pods += [{"name": f"web-{n}", "namespace": "default"} for n in range(PODS - PROCESSES)]
    return {
        "seed": 1,
        "gpus": [{"model": "h100-sxm", "count": GPUS}],
        "processes": processes,
        "pods": pods,
    }


def load(*argv: str) -> ServeConfig:
    """`gpuscope serve`'s settings from these flags, parsed as the command line does."""
    args = build_parser().parse_args(["serve", *argv])
    return config.load({key: value for key, value in vars(args).items() if key != "command"}, {})


async def series_count(flags: tuple[str, ...]) -> int:
    """Series (sample lines) of the node's OpenMetrics exposition under `flags`."""
    async with sampled_node(
        parse_fleet(budget_fleet()), load(*flags), node=NODE, build=BuildInfo("budget")
    ) as (sampling, clock):
        for _ in range(6):  # past the 5 s readings
            exposition = sampling.cycle()
            clock.advance(1.0)
        body = exposition.render(OPENMETRICS).body
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def test_the_defaults_leave_out_only_the_collectors_past_the_budget() -> None:
    assert ServeConfig().collectors == {name for name, _ in COLLECTORS} - OFF_BY_DEFAULT
    assert {"processes", "nvlink"} == OFF_BY_DEFAULT


def test_a_default_node_stays_within_the_budget_and_full_would_not() -> None:
    lean, default, full = (asyncio.run(series_count(PROFILES[name])) for name in PROFILES)
    assert lean < default <= BUDGET_SERIES < full
    per_process = asyncio.run(series_count(("--collector.processes",))) - default
    # memory and utilization per process, and the collector's own success and duration
    assert per_process == 2 * PROCESSES + 2


def test_process_names_need_the_per_process_series() -> None:
    with pytest.raises(
        ConfigError, match=r"^invalid --collect\.process-names: .*--collector\.processes is off"
    ):
        load("--collect.process-names")
    assert load("--collect.process-names", "--collector.processes").process_names


def daemon_args(*switches: str) -> list[str]:
    command = [require_tool("helm"), "template", "gpuscope", str(ROOT / "helm" / "gpuscope")]
    for switch in switches:
        command += ["--set", switch]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    for document in yaml.safe_load_all(result.stdout):
        if document and document["kind"] == "DaemonSet":
            args: list[str] = document["spec"]["template"]["spec"]["containers"][0]["args"]
            return args
    raise AssertionError("no DaemonSet rendered")


def collector_flags(args: list[str]) -> list[str]:
    return [arg for arg in args if "collector." in arg or "collect.processes" in arg]


@pytest.mark.parametrize("profile", list(PROFILES))
def test_the_charts_profiles_are_the_declared_flags(profile: str) -> None:
    assert collector_flags(daemon_args(f"daemon.profile={profile}")) == list(PROFILES[profile])


def test_collect_processes_overrides_the_profile_and_a_bad_profile_is_refused() -> None:
    assert collector_flags(daemon_args()) == []
    assert collector_flags(daemon_args("daemon.collectProcesses=true")) == [
        "--collector.processes=true"
    ]
    assert collector_flags(daemon_args("daemon.profile=full", "daemon.collectProcesses=false")) == [
        "--collector.nvlink",
        "--collector.processes=false",
    ]
    command = [require_tool("helm"), "template", "gpuscope", str(ROOT / "helm" / "gpuscope")]
    refused = subprocess.run(
        [*command, "--set", "daemon.profile=everything"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0
    assert "daemon/profile" in refused.stderr
