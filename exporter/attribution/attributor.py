"""`Attributor` runs the three sources once per sampling cycle, in the sampler's worker thread, and
joins them with the cycle's GPU samples. Each source fails alone and reports itself as a
collector (`kubernetes`, `podresources`, `cgroups`). The pod watch runs in a thread of its own,
started and stopped with the application.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.join import Join
from exporter.attribution.podresources import PodResourcesClient
from exporter.attribution.pods import BATCH_SECONDS, PodCache
from exporter.attribution.procfs import ProcessContainers
from exporter.logs import LogOnce
from exporter.model import Attribution, CollectorStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.attribution import ClusterAccess
    from exporter.config import ServeConfig
    from exporter.model import GpuSample

log = logging.getLogger(__name__)


class Attributor:
    def __init__(
        self,
        config: ServeConfig,
        access: ClusterAccess,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.pods = PodCache(
            KubernetesClient(access),
            access.node_name,
            batch_seconds=min(BATCH_SECONDS, config.collect_interval / 2),
        )
        self._podresources = PodResourcesClient(
            config.pod_resources_socket,
            resource_names=config.resource_names or (),
            timeout=config.collect_interval / 2,
            clock=clock,
        )
        self._processes = ProcessContainers(config.procfs)
        self._join = Join(access.node_name, pod_labels=config.pod_labels)
        self._node = access.node_name
        self._once = LogOnce(log)

    def start(self) -> None:
        """Start watching pods (in a thread of its own)."""
        self.pods.start()

    def stop(self) -> None:
        self.pods.stop()

    def attribute(
        self, gpus: tuple[GpuSample, ...]
    ) -> tuple[Attribution, tuple[CollectorStatus, ...]]:
        """One cycle's attribution of these GPU samples. Blocking: runs in the worker thread.

        Never raises: whatever breaks here costs the pod series of this cycle, not the device
        series beside them."""
        started = self._clock()
        try:
            return self._attribute(gpus, started)
        except Exception as error:  # noqa: BLE001 - attribution must never stop sampling
            self._once(
                logging.ERROR,
                (type(error).__name__, str(error)),
                "pod attribution failed this cycle; device metrics are unaffected",
                exc_info=error,
            )
            failed = self._clock() - started
            empty = Attribution(self._node, (), (), (), (), self.pods.status())
            return empty, tuple(
                CollectorStatus(name, success=False, duration_seconds=failed)
                for name in ("kubernetes", "podresources", "cgroups")
            )

    def _attribute(
        self, gpus: tuple[GpuSample, ...], started: float
    ) -> tuple[Attribution, tuple[CollectorStatus, ...]]:
        index = self.pods.view()
        kubernetes = self.pods.status()
        viewed = self._clock()
        allocations, allocations_ok = self._podresources.allocations()
        asked = self._clock()
        pids = {
            process.pid for gpu in gpus if gpu.up and gpu.processes for process in gpu.processes
        }
        containers, cgroups_ok = self._processes.lookup(pids)
        read = self._clock()
        attribution = self._join(gpus, containers, index, allocations, kubernetes, now=read)
        joined = self._clock()
        return attribution, (
            CollectorStatus("kubernetes", kubernetes.watch_up, viewed - started + joined - read),
            CollectorStatus("podresources", allocations_ok, asked - viewed),
            CollectorStatus("cgroups", cgroups_ok, read - asked),
        )
