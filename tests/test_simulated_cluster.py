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
    SimulatedDevices,
    SimulatedPods,
    SimulatedProcesses,
    simulated_attributor,
)
from exporter.simulator.fleet import parse_fleet
from exporter.simulator.spec import FleetError
from tests.helpers import ROOT, ManualClock, patient, running_daemon, series, value

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.model import Attribution
    from exporter.simulator.spec import Fleet

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
    allocations, healthy = SimulatedAllocations(fleet, "node-a").allocations()
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


def attribute(fleet: Fleet) -> Attribution:
    """The fleet's GPUs sampled twice on a manual clock, attributed to its pods."""
    clock = ManualClock()
    sampler = patient(NvmlSampler(SimulatedNvml(fleet, clock=clock), clock=clock))
    sampler.start()
    attributor = simulated_attributor(fleet, node="node-a")
    try:
        for _ in range(2):
            clock.advance(1)
            gpus, _ = sampler.sample()
        attribution, statuses = attributor.attribute(gpus)
    finally:
        sampler.close()
    assert all(status.success for status in statuses)
    return attribution


def test_the_join_attributes_simulated_gpus_to_pods() -> None:
    fleet = parse_fleet(FLEET)
    attribution = attribute(fleet)
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
    assert value(text, "gpuscope_kubernetes_watch_up", resource="pods") == 1
    # two pods hold theirs through DRA claims: a whole GPU and a MIG instance
    (trainer,) = series(text, "gpu_allocation_info", pod="llm-pretrain-0")
    assert {"claim": "llm-pretrain-0-gpu", "resource": "nvidia.com/gpu", "gpu": "0"}.items() <= (
        dict(trainer).items()
    )
    (finetune,) = series(text, "gpu_allocation_info", pod="finetune-0", claim="finetune-0-mig")
    assert dict(finetune)["mig_profile"] == "3g.40gb"
    assert dict(finetune)["resource"] == "gpu.nvidia.com"
    assert value(text, "gpu_allocation_in_use", pod="finetune-0") == 1
    assert value(text, "gpuscope_kubernetes_watch_up", resource="resourceslices") == 1
    assert value(text, "gpuscope_dra_devices") == 4 + 4, "four whole GPUs, four MIG instances"


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


# -- DRA: devices through ResourceClaims ---------------------------------------------------------

DRA_FLEET = {
    "seed": 5,
    "gpus": [
        {"model": "h100-sxm", "count": 2},
        {"model": "h100-sxm", "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]},
        {"model": "h100-sxm", "count": 2},
    ],
    "pods": [
        {"name": "solo", "namespace": "ml", "gpus": [0], "claim": "solo-gpu"},
        {"name": "pair-a", "namespace": "ml", "gpus": [1], "claim": "pair"},
        {"name": "pair-b", "namespace": "ml", "gpus": [1], "claim": "pair"},
        {
            "name": "small",
            "namespace": "ml",
            "gpus": [{"gpu": 2, "mig_instance": 2}],
            "claim": "mig",
        },
        {"name": "cap-a", "namespace": "ml", "gpus": [3], "claim": "cap-a"},
        {"name": "cap-b", "namespace": "ml", "gpus": [3], "claim": "cap-b"},
        {"name": "plugin", "namespace": "ml", "gpus": [4]},
    ],
    "processes": [
        {"pid": 21, "gpu": 0, "pod": "ml/solo", "level": 0.6},
        {"pid": 22, "gpu": 1, "pod": "ml/pair-a", "level": 0.3},
        {"pid": 23, "gpu": 2, "mig_instance": 2, "pod": "ml/small", "memory": "4GiB"},
    ],
}


def test_claims_as_the_kubelet_gives_them() -> None:
    fleet = parse_fleet(DRA_FLEET)
    allocations, _ = SimulatedAllocations(fleet, "node-a").allocations()
    assert allocations is not None
    by_pod = {allocation.pod: allocation for allocation in allocations}
    solo = by_pod["solo"]
    assert (solo.driver, solo.pool, solo.device_id) == ("gpu.nvidia.com", "node-a", "gpu-0")
    assert (solo.claim, solo.claim_namespace, solo.share_id) == ("solo-gpu", "ml", "")
    assert by_pod["pair-a"].device_id == by_pod["pair-b"].device_id == "gpu-1"
    assert by_pod["pair-a"].claim == by_pod["pair-b"].claim == "pair"
    assert by_pod["small"].device_id == "gpu-2-mig-1g10gb-2"
    assert by_pod["small"].resource == "gpu.nvidia.com", "the MIG class has no extended resource"
    shares = {by_pod["cap-a"].share_id, by_pod["cap-b"].share_id}
    assert len(shares - {""}) == 2, "two claims on one device: one share each"
    assert by_pod["plugin"].driver == ""
    assert by_pod["plugin"].device_id == fleet.gpus[4].uuid


def test_the_simulated_resourceslice_names_every_device() -> None:
    fleet = parse_fleet(DRA_FLEET)
    devices = SimulatedDevices(fleet, "node-a")
    status = devices.status()
    assert status is not None
    assert (status.resource, status.up) == ("resourceslices", True)
    index = devices.view()
    assert len(index) == 4 + 4
    assert index.get("gpu.nvidia.com", "node-a", "gpu-0").uuid == fleet.gpus[0].uuid  # type: ignore[union-attr]
    mig = index.get("gpu.nvidia.com", "node-a", "gpu-2-mig-1g10gb-2")
    assert mig is not None
    assert (mig.parent_uuid, mig.profile) == (fleet.gpus[2].uuid, "1g.10gb")
    assert mig.uuid.startswith("MIG-")
    assert SimulatedDevices(parse_fleet(FLEET), "node-a").status() is None, "no claim, no DRA"


def test_the_join_attributes_claims_like_device_plugin_allocations() -> None:
    fleet = parse_fleet(DRA_FLEET)
    attribution = attribute(fleet)
    held = {a.pod.name: a for a in attribution.allocations}
    assert (held["solo"].claim, held["solo"].resource) == ("solo-gpu", "nvidia.com/gpu")
    assert held["solo"].gpu.uuid == fleet.gpus[0].uuid
    assert held["solo"].in_use
    assert not held["solo"].shared
    assert (held["pair-a"].shared, held["pair-b"].shared) == (True, True), "one claim, two pods"
    assert (held["pair-a"].in_use, held["pair-b"].in_use) == (True, False)
    assert held["small"].gpu.mig_profile == "1g.10gb"
    assert held["small"].in_use
    assert (held["cap-a"].shared, held["cap-b"].shared) == (True, True), "capacity shares"
    assert (held["plugin"].claim, held["plugin"].resource) == ("", "nvidia.com/gpu")
    assert attribution.kubernetes.dra_devices == 8
    assert {watch.resource for watch in attribution.kubernetes.watches} == {
        "pods",
        "resourceslices",
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"gpus": [0, 1]}, "pods[2].claim: claim pair holds other gpus"),
        ({"shared": True}, "pods[2].shared: time-slicing is the device plugin's"),
        ({"gpus": []}, "pods[2].claim: a claim holds devices"),
        ({"claim": "Not_A_Name"}, "pods[2].claim"),
    ],
)
def test_a_bad_claim_in_a_fleet_file_names_its_entry(
    change: dict[str, object], problem: str
) -> None:
    pods = [dict(entry) for entry in DRA_FLEET["pods"]]  # type: ignore[union-attr]
    pods[2] |= change
    with pytest.raises(FleetError) as caught:
        parse_fleet({**DRA_FLEET, "pods": pods})
    assert problem in str(caught.value)
