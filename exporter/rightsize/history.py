"""Usage history from Prometheus: one PromQL template per signal, aggregated inside Prometheus.

Every signal is one instant query at the end of the window; statistics over time come from
`*_over_time` functions over subqueries (`[14d:5m]`), so Prometheus returns one number per GPU a
pod held instead of 4,000 points. Utilization comes from the integrated counters:
`rate(gpu_pod_busy_seconds_total[STEP])` evaluated every STEP is the exact average of each slice,
whatever the scrape interval (at most half of STEP) and however briefly the GPU was busy.

Results are keyed per device a pod held (namespace, workload_kind, workload, pod, uuid) and then
grouped per workload. A signal whose series do not exist (no GPM on Ampere, no cAdvisor, no
calibration) simply leaves its fields `None`; an optional signal whose query fails is reported
in `History.missing_signals` and costs only its own fields.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.prometheus import PrometheusError, PrometheusQueryError

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

_D: Final = ", ".join(DEVICE_LABELS)
_BUSY: Final = (
    "(sum by ({D}) (rate(gpu_pod_busy_seconds_total{{{m}}}[{s}]))"
    # A pod with no process on its GPU has no busy counter: it is 0% busy, not "no data".
    " or max by ({D}) (gpu_allocation_in_use{{{m}}} == 0))"
)


def _activity(metric: str) -> str:
    # Device-wide activity joined onto the pod holding the device; only exclusive devices use it.
    return (
        f"(max by (uuid) (rate({metric}{{{{}}}}[{{s}}])) * on (uuid) group_right "
        "max by ({D}) (gpu_allocation_info{{{m}}}))"
    )


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    template: str
    """PromQL with `{m}` (namespace matchers), `{mc}` (the same after a comma), `{w}` (window),
    `{s}` (step), `{q}` (the strategy's quantile), `{f}` (the label-selector filter)."""
    required: bool = False
    """A failed required signal fails the report; a failed optional one only blanks its field."""


SIGNALS: Final = (
    Signal(
        "held",
        "count_over_time((max by ({D}, model, mig_profile, resource) "
        "(gpu_allocation_info{{{m}}}))[{w}:{s}]){f}",
        required=True,
    ),
    Signal(
        "last_seen",
        "max_over_time(timestamp(max by ({D}) (gpu_allocation_info{{{m}}}))[{w}:{s}]){f}",
        required=True,
    ),
    Signal(
        "shared",
        "max_over_time((max by ({D}) (gpu_allocation_shared{{{m}}}))[{w}:{s}]){f}",
    ),
    Signal(
        "in_use",
        "avg_over_time((max by ({D}) (gpu_allocation_in_use{{{m}}}))[{w}:{s}]){f}",
    ),
    Signal("busy_steps", "count_over_time({busy}[{w}:{s}]){f}", required=True),
    Signal("busy_mean", "avg_over_time({busy}[{w}:{s}]){f}", required=True),
    Signal("busy_quantile", "quantile_over_time({q}, {busy}[{w}:{s}]){f}", required=True),
    Signal(
        "busy_idle_quantile",
        f"quantile_over_time({IDLE_QUANTILE}, {{busy}}[{{w}}:{{s}}]){{f}}",
        required=True,
    ),
    Signal(
        "memory_peak",
        "sum by ({D}) (max_over_time(gpu_pod_memory_used_bytes{{{m}}}[{w}])){f}",
        required=True,
    ),
    Signal(
        "memory_quantile",
        f"quantile_over_time({MEMORY_QUANTILE}, (sum by ({{D}}) "
        "(gpu_pod_memory_used_bytes{{{m}}}))[{w}:{s}]){f}",
    ),
    Signal("sm_quantile", "quantile_over_time({q}, {sm}[{w}:{s}]){f}"),
    Signal("sm_mean", "avg_over_time({sm}[{w}:{s}]){f}"),
    Signal("tensor_mean", "avg_over_time({tensor}[{w}:{s}]){f}"),
    Signal("dram_mean", "avg_over_time({dram}[{w}:{s}]){f}"),
    Signal(
        "cpu_usage_quantile",
        "quantile_over_time({q}, (sum by (namespace, pod, container) "
        '(rate(container_cpu_usage_seconds_total{{container!="", container!="POD"{mc}}}[{s}]))'
        " and on (namespace, pod) group by (namespace, pod) (gpu_allocation_info{{{m}}}))"
        "[{w}:{s}]){f}",
    ),
    Signal(
        "cpu_limit",
        "max by (namespace, pod, container) "
        '(max_over_time(kube_pod_container_resource_limits{{resource="cpu"{mc}}}[{w}]))'
        " and on (namespace, pod) group by (namespace, pod) "
        "(max_over_time(gpu_allocation_info{{{m}}}[{w}])){f}",
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
    signal: Signal, *, selection: Selection, window: float, step: float, quantile: float
) -> str:
    """The PromQL of one signal for this selection, window, step and quantile."""
    w, s = format_duration(window), format_duration(step)
    m = selection.matchers()
    parts = {
        "D": _D,
        "m": m,
        "mc": f", {m}" if m else "",
        "w": w,
        "s": s,
        "q": f"{quantile:g}",
        "f": selection.pod_filter(w),
    }
    nested = {
        "busy": _BUSY.format(**parts),
        "sm": _activity("gpu_sm_active_seconds_total").format(**parts),
        "tensor": _activity("gpu_tensor_active_seconds_total").format(**parts),
        "dram": _activity("gpu_dram_active_seconds_total").format(**parts),
    }
    return signal.template.format(**parts, **nested)


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
    last_seen: float
    observed_seconds: float
    """How long there was utilization data for it; `observed / held` is the coverage."""
    shared: bool = False
    """Time-sliced or MPS-shared with other containers at some point in the window."""
    holders: int = 1
    """Pods seen holding this device in the window."""
    in_use_ratio: float | None = None
    """Share of the held time during which a process of the pod ran on it."""
    busy_mean: float | None = None
    busy_quantile: float | None = None
    busy_idle_quantile: float | None = None
    memory_peak_bytes: float | None = None
    memory_quantile_bytes: float | None = None
    sm_quantile: float | None = None
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
    # seventeen parallel ones.
    await client.query("vector(1)", at=end, name="connectivity check")
    results = await asyncio.gather(
        *(
            _run(
                client,
                signal,
                end,
                render(signal, selection=selection, window=window, step=step, quantile=quantile),
            )
            for signal in SIGNALS
        )
    )
    answers = {signal.name: samples for signal, samples in zip(SIGNALS, results, strict=True)}
    missing = tuple(name for name, samples in answers.items() if samples is None)
    return assemble(
        {name: samples or [] for name, samples in answers.items()},
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        missing_signals=missing,
    )


async def _run(
    client: PrometheusClient, signal: Signal, end: float, promql: str
) -> list[Sample] | None:
    try:
        return await client.query(promql, at=end, name=signal.name)
    except PrometheusQueryError as error:
        if signal.required:
            raise
        log.warning(
            "optional signal unavailable", extra={"signal": signal.name, "error": str(error)}
        )
        return None
    except PrometheusError:
        raise


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
    by_device: dict[str, dict[tuple[str, ...], float]] = {}
    for name, samples in answers.items():
        keyed: dict[tuple[str, ...], float] = {}
        names = CONTAINER_LABELS if name.startswith("cpu_") else DEVICE_LABELS
        for sample in samples:
            keyed[_key(sample.labels, names)] = sample.value
        by_device[name] = keyed

    held = [(sample.labels, sample.value) for sample in answers.get("held", ())]
    holders: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for labels, _ in held:
        holders[labels.get("uuid", "")].add(_key(labels, DEVICE_LABELS[:4]))

    def get(signal: str, key: tuple[str, ...]) -> float | None:
        return by_device.get(signal, {}).get(key)

    pods: dict[tuple[str, ...], list[DeviceHistory]] = defaultdict(list)
    for labels, steps in held:
        key = _key(labels, DEVICE_LABELS)
        uuid = labels.get("uuid", "")
        shared = get("shared", key)
        device = DeviceHistory(
            uuid=uuid,
            model=labels.get("model", ""),
            mig_profile=labels.get("mig_profile") or None,
            resource=labels.get("resource", ""),
            # A subquery's range includes both ends: one step more than window/step.
            held_seconds=min(steps * step, window),
            last_seen=get("last_seen", key) or end,
            observed_seconds=min((get("busy_steps", key) or 0.0) * step, window),
            shared=bool(shared) or len(holders[uuid]) > 1,
            holders=len(holders[uuid]),
            in_use_ratio=get("in_use", key),
            busy_mean=get("busy_mean", key),
            busy_quantile=get("busy_quantile", key),
            busy_idle_quantile=get("busy_idle_quantile", key),
            memory_peak_bytes=get("memory_peak", key),
            memory_quantile_bytes=get("memory_quantile", key),
            sm_quantile=get("sm_quantile", key),
            sm_mean=get("sm_mean", key),
            tensor_mean=get("tensor_mean", key),
            dram_mean=get("dram_mean", key),
        )
        pods[key[:4]].append(device)

    cpu: dict[tuple[str, str], list[ContainerCpu]] = defaultdict(list)
    containers = set(by_device.get("cpu_usage_quantile", {})) | set(by_device.get("cpu_limit", {}))
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


def _key(labels: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in names)
