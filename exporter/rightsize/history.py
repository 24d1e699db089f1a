"""A workload's usage history, as the rightsizing strategies read it: the types (a device a pod
held, its pods, the workload on one GPU configuration, the window's `History`) and `assemble`,
which makes them from the signals' answers (`signals.py` writes the queries, `fetch.py` asks
them).

Results are keyed per device a pod held (namespace, workload_kind, workload, pod, uuid) and then
grouped per workload. A signal whose series do not exist (no GPM on Ampere, no cAdvisor, no
calibration) simply leaves its fields `None`; an optional signal whose query fails is reported
in `History.missing_signals` and costs only its own fields. Joins that Prometheus would have to
make at every step of a subquery (device activity onto the pod holding the device) happen here,
by uuid.

With a cluster label (`--cluster-label cluster`, for Thanos, Mimir or VictoriaMetrics holding
many clusters) every grouping and join carries it too, so two clusters' `ml/trainer` are two
workloads. Besides the window, the history holds the shorter terms (the last day and week, as
Kruize's short and medium terms), so a recommendation can say where demand is going.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from exporter.rightsize.prometheus import Sample

DEVICE_LABELS: Final = ("namespace", "workload_kind", "workload", "pod", "uuid")
CONTAINER_LABELS: Final = ("namespace", "pod", "container")
AUTOSCALER_LABELS: Final = ("namespace", "horizontalpodautoscaler")


class Term(NamedTuple):
    """A span of history ending where the window ends, recommended on separately."""

    name: str
    seconds: float


TERMS: Final = (Term("short_term", 86400.0), Term("medium_term", 7 * 86400.0))
"""The shorter terms beside the whole window (`long_term`), as Kruize names them: the last day
and the last week. A term as long as the window, or longer, is the window itself."""
LONG_TERM: Final = "long_term"


@dataclass(frozen=True, slots=True)
class Grouping:
    """The labels results are grouped and joined by: a workload's device, a GPU, a container;
    with a cluster label, each of them also per cluster."""

    cluster_label: str | None = None

    @property
    def extra(self) -> tuple[str, ...]:
        return (self.cluster_label,) if self.cluster_label else ()

    @property
    def device(self) -> tuple[str, ...]:
        return (*self.extra, *DEVICE_LABELS)

    @property
    def uuid(self) -> tuple[str, ...]:
        return (*self.extra, "uuid")

    @property
    def container(self) -> tuple[str, ...]:
        return (*self.extra, *CONTAINER_LABELS)

    @property
    def autoscaler(self) -> tuple[str, ...]:
        return (*self.extra, *AUTOSCALER_LABELS)

    def cluster(self, labels: Mapping[str, str]) -> str:
        return labels.get(self.cluster_label, "") if self.cluster_label else ""


@dataclass(frozen=True, slots=True)
class DeviceHistory:
    """One GPU or MIG instance held by one pod, summarised over the window."""

    uuid: str
    model: str
    """As NVML names it (`NVIDIA H100 80GB HBM3`); a MIG instance carries its parent's model."""
    mig_profile: str | None
    resource: str
    """The resource name the pod was allocated it under (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`,
    a renamed time-sliced resource, ...)."""
    held_seconds: float
    """How long the pod held it within the window (steps held x step)."""
    observed_seconds: float
    """How long there was utilization data for it; `observed / held` is the coverage."""
    present: bool = True
    """Still held at the end of the window."""
    shared: bool = False
    """Time-sliced or MPS-shared with other containers at some point in the window."""
    holders: int = 1
    """Pods sharing it at a time, on average while shared (1 when exclusive)."""
    share: float | None = None
    """The part of the GPU it held, on average while held (`gpu_allocation_share_ratio`: what it
    reserved where a scheduler hands out fractions); None where the series is absent."""
    in_use_ratio: float | None = None
    """Share of the held time during which a process of the pod ran on it."""
    busy_mean: float | None = None
    busy_quantile: float | None = None
    busy_idle_quantile: float | None = None
    memory_peak_bytes: float | None = None
    memory_quantile_bytes: float | None = None
    sm_quantile: float | None = None
    """SM activity at the quantile, when the device was the workload's alone (GPM)."""
    sm_mean: float | None = None
    tensor_mean: float | None = None
    dram_mean: float | None = None
    container: str = ""
    """The container it was allocated to (the one a patch changes)."""

    @property
    def part(self) -> float:
        """The part of the device its cost is: what it held where known, else 1/holders."""
        return self.share if self.share is not None else 1.0 / self.holders


@dataclass(frozen=True, slots=True)
class ContainerCpu:
    container: str
    usage_cores: float | None
    """The strategy's quantile of CPU cores used."""
    limit_cores: float | None


@dataclass(frozen=True, slots=True)
class PodHistory:
    name: str
    devices: tuple[DeviceHistory, ...]
    cpu: tuple[ContainerCpu, ...] = ()

    @property
    def present(self) -> bool:
        """Still holding a GPU at the end of the window."""
        return any(device.present for device in self.devices)


@dataclass(frozen=True, slots=True)
class WorkloadHistory:
    """A workload on one GPU configuration (model and MIG profile): the unit of a recommendation."""

    namespace: str
    kind: str
    name: str
    model: str
    mig_profile: str | None
    pods: tuple[PodHistory, ...]
    cluster: str = ""
    """The cluster label's value (empty without `--cluster-label`)."""
    served_tokens: float | None = None
    """Tokens (prompt + output) its inference servers served over the window, from
    `workload_model:serving_tokens:rate5m`; None when it serves none or holds GPUs of more than
    one configuration (the tokens cannot be told apart between them)."""
    queue: str = ""
    """The queue its pods were admitted through (`gpu_pod_queue_info`): a Kueue ClusterQueue or a
    KAI Scheduler queue; "" for none. Pods in several queues over the window: the first by name."""
    queue_kind: str = ""
    """`kueue` or `kai`; "" for none."""

    @property
    def devices(self) -> tuple[DeviceHistory, ...]:
        return tuple(device for pod in self.pods for device in pod.devices)

    @property
    def key(self) -> str:
        key = f"{self.namespace}/{self.kind}/{self.name}"
        return f"{self.cluster}/{key}" if self.cluster else key

    @property
    def owner(self) -> tuple[str, str, str, str]:
        """(cluster, namespace, kind, name): the object a patch changes."""
        return (self.cluster, self.namespace, self.kind, self.name)

    @property
    def configuration(self) -> tuple[str, str, str, str, str, str]:
        """The workload on its GPU configuration: how the terms' histories are matched."""
        return (*self.owner, self.model, self.mig_profile or "")


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Measured ceilings from the calibration job, keyed by NVML model name."""

    flops: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(model, dtype) -> FLOP/s."""
    memory_bandwidth: Mapping[str, float] = field(default_factory=dict)
    """model -> bytes per second."""


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """A GPU resource name the cluster's pods held in the window, and what it offers."""

    cluster: str
    resource: str
    mig_profile: str | None
    """The MIG profile of the devices held under it (None for whole GPUs): a MIG device under
    `nvidia.com/gpu` is the device plugin's single strategy."""


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """A HorizontalPodAutoscaler scaling a workload (kube-state-metrics)."""

    name: str
    min_replicas: int | None
    max_replicas: int | None
    metrics: tuple[str, ...] = ()
    """The metrics it scales on (`cpu`, `nvidia_gpu_utilization`, ...)."""


@dataclass(frozen=True, slots=True)
class TermHistory:
    """The workloads over a shorter term, by `WorkloadHistory.configuration`."""

    name: str
    window_seconds: float
    workloads: Mapping[tuple[str, ...], WorkloadHistory]


@dataclass(frozen=True, slots=True)
class History:
    end: float
    window_seconds: float
    step_seconds: float
    quantile: float
    workloads: tuple[WorkloadHistory, ...]
    ceilings: Ceilings = field(default_factory=Ceilings)
    missing_signals: tuple[str, ...] = ()
    """Optional signals whose query failed (their fields are `None` everywhere), and terms that
    could not be read (`short_term`)."""
    terms: tuple[TermHistory, ...] = ()
    resources: tuple[ResourceUse, ...] = ()
    autoscalers: Mapping[tuple[str, str, str, str], Autoscaler] = field(default_factory=dict)
    """By the (cluster, namespace, kind, name) of the workload they scale."""
    cluster_label: str | None = None
    source: str = "gpuscope"
    """Whose series it was read from: `gpuscope` or `dcgm-exporter` (`--source`)."""
    limits: tuple[str, ...] = ()
    """What the source cannot tell, in words (dcgm-exporter has no calibration, ...): each
    recommendation made from it is at most of medium confidence."""
    node_prices: Mapping[str, float] = field(default_factory=dict)
    """OpenCost's price per GPU-hour of the GPUs on the nodes it prices, by uuid
    (`opencost.py`): what those GPUs cost, instead of the catalog's price."""


def assemble(
    answers: Mapping[str, Iterable[Sample]],
    *,
    end: float,
    window: float,
    step: float,
    quantile: float,
    missing_signals: tuple[str, ...] = (),
    cluster_label: str | None = None,
) -> History:
    """Pure: query answers (by signal name) -> History. Devices come from the `held` signal."""
    grouping = Grouping(cluster_label)
    keys = {
        "cpu_usage_quantile": grouping.container,
        "cpu_limit": grouping.container,
        "sharers": grouping.uuid,
        "sm_quantile": grouping.uuid,
        "sm_seconds": grouping.uuid,
        "tensor_seconds": grouping.uuid,
        "dram_seconds": grouping.uuid,
        "autoscaler_min": grouping.autoscaler,
        "autoscaler_max": grouping.autoscaler,
        "served_tokens": grouping.device[:-2],
    }
    keyed: dict[str, dict[tuple[str, ...], float]] = {}
    for name, samples in answers.items():
        names = keys.get(name, grouping.device)
        keyed[name] = {_key(sample.labels, names): sample.value for sample in samples}

    def get(signal: str, key: tuple[str, ...]) -> float | None:
        return keyed.get(signal, {}).get(key)

    held = [(sample.labels, sample.value) for sample in answers.get("held", ())]
    # Device activity is device-wide: it belongs to a workload only if no other workload held
    # the device within the window.
    workloads_on: dict[tuple[str, ...], set[tuple[str, ...]]] = defaultdict(set)
    for labels, _ in held:
        workloads_on[_key(labels, grouping.uuid)].add(_key(labels, grouping.device[:-2]))

    pods: dict[tuple[str, ...], list[DeviceHistory]] = defaultdict(list)
    for labels, steps in held:
        key = _key(labels, grouping.device)
        gpu = _key(labels, grouping.uuid)
        # A subquery's range includes both ends: one step more than window/step.
        held_seconds = min(steps * step, window)
        shared = bool(get("shared", key))
        in_use = get("in_use", key)
        busy = {
            "busy_quantile": get("busy_quantile", key),
            "busy_idle_quantile": get("busy_idle_quantile", key),
        }
        observed = min((get("busy_steps", key) or 0.0) * step, held_seconds)
        busy_seconds = get("busy_seconds", key)
        if busy["busy_quantile"] is None and in_use == 0:
            # No process ever ran on it, so no busy counter exists: 0% busy, fully observed.
            busy = dict.fromkeys(busy, 0.0)
            observed, busy_seconds = held_seconds, 0.0
        own = not shared and len(workloads_on[gpu]) == 1
        activity = {
            name: get(name, gpu) if own else None
            for name in ("sm_quantile", "sm_seconds", "tensor_seconds", "dram_seconds")
        }
        sharers = get("sharers", gpu)
        device = DeviceHistory(
            uuid=labels.get("uuid", ""),
            model=labels.get("model", ""),
            mig_profile=labels.get("mig_profile") or None,
            resource=labels.get("resource", ""),
            held_seconds=held_seconds,
            observed_seconds=observed,
            present=get("present", key) is not None,
            shared=shared,
            holders=max(2, round(sharers)) if shared and sharers else (2 if shared else 1),
            share=get("share", key),
            in_use_ratio=in_use,
            busy_mean=_mean(busy_seconds, held_seconds),
            busy_quantile=busy["busy_quantile"],
            busy_idle_quantile=busy["busy_idle_quantile"],
            memory_peak_bytes=get("memory_peak", key),
            memory_quantile_bytes=get("memory_quantile", key),
            sm_quantile=activity["sm_quantile"],
            sm_mean=_mean(activity["sm_seconds"], held_seconds),
            tensor_mean=_mean(activity["tensor_seconds"], held_seconds),
            dram_mean=_mean(activity["dram_seconds"], held_seconds),
            container=labels.get("container", ""),
        )
        pods[key[:-1]].append(device)

    cpu: dict[tuple[str, ...], list[ContainerCpu]] = defaultdict(list)
    containers = set(keyed.get("cpu_usage_quantile", {})) | set(keyed.get("cpu_limit", {}))
    for container_key in sorted(containers):
        cpu[container_key[:-1]].append(
            ContainerCpu(
                container_key[-1],
                get("cpu_usage_quantile", container_key),
                get("cpu_limit", container_key),
            )
        )

    extra = len(grouping.extra)
    queues = _queues(answers, grouping)
    unit_queues: dict[tuple[str, ...], tuple[str, str]] = {}
    units: dict[tuple[str, ...], list[PodHistory]] = defaultdict(list)
    for pod_key, devices in sorted(pods.items()):
        cluster = pod_key[0] if extra else ""
        namespace, kind, workload, pod = pod_key[extra:]
        configurations: dict[tuple[str, str], list[DeviceHistory]] = defaultdict(list)
        for device in sorted(devices, key=lambda d: d.uuid):
            configurations[(device.model, device.mig_profile or "")].append(device)
        for (model, profile), held_devices in configurations.items():
            # A bare pod (no owning workload) is its own workload.
            unit = (cluster, namespace, kind or "Pod", workload or pod, model, profile)
            units[unit].append(
                PodHistory(
                    pod, tuple(held_devices), tuple(cpu.get((*pod_key[:extra], namespace, pod), ()))
                )
            )
            queue = queues.get(pod_key[:-1])
            if queue is not None:
                unit_queues[unit] = min(queue, unit_queues.get(unit, queue))

    ceilings = Ceilings(
        flops={
            (s.labels.get("model", ""), s.labels.get("dtype", "")): s.value
            for s in answers.get("calibrated_flops", ())
        },
        memory_bandwidth={
            s.labels.get("model", ""): s.value for s in answers.get("calibrated_bandwidth", ())
        },
    )
    resources = sorted(
        {
            ResourceUse(
                grouping.cluster(s.labels),
                s.labels.get("resource", ""),
                s.labels.get("mig_profile") or None,
            )
            for s in answers.get("resources", ())
            if s.labels.get("resource")
        },
        key=lambda use: (use.cluster, use.resource, use.mig_profile or ""),
    )
    return History(
        end=end,
        window_seconds=window,
        step_seconds=step,
        quantile=quantile,
        workloads=tuple(
            WorkloadHistory(
                namespace=unit[1],
                kind=unit[2],
                name=unit[3],
                model=unit[4],
                mig_profile=unit[5] or None,
                pods=tuple(pod_list),
                cluster=unit[0],
                served_tokens=_served_tokens(keyed, unit, units, extra=extra, step=step),
                queue=unit_queues.get(unit, ("", ""))[0],
                queue_kind=unit_queues.get(unit, ("", ""))[1],
            )
            for unit, pod_list in sorted(units.items())
        ),
        ceilings=ceilings,
        missing_signals=missing_signals,
        resources=tuple(resources),
        autoscalers=_autoscalers(answers, keyed, grouping),
        cluster_label=cluster_label,
    )


def _served_tokens(
    keyed: Mapping[str, Mapping[tuple[str, ...], float]],
    unit: tuple[str, ...],
    units: Mapping[tuple[str, ...], object],
    *,
    extra: int,
    step: float,
) -> float | None:
    """The tokens the workload of `unit` served over the window, when it has no other GPU
    configuration (its rate summed over the window's steps, times the step)."""
    owner = unit[:4]
    if sum(1 for other in units if other[:4] == owner) != 1:
        return None
    key = unit[:4] if extra else unit[1:4]
    steps = keyed.get("served_tokens", {}).get(key)
    return None if steps is None or steps <= 0 else steps * step


def _autoscalers(
    answers: Mapping[str, Iterable[Sample]],
    keyed: Mapping[str, Mapping[tuple[str, ...], float]],
    grouping: Grouping,
) -> dict[tuple[str, str, str, str], Autoscaler]:
    """kube-state-metrics' HorizontalPodAutoscalers, by the workload they scale."""
    metrics: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for sample in answers.get("autoscaler_metrics", ()):
        name = sample.labels.get("metric_name")
        if name:
            metrics[_key(sample.labels, grouping.autoscaler)].add(name)
    found: dict[tuple[str, str, str, str], Autoscaler] = {}
    for sample in answers.get("autoscalers", ()):
        labels = sample.labels
        kind, target = labels.get("scaletargetref_kind", ""), labels.get("scaletargetref_name", "")
        if not kind or not target:
            continue
        key = _key(labels, grouping.autoscaler)
        low, high = (
            keyed.get("autoscaler_min", {}).get(key),
            keyed.get("autoscaler_max", {}).get(key),
        )
        found[(grouping.cluster(labels), labels.get("namespace", ""), kind, target)] = Autoscaler(
            labels.get("horizontalpodautoscaler", ""),
            None if low is None else round(low),
            None if high is None else round(high),
            tuple(sorted(metrics[key])),
        )
    return found


def _mean(seconds: float | None, held: float) -> float | None:
    """Busy (or active) seconds over the held time, as a ratio."""
    return None if seconds is None or held <= 0 else min(seconds / held, 1.0)


def _queues(
    answers: Mapping[str, Iterable[Sample]], grouping: Grouping
) -> dict[tuple[str, ...], tuple[str, str]]:
    """(queue, queue kind) by workload (cluster, namespace, kind, name); of several, the first."""
    found: dict[tuple[str, ...], tuple[str, str]] = {}
    for sample in answers.get("queue", ()):
        queue = (sample.labels.get("queue", ""), sample.labels.get("queue_kind", ""))
        if queue[0]:
            key = _key(sample.labels, grouping.device[:-2])
            found[key] = min(queue, found.get(key, queue))
    return found


def _key(labels: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in names)
