"""A simulated node with pods: the fleet file's pods, allocations and processes go through the
same parsing and join as a real node's API server, kubelet and /proc (a bad `pods` entry is
tests/test_fleet_file.py's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.nvml.sampler import NvmlSampler
from exporter.simulator import SimulatedNvml
from exporter.simulator.cluster import (
    SimulatedAllocations,
    SimulatedPods,
    SimulatedProcesses,
    simulated_attributor,
)
from exporter.simulator.fleet import parse_fleet
from tests.helpers import ROOT, ManualClock, running_daemon, series, value

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)

FLEET = {
    "seed": 3,
    "gpus": [
        {"model": "h100-sxm", "count": 2},
        {"model": "h100-sxm", "mig": ["3g.40gb", "4g.40gb"]},
    ],
    "pods": [
        {
            "name": "chat-7d9c8b6f5-aaaaa",
            "namespace": "serving",
            "workload": {"kind": "Deployment", "name": "chat"},
            "labels": {"team": "apps"},
            "containers": ["server", "proxy"],
            "gpus": [0],
            "shared": True,
        },
        {
            "name": "embed-7d9c8b6f5-bbbbb",
            "namespace": "serving",
            "workload": {"kind": "Deployment", "name": "embed"},
            "gpus": [0],
            "shared": True,
        },
        {"name": "notebook", "namespace": "lab", "gpus": [1]},
        {
            "name": "tune-0",
            "namespace": "ml",
            "workload": {"kind": "StatefulSet", "name": "tune"},
            "gpus": [{"gpu": 2, "mig_instance": 1}],
        },
        {"name": "nightly-29420000-ccccc", "workload": {"kind": "CronJob", "name": "nightly"}},
    ],
    "processes": [
        {
            "pid": 11,
            "gpu": 0,
            "pod": "serving/chat-7d9c8b6f5-aaaaa",
            "container": "server",
            "level": 0.6,
        },
        {"pid": 12, "gpu": 0, "pod": "serving/embed-7d9c8b6f5-bbbbb", "level": 0.3},
        {"pid": 13, "gpu": 1, "pod": "lab/notebook", "pattern": "idle"},
        {"pid": 14, "gpu": 2, "mig_instance": 1, "pod": "ml/tune-0", "memory": "20GiB"},
        {"pid": 15, "gpu": 0, "memory": "1GiB"},
    ],
}


def test_pods_read_as_the_api_shows_them() -> None:
    fleet = parse_fleet(FLEET)
    index = SimulatedPods(fleet, "node-a").view()
    pods = {pod.name: pod for pod in index.by_uid.values()}
    assert (
        pods["chat-7d9c8b6f5-aaaaa"].workload.kind,
        pods["chat-7d9c8b6f5-aaaaa"].workload.name,
    ) == (
        "Deployment",
        "chat",
    )
    assert pods["tune-0"].workload.kind == "StatefulSet"
    assert (
        pods["nightly-29420000-ccccc"].workload.kind,
        pods["nightly-29420000-ccccc"].workload.name,
    ) == (
        "CronJob",
        "nightly",
    )
    assert pods["notebook"].workload.kind == "Pod"
    assert sorted(pods["chat-7d9c8b6f5-aaaaa"].containers.values()) == ["proxy", "server"]


def test_allocations_as_the_kubelet_gives_them() -> None:
    fleet = parse_fleet(FLEET)
    allocations, healthy = SimulatedAllocations(fleet).allocations()
    assert healthy
    assert allocations is not None
    by_pod = {allocation.pod: allocation for allocation in allocations}
    uuid0 = fleet.gpus[0].uuid
    assert {
        by_pod["chat-7d9c8b6f5-aaaaa"].device_id,
        by_pod["embed-7d9c8b6f5-bbbbb"].device_id,
    } == {
        f"{uuid0}::0",
        f"{uuid0}::1",
    }, "time-sliced: one replica each"
    assert by_pod["chat-7d9c8b6f5-aaaaa"].container == "server", "to the first container"
    assert by_pod["notebook"].device_id == fleet.gpus[1].uuid
    assert by_pod["tune-0"].resource == "nvidia.com/mig-4g.40gb"
    assert by_pod["tune-0"].device_id.startswith("MIG-")


def test_processes_run_in_their_pods_containers() -> None:
    containers, healthy = SimulatedProcesses(parse_fleet(FLEET)).lookup([11, 12, 15])
    assert healthy
    assert set(containers) == {11, 12}, "a process without a pod is in none"


def test_the_join_attributes_simulated_gpus_to_pods() -> None:
    clock = ManualClock()
    fleet = parse_fleet(FLEET)
    sampler = NvmlSampler(SimulatedNvml(fleet, clock=clock), clock=clock)
    sampler.start()
    attributor = simulated_attributor(fleet, node="node-a")
    try:
        clock.advance(1)
        sampler.sample()
        clock.advance(1)
        gpus, _ = sampler.sample()
        attribution, statuses = attributor.attribute(gpus)
    finally:
        sampler.close()
    assert all(status.success for status in statuses)
    used = {(use.pod.name, use.gpu.index): use for use in attribution.usage}
    assert used[("chat-7d9c8b6f5-aaaaa", 0)].utilization is not None
    assert used[("notebook", 1)].utilization == 0.0
    held = {(a.pod.name, a.gpu.uuid): a for a in attribution.allocations}
    assert held[("chat-7d9c8b6f5-aaaaa", fleet.gpus[0].uuid)].shared
    assert not held[("notebook", fleet.gpus[1].uuid)].shared
    tune = next(a for a in attribution.allocations if a.pod.name == "tune-0")
    assert tune.gpu.mig_profile == "4g.40gb"
    stray = [u for u in attribution.unattributed if u.processes]
    assert [(u.gpu.index, u.processes) for u in stray] == [(0, 1)], "pid 15 runs in no pod"


@pytest.mark.slow
def test_scripts_try_shows_pods_without_a_cluster() -> None:
    with running_daemon(
        f"--simulate={ROOT / 'examples' / 'fleet.yaml'}",
        "--collect.interval=200ms",
        "--kubernetes.pod-labels=team",
        env={"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""},
    ) as daemon:
        daemon.wait_ready()
        text = daemon.metrics()
    assert value(text, "gpu_pod_info", pod="notebook-ana", label_team="research") == 1
    assert series(
        text, "gpu_pod_utilization_ratio", workload="chat-api", workload_kind="Deployment"
    )
    assert value(text, "gpu_allocation_shared", pod="embedder-5c8d9f7b6-k4t8p") == 1
    assert value(text, "gpu_allocation_in_use", pod="notebook-ana") == 1
    assert (
        value(text, "gpu_allocation_info", pod="notebook-raj", resource="nvidia.com/mig-1g.10gb")
        == 1
    )
    assert value(text, "gpuscope_collector_success", collector="podresources") == 1
    assert value(text, "gpuscope_kubernetes_watch_up") == 1


@pytest.mark.slow
def test_a_real_cluster_config_wins_over_the_fleets_pods(tmp_path: Path) -> None:
    from tests.fake_kube.pods import NODE, serve_pods  # noqa: PLC0415 - the stand-in API server
    from tests.fake_kube.server import FakeKube  # noqa: PLC0415

    with serve_pods(FakeKube()) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with running_daemon(
            f"--simulate={ROOT / 'examples' / 'fleet.yaml'}",
            "--collect.interval=200ms",
            f"--kubeconfig={kubeconfig}",
            f"--kubernetes.node-name={NODE}",
            f"--kubelet.pod-resources-socket={tmp_path / 'absent.sock'}",
        ) as daemon:
            daemon.wait_ready()
            text = daemon.metrics()
    assert not series(text, "gpu_pod_info"), "the API server has no pods on this node"
    assert value(text, "gpuscope_pods_cached") == 0
