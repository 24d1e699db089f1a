"""`Attributor` joins the cycle's GPU samples with its sources — the pods of this node, the
kubelet's allocations, the DRA devices of the node's ResourceSlices, and which container each GPU
process runs in — into who holds and who uses each GPU. It runs once per sampling cycle, in the
sampler's worker thread; each source fails alone and reports itself as a collector
(`kubernetes`: the pod, ResourceSlice and LocalQueue watches; `podresources`; `cgroups`).

The sources are small protocols: on a node they are the pod and ResourceSlice watches, the
kubelet's PodResources API and `/proc` (`exporter.attribution.live`); under `--simulate` they are
the fleet file's pods (`exporter.simulator.cluster`). The join is the same either way. Sources
that block (the watches, the kubelet's gRPC API) do so in threads of their own: the cycle only
takes what they last published, and never waits for them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final, Protocol

from exporter.attribution.join import Join
from exporter.attribution.localqueues import NoLocalQueues
from exporter.logs import LogOnce
from exporter.model import Attribution, CollectorStatus, KubernetesStatus

if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Iterable

    from exporter.attribution.cgroups import ContainerRef
    from exporter.attribution.dra import DeviceIndex
    from exporter.attribution.localqueues import LocalQueueIndex
    from exporter.attribution.pod import PodIndex
    from exporter.attribution.podresources import DeviceAllocation
    from exporter.model import GpuSample, WatchStatus

log = logging.getLogger(__name__)


STOP_SECONDS: Final = 1.0
"""How long `Attributor.stop` waits for the sources' threads, all of them together."""


class Background(Protocol):
    """A source kept current in the background. Stopping is two steps, so that several are
    stopped in the time of one: `request_stop` tells its threads and returns at once, `join`
    waits for them until a deadline on `time.monotonic`'s clock (they are daemon threads: one
    still stuck then cannot hold the process)."""

    def start(self) -> None: ...
    def request_stop(self) -> None: ...
    def join(self, deadline: float) -> None: ...


class PodSource(Background, Protocol):
    """The pods of this node, kept current in the background."""

    def view(self) -> PodIndex: ...
    def status(self) -> WatchStatus | None: ...


class DeviceSource(Background, Protocol):
    """The DRA devices of this node (its ResourceSlices), kept current in the background."""

    def view(self) -> DeviceIndex: ...
    def status(self) -> WatchStatus | None:
        """None while DRA is off (no driver configured, or the cluster serves no slices)."""


class QueueSource(Background, Protocol):
    """The cluster's Kueue LocalQueues, kept current in the background."""

    def view(self) -> LocalQueueIndex: ...
    def status(self) -> WatchStatus | None:
        """None while nothing is watched (no cluster, no Kueue, or no RBAC for it)."""


class AllocationSource(Background, Protocol):
    """Which container was given which device, kept current in the background. A cycle takes
    the answer last published and never waits for the source."""

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        """(the allocations, or None while unknown; whether the source answers)."""


class ProcessSource(Protocol):
    """Which container each process runs in."""

    def lookup(self, pids: Iterable[int]) -> tuple[dict[int, ContainerRef], bool]:
        """(the container of each pid in one; whether every pid could be looked up)."""


class Attributor:
    def __init__(
        self,
        node: str,
        pods: PodSource,
        allocations: AllocationSource,
        processes: ProcessSource,
        devices: DeviceSource,
        *,
        queues: QueueSource | None = None,
        pod_labels: re.Pattern[str] | None = None,
        image_pattern: re.Pattern[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node = node
        self.pods = pods
        self._allocations = allocations
        self._processes = processes
        self.devices = devices
        self.queues: QueueSource = queues if queues is not None else NoLocalQueues()
        self._join = Join(node, pod_labels=pod_labels, image_pattern=image_pattern)
        self._clock = clock
        self._once = LogOnce(log)

    def start(self) -> None:
        """Start the sources' background work."""
        self.pods.start()
        self.devices.start()
        self.queues.start()
        self._allocations.start()

    def stop(self, *, timeout: float = STOP_SECONDS) -> None:
        """Stop the sources' background work: every thread is told first, then all are waited
        for until one deadline, `timeout` from now; returns by then whatever they do."""
        deadline = time.monotonic() + timeout
        sources: tuple[Background, ...] = (
            self._allocations,
            self.devices,
            self.queues,
            self.pods,
        )
        for source in sources:
            source.request_stop()
        for source in sources:
            source.join(deadline)

    def kubernetes(self) -> KubernetesStatus:
        """How current the watches are."""
        pods, devices, queues = self.pods.status(), self.devices.status(), self.queues.status()
        return KubernetesStatus(
            watches=tuple(status for status in (pods, devices, queues) if status is not None),
            pods_cached=pods.objects if pods is not None else 0,
            dra_devices=None if devices is None else len(self.devices.view()),
        )

    def attribute(
        self, gpus: tuple[GpuSample, ...]
    ) -> tuple[Attribution, tuple[CollectorStatus, ...]]:
        """One cycle's attribution of these GPU samples. Runs in the worker thread.

        Never raises: whatever breaks here costs the pod series of this cycle, not the device
        series beside them."""
        started = self._clock()
        try:
            return self._attribute(gpus, started)
        except Exception as error:  # noqa: BLE001 - attribution must never stop sampling
            self._once.unexpected(
                ("attribute",),
                "pod attribution failed this cycle; device metrics are unaffected",
                error,
            )
            failed = self._clock() - started
            empty = Attribution(self._node, (), (), (), (), self.kubernetes())
            return empty, tuple(
                CollectorStatus(name, success=False, duration_seconds=failed)
                for name in ("kubernetes", "podresources", "cgroups")
            )

    def _attribute(
        self, gpus: tuple[GpuSample, ...], started: float
    ) -> tuple[Attribution, tuple[CollectorStatus, ...]]:
        index = self.pods.view()
        devices = self.devices.view()
        local_queues = self.queues.view()
        kubernetes = self.kubernetes()
        viewed = self._clock()
        allocations, allocations_ok = self._allocations.allocations()
        asked = self._clock()
        pids = {
            process.pid for gpu in gpus if gpu.up and gpu.processes for process in gpu.processes
        }
        containers, cgroups_ok = self._processes.lookup(pids)
        read = self._clock()
        attribution = self._join(
            gpus,
            containers,
            index,
            allocations,
            kubernetes,
            devices=devices,
            local_queues=local_queues,
            now=read,
        )
        joined = self._clock()
        return attribution, (
            CollectorStatus("kubernetes", kubernetes.watch_up, viewed - started + joined - read),
            CollectorStatus("podresources", allocations_ok, asked - viewed),
            CollectorStatus("cgroups", cgroups_ok, read - asked),
        )
