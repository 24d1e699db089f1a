"""From history to the report: run the strategy per workload, attach money, simulate consolidation.

Money is the window's spend scaled to a 730-hour month: a workload that held one GPU for the
whole window costs one GPU-month, one that held it for a third of the window a third of that.
A MIG instance costs the larger of its compute and memory share of the GPU's price; a
time-sliced GPU is split evenly between the pods holding it.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.durations import format_duration
from exporter.rightsize.consolidation import Consolidation, Slot, consolidate
from exporter.rightsize.hardware import HOURS_PER_MONTH, Ceiling, Hardware, Option
from exporter.rightsize.strategy import (
    CLASSIFICATIONS,
    IDLE,
    INPUT_BOUND,
    UNDEFINED,
    UNDERUSED,
    Recommendation,
    Strategy,
    undefined,
)

if TYPE_CHECKING:
    from exporter.catalog import GpuModel
    from exporter.rightsize.history import DeviceHistory, History, WorkloadHistory
    from exporter.rightsize.settings import StrategySettings

log = logging.getLogger("exporter.rightsize.report")


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    history: WorkloadHistory
    recommendation: Recommendation
    gpus_held: float
    """Average number of devices held over the window."""
    cost_current: float | None
    """USD per month."""
    cost_recommended: float | None

    @property
    def savings(self) -> float | None:
        if self.cost_current is None or self.cost_recommended is None:
            return None
        return self.cost_current - self.cost_recommended

    @property
    def devices(self) -> tuple[DeviceHistory, ...]:
        return self.history.devices

    @property
    def utilization_mean(self) -> float | None:
        return _weighted(self.devices, "busy_mean")

    @property
    def utilization_quantile(self) -> float | None:
        return _maximum(self.devices, "busy_quantile")

    @property
    def sm_quantile(self) -> float | None:
        return _maximum(self.devices, "sm_quantile")

    @property
    def memory_peak_bytes(self) -> float | None:
        return _maximum(self.devices, "memory_peak_bytes")

    @property
    def memory_quantile_bytes(self) -> float | None:
        return _maximum(self.devices, "memory_quantile_bytes")

    @property
    def idle_ratio(self) -> float | None:
        in_use = _weighted(self.devices, "in_use_ratio")
        return None if in_use is None else 1 - in_use

    @property
    def shared(self) -> bool:
        return any(device.shared for device in self.devices)

    @property
    def cpu_ratio(self) -> float | None:
        """The highest CPU use at the percentile over its limit, among the pods' containers."""
        ratios = [
            cpu.usage_cores / cpu.limit_cores
            for pod in self.history.pods
            for cpu in pod.cpu
            if cpu.usage_cores is not None and cpu.limit_cores
        ]
        return max(ratios) if ratios else None

    @property
    def target_label(self) -> str:
        recommendation = self.recommendation
        if recommendation.classification == IDLE:
            return "release"
        if recommendation.target is None or recommendation.classification == UNDEFINED:
            return "-"
        return recommendation.target.label


@dataclass(frozen=True, slots=True)
class Money:
    current: float
    recommended: float
    unpriced: int = 0
    """Workloads on a GPU model without a price: left out of these sums."""

    @property
    def savings(self) -> float:
        return self.current - self.recommended


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    workload: str
    classification: str
    intensity: float
    """FLOP per byte of DRAM traffic."""
    flops: float
    """Achieved FLOP/s."""


@dataclass(frozen=True, slots=True)
class Roofline:
    model: str
    dtype: str
    peak_flops: Ceiling
    bandwidth: Ceiling
    points: tuple[RooflinePoint, ...]


@dataclass(frozen=True, slots=True)
class Report:
    end: float
    window_seconds: float
    step_seconds: float
    source: str
    strategy: str
    settings: StrategySettings
    rows: tuple[WorkloadRow, ...]
    namespaces: tuple[tuple[str, Money], ...]
    total: Money
    consolidation: Consolidation
    rooflines: tuple[Roofline, ...]
    missing_signals: tuple[str, ...] = ()
    version: str = __version__

    @property
    def classification_counts(self) -> dict[str, int]:
        counts = Counter(row.recommendation.classification for row in self.rows)
        return {name: counts[name] for name in CLASSIFICATIONS if counts[name]}

    @property
    def business_case(self) -> str:
        return business_case(self)


def build_report(
    history: History,
    *,
    strategy: Strategy,
    hardware: Hardware,
    settings: StrategySettings,
    source: str,
) -> Report:
    rows = []
    for workload in history.workloads:
        try:
            recommendation = strategy.run(workload, hardware, settings)
        except (ArithmeticError, ValueError) as error:
            # One bad workload never costs the whole report.
            log.warning("strategy failed", extra={"workload": workload.key, "error": str(error)})
            recommendation = undefined(f"strategy failed: {error}")
        rows.append(_row(workload, recommendation, hardware, history.window_seconds))
    rows.sort(key=lambda row: (-(row.savings or 0.0), row.history.key))
    return Report(
        end=history.end,
        window_seconds=history.window_seconds,
        step_seconds=history.step_seconds,
        source=source,
        strategy=strategy.name,
        settings=settings,
        rows=tuple(rows),
        namespaces=_per_namespace(rows),
        total=_money(rows),
        consolidation=_consolidation(rows, hardware, settings),
        rooflines=_rooflines(rows, hardware, settings),
        missing_signals=history.missing_signals,
    )


def _row(
    workload: WorkloadHistory, recommendation: Recommendation, hardware: Hardware, window: float
) -> WorkloadRow:
    devices = workload.devices
    months = [d.held_seconds / window * HOURS_PER_MONTH for d in devices]  # GPU-hours per month
    current = recommendation.current
    price = hardware.price(current.model) if current is not None else None
    cost_current = None
    if current is not None and price is not None:
        unshared = Option(current.model, current.mig_profile).share
        cost_current = sum(
            hours * price * unshared / device.holders
            for hours, device in zip(months, devices, strict=True)
        )
    cost_recommended = cost_current
    if recommendation.classification == IDLE:
        cost_recommended = 0.0 if cost_current is not None else None
    elif recommendation.classification == UNDERUSED and recommendation.target is not None:
        target_price = hardware.price(recommendation.target.model)
        if cost_current is not None and target_price is not None:
            cost_recommended = sum(months) * target_price * recommendation.target.share
    return WorkloadRow(
        workload,
        recommendation,
        gpus_held=sum(d.held_seconds for d in devices) / window,
        cost_current=cost_current,
        cost_recommended=cost_recommended,
    )


def _money(rows: list[WorkloadRow]) -> Money:
    priced = [row for row in rows if row.cost_current is not None]
    return Money(
        current=sum(row.cost_current or 0.0 for row in priced),
        recommended=sum(row.cost_recommended or 0.0 for row in priced),
        unpriced=len(rows) - len(priced),
    )


def _per_namespace(rows: list[WorkloadRow]) -> tuple[tuple[str, Money], ...]:
    grouped: dict[str, list[WorkloadRow]] = defaultdict(list)
    for row in rows:
        grouped[row.history.namespace].append(row)
    totals = [(namespace, _money(members)) for namespace, members in grouped.items()]
    totals.sort(key=lambda item: (-item[1].savings, item[0]))
    return tuple(totals)


def _consolidation(
    rows: list[WorkloadRow], hardware: Hardware, settings: StrategySettings
) -> Consolidation:
    """Slots of the devices held at the end of the window, as they are and as recommended."""
    before: list[Slot] = []
    after: list[Slot] = []
    for row in rows:
        recommendation = row.recommendation
        current = recommendation.current
        if current is None:
            continue
        for device in row.devices:
            if not device.present:
                continue
            shared_uuid = device.uuid if device.shared else None
            work = (device.busy_mean or 0.0) * current.compute
            before.append(Slot(current.model, current.mig_profile, work, shared_uuid))
            target = recommendation.target
            if recommendation.classification == IDLE or target is None:
                continue
            if recommendation.classification != UNDERUSED:
                after.append(Slot(current.model, current.mig_profile, work, shared_uuid))
                continue
            side = recommendation.demand.roofline_side if recommendation.demand else None
            scale = hardware.scale(current.model, target.model, settings.dtype, side) or 1.0
            after.append(Slot(target.model, target.mig_profile, work * scale))
    return consolidate(before, after)


def _rooflines(
    rows: list[WorkloadRow], hardware: Hardware, settings: StrategySettings
) -> tuple[Roofline, ...]:
    """Each workload with SM/tensor and DRAM activity on its GPU type's roofline."""
    models: dict[str, GpuModel] = {}
    points: dict[str, list[RooflinePoint]] = defaultdict(list)
    for row in rows:
        current = row.recommendation.current
        if current is None or row.shared:
            continue
        models[current.model.key] = current.model
        dram = _weighted(row.devices, "dram_mean")
        tensor = _weighted(row.devices, "tensor_mean")
        sm = _weighted(row.devices, "sm_mean")
        compute = tensor if tensor else sm
        ceiling = _flops_ceiling(hardware, current.model, settings.dtype)
        if not dram or not compute or ceiling is None:
            continue
        achieved = compute * ceiling.value * current.compute
        traffic = dram * hardware.bandwidth(current.model).value * current.compute
        points[current.model.key].append(
            RooflinePoint(
                row.history.key, row.recommendation.classification, achieved / traffic, achieved
            )
        )
    rooflines = []
    for key, model in sorted(models.items()):
        ceiling = _flops_ceiling(hardware, model, settings.dtype)
        if ceiling is None or not points[key]:
            continue
        rooflines.append(
            Roofline(
                model.name,
                _flops_dtype(hardware, model, settings.dtype) or settings.dtype,
                ceiling,
                hardware.bandwidth(model),
                tuple(points[key]),
            )
        )
    return tuple(rooflines)


def _flops_dtype(hardware: Hardware, model: GpuModel, dtype: str) -> str | None:
    return hardware.compute_dtype(model, model, dtype)


def _flops_ceiling(hardware: Hardware, model: GpuModel, dtype: str) -> Ceiling | None:
    chosen = _flops_dtype(hardware, model, dtype)
    return hardware.flops(model, chosen) if chosen else None


def _weighted(devices: tuple[DeviceHistory, ...], name: str) -> float | None:
    pairs = [(value, d.held_seconds) for d in devices if (value := getattr(d, name)) is not None]
    total = sum(weight for _, weight in pairs)
    return sum(v * w for v, w in pairs) / total if pairs and total > 0 else None


def _maximum(devices: tuple[DeviceHistory, ...], name: str) -> float | None:
    values = [value for d in devices if (value := getattr(d, name)) is not None]
    return max(values) if values else None


def money_text(usd: float) -> str:
    return f"${usd:,.0f}"


def business_case(report: Report) -> str:
    """The report's conclusion in one paragraph."""
    counts = report.classification_counts
    rows = report.rows
    if not rows:
        return (
            f"No workload held a GPU in the last {format_duration(report.window_seconds)} "
            "(or none matched the selection): nothing to rightsize."
        )
    consolidation = report.consolidation
    namespaces = len({row.history.namespace for row in rows})
    actions = []
    if counts.get(IDLE):
        released = sum(1 for row in rows if row.recommendation.classification == IDLE)
        actions.append(f"release {released} idle {_plural(released, 'GPU holder')}")
    if counts.get(UNDERUSED):
        actions.append(
            f"move {counts[UNDERUSED]} underused {_plural(counts[UNDERUSED], 'workload')} to MIG "
            "slices or cheaper GPUs"
        )
    if counts.get(INPUT_BOUND):
        actions.append(
            f"give {counts[INPUT_BOUND]} starved input {_plural(counts[INPUT_BOUND], 'pipeline')} "
            "more CPU"
        )
    total = report.total
    text = (
        f"Over the last {format_duration(report.window_seconds)}, {len(rows)} "
        f"{_plural(len(rows), 'workload')} in {namespaces} {_plural(namespaces, 'namespace')} "
        f"held {consolidation.gpus_before} {_plural(consolidation.gpus_before, 'GPU')} "
        f"at an average utilization of {consolidation.utilization_before:.0%}. "
    )
    if actions:
        text += (
            f"Following the recommendations ({'; '.join(actions)}), they fit on "
            f"{consolidation.gpus_after} {_plural(consolidation.gpus_after, 'GPU')} at a projected "
            f"{consolidation.utilization_after:.0%}, and the GPU bill falls from "
            f"{money_text(total.current)} to {money_text(total.recommended)} a month: "
            f"{money_text(total.savings)} saved per month, {money_text(total.savings * 12)} a year."
        )
    else:
        text += "Every workload with enough history is sized right: nothing to save."
    if counts.get(UNDEFINED):
        text += (
            f" {counts[UNDEFINED]} {_plural(counts[UNDEFINED], 'workload')} "
            f"{'has' if counts[UNDEFINED] == 1 else 'have'} too little history to judge."
        )
    if total.unpriced:
        text += f" {total.unpriced} on GPU models without a price are left out of the sums."
    return text


def _plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}s"
