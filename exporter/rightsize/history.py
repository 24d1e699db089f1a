"""Usage history from Prometheus: one PromQL template per signal, aggregated inside Prometheus.

Every signal is one instant query at the end of the window; statistics over time come from
`*_over_time` functions over the raw samples or over subqueries (`[14d:5m]`), so Prometheus
returns one number per GPU a pod held instead of 4,000 points. Utilization comes from the
integrated counters: `rate(gpu_pod_busy_seconds_total[STEP])` evaluated every STEP is the exact
average of each slice, whatever the scrape interval (at most half of STEP), and `increase` over
the window is the exact busy time.

Aggregations (`sum by`, `max by`, joins) sit outside the `*_over_time` functions: inside a
subquery Prometheus would evaluate them at every one of its 4,000 steps, which costs ten times
more than the rest of the query. Joins that would need them per step (device activity onto the
pod holding the device) happen in `assemble`, in Python, by uuid. One device's series can be
split in time (the daemon restarted and the scrape's `instance` label changed), so counts and
increases add up across series (`sum by`) while percentiles and peaks take the largest (`max by`).

Results are keyed per device a pod held (namespace, workload_kind, workload, pod, uuid) and then
grouped per workload. A signal whose series do not exist (no GPM on Ampere, no cAdvisor, no
calibration) simply leaves its fields `None`; an optional signal whose query fails is reported
in `History.missing_signals` and costs only its own fields.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.prometheus import PrometheusQueryError
from exporter.rightsize.selection import promql_string

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from exporter.rightsize.prometheus import PrometheusClient, Sample
    from exporter.rightsize.selection import Selection

log = logging.getLogger("exporter.rightsize.history")

DEVICE_LABELS: Final = ("namespace", "workload_kind", "workload", "pod", "uuid")
CONTAINER_LABELS: Final = ("namespace", "pod", "container")
IDLE_QUANTILE: Final = 0.99
"""A GPU is idle when even this quantile of its utilization stays under the idle threshold."""
MEMORY_QUANTILE: Final = 0.99
SHARING_STEP: Final = 3600.0
"""Resolution at which the pods time-slicing a GPU are counted (a per-step count is costly)."""


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    template: str
    """PromQL with `{D}` (the device labels), `{m}` (namespace matchers), `{mc}` (the same after a
    comma), `{w}` (window), `{s}` (step), `{c}` (the sharing step), `{q}` (the strategy's
    quantile), `{f}` (the label-selector filter), `{pods}` (matchers for the pods found)."""
    required: bool = False
    """A failed required signal fails the report; a failed optional one only blanks its field."""
    per_pod: bool = False
    """Asked only once the pods holding GPUs are known (cAdvisor and kube-state-metrics have
    series for every container of the cluster: the query names the pods it wants)."""


_HELD_UUIDS: Final = (
    # Device series carry no namespace: keep the GPUs the selected pods held.
    " and on (uuid) group by (uuid) (last_over_time(gpu_allocation_info{{{m}}}[{w}]))"
)


SIGNALS: Final = (
    Signal(
        "held",
        "sum by ({D}, model, mig_profile, resource) "
        "(count_over_time(gpu_allocation_info{{{m}}}[{w}:{s}])){f}",
        required=True,
    ),
    Signal("present", "max by ({D}) (timestamp(gpu_allocation_info{{{m}}})){f}", required=True),
    Signal("shared", "max by ({D}) (max_over_time(gpu_allocation_shared{{{m}}}[{w}])){f}"),
    Signal(
        "sharers",
        # Every holder counts, whatever the selection: the cost of a shared GPU is split by all.
        "avg_over_time((count by (uuid) (gpu_allocation_shared == 1))[{w}:{c}])",
    ),
    Signal("in_use", "max by ({D}) (avg_over_time(gpu_allocation_in_use{{{m}}}[{w}])){f}"),
    Signal(
        "busy_steps",
        "sum by ({D}) (count_over_time(rate(gpu_pod_busy_seconds_total{{{m}}}[{s}])[{w}:{s}])){f}",
        required=True,
    ),
    Signal(
        "busy_seconds",
        "sum by ({D}) (increase(gpu_pod_busy_seconds_total{{{m}}}[{w}])){f}",
        required=True,
    ),
    Signal(
        "busy_quantile",
        "max by ({D}) "
        "(quantile_over_time({q}, rate(gpu_pod_busy_seconds_total{{{m}}}[{s}])[{w}:{s}])){f}",
        required=True,
    ),
    Signal(
        "busy_idle_quantile",
        f"max by ({{D}}) (quantile_over_time({IDLE_QUANTILE}, "
        "rate(gpu_pod_busy_seconds_total{{{m}}}[{s}])[{w}:{s}])){f}",
        required=True,
    ),
    Signal(
        "memory_peak",
        "max by ({D}) (max_over_time(gpu_pod_memory_used_bytes{{{m}}}[{w}])){f}",
        required=True,
    ),
    Signal(
        "memory_quantile",
        f"max by ({{D}}) (quantile_over_time({MEMORY_QUANTILE}, "
        "gpu_pod_memory_used_bytes{{{m}}}[{w}])){f}",
    ),
    Signal(
        "sm_quantile",
        "max by (uuid) (quantile_over_time({q}, rate(gpu_sm_active_seconds_total[{s}])[{w}:{s}]))"
        + _HELD_UUIDS,
    ),
    Signal(
        "sm_seconds", "sum by (uuid) (increase(gpu_sm_active_seconds_total[{w}]))" + _HELD_UUIDS
    ),
    Signal(
        "tensor_seconds",
        "sum by (uuid) (increase(gpu_tensor_active_seconds_total[{w}]))" + _HELD_UUIDS,
    ),
    Signal(
        "dram_seconds", "sum by (uuid) (increase(gpu_dram_active_seconds_total[{w}]))" + _HELD_UUIDS
    ),
    Signal(
        "cpu_usage_quantile",
        "max by (namespace, pod, container) (quantile_over_time({q}, "
        'rate(container_cpu_usage_seconds_total{{container!="", container!="POD", {pods}}}[{s}])'
        "[{w}:{s}]))",
        per_pod=True,
    ),
    Signal(
        "cpu_limit",
        "max by (namespace, pod, container) (max_over_time("
        'kube_pod_container_resource_limits{{resource="cpu", {pods}}}[{w}]))',
        per_pod=True,
    ),
    Signal(
        "calibrated_flops",
        "avg by (model, dtype) (last_over_time(gpu_calibrated_flops[{w}]))",
    ),
    Signal(
        "calibrated_bandwidth",
        "avg by (model) (last_over_time(gpu_calibrated_memory_bandwidth_bytes_per_second[{w}]))",
    ),
)


def render(
    signal: Signal,
    *,
    selection: Selection,
    window: float,
    step: float,
    quantile: float,
    pods: Iterable[tuple[str, str]] = (),
) -> str:
    """The PromQL of one signal for this selection, window, step and quantile; `pods` are the
    (namespace, pod) pairs the per-pod signals ask about."""
    w, s = format_duration(window), format_duration(step)
    m = selection.matchers()
    found = sorted(set(pods))
    namespaces = sorted({namespace for namespace, _ in found})
    names = sorted({pod for _, pod in found})
    return signal.template.format(
        D=", ".join(DEVICE_LABELS),
        m=m,
        mc=f", {m}" if m else "",
        w=w,
        s=s,
        c=format_duration(max(step, min(SHARING_STEP, window))),
        q=f"{quantile:g}",
        f=selection.pod_filter(w),
        pods=f'namespace=~"{_alternatives(namespaces)}", pod=~"{_alternatives(names)}"',
    )


def _alternatives(values: list[str]) -> str:
    return promql_string("|".join(re.escape(value) for value in values))


@dataclass(frozen=True, slots=True)
class DeviceHistory:
    """One GPU or MIG instance held by one pod, summarised over the window."""

    uuid: str
    model: str
    """As NVML names it (`NVIDIA H100 80GB HBM3`); a MIG instance carries its parent's model."""
    mig_profile: str | None
    resource: str
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


@dataclass(frozen=True, slots=True)
class WorkloadHistory:
    """A workload on one GPU configuration (model and MIG profile): the unit of a recommendation."""

    namespace: str
    kind: str
    name: str
    model: str
    mig_profile: str | None
    pods: tuple[PodHistory, ...]

    @property
    def devices(self) -> tuple[DeviceHistory, ...]:
        return tuple(device for pod in self.pods for device in pod.devices)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Measured ceilings from the calibration job, keyed by NVML model name."""

    flops: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(model, dtype) -> FLOP/s."""
    memory_bandwidth: Mapping[str, float] = field(default_factory=dict)
    """model -> bytes per second."""


@dataclass(frozen=True, slots=True)
class History:
    end: float
    window_seconds: float
    step_seconds: float
    quantile: float
    workloads: tuple[WorkloadHistory, ...]
    ceilings: Ceilings = field(default_factory=Ceilings)
    missing_signals: tuple[str, ...] = ()
    """Optional signals whose query failed; their fields are `None` everywhere."""


async def fetch(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
) -> History:
    """Run every signal's query (concurrency bounded by the client) and assemble the history."""
    # One cheap query first, so an unreachable or unauthorized server is one clear error, not
    # nineteen parallel ones.
    await client.query("vector(1)", at=end, name="connectivity check")

    async def ask(signal: Signal, pods: Iterable[tuple[str, str]] = ()) -> list[Sample] | None:
        promql = render(
            signal, selection=selection, window=window, step=step, quantile=quantile, pods=pods
        )
        try:
            return await client.query(promql, at=end, name=signal.name)
        except PrometheusQueryError as error:
            if signal.required:
                raise
            log.warning(
                "optional signal unavailable", extra={"signal": signal.name, "error": str(error)}
            )
            return None

    device_signals = [signal for signal in SIGNALS if not signal.per_pod]
    pod_signals = [signal for signal in SIGNALS if signal.per_pod]
    held_signal, *other_signals = device_signals
    device_answers = asyncio.gather(*(ask(signal) for signal in other_signals))
    held = await ask(held_signal)
    pods = {(s.labels.get("namespace", ""), s.labels.get("pod", "")) for s in held or ()}
    pod_answers = await asyncio.gather(*(ask(signal, pods) for signal in pod_signals if pods))
    answers = {held_signal.name: held}
    answers.update(zip([s.name for s in other_signals], await device_answers, strict=True))
    answers.update(zip([s.name for s in pod_signals if pods], pod_answers, strict=True))
    missing = tuple(name for name, samples in answers.items() if samples is None)
    return assemble(
        {name: samples or [] for name, samples in answers.items()},
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        missing_signals=missing,
    )


def assemble(
    answers: Mapping[str, Iterable[Sample]],
    *,
    end: float,
    window: float,
    step: float,
    quantile: float,
    missing_signals: tuple[str, ...] = (),
) -> History:
    """Pure: query answers (by signal name) -> History. Devices come from the `held` signal."""
    keyed: dict[str, dict[tuple[str, ...], float]] = {}
    for name, samples in answers.items():
        names = _KEYS.get(name, DEVICE_LABELS)
        keyed[name] = {_key(sample.labels, names): sample.value for sample in samples}

    def get(signal: str, key: tuple[str, ...]) -> float | None:
        return keyed.get(signal, {}).get(key)

    held = [(sample.labels, sample.value) for sample in answers.get("held", ())]
    # Device activity is device-wide: it belongs to a workload only if no other workload held
    # the device within the window.
    workloads_on: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for labels, _ in held:
        workloads_on[labels.get("uuid", "")].add(_key(labels, DEVICE_LABELS[:3]))

    pods: dict[tuple[str, ...], list[DeviceHistory]] = defaultdict(list)
    for labels, steps in held:
        key = _key(labels, DEVICE_LABELS)
        uuid = labels.get("uuid", "")
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
        own = not shared and len(workloads_on[uuid]) == 1
        activity = {
            name: get(name, (uuid,)) if own else None
            for name in ("sm_quantile", "sm_seconds", "tensor_seconds", "dram_seconds")
        }
        sharers = get("sharers", (uuid,))
        device = DeviceHistory(
            uuid=uuid,
            model=labels.get("model", ""),
            mig_profile=labels.get("mig_profile") or None,
            resource=labels.get("resource", ""),
            held_seconds=held_seconds,
            observed_seconds=observed,
            present=get("present", key) is not None,
            shared=shared,
            holders=max(2, round(sharers)) if shared and sharers else (2 if shared else 1),
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
        )
        pods[key[:4]].append(device)

    cpu: dict[tuple[str, str], list[ContainerCpu]] = defaultdict(list)
    containers = set(keyed.get("cpu_usage_quantile", {})) | set(keyed.get("cpu_limit", {}))
    for namespace, pod, container in sorted(containers):
        cpu[(namespace, pod)].append(
            ContainerCpu(
                container,
                get("cpu_usage_quantile", (namespace, pod, container)),
                get("cpu_limit", (namespace, pod, container)),
            )
        )

    units: dict[tuple[str, str, str, str, str], list[PodHistory]] = defaultdict(list)
    for (namespace, kind, workload, pod), devices in sorted(pods.items()):
        configurations: dict[tuple[str, str], list[DeviceHistory]] = defaultdict(list)
        for device in sorted(devices, key=lambda d: d.uuid):
            configurations[(device.model, device.mig_profile or "")].append(device)
        for (model, profile), held_devices in configurations.items():
            # A bare pod (no owning workload) is its own workload.
            unit = (namespace, kind or "Pod", workload or pod, model, profile)
            units[unit].append(
                PodHistory(pod, tuple(held_devices), tuple(cpu.get((namespace, pod), ())))
            )

    ceilings = Ceilings(
        flops={
            (s.labels.get("model", ""), s.labels.get("dtype", "")): s.value
            for s in answers.get("calibrated_flops", ())
        },
        memory_bandwidth={
            s.labels.get("model", ""): s.value for s in answers.get("calibrated_bandwidth", ())
        },
    )
    return History(
        end=end,
        window_seconds=window,
        step_seconds=step,
        quantile=quantile,
        workloads=tuple(
            WorkloadHistory(namespace, kind, name, model, profile or None, tuple(pod_list))
            for (namespace, kind, name, model, profile), pod_list in sorted(units.items())
        ),
        ceilings=ceilings,
        missing_signals=missing_signals,
    )


_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "cpu_usage_quantile": CONTAINER_LABELS,
    "cpu_limit": CONTAINER_LABELS,
    "sharers": ("uuid",),
    "sm_quantile": ("uuid",),
    "sm_seconds": ("uuid",),
    "tensor_seconds": ("uuid",),
    "dram_seconds": ("uuid",),
}


def _mean(seconds: float | None, held: float) -> float | None:
    """Busy (or active) seconds over the held time, as a ratio."""
    return None if seconds is None or held <= 0 else min(seconds / held, 1.0)


def _key(labels: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in names)
