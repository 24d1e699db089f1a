"""How a report shows the replay: the JSON objects, one line per policy, a manager's sentence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from exporter.rightsize.replay.policies import BINPACK, CURRENT, EXCLUSIVE, MIG, TIMESLICE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.rightsize.replay.engine import PolicyResult

WHAT: Final = {
    EXCLUSIVE: "one right-sized GPU per workload",
    MIG: "MIG instances sized to each workload",
    TIMESLICE: "time-slicing the serving workloads",
    BINPACK: "packing every workload step by step",
}
COLUMNS: Final = ("policy", "GPUs p50/p95/max", "utilization", "contention", "$/month", "saving")


def _count(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 3)


def simulation_document(results: Sequence[PolicyResult]) -> list[dict[str, Any]]:
    """The report's `simulation` list: one object per policy replayed."""
    return [
        {
            "policy": result.policy,
            "gpus": {
                "p50": _count(result.gpus.p50),
                "p95": _count(result.gpus.p95),
                "max": _count(result.gpus.max),
            },
            "utilization_mean": round(result.utilization_mean, 4),
            "contention_share": round(result.contention_share, 4),
            "memory_overcommit_steps": result.memory_overcommit_steps,
            "cost_usd_per_month": None
            if result.cost_usd_per_month is None
            else round(result.cost_usd_per_month, 2),
            "placements": [
                {
                    **({"cluster": p.cluster} if p.cluster else {}),
                    "namespace": p.namespace,
                    "kind": p.kind,
                    "workload": p.workload,
                    "gpu_model": p.gpu_model,
                    "mig_profile": p.mig_profile,
                    "group": p.group,
                }
                for p in result.placements
            ],
        }
        for result in results
    ]


def _gpus(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.0f}"


def policy_rows(results: Sequence[PolicyResult]) -> list[tuple[str, ...]]:
    """One line per policy: GPUs, utilization, contention, cost, saving against `current`."""
    baseline = next((r.cost_usd_per_month for r in results if r.policy == CURRENT), None)
    rows: list[tuple[str, ...]] = []
    for result in results:
        cost = result.cost_usd_per_month
        saving = "-"
        if result.policy != CURRENT and baseline is not None and cost is not None:
            saving = _usd(baseline - cost)
        gpus = result.gpus
        rows.append(
            (
                result.policy,
                f"{_gpus(gpus.p50)}/{_gpus(gpus.p95)}/{_gpus(gpus.max)}",
                f"{result.utilization_mean:.0%}",
                f"{result.contention_share:.1%} of steps",
                _usd(cost),
                saving,
            )
        )
    return rows


def sentence(results: Sequence[PolicyResult], *, saturation: float) -> str:
    """The best replayed policy against `current` in a sentence ("time-slicing the serving
    workloads: 8 → 3 A100 80GB SXM GPUs, utilization 23% → 63%, no step over 80%"); empty
    without both."""
    current = next((r for r in results if r.policy == CURRENT), None)
    others = [r for r in results if r.policy != CURRENT]
    if current is None or not others:
        return ""
    best = min(
        others,
        key=lambda r: (r.gpus.max, r.cost_usd_per_month or 0.0, r.contention_share),
    )
    text = (
        f"{WHAT[best.policy]}: {_gpus(current.gpus.max)} → {_gpus(best.gpus.max)} "
        f"{_models(current, best)}, utilization {current.utilization_mean:.0%} → "
        f"{best.utilization_mean:.0%}, "
    )
    if best.contention_share == 0:
        if best.policy not in {TIMESLICE, BINPACK}:
            text += "no step over a whole GPU"
        elif all(p.group is not None and p.mig_profile is None for p in best.placements):
            text += f"no step over {saturation:.0%}"
        else:
            # GPUs of their own may run above the target: it bounds only GPUs that are shared.
            text += f"no shared GPU over {saturation:.0%} at any step"
    else:
        text += f"GPUs contended on {best.contention_share:.1%} of the steps"
    if current.cost_usd_per_month is not None and best.cost_usd_per_month is not None:
        saved = current.cost_usd_per_month - best.cost_usd_per_month
        if saved > 0:
            text += f", {_usd(saved)} a month less"
    return text + "."


def _models(current: PolicyResult, best: PolicyResult) -> str:
    names = {name for name, _ in current.models} | {name for name, _ in best.models}
    return f"{names.pop()} GPUs" if len(names) == 1 else "GPUs"
