"""GPU processes + their containers + pods + allocations -> who holds and who uses each GPU.

Pure but for a little state: the busy and energy counters, which integrate per (pod, container,
GPU) so that a process exiting never makes a counter go down, each GPU's last energy reading and
unattributed energy, and a cache of each pod's identity. A row (pod, container, GPU) appears when
the container runs a process on the GPU or holds it, stays (with zero use) while the pod lives,
and vanishes with the pod.

Energy. Each cycle the GPU's energy since the last cycle (the increase of its energy counter
between this cycle's reading and the last one's) is divided among the containers on it, and
whatever is not given to one goes to the GPU's unattributed energy, so that the parts always add
up to the GPU's increase:

- one container alone on the GPU (it holds all of it or runs on it, and no process outside a pod
  runs there): all of it;
- several (time-slicing, MPS, a shared claim, fractions, processes outside pods): the busy part
  (the energy times the GPU's busy fraction: (the per-process utilization of every process there,
  summed and capped at 1) in proportion to each container's per-process utilization — the part
  of processes outside pods is unattributed; the idle part (the rest) by the share of the GPU
  each holder holds (`Allocation.share`: equal parts but where HAMi, KAI or DRA capacity sharing
  say what each reserved), the part nobody reserved unattributed (to the containers running on
  it in equal parts when nobody holds it);
- unattributed: a GPU no container holds or runs on, a GPU in MIG mode (NVML measures the whole
  GPU, never an instance: a MIG instance's rows carry no energy), a GPU whose process list or
  processes' utilization could not be read this cycle, and energy that spans cycles without a
  reading (it is counted when readings resume, never split);
- nothing: the first reading of a GPU, and a reading below the last one (the driver reloaded and
  its counter restarted): never negative.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.attribution.dra import NO_DEVICES
from exporter.attribution.localqueues import NO_LOCAL_QUEUES, queue_of
from exporter.attribution.pod import revision
from exporter.attribution.reserved import Holding, Reservations, capacity_share, hami_slot
from exporter.attribution.shares import HAMI_ALLOCATED, KAI_GROUP, is_reservation
from exporter.logs import LogOnce
from exporter.model import (
    Allocation,
    Attribution,
    GpuIdentity,
    KubernetesStatus,
    PodIdentity,
    PodUsage,
    Unattributed,
    UnattributedEnergy,
)
from exporter.readings import ENERGY, SM_ACTIVE, UTILIZATION
from exporter.readings.device import MEMORY_TOTAL

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.attribution.cgroups import ContainerRef
    from exporter.attribution.dra import DeviceIndex
    from exporter.attribution.localqueues import LocalQueueIndex
    from exporter.attribution.pod import Pod, PodIndex
    from exporter.attribution.podresources import DeviceAllocation
    from exporter.model import GpuSample

log = logging.getLogger(__name__)

_MINOR_DEVICE: Final = re.compile(r"nvidia(\d+)")
_WHOLE: Final = 1.0 - 1e-9
"""Shares adding up to this hold the whole GPU (a sum of thirds misses 1 by ulps)."""
_REPLICA_SEPARATOR: Final = "::"
"""Time-slicing device plugins hand out `<uuid>::N`: replica N of one GPU."""
_INVALID_LABEL_CHARACTERS: Final = re.compile(r"[^A-Za-z0-9_]")


Key = tuple[str, str, str]
"""(pod UID, container name, GPU UUID)"""


@dataclass(slots=True)
class _Use:
    memory: int | None = None
    utilization: float | None = None
    processes: int = 0


@dataclass(slots=True)
class _Busy:
    total: float = 0.0
    read_at: float | None = None
    energy: float = 0.0
    """Joules given to the row since it appeared."""


@dataclass(slots=True)
class _Strays:
    """A GPU's processes outside pods, and whether every process there (in pods or not) was
    timed (had a per-process utilization)."""

    processes: int = 0
    utilization: float = 0.0
    timed: bool = True


@dataclass(slots=True)
class _Energy:
    """One physical GPU's energy counter as the join last saw it."""

    reading: float
    cycle: int
    unattributed: float = 0.0


class Join:
    def __init__(
        self,
        node: str,
        *,
        pod_labels: re.Pattern[str] | None = None,
        image_pattern: re.Pattern[str] | None = None,
    ) -> None:
        self._node = node
        self._pod_labels = pod_labels
        self._image_pattern = image_pattern
        self._busy: dict[Key, _Busy] = {}
        self._energy: dict[str, _Energy] = {}
        self._cycle = 0
        self._identities: dict[str, tuple[Pod, tuple[str, str] | None, PodIdentity]] = {}
        """Each pod's identity, made again when the pod or its queue changes."""
        self._local_queues = NO_LOCAL_QUEUES
        self._held: dict[tuple[str, str, str, str], Allocation] = {}
        """Last cycle's allocations, reused while unchanged (most cycles change none)."""
        self._reservations = Reservations()
        self._once = LogOnce(log)

    def __call__(
        self,
        gpus: tuple[GpuSample, ...],
        containers: Mapping[int, ContainerRef],
        pods: PodIndex,
        allocations: tuple[DeviceAllocation, ...] | None,
        kubernetes: KubernetesStatus,
        *,
        devices: DeviceIndex = NO_DEVICES,
        local_queues: LocalQueueIndex = NO_LOCAL_QUEUES,
        now: float,
    ) -> Attribution:
        self._local_queues = local_queues
        by_uuid = {gpu.identity.uuid: gpu for gpu in gpus if gpu.identity.uuid}
        uses, unattributed, strays = self._uses(gpus, containers, pods)
        held = self._allocations(allocations or (), pods, gpus, uses, devices)

        holders: dict[Key, float] = {}
        for allocation in held.values():
            key = (allocation.pod.uid, allocation.container, allocation.gpu.uuid)
            holders[key] = min(1.0, holders.get(key, 0.0) + allocation.share)
        for key in uses.keys() | holders.keys():
            self._busy.setdefault(key, _Busy())
        self._cycle += 1
        shares, spare = self._energy_shares(gpus, uses, holders, strays)
        usage: list[PodUsage] = []
        for key, busy in list(self._busy.items()):
            pod_uid, container, uuid = key
            pod = pods.by_uid.get(pod_uid)
            gpu = by_uuid.get(uuid)
            if pod is None or pod.uid != pod_uid or gpu is None:
                del self._busy[key]  # the pod ended (or the GPU left the node)
                continue
            if not gpu.up:
                busy.read_at = None  # integrate again from the next reading
                continue
            busy.energy += shares.pop(key, 0.0)
            use = uses.get(key) or _Use(memory=0, utilization=0.0)
            if use.utilization is not None:
                if busy.read_at is not None:
                    busy.total += use.utilization * (now - busy.read_at)
                busy.read_at = now
            usage.append(
                PodUsage(
                    pod=self._identity(pod),
                    container=container,
                    gpu=gpu.identity,
                    memory_used_bytes=use.memory,
                    utilization=use.utilization,
                    busy_seconds_total=busy.total if busy.read_at is not None else None,
                    processes=use.processes,
                    energy_joules_total=busy.energy if uuid in self._energy else None,
                )
            )
        for (_, _, uuid), joules in shares.items():  # rows that could not take theirs
            spare[uuid] = spare.get(uuid, 0.0) + joules
        usage.sort(key=lambda u: (u.gpu.index, u.pod.namespace, u.pod.name, u.container))
        allocations_out = sorted(
            held.values(),
            key=lambda a: (a.gpu.index, a.pod.namespace, a.pod.name, a.container, a.resource),
        )
        involved = {row.pod.uid: row.pod for row in usage}
        involved.update((row.pod.uid, row.pod) for row in allocations_out)
        return Attribution(
            node=self._node,
            pods=tuple(sorted(involved.values(), key=lambda p: (p.namespace, p.name))),
            usage=tuple(usage),
            allocations=tuple(allocations_out),
            unattributed=tuple(unattributed),
            kubernetes=kubernetes,
            unattributed_energy=self._unattributed_energy(gpus, spare),
        )

    def _energy_shares(
        self,
        gpus: tuple[GpuSample, ...],
        uses: Mapping[Key, _Use],
        holders: Mapping[Key, float],
        strays: Mapping[str, _Strays],
    ) -> tuple[dict[Key, float], dict[str, float]]:
        """This cycle's energy of each physical GPU: (joules per row, joules unattributed per
        GPU). The rules are the module's."""
        shares: dict[Key, float] = {}
        spare: dict[str, float] = {}
        split = {
            gpu.identity.parent_uuid for gpu in gpus if gpu.identity.is_mig_instance
        }  # GPUs in MIG mode: NVML measures none of their instances
        rows: dict[str, list[Key]] = {}
        held: dict[str, dict[Key, float]] = {}
        for key in uses:
            rows.setdefault(key[2], []).append(key)
        for key, share in holders.items():
            held.setdefault(key[2], {})[key] = share
            if key not in uses:
                rows.setdefault(key[2], []).append(key)
        for gpu in gpus:
            uuid = gpu.identity.uuid
            if gpu.identity.is_mig_instance or not uuid:
                continue
            reading = gpu.value(ENERGY) if gpu.up else None
            last = self._energy.get(uuid)
            if reading is None:
                continue  # no energy this cycle; the next reading counts the gap, unattributed
            if last is None:
                self._energy[uuid] = _Energy(reading, self._cycle)
                continue
            joules = reading - last.reading if reading >= last.reading else 0.0
            contiguous = last.cycle == self._cycle - 1
            last.reading, last.cycle = reading, self._cycle
            if joules <= 0.0:
                continue
            here, stray = rows.get(uuid, []), strays.get(uuid)
            if not contiguous or uuid in split or stray is None or not here:
                spare[uuid] = joules  # a gap, a MIG GPU, no process list, nobody there
            elif len(here) == 1 and not stray.processes and holders.get(here[0], 1.0) >= 1.0:
                shares[here[0]] = joules
            elif not stray.timed:
                spare[uuid] = joules  # not every process was timed: no basis for a split
            else:
                idle_takers = held.get(uuid) or dict.fromkeys(here, 1.0 / len(here))
                parts, spare[uuid] = _split(
                    joules, here=here, idle_takers=idle_takers, uses=uses, stray=stray
                )
                shares.update(parts)
        return shares, spare

    def _unattributed_energy(
        self, gpus: tuple[GpuSample, ...], spare: Mapping[str, float]
    ) -> tuple[UnattributedEnergy, ...]:
        present = {gpu.identity.uuid for gpu in gpus}
        for uuid in [uuid for uuid in self._energy if uuid not in present]:
            del self._energy[uuid]  # the GPU left the node
        out: list[UnattributedEnergy] = []
        for gpu in gpus:
            energy = self._energy.get(gpu.identity.uuid)
            if energy is None or not gpu.up:
                continue
            energy.unattributed += spare.get(gpu.identity.uuid, 0.0)
            out.append(UnattributedEnergy(gpu.identity, energy.unattributed))
        return tuple(out)

    def _uses(
        self,
        gpus: tuple[GpuSample, ...],
        containers: Mapping[int, ContainerRef],
        pods: PodIndex,
    ) -> tuple[dict[Key, _Use], list[Unattributed], dict[str, _Strays]]:
        """Each row's use, the processes outside pods per GPU, and their utilization (with
        whether every process of the GPU was timed) per GPU whose process list answered."""
        uses: dict[Key, _Use] = {}
        unattributed: list[Unattributed] = []
        strays: dict[str, _Strays] = {}
        for gpu in gpus:
            if not gpu.up or gpu.processes is None:
                continue
            stray = 0
            stray_memory = 0
            timing = strays[gpu.identity.uuid] = _Strays()
            here: set[Key] = set()
            for process in gpu.processes:
                timing.timed = timing.timed and process.sm_utilization is not None
                name: str | None = None
                pod: Pod | None = None
                ref = containers.get(process.pid)
                if ref is not None:
                    pod = pods.by_uid.get(ref.pod_uid)
                    if pod is None:
                        self._once(
                            logging.DEBUG,
                            ("unknown pod", ref.pod_uid),
                            "a GPU process runs in a pod the API has not shown (yet)",
                            fields={"pid": process.pid, "pod_uid": ref.pod_uid},
                        )
                    else:
                        name = pod.containers.get(ref.container_id)
                        if name is None:
                            self._once(
                                logging.INFO,
                                ("unknown container", ref.container_id),
                                "a GPU process runs in a container its pod's status does not "
                                "list (yet); it attributes to no pod until it does",
                                fields={
                                    "pid": process.pid,
                                    "namespace": pod.namespace,
                                    "pod": pod.name,
                                    "container_id": ref.container_id,
                                },
                            )
                if pod is None or name is None or is_reservation(pod):
                    # a KAI reservation pod only keeps the GPU for its group: no holder, no user
                    stray += 1
                    stray_memory += process.used_memory_bytes or 0
                    timing.processes += 1
                    timing.utilization += process.sm_utilization or 0.0
                    continue
                key = (pod.uid, name, gpu.identity.uuid)
                use = uses.setdefault(key, _Use())
                here.add(key)
                use.processes += 1
                if process.used_memory_bytes is not None:
                    use.memory = (use.memory or 0) + process.used_memory_bytes
                if process.sm_utilization is not None:
                    use.utilization = min(1.0, (use.utilization or 0.0) + process.sm_utilization)
            if len(here) == 1 and not stray:
                # One container alone on the device: the device's own activity is its activity.
                # This is what times a MIG instance's user, whose processes NVML cannot time.
                (alone,) = here
                if uses[alone].utilization is None:
                    uses[alone].utilization = _device_busy(gpu)
            unattributed.append(Unattributed(gpu.identity, stray, stray_memory))
        return uses, unattributed, strays

    def _allocations(
        self,
        allocations: tuple[DeviceAllocation, ...],
        pods: PodIndex,
        gpus: tuple[GpuSample, ...],
        uses: Mapping[Key, _Use],
        devices: DeviceIndex,
    ) -> dict[tuple[str, str, str, str], Allocation]:
        by_uuid = {gpu.identity.uuid: gpu.identity for gpu in gpus if gpu.identity.uuid}
        answering = {gpu.identity.uuid for gpu in gpus if gpu.up and gpu.processes is not None}
        memory = {gpu.identity.uuid: gpu.value(MEMORY_TOTAL) for gpu in gpus}
        by_minor = {
            gpu.identity.minor_number: gpu.identity
            for gpu in gpus
            if gpu.identity.minor_number is not None
        }
        resolved: list[Holding] = []
        groups: dict[str, tuple[GpuIdentity, str]] = {}
        """KAI GPU group -> the GPU its reservation pod holds, and under which resource."""
        for allocation in allocations:
            pod = pods.by_name.get((allocation.namespace, allocation.pod))
            if pod is None:
                continue  # a pod the API has not shown yet, or one that ended
            if allocation.driver:
                identity = self._dra_device(
                    allocation, pod, devices=devices, gpus=gpus, by_uuid=by_uuid, uses=uses
                )
                replica = allocation.share_id
            else:
                identity, replica = self._plugin_device(allocation, by_uuid, by_minor)
            if identity is None:
                continue
            if is_reservation(pod):
                groups[pod.labels[KAI_GROUP]] = (identity, allocation.resource)
                continue  # it keeps the GPU for its group's pods: they are the holders
            if HAMI_ALLOCATED in pod.annotations and not allocation.driver:
                given = self._reservations.hami(pod, allocation, identity, by_uuid, memory)
                if given is not None:
                    resolved.extend(given)
                    continue
            reserved = capacity_share(allocation, devices) if allocation.share_id else None
            resolved.append(Holding(pod, allocation, identity, bool(replica), reserved))
        resolved.extend(self._reservations.kai(pods, groups, by_uuid, memory))
        holders, shares = self._reservations.divide(resolved)
        held: dict[tuple[str, str, str, str], Allocation] = {}
        for pod, allocation, identity, is_replica, _ in resolved:
            use = uses.get((pod.uid, allocation.container, identity.uuid))
            key = (pod.uid, allocation.container, identity.uuid, allocation.resource)
            previous = held.get(key)
            pod_identity = self._identity(pod)
            # Whether the holder runs anything there is unknown while the GPU (or its process
            # list) does not answer: not a GPU held idle.
            in_use = (use is not None and use.processes > 0) if identity.uuid in answering else None
            shared = (
                is_replica
                or len(holders[identity.uuid]) > 1
                or (previous is not None and previous.shared)
            )
            known = self._held.get(key)
            if (
                known is None
                or known.pod is not pod_identity
                or known.gpu is not identity
                or known.in_use != in_use
                or known.shared != shared
                or known.claim != allocation.claim
                or known.claim_namespace != allocation.claim_namespace
                or known.share != shares[key]
            ):
                known = Allocation(
                    pod_identity,
                    allocation.container,
                    allocation.resource,
                    identity,
                    in_use,
                    shared,
                    allocation.claim,
                    allocation.claim_namespace,
                    shares[key],
                )
            held[key] = known
        self._held = held
        return held

    def _plugin_device(
        self,
        allocation: DeviceAllocation,
        by_uuid: Mapping[str, GpuIdentity],
        by_minor: Mapping[int, GpuIdentity],
    ) -> tuple[GpuIdentity | None, str]:
        """The GPU a device plugin's id names (`<uuid>`, `nvidia<minor>`, a time-sliced replica
        `<uuid>::<n>`, a HAMi slot `<uuid>-<n>`), and the replica's number ("" for none)."""
        device, replica, _ = allocation.device_id.partition(_REPLICA_SEPARATOR)
        identity = by_uuid.get(device)
        if identity is None:
            minor = _MINOR_DEVICE.fullmatch(device)
            identity = by_minor.get(int(minor[1])) if minor else None
        if identity is None:
            identity = hami_slot(device, by_uuid)
        if identity is None:
            self._unknown(allocation, "a device this node's NVML does not show")
        return identity, replica

    def _dra_device(
        self,
        allocation: DeviceAllocation,
        pod: Pod,
        *,
        devices: DeviceIndex,
        gpus: tuple[GpuSample, ...],
        by_uuid: Mapping[str, GpuIdentity],
        uses: Mapping[Key, _Use],
    ) -> GpuIdentity | None:
        """The GPU or MIG instance behind a DRA device: by the `uuid` its ResourceSlice gives,
        else (a MIG device without one) the instance of its profile on its parent GPU — the one
        the holder runs on when the parent has several of that profile."""
        device = devices.get(allocation.driver, allocation.pool, allocation.device_id)
        if device is None:
            self._unknown(allocation, "a DRA device no ResourceSlice of this node publishes")
            return None
        identity = by_uuid.get(device.uuid) if device.uuid else None
        if identity is not None or not (device.parent_uuid and device.profile):
            if identity is None:
                self._unknown(allocation, "a DRA device whose GPU this node's NVML does not show")
            return identity
        candidates = [
            gpu.identity
            for gpu in gpus
            if gpu.identity.parent_uuid == device.parent_uuid
            and gpu.identity.mig_profile == device.profile
        ]
        if len(candidates) > 1:
            candidates = [
                candidate
                for candidate in candidates
                if (pod.uid, allocation.container, candidate.uuid) in uses
            ]
        if len(candidates) == 1:
            return candidates[0]
        self._unknown(
            allocation,
            "a DRA MIG device without a UUID, and no single MIG instance of its profile on its "
            "GPU that its holder runs on",
        )
        return None

    def _unknown(self, allocation: DeviceAllocation, what: str) -> None:
        fields: dict[str, object] = {
            "namespace": allocation.namespace,
            "pod": allocation.pod,
            "resource": allocation.resource,
            "device": allocation.device_id,
        }
        if allocation.driver:
            fields |= {"driver": allocation.driver, "pool": allocation.pool}
            fields["claim"] = allocation.claim
        self._once(
            # a DRA device may come before the first list of the node's ResourceSlices
            logging.INFO if allocation.driver else logging.WARNING,
            ("unknown device", allocation.driver, allocation.pool, allocation.device_id, what),
            f"the kubelet allocated {what}; skipping it",
            fields=fields,
        )

    def _identity(self, pod: Pod) -> PodIdentity:
        queue = queue_of(pod.namespace, pod.labels, self._local_queues)
        cached = self._identities.get(pod.uid)
        if cached is not None and cached[0] is pod and cached[1] == queue:
            return cached[2]
        labels: dict[str, str] = {}
        if self._pod_labels is not None:
            for name in sorted(pod.labels):
                if self._pod_labels.fullmatch(name):
                    labels.setdefault(
                        "label_" + _INVALID_LABEL_CHARACTERS.sub("_", name), pod.labels[name]
                    )
        identity = PodIdentity(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            workload=pod.workload.name,
            workload_kind=pod.workload.kind,
            labels=tuple(sorted(labels.items())),
            revision=revision(pod.labels),
            images=tuple(
                (container, image if self._shown(image) else "") for container, image in pod.images
            ),
            queue=queue[0] if queue else "",
            queue_kind=queue[1] if queue else "",
        )
        if len(self._identities) > 4 * len(self._busy) + 1024:
            self._identities.clear()  # bounded: pods come and go
        self._identities[pod.uid] = (pod, queue, identity)
        return identity

    def _shown(self, image: str) -> bool:
        """Whether --kubernetes.image-pattern lets the image be exported (all without one)."""
        return self._image_pattern is None or self._image_pattern.fullmatch(image) is not None


def _split(
    joules: float,
    *,
    here: list[Key],
    idle_takers: Mapping[Key, float],
    uses: Mapping[Key, _Use],
    stray: _Strays,
) -> tuple[dict[Key, float], float]:
    """A shared GPU's energy, every process timed: (joules per row, joules unattributed). The
    busy part by per-process utilization (the part of processes outside pods unattributed), the
    idle part by the share of the GPU each holder holds (or, with none, in equal parts to the
    containers running there); the idle part no holder holds is unattributed."""
    timed = {key: uses[key].utilization or 0.0 for key in here if key in uses}
    total = sum(timed.values()) + stray.utilization
    active = joules * min(1.0, total)
    idle = joules - active
    shares = {key: idle * share for key, share in idle_takers.items()}
    held = sum(idle_takers.values())
    unheld = idle * (1.0 - held) if held < _WHOLE else 0.0
    if total <= 0.0:
        return shares, unheld
    for key, value in timed.items():
        shares[key] = shares.get(key, 0.0) + active * value / total
    return shares, unheld + active * stray.utilization / total


def _device_busy(gpu: GpuSample) -> float | None:
    """How busy the device was: NVML utilization, else GPM SM activity (on MIG instances)."""
    utilization = gpu.value(UTILIZATION)
    return utilization if utilization is not None else gpu.value(SM_ACTIVE)
