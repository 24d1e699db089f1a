"""The HTML report's two plots as inline SVG, drawn by hand (no plotting dependency).

`roofline` puts each workload on its GPU type's roofline (log-log: FLOP per byte against
FLOP/s, the roof being min(peak FLOP/s, bandwidth x intensity)); `consolidation` shows GPUs and
the busy part of them per model, before and after the recommendations.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from exporter.rightsize.consolidation import Consolidation
    from exporter.rightsize.report import Roofline

COLORS: Final = {
    "idle": "#d62728",
    "input-bound": "#ff7f0e",
    "underused": "#e6b800",
    "memory-bound": "#1f77b4",
    "compute-bound": "#2ca02c",
    "right-sized": "#17becf",
    "undefined": "#7f7f7f",
}
FONT: Final = "font-family='system-ui, sans-serif'"


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def roofline(chart: Roofline, *, width: int = 520, height: int = 340) -> str:
    left, right, top, bottom = 62, 28, 40, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    peak, bandwidth = chart.peak_flops.value, chart.bandwidth.value
    ridge = peak / bandwidth
    intensities = [p.intensity for p in chart.points] + [ridge]
    x_low = 10 ** math.floor(math.log10(min(intensities) / 2))
    x_high = 10 ** math.ceil(math.log10(max(intensities) * 2))
    achieved = [p.flops for p in chart.points]
    y_high = 10 ** math.ceil(math.log10(peak * 1.5))
    y_low = 10 ** math.floor(math.log10(max(min([*achieved, peak]) / 3, y_high / 1e6)))

    def x(value: float) -> float:
        return left + plot_w * (math.log10(value) - math.log10(x_low)) / math.log10(x_high / x_low)

    def y(value: float) -> float:
        clipped = min(max(value, y_low), y_high)
        return top + plot_h * (
            1 - (math.log10(clipped) - math.log10(y_low)) / math.log10(y_high / y_low)
        )

    parts = [
        (
            f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' width='{width}' "
            f"height='{height}' role='img' {FONT} font-size='11'>"
        ),
        f"<title>Roofline of {escape(chart.model)}</title>",
        f"<text x='{left}' y='16' font-size='13' font-weight='600'>{escape(chart.model)}</text>",
        (
            f"<text x='{left}' y='31' fill='#555'>{chart.dtype} peak {_si(peak, 'FLOP/s')} "
            f"({chart.peak_flops.source}), memory {_si(bandwidth, 'B/s')} ({chart.bandwidth.source})</text>"
        ),
        f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='#fafafa' stroke='#ccc'/>",
    ]
    decade = x_low
    while decade <= x_high * 1.001:
        px = x(decade)
        parts.append(
            f"<line x1='{px:.1f}' y1='{top}' x2='{px:.1f}' y2='{top + plot_h}' stroke='#e5e5e5'/>"
        )
        parts.append(
            f"<text x='{px:.1f}' y='{top + plot_h + 14}' text-anchor='middle'>{decade:g}</text>"
        )
        decade *= 10
    decade = y_low
    while decade <= y_high * 1.001:
        py = y(decade)
        parts.append(
            f"<line x1='{left}' y1='{py:.1f}' x2='{left + plot_w}' y2='{py:.1f}' stroke='#e5e5e5'/>"
        )
        parts.append(
            f"<text x='{left - 4}' y='{py + 4:.1f}' text-anchor='end'>{_si(decade, '')}</text>"
        )
        decade *= 10
    roof_start = max(x_low, y_low / bandwidth)
    parts.append(
        f"<polyline fill='none' stroke='#333' stroke-width='2' points='"
        f"{x(roof_start):.1f},{y(bandwidth * roof_start):.1f} {x(ridge):.1f},{y(peak):.1f} "
        f"{x(x_high):.1f},{y(peak):.1f}'/>"
    )
    parts.append(
        f"<text x='{x(ridge) + 4:.1f}' y='{y(peak) - 4:.1f}' fill='#333'>ridge {ridge:.0f} FLOP/B</text>"
    )
    for point in chart.points:
        color = COLORS.get(point.classification, "#000")
        px, py = x(point.intensity), y(point.flops)
        name = escape(point.workload.rsplit("/", 1)[-1])
        parts.append(
            f"<circle cx='{px:.1f}' cy='{py:.1f}' r='5' fill='{color}' stroke='#222'>"
            f"<title>{escape(point.workload)}: {point.intensity:.1f} FLOP/B, "
            f"{_si(point.flops, 'FLOP/s')} ({point.classification})</title></circle>"
        )
        parts.append(f"<text x='{px + 7:.1f}' y='{py + 4:.1f}'>{name}</text>")
    parts.append(
        f"<text x='{left + plot_w / 2}' y='{height - 6}' text-anchor='middle'>"
        "arithmetic intensity (FLOP per DRAM byte)</text>"
        f"<text transform='translate(12 {top + plot_h / 2}) rotate(-90)' text-anchor='middle'>"
        "achieved FLOP/s</text></svg>"
    )
    return "".join(parts)


def consolidation(result: Consolidation, *, width: int = 520, height: int = 340) -> str:
    left, right, top, bottom = 40, 16, 40, 64
    plot_w, plot_h = width - left - right, height - top - bottom
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
    scale = plot_h / (highest * 1.15)
    slot = plot_w / len(groups)
    bar = min(36.0, slot / 3)
    parts = [
        (
            f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' width='{width}' "
            f"height='{height}' role='img' {FONT} font-size='11'>"
        ),
        "<title>GPUs and utilization before and after consolidation</title>",
        f"<text x='{left}' y='16' font-size='13' font-weight='600'>GPUs needed, now and after</text>",
        f"<text x='{left}' y='31' fill='#555'>bar = GPUs; dark part = busy share (mean utilization)</text>",
        f"<line x1='{left}' y1='{top + plot_h}' x2='{left + plot_w}' y2='{top + plot_h}' stroke='#999'/>",
    ]
    for index, (name, before, util_before, after, util_after) in enumerate(groups):
        center = left + slot * (index + 0.5)
        for offset, gpus, utilization, light, dark, caption in (
            (-bar - 2, before, util_before, "#c7c7c7", "#6b6b6b", "now"),
            (2, after, util_after, "#a1d99b", "#2ca02c", "after"),
        ):
            x0 = center + offset
            full = gpus * scale
            busy = full * min(utilization, 1.0)
            y0 = top + plot_h - full
            parts.append(
                f"<rect x='{x0:.1f}' y='{y0:.1f}' width='{bar:.1f}' height='{full:.1f}' fill='{light}'>"
                f"<title>{escape(name)} {caption}: {gpus} GPUs, {utilization:.0%} busy</title></rect>"
            )
            parts.append(
                f"<rect x='{x0:.1f}' y='{top + plot_h - busy:.1f}' width='{bar:.1f}' "
                f"height='{busy:.1f}' fill='{dark}'/>"
            )
            parts.append(
                f"<text x='{x0 + bar / 2:.1f}' y='{y0 - 4:.1f}' text-anchor='middle'>{gpus}</text>"
            )
            parts.append(
                f"<text x='{x0 + bar / 2:.1f}' y='{top + plot_h + 13}' text-anchor='middle' "
                f"fill='#555'>{caption}</text>"
            )
            parts.append(
                f"<text x='{x0 + bar / 2:.1f}' y='{top + plot_h + 26}' text-anchor='middle' "
                f"fill='#555'>{utilization:.0%}</text>"
            )
        parts.append(
            f"<text x='{center:.1f}' y='{top + plot_h + 44}' text-anchor='middle' "
            f"font-weight='600'>{escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
