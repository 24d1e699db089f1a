"""Who holds and who uses each GPU: the pod families; nothing at all when attribution is off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.samples import Sample

from exporter.metrics.base import add, gpu_labels, identity_pairs, new_metric
from exporter.metrics.labels import LabelCache
from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from exporter.model import Attribution, GpuIdentity, PodIdentity

POD_LABELS: Final = ("namespace", "pod", "container", "workload", "workload_kind")

POD_MEMORY: Final = Family(
    "gpu_pod_memory_used_bytes",
    "GPU memory used by a container's processes on this GPU.",
    unit="bytes",
    labels=POD_LABELS,
    doc="memory of that container's processes on the GPU (0 for a container that holds the GPU "
    "and runs nothing)",
    collector="attribution",
)
POD_UTILIZATION: Final = Family(
    "gpu_pod_utilization_ratio",
    "Share of the last sample period in which a container's processes ran a kernel on this "
    "GPU (summed per-process utilization, so shared GPUs split truthfully).",
    unit="ratio",
    labels=POD_LABELS,
    labels_doc="as above",
    doc="share of the last sample period in which that container's processes ran a kernel: the "
    "sum of their per-process utilization, so a shared GPU splits truthfully",
    collector="attribution",
)
POD_BUSY: Final = Family(
    "gpu_pod_busy_seconds",
    "A container's utilization of this GPU integrated over time; rate() gives its average.",
    kind="counter",
    unit="seconds",
    labels=POD_LABELS,
    labels_doc="as above",
    doc="the same, integrated over time; never goes down while the pod lives, even as its "
    "processes come and go",
    collector="attribution",
)
POD_ENERGY: Final = Family(
    "gpu_pod_energy_joules",
    "A container's part of this GPU's energy: all of it alone on the GPU; on a shared one the "
    "busy part by per-process utilization, the idle part by the share each holder holds.",
    kind="counter",
    unit="joules",
    labels=POD_LABELS,
    labels_doc="as above (never on MIG instances)",
    doc="that container's part of the GPU's energy (see [Energy and carbon](../guide/attribution.md#energy-and-carbon)): "
    "all of it when the container is alone on the GPU, else the busy part by per-process "
    "utilization and the idle part by the share of the GPU each holder holds "
    "(`gpu_allocation_share_ratio`; equal parts on a time-sliced GPU); with "
    "`gpu_unattributed_energy_joules_total` it adds up to the GPU's energy; never goes down "
    "while the pod lives; absent on MIG instances (NVML measures the whole GPU only)",
    collector="attribution",
)
ALLOCATION_INFO: Final = Family(
    "gpu_allocation_info",
    "The kubelet allocated this GPU to this container, by a device plugin or through a DRA "
    "ResourceClaim (claim, claim_namespace); always 1.",
    labels=(*POD_LABELS, "resource"),
    labels_doc="as above, `resource`; through DRA also `claim`, `claim_namespace`",
    doc="the kubelet allocated this GPU to that container: by a device plugin (`resource` is its "
    "resource, e.g. `nvidia.com/gpu`), or through a DRA ResourceClaim (`resource` is the "
    "DeviceClass's extended resource name, e.g. `nvidia.com/gpu`, else the driver's name; "
    "`claim` and `claim_namespace` name the claim); always 1",
    collector="attribution",
)
ALLOCATION_IN_USE: Final = Family(
    "gpu_allocation_in_use",
    "1 when at least one process of the holding container runs on the allocated GPU, "
    "0 when it holds the GPU idle.",
    labels=(*POD_LABELS, "resource"),
    labels_doc="as `gpu_allocation_info`, without `claim` and `claim_namespace`",
    doc="1 when at least one process of the holding container runs on the GPU, 0 when it holds "
    "the GPU idle",
    collector="attribution",
)
ALLOCATION_SHARED: Final = Family(
    "gpu_allocation_shared",
    "1 when the allocated GPU is shared: time-sliced replicas, a fraction (HAMi, KAI), a share "
    "of a DRA device, or more than one holder.",
    labels=(*POD_LABELS, "resource"),
    labels_doc="as `gpu_allocation_in_use`",
    doc="1 when the GPU is shared: time-sliced replicas (`<uuid>::N` device ids), a fraction "
    "HAMi or KAI Scheduler handed out, a share of a DRA device's capacity (`share_id`), or more "
    "than one holding container (one ResourceClaim several pods reserve, say)",
    collector="attribution",
)
ALLOCATION_SHARE: Final = Family(
    "gpu_allocation_share_ratio",
    "The part of the allocated GPU the holder holds: what it reserved (HAMi, KAI, DRA capacity "
    "sharing), else an equal part of what the GPU's other holders leave; a GPU's add up to 1 at "
    "most.",
    unit="ratio",
    labels=(*POD_LABELS, "resource"),
    labels_doc="as `gpu_allocation_in_use`",
    doc="the part of the GPU that container holds: 1 alone on it; what it reserved where HAMi "
    "(`hami.io/vgpu-devices-allocated`), KAI Scheduler (`gpu-fraction`, `gpu-memory`) or DRA "
    "capacity sharing (`consumedCapacity`) say so; else an equal part of what the GPU's other "
    "holders leave (1/N of N time-sliced or MPS holders, or of one claim's pods); a GPU's "
    "shares add up to 1 at most (see [Shared GPUs](../guide/attribution.md#shared-gpus)); "
    "`allocation:gpu_allocation:share` is this series with `gpu_allocation_info`'s labels",
    collector="attribution",
)
POD_INFO: Final = Family(
    "gpu_pod_info",
    "A pod that holds or uses a GPU on this node, its workload and chosen pod labels; always 1.",
    labels=("namespace", "pod", "workload", "workload_kind", "node", "revision"),
    gpu=False,
    labels_doc="no GPU labels: `namespace`, `pod`, `workload`, `workload_kind`, `node`, "
    "`revision`, `label_<name>`",
    doc="a pod that holds or uses a GPU of this node, its template's revision (its "
    "`pod-template-hash` label, else `controller-revision-hash`; empty for neither) and the pod "
    "labels chosen by `--kubernetes.pod-labels`; always 1",
    collector="attribution",
)
QUEUE_INFO: Final = Family(
    "gpu_pod_queue_info",
    "The queue a pod that holds or uses a GPU on this node was admitted through (a Kueue "
    "ClusterQueue or a KAI Scheduler queue); always 1.",
    labels=("namespace", "pod", "queue", "queue_kind"),
    gpu=False,
    labels_doc="no GPU labels: `namespace`, `pod`, `queue`, `queue_kind` (`kueue` or `kai`)",
    doc="the queue a pod that holds or uses a GPU of this node was admitted through: its Kueue "
    'ClusterQueue (`queue_kind="kueue"`; the pod\'s `kueue.x-k8s.io/cluster-queue-name` label, '
    "else its `kueue.x-k8s.io/queue-name` LocalQueue's `spec.clusterQueue`) or its KAI Scheduler "
    'queue (`queue_kind="kai"`, the `kai.scheduler/queue` label); absent for a pod in no '
    "queue; always 1 (see [Showback per queue](../guide/attribution.md#showback-per-queue))",
    collector="attribution",
)
CONTAINER_INFO: Final = Family(
    "gpu_pod_container_info",
    "The image of a container that holds or uses a GPU on this node (digest dropped, cut to 128 "
    "characters); always 1.",
    labels=("namespace", "pod", "container", "image"),
    gpu=False,
    labels_doc="no GPU labels: `namespace`, `pod`, `container`, `image`",
    doc="the image of a container that holds or uses a GPU of this node, as its pod's spec names "
    'it without the digest, cut to 128 characters; `image=""` where '
    "`--kubernetes.image-pattern` does not match it; always 1",
    collector="attribution",
)
UNATTRIBUTED_MEMORY: Final = Family(
    "gpu_unattributed_memory_used_bytes",
    "GPU memory used by processes that map to no pod (outside Kubernetes, or a pod not known yet).",
    unit="bytes",
    doc="memory of the GPU's processes that map to no pod",
    collector="attribution",
)
UNATTRIBUTED_ENERGY: Final = Family(
    "gpu_unattributed_energy_joules",
    "This GPU's energy given to no container: processes outside pods, a GPU nobody holds, a GPU "
    "in MIG mode, cycles whose split could not be made.",
    kind="counter",
    unit="joules",
    doc="the GPU's energy given to no container: processes outside pods, a GPU no container "
    "holds or runs on, a GPU in MIG mode, cycles without a process list or per-process "
    "utilization, energy across a gap in readings; with the pods' it adds up to the GPU's",
    collector="attribution",
)
UNATTRIBUTED_PROCESSES: Final = Family(
    "gpu_unattributed_processes",
    "Processes on the GPU that map to no pod.",
    doc="processes on the GPU that map to no pod (outside Kubernetes, or in a pod the API has "
    "not shown yet)",
    collector="attribution",
)
WATCH_UP: Final = Family(
    "gpuscope_kubernetes_watch_up",
    "1 while a cache follows the Kubernetes API (list + watch of resource), 0 while it cannot.",
    labels=("resource",),
    gpu=False,
    labels_doc="`resource`: `pods`, `resourceslices` while DRA is on, `localqueues` while the "
    "cluster serves Kueue's LocalQueues",
    doc="1 while the cache of that resource follows the Kubernetes API (list + watch), 0 while "
    "it cannot reach it",
    collector="attribution",
)
CACHE_AGE: Final = Family(
    "gpuscope_kubernetes_cache_age_seconds",
    "How long ago a cache was last known to be current (0 while its watch is up).",
    unit="seconds",
    labels=("resource",),
    gpu=False,
    labels_doc="`resource`, as above",
    doc="how long ago the cache of that resource was last known to be current: 0 while the watch "
    "is up, growing while the API is away; absent before the first list",
    collector="attribution",
)
PODS_CACHED: Final = Family(
    "gpuscope_pods_cached",
    "Pods on this node in the pod cache.",
    gpu=False,
    doc="pods of this node in the pod cache",
    collector="attribution",
)
DRA_DEVICES: Final = Family(
    "gpuscope_dra_devices",
    "Devices of the configured DRA drivers that this node's ResourceSlices publish (each pool's "
    "newest generation); absent while DRA is off.",
    gpu=False,
    doc="devices of the configured DRA drivers that this node's ResourceSlices publish (each "
    "pool's newest generation); absent while DRA is off",
    collector="attribution",
)
FAMILIES: Final = (
    POD_MEMORY,
    POD_UTILIZATION,
    POD_BUSY,
    POD_ENERGY,
    ALLOCATION_INFO,
    ALLOCATION_IN_USE,
    ALLOCATION_SHARED,
    ALLOCATION_SHARE,
    POD_INFO,
    QUEUE_INFO,
    CONTAINER_INFO,
    UNATTRIBUTED_MEMORY,
    UNATTRIBUTED_PROCESSES,
    UNATTRIBUTED_ENERGY,
    WATCH_UP,
    CACHE_AGE,
    PODS_CACHED,
    DRA_DEVICES,
)


def _row_pairs(row: tuple[GpuIdentity, PodIdentity, str]) -> list[tuple[str, str]]:
    gpu, pod, container = row
    return [
        *identity_pairs(gpu),
        ("namespace", pod.namespace),
        ("pod", pod.name),
        ("container", container),
        ("workload", pod.workload),
        ("workload_kind", pod.workload_kind),
    ]


_row_labels: Final[LabelCache[tuple[GpuIdentity, PodIdentity, str]]] = LabelCache(_row_pairs)
"""One pod row's labels (GPU, pod, container), made once and shared by the row's series in every
family and every cycle: pod rows are most of a node's series."""


def attribution_families(attribution: Attribution | None) -> Iterator[Metric]:
    if attribution is None:
        return
    memory, utilization, busy, energy = (
        new_metric(POD_MEMORY),
        new_metric(POD_UTILIZATION),
        new_metric(POD_BUSY),
        new_metric(POD_ENERGY),
    )
    for use in attribution.usage:
        labels = _row_labels((use.gpu, use.pod, use.container)).base
        if use.memory_used_bytes is not None:
            memory.samples.append(Sample(memory.name, labels, use.memory_used_bytes))
        if use.utilization is not None:
            utilization.samples.append(Sample(utilization.name, labels, use.utilization))
        if use.busy_seconds_total is not None:
            busy.samples.append(Sample(f"{busy.name}_total", labels, use.busy_seconds_total))
        if use.energy_joules_total is not None:
            energy.samples.append(Sample(f"{energy.name}_total", labels, use.energy_joules_total))
    yield from (memory, utilization, busy, energy)

    info = new_metric(ALLOCATION_INFO)
    in_use = new_metric(ALLOCATION_IN_USE)
    shared = new_metric(ALLOCATION_SHARED)
    share = new_metric(ALLOCATION_SHARE)
    for allocation in attribution.allocations:
        row = _row_labels((allocation.gpu, allocation.pod, allocation.container))
        labels = row.with_pairs(("resource", allocation.resource))
        # a DRA claim names itself on the info series only: the others keep one row's labels
        info_labels = (
            row.with_pairs(
                ("resource", allocation.resource),
                ("claim", allocation.claim),
                ("claim_namespace", allocation.claim_namespace),
            )
            if allocation.claim
            else labels
        )
        info.samples.append(Sample(info.name, info_labels, 1))
        if allocation.in_use is not None:
            in_use.samples.append(Sample(in_use.name, labels, 1 if allocation.in_use else 0))
        shared.samples.append(Sample(shared.name, labels, 1 if allocation.shared else 0))
        share.samples.append(Sample(share.name, labels, allocation.share))
    yield from (info, in_use, shared, share)

    pod_info = new_metric(POD_INFO)
    for pod in attribution.pods:
        pod_labels = {
            "namespace": pod.namespace,
            "pod": pod.name,
            "workload": pod.workload,
            "workload_kind": pod.workload_kind,
            "node": attribution.node,
            "revision": pod.revision,
            **dict(pod.labels),
        }
        pod_info.samples.append(Sample(POD_INFO.name, pod_labels, 1))
    yield pod_info
    yield _queue_info(attribution)
    yield _container_info(attribution)
    yield from _unattributed(attribution)

    kubernetes = attribution.kubernetes
    watch_up, age = new_metric(WATCH_UP), new_metric(CACHE_AGE)
    for watch in kubernetes.watches:
        resource = {"resource": watch.resource}
        add(watch_up, resource, 1 if watch.up else 0)
        if watch.cache_age_seconds is not None:
            add(age, resource, watch.cache_age_seconds)
    yield from (watch_up, age)
    cached = new_metric(PODS_CACHED)
    add(cached, {}, kubernetes.pods_cached)
    yield cached
    devices = new_metric(DRA_DEVICES)
    if kubernetes.dra_devices is not None:
        add(devices, {}, kubernetes.dra_devices)
    yield devices


def _queue_info(attribution: Attribution) -> Metric:
    """The queue of each pod in one (`exporter.attribution.localqueues`)."""
    info = new_metric(QUEUE_INFO)
    for pod in attribution.pods:
        if pod.queue:
            labels = {
                "namespace": pod.namespace,
                "pod": pod.name,
                "queue": pod.queue,
                "queue_kind": pod.queue_kind,
            }
            info.samples.append(Sample(info.name, labels, 1))
    return info


def _container_info(attribution: Attribution) -> Metric:
    """The image of each container that holds or uses a GPU, once per container."""
    info = new_metric(CONTAINER_INFO)
    rows = {(use.pod, use.container) for use in attribution.usage}
    rows.update((allocation.pod, allocation.container) for allocation in attribution.allocations)
    for pod, container in sorted(rows, key=lambda row: (row[0].namespace, row[0].name, row[1])):
        image = next((image for name, image in pod.images if name == container), None)
        if image is not None:
            labels = {
                "namespace": pod.namespace,
                "pod": pod.name,
                "container": container,
                "image": image,
            }
            info.samples.append(Sample(info.name, labels, 1))
    return info


def _unattributed(attribution: Attribution) -> Iterator[Metric]:
    """What runs on each GPU outside pods, and the GPU's energy no container was given."""
    stray_memory, stray = new_metric(UNATTRIBUTED_MEMORY), new_metric(UNATTRIBUTED_PROCESSES)
    for unattributed in attribution.unattributed:
        labels = gpu_labels(unattributed.gpu).base
        add(stray_memory, labels, unattributed.memory_used_bytes)
        add(stray, labels, unattributed.processes)
    energy = new_metric(UNATTRIBUTED_ENERGY)
    for unattributed_energy in attribution.unattributed_energy:
        add(energy, gpu_labels(unattributed_energy.gpu).base, unattributed_energy.joules_total)
    yield from (stray_memory, stray, energy)
