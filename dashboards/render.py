"""Draw each dashboard as a PNG from live data, for the README: `python -m dashboards.render`.

There is no Grafana here, so this draws what Grafana would: every panel at its grid position
with its title, filled from the panel's own queries run against a real Prometheus — by default
the live stack the tests use (simulated nodes from tests/fixtures/fleets, scraped every second
for `--seconds`). Lines, stacked areas, stats, bar gauges, tables, state timelines and donuts
are drawn in Grafana's dark theme; a panel whose queries return nothing says "No data", as
Grafana would.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from dashboards import promql
from dashboards.live import ROOT, LiveStack, Prometheus
from dashboards.panels import value_field

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.axes import Axes

Json = dict[str, Any]

OUTPUT: Final = ROOT / "docs" / "dashboards"
UNIT_PX: Final = (60, 30)
"""Pixels per grid column and per grid row (Grafana's row height is 30 px)."""
DPI: Final = 100
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


# -- drawing --------------------------------------------------------------------------------------


def _minutes(value: float, _: object) -> str:
    """Time-axis ticks: minutes before the end of the window."""
    return "now" if abs(value) < 1e-9 else f"{value:g}m"


def _style(axes: Axes) -> None:
    axes.set_facecolor(PANEL)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.tick_params(colors=MUTED, labelsize=7, length=0)
    axes.grid(color=BORDER, linewidth=0.5)


def _no_data(axes: Axes, text: str = "No data") -> None:
    axes.set_axis_off()
    axes.text(
        0.5, 0.5, text, color=MUTED, ha="center", va="center", fontsize=10, transform=axes.transAxes
    )


def draw_timeseries(axes: Axes, panel: Json, source: Source, dashboard: Json) -> None:
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
        _no_data(axes)
        return
    _style(axes)
    base: dict[float, float] = {}
    for number, (name, points) in enumerate(lines[:16]):
        color = PALETTE[number % len(PALETTE)]
        times = [(t - source.window.end) / 60 for t, _ in points]
        values = [-v if any(p.search(name) for p in negative) else v for _, v in points]
        if any(p.search(name) for p in dashed):
            axes.plot(times, values, color=TEXT, linewidth=0.9, linestyle=(0, (4, 3)), label=name)
        elif stacked:
            lower = [base.get(t, 0.0) for t, _ in points]
            upper = [low + v for low, v in zip(lower, values, strict=True)]
            axes.fill_between(times, lower, upper, color=color, alpha=0.35, linewidth=0)
            axes.plot(times, upper, color=color, linewidth=1, label=name)
            base.update({t: up for (t, _), up in zip(points, upper, strict=True)})
        else:
            axes.plot(times, values, color=color, linewidth=1.1, label=name)
            axes.fill_between(times, values, color=color, alpha=0.06, linewidth=0)
    if defaults.get("min") is not None:
        axes.set_ylim(bottom=defaults["min"])
    if defaults.get("max") is not None:
        axes.set_ylim(top=defaults["max"] * 1.02)
    axes.yaxis.set_major_formatter(lambda value, _: format_value(value, unit))
    axes.xaxis.set_major_formatter(_minutes)
    axes.legend(
        loc="upper left",
        bbox_to_anchor=(0, -0.12),
        ncol=3,
        fontsize=6,
        frameon=False,
        labelcolor=TEXT,
        handlelength=1.2,
        borderaxespad=0,
    )


def draw_stat(axes: Axes, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    results = source.instant(dashboard, panel["targets"][0]["expr"])
    if not results:
        _no_data(axes)
        return
    axes.set_axis_off()
    values = [float(r["value"][1]) for r in results]
    text = "  ".join(format_value(v, defaults.get("unit", "short")) for v in values[:3])
    color = threshold_color(values[0], defaults.get("thresholds"))
    axes.text(
        0.5,
        0.45,
        text,
        color=color,
        ha="center",
        va="center",
        fontsize=22,
        weight="bold",
        transform=axes.transAxes,
    )


def draw_bargauge(axes: Axes, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    target = panel["targets"][0]
    results = source.instant(dashboard, target["expr"])
    if not results:
        _no_data(axes)
        return
    axes.set_axis_off()
    bars = [(legend(target["legendFormat"], r["metric"]), float(r["value"][1])) for r in results][
        :8
    ]
    top = defaults.get("max") or max(v for _, v in bars) or 1.0
    height = 1.0 / len(bars)
    for number, (name, value) in enumerate(bars):
        y = 1 - (number + 1) * height
        color = (
            threshold_color(value, defaults.get("thresholds"))
            if defaults.get("max") == 1
            else PALETTE[number % len(PALETTE)]
        )
        axes.add_patch(
            Rectangle(
                (0.32, y + height * 0.15),
                0.52,
                height * 0.7,
                color=BORDER,
                transform=axes.transAxes,
            )
        )
        axes.add_patch(
            Rectangle(
                (0.32, y + height * 0.15),
                0.52 * min(value / top, 1.0),
                height * 0.7,
                color=color,
                transform=axes.transAxes,
            )
        )
        axes.text(
            0.30,
            y + height / 2,
            name[:40],
            color=TEXT,
            ha="right",
            va="center",
            fontsize=7,
            transform=axes.transAxes,
        )
        axes.text(
            0.86,
            y + height / 2,
            format_value(value, defaults.get("unit", "short")),
            color=color,
            ha="left",
            va="center",
            fontsize=8,
            transform=axes.transAxes,
        )


def table_rows(panel: Json, source: Source, dashboard: Json) -> tuple[list[str], list[list[str]]]:
    """The merged table: label columns first, then one column per titled query."""
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
                found = mapped(value, maps.get(column, []))
                row[column] = found[0] if found else format_value(value, units.get(column, "short"))
    header = [renames.get(name, name) for name in shown]
    return header, [[row.get(name, "") for name in header] for row in rows]


def draw_table(axes: Axes, panel: Json, source: Source, dashboard: Json) -> None:
    header, rows = table_rows(panel, source, dashboard)
    if not rows:
        _no_data(axes)
        return
    axes.set_axis_off()
    line = 0.11
    fitting = max(int(0.95 / line) - 1, 1)
    widths = [
        max(len(header[c]), *(len(r[c]) for r in rows[:fitting])) + 2 for c in range(len(header))
    ]
    total = sum(widths)
    for row_number, row in enumerate([header, *rows[:fitting]]):
        y = 0.97 - row_number * line
        x = 0.0
        for column, cell in enumerate(row):
            axes.text(
                x,
                y,
                cell[:48],
                color=MUTED if row_number == 0 else TEXT,
                fontsize=6.5,
                va="top",
                weight="bold" if row_number == 0 else "normal",
                transform=axes.transAxes,
            )
            x += widths[column] / total
        if row_number == 0:
            axes.plot(
                [0, 1],
                [y - line * 0.75, y - line * 0.75],
                color=BORDER,
                linewidth=0.8,
                transform=axes.transAxes,
            )
    if len(rows) > fitting:
        axes.text(
            1,
            0.0,
            f"{len(rows)} rows",
            color=MUTED,
            fontsize=6,
            ha="right",
            transform=axes.transAxes,
        )


def draw_state_timeline(axes: Axes, panel: Json, source: Source, dashboard: Json) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    target = panel["targets"][0]
    results = source.series(dashboard, target["expr"])[:10]
    if not results:
        _no_data(axes, defaults.get("noValue", "No data"))
        return
    axes.set_facecolor(PANEL)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.tick_params(colors=MUTED, labelsize=6.5, length=0)
    box = axes.get_position()  # leave the left quarter for the row names, as Grafana does
    axes.set_position((box.x0 + box.width * 0.25, box.y0, box.width * 0.75, box.height))
    names = []
    for row, series in enumerate(results):
        names.append(legend(target["legendFormat"], series["metric"]))
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
    axes.set_xlim((source.window.start - source.window.end) / 60, 0)
    axes.set_ylim(len(results), 0)
    axes.set_yticks([row + 0.5 for row in range(len(results))], names)
    axes.xaxis.set_major_formatter(_minutes)


def draw_piechart(axes: Axes, panel: Json, source: Source, dashboard: Json) -> None:
    slices = [
        (legend(target["legendFormat"], r["metric"]), float(r["value"][1]))
        for target in panel["targets"]
        for r in source.instant(dashboard, target["expr"])
    ]
    if not any(value for _, value in slices):
        _no_data(axes)
        return
    axes.pie(
        [value for _, value in slices],
        labels=[f"{name} {value:g}" for name, value in slices],
        colors=PALETTE,
        wedgeprops={"width": 0.4, "edgecolor": PANEL},
        textprops={"color": TEXT, "fontsize": 7},
    )


DRAW: Final = {
    "timeseries": draw_timeseries,
    "stat": draw_stat,
    "bargauge": draw_bargauge,
    "table": draw_table,
    "state-timeline": draw_state_timeline,
    "piechart": draw_piechart,
}


def draw_dashboard(dashboard: Json, source: Source) -> Figure:
    panels = list(promql.panels(dashboard))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) + 2
    width, height = 24 * UNIT_PX[0], rows * UNIT_PX[1]
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor=BACKGROUND)
    pad = 4

    def box(grid: Json) -> tuple[float, float, float, float]:
        """A grid position in figure coordinates (left, bottom, width, height), below the title bar."""
        x, y = grid["x"] * UNIT_PX[0] + pad, (grid["y"] + 2) * UNIT_PX[1] + pad
        w, h = grid["w"] * UNIT_PX[0] - 2 * pad, grid["h"] * UNIT_PX[1] - 2 * pad
        return x / width, 1 - (y + h) / height, w / width, h / height

    figure.text(
        pad / width,
        1 - UNIT_PX[1] / height,
        dashboard["title"],
        color=TEXT,
        fontsize=15,
        weight="bold",
        va="center",
    )
    for panel in panels:
        left, bottom, w, h = box(panel["gridPos"])
        if panel["type"] == "row":
            figure.text(
                left,
                bottom + h / 2,
                f"⌄ {panel['title']}",
                color=TEXT,
                fontsize=11,
                weight="bold",
                va="center",
            )
            continue
        figure.patches.append(
            FancyBboxPatch(
                (left, bottom),
                w,
                h,
                boxstyle="round,pad=0,rounding_size=0.002",
                facecolor=PANEL,
                edgecolor=BORDER,
                linewidth=0.8,
                transform=figure.transFigure,
                zorder=-1,
                figure=figure,
            )
        )
        title_height = 22 / height
        figure.text(
            left + 8 / width,
            bottom + h - title_height / 2,
            panel["title"],
            color=TEXT,
            fontsize=8.5,
            weight="bold",
            va="center",
        )
        legend_room = 0.22 * h if panel["type"] == "timeseries" else 0.0
        inner = figure.add_axes(
            (
                left + 0.035 * w + 30 / width,
                bottom + 10 / height + legend_room,
                w * 0.93 - 30 / width,
                h - title_height - 18 / height - legend_room,
            )
        )
        DRAW[panel["type"]](inner, panel, source, dashboard)
    return figure


def render_all(
    prometheus: Prometheus, output: Path, *, seconds: float, scrape_seconds: float = 1.0
) -> list[Path]:
    """Draw every dashboard from the last `seconds` of data into `output`; the PNGs written."""
    output.mkdir(parents=True, exist_ok=True)
    end = time.time()
    window = Window(start=end - seconds, end=end, step=max(scrape_seconds, seconds / 240))
    written = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        figure = draw_dashboard(dashboard, Source(prometheus, window, scrape_seconds))
        target = output / f"{path.stem}.png"
        figure.savefig(target, facecolor=BACKGROUND, dpi=DPI)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds",
        type=float,
        default=300,
        help="how much live data to collect and draw (default 300)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=OUTPUT,
        help=f"where to write the PNGs (default {OUTPUT.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--prometheus", help="draw from this Prometheus instead of starting the simulated stack"
    )
    args = parser.parse_args(argv)
    # A stop request unwinds like Ctrl-C, so the stack below stops its daemons and Prometheus.
    signal.signal(signal.SIGTERM, lambda number, _: sys.exit(128 + number))
    if args.prometheus:
        written = render_all(
            Prometheus(args.prometheus.rstrip("/")), args.output, seconds=args.seconds
        )
    else:
        # The demo node's stand-ins (API server, kubelet) are test fixtures of the repository.
        from tests.demo_node import DEMO_NODES  # noqa: PLC0415

        with (
            tempfile.TemporaryDirectory(prefix="gpuscope-render-") as workdir,
            LiveStack(DEMO_NODES, Path(workdir)) as stack,
        ):
            stack.wait_for_scrapes(3)
            print(
                f"collecting {args.seconds:.0f} s of data from the simulated stack...", flush=True
            )
            time.sleep(args.seconds)
            written = render_all(stack.prometheus, args.output, seconds=args.seconds)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
