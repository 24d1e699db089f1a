"""Strategies: pure functions `run(workload, hardware, settings) -> Recommendation`, by name.

A strategy never does I/O: it gets one workload's history, the hardware view (catalog, prices,
calibrated ceilings) and its settings, and answers with a Recommendation — or with
`undefined("not enough data: ...")` when the history cannot support an answer.
How `simple` decides is explained step by step in docs/guide/rightsizing.md ("How it works").
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

FEWER_GPUS: Final = "fewer GPUs"
"""The action of a replica that holds GPUs it never uses: the same GPU, fewer of it."""

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
    margin: float | None = None
    """How far the evidence is from the threshold that decided (0: on it, 1 or more: far from
    it), as a share of the room that threshold leaves; None without an answer."""
    margin_text: str = ""
    """The same in words, for the confidence's reason."""
    recommended_gpus: int | None = None
    """GPUs per replica to ask for instead of today's, when some of them are never used
    (`fewer GPUs`: the same GPU option, fewer of it); None when the count does not change."""

    @property
    def action(self) -> str:
        if self.classification == UNDEFINED:
            return "none"
        if self.classification == IDLE:
            return "release"
        if self.classification == INPUT_BOUND:
            return "add CPU"
        if self.classification == UNDERUSED:
            return FEWER_GPUS if self.recommended_gpus is not None else "move"
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
        or _fewer_gpus(workload, settings, current)
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
    threshold = settings.idle_utilization
    return Recommendation(
        IDLE,
        f"p99 utilization {busy:.1%} over {format_duration(_round_minutes(held))}{detail}: "
        "release the GPU",
        current=current,
        target=None,
        demand=Demand(busy * current.compute, "utilization", _peak_memory(devices), None),
        margin=(threshold - busy) / threshold if threshold > 0 else 1.0,
        margin_text=f"p99 utilization {busy:.1%} against the {threshold:.0%} idle threshold",
    )


def _unused(device: DeviceHistory, settings: StrategySettings, current: Option) -> bool:
    """Whether a device was never used: p99 utilization under the idle threshold and hardly any
    memory (a shard's weights kept on an otherwise idle GPU are a use)."""
    busy = device.busy_idle_quantile
    memory = device.memory_peak_bytes or 0.0
    return (
        busy is not None
        and busy <= settings.idle_utilization
        and memory <= settings.idle_utilization * current.memory_bytes
    )


def _fewer_gpus(
    workload: WorkloadHistory, settings: StrategySettings, current: Option
) -> Recommendation | None:
    """A replica holding several GPUs of which some are never used (a 2-GPU Job whose second GPU
    idles all week) needs only as many as its busiest replica used."""
    per_pod = gpus_per_pod(workload)
    if per_pod < 2:
        return None
    used = max(
        sum(1 for device in pod.devices if not _unused(device, settings, current))
        for pod in workload.pods
    )
    if used == 0 or used >= per_pod:
        return None
    idle = [d for d in workload.devices if _unused(d, settings, current)]
    kept = tuple(d for d in workload.devices if not _unused(d, settings, current))
    busiest_idle = _max(d.busy_idle_quantile for d in idle) or 0.0
    threshold = settings.idle_utilization
    return Recommendation(
        UNDERUSED,
        f"{per_pod - used} of the {per_pod} GPUs of each replica unused (p99 utilization "
        f"{busiest_idle:.1%} at most): ask for {used} {_gpus(used)} per replica",
        current=current,
        target=current,
        demand=_demand(kept, current),
        margin=(threshold - busiest_idle) / threshold if threshold > 0 else 1.0,
        margin_text=(
            f"p99 utilization of the unused GPUs {busiest_idle:.1%} against the "
            f"{threshold:.0%} idle threshold"
        ),
        recommended_gpus=used,
    )


def _gpus(count: int) -> str:
    return "GPU" if count == 1 else "GPUs"


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
    pinned = max(change.usage_cores / change.limit_cores for change in changes)
    cpu_room = 1 - settings.cpu_saturation
    return Recommendation(
        INPUT_BOUND,
        f"GPU p{settings.percentile * 100:g} {busy:.0%} while container {first.container} uses "
        f"{first.usage_cores:.1f} of {first.limit_cores:g} CPU cores: raise its CPU limit to "
        f"{first.recommended_cores:g} and keep the GPU",
        current=current,
        target=current,
        demand=_demand(devices, current),
        cpu_changes=changes,
        margin=min(
            (pinned - settings.cpu_saturation) / cpu_room if cpu_room > 0 else 1.0,
            (settings.saturation - busy) / settings.saturation,
        ),
        margin_text=(
            f"CPU at {pinned:.0%} of its limit (input-bound from {settings.cpu_saturation:.0%}), "
            f"GPU at {busy:.0%} (saturated from {settings.saturation:.0%})"
        ),
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
    considered = _candidates(
        demand, current, hardware, settings, models, allow_mig=gpus_per_pod(workload) == 1
    )
    affordable = current_cost * (1 - settings.min_savings)
    priced = [
        (price * fit.option.share, fit)
        for fit in considered
        if fit.fits and (price := price_of(fit.option.model)) is not None
    ]
    priced.sort(
        key=lambda c: (c[0], c[1].option.model.key != current.model.key, -c[1].option.compute)
    )
    if priced and priced[0][0] <= affordable:
        best = priced[0][1]
        return Recommendation(
            UNDERUSED,
            f"{_demand_text(demand, percentile, current)}: {best.option.label} covers it with "
            "headroom",
            current=current,
            target=best.option,
            demand=demand,
            margin=1 - best.load,
            margin_text=(
                f"demand with headroom takes {best.compute_load:.0%} of the {best.option.label}'s "
                f"compute and {best.memory_load:.0%} of its memory"
            ),
        )
    cheaper = [
        fit
        for fit in considered
        if not fit.fits
        and (price := price_of(fit.option.model)) is not None
        and price * fit.option.share <= affordable
    ]
    return _keep(demand, current, settings, percentile, cheaper=cheaper)


@dataclass(frozen=True, slots=True)
class _Fit:
    """An option other than the current one, and how much of it the demand with headroom takes
    (over 1: it does not fit)."""

    option: Option
    compute_load: float
    memory_load: float

    @property
    def load(self) -> float:
        return max(self.compute_load, self.memory_load)

    @property
    def fits(self) -> bool:
        return self.load <= 1

    @property
    def memory_only(self) -> bool:
        """Its compute would do, its memory is too small."""
        return self.compute_load <= 1 < self.memory_load


def _candidates(
    demand: Demand,
    current: Option,
    hardware: Hardware,
    settings: StrategySettings,
    models: list[GpuModel],
    *,
    allow_mig: bool,
) -> list[_Fit]:
    """Every option other than the current one whose compute can be compared, with its load."""
    need_memory = demand.memory_bytes * (1 + settings.memory_headroom)
    considered: list[_Fit] = []
    for model in models:
        scale = hardware.scale(current.model, model, settings.dtype, demand.roofline_side)
        if scale is None:
            continue
        need_compute = demand.compute * scale * (1 + settings.compute_headroom)
        for option in hardware.options(model, allow_mig=allow_mig):
            if option.same_slot(current):
                continue
            considered.append(
                _Fit(option, need_compute / option.compute, need_memory / option.memory_bytes)
            )
    return considered


def _keep(
    demand: Demand,
    current: Option,
    settings: StrategySettings,
    percentile: str,
    *,
    cheaper: list[_Fit],
) -> Recommendation:
    """Nothing cheaper covers the demand: say which side binds. `cheaper` are the options that
    would save enough but do not fit."""
    used = demand.compute / current.compute
    need_memory = demand.memory_bytes * (1 + settings.memory_headroom)
    memory_blocked = [fit for fit in cheaper if fit.memory_only]
    nearest = min(cheaper, key=lambda fit: fit.load, default=None)
    if used >= settings.saturation:
        room = 1 - settings.saturation
        margin = (used - settings.saturation) / room if room > 0 else 1.0
        margin_text = (
            f"{demand.compute_signal} {percentile} {used:.0%} against the "
            f"{settings.saturation:.0%} saturation threshold"
        )
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
    elif memory_blocked or need_memory > current.memory_bytes:
        classification = MEMORY_BOUND
        reason = (
            f"peak memory {demand.memory_bytes / GIB:.1f} GiB of {current.memory_bytes / GIB:.1f} "
            "GiB: memory capacity keeps it on this GPU"
        )
        if need_memory > current.memory_bytes:
            margin, margin_text = 1.0, "peak memory with headroom is more than this GPU holds"
        else:
            closest = min(memory_blocked, key=lambda fit: fit.memory_load)
            margin = closest.memory_load - 1
            margin_text = (
                f"peak memory with headroom {margin:.0%} over what the {closest.option.label} holds"
            )
    else:
        classification = RIGHT_SIZED
        reason = f"{_demand_text(demand, percentile, current)}: nothing cheaper covers it"
        if nearest is None:
            margin, margin_text = 1.0, "no cheaper option exists"
        else:
            margin = nearest.load - 1
            margin_text = (
                f"demand with headroom {margin:.0%} over what the nearest cheaper option, "
                f"{nearest.option.label}, offers"
            )
    return Recommendation(
        classification,
        reason,
        current=current,
        target=current,
        demand=demand,
        margin=margin,
        margin_text=margin_text,
    )


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
