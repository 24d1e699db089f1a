"""Draw each dashboard as a PNG from live data, for the docs: `python -m dashboards.render`.

There is no Grafana here, so this draws what Grafana would: every panel at its grid position
with its title, filled from the panel's own queries run against a real Prometheus — by default
the live stack the tests use (simulated nodes from tests/fixtures/fleets, scraped every second
for `--seconds`). The panels are drawn by `draw.py` in Grafana's dark theme. A picture is written
only if it is legible: `fit.overlaps` finds no text leaving its panel or covering another.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from dashboards import promql
from dashboards.draw import BACKGROUND, BORDER, DRAW, PANEL, TEXT, Page, Source, Window
from dashboards.fit import grid_box, overlaps, picture_size, renderer
from dashboards.live import ROOT, LiveStack, Prometheus

Json = dict[str, Any]

OUTPUT: Final = ROOT / "docs" / "dashboards"
DPI: Final = 100
TITLE_PX: Final = 22
"""A panel's title bar."""
INSET_PX: Final = 8
"""Between a panel's edge and what it draws."""


class IllegibleError(RuntimeError):
    """A drawn dashboard has texts out of place; the message names each."""


def draw_dashboard(dashboard: Json, source: Source) -> Figure:
    size = picture_size(dashboard)
    figure = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI, facecolor=BACKGROUND)
    page = Page(figure, renderer(figure), size)
    figure.text(
        INSET_PX / size[0],
        1 - 30 / size[1],
        dashboard["title"],
        color=TEXT,
        fontsize=15,
        weight="bold",
        va="center",
    )
    for panel in promql.panels(dashboard):
        box = grid_box(panel["gridPos"], size)
        left, bottom, _, _ = box.fraction(size)
        if panel["type"] == "row":
            figure.text(
                left,
                (box.y0 + box.height / 2) / size[1],
                page.cut(f"⌄ {panel['title']}", box.width, 11, bold=True),
                color=TEXT,
                fontsize=11,
                weight="bold",
                va="center",
            )
            continue
        figure.patches.append(
            FancyBboxPatch(
                (left, bottom),
                box.width / size[0],
                box.height / size[1],
                boxstyle="round,pad=0,rounding_size=0.002",
                facecolor=PANEL,
                edgecolor=BORDER,
                linewidth=0.8,
                transform=figure.transFigure,
                zorder=-1,
                figure=figure,
            )
        )
        figure.text(
            (box.x0 + INSET_PX) / size[0],
            (box.y1 - TITLE_PX / 2) / size[1],
            page.cut(panel["title"], box.width - 2 * INSET_PX, 8.5, bold=True),
            color=TEXT,
            fontsize=8.5,
            weight="bold",
            va="center",
        )
        content = box.inset(left=INSET_PX, right=INSET_PX, top=TITLE_PX + 4, bottom=6)
        DRAW[panel["type"]](page, content, panel, source, dashboard)
    return figure


def save(dashboard: Json, source: Source, target: Path) -> Path:
    """Draw `dashboard` into the PNG `target`, if it is legible (else IllegibleError)."""
    figure = draw_dashboard(dashboard, source)
    problems = overlaps(figure, dashboard)
    if problems:
        listed = "\n  ".join(problems)
        raise IllegibleError(
            f"{dashboard['title']}: {len(problems)} texts out of place:\n  {listed}"
        )
    figure.savefig(target, facecolor=BACKGROUND, dpi=DPI)
    return target


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
        source = Source(prometheus, window, scrape_seconds)
        written.append(save(dashboard, source, output / f"{path.stem}.png"))
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
