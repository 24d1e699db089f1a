"""Strategies: pure functions `run(workload, hardware, settings) -> Recommendation`, by name.

A strategy never does I/O: it gets one workload's history, the hardware view (catalog, prices,
calibrated ceilings) and its settings, and answers with a Recommendation — or with
`undefined("not enough data: ...")` when the history cannot support an answer.
How `simple` decides is explained step by step in the README ("How it works").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.hardware import Hardware, Option

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.catalog import GpuModel
    from exporter.rightsize.history import ContainerCpu, DeviceHistory, WorkloadHistory
    from exporter.rightsize.settings import StrategySettings

IDLE: Final = "idle"
INPUT_BOUND: Final = "input-bound"
UNDERUSED: Final = "underused"
MEMORY_BOUND: Final = "memory-bound"
COMPUTE_BOUND: Final = "compute-bound"
RIGHT_SIZED: Final = "right-sized"
UNDEFINED: Final = "undefined"
CLASSIFICATIONS: Final = (
    IDLE,
    INPUT_BOUND,
    UNDERUSED,
    MEMORY_BOUND,
    COMPUTE_BOUND,
    RIGHT_SIZED,
    UNDEFINED,
)

MAX_CPU_FACTOR: Final = 4.0
"""An input-bound pod's CPU limit is raised at most this many times in one recommendation."""
MIN_CPU_FACTOR: Final = 1.5
GIB: Final = 1024**3


@dataclass(frozen=True, slots=True)
class CpuChange:
    pod: str
    container: str
    usage_cores: float
    limit_cores: float
    recommended_cores: float


@dataclass(frozen=True, slots=True)
class Demand:
    """What the workload needs from one of its GPUs, before headroom."""

    compute: float
    """At the percentile, as a fraction of one whole GPU of its current model."""
    compute_signal: str
    """`SM activity` (GPM, exclusive GPUs) or `utilization` (NVML busy time)."""
    memory_bytes: float
    """Peak memory used on one device."""
    roofline_side: str | None
    """`compute` or `memory` when SM/tensor and DRAM activity are known, else None."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    classification: str
    reason: str
    current: Option | None = None
    target: Option | None = None
    """The GPU option to run on; None means release the GPU (idle) or no answer (undefined)."""
    demand: Demand | None = None
    cpu_changes: tuple[CpuChange, ...] = ()

    @property
    def action(self) -> str:
        if self.classification == UNDEFINED:
            return "none"
        if self.classification == IDLE:
            return "release"
        if self.classification == INPUT_BOUND:
            return "add CPU"
        if self.classification == UNDERUSED:
            return "move"
        return "keep"


def undefined(reason: str, current: Option | None = None) -> Recommendation:
    """The explicit "no answer"."""
    return Recommendation(UNDEFINED, reason, current=current, target=current)


StrategyFunction = Callable[["WorkloadHistory", Hardware, "StrategySettings"], Recommendation]


@dataclass(frozen=True, slots=True)
class Strategy:
    name: str
    description: str
    run: StrategyFunction


STRATEGIES: dict[str, Strategy] = {}


def register(name: str, description: str) -> Callable[[StrategyFunction], StrategyFunction]:
    def add(function: StrategyFunction) -> StrategyFunction:
        STRATEGIES[name] = Strategy(name, description, function)
        return function

    return add


def current_option(workload: WorkloadHistory, hardware: Hardware) -> Option | None:
    model = hardware.model(workload.model)
    if model is None:
        return None
    profile = None
    if workload.mig_profile is not None:
        profile = model.mig_profile(workload.mig_profile)
        if profile is None:
            return None
    holders = max((d.holders for d in workload.devices if d.shared), default=1)
    return Option(model, profile, shared_by=holders)


def gpus_per_pod(workload: WorkloadHistory) -> int:
    return max((len(pod.devices) for pod in workload.pods), default=0)


@register(
    "simple",
    "Idle -> release; starved while CPU is at its limit -> add CPU; otherwise the cheapest whole "
    "GPU or MIG profile whose compute and memory cover the percentile plus headroom.",
)
def simple(
    workload: WorkloadHistory, hardware: Hardware, settings: StrategySettings
) -> Recommendation:
    current = current_option(workload, hardware)
    if current is None:
        what = f"GPU model {workload.model!r}"
        if workload.mig_profile and hardware.model(workload.model) is not None:
            what = f"MIG profile {workload.mig_profile!r} of {workload.model!r}"
        return undefined(f"{what} is not in the catalog")
    problem = _not_enough_data(workload, settings)
    if problem is not None:
        return undefined(f"not enough data: {problem}", current)
    return (
        _idle(workload, settings, current)
        or _input_bound(workload, settings, current)
        or _size(workload, hardware, settings, current)
    )


def _not_enough_data(workload: WorkloadHistory, settings: StrategySettings) -> str | None:
    devices = workload.devices
    held = sum(d.held_seconds for d in devices)
    # A workload's history is its GPU time per replica's set of GPUs: 3 replicas for 2 hours
    # each are 6 hours of evidence.
    history = held / max(gpus_per_pod(workload), 1)
    if history < settings.min_history:
        return (
            f"{format_duration(_round_minutes(history))} of history, "
            f"needs {format_duration(settings.min_history)}"
        )
    coverage = sum(min(d.observed_seconds, d.held_seconds) for d in devices) / held
    if coverage < settings.min_coverage:
        return (
            f"utilization known for {coverage:.0%} of the held time, "
            f"needs {settings.min_coverage:.0%}"
        )
    if _max(d.busy_quantile for d in devices) is None:
        return "no utilization series"
    return None


def _idle(
    workload: WorkloadHistory, settings: StrategySettings, current: Option
) -> Recommendation | None:
    devices = workload.devices
    busy = _max(d.busy_idle_quantile for d in devices) or 0.0
    if busy > settings.idle_utilization:
        return None
    in_use = _weighted(devices, lambda d: d.in_use_ratio)
    detail = ""
    if in_use is not None and in_use < 0.5:
        detail = f"; no process on it {1 - in_use:.0%} of the time"
    held = sum(d.held_seconds for d in devices) / len(devices)
    return Recommendation(
        IDLE,
        f"p99 utilization {busy:.1%} over {format_duration(_round_minutes(held))}{detail}: "
        "release the GPU",
        current=current,
        target=None,
        demand=Demand(busy * current.compute, "utilization", _peak_memory(devices), None),
    )


def _input_bound(
    workload: WorkloadHistory, settings: StrategySettings, current: Option
) -> Recommendation | None:
    devices = workload.devices
    busy = _max(d.busy_quantile for d in devices) or 0.0
    starving = _starved_containers(workload, settings)
    if not starving or busy >= settings.saturation:
        return None
    # Feed the GPU up to the saturation level: CPU in proportion, within sane bounds, since
    # a limit that is always hit hides how much the pipeline would really use.
    mean = _weighted(devices, lambda d: d.busy_mean) or busy
    factor = min(max(settings.saturation / max(mean, 0.01), MIN_CPU_FACTOR), MAX_CPU_FACTOR)
    changes = tuple(
        CpuChange(
            pod,
            cpu.container,
            cpu.usage_cores or 0.0,
            cpu.limit_cores or 0.0,
            math.ceil((cpu.limit_cores or 0.0) * factor * 2) / 2,
        )
        for pod, cpu in starving
    )
    first = changes[0]
    return Recommendation(
        INPUT_BOUND,
        f"GPU p{settings.percentile * 100:g} {busy:.0%} while container {first.container} uses "
        f"{first.usage_cores:.1f} of {first.limit_cores:g} CPU cores: raise its CPU limit to "
        f"{first.recommended_cores:g} and keep the GPU",
        current=current,
        target=current,
        demand=_demand(devices, current),
        cpu_changes=changes,
    )


def _size(
    workload: WorkloadHistory, hardware: Hardware, settings: StrategySettings, current: Option
) -> Recommendation:
    demand = _demand(workload.devices, current)
    percentile = f"p{settings.percentile * 100:g}"
    current_price = hardware.price(current.model)
    # Without a price for today's GPU, only its own MIG profiles compare (by their share).
    price_of = hardware.price if current_price is not None else (lambda _model: 1.0)
    current_cost = price_of(current.model) or 0.0
    current_cost *= current.share
    # Its own model's MIG profiles are always an option; other models as the settings allow.
    models = [current.model]
    if current_price is not None:
        models += [m for m in hardware.target_models(settings.models) if m.key != current.model.key]
    fitting, memory_blocked = _candidates(
        demand, current, hardware, settings, models, allow_mig=gpus_per_pod(workload) == 1
    )
    priced = [
        (price * option.share, option)
        for option in fitting
        if (price := price_of(option.model)) is not None
    ]
    priced.sort(key=lambda c: (c[0], c[1].model.key != current.model.key, -c[1].compute))
    if priced and priced[0][0] <= current_cost * (1 - settings.min_savings):
        best = priced[0][1]
        return Recommendation(
            UNDERUSED,
            f"{_demand_text(demand, percentile, current)}: {best.label} covers it with headroom",
            current=current,
            target=best,
            demand=demand,
        )
    return _keep(
        demand,
        current,
        settings,
        percentile,
        memory_blocked=[
            option
            for option in memory_blocked
            if (price := price_of(option.model)) is not None
            and price * option.share <= current_cost * (1 - settings.min_savings)
        ],
    )


def _candidates(
    demand: Demand,
    current: Option,
    hardware: Hardware,
    settings: StrategySettings,
    models: list[GpuModel],
    *,
    allow_mig: bool,
) -> tuple[list[Option], list[Option]]:
    """Options other than the current one that cover the demand with headroom, and those whose
    compute would do but whose memory is too small."""
    need_memory = demand.memory_bytes * (1 + settings.memory_headroom)
    fitting: list[Option] = []
    memory_blocked: list[Option] = []
    for model in models:
        scale = hardware.scale(current.model, model, settings.dtype, demand.roofline_side)
        if scale is None:
            continue
        need_compute = demand.compute * scale * (1 + settings.compute_headroom)
        for option in hardware.options(model, allow_mig=allow_mig):
            if option.same_slot(current) or need_compute > option.compute:
                continue
            (fitting if need_memory <= option.memory_bytes else memory_blocked).append(option)
    return fitting, memory_blocked


def _keep(
    demand: Demand,
    current: Option,
    settings: StrategySettings,
    percentile: str,
    *,
    memory_blocked: list[Option],
) -> Recommendation:
    """Nothing cheaper covers the demand: say which side binds. `memory_blocked` are the options
    that would save enough and have the compute, but not the memory."""
    used = demand.compute / current.compute
    if used >= settings.saturation:
        if demand.roofline_side == "memory":
            classification = MEMORY_BOUND
            reason = f"{demand.compute_signal} {percentile} {used:.0%}, DRAM busier than the SMs: bandwidth-bound side of the roofline; keep"
        else:
            classification = COMPUTE_BOUND
            side = (
                "compute-bound side of the roofline"
                if demand.roofline_side
                else "roofline side unknown (no DRAM activity series)"
            )
            reason = f"{demand.compute_signal} {percentile} {used:.0%}: {side}; keep"
    elif (
        memory_blocked
        or demand.memory_bytes * (1 + settings.memory_headroom) > current.memory_bytes
    ):
        classification = MEMORY_BOUND
        reason = (
            f"peak memory {demand.memory_bytes / GIB:.1f} GiB of {current.memory_bytes / GIB:.1f} "
            "GiB: memory capacity keeps it on this GPU"
        )
    else:
        classification = RIGHT_SIZED
        reason = f"{_demand_text(demand, percentile, current)}: nothing cheaper covers it"
    return Recommendation(classification, reason, current=current, target=current, demand=demand)


def _demand(devices: tuple[DeviceHistory, ...], current: Option) -> Demand:
    """Compute at the percentile (SM activity when the GPU is exclusive and GPM reports it,
    else utilization) in whole GPUs of the current model, peak memory, and the roofline side."""
    busy = _max(d.busy_quantile for d in devices) or 0.0
    exclusive = not any(d.shared for d in devices)
    sm = _max(d.sm_quantile for d in devices) if exclusive else None
    signal, used = ("SM activity", sm) if sm is not None else ("utilization", busy)
    side = None
    if exclusive:
        dram = _weighted(devices, lambda d: d.dram_mean)
        compute = _weighted(devices, lambda d: d.tensor_mean if d.tensor_mean else d.sm_mean)
        if dram is not None and compute is not None:
            side = "memory" if dram > compute else "compute"
    return Demand(used * current.compute, signal, _peak_memory(devices), side)


def _demand_text(demand: Demand, percentile: str, current: Option) -> str:
    return (
        f"{demand.compute_signal} {percentile} {demand.compute / current.compute:.0%} of "
        f"{current.label}, peak memory {demand.memory_bytes / GIB:.1f} GiB"
    )


def _starved_containers(
    workload: WorkloadHistory, settings: StrategySettings
) -> list[tuple[str, ContainerCpu]]:
    return [
        (pod.name, cpu)
        for pod in workload.pods
        for cpu in pod.cpu
        if cpu.usage_cores is not None
        and cpu.limit_cores
        and cpu.usage_cores >= settings.cpu_saturation * cpu.limit_cores
    ]


def _peak_memory(devices: tuple[DeviceHistory, ...]) -> float:
    return _max(d.memory_peak_bytes for d in devices) or 0.0


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _weighted(
    devices: tuple[DeviceHistory, ...], value: Callable[[DeviceHistory], float | None]
) -> float | None:
    pairs = [(v, d.held_seconds) for d in devices if (v := value(d)) is not None]
    total = sum(weight for _, weight in pairs)
    if not pairs or total <= 0:
        return None
    return sum(v * weight for v, weight in pairs) / total


def _round_minutes(seconds: float) -> float:
    return round(seconds / 60) * 60
