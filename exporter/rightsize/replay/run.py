"""From the report and the per-step history to each policy's result."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from exporter.rightsize.hardware import Option
from exporter.rightsize.replay.cut import NEVER
from exporter.rightsize.replay.engine import CurrentSteps, PolicyResult, Workload, replay

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.rightsize.hardware import Hardware
    from exporter.rightsize.replay.cut import Cut
    from exporter.rightsize.replay.steps import StepHistory
    from exporter.rightsize.report import Report


def simulate(
    report: Report,
    history: StepHistory,
    *,
    hardware: Hardware,
    policies: Sequence[str],
    cut: Cut = NEVER,
) -> tuple[PolicyResult, ...]:
    """Replay `policies` for the report's workload rows (those with a GPU model the catalog
    knows: the others cannot be moved or priced, and are left out of every policy)."""
    workloads = []
    for row in report.rows:
        current = row.recommendation.current
        if current is None:
            continue
        history_row = row.history
        demand = row.recommendation.demand
        shared = next((d.uuid for d in row.devices if d.shared), None)
        busy = history.busy.get(history_row.configuration)
        if busy is None:
            # No busy series in the window: it held its GPUs idle at every step.
            busy = np.zeros(history.steps)
        workloads.append(
            Workload(
                cluster=history_row.cluster,
                namespace=history_row.namespace,
                kind=history_row.kind,
                name=history_row.name,
                current=current,
                busy=busy,
                memory_bytes=row.memory_peak_bytes or 0.0,
                devices=max(1, row.replicas * row.gpus_per_replica),
                roofline_side=demand.roofline_side if demand else None,
                shared_uuid=shared,
                gpus_per_pod=max(1, row.gpus_per_replica),
            )
        )
    return replay(
        workloads,
        _current(history, hardware),
        hardware=hardware,
        settings=report.settings,
        policies=policies,
        cut=cut,
    )


def _current(history: StepHistory, hardware: Hardware) -> CurrentSteps:
    """GPUs held at each step: a whole GPU counts 1, a MIG instance its share of the price."""
    held: list[float] = []
    by_model: dict[str, float] = {}
    unpriced = False
    for counts in history.held:
        total = 0.0
        for (name, profile_name), count in counts.items():
            model = hardware.model(name)
            profile = model.mig_profile(profile_name) if model and profile_name else None
            if model is None or hardware.price(model) is None:
                unpriced = True
            share = 1.0
            if profile is not None and model is not None:
                share = Option(model, profile).share
            total += count * share
            key = model.key if model else name
            by_model[key] = by_model.get(key, 0.0) + count * share
        held.append(total)
    return CurrentSteps(tuple(held), by_model, sum(history.contended), unpriced=unpriced)
