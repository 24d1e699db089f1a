"""The HTML report's picture of the policy replay (`--simulate`), as geometry for its template
(`templates/plots.svg.j2`, macro `replay`) to draw as inline SVG.

Time over the window runs left to right, GPUs up. `current` is the GPUs held at each step (a
line that moves); every other policy is a fixed placement, the same GPUs at every step, so it is
a flat line at its GPUs. Flat lines that coincide are dashed in turn (each policy its own slot
of the dash pattern), so two policies needing the same GPUs both stay visible. Under them, the
busy GPU-equivalents at each step: the demand a placement carries, which is why it fits. Most
policies keep each workload on its model and carry the same demand; a policy that moves
workloads to another model carries it in GPUs of that model, and gets a line of its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.formatters.plots import Frame, Tick
from exporter.rightsize.replay.policies import CURRENT

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.rightsize.replay.engine import PolicyResult

WIDTH: Final = 900
HEIGHT: Final = 340
ENTRY_HEIGHT: Final = 28
"""A legend entry's two lines."""
LEGEND_WIDTH: Final = 236
DASH: Final = 8.0
COLORS: Final = {
    CURRENT: "#333333",
    "exclusive": "#1f77b4",
    "mig": "#9467bd",
    "timeslice": "#2ca02c",
    "binpack": "#d62728",
}
BUSY_FILL: Final = "#d9d9d9"
TIME_TICKS: Final = (
    600,
    1800,
    3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    7 * 86400,
    14 * 86400,
    28 * 86400,
    91 * 86400,
)
"""Candidate spacings of the time axis' ticks, seconds: the first that gives at most 7."""
MAX_TIME_TICKS: Final = 7


@dataclass(frozen=True, slots=True)
class Line:
    policy: str
    """The policy drawn (for a busy line, the first of `policies`)."""
    series: str
    """`gpus` or `busy`."""
    points: tuple[tuple[float, float], ...]
    color: str
    width: float
    dash: str | None = None
    dash_offset: float = 0.0
    policies: tuple[str, ...] = ()
    """For a busy line: every policy carrying that demand."""
    area: tuple[tuple[float, float], ...] = ()
    """For the first busy line: the polygon under it, filled."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the legend: a swatch like its line, and what it is."""

    color: str
    text: str
    detail: str = ""
    """A second line, under the first."""
    dash: str | None = None
    filled: bool = False


@dataclass(frozen=True, slots=True)
class ReplayPlot:
    frame: Frame
    subtitle: str
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    lines: tuple[Line, ...]
    legend: tuple[Entry, ...]
    notes: tuple[str, ...]
    """What the picture cannot show, and why (`current` not replayed, a policy unpriced)."""
    width: int = WIDTH
    height: int = HEIGHT
    busy_fill: str = BUSY_FILL
    entry_height: int = ENTRY_HEIGHT


def _nice_step(highest: float, ticks: int = 5) -> float:
    raw = highest / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return next(factor * power for factor in (1.0, 2.0, 5.0, 10.0) if factor * power >= raw)


def _gpu_text(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"


def _time_label(at: float, spacing: int, *, first: bool) -> str:
    moment = time.gmtime(at)
    if spacing >= 86400:
        return time.strftime("%b %d", moment)
    if first or (moment.tm_hour == 0 and moment.tm_min == 0):
        return time.strftime("%b %d %H:%M", moment)
    return time.strftime("%H:%M", moment)


def _time_ticks(start: float, end: float, x: Callable[[float], float]) -> tuple[Tick, ...]:
    span = max(end - start, 1.0)
    spacing = next((s for s in TIME_TICKS if span / s <= MAX_TIME_TICKS), TIME_TICKS[-1])
    at = math.ceil(start / spacing) * spacing
    ticks: list[Tick] = []
    while at <= end + 1e-6:
        ticks.append(Tick(x(at), _time_label(at, spacing, first=not ticks)))
        at += spacing
    return tuple(ticks)


def _usd(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:,.0f}/month"


def replay(results: Sequence[PolicyResult], *, end: float, step: float) -> ReplayPlot:
    """The picture of `results` (each with its per-step series) over the steps ending at `end`."""
    frame = Frame(48, 40, WIDTH - 48 - 16 - LEGEND_WIDTH, HEIGHT - 40 - 46)
    steps = max((len(r.gpus_by_step) for r in results), default=0)
    times = [end - (steps - 1 - k) * step for k in range(steps)]
    start = times[0] if steps > 1 else end - step
    highest = max(
        [1.0, *(max(r.gpus_by_step, default=0.0) for r in results)]
        + [max(r.busy_by_step, default=0.0) for r in results]
    )
    y_step = _nice_step(highest * 1.1)
    y_top = math.ceil(highest * 1.1 / y_step) * y_step

    def x(at: float) -> float:
        return frame.left + frame.width * (at - start) / max(end - start, 1.0)

    def y(value: float) -> float:
        return frame.bottom - frame.height * value / y_top

    def through(values: Sequence[float]) -> tuple[tuple[float, float], ...]:
        if len(values) == 1:
            return ((x(start), y(values[0])), (x(end), y(values[0])))
        return tuple((x(at), y(value)) for at, value in zip(times, values, strict=True))

    lines: list[Line] = []
    legend: list[Entry] = []
    # The busy GPU-equivalents: one line per distinct demand, the first filled beneath.
    carried: dict[tuple[float, ...], list[str]] = {}
    for result in results:
        if result.busy_by_step:  # a result made without its series (none the engine makes)
            key = tuple(round(value, 6) for value in result.busy_by_step)
            carried.setdefault(key, []).append(result.policy)
    for number, policies in enumerate(carried.values()):
        first = next(r for r in results if r.policy == policies[0])
        points = through(first.busy_by_step)
        color = BUSY_FILL if number == 0 else COLORS[first.policy]
        area: tuple[tuple[float, float], ...] = ()
        if number == 0:
            area = ((points[0][0], y(0)), *points, (points[-1][0], y(0)))
        lines.append(
            Line(
                first.policy,
                "busy",
                points,
                "#9a9a9a" if number == 0 else color,
                1.0,
                policies=tuple(policies),
                area=area,
            )
        )
        named = "every policy replayed" if len(policies) == len(results) else ", ".join(policies)
        # A policy moving workloads to other models carries their demand in those models' GPUs.
        text = "busy GPU-equivalents" if number == 0 else "busy, on the models of"
        legend.append(Entry(color, text, named, filled=number == 0))
    fixed = [r for r in results if r.policy != CURRENT]
    period = DASH * len(fixed)
    for index, result in enumerate(fixed):
        dash = f"{DASH:g} {period - DASH:g}" if len(fixed) > 1 else None
        count = result.gpus.max
        lines.append(
            Line(
                result.policy,
                "gpus",
                ((x(start), y(count)), (x(end), y(count))),
                COLORS[result.policy],
                2.5,
                dash=dash,
                dash_offset=-DASH * index,
            )
        )
        legend.append(
            Entry(
                COLORS[result.policy],
                f"{result.policy}: {_gpu_text(count)} GPUs",
                _usd(result.cost_usd_per_month),
                dash="6 3" if dash else None,
            )
        )
    current = next((r for r in results if r.policy == CURRENT), None)
    notes = [
        f"{r.policy} is unpriced: a GPU model it uses has no price (give one with --prices)."
        for r in results
        if r.cost_usd_per_month is None
    ]
    if not any(r.placements for r in results):
        notes.append(
            "No workload of the report has a GPU model the catalog knows: the policies placed "
            "nothing."
        )
    if current is not None:
        lines.append(Line(CURRENT, "gpus", through(current.gpus_by_step), COLORS[CURRENT], 2.0))
        legend.insert(
            0,
            Entry(
                COLORS[CURRENT],
                f"current: GPUs held, {_gpu_text(current.gpus.max)} at most",
                _usd(current.cost_usd_per_month),
            ),
        )
    else:
        notes.insert(
            0, "current was not replayed: add it to --simulate to draw the GPUs held beside these."
        )
    return ReplayPlot(
        frame=frame,
        subtitle=(
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(start))} to "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(end))} UTC, "
            f"{steps} steps of {format_duration(step)}"
        ),
        x_ticks=_time_ticks(start, end, x),
        y_ticks=tuple(
            Tick(y(k * y_step), _gpu_text(k * y_step)) for k in range(round(y_top / y_step) + 1)
        ),
        lines=tuple(lines),
        legend=tuple(legend),
        notes=tuple(notes),
        height=max(HEIGHT, frame.top + ENTRY_HEIGHT * len(legend) + 8),
    )
