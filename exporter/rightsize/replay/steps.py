"""Asking the PromQL API for the replay's per-step history, through the report's client.

Each expression is asked as range queries (`PrometheusClient.query_matrix`) over the report's
grid, the last step at `end`: one evaluation covers many steps, where an instant query would
cost one evaluation per step. The window is cut into time slices of as many steps as keep an
answer under `MAX_SAMPLES` samples and half the answer limit (and each series under
`MAX_POINTS` points, the server's own limit); a sample's time says its step. The queries run
under the client's concurrency, its retries, limits and checks. Each answer is read as columns
(`PrometheusClient.query_matrix`: a series' times and values as arrays, 16 bytes a sample, never
an object per sample) and folded into the history as it arrives, each series' samples added at
their steps in one numpy operation, so at most `--prometheus.concurrency` answers are held at
once.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import numpy as np

from exporter.rightsize.prometheus import Bounds, PrometheusQueryError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    from numpy.typing import NDArray

    from exporter.rightsize.prometheus import PrometheusClient

    Steps: TypeAlias = NDArray[np.intp]
    Values: TypeAlias = NDArray[np.float64]
    Fold: TypeAlias = Callable[[Mapping[str, str], Steps, Values], None]
    """Folds one series of an answer (its samples' steps, oldest first 0, and values) into the
    history."""
    from exporter.rightsize.selection import Selection

log = logging.getLogger("exporter.rightsize.replay")

MAX_SAMPLES: Final = 400_000
"""Samples of one answer: at most `SAMPLE_BYTES` each (and a series' labels once), 16 MB, half
the default answer limit (`--prometheus.max-response-size`; a lower limit asks smaller slices),
and 6.4 MB of samples read as columns. Each query costs the server its series' lookup and the chunks or
blocks around its slice (VictoriaMetrics decompresses each series' blocks whole, a block up to
8,192 samples), whatever the slice's length: 10,000 workload rows over 2,016 steps are 51
queries, where 100,000 samples an answer made them 202 (the server's work four times over)."""
SAMPLE_BYTES: Final = 40
"""A matrix sample's JSON at most: `[1795818600,"0.08123456789012345"],` is 35 characters."""
MAX_POINTS: Final = 10_000
"""Points of one series: Prometheus refuses a range query of more than 11,000."""
MAX_BUSY_GPUS: Final = 1e6
"""A workload busy on a million GPUs at once is no measurement."""

Key = tuple[str, str, str, str, str, str]
"""(cluster, namespace, kind, workload, model, mig_profile), as `WorkloadHistory.configuration`."""


@dataclass(frozen=True, slots=True)
class StepHistory:
    """The window's steps, oldest first."""

    steps: int
    busy: dict[Key, NDArray[np.float64]]
    """Per workload configuration: its devices' busy ratios summed, per step (0 without data)."""
    held: list[dict[tuple[str, str], float]]
    """Per step: devices held per (model, MIG profile)."""
    contended: list[bool]


def _slices(steps: int, per_query: int) -> list[tuple[int, int]]:
    """The steps (numbered back from the end, 0 the newest) cut into slices of at most
    `per_query`: each as (its newest step, its oldest)."""
    return [(first, min(first + per_query, steps) - 1) for first in range(0, steps, per_query)]


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
    lookback = f"{round(window)}s"
    # Pods the selector matched anywhere in the report's window, whichever step is evaluated:
    # the filter is pinned to `end` (`@`).
    f = selection.pod_filter(lookback, cluster_label=cluster_label).replace(
        f"[{lookback}]", f"[{lookback}] @ {end:.3f}"
    )
    named = ", ".join(part for part in (m, 'workload!=""') if part)
    bare = ", ".join(part for part in (m, 'workload=""') if part)
    demand = (
        f"sum by ({k}namespace, workload_kind, workload, model, mig_profile) "
        f"(rate(gpu_pod_busy_seconds_total{{{named}}}[{s}]){f}) or "
        f"sum by ({k}namespace, pod, model, mig_profile) "
        f"(rate(gpu_pod_busy_seconds_total{{{bare}}}[{s}]){f})"
    )
    held = (
        f"count by ({k}model, mig_profile) (group by ({k}uuid, model, mig_profile) "
        f"(gpu_allocation_info{{{m}}}{f}))"
    )
    contended = (
        f"count(sum by ({k}uuid) (rate(gpu_pod_busy_seconds_total[{s}])) > 1 "
        f"and on ({k}uuid) (max by ({k}uuid) (gpu_allocation_shared{{{m}}}) == 1))"
    )
    bounds = Bounds(0.0, MAX_BUSY_GPUS, "busy GPUs")
    # An answer's samples fill at most half the answer limit: the series' labels have the rest.
    samples = min(MAX_SAMPLES, client.connection.max_response_bytes // (2 * SAMPLE_BYTES))
    busy: dict[Key, NDArray[np.float64]] = {}
    held_by_step: list[dict[tuple[str, str], float]] = [{} for _ in range(steps)]
    contended_by_step = [False] * steps

    def add_demand(labels: Mapping[str, str], index: Steps, value: Values) -> None:
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
        vector = busy.get(key)
        if vector is None:
            vector = busy[key] = np.zeros(steps)
        # Unbuffered: a step twice in one series (a server's duplicate) adds both, in order.
        np.add.at(vector, index, value)

    def add_held(labels: Mapping[str, str], index: Steps, value: Values) -> None:
        configuration = (labels.get("model", ""), labels.get("mig_profile", ""))
        for at, count in zip(index.tolist(), value.tolist(), strict=True):
            counts = held_by_step[at]
            counts[configuration] = counts.get(configuration, 0.0) + count

    def add_contended(_labels: Mapping[str, str], index: Steps, value: Values) -> None:
        for at, count in zip(index.tolist(), value.tolist(), strict=True):
            contended_by_step[at] |= count > 0

    async def ask(expression: str, name: str, per_step: int, fold: Fold) -> None:
        """Every step's answer, each query's folded in as it arrives (and then dropped)."""
        per_query = max(1, min(samples // max(per_step, 1), MAX_POINTS))

        async def one(newest: int, oldest: int) -> None:
            answer = await client.query_matrix(
                expression,
                start=end - oldest * step,
                end=end - newest * step,
                step=step,
                name=f"replay {name}",
                bounds=bounds,
            )
            back = np.rint((end - answer.times) / step)
            # A sample off the grid or outside the window is no step's: a server's own.
            on_grid = (
                (back >= 0) & (back < steps) & (np.abs(end - back * step - answer.times) < 0.5)
            )
            index = (steps - 1 - np.where(on_grid, back, 0)).astype(np.intp)
            everywhere = bool(on_grid.all())
            for labels, part in answer.series():
                if everywhere:
                    fold(labels, index[part], answer.values[part])
                else:
                    kept = on_grid[part]
                    fold(labels, index[part][kept], answer.values[part][kept])

        await _all([one(newest, oldest) for newest, oldest in _slices(steps, per_query)])

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
