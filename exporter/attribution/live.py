"""The attribution sources of a real node: the pod watch (list + watch of the API server, in a
thread of its own), the kubelet's PodResources API (asked by a poller thread of its own, so a
slow kubelet never delays a cycle) and `/proc` (read in the cycle: one `stat` per GPU process,
a file only for a process not seen before).

Imported only when a cluster is configured: the `kubernetes` package it pulls in costs about
20 MiB of memory.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final

from exporter.attribution.attributor import Attributor
from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.podresources import PodResourcesClient
from exporter.attribution.pods import BATCH_SECONDS, PodCache
from exporter.attribution.procfs import ProcessContainers
from exporter.supervise import SupervisedThread

if TYPE_CHECKING:
    from exporter.attribution import ClusterAccess
    from exporter.attribution.podresources import DeviceAllocation
    from exporter.config import ServeConfig

POLL_SECONDS: Final = 1.0
"""How often the poller asks the client (which itself calls the kubelet at most every 5 s)."""
FIRST_ANSWER_SECONDS: Final = 2.0
"""How long the first cycle waits for the kubelet's first answer."""


class PodResourcesPoller:
    """The kubelet's allocations, asked in a thread of its own; the cycle takes the latest."""

    def __init__(self, client: PodResourcesClient) -> None:
        self._client = client
        self._latest: tuple[tuple[DeviceAllocation, ...] | None, bool] = (None, False)
        self._answered = threading.Event()
        self._stopping = threading.Event()
        self._started = False
        self._thread = SupervisedThread("gpuscope-podresources", self._run)

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.stop(2.0)

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        """The latest answer (an immutable tuple, replaced whole by the poller); the first cycle
        waits briefly for the first."""
        if self._started:
            self._answered.wait(FIRST_ANSWER_SECONDS)
        return self._latest

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._latest = self._client.allocations()
            self._answered.set()
            self._stopping.wait(POLL_SECONDS)


def cluster_attributor(config: ServeConfig, access: ClusterAccess) -> Attributor:
    """The attributor of a node in a real cluster."""
    return Attributor(
        access.node_name,
        PodCache(
            KubernetesClient(access),
            access.node_name,
            batch_seconds=min(BATCH_SECONDS, config.collect_interval / 2),
        ),
        PodResourcesPoller(
            PodResourcesClient(
                config.pod_resources_socket, resource_names=config.resource_names or ()
            )
        ),
        ProcessContainers(config.procfs),
        pod_labels=config.pod_labels,
    )
