"""Asking the PromQL API for the replay's per-step history, through the report's client.

The client asks instant queries only (`prometheus.py`), so each step of the report's grid is one
term of a union: the same expression at `offset k*step`, tagged with the step's number
(`label_replace(..., "replay_step", "k", "", "")`), several steps per query. A query holds as
many steps as keep it under `MAX_QUERY_BYTES` and its answer under `MAX_ELEMENTS` elements; the
queries run under the client's concurrency, its retries, limits and checks.

Three expressions, each aggregated inside Prometheus:

- `demand`: `rate(gpu_pod_busy_seconds_total[<step>])` summed per workload and GPU
  configuration, as the report's workload rows are grouped (a bare pod is its own workload);
- `held`: the GPUs held, counted per model and MIG profile (a time-sliced GPU once);
- `contended`: whether some time-sliced GPU was asked for more than all of its time.

A query the server refuses (too long for it, too many samples) costs the replay, not the report.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from exporter.rightsize.prometheus import Bounds, PrometheusQueryError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    from exporter.rightsize.prometheus import PrometheusClient

    Fold: TypeAlias = Callable[[int, Mapping[str, str], float], None]
    """Folds one element of a step's answer (the step's index, oldest first) into the history."""
    from exporter.rightsize.selection import Selection

log = logging.getLogger("exporter.rightsize.replay")

STEP_LABEL: Final = "replay_step"
OFFSET: Final = "<offset>"
"""Where a step's `offset` goes in an expression."""
MAX_QUERY_BYTES: Final = 12 * 1024
"""VictoriaMetrics refuses queries over 16 KiB by default (`-search.maxQueryLen`)."""
MAX_ELEMENTS: Final = 20_000
"""Elements of one answer: about 275 bytes each, some 5.5 MB, well under the answer limit."""
MAX_BUSY_GPUS: Final = 1e6
"""A workload busy on a million GPUs at once is no measurement."""

Key = tuple[str, str, str, str, str, str]
"""(cluster, namespace, kind, workload, model, mig_profile), as `WorkloadHistory.configuration`."""


@dataclass(frozen=True, slots=True)
class StepHistory:
    """The window's steps, oldest first."""

    steps: int
    busy: dict[Key, array[float]]
    """Per workload configuration: its devices' busy ratios summed, per step (0 without data)."""
    held: list[dict[tuple[str, str], float]]
    """Per step: devices held per (model, MIG profile)."""
    contended: list[bool]


def _terms(expression: str, steps: int, step: float) -> list[str]:
    """The expression at each step back from the end (`offset 0s` is refused: none there)."""
    terms = []
    for k in range(steps):
        at = expression.replace(OFFSET, f" offset {round(k * step)}s" if k else "")
        terms.append(f'label_replace({at}, "{STEP_LABEL}", "{k}", "", "")')
    return terms


def _queries(terms: list[str], per_query: int) -> list[tuple[int, str]]:
    """The terms joined with `or` into queries of at most `per_query` terms and
    `MAX_QUERY_BYTES`; each with the number of its first term."""
    queries: list[tuple[int, str]] = []
    first, batch, size = 0, list[str](), 0
    for index, term in enumerate(terms):
        if batch and (len(batch) >= per_query or size + len(term) + 4 > MAX_QUERY_BYTES):
            queries.append((first, " or ".join(batch)))
            first, batch, size = index, [], 0
        batch.append(term)
        size += len(term) + 4
    if batch:
        queries.append((first, " or ".join(batch)))
    return queries


async def fetch_steps(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    cluster_label: str | None,
    configurations: int,
) -> StepHistory | None:
    """`_fetch_steps`, or None when the server refuses a replay query: the report goes out
    without the replay (it names `replay` among the signals it could not read)."""
    try:
        return await _fetch_steps(
            client,
            selection=selection,
            end=end,
            window=window,
            step=step,
            cluster_label=cluster_label,
            configurations=configurations,
        )
    except PrometheusQueryError as error:
        log.warning("policy replay unavailable", extra={"error": str(error)})
        return None


async def _fetch_steps(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    cluster_label: str | None,
    configurations: int,
) -> StepHistory:
    """Every step of the window (`window // step` of them, the last ending at `end`):
    each workload's busy GPUs, the GPUs held, whether a time-sliced GPU was contended.
    `configurations` (the report's workload rows) sizes the demand queries' answers."""
    steps = max(int(window // step), 1)
    s = f"{round(step)}s"
    k = f"{cluster_label}, " if cluster_label else ""
    m = selection.matchers()
    f = selection.pod_filter(f"{round(window)}s", cluster_label=cluster_label)
    named = ", ".join(part for part in (m, 'workload!=""') if part)
    bare = ", ".join(part for part in (m, 'workload=""') if part)
    demand = (
        f"sum by ({k}namespace, workload_kind, workload, model, mig_profile) "
        f"(rate(gpu_pod_busy_seconds_total{{{named}}}[{s}]{OFFSET}){f}) or "
        f"sum by ({k}namespace, pod, model, mig_profile) "
        f"(rate(gpu_pod_busy_seconds_total{{{bare}}}[{s}]{OFFSET}){f})"
    )
    held = (
        f"count by ({k}model, mig_profile) (group by ({k}uuid, model, mig_profile) "
        f"(gpu_allocation_info{{{m}}}{OFFSET}{f}))"
    )
    contended = (
        f"count(sum by ({k}uuid) (rate(gpu_pod_busy_seconds_total[{s}]{OFFSET})) > 1 "
        f"and on ({k}uuid) (max by ({k}uuid) (gpu_allocation_shared{{{m}}}{OFFSET}) == 1))"
    )
    bounds = Bounds(0.0, MAX_BUSY_GPUS, "busy GPUs")
    busy: dict[Key, array[float]] = {}
    held_by_step: list[dict[tuple[str, str], float]] = [{} for _ in range(steps)]
    contended_by_step = [False] * steps

    def add_demand(index: int, labels: Mapping[str, str], value: float) -> None:
        if labels.get("workload"):
            kind, name = labels.get("workload_kind", "") or "Pod", labels.get("workload", "")
        else:
            kind, name = "Pod", labels.get("pod", "")
        key = (
            labels.get(cluster_label, "") if cluster_label else "",
            labels.get("namespace", ""),
            kind,
            name,
            labels.get("model", ""),
            labels.get("mig_profile", ""),
        )
        if key not in busy:
            busy[key] = array("d", bytes(8 * steps))
        busy[key][index] += value

    def add_held(index: int, labels: Mapping[str, str], value: float) -> None:
        counts = held_by_step[index]
        configuration = (labels.get("model", ""), labels.get("mig_profile", ""))
        counts[configuration] = counts.get(configuration, 0.0) + value

    def add_contended(index: int, _labels: Mapping[str, str], value: float) -> None:
        contended_by_step[index] |= value > 0

    async def ask(expression: str, name: str, per_step: int, fold: Fold) -> None:
        """Every step's answer, each query's folded in as it arrives (and then dropped)."""
        per_query = max(1, MAX_ELEMENTS // max(per_step, 1))

        async def one(promql: str) -> None:
            answer = await client.query(promql, at=end, name=f"replay {name}", bounds=bounds)
            for sample in answer:
                number = sample.labels.get(STEP_LABEL, "")
                if number.isdigit() and int(number) < steps:
                    # Offset k is the k-th step back from the end.
                    fold(steps - 1 - int(number), sample.labels, sample.value)

        await _all(
            [one(promql) for _, promql in _queries(_terms(expression, steps, step), per_query)]
        )

    await _all(
        [
            ask(demand, "demand", configurations, add_demand),
            ask(held, "held", 16, add_held),
            ask(contended, "contended", 1, add_contended),
        ]
    )
    return StepHistory(steps, busy, held_by_step, contended_by_step)


async def _all(coroutines: list[Coroutine[Any, Any, None]]) -> None:
    """Run them together; the first failure cancels the others (none left asking a server the
    report no longer waits for) and is raised."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
