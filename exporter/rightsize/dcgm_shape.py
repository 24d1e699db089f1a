"""dcgm-exporter's and kube-state-metrics' answers in the shape of gpuscope's signals
(`translate`), so that `history.assemble` makes the history from them as from gpuscope's own: each
device under the pod holding it (its `exported_*` labels where the scrape renamed dcgm-exporter's
own), its workload from kube-state-metrics' owners, and what such a history cannot tell, in words
(`limits`). Pure.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.rightsize.history import Grouping
from exporter.rightsize.prometheus import Sample

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from exporter.rightsize.selection import Selection

HOLDER_LABELS: Final = ("namespace", "pod", "container")
EXPORTED: Final = tuple(f"exported_{name}" for name in HOLDER_LABELS)
DEVICE_GROUP: Final = ("UUID", "GPU_I_ID", "GPU_I_PROFILE", "modelName", *HOLDER_LABELS, *EXPORTED)
"""What dcgm-exporter's answers are grouped by: a GPU (or MIG instance) and who held it."""

CALIBRATION_LIMIT: Final = (
    "calibration: dcgm-exporter measures no achievable FLOP/s or memory bandwidth (gpuscope "
    "calibrate does), so moves between GPU models are sized on datasheet figures"
)
IN_USE_LIMIT: Final = (
    "whether a process ran: dcgm-exporter does not say when a pod ran nothing on its GPU, so "
    "idle is judged by utilization alone"
)


@dataclass(frozen=True, slots=True)
class Cluster:
    """What kube-state-metrics (and cAdvisor) said about the pods dcgm-exporter named."""

    requests: Mapping[tuple[str, ...], set[tuple[str, str]]]
    """(cluster, namespace, pod) -> its (container, resource) GPU requests."""
    owners: Mapping[tuple[str, ...], tuple[str, str]]
    """(cluster, namespace, pod) -> (kind, name) of the workload it belongs to."""
    cpu: Mapping[str, list[Sample]]
    """gpuscope's CPU signals' answers (cAdvisor, kube-state-metrics' CPU limits), by name."""
    known: frozenset[str]
    """Which of kube-state-metrics' series answered at all (`requests`, `owners`)."""


def holder(labels: Mapping[str, str]) -> tuple[str, str, str]:
    """(namespace, pod, container) of the pod holding a device: the `exported_*` labels where
    the scrape renamed dcgm-exporter's own."""
    if labels.get("exported_pod"):
        return (
            labels.get("exported_namespace", ""),
            labels["exported_pod"],
            labels.get("exported_container", ""),
        )
    return (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))


def device_id(labels: Mapping[str, str]) -> str:
    """A GPU's UUID, or a MIG instance's: its parent's UUID and its GPU instance id."""
    uuid = labels.get("UUID") or labels.get("uuid", "")
    instance = labels.get("GPU_I_ID", "")
    return f"{uuid}/{instance}" if instance else uuid


def cluster_of(labels: Mapping[str, str], grouping: Grouping) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in grouping.extra)


def pod_of(labels: Mapping[str, str]) -> tuple[str, str]:
    return (labels.get("namespace", ""), labels.get("pod", ""))


SHARED_SLACK: Final = 1.05
"""A GPU counts as shared when its holders held it for more than this many windows in all: pods
that replaced one another (a rollout) hold it one after the other, never longer than the window."""
SUMMED: Final = frozenset({"held", "busy_steps"})
"""Signals that add up over a device's series (counts); the others take the largest."""
ACTIVITY: Final = (
    ("sm_mean", "sm_seconds"),
    ("tensor_mean", "tensor_seconds"),
    ("dram_mean", "dram_seconds"),
)
"""Device activity as dcgm-exporter gives it (a mean while held) and as gpuscope's history reads
it (seconds active)."""


def translate(
    answers: Mapping[str, Iterable[Sample]],
    cluster: Cluster,
    *,
    selection: Selection,
    window: float,
    step: float,
    cluster_label: str | None,
) -> tuple[dict[str, list[Sample]], list[str]]:
    """dcgm-exporter's and kube-state-metrics' answers in the shape of gpuscope's signals (by
    the device labels `history.assemble` groups by), and what the history cannot tell."""
    grouping = Grouping(cluster_label)
    group = (*grouping.extra, *DEVICE_GROUP)
    checked_requests = "requests" in cluster.known
    devices: dict[tuple[str, ...], dict[str, str]] = {}
    for sample in answers.get("held", ()):
        labels = sample.labels
        namespace, pod, container = holder(labels)
        where = cluster_of(labels, grouping)
        requests = cluster.requests.get((*where, namespace, pod), set())
        if not pod or (checked_requests and not requests):
            continue  # nobody's GPU, or the exporter's own pod in the exported_* form
        if selection.namespaces and namespace not in selection.namespaces:
            continue
        kind, name = cluster.owners.get((*where, namespace, pod), ("", ""))
        profile = labels.get("GPU_I_PROFILE", "")
        devices[tuple(labels.get(label, "") for label in group)] = {
            **dict(zip(grouping.extra, where, strict=True)),
            "namespace": namespace,
            "workload_kind": kind,
            "workload": name,
            "pod": pod,
            "uuid": device_id(labels),
            "container": container or _gpu_container(requests),
            "model": labels.get("modelName", ""),
            "mig_profile": profile,
            "resource": _resource(profile, requests),
        }
    translated: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for name, samples in answers.items():
        target = "busy_seconds" if name == "busy_mean" else name
        translated.setdefault(target, {})
        for sample in samples:
            device = devices.get(tuple(sample.labels.get(label, "") for label in group))
            if device is None:
                continue
            key = tuple(device.items())
            found = translated[target]
            if name in SUMMED:
                found[key] = found.get(key, 0.0) + sample.value
            else:
                found[key] = max(found.get(key, sample.value), sample.value)
    steps = translated.get("busy_steps", {})
    translated["busy_seconds"] = {
        key: mean * steps.get(key, 0.0) * step
        for key, mean in translated.get("busy_seconds", {}).items()
    }
    result = {
        name: [Sample(dict(key), value) for key, value in values.items()]
        for name, values in translated.items()
        if name != "sm_quantile" and name not in dict(ACTIVITY)
    }
    held = translated.get("held", {})
    result.update(_per_gpu(translated, held, step=step, grouping=grouping))
    shared = _shared(held, window=window, step=step, grouping=grouping)
    result["shared"] = [
        Sample(dict(key), 1.0) for key in held if (*_gpu_key(key, grouping),) in shared
    ]
    result["sharers"] = [
        Sample({**dict(zip(grouping.uuid, gpu, strict=True))}, float(count))
        for gpu, count in shared.items()
    ]
    result["resources"] = [
        Sample({**dict(key)}, 1.0)
        for key in {
            tuple((k, v) for k, v in key if k in {*grouping.extra, "resource", "mig_profile"})
            for key in held
        }
    ]
    result.update(cluster.cpu)
    return result, _limits(translated, cluster, shared)


def _per_gpu(
    translated: Mapping[str, Mapping[tuple[tuple[str, str], ...], float]],
    held: Mapping[tuple[tuple[str, str], ...], float],
    *,
    step: float,
    grouping: Grouping,
) -> dict[str, list[Sample]]:
    """Device activity keyed by GPU, as `assemble` joins it: the quantile, and seconds active
    (each holder's mean over the time it held the GPU)."""
    result: dict[str, list[Sample]] = {}
    quantiles: dict[tuple[str, ...], float] = {}
    for key, value in translated.get("sm_quantile", {}).items():
        gpu = _gpu_key(key, grouping)
        quantiles[gpu] = max(quantiles.get(gpu, value), value)
    result["sm_quantile"] = [
        Sample(dict(zip(grouping.uuid, gpu, strict=True)), value)
        for gpu, value in quantiles.items()
    ]
    for mean_name, seconds_name in ACTIVITY:
        seconds: dict[tuple[str, ...], float] = defaultdict(float)
        for key, mean in translated.get(mean_name, {}).items():
            seconds[_gpu_key(key, grouping)] += mean * held.get(key, 0.0) * step
        result[seconds_name] = [
            Sample(dict(zip(grouping.uuid, gpu, strict=True)), value)
            for gpu, value in seconds.items()
        ]
    return result


def _shared(
    held: Mapping[tuple[tuple[str, str], ...], float],
    *,
    window: float,
    step: float,
    grouping: Grouping,
) -> dict[tuple[str, ...], int]:
    """GPUs held by pods at once (their holders' held time adds up past the window), and by how
    many pods."""
    pods: dict[tuple[str, ...], set[str]] = defaultdict(set)
    seconds: dict[tuple[str, ...], float] = defaultdict(float)
    for key, steps in held.items():
        gpu = _gpu_key(key, grouping)
        pods[gpu].add(dict(key)["pod"])
        seconds[gpu] += min(steps * step, window)
    return {
        gpu: len(holders)
        for gpu, holders in pods.items()
        if len(holders) > 1 and seconds[gpu] > SHARED_SLACK * window
    }


def _limits(
    translated: Mapping[str, Mapping[tuple[tuple[str, str], ...], float]],
    cluster: Cluster,
    shared: Mapping[tuple[str, ...], int],
) -> list[str]:
    """What a history from dcgm-exporter cannot tell, in words."""
    limits = [CALIBRATION_LIMIT, IN_USE_LIMIT]
    if not translated.get("sm_quantile"):
        limits.append(
            "SM activity: DCGM_FI_PROF_SM_ACTIVE is not collected (dcgm-exporter's default "
            "counters leave it out), so demand is judged by utilization, which counts a GPU busy "
            "while any kernel runs, however few of its SMs it keeps busy"
        )
    if shared:
        names = ", ".join(sorted(gpu[-1] for gpu in shared)[:5])
        more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
        limits.append(
            f"per-process data: {names}{more} were held by several pods at once; dcgm-exporter "
            "before 4.8.2 (or without KUBERNETES_VIRTUAL_GPUS) shows each of them the whole GPU's "
            "utilization and memory, so what each pod used is not known"
        )
    if not any(cluster.cpu.values()):
        limits.append(
            "CPU use against its limit (cAdvisor's container_cpu_usage_seconds_total, "
            "kube-state-metrics' CPU limits): a pipeline starved of CPU cannot be told from an "
            "underused GPU"
        )
    if "requests" not in cluster.known:
        limits.append(
            "GPU requests (kube-state-metrics' kube_pod_container_resource_requests): every pod "
            "on a dcgm-exporter series counts as holding its GPU"
        )
    if "owners" not in cluster.known:
        limits.append(
            "workload owners (kube-state-metrics' kube_pod_owner): each pod is reported as a "
            "workload of its own"
        )
    return limits


def _gpu_key(key: tuple[tuple[str, str], ...], grouping: Grouping) -> tuple[str, ...]:
    labels = dict(key)
    return tuple(labels.get(name, "") for name in grouping.uuid)


def _gpu_container(requests: set[tuple[str, str]]) -> str:
    """The container that asked for GPUs, when dcgm-exporter's series do not name one."""
    return min((container for container, _ in requests), default="")


def _resource(profile: str, requests: set[tuple[str, str]]) -> str:
    """The resource name a device was allocated under: the MIG profile's own under the device
    plugin's mixed strategy (kube-state-metrics spells `nvidia.com/mig-1g.10gb`
    `nvidia_com_mig_1g_10gb`), else `nvidia.com/gpu`."""
    if profile:
        mixed = "nvidia_com_mig_" + re.sub(r"[^a-zA-Z0-9_]", "_", profile)
        if any(resource == mixed for _, resource in requests):
            return f"nvidia.com/mig-{profile}"
    return "nvidia.com/gpu"
