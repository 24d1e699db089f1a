"""The attribution nodes the subprocess tests run `gpuscope serve` against: a simulated fleet
whose processes live in a procfs tree, the stand-in API server holding the node's pods, and a
real gRPC pod-resources socket allocating the GPUs to them.

`attributed_node` (tests/test_e2e_attribution.py, tests/test_faults.py): the fleet
tests/fixtures/fleets/attribution.yaml, the fixture procfs tree, device-plugin allocations, and
an API server that serves no `resource.k8s.io` (DRA stays off). `dra_node`
(tests/test_dra_e2e.py): tests/fixtures/fleets/dra.yaml, GPUs and MIG devices handed out through
ResourceClaims beside a device plugin's, the API server serving the node's ResourceSlices,
claims and NVIDIA's DeviceClasses."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.simulator import load_fleet
from exporter.simulator.activity import mig_uuid
from tests.fake_kube.dra import (
    gpu_device,
    mig_device,
    resource_claim,
    resource_slice,
    serve_dra,
)
from tests.fake_kube.pods import NODE, pod, serve_pods
from tests.fake_kube.server import FakeKube
from tests.fake_kube.writes import ClusterWrites, node_object, serve_writes
from tests.fake_kubelet import ClaimDevice, FakeKubelet, claim_allocations, gpu_allocations
from tests.helpers import FLEETS, series
from tests.proc_fixture import PROC, container_id, pod_uid

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

FLEET = FLEETS / "attribution.yaml"
UUIDS = [gpu.uuid for gpu in load_fleet(FLEET).gpus]
GPU = "nvidia.com/gpu"

PODS = (
    pod(
        "infer-a-7d9c8b6f5-x2x9q",
        pod_uid(1),
        namespace="ml",
        containers={"server": container_id(1)},
        owner=("ReplicaSet", "infer-a-7d9c8b6f5"),
        labels={"pod-template-hash": "7d9c8b6f5", "team": "vision"},
    ),
    pod(
        "infer-b-0",
        pod_uid(2),
        namespace="ml",
        containers={"server": container_id(2)},
        owner=("StatefulSet", "infer-b"),
        runtime="cri-o",
    ),
    pod("notebook", pod_uid(20), namespace="lab", containers={"jupyter": container_id(20)}),
    pod(
        "train-29471040-q8x7z",
        pod_uid(3),
        namespace="train",
        containers={"main": container_id(3)},
        owner=("Job", "train-29471040"),
    ),
    pod(
        "gpu-monitor-7xk2p",
        pod_uid(10),
        namespace="kube-system",
        containers={"agent": container_id(10)},
        owner=("DaemonSet", "gpu-monitor"),
    ),
    pod("elsewhere", pod_uid(40), node="other-node", containers={"main": container_id(40)}),
)
ALLOCATIONS = gpu_allocations(
    [
        ("ml", "infer-a-7d9c8b6f5-x2x9q", "server", GPU, [f"{UUIDS[0]}::0"]),
        ("ml", "infer-b-0", "server", GPU, [f"{UUIDS[0]}::1"]),
        ("lab", "notebook", "jupyter", GPU, [UUIDS[1]]),
        ("train", "train-29471040-q8x7z", "main", GPU, ["nvidia2"]),  # by /dev/nvidia2
    ]
)


@dataclass
class Node:
    api: FakeKube
    kubelet: FakeKubelet
    args: list[str]
    """`gpuscope serve`'s flags for this node."""
    writes: ClusterWrites | None = None
    """The node's status and Events, when served (`cluster_writes`)."""


@contextmanager
def attributed_node(
    tmp_path: Path, *extra_args: str, cluster_writes: bool = False
) -> Iterator[Node]:
    """The API server with `PODS` and the kubelet with `ALLOCATIONS`, while in the block;
    `cluster_writes`: the server also keeps the Node and takes its status patches and Events."""
    api = serve_pods(FakeKube(), *PODS)
    writes = serve_writes(api, node_object(NODE)) if cluster_writes else None
    with api, FakeKubelet(tmp_path / "kubelet.sock") as kubelet:
        kubelet.set(ALLOCATIONS)
        yield Node(
            api,
            kubelet,
            [
                f"--simulate={FLEET}",
                f"--path.procfs={PROC}",
                f"--kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
                f"--kubernetes.node-name={NODE}",
                f"--kubelet.pod-resources-socket={kubelet.socket}",
                *extra_args,
            ],
            writes,
        )


def attributed(text: str) -> bool:
    """Whether /metrics shows pods' use (from /proc and the API) and allocations (the kubelet)."""
    return bool(series(text, "gpu_pod_memory_used_bytes", pod="infer-b-0")) and bool(
        series(text, "gpu_allocation_info", pod="notebook")
    )


# -- the DRA node ---------------------------------------------------------------------------------

DRA_FLEET = FLEETS / "dra.yaml"
_DRA = load_fleet(DRA_FLEET)
DRA_UUIDS = [gpu.uuid for gpu in _DRA.gpus]
_MIG_LAYOUT = _DRA.gpus[2].mig or ()
MIG_UUIDS = [
    mig_uuid(_DRA.seed, 2, position, profile.profile)
    for position, profile in enumerate(_MIG_LAYOUT)
]
"""GPU 2's MIG instances: 3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb."""
MIG_DEVICE = "gpu-2-mig-1g10gb-19-6"
"""Instance 2 (1g.10gb), static: its slice names its UUID."""
DYNAMIC_MIG_DEVICE = "gpu-2-mig-3g40gb-9-0"
"""Instance 0 (3g.40gb) as DynamicMIG advertises it: parent and profile, no UUID."""
DRA_PODS = (
    pod(
        "trainer-0",
        pod_uid(60),
        namespace="train",
        containers={"main": container_id(60)},
        owner=("StatefulSet", "trainer"),
    ),
    pod(
        "infer-7d9c8b6f5-aaaaa",
        pod_uid(61),
        namespace="serving",
        containers={"server": container_id(61)},
        owner=("ReplicaSet", "infer-7d9c8b6f5"),
        labels={"pod-template-hash": "7d9c8b6f5"},
    ),
    pod(
        "infer-7d9c8b6f5-bbbbb",
        pod_uid(62),
        namespace="serving",
        containers={"server": container_id(62)},
        owner=("ReplicaSet", "infer-7d9c8b6f5"),
        labels={"pod-template-hash": "7d9c8b6f5"},
    ),
    pod("tiny-0", pod_uid(63), namespace="serving", containers={"server": container_id(63)}),
    pod("big-0", pod_uid(64), namespace="train", containers={"main": container_id(64)}),
    pod("notebook", pod_uid(65), namespace="lab", containers={"jupyter": container_id(65)}),
)
_DRA_PROCESSES = {3001: 60, 3002: 61, 3003: 63, 3004: 64}
"""pid -> the pod number whose container runs it."""
WHOLE_SLICE = f"{NODE}-gpu.nvidia.com-whole"
MIG_SLICE = f"{NODE}-gpu.nvidia.com-mig"


def dra_slices(generation: int = 1) -> tuple[dict[str, object], dict[str, object]]:
    """The driver's pool on the node: whole GPUs in one slice, GPU 2's MIG devices in another."""
    whole = resource_slice(
        WHOLE_SLICE,
        [gpu_device(f"gpu-{n}", DRA_UUIDS[n]) for n in (0, 1, 3)],
        generation=generation,
        slices_in_pool=2,
    )
    mig = resource_slice(
        MIG_SLICE,
        [
            mig_device(DYNAMIC_MIG_DEVICE, DRA_UUIDS[2], "3g.40gb"),
            mig_device("gpu-2-mig-2g20gb-14-4", DRA_UUIDS[2], "2g.20gb", MIG_UUIDS[1]),
            mig_device(MIG_DEVICE, DRA_UUIDS[2], "1g.10gb", MIG_UUIDS[2]),
            mig_device("gpu-2-mig-1g10gb-19-5", DRA_UUIDS[2], "1g.10gb", MIG_UUIDS[3]),
        ],
        generation=generation,
        slices_in_pool=2,
    )
    return whole, mig


def _claims() -> list[tuple[str, dict[str, object]]]:
    infer = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in DRA_PODS[1:3]]
    return [
        (
            "resourceclaims",
            resource_claim(
                "trainer-0-gpu-x7k2p", "train", ["gpu-0"], reserved_for=[("trainer-0", pod_uid(60))]
            ),
        ),
        (
            "resourceclaims",
            resource_claim("shared-infer", "serving", ["gpu-1"], reserved_for=infer),
        ),
        (
            "resourceclaims",
            resource_claim(
                "tiny-mig",
                "serving",
                [MIG_DEVICE],
                device_class="mig.nvidia.com",
                reserved_for=[("tiny-0", pod_uid(63))],
            ),
        ),
        (
            "resourceclaims",
            resource_claim(
                "big-mig",
                "train",
                [DYNAMIC_MIG_DEVICE],
                device_class="mig.nvidia.com",
                reserved_for=[("big-0", pod_uid(64))],
            ),
        ),
    ]


DRA_CLAIMS = claim_allocations(
    [
        ("train", "trainer-0", "main", "trainer-0-gpu-x7k2p", [ClaimDevice("gpu-0", NODE)]),
        (
            "serving",
            "infer-7d9c8b6f5-aaaaa",
            "server",
            "shared-infer",
            [ClaimDevice("gpu-1", NODE)],
        ),
        (
            "serving",
            "infer-7d9c8b6f5-bbbbb",
            "server",
            "shared-infer",
            [ClaimDevice("gpu-1", NODE)],
        ),
        ("serving", "tiny-0", "server", "tiny-mig", [ClaimDevice(MIG_DEVICE, NODE)]),
        ("train", "big-0", "main", "big-mig", [ClaimDevice(DYNAMIC_MIG_DEVICE, NODE)]),
    ]
)
DRA_PLUGIN = gpu_allocations([("lab", "notebook", "jupyter", GPU, [DRA_UUIDS[3]])])


def _write_procfs(root: Path) -> None:
    for pid, number in _DRA_PROCESSES.items():
        directory = root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        uid = pod_uid(number).replace("-", "_")
        (directory / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{container_id(number)}.scope\n"
        )


@contextmanager
def dra_node(tmp_path: Path, *extra_args: str, older_cluster: bool = False) -> Iterator[Node]:
    """The DRA node while in the block; `older_cluster`: its API server serves no
    resource.k8s.io (the kubelet still reports the claims' devices)."""
    _write_procfs(tmp_path / "proc")
    objects = [*(("resourceslices", piece) for piece in dra_slices()), *_claims()]
    with (
        serve_dra(serve_pods(FakeKube(), *DRA_PODS), *objects) as api,
        FakeKubelet(tmp_path / "kubelet.sock") as kubelet,
    ):
        if older_cluster:
            api.withheld.add("resource.k8s.io")
        kubelet.set(DRA_PLUGIN, DRA_CLAIMS)
        yield Node(
            api,
            kubelet,
            [
                f"--simulate={DRA_FLEET}",
                f"--path.procfs={tmp_path / 'proc'}",
                f"--kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
                f"--kubernetes.node-name={NODE}",
                f"--kubelet.pod-resources-socket={kubelet.socket}",
                *extra_args,
            ],
        )
