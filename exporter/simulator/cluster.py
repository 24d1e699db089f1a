"""The simulated node's Kubernetes side: the fleet file's pods as the attribution sources see
them, so that `--simulate` without a cluster attributes GPUs to pods through the same join as a
real node.

Each simulated pod becomes the API's JSON for a `v1.Pod` (UID, owner references, labels, the
container ids in its status), parsed by the same `pod_from_api` as the pod watch's; each pod's
devices become the kubelet's PodResources allocations (`<uuid>::N` replicas when time-sliced, a
MIG instance by its UUID); each process's pod and container become the container its `/proc`
cgroup would name. Nothing here blocks, and nothing changes while the daemon runs (pods come
and go only in a real cluster).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

from exporter.attribution.attributor import Attributor
from exporter.attribution.cgroups import ContainerRef
from exporter.attribution.pod import PodIndex, pod_from_api
from exporter.attribution.podresources import DeviceAllocation
from exporter.model import KubernetesStatus
from exporter.simulator.activity import mig_uuid

if TYPE_CHECKING:
    import re
    from collections.abc import Iterable

    from exporter.simulator.fleet import Fleet, SimPod

NODE: Final = "simulated-node"
"""The node name simulated pods run on, unless `--kubernetes.node-name` gives one."""
_TEMPLATE_HASH: Final = "7d9c8b6f5"
_CRONJOB_MINUTES: Final = 29_420_000
"""A CronJob's Job is named after its scheduled time in minutes since the epoch (2025-12)."""


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _uid(pod: SimPod) -> str:
    digest = _digest("uid", pod.namespace, pod.name)
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"


def container_id(pod: SimPod, container: str) -> str:
    """The 64-hex id the runtime would give the container (stable across runs)."""
    return _digest("container", pod.namespace, pod.name, container)


def _owner(pod: SimPod) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The controller reference the API shows for a pod of this workload, and the labels the
    controller adds."""
    match pod.workload_kind:
        case "Pod":
            return None
        case "Deployment":
            return (
                {"kind": "ReplicaSet", "name": f"{pod.workload}-{_TEMPLATE_HASH}"},
                {"pod-template-hash": _TEMPLATE_HASH},
            )
        case "CronJob":
            return {"kind": "Job", "name": f"{pod.workload}-{_CRONJOB_MINUTES}"}, {}
        case kind:
            return {"kind": kind, "name": pod.workload}, {}


def pod_document(pod: SimPod, node: str) -> dict[str, Any]:
    """The pod as the API would serve it (the fields attribution reads)."""
    owner = _owner(pod)
    labels = dict(pod.labels)
    metadata: dict[str, Any] = {
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": _uid(pod),
        "labels": labels,
    }
    if owner is not None:
        reference, extra_labels = owner
        metadata["ownerReferences"] = [{**reference, "controller": True}]
        labels.update(extra_labels)
    return {
        "metadata": metadata,
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": name, "containerID": f"containerd://{container_id(pod, name)}"}
                for name in pod.containers
            ],
        },
    }


class SimulatedPods:
    """The pod watch of a simulated node: always current, never changing."""

    def __init__(self, fleet: Fleet, node: str) -> None:
        self._index = PodIndex.of(pod_from_api(pod_document(pod, node)) for pod in fleet.pods)
        self._count = len(fleet.pods)

    def start(self) -> None:
        """Nothing to watch."""

    def stop(self) -> None:
        """Nothing to stop."""

    def view(self) -> PodIndex:
        return self._index

    def status(self) -> KubernetesStatus:
        return KubernetesStatus(watch_up=True, cache_age_seconds=0.0, pods_cached=self._count)


class SimulatedAllocations:
    """The kubelet's PodResources answer of a simulated node."""

    def __init__(self, fleet: Fleet) -> None:
        found: list[DeviceAllocation] = []
        replicas: dict[int, int] = {}
        for pod in fleet.pods:
            for device in pod.devices:
                gpu = fleet.gpus[device.gpu]
                resource = pod.resource or "nvidia.com/gpu"
                if device.mig_instance is not None and gpu.mig is not None:
                    profile = gpu.mig[device.mig_instance].profile
                    device_id = mig_uuid(fleet.seed, gpu.index, device.mig_instance, profile)
                    resource = pod.resource or f"nvidia.com/mig-{profile}"
                elif pod.shared:
                    replicas[gpu.index] = replicas.get(gpu.index, -1) + 1
                    device_id = f"{gpu.uuid}::{replicas[gpu.index]}"
                else:
                    device_id = gpu.uuid
                found.append(
                    DeviceAllocation(
                        pod.namespace, pod.name, pod.containers[0], resource, device_id
                    )
                )
        self._allocations = tuple(found)

    def start(self) -> None:
        """Nothing to ask in the background."""

    def stop(self) -> None:
        """Nothing to stop."""

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        return self._allocations, True


class SimulatedProcesses:
    """Which container each simulated process runs in, as its cgroup would say."""

    def __init__(self, fleet: Fleet) -> None:
        pods = {pod.key: pod for pod in fleet.pods}
        self._containers: dict[int, ContainerRef] = {}
        for process in fleet.processes:
            pod = pods.get(process.pod or "")
            if pod is not None:
                container = process.container or pod.containers[0]
                self._containers[process.pid] = ContainerRef(
                    pod_uid=_uid(pod), container_id=container_id(pod, container)
                )

    def lookup(self, pids: Iterable[int]) -> tuple[dict[int, ContainerRef], bool]:
        return {pid: self._containers[pid] for pid in pids if pid in self._containers}, True


def simulated_attributor(
    fleet: Fleet, *, node: str | None = None, pod_labels: re.Pattern[str] | None = None
) -> Attributor:
    """Attribution from the fleet file's pods."""
    name = node or NODE
    return Attributor(
        name,
        SimulatedPods(fleet, name),
        SimulatedAllocations(fleet),
        SimulatedProcesses(fleet),
        pod_labels=pod_labels,
    )
