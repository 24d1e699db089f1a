"""The pods on this node, kept current by list + watch (`exporter.attribution.watch`) of
`/api/v1/pods?fieldSelector=spec.nodeName=<node>`; the sampler takes an immutable `PodIndex`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from exporter.attribution.cluster import MAX_OBJECT_BYTES, PODS_PATH
from exporter.attribution.pod import (
    EMPTY_INDEX,
    Pod,
    PodFormatError,
    PodIndex,
    pod_from_api,
    pod_shape,
)
from exporter.attribution.watch import (
    BACKOFF_SECONDS,
    BATCH_SECONDS,
    PAGE_OBJECTS,
    Kind,
    ListWatch,
)
from exporter.logs import LogOnce

if TYPE_CHECKING:
    import re

    from exporter.attribution.cluster import KubernetesClient

log = logging.getLogger(__name__)

THREAD: Final = "gpuscope-pod-watch"

PodWatch = ListWatch[Pod, PodIndex]


def pod_watch(
    client: KubernetesClient,
    node: str,
    *,
    pod_labels: re.Pattern[str] | None = None,
    backoff: tuple[float, ...] = BACKOFF_SECONDS,
    batch_seconds: float = BATCH_SECONDS,
    page_objects: int = PAGE_OBJECTS,
    max_object_bytes: int = MAX_OBJECT_BYTES,
) -> PodWatch:
    """The list + watch of `node`'s pods, keeping of their labels those `pod_labels` names."""
    kind = Kind(
        resource="pods",
        noun="pods",
        path=PODS_PATH,
        selector=f"spec.nodeName={node}",
        shape=pod_shape(labels=pod_labels),
        parse=_PodParser(),
        index=PodIndex.of,
        empty=EMPTY_INDEX,
        page_objects=page_objects,
        max_object_bytes=max_object_bytes,
    )
    return ListWatch(client, kind, thread=THREAD, backoff=backoff, batch_seconds=batch_seconds)


class _PodParser:
    """A pod of the API's JSON, keyed by UID; what cannot be matched is said once per cause."""

    def __init__(self) -> None:
        self._once = LogOnce(log)

    def __call__(self, obj: object) -> tuple[str, Pod] | None:
        try:
            if not isinstance(obj, dict):
                raise PodFormatError("not an object")
            pod = pod_from_api(obj)
        except PodFormatError as error:
            self._once(
                logging.WARNING,
                ("pod", str(error)),
                "the API sent a pod without the fields every pod has; skipping it",
                fields={"problem": str(error)},
            )
            return None
        for cause, detail in pod.problems:
            self._once(
                logging.WARNING,
                (cause, detail),
                "container id of an unknown form; that container's processes attribute to no pod"
                if cause == "container-id"
                else "container runtime gpuscope does not know; matching its containers by id",
                fields={"namespace": pod.namespace, "pod": pod.name, "runtime": detail},
            )
        return pod.uid, pod
