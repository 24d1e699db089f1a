"""The attribution node the subprocess tests run `gpuscope serve` against
(tests/test_e2e_attribution.py, tests/test_faults.py): a simulated fleet
(tests/fixtures/fleets/attribution.yaml) whose processes live in the fixture procfs tree, the
stand-in API server holding the node's pods, and a real gRPC pod-resources socket allocating
the GPUs to them."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.simulator import load_fleet
from tests.fake_kube.pods import NODE, pod, serve_pods
from tests.fake_kube.server import FakeKube
from tests.fake_kubelet import FakeKubelet, gpu_allocations
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


@contextmanager
def attributed_node(tmp_path: Path, *extra_args: str) -> Iterator[Node]:
    """The API server with `PODS` and the kubelet with `ALLOCATIONS`, while in the block."""
    with serve_pods(FakeKube(), *PODS) as api, FakeKubelet(tmp_path / "kubelet.sock") as kubelet:
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
        )


def attributed(text: str) -> bool:
    """Whether /metrics shows pods' use (from /proc and the API) and allocations (the kubelet)."""
    return bool(series(text, "gpu_pod_memory_used_bytes", pod="infer-b-0")) and bool(
        series(text, "gpu_allocation_info", pod="notebook")
    )
