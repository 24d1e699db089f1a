"""From history to the report: run the strategy per workload, attach money, simulate consolidation.

Money is the window's spend scaled to a 730-hour month: a workload that held one GPU for the
whole window costs one GPU-month, one that held it for a third of the window a third of that.
A MIG instance costs the larger of its compute and memory share of the GPU's price; a
time-sliced GPU is split evenly between the pods holding it. A GPU on a node OpenCost prices
costs OpenCost's price, else the catalog's (`opencost.py`); the options are priced from the
catalog, scaled by the same factor, and each row says who priced it.

Each row also carries how far to trust it (`confidence.py`), what the shorter terms recommend and
the trend between them, its replicas and autoscaler, and the patch that applies it
(`patches.py`). `--min-confidence` leaves rows below it out of the report (and its sums), saying
how many.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.durations import format_duration
from exporter.rightsize.confidence import (
    HIGH,
    LEVELS,
    LOW,
    MEDIUM,
    Confidence,
    TermAnswer,
    assess,
    term_label,
    trend,
)
from exporter.rightsize.consolidation import Consolidation, Slot, consolidate
from exporter.rightsize.hardware import HOURS_PER_MONTH, Ceiling, Hardware, Option
from exporter.rightsize.history import LONG_TERM
from exporter.rightsize.opencost import CurrentCost, current_cost
from exporter.rightsize.patches import build_patch
from exporter.rightsize.row import WorkloadRow, weighted
from exporter.rightsize.strategy import (
    CLASSIFICATIONS,
    IDLE,
    INPUT_BOUND,
    UNDEFINED,
    UNDERUSED,
    Recommendation,
    Strategy,
    gpus_per_pod,
    undefined,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.catalog import GpuModel
    from exporter.rightsize.history import Autoscaler, History, WorkloadHistory
    from exporter.rightsize.replay.engine import PolicyResult
    from exporter.rightsize.replay.patchset import PlacementPatches
    from exporter.rightsize.settings import StrategySettings

log = logging.getLogger("exporter.rightsize.report")


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
class NamespaceMoney:
    cluster: str
    namespace: str
    money: Money


@dataclass(frozen=True, slots=True)
class QueueMoney:
    """Showback per queue: the money of the workloads admitted through one queue."""

    cluster: str
    queue: str
    """"" for the workloads in no queue."""
    queue_kind: str
    """`kueue`, `kai`, or "" for none."""
    money: Money


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
    namespaces: tuple[NamespaceMoney, ...]
    total: Money
    consolidation: Consolidation
    """Whole GPUs now and after the recommendations (`consolidation.py`), every cluster's."""
    cluster_consolidations: tuple[tuple[str, Consolidation], ...]
    """The same per cluster ("" without a cluster label), which add up to `consolidation`:
    GPUs are packed within a cluster, never across two."""
    rooflines: tuple[Roofline, ...]
    missing_signals: tuple[str, ...] = ()
    version: str = __version__
    clusters: tuple[tuple[str, Money], ...] = ()
    """Per cluster, with a cluster label (`--cluster-label`)."""
    cluster_label: str | None = None
    min_confidence: str = LOW
    left_out: int = 0
    """Recommendations below `min_confidence`, not in the rows."""
    history_source: str = "gpuscope"
    """Whose series the history was read from (`--source`): `gpuscope` or `dcgm-exporter`."""
    simulation: tuple[PolicyResult, ...] = ()
    """Each policy `--simulate` asked for, replayed over the window (`replay/`)."""
    placement_patches: PlacementPatches | None = None
    """The winning placement's patches, where Kubernetes can express it (`replay/patchset.py`)."""
    queues: tuple[QueueMoney, ...] = ()
    """Per queue (the workloads in none as one more entry); empty when no workload is in one."""

    @property
    def classification_counts(self) -> dict[str, int]:
        counts = Counter(row.recommendation.classification for row in self.rows)
        return {name: counts[name] for name in CLASSIFICATIONS if counts[name]}

    @property
    def confidence_counts(self) -> dict[str, int]:
        counts = Counter(row.confidence_level for row in self.rows)
        return {name: counts[name] for name in reversed(LEVELS) if counts[name]}

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
    min_confidence: str = LOW,
) -> Report:
    rows = [_row(workload, strategy, hardware, settings, history) for workload in history.workloads]
    rows = _one_patch_per_owner(rows)
    _warn_skipped(rows)
    kept = [
        row for row in rows if LEVELS.index(row.confidence_level) >= LEVELS.index(min_confidence)
    ]
    kept.sort(key=lambda row: (-(row.savings or 0.0), row.history.key))
    clusters: dict[str, list[WorkloadRow]] = defaultdict(list)
    for row in kept:
        clusters[row.cluster].append(row)
    return Report(
        end=history.end,
        window_seconds=history.window_seconds,
        step_seconds=history.step_seconds,
        source=source,
        strategy=strategy.name,
        settings=settings,
        rows=tuple(kept),
        namespaces=_per_namespace(kept),
        queues=_per_queue(kept),
        total=_money(kept),
        consolidation=_consolidation(kept, hardware, settings),
        cluster_consolidations=tuple(
            (name, _consolidation(members, hardware, settings))
            for name, members in sorted(clusters.items())
        ),
        rooflines=_rooflines(kept, hardware, settings),
        missing_signals=(*history.missing_signals, *history.limits),
        clusters=tuple((name, _money(members)) for name, members in sorted(clusters.items()))
        if history.cluster_label
        else (),
        cluster_label=history.cluster_label,
        min_confidence=min_confidence,
        left_out=len(rows) - len(kept),
        history_source=history.source,
    )


def _recommend(
    strategy: Strategy, workload: WorkloadHistory, hardware: Hardware, settings: StrategySettings
) -> Recommendation:
    try:
        return strategy.run(workload, hardware, settings)
    except (ArithmeticError, ValueError) as error:
        # One bad workload never costs the whole report.
        log.warning("strategy failed", extra={"workload": workload.key, "error": str(error)})
        return undefined(f"strategy failed: {error}")


def _row(
    workload: WorkloadHistory,
    strategy: Strategy,
    hardware: Hardware,
    settings: StrategySettings,
    history: History,
) -> WorkloadRow:
    window = history.window_seconds
    recommendation = _recommend(strategy, workload, hardware, settings)
    autoscaler = history.autoscalers.get(workload.owner)
    if autoscaler is not None and recommendation.classification != UNDEFINED:
        recommendation = replace(
            recommendation, reason=f"{recommendation.reason}; {autoscaled(autoscaler)}"
        )
    terms = []
    for term in history.terms:
        held = term.workloads.get(workload.configuration)
        answer = _recommend(strategy, held, hardware, settings) if held is not None else None
        terms.append(TermAnswer(term.name, term.window_seconds, answer, term_label(answer)))
    terms.sort(key=lambda term: term.window_seconds)
    long_term = TermAnswer(LONG_TERM, window, recommendation, term_label(recommendation))
    priced = _priced(workload, recommendation, hardware, window, history.node_prices)
    return replace(
        priced,
        confidence=_limited(assess(workload, recommendation, window, terms), history),
        trend=trend(long_term, terms, f"p{settings.percentile * 100:g}"),
        terms=(*terms, long_term),
        autoscaler=autoscaler,
        patch=build_patch(workload, recommendation, history.resources, hardware.seen),
    )


def _limited(confidence: Confidence, history: History) -> Confidence:
    """At most medium when the history's source cannot tell everything (dcgm-exporter's)."""
    if not history.limits or confidence.level != HIGH:
        return confidence
    return replace(
        confidence,
        level=MEDIUM,
        reason=(
            f"{MEDIUM}: {confidence.reason.removeprefix(HIGH + ': ')}; at most medium from "
            f"{history.source}'s series alone (see the missing signals)"
        ),
    )


def autoscaled(autoscaler: Autoscaler) -> str:
    """How a recommendation says its workload is autoscaled."""
    low, high = autoscaler.min_replicas, autoscaler.max_replicas
    span = f"{low if low is not None else '?'}-{high if high is not None else '?'} replicas"
    on = f" on {', '.join(autoscaler.metrics)}" if autoscaler.metrics else ""
    return (
        f"autoscaled by HorizontalPodAutoscaler {autoscaler.name} ({span}{on}): sized per "
        "replica, the autoscaler sets how many"
    )


def _warn_skipped(rows: list[WorkloadRow]) -> None:
    """One warning per owner whose patch was skipped for a name Kubernetes would refuse."""
    warned: set[tuple[str, str, str, str]] = set()
    for row in rows:
        patch = row.patch
        if patch is not None and patch.skipped and row.history.owner not in warned:
            warned.add(row.history.owner)
            log.warning(
                "workload left out of the patches: its name is not a Kubernetes name",
                extra={"problem": patch.skipped},
            )


def _one_patch_per_owner(rows: list[WorkloadRow]) -> list[WorkloadRow]:
    """A workload on two GPU configurations within the window is two rows but one object: only
    the row its pods hold at the end (the most GPUs among them) keeps its patch."""
    owners: dict[tuple[str, str, str, str], list[WorkloadRow]] = defaultdict(list)
    for row in rows:
        if row.patch is not None:
            owners[row.history.owner].append(row)
    superseded: set[int] = set()
    for members in owners.values():
        if len(members) > 1:
            kept = max(members, key=lambda row: (row.replicas, row.gpus_held))
            superseded |= {id(row) for row in members if row is not kept}
    return [replace(row, patch=None) if id(row) in superseded else row for row in rows]


def _priced(
    workload: WorkloadHistory,
    recommendation: Recommendation,
    hardware: Hardware,
    window: float,
    node_prices: Mapping[str, float],
) -> WorkloadRow:
    devices = workload.devices
    months = [d.held_seconds / window * HOURS_PER_MONTH for d in devices]  # GPU-hours per month
    current = recommendation.current
    cost = CurrentCost(None, None)
    if current is not None:
        cost = current_cost(
            devices,
            months,
            catalog_price=hardware.price(current.model),
            unshared=Option(current.model, current.mig_profile).share,
            node_prices=node_prices,
        )
    cost_current = cost.usd_per_month
    cost_recommended = cost_current
    if recommendation.classification == IDLE:
        cost_recommended = 0.0 if cost_current is not None else None
    elif recommendation.recommended_gpus is not None:
        if cost_current is not None:
            per_pod = max(gpus_per_pod(workload), 1)
            cost_recommended = cost_current * recommendation.recommended_gpus / per_pod
    elif recommendation.classification == UNDERUSED and recommendation.target is not None:
        target_price = hardware.price(recommendation.target.model)
        if cost_current is not None and target_price is not None:
            target_price *= cost.option_scale
            cost_recommended = sum(months) * target_price * recommendation.target.share
    tokens = workload.served_tokens
    return WorkloadRow(
        workload,
        recommendation,
        gpus_held=sum(d.held_seconds for d in devices) / window,
        cost_current=cost_current,
        cost_recommended=cost_recommended,
        price_source=cost.source,
        option_price_scale=cost.option_scale,
        tokens_per_month=None if tokens is None else tokens / window * HOURS_PER_MONTH * 3600,
    )


def _money(rows: list[WorkloadRow]) -> Money:
    priced = [row for row in rows if row.cost_current is not None]
    return Money(
        current=sum(row.cost_current or 0.0 for row in priced),
        recommended=sum(row.cost_recommended or 0.0 for row in priced),
        unpriced=len(rows) - len(priced),
    )


def _per_namespace(rows: list[WorkloadRow]) -> tuple[NamespaceMoney, ...]:
    grouped: dict[tuple[str, str], list[WorkloadRow]] = defaultdict(list)
    for row in rows:
        grouped[(row.cluster, row.history.namespace)].append(row)
    totals = [
        NamespaceMoney(cluster, namespace, _money(members))
        for (cluster, namespace), members in grouped.items()
    ]
    totals.sort(key=lambda item: (-item.money.savings, item.cluster, item.namespace))
    return tuple(totals)


def _per_queue(rows: list[WorkloadRow]) -> tuple[QueueMoney, ...]:
    if not any(row.history.queue for row in rows):
        return ()
    grouped: dict[tuple[str, str, str], list[WorkloadRow]] = defaultdict(list)
    for row in rows:
        grouped[(row.cluster, row.history.queue, row.history.queue_kind)].append(row)
    totals = [QueueMoney(*key, _money(members)) for key, members in grouped.items()]
    totals.sort(key=lambda item: (-item.money.current, item.cluster, item.queue))
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
        kept = _kept_devices(row)
        for device in row.devices:
            if not device.present:
                continue
            shared_uuid = device.uuid if device.shared else None
            work = (device.busy_mean or 0.0) * current.compute
            cluster = row.cluster
            before.append(Slot(current.model, current.mig_profile, work, shared_uuid, cluster))
            target = recommendation.target
            if recommendation.classification == IDLE or target is None or id(device) not in kept:
                continue
            if recommendation.classification != UNDERUSED:
                after.append(Slot(current.model, current.mig_profile, work, shared_uuid, cluster))
                continue
            side = recommendation.demand.roofline_side if recommendation.demand else None
            scale = hardware.scale(current.model, target.model, settings.dtype, side) or 1.0
            after.append(Slot(target.model, target.mig_profile, work * scale, cluster=cluster))
    return consolidate(before, after)


def _kept_devices(row: WorkloadRow) -> set[int]:
    """The ids of the devices a row keeps: each pod's busiest `recommended_gpus` when it asks
    for fewer, else all of them."""
    count = row.recommendation.recommended_gpus
    if count is None:
        return {id(device) for device in row.devices}
    return {
        id(device)
        for pod in row.history.pods
        for device in sorted(pod.devices, key=lambda d: -(d.busy_mean or 0.0))[:count]
    }


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
        dram = weighted(row.devices, "dram_mean")
        tensor = weighted(row.devices, "tensor_mean")
        sm = weighted(row.devices, "sm_mean")
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
    namespaces = len({(row.cluster, row.history.namespace) for row in rows})
    actions = []
    if counts.get(IDLE):
        released = sum(1 for row in rows if row.recommendation.classification == IDLE)
        actions.append(f"release {released} idle {_plural(released, 'GPU holder')}")
    fewer = sum(1 for row in rows if row.recommendation.recommended_gpus is not None)
    moved = counts.get(UNDERUSED, 0) - fewer
    if moved:
        actions.append(
            f"move {moved} underused {_plural(moved, 'workload')} to MIG slices or cheaper GPUs"
        )
    if fewer:
        actions.append(
            f"ask for fewer GPUs per replica for {fewer} {_plural(fewer, 'workload')} that never "
            "use some of theirs"
        )
    if counts.get(INPUT_BOUND):
        actions.append(
            f"give {counts[INPUT_BOUND]} starved input {_plural(counts[INPUT_BOUND], 'pipeline')} "
            "more CPU"
        )
    total = report.total
    clusters = len({row.cluster for row in rows})
    where = f" of {clusters} {_plural(clusters, 'cluster')}" if report.cluster_label else ""
    text = (
        f"Over the last {format_duration(report.window_seconds)}, {len(rows)} "
        f"{_plural(len(rows), 'workload')} in {namespaces} {_plural(namespaces, 'namespace')}"
        f"{where} "
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
    if report.left_out:
        text += (
            f" {report.left_out} {_plural(report.left_out, 'recommendation')} below "
            f"{report.min_confidence} confidence {'is' if report.left_out == 1 else 'are'} left "
            "out."
        )
    return text


def _plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}s"
