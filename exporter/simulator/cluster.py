"""The simulated node's Kubernetes side: the fleet file's pods as the attribution sources see
them, so that `--simulate` without a cluster attributes GPUs to pods through the same join as a
real node.

Each simulated pod becomes the API's JSON for a `v1.Pod` (UID, owner references, labels with
its template's revision, its containers and their images, the container ids in its status),
parsed by the same `pod_from_api` as the pod watch's; each pod's
devices become the kubelet's PodResources allocations (`<uuid>::N` replicas when time-sliced, a
MIG instance by its UUID; through a `claim`, NVIDIA's DRA driver's devices `gpu-<index>` and
`gpu-<index>-mig-<profile>-<position>` in the node's pool, published in one ResourceSlice parsed
by the same `slice_from_api` as the ResourceSlice watch's); each process's pod and container
become the container its `/proc` cgroup would name. Nothing here blocks, and nothing changes
while the daemon runs (pods come and go only in a real cluster).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

from exporter.attribution.attributor import Attributor
from exporter.attribution.cgroups import ContainerRef
from exporter.attribution.dra import NO_DEVICES, DeviceIndex, slice_from_api
from exporter.attribution.pod import PodIndex, pod_from_api
from exporter.attribution.podresources import DeviceAllocation
from exporter.config import DRA_DRIVERS
from exporter.model import WatchStatus
from exporter.simulator.activity import mig_uuid
from exporter.simulator.spec import SimDevice

if TYPE_CHECKING:
    import re
    from collections.abc import Iterable

    from exporter.simulator.fleet import Fleet, SimPod

NODE: Final = "simulated-node"
"""The node name simulated pods run on, unless `--kubernetes.node-name` gives one."""
_TEMPLATE_HASH: Final = "7d9c8b6f5"
_HASH_CHARACTERS: Final = "bcdfghjklmnpqrstvwxz2456789"
"""What Kubernetes' revision hashes are spelled in (no vowels, no 0, 1, 3)."""
_CRONJOB_MINUTES: Final = 29_420_000
"""A CronJob's Job is named after its scheduled time in minutes since the epoch (2025-12)."""


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _uuid(*parts: str) -> str:
    """A stable UUID (version 4 in form) made from `parts`."""
    digest = _digest(*parts)
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"


def _uid(pod: SimPod) -> str:
    return _uuid("uid", pod.namespace, pod.name)


def container_id(pod: SimPod, container: str) -> str:
    """The 64-hex id the runtime would give the container (stable across runs)."""
    return _digest("container", pod.namespace, pod.name, container)


def _owner(pod: SimPod) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The controller reference the API shows for a pod of this workload, and the labels the
    controller adds: a Deployment's pods their `pod-template-hash` (the fleet file's label, else
    the one in the pod's name `<deployment>-<hash>-<suffix>`), a StatefulSet's or DaemonSet's a
    `controller-revision-hash` (the fleet file's label, else one made from the workload)."""
    labels = dict(pod.labels)
    match pod.workload_kind:
        case "Pod":
            return None
        case "Deployment":
            template_hash = labels.get("pod-template-hash") or _name_hash(pod)
            return (
                {"kind": "ReplicaSet", "name": f"{pod.workload}-{template_hash}"},
                {"pod-template-hash": template_hash},
            )
        case "CronJob":
            return {"kind": "Job", "name": f"{pod.workload}-{_CRONJOB_MINUTES}"}, {}
        case "StatefulSet" | "DaemonSet" as kind:
            revision = labels.get("controller-revision-hash") or (
                f"{pod.workload}-{_revision_hash(pod.namespace, pod.workload)}"
            )
            return {"kind": kind, "name": pod.workload}, {"controller-revision-hash": revision}
        case kind:
            return {"kind": kind, "name": pod.workload}, {}


def _name_hash(pod: SimPod) -> str:
    """The template hash a Deployment's pod name carries (`chat-api-6b9f7c5d4-7xq2m`), else a
    fixed one."""
    middle, _, suffix = pod.name.removeprefix(f"{pod.workload}-").rpartition("-")
    named = pod.name.startswith(f"{pod.workload}-") and len(suffix) == 5
    return middle if named and 6 <= len(middle) <= 10 and "-" not in middle else _TEMPLATE_HASH


def _revision_hash(*parts: str) -> str:
    """A stable 10-character revision hash in Kubernetes' alphabet."""
    number = int(_digest("revision", *parts), 16)
    spelled = []
    for _ in range(10):
        number, digit = divmod(number, len(_HASH_CHARACTERS))
        spelled.append(_HASH_CHARACTERS[digit])
    return "".join(spelled)


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
    images = dict(pod.images)
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": name, **({"image": images[name]} if name in images else {})}
                for name in pod.containers
            ],
        },
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

    def request_stop(self) -> None:
        """Nothing to stop."""

    def join(self, deadline: float) -> None:
        """Nothing to wait for."""

    def view(self) -> PodIndex:
        return self._index

    def status(self) -> WatchStatus:
        return WatchStatus("pods", up=True, cache_age_seconds=0.0, objects=self._count)


DRIVER: Final = DRA_DRIVERS[0]
"""The DRA driver of the simulated node: NVIDIA's."""


def dra_device_name(fleet: Fleet, device: SimDevice) -> str:
    """The name NVIDIA's DRA driver gives a device: `gpu-<minor>`, or for a MIG device
    `gpu-<minor>-mig-<profile without dots>-<position>`."""
    layout = fleet.gpus[device.gpu].mig
    if device.mig_instance is None or layout is None:
        return f"gpu-{device.gpu}"
    profile = layout[device.mig_instance].profile.replace(".", "")
    return f"gpu-{device.gpu}-mig-{profile}-{device.mig_instance}"


def resource_slice_document(fleet: Fleet, node: str) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's DRA driver would publish for the simulated node: every GPU
    and every MIG instance of the starting layout, one pool named after the node."""
    devices: list[dict[str, Any]] = []
    for gpu in fleet.gpus:
        layout = gpu.mig or ()
        for position, profile in enumerate(layout):
            name = dra_device_name(fleet, SimDevice(gpu.index, position))
            attributes = {
                "type": "mig",
                "uuid": mig_uuid(fleet.seed, gpu.index, position, profile.profile),
                "parentUUID": gpu.uuid,
                "profile": profile.profile,
            }
            devices.append({"name": name, "attributes": _attributes(attributes)})
        if gpu.mig is None:
            attributes = {"type": "gpu", "uuid": gpu.uuid, "productName": gpu.model.name}
            devices.append({"name": f"gpu-{gpu.index}", "attributes": _attributes(attributes)})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-sim"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _attributes(values: dict[str, str]) -> dict[str, dict[str, str]]:
    return {key: {"string": value} for key, value in values.items()}


class SimulatedDevices:
    """The ResourceSlice watch of a simulated node: its DRA devices when a pod holds a claim,
    else DRA is off."""

    def __init__(self, fleet: Fleet, node: str) -> None:
        self._on = any(pod.claim is not None for pod in fleet.pods)
        self._index = (
            DeviceIndex.of([slice_from_api(resource_slice_document(fleet, node))])
            if self._on
            else NO_DEVICES
        )

    def start(self) -> None:
        """Nothing to watch."""

    def request_stop(self) -> None:
        """Nothing to stop."""

    def join(self, deadline: float) -> None:
        """Nothing to wait for."""

    def view(self) -> DeviceIndex:
        return self._index

    def status(self) -> WatchStatus | None:
        if not self._on:
            return None
        return WatchStatus("resourceslices", up=True, cache_age_seconds=0.0, objects=1)


class SimulatedAllocations:
    """The kubelet's PodResources answer of a simulated node."""

    def __init__(self, fleet: Fleet, node: str) -> None:
        found: list[DeviceAllocation] = []
        replicas: dict[int, int] = {}
        claims_of: dict[SimDevice, set[tuple[str, str]]] = {}
        for pod in fleet.pods:
            if pod.claim is not None:
                for device in pod.devices:
                    claims_of.setdefault(device, set()).add((pod.namespace, pod.claim))
        for pod in fleet.pods:
            if pod.claim is not None:
                found.extend(_claimed(fleet, pod, node, claims_of))
                continue
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

    def request_stop(self) -> None:
        """Nothing to stop."""

    def join(self, deadline: float) -> None:
        """Nothing to wait for."""

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        return self._allocations, True


def _claimed(
    fleet: Fleet, pod: SimPod, node: str, claims_of: dict[SimDevice, set[tuple[str, str]]]
) -> Iterable[DeviceAllocation]:
    """A claim's devices as the kubelet lists them for the pod's first container; a device in
    more than one claim gets a `share_id` (its capacity shared between them)."""
    assert pod.claim is not None
    for device in pod.devices:
        mig = device.mig_instance is not None and fleet.gpus[device.gpu].mig is not None
        shared = len(claims_of[device]) > 1
        share_id = (
            _uuid("share", pod.namespace, pod.claim, dra_device_name(fleet, device))
            if shared
            else ""
        )
        yield DeviceAllocation(
            pod.namespace,
            pod.name,
            pod.containers[0],
            pod.resource or (DRIVER if mig else "nvidia.com/gpu"),
            dra_device_name(fleet, device),
            driver=DRIVER,
            pool=node,
            claim=pod.claim,
            claim_namespace=pod.namespace,
            share_id=share_id,
        )


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
    fleet: Fleet,
    *,
    node: str | None = None,
    pod_labels: re.Pattern[str] | None = None,
    image_pattern: re.Pattern[str] | None = None,
) -> Attributor:
    """Attribution from the fleet file's pods."""
    name = node or NODE
    return Attributor(
        name,
        SimulatedPods(fleet, name),
        SimulatedAllocations(fleet, name),
        SimulatedProcesses(fleet),
        SimulatedDevices(fleet, name),
        pod_labels=pod_labels,
        image_pattern=image_pattern,
    )
