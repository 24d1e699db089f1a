"""Which queue a pod was admitted through: Kueue's ClusterQueue or KAI Scheduler's queue, read
from the pod's labels, with Kueue's LocalQueues kept current by list + watch
(`exporter.attribution.watch`) of `/apis/kueue.x-k8s.io/<version>/localqueues`, cluster-wide.

What is read, and which wins when they disagree (`queue_of`):

1. Kueue's `kueue.x-k8s.io/cluster-queue-name` pod label (Kueue 0.17 and later put it on the
   pods of an admitted workload): the ClusterQueue, as Kueue itself recorded it at admission.
2. Else Kueue's `kueue.x-k8s.io/queue-name` label (what a user writes: a LocalQueue of the
   pod's namespace), resolved through that LocalQueue's `spec.clusterQueue`. A LocalQueue not
   seen yet leaves the pod unqueued until its watch event arrives.
3. Else KAI Scheduler's `kai.scheduler/queue` label: the KAI queue.

LocalQueues are served as `kueue.x-k8s.io/v1beta2` by newer Kueue releases and `v1beta1` by
older ones; the watch asks for v1beta2 and falls back to v1beta1 at a 404. A cluster without
Kueue (404 for both) or a service account without the RBAC (403) turns the watch off with one
log line: the cluster-queue-name and KAI labels still name queues, `queue-name` alone does not.

Of a LocalQueue only its namespace, name and `spec.clusterQueue` are held (each string cut to
`jsonstream.MAX_TEXT`); its status is scanned past.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.attribution.jsonstream import TEXT, Fields
from exporter.attribution.watch import BACKOFF_SECONDS, BATCH_SECONDS, Kind, ListWatch
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from exporter.attribution.cluster import KubernetesClient
    from exporter.model import WatchStatus

log = logging.getLogger(__name__)

CLUSTER_QUEUE_LABEL: Final = "kueue.x-k8s.io/cluster-queue-name"
LOCAL_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KAI_QUEUE_LABEL: Final = "kai.scheduler/queue"
QUEUE_LABELS: Final = (CLUSTER_QUEUE_LABEL, LOCAL_QUEUE_LABEL, KAI_QUEUE_LABEL)
"""The pod labels `queue_of` reads (the pod watch keeps them)."""
KUEUE: Final = "kueue"
KAI: Final = "kai"

LOCAL_QUEUES_PATHS: Final = (
    "/apis/kueue.x-k8s.io/v1beta2/localqueues",
    "/apis/kueue.x-k8s.io/v1beta1/localqueues",
)
"""Newest first: the watch asks for the next at a 404."""
THREAD: Final = "gpuscope-localqueue-watch"
ABSENT: Final = (
    "the Kubernetes API does not serve Kueue's LocalQueues to gpuscope (Kueue not installed, or "
    "RBAC without list and watch on localqueues.kueue.x-k8s.io): a pod labelled only with "
    "kueue.x-k8s.io/queue-name is exported without a queue"
)
LOCAL_QUEUE_SHAPE: Final = Fields(
    {
        "metadata": Fields({"namespace": TEXT, "name": TEXT}),
        "spec": Fields({"clusterQueue": TEXT}),
    }
)


@dataclass(frozen=True, slots=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    """`spec.clusterQueue`: "" when it names none (the LocalQueue resolves no pod)."""


@dataclass(frozen=True, slots=True)
class LocalQueueIndex:
    """The ClusterQueue of each LocalQueue, by (namespace, name); immutable."""

    cluster_queues: Mapping[tuple[str, str], str]

    @classmethod
    def of(cls, queues: Iterable[LocalQueue]) -> LocalQueueIndex:
        return cls({(q.namespace, q.name): q.cluster_queue for q in queues if q.cluster_queue})

    def __len__(self) -> int:
        return len(self.cluster_queues)


NO_LOCAL_QUEUES: Final = LocalQueueIndex({})


def queue_of(
    namespace: str, labels: Mapping[str, str], local_queues: LocalQueueIndex
) -> tuple[str, str] | None:
    """(queue, queue kind) of a pod with these labels, or None for an unqueued one; the order
    is the module's."""
    cluster_queue = labels.get(CLUSTER_QUEUE_LABEL)
    if cluster_queue:
        return cluster_queue, KUEUE
    local_queue = labels.get(LOCAL_QUEUE_LABEL)
    if local_queue:
        resolved = local_queues.cluster_queues.get((namespace, local_queue))
        if resolved:
            return resolved, KUEUE
    kai_queue = labels.get(KAI_QUEUE_LABEL)
    if kai_queue:
        return kai_queue, KAI
    return None


LocalQueueWatch = ListWatch[LocalQueue, LocalQueueIndex]


def local_queue_watch(
    client: KubernetesClient,
    *,
    backoff: tuple[float, ...] = BACKOFF_SECONDS,
    batch_seconds: float = BATCH_SECONDS,
) -> LocalQueueWatch:
    """The list + watch of the cluster's LocalQueues (every namespace's)."""
    kind = Kind(
        resource="localqueues",
        noun="LocalQueues",
        path=LOCAL_QUEUES_PATHS[0],
        selector="",
        shape=LOCAL_QUEUE_SHAPE,
        parse=_LocalQueueParser(),
        index=LocalQueueIndex.of,
        empty=NO_LOCAL_QUEUES,
        optional=True,
        absent=ABSENT,
        older_paths=LOCAL_QUEUES_PATHS[1:],
    )
    return ListWatch(client, kind, thread=THREAD, backoff=backoff, batch_seconds=batch_seconds)


class _LocalQueueParser:
    """A LocalQueue of the API's JSON, keyed by namespace/name; a malformed one said once."""

    def __init__(self) -> None:
        self._once = LogOnce(log)

    def __call__(self, obj: object) -> tuple[str, LocalQueue] | None:
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        spec = obj.get("spec") if isinstance(obj, dict) else None
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not (isinstance(namespace, str) and namespace and isinstance(name, str) and name):
            self._once(
                logging.WARNING,
                ("localqueue",),
                "the API sent a LocalQueue without metadata.namespace or metadata.name; "
                "skipping it",
            )
            return None
        cluster_queue = spec.get("clusterQueue") if isinstance(spec, dict) else None
        queue = LocalQueue(namespace, name, cluster_queue if isinstance(cluster_queue, str) else "")
        return f"{namespace}/{name}", queue


class NoLocalQueues:
    """The LocalQueue source where there is no cluster to ask (the simulator)."""

    def start(self) -> None:
        """Nothing to watch."""

    def request_stop(self) -> None:
        """Nothing to stop."""

    def join(self, deadline: float) -> None:
        """Nothing to wait for."""

    def view(self) -> LocalQueueIndex:
        return NO_LOCAL_QUEUES

    def status(self) -> WatchStatus | None:
        return None
