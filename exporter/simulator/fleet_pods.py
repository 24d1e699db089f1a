"""A fleet file's `pods`, and the pod and container its processes name.

Names follow Kubernetes' rules (DNS names, label names and values), so that a simulated pod is
one the API server would have accepted. Each function takes a value and its key path, returns
it typed, or raises `documents.Invalid`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from exporter.documents import Invalid, boolean, choice, join, mapping, quote, sequence, text
from exporter.simulator.fleet_values import entries, gpu_index, instance_position
from exporter.simulator.spec import (
    MAX_GPUS,
    MIG_COMPUTE_SLICES,
    WORKLOAD_KINDS,
    SimDevice,
    SimGpu,
    SimPod,
    SimProcess,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

POD_KEYS: Final = (
    "name",
    "namespace",
    "workload",
    "labels",
    "containers",
    "gpus",
    "resource",
    "shared",
    "claim",
    "images",
)
MAX_CONTAINERS: Final = 64
MAX_IMAGE_LENGTH: Final = 512
"""An image reference as a fleet file may write it (a registry host, a path, a tag, a digest)."""
_IMAGE: Final = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.:/@+]*")
_DNS_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_NAME: Final = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE: Final = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_RESOURCE: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9][-A-Za-z0-9_.]*")


def pod(value: object, path: str, gpus: tuple[SimGpu, ...]) -> SimPod:
    """A `pods` entry."""
    entry = mapping(value, path, required=("name",), optional=POD_KEYS)
    name = kubernetes_name(entry["name"], join(path, "name"))
    workload = mapping(
        entry.get("workload"), join(path, "workload"), optional=("kind", "name"), null_is_empty=True
    )
    labels = mapping(entry.get("labels"), join(path, "labels"), null_is_empty=True)
    containers = sequence(
        entry.get("containers", ["main"]),
        join(path, "containers"),
        min_items=1,
        max_items=MAX_CONTAINERS,
    )
    devices = entries(entry.get("gpus"), join(path, "gpus"), MAX_GPUS * MIG_COMPUTE_SLICES)
    resource = entry.get("resource")
    claim = entry.get("claim")
    shared = boolean(entry.get("shared", False), join(path, "shared"))
    images = mapping(entry.get("images"), join(path, "images"), null_is_empty=True)
    if claim is not None:
        if not devices:
            raise Invalid(join(path, "claim"), "a claim holds devices: give the pod gpus")
        if shared:
            raise Invalid(
                join(path, "shared"),
                "time-slicing is the device plugin's; pods share a claim by naming the same one",
            )
    return SimPod(
        namespace=kubernetes_name(entry.get("namespace", "default"), join(path, "namespace")),
        name=name,
        workload_kind=choice(
            workload.get("kind", "Pod"), join(path, "workload.kind"), WORKLOAD_KINDS
        ),
        workload=kubernetes_name(workload.get("name", name), join(path, "workload.name")),
        labels=tuple(
            sorted(_label(key, label, join(path, "labels")) for key, label in labels.items())
        ),
        containers=tuple(
            kubernetes_name(container, join(join(path, "containers"), n))
            for n, container in enumerate(containers)
        ),
        devices=tuple(
            _device(device, join(join(path, "gpus"), n), gpus) for n, device in enumerate(devices)
        ),
        resource=None if resource is None else _resource(resource, join(path, "resource")),
        shared=shared,
        claim=None if claim is None else kubernetes_name(claim, join(path, "claim")),
        images=tuple(
            (container, _image(image, join(join(path, "images"), container)))
            for container, image in images.items()
        ),
    )


def pod_key(value: object, path: str) -> str:
    """A process's `pod`: `namespace/name`."""
    key = text(value, path, max_length=507)
    namespace, slash, name = key.partition("/")
    if not slash:
        raise Invalid(path, f"{quote(key)} is not namespace/name")
    return f"{kubernetes_name(namespace, path)}/{kubernetes_name(name, path)}"


def kubernetes_name(value: object, path: str) -> str:
    """A name as Kubernetes names objects (a DNS subdomain)."""
    return text(value, path, max_length=253, pattern=_DNS_NAME, describe="a Kubernetes name")


def check_pods(pods: Sequence[SimPod], processes: Sequence[SimProcess]) -> None:
    """Pods named once; pods naming one claim hold the same devices; every process's pod and
    container exist."""
    by_key: dict[str, SimPod] = {}
    claims: dict[tuple[str, str], SimPod] = {}
    for n, entry in enumerate(pods):
        if entry.key in by_key:
            raise Invalid(join("pods", n), f"{entry.key} appears more than once")
        by_key[entry.key] = entry
        if entry.claim is None:
            continue
        first = claims.setdefault((entry.namespace, entry.claim), entry)
        if first.devices != entry.devices or first.resource != entry.resource:
            raise Invalid(
                join(join("pods", n), "claim"),
                f"claim {entry.claim} holds other gpus or another resource in {first.key}: "
                "pods naming one claim share its devices",
            )
    for n, entry in enumerate(pods):
        for container, _ in entry.images:
            if container not in entry.containers:
                raise Invalid(
                    join(join(join("pods", n), "images"), container),
                    f"{entry.key} has no container {quote(container)} "
                    f"(it has {', '.join(entry.containers)})",
                )
    for n, process in enumerate(processes):
        path = join("processes", n)
        if process.pod is None:
            if process.container is not None:
                raise Invalid(join(path, "container"), "needs a pod")
            continue
        owner = by_key.get(process.pod)
        if owner is None:
            raise Invalid(join(path, "pod"), f"no pod {process.pod} in pods")
        if process.container is not None and process.container not in owner.containers:
            raise Invalid(
                join(path, "container"),
                f"{owner.key} has no container {quote(process.container)} "
                f"(it has {', '.join(owner.containers)})",
            )


def _label(key: str, value: object, path: str) -> tuple[str, str]:
    text(key, path, max_length=316, pattern=_LABEL_NAME, describe="a Kubernetes label name")
    label = text(
        value,
        join(path, key),
        max_length=63,
        pattern=_LABEL_VALUE,
        describe="a Kubernetes label value",
        allow_empty=True,
    )
    return key, label


def _image(value: object, path: str) -> str:
    return text(
        value,
        path,
        max_length=MAX_IMAGE_LENGTH,
        pattern=_IMAGE,
        describe="an image reference such as vllm/vllm-openai:v0.8.5",
    )


def _resource(value: object, path: str) -> str:
    return text(value, path, pattern=_RESOURCE, describe="a resource name such as nvidia.com/gpu")


def _device(value: object, path: str, gpus: tuple[SimGpu, ...]) -> SimDevice:
    """`2` (a whole GPU) or `{gpu: 4, mig_instance: 1}` (one of its MIG instances)."""
    if not isinstance(value, Mapping):
        return SimDevice(gpu_index(value, path, gpus))
    entry = mapping(value, path, required=("gpu",), optional=("mig_instance",))
    gpu = gpu_index(entry["gpu"], join(path, "gpu"), gpus)
    if "mig_instance" not in entry:
        return SimDevice(gpu)
    instance = instance_position(entry["mig_instance"], join(path, "mig_instance"))
    layout = gpus[gpu].mig
    if layout is None or instance >= len(layout):
        raise Invalid(join(path, "mig_instance"), f"GPU {gpu} has no MIG instance {instance}")
    return SimDevice(gpu, instance)
