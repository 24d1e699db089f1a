"""The demo node of the dashboard tests and pictures: the simulated fleet
tests/fixtures/fleets/dashboards.yaml, with its processes in pods.

`demo_cluster(workdir)` starts the stand-ins the daemon attributes pods from — the Kubernetes API
(tests/fake_kube) serving the node's pods, ResourceSlices, ResourceClaims, NVIDIA's
DeviceClasses and a Kueue LocalQueue (pods in Kueue's and KAI's queues, and in none), the kubelet's PodResources API (tests/fake_kubelet) with their GPU allocations
(some through the device plugin, some through DRA claims), and a procfs whose cgroup files put
each process in its container — and yields the `gpuscope serve` flags that point the daemon at
them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dashboards.live import Node
from exporter.simulator import load_fleet
from exporter.simulator.activity import mig_uuid
from exporter.simulator.cluster import dra_device_name, resource_slice_document
from exporter.simulator.spec import SimDevice
from tests.fake_kube.dra import resource_claim, serve_dra
from tests.fake_kube.kueue import local_queue, serve_kueue
from tests.fake_kube.pods import NODE, pod, serve_pods
from tests.fake_kube.server import FakeKube
from tests.fake_kubelet import ClaimDevice, FakeKubelet, claim_allocations, gpu_allocations
from tests.helpers import FLEETS, ROOT
from tests.proc_fixture import container_id, pod_uid

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

FLEET: Final = FLEETS / "dashboards.yaml"
GPU: Final = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class DemoPod:
    number: int
    """Picks the pod's uid and container id (tests/proc_fixture.py)."""
    namespace: str
    name: str
    container: str
    owner: tuple[str, str] | None
    pids: tuple[int, ...]
    devices: tuple[tuple[str, str], ...]
    """(resource, device id) pairs the kubelet gave the container; `gpu:N` and `mig:N/P` stand
    for the fleet's GPU N and the P-th MIG instance of GPU N."""
    labels: tuple[tuple[str, str], ...] = ()
    claim: str | None = None
    """The DRA ResourceClaim its devices come through (NVIDIA's driver); None: the device
    plugin's `resource`. Pods naming one claim share it."""


PODS: Final = (
    DemoPod(
        101,
        "train",
        "llm-pretrain-0",
        "main",
        ("StatefulSet", "llm-pretrain"),
        (6101,),
        ((GPU, "gpu:0"),),
        (("team", "research"), ("kueue.x-k8s.io/cluster-queue-name", "research")),
        claim="llm-pretrain-0-gpu-x7k2p",
    ),
    DemoPod(
        102,
        "serving",
        "chat-api-6b9f7c5d4-7xq2m",
        "server",
        ("ReplicaSet", "chat-api-6b9f7c5d4"),
        (6201,),
        ((GPU, "gpu:1::0"),),
        (
            ("team", "serving"),
            ("pod-template-hash", "6b9f7c5d4"),
            ("kai.scheduler/queue", "serving"),
        ),
    ),
    DemoPod(
        103,
        "serving",
        "embedder-5c8d9f7b6-k4t8p",
        "server",
        ("ReplicaSet", "embedder-5c8d9f7b6"),
        (6202,),
        ((GPU, "gpu:1::1"),),
        (
            ("team", "serving"),
            ("pod-template-hash", "5c8d9f7b6"),
            ("kai.scheduler/queue", "serving"),
        ),
    ),
    DemoPod(
        104,
        "lab",
        "notebook-ana",
        "jupyter",
        None,
        (6301,),
        ((GPU, "gpu:2"),),
        (("team", "research"),),
    ),
    DemoPod(
        105,
        "train",
        "vision-finetune-29471040-q8x7z",
        "main",
        ("Job", "vision-finetune-29471040"),
        (6401,),
        ((GPU, "gpu:3"),),
        (("kueue.x-k8s.io/queue-name", "finetune"),),  # resolved through its LocalQueue
    ),
    DemoPod(
        106,
        "serving",
        "ranker-0",
        "server",
        ("StatefulSet", "ranker"),
        (6501,),
        ((GPU, "gpu:4"),),
        claim="ranker-gpu",
    ),
    DemoPod(
        107,
        "serving",
        "ranker-1",
        "server",
        ("StatefulSet", "ranker"),
        (6502,),
        ((GPU, "gpu:4"),),
        claim="ranker-gpu",
    ),
    DemoPod(
        108,
        "train",
        "llm-pretrain-1",
        "main",
        ("StatefulSet", "llm-pretrain"),
        (6601,),
        ((GPU, "gpu:5"),),
        (("team", "research"), ("kueue.x-k8s.io/cluster-queue-name", "research")),
    ),
    DemoPod(
        109,
        "serving",
        "rerank-small-7f6d5c4b3-p9m2n",
        "server",
        ("ReplicaSet", "rerank-small-7f6d5c4b3"),
        (6701,),
        (("nvidia.com/mig-3g.40gb", "mig:6/0"),),
        (("pod-template-hash", "7f6d5c4b3"),),
    ),
    DemoPod(
        110,
        "lab",
        "notebook-raj",
        "jupyter",
        None,
        (6702,),
        (("nvidia.com/mig-1g.10gb", "mig:6/2"),),
    ),
    DemoPod(
        111,
        "train",
        "legacy-train-0",
        "main",
        ("StatefulSet", "legacy-train"),
        (6801,),
        ((GPU, "gpu:7"),),
    ),
)


def _device_id(spec: str) -> str:
    fleet = load_fleet(FLEET)
    if spec.startswith("mig:"):
        gpu, position = (int(part) for part in spec[4:].split("/"))
        layout = fleet.gpus[gpu].mig or ()
        return mig_uuid(fleet.seed, gpu, position, layout[position].profile)
    gpu_text, _, replica = spec[4:].partition("::")
    uuid = fleet.gpus[int(gpu_text)].uuid
    return f"{uuid}::{replica}" if replica else uuid


def _dra_device(spec: str) -> str:
    """The name NVIDIA's DRA driver gives the device `gpu:N` or `mig:N/P` stands for."""
    if spec.startswith("mig:"):
        gpu, position = (int(part) for part in spec[4:].split("/"))
        return dra_device_name(load_fleet(FLEET), SimDevice(gpu, position))
    return dra_device_name(load_fleet(FLEET), SimDevice(int(spec[4:])))


def _claims() -> list[tuple[str, dict[str, object]]]:
    """The claims of the demo pods that hold theirs through DRA, with their consumers."""
    found: dict[tuple[str, str], tuple[list[str], list[tuple[str, str]]]] = {}
    for demo in PODS:
        if demo.claim is not None:
            devices, consumers = found.setdefault((demo.namespace, demo.claim), ([], []))
            devices[:] = [_dra_device(spec) for _, spec in demo.devices]
            consumers.append((demo.name, pod_uid(demo.number)))
    return [
        ("resourceclaims", resource_claim(name, namespace, devices, reserved_for=consumers))
        for (namespace, name), (devices, consumers) in found.items()
    ]


def _write_procfs(root: Path) -> None:
    for demo in PODS:
        uid = pod_uid(demo.number).replace("-", "_")
        for pid in demo.pids:
            directory = root / str(pid)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                f"cri-containerd-{container_id(demo.number)}.scope\n"
            )


@contextlib.contextmanager
def demo_cluster(workdir: Path) -> Iterator[list[str]]:
    """The stand-ins for the demo node; yields the daemon's extra flags."""
    workdir.mkdir(parents=True, exist_ok=True)
    _write_procfs(workdir / "proc")
    pods = [
        pod(
            demo.name,
            pod_uid(demo.number),
            namespace=demo.namespace,
            containers={demo.container: container_id(demo.number)},
            owner=demo.owner,
            labels=dict(demo.labels),
        )
        for demo in PODS
    ]
    allocations = gpu_allocations(
        (demo.namespace, demo.name, demo.container, resource, [_device_id(device)])
        for demo in PODS
        if demo.claim is None
        for resource, device in demo.devices
    )
    claims = claim_allocations(
        (
            demo.namespace,
            demo.name,
            demo.container,
            demo.claim,
            [ClaimDevice(_dra_device(spec), NODE) for _, spec in demo.devices],
        )
        for demo in PODS
        if demo.claim is not None
    )
    node_slice = resource_slice_document(load_fleet(FLEET), NODE)
    with (
        serve_kueue(
            serve_dra(serve_pods(FakeKube(), *pods), ("resourceslices", node_slice), *_claims()),
            local_queue("train", "finetune", "batch"),
        ) as api,
        FakeKubelet(workdir / "kubelet.sock") as kubelet,
    ):
        kubelet.set(allocations, claims)
        yield [
            f"--path.procfs={workdir / 'proc'}",
            f"--kubeconfig={api.write_kubeconfig(workdir / 'kubeconfig')}",
            f"--kubernetes.node-name={NODE}",
            f"--kubelet.pod-resources-socket={kubelet.socket}",
            "--kubernetes.pod-labels=team",
        ]


DEMO_NODES: Final = (
    # every panel has something to show and the alerts fire where this node gives them a reason
    Node(
        "sim-a",
        FLEET,
        (
            f"--calibration.path={ROOT / 'tests' / 'fixtures' / 'calibration'}",
            "--collector.processes",  # off by default; the Node dashboard's Processes table
        ),
        cluster=demo_cluster,
        opencost=(2.5, True),  # a spot node OpenCost prices: the Nodes table's price and spot
    ),
    Node("sim-b", FLEETS / "broken-node.yaml"),  # NVML never initialises
    Node("sim-c", None),  # a daemon that is down
    Node("sim-d", FLEETS / "stalled-node.yaml"),  # its sampler wedges in nvmlInit
)
"""The stack behind the dashboard tests and the dashboard pictures."""
