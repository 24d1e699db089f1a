"""The holders of each GPU and the share each one holds: the kubelet's allocations, read with what
HAMi's and KAI's annotations and DRA capacity sharing say each one reserved
(`exporter.attribution.shares`), divided per GPU. Part of the join (`exporter.attribution.join`),
in its thread: what it remembers of pods (their annotations read, the pods of KAI GPU groups) is
that thread's alone."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, NamedTuple

from exporter.attribution.podresources import DeviceAllocation
from exporter.attribution.shares import (
    HAMI_ALLOCATED,
    KAI_GROUP,
    KAI_RESERVED_GPU,
    KaiRequest,
    Reserved,
    ShareError,
    divide,
    hami_devices,
    is_reservation,
    kai_request,
)
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.attribution.dra import DeviceIndex
    from exporter.attribution.pod import Pod, PodIndex
    from exporter.model import GpuIdentity

log = logging.getLogger(__name__)

KAI_RESOURCE: Final = "nvidia.com/gpu"
"""The resource a KAI pod's fraction is exported under while its reservation pod's device is
not known (its GPU named by the reservation pod's annotation): what that pod asks for."""
MAX_CACHED: Final = 4096
"""Pods whose HAMi annotation is remembered read; the cache starts over past this."""

Shares = dict[tuple[str, str, str, str], float]
"""(pod UID, container, GPU UUID, resource) -> the share of the GPU held."""


class Holding(NamedTuple):
    """A container's hold on a GPU, before the GPU's holders' shares are divided."""

    pod: Pod
    allocation: DeviceAllocation
    gpu: GpuIdentity
    replica: bool
    """A share of the GPU by its device id (time-slicing, HAMi, KAI, DRA capacity sharing)."""
    reserved: float | None
    """What it reserved of the GPU; None: nothing known (an equal part of what others leave)."""


class Reservations:
    """What each holder of a GPU reserved of it, and the GPUs' shares divided among them."""

    def __init__(self) -> None:
        self._once = LogOnce(log)
        self._hami_cache: dict[str, tuple[Pod, dict[str, tuple[Reserved, ...]] | None]] = {}
        """Pod UID -> the pod (a new object whenever it changes) and what HAMi's annotation
        gives each of its containers (None: it cannot be read): read once, not every cycle."""
        self._kai_pods: tuple[PodIndex | None, list[tuple[Pod, KaiRequest]], dict[str, Pod]] = (
            None,
            [],
            {},
        )
        """Of the last pod index: the pods asking for a fraction of their KAI GPU group's GPU,
        what each asked, and each group's reservation pod."""

    def divide(self, resolved: list[Holding]) -> tuple[dict[str, set[tuple[str, str]]], Shares]:
        """The (pod UID, container) holding each GPU, and each holding's share."""
        holders: dict[str, set[tuple[str, str]]] = {}
        reserved_by_gpu: dict[str, dict[tuple[str, str, str, str], float | None]] = {}
        for holding in resolved:
            uuid = holding.gpu.uuid
            holders.setdefault(uuid, set()).add((holding.pod.uid, holding.allocation.container))
            key = (holding.pod.uid, holding.allocation.container, uuid, holding.allocation.resource)
            reserved_by_gpu.setdefault(uuid, {})[key] = holding.reserved
        shares: dict[tuple[str, str, str, str], float] = {}
        for uuid, reserved in reserved_by_gpu.items():
            divided, claimed = divide(reserved)
            shares.update(divided)
            if claimed:
                self._once(
                    logging.WARNING,
                    ("over-reserved", uuid),
                    "the pods holding a GPU reserved more than all of it; each one's share is "
                    "scaled down in proportion",
                    fields={"uuid": uuid, "reserved": round(claimed, 4)},
                )
        return holders, shares

    def hami(
        self,
        pod: Pod,
        allocation: DeviceAllocation,
        slot: GpuIdentity,
        by_uuid: Mapping[str, GpuIdentity],
        memory: Mapping[str, float | None],
    ) -> list[Holding] | None:
        """What HAMi's annotation gives the allocation's container: it wins over the kubelet's
        slot. None when it cannot be read, or gives the container nothing (the slot's GPU then
        stands, an equal part of what others leave)."""
        cached = self._hami_cache.get(pod.uid)
        if cached is not None and cached[0] is pod:
            given = cached[1]  # the same pod object: its annotation and containers unchanged
        else:
            try:
                given = hami_devices(
                    pod.annotations[HAMI_ALLOCATED], (*pod.init_containers, *pod.spec_containers)
                )
            except ShareError as error:
                given = None
                self._once(
                    logging.WARNING,
                    ("hami annotation", pod.uid),
                    f"cannot read a pod's {HAMI_ALLOCATED} annotation ({error}); its GPUs are "
                    "those the kubelet lists, each an equal part of what other holders leave",
                    fields={"namespace": pod.namespace, "pod": pod.name},
                )
            if len(self._hami_cache) > MAX_CACHED:
                self._hami_cache.clear()  # bounded: pods come and go
            self._hami_cache[pod.uid] = (pod, given)
        devices = given.get(allocation.container) if given is not None else None
        if not devices:
            return None
        if slot.uuid not in {device.uuid for device in devices}:
            self._once(
                logging.DEBUG,
                ("hami slot", pod.uid, allocation.container, slot.uuid),
                f"the kubelet's device and HAMi's {HAMI_ALLOCATED} name different GPUs; the "
                "annotation's count",
                fields={
                    "namespace": pod.namespace,
                    "pod": pod.name,
                    "container": allocation.container,
                    "device": allocation.device_id,
                },
            )
        found: list[Holding] = []
        for device in devices:
            identity = by_uuid.get(device.uuid)
            if identity is None:
                self._once(
                    logging.WARNING,
                    ("hami gpu", pod.uid, device.uuid),
                    f"HAMi's {HAMI_ALLOCATED} names a GPU this node's NVML does not show; "
                    "skipping it",
                    fields={"namespace": pod.namespace, "pod": pod.name, "uuid": device.uuid},
                )
                continue
            share = device.share(memory.get(device.uuid))
            found.append(Holding(pod, allocation, identity, replica=True, reserved=share))
        return found

    def _kai_members(self, pods: PodIndex) -> tuple[list[tuple[Pod, KaiRequest]], dict[str, Pod]]:
        """The pods of KAI GPU groups: those asking for a fraction, and the reservation pods."""
        requests: list[tuple[Pod, KaiRequest]] = []
        reservations: dict[str, Pod] = {}
        for pod in pods.by_name.values():
            if KAI_GROUP not in pod.labels:
                continue
            if is_reservation(pod):
                reservations[pod.labels[KAI_GROUP]] = pod
                continue
            try:
                request = kai_request(pod)
            except ShareError as error:
                self._once(
                    logging.WARNING,
                    ("kai annotation", pod.uid),
                    f"cannot read what a KAI pod asked of its GPU ({error}); it holds none",
                    fields={"namespace": pod.namespace, "pod": pod.name},
                )
                continue
            if request is not None:
                requests.append((pod, request))
        return requests, reservations

    def kai(
        self,
        pods: PodIndex,
        groups: Mapping[str, tuple[GpuIdentity, str]],
        by_uuid: Mapping[str, GpuIdentity],
        memory: Mapping[str, float | None],
    ) -> list[Holding]:
        """The pods holding a fraction of their KAI GPU group's GPU."""
        if self._kai_pods[0] is not pods:
            self._kai_pods = (pods, *self._kai_members(pods))
        _, requests, reservations = self._kai_pods
        found: list[Holding] = []
        for pod, request in requests:
            group = pod.labels[KAI_GROUP]
            gpu, resource = groups.get(group, (None, KAI_RESOURCE))
            if gpu is None:
                reservation = reservations.get(group)
                named = reservation.annotations.get(KAI_RESERVED_GPU) if reservation else None
                gpu = by_uuid.get(named) if named else None
            if gpu is None:
                self._once(
                    logging.INFO,
                    ("kai group", pod.uid, group),
                    "a KAI pod's GPU group has no reservation pod holding a GPU of this node "
                    "(yet); it holds none until it has",
                    fields={"namespace": pod.namespace, "pod": pod.name, "group": group},
                )
                continue
            allocation = DeviceAllocation(
                pod.namespace, pod.name, request.container, resource, gpu.uuid
            )
            share = request.share(memory.get(gpu.uuid))
            found.append(Holding(pod, allocation, gpu, replica=True, reserved=share))
        return found


def hami_slot(device: str, by_uuid: Mapping[str, GpuIdentity]) -> GpuIdentity | None:
    """The GPU of one of HAMi's virtual slots, `<uuid>-<n>`."""
    uuid, _, slot = device.rpartition("-")
    return by_uuid.get(uuid) if slot.isdigit() else None


def capacity_share(allocation: DeviceAllocation, devices: DeviceIndex) -> float | None:
    """A DRA allocation's share of its device's memory (capacity sharing); None when the claim
    or the slice does not say."""
    device = devices.get(allocation.driver, allocation.pool, allocation.device_id)
    if allocation.consumed_memory is None or device is None or not device.memory:
        return None
    return min(1.0, allocation.consumed_memory / device.memory)
