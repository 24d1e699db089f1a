"""The HTML report's two plots, as geometry for its template (`templates/plots.svg.j2`) to draw
as inline SVG (no plotting dependency).

`roofline` puts each workload on its GPU type's roofline (log-log: FLOP per byte against
FLOP/s, the roof being min(peak FLOP/s, bandwidth x intensity)); `consolidation` shows GPUs and
the busy part of them per model, before and after the recommendations. Positions are in SVG user
units; the template writes them with one decimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.rightsize.formatters.common import COLORS

if TYPE_CHECKING:
    from exporter.rightsize.consolidation import Consolidation
    from exporter.rightsize.report import Roofline

WIDTH: Final = 520
HEIGHT: Final = 340


@dataclass(frozen=True, slots=True)
class Frame:
    """The plot area inside the figure."""

    left: int
    top: int
    width: int
    height: int

    @property
    def right(self) -> int:
        return self.left + self.width

    @property
    def bottom(self) -> int:
        return self.top + self.height


@dataclass(frozen=True, slots=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True, slots=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float
    color: str
    name: str
    tooltip: str


@dataclass(frozen=True, slots=True)
class RooflinePlot:
    frame: Frame
    model: str
    subtitle: str
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    roof: tuple[tuple[float, float], ...]
    ridge: Label
    """Where the roof bends, at the ridge point's intensity."""
    points: tuple[Point, ...]
    width: int = WIDTH
    height: int = HEIGHT


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    height: float
    """All the GPUs; `busy` of it, from the baseline, is their mean utilization."""
    busy: float
    light: str
    dark: str
    gpus: int
    caption: str
    utilization: str
    tooltip: str


@dataclass(frozen=True, slots=True)
class BarGroup:
    name: str
    center: float
    bars: tuple[Bar, ...]


@dataclass(frozen=True, slots=True)
class ConsolidationPlot:
    frame: Frame
    groups: tuple[BarGroup, ...]
    width: int = WIDTH
    height: int = HEIGHT


def si(value: float, unit: str) -> str:
    """`1.98 PFLOP/s`, `3.35 TB/s`."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _decades(low: float, high: float) -> list[float]:
    values = []
    decade = low
    while decade <= high * 1.001:
        values.append(decade)
        decade *= 10
    return values


def roofline(chart: Roofline) -> RooflinePlot:
    frame = Frame(62, 40, WIDTH - 62 - 28, HEIGHT - 40 - 44)
    peak, bandwidth = chart.peak_flops.value, chart.bandwidth.value
    ridge = peak / bandwidth
    intensities = [p.intensity for p in chart.points] + [ridge]
    x_low = 10 ** math.floor(math.log10(min(intensities) / 2))
    x_high = 10 ** math.ceil(math.log10(max(intensities) * 2))
    achieved = [p.flops for p in chart.points]
    y_high = 10 ** math.ceil(math.log10(peak * 1.5))
    y_low = 10 ** math.floor(math.log10(max(min([*achieved, peak]) / 3, y_high / 1e6)))

    def x(value: float) -> float:
        span = math.log10(x_high / x_low)
        return frame.left + frame.width * (math.log10(value) - math.log10(x_low)) / span

    def y(value: float) -> float:
        clipped = min(max(value, y_low), y_high)
        span = math.log10(y_high / y_low)
        return frame.top + frame.height * (1 - (math.log10(clipped) - math.log10(y_low)) / span)

    roof_start = max(x_low, y_low / bandwidth)
    return RooflinePlot(
        frame=frame,
        model=chart.model,
        subtitle=(
            f"{chart.dtype} peak {si(peak, 'FLOP/s')} ({chart.peak_flops.source}), "
            f"memory {si(bandwidth, 'B/s')} ({chart.bandwidth.source})"
        ),
        x_ticks=tuple(Tick(x(decade), f"{decade:g}") for decade in _decades(x_low, x_high)),
        y_ticks=tuple(Tick(y(decade), si(decade, "")) for decade in _decades(y_low, y_high)),
        roof=(
            (x(roof_start), y(bandwidth * roof_start)),
            (x(ridge), y(peak)),
            (x(x_high), y(peak)),
        ),
        ridge=Label(x(ridge), y(peak), f"ridge {ridge:.0f} FLOP/B"),
        points=tuple(
            Point(
                x(point.intensity),
                y(point.flops),
                COLORS.get(point.classification, "#000"),
                point.workload.rsplit("/", 1)[-1],
                f"{point.workload}: {point.intensity:.1f} FLOP/B, "
                f"{si(point.flops, 'FLOP/s')} ({point.classification})",
            )
            for point in chart.points
        ),
    )


def consolidation(result: Consolidation) -> ConsolidationPlot:
    frame = Frame(40, 40, WIDTH - 40 - 16, HEIGHT - 40 - 64)
    groups = [
        (
            change.model,
            change.gpus_before,
            change.utilization_before or 0.0,
            change.gpus_after,
            change.utilization_after or 0.0,
        )
        for change in result.models
    ]
    groups.append(
        (
            "all GPUs",
            result.gpus_before,
            result.utilization_before,
            result.gpus_after,
            result.utilization_after,
        )
    )
    highest = max([1, *(max(g[1], g[3]) for g in groups)])
    scale = frame.height / (highest * 1.15)
    slot = frame.width / len(groups)
    width = min(36.0, slot / 3)
    drawn = []
    for index, (name, before, util_before, after, util_after) in enumerate(groups):
        center = frame.left + slot * (index + 0.5)
        bars = []
        for offset, gpus, utilization, light, dark, caption in (
            (-width - 2, before, util_before, "#c7c7c7", "#6b6b6b", "now"),
            (2, after, util_after, "#a1d99b", "#2ca02c", "after"),
        ):
            full = gpus * scale
            bars.append(
                Bar(
                    x=center + offset,
                    width=width,
                    height=full,
                    busy=full * min(utilization, 1.0),
                    light=light,
                    dark=dark,
                    gpus=gpus,
                    caption=caption,
                    utilization=f"{utilization:.0%}",
                    tooltip=f"{name} {caption}: {gpus} GPUs, {utilization:.0%} busy",
                )
            )
        drawn.append(BarGroup(name, center, tuple(bars)))
    return ConsolidationPlot(frame, tuple(drawn))
