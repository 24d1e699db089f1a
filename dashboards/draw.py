"""Each panel type drawn as Grafana's dark theme shows it, into its box of the picture, from the
panel's own queries: lines and stacked areas with their legend, stats, bar gauges, tables, state
timelines and donuts; a panel whose queries return nothing says "No data", as Grafana would.

Every drawer lays its panel out in pixels and measures its texts as the renderer draws them
(`fit.py`), so nothing leaves its panel or covers another text: a label too long for its room is
cut with an ellipsis, a legend or a table with more entries than fit shows those that fit and
says how many more there are, and a stat's number shrinks to its box.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from dashboards import promql
from dashboards.fit import Box, cut, text_width
from dashboards.panels import value_field

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure

    from dashboards.live import Prometheus

Json = dict[str, Any]

BACKGROUND: Final = "#111217"
PANEL: Final = "#181b1f"
BORDER: Final = "#2c3235"
TEXT: Final = "#ccccdc"
MUTED: Final = "#8e8e8e"
PALETTE: Final = (
    "#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c",
    "#5794f2", "#b877d9", "#705da0", "#37872d", "#fade2a",
)  # fmt: skip
NAMED_COLORS: Final = {
    "green": "#73bf69",
    "red": "#f2495c",
    "orange": "#ff9830",
    "blue": "#5794f2",
    "text": TEXT,
    "dark-orange": "#fa6400",
}
PX_PER_POINT: Final = 100 / 72
"""At the pictures' 100 dpi."""
LEGEND_POINTS: Final = 6.0
LEGEND_LINE_PX: Final = 10.0
LEGEND_SHARE: Final = 0.4
"""At most this much of a time series panel goes to its legend; the rest of it is summed up."""
TABLE_POINTS: Final = 6.5
TABLE_LINE_PX: Final = 14.0
TABLE_GAP_PX: Final = 10.0
TICK_POINTS: Final = 7.0
SERIES_LIMIT: Final = 16
"""Series drawn per time series panel, as a legible picture holds them."""


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    step: float


# -- numbers and labels ---------------------------------------------------------------------------


def _scaled(value: float, base: float, units: tuple[str, ...], suffix: str = "") -> str:
    index = 0
    while abs(value) >= base and index < len(units) - 1:
        value /= base
        index += 1
    return f"{value:.3g} {units[index]}{suffix}".strip()


def _seconds(value: float) -> str:
    return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"


_FORMATS: Final[dict[str, Callable[[float], str]]] = {
    "percentunit": lambda value: f"{value * 100:.3g}%",
    "bytes": lambda value: _scaled(value, 1024, ("B", "KiB", "MiB", "GiB", "TiB")),
    "Bps": lambda value: _scaled(value, 1000, ("B", "kB", "MB", "GB", "TB"), "/s"),
    "watt": lambda value: _scaled(value, 1000, ("W", "kW", "MW")),
    "celsius": lambda value: f"{value:.3g} °C",
    "hertz": lambda value: _scaled(value, 1000, ("Hz", "kHz", "MHz", "GHz")),
    "currencyUSD": lambda value: f"${value:,.2f}",
    "s": _seconds,
    "ops": lambda value: f"{value:.3g} ops/s",
    "dateTimeAsIso": lambda value: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value / 1000)),
}


def format_value(value: float, unit: str) -> str:
    """A value as Grafana shows it, for the units the dashboards use."""
    if math.isnan(value):
        return "NaN"
    if unit.startswith("suffix:"):
        return f"{value:.3g} {unit.removeprefix('suffix:').strip()}"
    formatter = _FORMATS.get(unit)
    return formatter(value) if formatter is not None else f"{value:.4g}"


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: `{{label}}` replaced by the series' label value."""
    if template in {"", "__auto"}:
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return f"{labels.get('__name__', '')}{{{inner}}}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template).strip()


def threshold_color(value: float, thresholds: Json | None) -> str:
    color = NAMED_COLORS["green"]
    for step in (thresholds or {}).get("steps", []):
        if step["value"] is None or value >= step["value"]:
            color = NAMED_COLORS.get(step["color"], step["color"])
    return color


def mapped(value: float, mappings: list[Json]) -> tuple[str, str] | None:
    for mapping in mappings:
        option = mapping.get("options", {}).get(f"{value:g}")
        if option is not None:
            return option["text"], NAMED_COLORS.get(option.get("color", "text"), TEXT)
    return None


# -- data -----------------------------------------------------------------------------------------


class Source:
    """Runs a dashboard's queries with Grafana's substitutions for one time window."""

    def __init__(self, prometheus: Prometheus, window: Window, scrape_seconds: float) -> None:
        self.prometheus = prometheus
        self.window = window
        self.scrape_seconds = scrape_seconds

    def values(self, dashboard: Json) -> dict[str, str]:
        return promql.grafana_values(
            dashboard,
            interval=max(self.window.step, self.scrape_seconds),
            scrape_seconds=self.scrape_seconds,
            range_seconds=self.window.end - self.window.start,
        )

    def instant(self, dashboard: Json, expr: str) -> list[Json]:
        answer = self.prometheus.query(
            promql.substitute(expr, self.values(dashboard)), at=self.window.end
        )
        result: list[Json] = (
            answer.get("data", {}).get("result", []) if answer["status"] == "success" else []
        )
        return result

    def series(self, dashboard: Json, expr: str) -> list[Json]:
        answer = self.prometheus.query_range(
            promql.substitute(expr, self.values(dashboard)),
            start=self.window.start,
            end=self.window.end,
            step=self.window.step,
        )
        result: list[Json] = (
            answer.get("data", {}).get("result", []) if answer["status"] == "success" else []
        )
        return result


# -- the page a panel is drawn on -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """The figure a dashboard is drawn on, its renderer (what texts are measured with) and its
    size in pixels."""

    figure: Figure
    drawer: RendererAgg
    size: tuple[int, int]

    def axes(self, box: Box) -> Axes:
        """Axes filling `box`."""
        return self.figure.add_axes(box.fraction(self.size))

    def sheet(self, box: Box) -> Axes:
        """Axes without axis filling `box` whose data coordinates are its pixels, origin at the
        top left: where tables, gauges and legends are laid out."""
        axes = self.axes(box)
        axes.set_axis_off()
        axes.set_xlim(0, box.width)
        axes.set_ylim(box.height, 0)
        return axes

    def width(self, text: str, points: float, *, bold: bool = False) -> float:
        return text_width(self.drawer, text, points, bold=bold)

    def cut(self, text: str, width: float, points: float, *, bold: bool = False) -> str:
        return cut(self.drawer, text, width, points, bold=bold)


def no_data(page: Page, box: Box, text: str = "No data") -> None:
    page.sheet(box).text(
        box.width / 2, box.height / 2, text, color=MUTED, ha="center", va="center", fontsize=10
    )


def _minutes(page: Page, axes: Axes) -> FuncFormatter:
    """Time-axis ticks: minutes before the end of the window; a tick whose label would reach
    left of the plot unlabelled (it would run under the value axis' lowest label), the window's
    left edge among them."""

    def label(value: float, _: object) -> str:
        if abs(value) < 1e-9:
            return "now"
        text = f"{value:g}m"
        tick = axes.transData.transform((value, 0.0))[0]
        plot = axes.get_window_extent(page.drawer)
        return "" if tick - page.width(text, TICK_POINTS) / 2 < plot.x0 else text

    return FuncFormatter(label)


def _style(axes: Axes) -> None:
    axes.set_facecolor(PANEL)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.tick_params(colors=MUTED, labelsize=TICK_POINTS, length=0)


def fit_axes(page: Page, axes: Axes, room: Box, *, value_axis: bool = True) -> None:
    """Shrink `axes` until its tick labels (and whatever else it draws around its plot) fit
    `room`, with a time tick every 80 px at most and, on a value axis, a value tick every 28 px
    at most, so that labels never touch (a timeline's rows keep the ticks they have)."""
    # Round numbers (and halves, fifths of one) as Grafana's axes have them: -4m, never -4.8m.
    round_steps = [1, 2, 2.5, 5, 10]

    def space_ticks(plot: Box) -> None:
        axes.xaxis.set_major_locator(
            MaxNLocator(nbins=max(2, int(plot.width // 80)), steps=round_steps)
        )
        if value_axis:
            axes.yaxis.set_major_locator(
                MaxNLocator(nbins=max(2, int(plot.height // 28)), steps=round_steps)
            )

    space_ticks(room)
    axes.set_position(room.fraction(page.size))
    # Tick labels change as the plot shrinks, and the ticks are spaced for the plot it shrank
    # to (spaced for the whole room, they crowd a plot that its labels made smaller); three
    # rounds settle them.
    for _ in range(3):
        tight = axes.get_tightbbox(page.drawer)
        inner = axes.get_window_extent(page.drawer)
        if tight is None:
            return
        plot = room.inset(
            left=max(inner.x0 - tight.x0, 0) + 2,
            bottom=max(inner.y0 - tight.y0, 0) + 2,
            right=max(tight.x1 - inner.x1, 0) + 2,
            top=max(tight.y1 - inner.y1, 0) + 2,
        )
        space_ticks(plot)
        axes.set_position(plot.fraction(page.size))


def draw_legend(page: Page, box: Box, entries: Sequence[tuple[str, str, bool]]) -> float:
    """Grafana's list legend along the bottom of `box`, left to right in columns as wide as the
    widest name, at most `LEGEND_SHARE` of the box high (the rest summed up as "+N more");
    entries are (name, colour, dashed). The height it took, in pixels."""
    if not entries:
        return 0.0
    handle, gap, spacing = 12.0, 4.0, 12.0
    names = [page.cut(name, box.width - handle - gap, LEGEND_POINTS) for name, _, _ in entries]
    column = max(page.width(name, LEGEND_POINTS) for name in names) + handle + gap + spacing
    columns = max(1, min(len(names), int((box.width + spacing) // column)))
    rows = math.ceil(len(names) / columns)
    most = max(1, int(box.height * LEGEND_SHARE // LEGEND_LINE_PX))
    shown = list(zip(names, entries, strict=True))
    more = 0
    if rows > most:
        rows = most
        more = len(names) - (most * columns - 1)
        shown = shown[: most * columns - 1]
    height = rows * LEGEND_LINE_PX
    area = Box(box.x0, box.y0, box.x1, box.y0 + height)
    sheet = page.sheet(area)
    for index, (name, (_, color, dashed)) in enumerate(shown):
        x, y = (index % columns) * column, (index // columns + 0.5) * LEGEND_LINE_PX
        style = (0, (2, 1.5)) if dashed else "-"
        sheet.plot([x, x + handle - 2], [y, y], color=color, linewidth=1.5, linestyle=style)
        sheet.text(x + handle + gap - 2, y, name, color=TEXT, fontsize=LEGEND_POINTS, va="center")
    if more:
        index = len(shown)
        x, y = (index % columns) * column, (index // columns + 0.5) * LEGEND_LINE_PX
        sheet.text(x, y, f"+{more} more", color=MUTED, fontsize=LEGEND_POINTS, va="center")
    return height


# -- the panels -----------------------------------------------------------------------------------


def draw_timeseries(page: Page, box: Box, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    unit = defaults.get("unit", "short")
    stacked = defaults["custom"]["stacking"]["mode"] != "none"
    dashed = [
        re.compile(o["matcher"]["options"].strip("/"))
        for o in panel["fieldConfig"]["overrides"]
        if any(p["id"] == "custom.lineStyle" for p in o["properties"])
    ]
    negative = [
        re.compile(o["matcher"]["options"].strip("/"))
        for o in panel["fieldConfig"]["overrides"]
        if any(p["id"] == "custom.transform" for p in o["properties"])
    ]
    lines = []
    for target in panel["targets"]:
        for series in source.series(dashboard, target["expr"]):
            points = [(float(t), float(v)) for t, v in series["values"]]
            lines.append((legend(target["legendFormat"], series["metric"]), points))
    if not lines:
        no_data(page, box)
        return
    entries = []
    for number, (name, _) in enumerate(lines[:SERIES_LIMIT]):
        is_dashed = any(p.search(name) for p in dashed)
        entries.append((name, TEXT if is_dashed else PALETTE[number % len(PALETTE)], is_dashed))
    legend_height = draw_legend(page, box, entries)
    room = box.inset(bottom=legend_height + 4 if legend_height else 0)
    axes = page.axes(room)
    _style(axes)
    axes.grid(color=BORDER, linewidth=0.5)
    base: dict[float, float] = {}
    for (name, points), (_, color, is_dashed) in zip(lines, entries, strict=False):
        times = [(t - source.window.end) / 60 for t, _ in points]
        values = [-v if any(p.search(name) for p in negative) else v for _, v in points]
        if is_dashed:
            axes.plot(times, values, color=color, linewidth=0.9, linestyle=(0, (4, 3)))
        elif stacked:
            lower = [base.get(t, 0.0) for t, _ in points]
            upper = [low + v for low, v in zip(lower, values, strict=True)]
            axes.fill_between(times, lower, upper, color=color, alpha=0.35, linewidth=0)
            axes.plot(times, upper, color=color, linewidth=1)
            base.update({t: up for (t, _), up in zip(points, upper, strict=True)})
        else:
            axes.plot(times, values, color=color, linewidth=1.1)
            axes.fill_between(times, values, color=color, alpha=0.06, linewidth=0)
    if defaults.get("min") is not None:
        axes.set_ylim(bottom=defaults["min"])
    if defaults.get("max") is not None:
        axes.set_ylim(top=defaults["max"] * 1.02)
    left = (source.window.start - source.window.end) / 60
    axes.set_xlim(left, 0)
    axes.yaxis.set_major_formatter(lambda value, _: format_value(value, unit))
    axes.xaxis.set_major_formatter(_minutes(page, axes))
    fit_axes(page, axes, room)


def draw_stat(page: Page, box: Box, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    results = source.instant(dashboard, panel["targets"][0]["expr"])
    if not results:
        no_data(page, box)
        return
    values = [float(r["value"][1]) for r in results]
    text = "  ".join(format_value(v, defaults.get("unit", "short")) for v in values[:3])
    color = threshold_color(values[0], defaults.get("thresholds"))
    points = 22.0
    width = page.width(text, points, bold=True)
    points *= min(1.0, 0.92 * box.width / width, 0.7 * box.height / (points * PX_PER_POINT))
    page.sheet(box).text(
        box.width / 2,
        box.height * 0.55,
        text,
        color=color,
        ha="center",
        va="center",
        fontsize=points,
        weight="bold",
    )


def draw_bargauge(page: Page, box: Box, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    unit = defaults.get("unit", "short")
    target = panel["targets"][0]
    results = source.instant(dashboard, target["expr"])
    if not results:
        no_data(page, box)
        return
    bars = [(legend(target["legendFormat"], r["metric"]), float(r["value"][1])) for r in results]
    bars = bars[:8]
    slot = box.height / len(bars)
    name_points = min(7.0, 0.55 * slot / PX_PER_POINT)
    value_points = min(8.0, 0.6 * slot / PX_PER_POINT)
    names = [page.cut(name, 0.36 * box.width, name_points) for name, _ in bars]
    values = [format_value(value, unit) for _, value in bars]
    name_width = max(page.width(name, name_points) for name in names)
    value_width = max(page.width(value, value_points) for value in values)
    start, end = name_width + 8, box.width - value_width - 8
    top = defaults.get("max") or max(v for _, v in bars) or 1.0
    sheet = page.sheet(box)
    for number, ((_, value), name, shown) in enumerate(zip(bars, names, values, strict=True)):
        y = number * slot
        color = (
            threshold_color(value, defaults.get("thresholds"))
            if defaults.get("max") == 1
            else PALETTE[number % len(PALETTE)]
        )
        bar = (start, y + slot * 0.15)
        sheet.add_patch(Rectangle(bar, end - start, slot * 0.7, color=BORDER))
        filled = (end - start) * max(min(value / top, 1.0), 0.0)
        sheet.add_patch(Rectangle(bar, filled, slot * 0.7, color=color))
        middle = y + slot / 2
        sheet.text(
            name_width, middle, name, color=TEXT, ha="right", va="center", fontsize=name_points
        )
        sheet.text(end + 6, middle, shown, color=color, va="center", fontsize=value_points)


def table_rows(panel: Json, source: Source, dashboard: Json) -> tuple[list[str], list[list[str]]]:
    """The merged table: label columns first, then one column per titled query, sorted as the
    panel says (by a column's values; rows without one last)."""
    shown = panel["transformations"][1]["options"]["include"]["names"]
    renames = panel["transformations"][2]["options"]["renameByName"]
    values = {value_field(n, len(panel["targets"])) for n in range(len(panel["targets"]))}
    labels = [name for name in shown if name not in values]  # some renamed: label columns
    units = {
        o["matcher"]["options"]: next(
            (p["value"] for p in o["properties"] if p["id"] == "unit"), "short"
        )
        for o in panel["fieldConfig"]["overrides"]
    }
    maps: dict[str, list[Json]] = {
        o["matcher"]["options"]: next(
            (p["value"] for p in o["properties"] if p["id"] == "mappings"), []
        )
        for o in panel["fieldConfig"]["overrides"]
    }
    rows: list[dict[str, str]] = []
    numbers: dict[int, dict[str, float]] = {}  # by id of the row: what its columns show
    for number, target in enumerate(panel["targets"]):
        column = renames.get(value_field(number, len(panel["targets"])))
        for result in source.instant(dashboard, target["expr"]):
            keys = {label: result["metric"][label] for label in labels if label in result["metric"]}
            row = next((r for r in rows if all(r.get(k, v) == v for k, v in keys.items())), None)
            if row is None:
                row = {}
                rows.append(row)
            row.update(keys)
            for label, text in keys.items():  # a label column's mapping, as Grafana applies it
                name = renames.get(label, label)
                options = [m.get("options", {}).get(text) for m in maps.get(name, [])]
                row[name] = next((o["text"] for o in options if o is not None), text)
            if column:
                value = float(result["value"][1])
                numbers.setdefault(id(row), {})[column] = value
                found = mapped(value, maps.get(column, []))
                row[column] = found[0] if found else format_value(value, units.get(column, "short"))
    for order in panel.get("options", {}).get("sortBy", [])[:1]:
        sign = -1.0 if order.get("desc") else 1.0
        name = order["displayName"]
        rows.sort(
            key=lambda row: (
                name not in numbers.get(id(row), {}),
                sign * numbers.get(id(row), {}).get(name, 0.0),
            )
        )
    header = [renames.get(name, name) for name in shown]
    return header, [[row.get(name, "") for name in header] for row in rows]


def _header_lines(page: Page, title: str) -> list[str]:
    """A column title on one line, or split on its spaces into the two most even lines."""
    words = title.split()
    if len(words) < 2:
        return [title]
    splits = [[" ".join(words[:n]), " ".join(words[n:])] for n in range(1, len(words))]
    return min(
        splits, key=lambda lines: max(page.width(line, TABLE_POINTS, bold=True) for line in lines)
    )


def column_widths(natural: Sequence[float], room: float) -> list[float]:
    """Each column's width in `room` pixels: what each needs, spread out in proportion when
    there is room to spare; when there is not, the narrow columns keep what they need and the
    wide ones share the rest equally (their texts are cut to it)."""
    total = sum(natural)
    if total <= room:
        return [width * room / total for width in natural]
    kept: set[int] = set()
    while True:
        open_columns = [n for n in range(len(natural)) if n not in kept]
        share = (room - sum(natural[n] for n in kept)) / max(len(open_columns), 1)
        fitting = {n for n in open_columns if natural[n] <= share}
        if not fitting:
            return [natural[n] if n in kept else share for n in range(len(natural))]
        kept |= fitting


def draw_table(page: Page, box: Box, panel: Json, source: Source, dashboard: Json) -> None:
    header, rows = table_rows(panel, source, dashboard)
    if not rows:
        no_data(page, box)
        return
    sheet = page.sheet(box)
    cells = [max(page.width(row[c], TABLE_POINTS) for row in rows) for c in range(len(header))]
    single = [page.width(title, TABLE_POINTS, bold=True) for title in header]
    wrapped = [_header_lines(page, title) for title in header]
    natural = [max(title, cell) + TABLE_GAP_PX for title, cell in zip(single, cells, strict=True)]
    if sum(natural) > box.width:  # titles go on two lines before any text is cut
        natural = [
            max(*(page.width(line, TABLE_POINTS, bold=True) for line in lines), cell) + TABLE_GAP_PX
            for lines, cell in zip(wrapped, cells, strict=True)
        ]
    widths = column_widths(natural, box.width)
    titles = [
        [title] if single[c] + TABLE_GAP_PX <= widths[c] else wrapped[c]
        for c, title in enumerate(header)
    ]
    header_height = max(len(lines) for lines in titles) * LEGEND_LINE_PX + 4
    fitting = int((box.height - header_height - 2) // TABLE_LINE_PX)
    if len(rows) > fitting:  # the last line says how many rows there are
        fitting = max(fitting - 1, 0)
        sheet.text(
            box.width,
            box.height,
            f"{len(rows)} rows",
            color=MUTED,
            fontsize=6,
            ha="right",
            va="bottom",
        )
    x = 0.0
    for column, width in enumerate(widths):
        room = width - TABLE_GAP_PX
        for line_number, line in enumerate(titles[column]):
            sheet.text(
                x,
                2 + line_number * LEGEND_LINE_PX,
                page.cut(line, room, TABLE_POINTS, bold=True),
                color=MUTED,
                fontsize=TABLE_POINTS,
                va="top",
                weight="bold",
            )
        for row_number, row in enumerate(rows[:fitting]):
            sheet.text(
                x,
                header_height + 4 + row_number * TABLE_LINE_PX,
                page.cut(row[column], room, TABLE_POINTS),
                color=TEXT,
                fontsize=TABLE_POINTS,
                va="top",
            )
        x += width
    sheet.plot([0, box.width], [header_height, header_height], color=BORDER, linewidth=0.8)


def draw_state_timeline(page: Page, box: Box, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    target = panel["targets"][0]
    results = source.series(dashboard, target["expr"])[:10]
    if not results:
        no_data(page, box, defaults.get("noValue", "No data"))
        return
    axes = page.axes(box)
    _style(axes)
    points = min(6.5, 0.6 * (box.height - 16) / len(results) / PX_PER_POINT)
    names = []
    for row, series in enumerate(results):
        name = legend(target["legendFormat"], series["metric"])
        names.append(page.cut(name, 0.3 * box.width, points))
        for t, v in series["values"]:
            found = mapped(float(v), defaults.get("mappings", []))
            color = found[1] if found else NAMED_COLORS["green"]
            axes.add_patch(
                Rectangle(
                    ((float(t) - source.window.end) / 60, row + 0.1),
                    source.window.step / 60,
                    0.8,
                    color=color,
                    linewidth=0,
                )
            )
    left = (source.window.start - source.window.end) / 60
    axes.set_xlim(left, 0)
    axes.set_ylim(len(results), 0)
    axes.set_yticks([row + 0.5 for row in range(len(results))], names, fontsize=points)
    axes.xaxis.set_major_formatter(_minutes(page, axes))
    fit_axes(page, axes, box, value_axis=False)


def draw_piechart(page: Page, box: Box, panel: Json, source: Source, dashboard: Json) -> None:
    slices = [
        (legend(target["legendFormat"], r["metric"]), float(r["value"][1]))
        for target in panel["targets"]
        for r in source.instant(dashboard, target["expr"])
    ]
    if not any(value for _, value in slices):
        no_data(page, box)
        return
    side = min(box.height, box.width * 0.55)
    donut = Box(box.x0, box.y1 - side, box.x0 + side, box.y1)
    axes = page.axes(donut)
    colors = [PALETTE[n % len(PALETTE)] for n in range(len(slices))]
    axes.pie(
        [value for _, value in slices],
        colors=colors,
        wedgeprops={"width": 0.4, "edgecolor": PANEL},
    )
    # Grafana's legend beside the donut: a swatch, the name and the value, one a line.
    rows = max(1, int(box.height // 12))
    shown = slices if len(slices) <= rows else slices[: rows - 1]
    area = Box(donut.x1 + 12, box.y0, box.x1, box.y1)
    sheet = page.sheet(area)
    top = max((area.height - len(shown) * 12) / 2, 0)
    for number, ((name, value), color) in enumerate(zip(shown, colors, strict=False)):
        y = top + number * 12 + 6
        sheet.add_patch(Rectangle((0, y - 3.5), 7, 7, color=color))
        label = page.cut(f"{name} {value:g}", area.width - 12, 7)
        sheet.text(12, y, label, color=TEXT, fontsize=7, va="center")
    if len(shown) < len(slices):
        sheet.text(
            12,
            top + len(shown) * 12 + 6,
            f"+{len(slices) - len(shown)} more",
            color=MUTED,
            fontsize=7,
            va="center",
        )


DRAW: Final[dict[str, Callable[[Page, Box, Json, Source, Json], None]]] = {
    "timeseries": draw_timeseries,
    "stat": draw_stat,
    "bargauge": draw_bargauge,
    "table": draw_table,
    "state-timeline": draw_state_timeline,
    "piechart": draw_piechart,
}
