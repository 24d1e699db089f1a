"""The attribution sources of a real node: the pod, ResourceSlice and LocalQueue watches (list +
watch of the API server, each in a thread of its own), the kubelet's PodResources API (asked by a poller
thread of its own, so a slow kubelet never delays a cycle; the same thread reads the DRA claims
it names, once each) and `/proc` (read in the cycle: one `stat` per GPU process, a file only for
a process not seen before).

Imported only when a cluster is configured.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Final

from exporter.attribution.attributor import Attributor
from exporter.attribution.claims import ClaimResources
from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.dra import NO_DEVICES
from exporter.attribution.localqueues import local_queue_watch
from exporter.attribution.podresources import PodResourcesClient
from exporter.attribution.pods import pod_watch
from exporter.attribution.procfs import ProcessContainers
from exporter.attribution.resourceslices import resource_slice_watch
from exporter.attribution.watch import BATCH_SECONDS, STOP_SECONDS
from exporter.supervise import SupervisedThread

if TYPE_CHECKING:
    from exporter.attribution import ClusterAccess
    from exporter.attribution.attributor import DeviceSource
    from exporter.attribution.dra import DeviceIndex
    from exporter.attribution.podresources import DeviceAllocation
    from exporter.config import ServeConfig
    from exporter.model import WatchStatus

POLL_SECONDS: Final = 1.0
"""How often the poller asks the client (which itself calls the kubelet at most every 5 s)."""


class PodResourcesPoller:
    """The kubelet's allocations, asked in a thread of its own; a cycle takes the answer last
    published and never waits for one (before the first, it has none: allocations unknown)."""

    def __init__(self, client: PodResourcesClient, *, claims: ClaimResources | None = None) -> None:
        self._client = client
        self._claims = claims
        """Gives DRA allocations their resource names (blocking: asks the API server)."""
        self._latest: tuple[tuple[DeviceAllocation, ...] | None, bool] = (None, False)
        """Replaced whole by the poller, read by the sampler: a tuple of immutable tuples."""
        self._stopping = threading.Event()
        self._thread = SupervisedThread("gpuscope-podresources", self._run)

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Tell the poller to end; returns at once (a call to the kubelet ends within its 1 s
        timeout, a claim's GET within its own)."""
        self._stopping.set()
        self._thread.stop(0)  # no restart after this; the thread is joined in `join`

    def join(self, deadline: float) -> None:
        """Wait for the poller until `deadline` (on `time.monotonic`'s clock), then close the
        claims' connections."""
        self._thread.stop(max(0.0, deadline - time.monotonic()))
        if self._claims is not None:
            self._claims.close()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        self.request_stop()
        self.join(time.monotonic() + timeout)

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        """The answer last published (an immutable tuple, replaced whole by the poller)."""
        return self._latest

    def _run(self) -> None:
        while not self._stopping.is_set():
            allocations, healthy = self._client.allocations()
            if allocations is not None and self._claims is not None:
                allocations = self._claims.resolve(allocations)
            self._latest = (allocations, healthy)
            self._stopping.wait(POLL_SECONDS)


class NoDevices:
    """The device source of a node with DRA switched off (`--kubernetes.dra-drivers=`)."""

    def start(self) -> None:
        """Nothing to watch."""

    def request_stop(self) -> None:
        """Nothing to stop."""

    def join(self, deadline: float) -> None:
        """Nothing to wait for."""

    def view(self) -> DeviceIndex:
        return NO_DEVICES

    def status(self) -> WatchStatus | None:
        return None


def cluster_attributor(config: ServeConfig, access: ClusterAccess) -> Attributor:
    """The attributor of a node in a real cluster."""
    batch_seconds = min(BATCH_SECONDS, config.collect_interval / 2)
    pods = pod_watch(
        KubernetesClient(access.configuration),
        access.node_name,
        pod_labels=config.pod_labels,
        batch_seconds=batch_seconds,
    )
    devices: DeviceSource = NoDevices()
    claims = None
    if config.dra_drivers:
        slices = resource_slice_watch(
            KubernetesClient(access.configuration),
            access.node_name,
            config.dra_drivers,
            batch_seconds=batch_seconds,
        )
        devices = slices
        # A claim is read only once the ResourceSlices' first list says the cluster serves DRA:
        # a cluster without resource.k8s.io is never asked for a claim.
        claims = ClaimResources(
            KubernetesClient(access.configuration),
            active=lambda: slices.answered and not slices.off,
        )
    return Attributor(
        access.node_name,
        pods,
        PodResourcesPoller(
            PodResourcesClient(
                config.pod_resources_socket,
                resource_names=config.resource_names or (),
                dra_drivers=config.dra_drivers,
            ),
            claims=claims,
        ),
        ProcessContainers(config.procfs),
        devices,
        queues=local_queue_watch(
            KubernetesClient(access.configuration), batch_seconds=batch_seconds
        ),
        pod_labels=config.pod_labels,
        image_pattern=config.image_pattern,
    )
