"""The winning placement's patch set (`replay/patchset.py`): the sharing that is safe for any
pods of a time-sliced pool together, never a patch that overcommits memory, the device plugin's
and MIG manager's configs, each pod patch applied by the real `kubectl`; and a replay that a
shutdown or a deadline cuts part-way (`replay/cut.py`)."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import yaml

from exporter.catalog import builtin_catalog
from exporter.rightsize import server
from exporter.rightsize.formatters.patches import MARK, PLACEMENT, PLACEMENT_SCRIPT, patch_files
from exporter.rightsize.hardware import Hardware
from exporter.rightsize.history import Ceilings, History, ResourceUse
from exporter.rightsize.options import load_serve
from exporter.rightsize.replay.cut import NEVER, Cut, ReplayCut
from exporter.rightsize.replay.engine import GpuCount, PolicyResult
from exporter.rightsize.replay.express import placement_patches
from exporter.rightsize.replay.patchset import (
    DEVICE_PLUGIN_LABEL,
    MIG_CONFIG_LABEL,
    SHARED_RESOURCE,
    winner,
)
from exporter.rightsize.replay.placement import Item, pack, safe_replicas
from exporter.rightsize.replay.run import simulate
from exporter.rightsize.replay.steps import StepHistory
from exporter.rightsize.report import build_report
from exporter.rightsize.server import Refresher
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.strategy import STRATEGIES
from tests.helpers import require_tool
from tests.rightsize_data import A100_80, END, WINDOW, device, workload

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.rightsize.replay.patchset import PlacementPatches
    from exporter.rightsize.report import Report

pytestmark = pytest.mark.timeout(120)

GIB = 1024**3
A100_MEMORY = 80 * GIB
PERIOD = 48
BASE, PEAK = 0.15, 0.39


def staggered(service: int) -> list[float]:
    """BASE, and PEAK in the service's own slot of 6 steps: no two peaks coincide."""
    return [PEAK if (t % PERIOD) // 6 == service else BASE for t in range(2 * PERIOD)]


def two_kinds(number: int) -> list[float]:
    """Half the services peak (0.35) in step 0 of each 4, the other half in step 1."""
    return [0.35 if t % 4 == number % 2 else 0.05 for t in range(2 * PERIOD)]


# -- the safe sharing -----------------------------------------------------------------------------


def test_the_safe_sharing_holds_for_any_pods_together_not_only_the_placements_groups() -> None:
    staggered_items = [Item(staggered(service), 10 * GIB) for service in range(8)]
    assert safe_replicas(staggered_items, capacity=0.8, memory=A100_MEMORY) == 3
    # Four of them on a GPU (two of each kind) never exceed 0.8, but any three peaking
    # together do: the scheduler may pick those, so only two are safe.
    items = [Item(two_kinds(number), 10 * GIB) for number in range(8)]
    groups = pack(items, capacity=0.8, memory=A100_MEMORY)
    assert sorted(len(group) for group in groups) == [4, 4]
    assert safe_replicas(items, capacity=0.8, memory=A100_MEMORY) == 2
    # Memory alone: the two largest peaks already exceed the GPU.
    heavy = [Item([0.01] * 8, peak * GIB) for peak in (50, 40, 10, 10)]
    assert safe_replicas(heavy, capacity=0.8, memory=A100_MEMORY) == 1
    assert safe_replicas([Item([0.9] * 8, GIB)], capacity=0.8, memory=A100_MEMORY) == 0


# -- the patch set of a replayed report -----------------------------------------------------------


def serving_report(
    busy: list[list[float]],
    *,
    memory_gib: float = 10.0,
    kind: str = "Deployment",
    policies: tuple[str, ...] = ("current", "exclusive", "mig", "timeslice", "binpack"),
) -> Report:
    """A report of one workload per busy vector, each on its own A100 80GB, and its replay."""
    workloads = tuple(
        workload(
            device(
                uuid=f"GPU-{number}",
                model=A100_80,
                busy=max(levels),
                memory_gib=memory_gib,
                container="main",
            ),
            name=f"svc-{number}",
            namespace="serving",
            kind=kind,
        )
        for number, levels in enumerate(busy)
    )
    hardware = Hardware.build(builtin_catalog(), Ceilings())
    report = build_report(
        History(END, WINDOW, 300.0, 0.95, workloads),
        strategy=STRATEGIES["simple"],
        hardware=hardware,
        settings=StrategySettings(models=("a100-sxm4-80gb",)),
        source="test",
    )
    steps = len(busy[0])
    history = StepHistory(
        steps,
        {
            row.history.configuration: np.array(busy[int(row.history.name.split("-")[1])])
            for row in report.rows
        },
        [{(A100_80, ""): float(len(busy))} for _ in range(steps)],
        [False] * steps,
    )
    simulation = simulate(
        report,
        history,
        hardware=hardware,
        policies=policies,
    )
    report = replace(report, simulation=simulation)
    found = placement_patches(
        report,
        hardware=hardware,
        inventory=(ResourceUse("", "nvidia.com/gpu", None),),
        seen_models=(A100_80,),
    )
    return replace(report, placement_patches=found)


def patch_set(report: Report) -> PlacementPatches:
    assert report.placement_patches is not None
    return report.placement_patches


def kubectl(tmp_path: Path, *arguments: str) -> Any:
    result = subprocess.run(
        [require_tool("kubectl"), *arguments, "--output=yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def deployment(name: str) -> dict[str, Any]:
    spec = {
        "nodeSelector": {"pool": "gpu"},
        "containers": [
            {
                "name": "main",
                "image": "server:1",
                "resources": {
                    "limits": {"nvidia.com/gpu": 1, "cpu": "2"},
                    "requests": {"nvidia.com/gpu": 1, "cpu": "2"},
                },
            },
            {"name": "sidecar", "image": "proxy:1"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "serving"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def test_time_sliced_staggered_services_get_the_device_plugin_config_and_pod_patches(
    tmp_path: Path,
) -> None:
    report = serving_report([staggered(service) for service in range(8)])
    chosen = winner(report.simulation)
    assert chosen is not None
    assert chosen.policy == "timeslice"
    found = patch_set(report)
    assert len(found.patches) == 8
    files = patch_files(report)
    script = files[PLACEMENT_SCRIPT]
    assert "Cannot express: which pods share which GPU" in script
    assert "Holds: time-slicing pool of A100 80GB SXM: 8 pods of 8 workloads on 3 GPUs" in script
    assert f"#   kubectl label node NODE {DEVICE_PLUGIN_LABEL}=gpuscope-a100-sxm4-80gb-x3" in script
    [configmap_file] = [name for name in files if name.endswith("device-plugin-config.yaml")]
    assert files[configmap_file].startswith(MARK)
    (tmp_path / configmap_file).write_text(files[configmap_file])
    configmap = kubectl(
        tmp_path, "patch", "--local", f"--filename={configmap_file}", "--type=merge", "--patch={}"
    )
    config = yaml.safe_load(configmap["data"]["gpuscope-a100-sxm4-80gb-x3"])
    assert config["version"] == "v1"
    slicing = config["sharing"]["timeSlicing"]
    assert slicing["resources"] == [{"name": "nvidia.com/gpu", "replicas": 3}]
    assert slicing["renameByDefault"] is True
    patch_name = f"{PLACEMENT}serving.deployment.svc-0.yaml"
    (tmp_path / "svc-0.yaml").write_text(yaml.safe_dump(deployment("svc-0")))
    (tmp_path / patch_name).write_text(files[patch_name])
    after = kubectl(
        tmp_path,
        "patch",
        "--local",
        "--filename=svc-0.yaml",
        "--type=strategic",
        f"--patch-file={patch_name}",
    )
    pod = after["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "pool": "gpu",
        DEVICE_PLUGIN_LABEL: "gpuscope-a100-sxm4-80gb-x3",
    }
    main = next(c for c in pod["containers"] if c["name"] == "main")
    assert main["resources"]["limits"] == {SHARED_RESOURCE: 1, "cpu": "2"}
    assert main["resources"]["requests"] == {SHARED_RESOURCE: 1, "cpu": "2"}
    assert [c["name"] for c in pod["containers"]] == ["main", "sidecar"]


def test_a_pool_whose_placement_shares_more_than_is_safe_says_it_needs_more_gpus() -> None:
    report = serving_report([two_kinds(number) for number in range(8)])
    found = patch_set(report)
    [pool] = next(r for r in report.simulation if r.policy == found.policy).pools
    assert (pool.gpus, pool.largest_group, pool.replicas, pool.gpus_needed) == (2, 4, 2, 4)
    assert any("only 2 of its pods are safe together" in line for line in found.cannot)
    assert "4 GPUs, not 2" in patch_files(report)[PLACEMENT_SCRIPT]


def test_the_pool_never_overcommits_memory_whichever_pods_share() -> None:
    # Each fits twice on a GPU by demand, but three of 30 GiB are over 80 GiB.
    report = serving_report([[0.1] * 20] * 6, memory_gib=30, policies=("current", "timeslice"))
    found = patch_set(report)
    for result in report.simulation:
        for pool in result.pools:
            assert pool.replicas * 30 * GIB <= A100_MEMORY
    data = yaml.safe_load(
        next(f for n, f in patch_files(report).items() if n.endswith("device-plugin-config.yaml"))
    )["data"]
    [config] = data.values()
    assert yaml.safe_load(config)["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 2
    assert found.patches


def test_mig_winner_gets_mig_parted_layouts_and_mig_resources(tmp_path: Path) -> None:
    report = serving_report([[0.05] * 10] * 7, memory_gib=1, kind="Job")
    found = patch_set(report)
    assert found.policy == "mig"
    files = patch_files(report)
    [name] = [n for n in files if n.endswith("mig-parted-config.yaml")]
    parted = yaml.safe_load(yaml.safe_load(files[name])["data"]["config.yaml"])
    assert parted["version"] == "v1"
    [(layout, entries)] = parted["mig-configs"].items()
    assert entries == [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    assert f"{MIG_CONFIG_LABEL}={layout}" in files[PLACEMENT_SCRIPT]
    body = yaml.safe_load(files[f"{PLACEMENT}serving.job.svc-0.yaml"])
    resources = body["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": 1}


def test_no_placement_wins_when_every_one_contends_or_overcommits() -> None:
    def result(policy: str, *, contention: float = 0.0, overcommit: int = 0) -> PolicyResult:
        return PolicyResult(policy, GpuCount(1, 1, 1), 0.5, contention, overcommit, 100.0, ())

    assert winner([result("current"), result("timeslice", contention=0.1)]) is None
    assert winner([result("mig", overcommit=3)]) is None
    assert winner([result("exclusive"), result("binpack")]) == result("exclusive")


# -- cutting the replay ---------------------------------------------------------------------------


def test_a_cut_replay_stops_at_its_next_look() -> None:
    items = [Item([0.05] * 64, GIB) for _ in range(2000)]
    stop = threading.Event()
    stop.set()
    with pytest.raises(ReplayCut, match="server is stopping"):
        pack(items, capacity=0.8, memory=A100_MEMORY, cut=Cut(stop))
    with pytest.raises(ReplayCut, match="deadline passed"):
        pack(items, capacity=0.8, memory=A100_MEMORY, cut=Cut(deadline=time.monotonic() - 1))
    report = serving_report([staggered(service) for service in range(8)])
    with pytest.raises(ReplayCut):
        simulate(
            report,
            StepHistory(2 * PERIOD, {}, [{}] * (2 * PERIOD), [False] * (2 * PERIOD)),
            hardware=Hardware.build(builtin_catalog(), Ceilings()),
            policies=("timeslice",),
            cut=Cut(stop),
        )


def _replaying(started: threading.Event):
    """A replay computing without yielding to its event loop, but looking at its cut (without
    one, as before cuts, it never ends and the test times out)."""

    async def produce(_run: object, *, cut: Cut = NEVER) -> Report:
        started.set()
        while True:
            cut.check()

    return produce


def test_the_server_stopping_cuts_a_replay_under_way(monkeypatch: pytest.MonkeyPatch) -> None:
    started = threading.Event()
    monkeypatch.setattr(server, "produce", _replaying(started))
    refresher = Refresher(load_serve(["--prometheus=http://127.0.0.1:9"], {}))

    async def stop_during_the_replay() -> bool:
        refresh = asyncio.ensure_future(refresher.refresh())
        assert await asyncio.to_thread(started.wait, 60)
        refresher.close()
        return await refresh

    assert asyncio.run(stop_during_the_replay()) is False
    assert (refresher.failures, refresher.published) == (1, None)


def test_a_refresh_past_its_deadline_is_abandoned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "produce", _replaying(threading.Event()))
    monkeypatch.setattr(server, "refresh_deadline", lambda _refresh: 0.2)
    refresher = Refresher(load_serve(["--prometheus=http://127.0.0.1:9"], {}))
    try:
        assert asyncio.run(refresher.refresh()) is False
    finally:
        refresher.close()
    assert (refresher.failures, refresher.last_ok) == (1, False)
