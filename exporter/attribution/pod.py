"""One pod as attribution needs it, read from the Kubernetes API's JSON; pure.

`pod_from_api` keeps what attribution uses of a `v1.Pod` (its UID, name, labels, workload, the
ids of its containers and their images); `PodIndex` finds the running pods of a node by UID or
name. The pod watch (`exporter.attribution.pods`) feeds them from the API server, the simulator
(`exporter.simulator.cluster`) from a fleet file: the same parsing either way.

`pod_shape` is what the watch reads of a pod as it arrives, and so all a tenant's pod can make the
daemon hold: the fields above, each string cut (`jsonstream.MAX_TEXT`), at most
`MAX_CONTAINERS` containers and statuses of each kind, two owner references (the first and the
controller), the mirror annotation and those that say what a pod reserved of a shared GPU
(`exporter.attribution.shares`), and only the labels gpuscope reads (the revision labels, KAI's
GPU group labels, the queue labels `exporter.attribution.localqueues` reads, and those
`--kubernetes.pod-labels` exports, at most `MAX_LABELS`). Env, volumes, managed fields, other
labels and annotations are scanned past, never built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from exporter.attribution.jsonstream import TEXT, Entries, Fields, Items, Scalar
from exporter.attribution.localqueues import QUEUE_LABELS
from exporter.attribution.owners import OwnerReference, Workload, workload_of
from exporter.attribution.shares import MAX_ANNOTATION, SHARE_ANNOTATIONS, SHARE_LABELS

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
"""On a static pod's mirror: the kubelet's own UID for it, the one in its cgroup path."""
KNOWN_RUNTIMES: Final = frozenset({"containerd", "cri-o", "docker"})
_CONTAINER_ID: Final = re.compile(r"[0-9a-f]{64}")
_ENDED_PHASES: Final = frozenset({"Succeeded", "Failed"})
REVISION_LABELS: Final = ("pod-template-hash", "controller-revision-hash")
"""The labels a controller puts on its pods to name the revision of their template: a
Deployment's ReplicaSet the first, a StatefulSet's or DaemonSet's ControllerRevision the second."""
MAX_IMAGE_LENGTH: Final = 128
"""An image reference is cut to this many characters (after its digest is dropped): a label value
a person reads, never a document."""
_CONTAINER_KINDS: Final = ("containers", "initContainers", "ephemeralContainers")
_STATUS_KINDS: Final = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")
MAX_CONTAINERS: Final = 64
"""Containers (and container statuses) of each kind read of a pod. Pods run a few; ephemeral
containers pile up with each `kubectl debug` and are never removed. A container past these is
not matched to its processes (its pod's other containers are)."""
MAX_LABELS: Final = 64
"""Labels kept of a pod among those `--kubernetes.pod-labels` names (each one a label of
`gpu_pod_info`)."""


class PodFormatError(ValueError):
    """A pod object without the fields every pod has; `str()` names the missing one."""


@dataclass(frozen=True, slots=True)
class Pod:
    """What attribution needs of one pod."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    workload: Workload
    containers: Mapping[str, str]
    """Container id (64 hex, as in the cgroup path) -> container name."""
    images: tuple[tuple[str, str], ...] = ()
    """(container name, image reference as `image_reference` shortens it), as the spec lists them."""
    static_uid: str | None = None
    ended: bool = False
    """Succeeded or Failed: its containers are gone and it attributes nothing."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Those of `shares.SHARE_ANNOTATIONS` the pod has: what it reserved of a shared GPU."""
    init_containers: tuple[str, ...] = ()
    spec_containers: tuple[str, ...] = ()
    """The names of its init containers and containers, in spec order."""
    problems: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """(cause, detail) of container ids that cannot be matched, for the log."""


def pod_from_api(obj: Mapping[str, Any]) -> Pod:
    """A `Pod` from the API's JSON for one pod (`v1.Pod`). Pure."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        raise PodFormatError("no metadata")
    uid, namespace, name = (metadata.get(key) for key in ("uid", "namespace", "name"))
    if not (isinstance(uid, str) and uid and isinstance(namespace, str) and namespace):
        raise PodFormatError("no metadata.uid or metadata.namespace")
    if not (isinstance(name, str) and name):
        raise PodFormatError("no metadata.name")
    labels = _string_map(metadata.get("labels"))
    annotations = _string_map(metadata.get("annotations"))
    owners = [
        OwnerReference(
            str(ref.get("kind", "")), str(ref.get("name", "")), ref.get("controller") is True
        )
        for ref in metadata.get("ownerReferences") or ()
        if isinstance(ref, dict) and ref.get("kind") and ref.get("name")
    ]
    status = obj.get("status")
    status = status if isinstance(status, dict) else {}
    containers: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for key in _STATUS_KINDS:
        for container in status.get(key) or ():
            if not isinstance(container, dict):
                continue
            reference = container.get("containerID")
            container_name = container.get("name")
            if not (isinstance(reference, str) and reference and isinstance(container_name, str)):
                continue  # not started yet
            runtime, sep, container_id = reference.partition("://")
            if not sep or not _CONTAINER_ID.fullmatch(container_id):
                problems.append(("container-id", runtime if sep else reference))
                continue
            if runtime not in KNOWN_RUNTIMES:
                problems.append(("runtime", runtime))
            containers[container_id] = container_name
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    mirror = annotations.get(MIRROR_ANNOTATION)
    return Pod(
        uid=uid,
        namespace=namespace,
        name=name,
        labels=labels,
        workload=workload_of(name, owners, labels),
        containers=containers,
        images=_images(spec),
        static_uid=mirror or None,
        ended=status.get("phase") in _ENDED_PHASES,
        problems=tuple(problems),
        annotations={key: value for key, value in annotations.items() if key in SHARE_ANNOTATIONS},
        init_containers=_names(spec.get("initContainers")),
        spec_containers=_names(spec.get("containers")),
    )


def pod_shape(*, labels: re.Pattern[str] | None = None) -> Fields:
    """What is read of a pod as the API serves it: what `pod_from_api` uses, with the labels
    gpuscope reads (the revision labels, the queue labels, and those `labels` matches in full)."""

    def read_label(name: str) -> bool:
        return (
            name in REVISION_LABELS
            or name in SHARE_LABELS
            or name in QUEUE_LABELS
            or (labels is not None and bool(labels.fullmatch(name)))
        )

    def read_annotation(name: str) -> bool:
        return name == MIRROR_ANNOTATION or name in SHARE_ANNOTATIONS

    container = Fields({"name": TEXT, "image": TEXT})
    container_status = Fields({"name": TEXT, "containerID": TEXT})
    owner = Fields({"kind": TEXT, "name": TEXT, "controller": Scalar()})
    return Fields(
        {
            "metadata": Fields(
                {
                    "uid": TEXT,
                    "namespace": TEXT,
                    "name": TEXT,
                    "labels": Entries(TEXT, keep=read_label, max_entries=MAX_LABELS),
                    "annotations": Entries(
                        Scalar(max_length=MAX_ANNOTATION),
                        keep=read_annotation,
                        max_entries=1 + len(SHARE_ANNOTATIONS),
                    ),
                    "ownerReferences": Items(owner, max_items=2, select=_first_or_controller),
                }
            ),
            "spec": Fields(
                {key: Items(container, max_items=MAX_CONTAINERS) for key in _CONTAINER_KINDS}
            ),
            "status": Fields(
                {
                    "phase": TEXT,
                    **{
                        key: Items(container_status, max_items=MAX_CONTAINERS)
                        for key in _STATUS_KINDS
                    },
                }
            ),
        }
    )


def _first_or_controller(owner: object, kept: Sequence[object]) -> object | None:
    """The owner references `workload_of` looks at: the controller, else the first."""
    controller = isinstance(owner, dict) and owner.get("controller") is True
    return owner if not kept or controller else None


def revision(labels: Mapping[str, str]) -> str:
    """The revision of the pod's template its controller labels it with; "" for none."""
    return next((labels[name] for name in REVISION_LABELS if labels.get(name)), "")


def image_reference(image: str) -> str:
    """An image as a label shows it: without its digest (`@sha256:…`: the tag names the
    release a person compares; the digest only makes every rebuild a series of its own), cut to
    `MAX_IMAGE_LENGTH` characters."""
    return image.partition("@")[0][:MAX_IMAGE_LENGTH]


def _images(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    images: list[tuple[str, str]] = []
    for key in _CONTAINER_KINDS:
        for container in spec.get(key) or ():
            if not isinstance(container, dict):
                continue
            name, image = container.get("name"), container.get("image")
            if isinstance(name, str) and name and isinstance(image, str) and image:
                images.append((name, image_reference(image)))
    return tuple(images)


def _names(containers: object) -> tuple[str, ...]:
    if not isinstance(containers, list):
        return ()
    return tuple(
        name
        for container in containers[:MAX_CONTAINERS]
        if isinstance(container, dict) and isinstance(name := container.get("name"), str) and name
    )


def _string_map(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(key): str(item) for key, item in value.items()}


@dataclass(frozen=True, slots=True)
class PodIndex:
    """The running pods of this node, found by UID (the API's or a static pod's) or by name."""

    by_uid: Mapping[str, Pod]
    by_name: Mapping[tuple[str, str], Pod]

    @classmethod
    def of(cls, pods: Iterable[Pod]) -> PodIndex:
        by_uid: dict[str, Pod] = {}
        by_name: dict[tuple[str, str], Pod] = {}
        for pod in pods:
            if pod.ended:
                continue
            by_uid[pod.uid] = pod
            if pod.static_uid:
                by_uid[pod.static_uid] = pod
            by_name[(pod.namespace, pod.name)] = pod
        return cls(by_uid, by_name)


EMPTY_INDEX: Final = PodIndex({}, {})
