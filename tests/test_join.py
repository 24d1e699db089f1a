"""The join: GPU samples + containers + pods + allocations -> who holds and uses each GPU."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from exporter.attribution import ClusterAccess
from exporter.attribution.cgroups import ContainerRef
from exporter.attribution.cluster import ApiConfig
from exporter.attribution.dra import DeviceIndex, DraDevice, ResourceSlice
from exporter.attribution.join import Join
from exporter.attribution.live import cluster_attributor
from exporter.attribution.pod import PodIndex, pod_from_api
from exporter.attribution.podresources import DeviceAllocation
from exporter.config import ServeConfig
from exporter.model import GpuIdentity, GpuSample, KubernetesStatus, ProcessSample, WatchStatus
from exporter.readings import SM_ACTIVE, UTILIZATION
from tests.fake_kube.pods import NODE, pod
from tests.proc_fixture import PROC, STATIC_UID, container_id, pod_uid

if TYPE_CHECKING:
    from pathlib import Path

GIB = 2**30
GPU0 = GpuIdentity(0, "GPU-0000", "NVIDIA H100 80GB HBM3", minor_number=0)
GPU1 = GpuIdentity(1, "GPU-1111", "NVIDIA H100 80GB HBM3", minor_number=1)
KUBE = KubernetesStatus((WatchStatus("pods", True, 0.0, 4),), pods_cached=4)
GPU = "nvidia.com/gpu"

PODS = PodIndex.of(
    pod_from_api(document)
    for document in (
        pod(
            "infer-a-7d9c8b6f5-abcde",
            pod_uid(1),
            namespace="ml",
            containers={"server": container_id(1)},
            owner=("ReplicaSet", "infer-a-7d9c8b6f5"),
            labels={
                "pod-template-hash": "7d9c8b6f5",
                "team": "vision",
                "app.kubernetes.io/name": "infer",
            },
        ),
        pod(
            "infer-b-0",
            pod_uid(2),
            namespace="ml",
            containers={"server": container_id(2)},
            owner=("StatefulSet", "infer-b"),
        ),
        pod("notebook", pod_uid(3), namespace="lab", containers={"jupyter": container_id(3)}),
        pod(
            "etcd-gpu-node-1",
            pod_uid(9),
            namespace="kube-system",
            containers={"etcd": container_id(9)},
            annotations={"kubernetes.io/config.mirror": STATIC_UID},
        ),
    )
)
CONTAINERS = {
    101: ContainerRef(pod_uid(1), container_id(1)),
    102: ContainerRef(pod_uid(2), container_id(2)),
    103: ContainerRef(pod_uid(1), container_id(1)),  # a second process of infer-a
    109: ContainerRef(STATIC_UID, container_id(9)),
    110: ContainerRef(pod_uid(77), container_id(77)),  # a pod the API has not shown
    111: ContainerRef(pod_uid(2), container_id(55)),  # a container its pod's status lacks
}
SHARED = (
    DeviceAllocation("ml", "infer-a-7d9c8b6f5-abcde", "server", GPU, "GPU-0000::0"),
    DeviceAllocation("ml", "infer-b-0", "server", GPU, "GPU-0000::1"),
    DeviceAllocation("lab", "notebook", "jupyter", GPU, "GPU-1111"),
)


def gpu(identity: GpuIdentity, *processes: ProcessSample, up: bool = True) -> GpuSample:
    return GpuSample(identity, up=up, processes=processes)


def process(pid: int, gib: int, utilization: float | None) -> ProcessSample:
    return ProcessSample(pid, gib * GIB, utilization, 0.0)


def test_two_pods_sharing_a_gpu_get_their_own_numbers_and_an_idle_holder_shows() -> None:
    join = Join(NODE)
    gpus = (
        gpu(GPU0, process(101, 10, 0.3), process(103, 2, 0.1), process(102, 20, 0.5)),
        gpu(GPU1),
    )
    result = join(gpus, CONTAINERS, PODS, SHARED, KUBE, now=10.0)
    usage = {(u.pod.name, u.gpu.uuid): u for u in result.usage}
    a = usage[("infer-a-7d9c8b6f5-abcde", "GPU-0000")]
    assert (a.memory_used_bytes, a.utilization, a.processes) == (12 * GIB, pytest.approx(0.4), 2)
    assert (a.pod.workload, a.pod.workload_kind) == ("infer-a", "Deployment")
    b = usage[("infer-b-0", "GPU-0000")]
    assert (b.memory_used_bytes, b.utilization) == (20 * GIB, 0.5)
    assert (b.pod.workload, b.pod.workload_kind) == ("infer-b", "StatefulSet")
    idle = usage[("notebook", "GPU-1111")]
    assert (idle.memory_used_bytes, idle.utilization, idle.processes) == (0, 0.0, 0)
    held = {(a.pod.name, a.gpu.uuid): a for a in result.allocations}
    assert held[("infer-a-7d9c8b6f5-abcde", "GPU-0000")].shared
    assert held[("infer-a-7d9c8b6f5-abcde", "GPU-0000")].in_use
    assert held[("infer-b-0", "GPU-0000")].shared
    notebook = held[("notebook", "GPU-1111")]
    assert (notebook.in_use, notebook.shared, notebook.resource) == (False, False, GPU)
    assert [p.name for p in result.pods] == ["notebook", "infer-a-7d9c8b6f5-abcde", "infer-b-0"]
    assert result.node == NODE


def test_processes_that_map_to_no_pod_are_counted_per_gpu(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    join = Join(NODE)
    gpus = (
        gpu(
            GPU0,
            process(110, 1, 0.1),
            process(111, 2, 0.1),
            process(500, 4, 0.2),
            process(101, 1, 0.0),
        ),
        gpu(GPU1),
    )
    for now in (1.0, 2.0, 3.0):
        result = join(gpus, CONTAINERS, PODS, (), KUBE, now=now)
    stray = {u.gpu.uuid: u for u in result.unattributed}
    assert (stray["GPU-0000"].processes, stray["GPU-0000"].memory_used_bytes) == (3, 7 * GIB)
    assert (stray["GPU-1111"].processes, stray["GPU-1111"].memory_used_bytes) == (0, 0)
    assert len([r for r in caplog.records if "does not list" in r.getMessage()]) == 1


def test_static_pods_are_found_by_their_kubelet_uid() -> None:
    result = Join(NODE)((gpu(GPU0, process(109, 1, 0.2)),), CONTAINERS, PODS, (), KUBE, now=1.0)
    (usage,) = result.usage
    assert (usage.pod.name, usage.container) == ("etcd-gpu-node-1", "etcd")
    assert usage.pod.uid == pod_uid(9)


def test_busy_counters_integrate_and_never_go_down_when_processes_exit() -> None:
    join = Join(NODE)
    busy: list[float | None] = []
    for now, processes in [
        (0.0, (process(101, 1, 0.5),)),
        (1.0, (process(101, 1, 0.5), process(103, 1, 0.25))),
        (2.0, (process(103, 1, 0.25),)),
        (3.0, ()),  # every process of the container exited
        (4.0, (process(101, 1, 1.0),)),
    ]:
        result = join((gpu(GPU0, *processes),), CONTAINERS, PODS, (), KUBE, now=now)
        (row,) = (u for u in result.usage if u.pod.name.startswith("infer-a"))
        busy.append(row.busy_seconds_total)
    assert busy == [0.0, 0.75, 1.0, 1.0, 2.0]


def test_rows_vanish_with_their_pod_and_skip_a_gpu_that_is_down() -> None:
    join = Join(NODE)
    gpus = (gpu(GPU0, process(101, 1, 0.5)), gpu(GPU1))
    join(gpus, CONTAINERS, PODS, SHARED, KUBE, now=0.0)
    down = join(
        (gpu(GPU0, process(101, 1, 0.5), up=False), gpu(GPU1)),
        CONTAINERS,
        PODS,
        SHARED,
        KUBE,
        now=1.0,
    )
    assert {u.gpu.uuid for u in down.usage} == {"GPU-1111"}
    back = join(gpus, CONTAINERS, PODS, SHARED, KUBE, now=5.0)
    row = next(u for u in back.usage if u.pod.name.startswith("infer-a"))
    assert row.busy_seconds_total == 0.0, "no jump over the time the GPU was down"
    without_a = PodIndex.of(p for p in PODS.by_name.values() if not p.name.startswith("infer-a"))
    gone = join(gpus, CONTAINERS, without_a, SHARED, KUBE, now=6.0)
    assert all(not u.pod.name.startswith("infer-a") for u in (*gone.usage, *gone.allocations))
    assert all(not p.name.startswith("infer-a") for p in gone.pods)


def test_device_ids_by_minor_number_and_unknown_devices(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    allocations = (
        DeviceAllocation("lab", "notebook", "jupyter", GPU, "nvidia1"),
        DeviceAllocation("lab", "notebook", "jupyter", GPU, "GPU-does-not-exist"),
        DeviceAllocation("lab", "notebook", "jupyter", "nvidia.com/mig-1g.10gb", "MIG-unknown"),
        DeviceAllocation("lab", "notebook", "jupyter", GPU, "nvidia7"),
        DeviceAllocation("gone", "pod-not-in-cache", "c", GPU, "GPU-0000"),
    )
    join = Join(NODE)
    for now in (1.0, 2.0):
        result = join((gpu(GPU0), gpu(GPU1)), CONTAINERS, PODS, allocations, KUBE, now=now)
    assert [(a.pod.name, a.gpu.uuid) for a in result.allocations] == [("notebook", "GPU-1111")]
    unknown = [r for r in caplog.records if "does not show" in r.getMessage()]
    assert sorted(r.device for r in unknown) == ["GPU-does-not-exist", "MIG-unknown", "nvidia7"]  # type: ignore[attr-defined]


def test_two_containers_holding_one_gpu_share_it() -> None:
    allocations = (
        DeviceAllocation("ml", "infer-a-7d9c8b6f5-abcde", "server", GPU, "GPU-0000"),
        DeviceAllocation("ml", "infer-b-0", "server", GPU, "GPU-0000"),
    )
    result = Join(NODE)(
        (gpu(GPU0, process(102, 1, 0.2)),), CONTAINERS, PODS, allocations, KUBE, now=1.0
    )
    assert all(a.shared for a in result.allocations)
    assert {a.pod.name: a.in_use for a in result.allocations} == {
        "infer-a-7d9c8b6f5-abcde": False,
        "infer-b-0": True,
    }


# -- DRA: devices through claims, named by the node's ResourceSlices ----------------------------

DRIVER = "gpu.nvidia.com"
MIG_A = GpuIdentity(
    1,
    "MIG-aaaa",
    "NVIDIA H100 80GB HBM3",
    mig_profile="1g.10gb",
    gpu_instance=9,
    parent_uuid="GPU-1111",
)
MIG_B = GpuIdentity(
    1,
    "MIG-bbbb",
    "NVIDIA H100 80GB HBM3",
    mig_profile="1g.10gb",
    gpu_instance=10,
    parent_uuid="GPU-1111",
)
SLICES = DeviceIndex.of(
    [
        ResourceSlice(
            DRIVER,
            "gpu-node-1",
            2,
            (
                ("gpu-0", DraDevice("GPU-0000")),
                ("gpu-1-mig-a", DraDevice("MIG-aaaa", "GPU-1111", "1g.10gb")),
                ("gpu-1-mig-dyn", DraDevice("", "GPU-1111", "1g.10gb")),
                ("gpu-1-mig-3g", DraDevice("", "GPU-1111", "3g.40gb")),
                ("gpu-9", DraDevice("GPU-9999")),
            ),
        ),
        ResourceSlice(DRIVER, "gpu-node-1", 1, (("gpu-old", DraDevice("GPU-0000")),)),
    ]
)


def claimed(
    namespace: str, pod: str, container: str, device: str, claim: str, share_id: str = ""
) -> DeviceAllocation:
    return DeviceAllocation(
        namespace, pod, container, GPU, device, DRIVER, "gpu-node-1", claim, namespace, share_id
    )


def test_only_each_pools_newest_generation_counts() -> None:
    assert SLICES.get(DRIVER, "gpu-node-1", "gpu-0") == DraDevice("GPU-0000")
    assert SLICES.get(DRIVER, "gpu-node-1", "gpu-old") is None
    assert len(SLICES) == 5


def test_claims_join_like_device_plugin_allocations(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    allocations = (
        claimed("ml", "infer-a-7d9c8b6f5-abcde", "server", "gpu-0", "pair"),
        claimed("ml", "infer-b-0", "server", "gpu-0", "pair"),
        claimed("lab", "notebook", "jupyter", "gpu-1-mig-a", "nb", share_id="7c1e"),
        claimed("lab", "notebook", "jupyter", "gpu-9", "nb"),  # NVML shows no GPU-9999
        claimed("lab", "notebook", "jupyter", "gpu-unpublished", "nb"),
        DeviceAllocation("lab", "notebook", "jupyter", GPU, "GPU-0000"),
    )
    gpus = (gpu(GPU0, process(102, 1, 0.2)), gpu(MIG_A), gpu(MIG_B))
    result = Join(NODE)(gpus, CONTAINERS, PODS, allocations, KUBE, devices=SLICES, now=1.0)
    held = {(a.pod.name, a.gpu.uuid): a for a in result.allocations}
    pair_a = held[("infer-a-7d9c8b6f5-abcde", "GPU-0000")]
    assert (pair_a.claim, pair_a.claim_namespace, pair_a.shared) == ("pair", "ml", True)
    assert held[("infer-b-0", "GPU-0000")].in_use
    assert not pair_a.in_use
    share = held[("notebook", "MIG-aaaa")]
    assert (share.claim, share.shared, share.gpu) == ("nb", True, MIG_A), "a share of a device"
    plugin = held[("notebook", "GPU-0000")]
    assert plugin.claim == "", "the device plugin's allocation beside the claims"
    assert set(held) == {
        ("infer-a-7d9c8b6f5-abcde", "GPU-0000"),
        ("infer-b-0", "GPU-0000"),
        ("notebook", "MIG-aaaa"),
        ("notebook", "GPU-0000"),
    }
    skipped = sorted(r.device for r in caplog.records if "skipping it" in r.getMessage())  # type: ignore[attr-defined]
    assert skipped == ["gpu-9", "gpu-unpublished"]


def test_a_mig_device_without_a_uuid_is_the_instance_of_its_profile_its_holder_runs_on() -> None:
    allocations = (claimed("ml", "infer-b-0", "server", "gpu-1-mig-dyn", "dyn"),)
    join = Join(NODE)
    # two 1g.10gb instances on the parent and the holder runs on neither: which one is unknown
    result = join(
        (gpu(MIG_A), gpu(MIG_B)), CONTAINERS, PODS, allocations, KUBE, devices=SLICES, now=1.0
    )
    assert result.allocations == ()
    result = join(
        (gpu(MIG_A), gpu(MIG_B, process(102, 3, None))),
        CONTAINERS,
        PODS,
        allocations,
        KUBE,
        devices=SLICES,
        now=2.0,
    )
    ((held),) = result.allocations
    assert held.gpu == MIG_B
    # one instance of the profile: that one, whatever runs there
    result = join((gpu(MIG_A),), CONTAINERS, PODS, allocations, KUBE, devices=SLICES, now=3.0)
    assert [a.gpu for a in result.allocations] == [MIG_A]
    # a partition not created yet (no instance of its profile) holds nothing NVML shows
    missing = (claimed("ml", "infer-b-0", "server", "gpu-1-mig-3g", "dyn"),)
    result = join((gpu(MIG_A),), CONTAINERS, PODS, missing, KUBE, devices=SLICES, now=4.0)
    assert result.allocations == ()


def test_utilization_is_capped_and_unknown_values_stay_unknown() -> None:
    result = Join(NODE)(
        (gpu(GPU0, process(101, 1, 0.7), process(103, 1, 0.6), process(102, 1, None)),),
        CONTAINERS,
        PODS,
        (),
        KUBE,
        now=1.0,
    )
    rows = {u.pod.name: u for u in result.usage}
    assert rows["infer-a-7d9c8b6f5-abcde"].utilization == 1.0
    assert rows["infer-b-0"].utilization is None
    assert rows["infer-b-0"].busy_seconds_total is None


def test_a_device_used_by_one_container_alone_lends_it_the_device_activity() -> None:
    # NVML cannot time processes on a MIG instance; GPM can time the instance itself.
    instance = GpuIdentity(
        0, "MIG-aaaa", "NVIDIA H100 80GB HBM3", mig_profile="1g.10gb", gpu_instance=9
    )
    alone = replace(
        gpu(instance, process(101, 1, None), process(103, 1, None)),
        values={SM_ACTIVE: 0.25},
    )
    shared = replace(
        gpu(GPU1, process(101, 1, None), process(102, 1, None)), values={UTILIZATION: 0.9}
    )
    result = Join(NODE)((alone, shared), CONTAINERS, PODS, (), KUBE, now=1.0)
    rows = {(u.pod.name, u.gpu.uuid): u for u in result.usage}
    assert rows[("infer-a-7d9c8b6f5-abcde", "MIG-aaaa")].utilization == 0.25
    assert rows[("infer-a-7d9c8b6f5-abcde", "GPU-1111")].utilization is None, "two users: unknown"
    assert rows[("infer-b-0", "GPU-1111")].utilization is None


def test_chosen_pod_labels_are_exported_under_valid_names() -> None:
    join = Join(NODE, pod_labels=re.compile(r"team|app\.kubernetes\.io/.*"))
    result = join(
        (gpu(GPU0, process(101, 1, 0.1), process(102, 1, 0.1)),),
        CONTAINERS,
        PODS,
        (),
        KUBE,
        now=1.0,
    )
    labels = {p.name: dict(p.labels) for p in result.pods}
    assert labels["infer-a-7d9c8b6f5-abcde"] == {
        "label_team": "vision",
        "label_app_kubernetes_io_name": "infer",
    }
    assert labels["infer-b-0"] == {}
    assert (
        Join(NODE)((gpu(GPU0, process(101, 1, 0.1)),), CONTAINERS, PODS, (), KUBE, now=1.0)
        .pods[0]
        .labels
        == ()
    )


def test_a_failing_cycle_costs_only_the_pod_series(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = replace(ServeConfig(), procfs=PROC, pod_resources_socket=tmp_path / "absent.sock")
    access = ClusterAccess(ApiConfig("http://127.0.0.1:9"), NODE, "test")
    attributor = cluster_attributor(config, access)

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug")

    attributor._join = broken  # type: ignore[assignment]
    for _ in range(2):
        attribution, statuses = attributor.attribute((gpu(GPU0, process(1001, 1, 0.5)),))
    assert attribution.usage == ()
    assert {status.name: status.success for status in statuses} == {
        "kubernetes": False,
        "podresources": False,
        "cgroups": False,
    }
    assert len([r for r in caplog.records if "attribution failed" in r.getMessage()]) == 1
