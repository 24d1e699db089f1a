"""Where a drawn dashboard's texts may go, and whether they stay there: the picture's regions
(the title strip, each row's strip, each panel's box) in pixels from the grid, how wide a text
is, a text cut to a width, and `overlaps`, which finds every text of a drawn figure that leaves
its region or covers another text or a plot.

The check reads only what matplotlib drew (each text's extent as the renderer lays it out) and
the dashboard's grid, never how the renderer meant to place things, so it holds any layout to
the same rule: a picture in the docs is legible or it is not written.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any, Final

from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.font_manager import FontProperties
from matplotlib.text import Text

from dashboards import promql

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

Json = dict[str, Any]

UNIT_PX: Final = (60, 30)
"""Pixels per grid column and per grid row (Grafana's row height is 30 px)."""
TITLE_ROWS: Final = 2
"""Grid rows above the first panel: the dashboard's title."""
PAD_PX: Final = 4
"""Between a panel's grid cell and its box."""
SLACK_PX: Final = 0.5
"""What two extents may share, or a text may pass its region by: anti-aliasing, not overlap."""
ELLIPSIS: Final = "…"


@dataclass(frozen=True, slots=True)
class Box:
    """A rectangle in pixels, origin at the picture's bottom left (matplotlib's display space)."""

    x0: float
    y0: float
    x1: float
    y1: float

    @property
    def width(self) -> float:
        return self.x1 - self.x0

    @property
    def height(self) -> float:
        return self.y1 - self.y0

    def inset(self, *, left: float = 0, bottom: float = 0, right: float = 0, top: float = 0) -> Box:
        return Box(self.x0 + left, self.y0 + bottom, self.x1 - right, self.y1 - top)

    def contains(self, other: Box) -> bool:
        return (
            other.x0 >= self.x0 - SLACK_PX
            and other.y0 >= self.y0 - SLACK_PX
            and other.x1 <= self.x1 + SLACK_PX
            and other.y1 <= self.y1 + SLACK_PX
        )

    def covers(self, point: tuple[float, float]) -> bool:
        return self.x0 <= point[0] <= self.x1 and self.y0 <= point[1] <= self.y1

    def meets(self, other: Box) -> bool:
        """Whether the two share more than a hairline."""
        return (
            min(self.x1, other.x1) - max(self.x0, other.x0) > SLACK_PX
            and min(self.y1, other.y1) - max(self.y0, other.y0) > SLACK_PX
        )

    @property
    def centre(self) -> tuple[float, float]:
        return ((self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2)

    def fraction(self, size: tuple[float, float]) -> tuple[float, float, float, float]:
        """(left, bottom, width, height) as fractions of a picture of `size` pixels."""
        return (
            self.x0 / size[0],
            self.y0 / size[1],
            self.width / size[0],
            self.height / size[1],
        )


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    box: Box


def picture_size(dashboard: Json) -> tuple[int, int]:
    """The picture's width and height in pixels: the grid's 24 columns, its rows and the title."""
    panels = list(promql.panels(dashboard))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) + TITLE_ROWS
    return 24 * UNIT_PX[0], rows * UNIT_PX[1]


def grid_box(grid: Json, size: tuple[int, int]) -> Box:
    """A panel's box (its grid cell less the padding) in pixels."""
    left = grid["x"] * UNIT_PX[0] + PAD_PX
    top = size[1] - (grid["y"] + TITLE_ROWS) * UNIT_PX[1] - PAD_PX
    return Box(
        left,
        top - grid["h"] * UNIT_PX[1] + 2 * PAD_PX,
        left + grid["w"] * UNIT_PX[0] - 2 * PAD_PX,
        top,
    )


def regions(dashboard: Json) -> list[Region]:
    """The title strip, then every row's strip and panel's box, from the grid alone."""
    size = picture_size(dashboard)
    found = [Region(dashboard["title"], Box(0, size[1] - TITLE_ROWS * UNIT_PX[1], *size))]
    for panel in promql.panels(dashboard):
        kind = "row" if panel["type"] == "row" else "panel"
        found.append(Region(f"{kind} {panel['title']!r}", grid_box(panel["gridPos"], size)))
    return found


def renderer(figure: Figure) -> RendererAgg:
    """The figure's Agg renderer (a canvas is attached if it has none): what texts measure with."""
    canvas = (
        figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    )
    # matplotlib's Agg backend has no type annotations.
    drawer: RendererAgg = canvas.get_renderer()  # type: ignore[no-untyped-call]
    return drawer


def text_width(drawer: RendererAgg, text: str, size: float, *, bold: bool = False) -> float:
    """How many pixels `text` takes at `size` points."""
    font = FontProperties(size=size, weight="bold" if bold else "normal")
    width, _, _ = drawer.get_text_width_height_descent(  # type: ignore[no-untyped-call]
        text, font, ismath=False
    )
    return float(width)


def cut(drawer: RendererAgg, text: str, width: float, size: float, *, bold: bool = False) -> str:
    """`text`, or as much of it as fits `width` pixels followed by an ellipsis ("" if not even
    that fits)."""
    if text_width(drawer, text, size, bold=bold) <= width:
        return text
    low, high = 0, len(text)
    while low < high:  # the longest prefix whose cut form fits
        middle = (low + high + 1) // 2
        if text_width(drawer, text[:middle].rstrip() + ELLIPSIS, size, bold=bold) <= width:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + ELLIPSIS if low else ""


def _ticks_drawn(axis: Axis) -> list[Text]:
    """The tick labels an axis draws: those of ticks inside its view."""
    low, high = sorted(axis.get_view_interval())
    span = (high - low) or 1.0
    labels: list[Text] = []
    for tick in axis.get_major_ticks():
        if low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span:
            labels.extend(label for label in (tick.label1, tick.label2) if label.get_visible())
    return labels


def _every_tick_label(axes: Axes) -> set[int]:
    return {
        id(label)
        for axis in (axes.xaxis, axes.yaxis)
        for tick in (*axis.majorTicks, *axis.minorTicks)
        for label in (tick.label1, tick.label2)
    }


def drawn_texts(figure: Figure) -> list[Text]:
    """Every text the figure draws that shows something."""
    tick_labels: set[int] = set()
    texts: list[Text] = []
    for axes in figure.axes:
        axes.xaxis.get_majorticklabels()  # brings the ticks up to date with the view
        axes.yaxis.get_majorticklabels()
        tick_labels |= _every_tick_label(axes)
        if axes.axison:
            texts.extend(_ticks_drawn(axes.xaxis))
            texts.extend(_ticks_drawn(axes.yaxis))
    for artist in figure.findobj(Text):
        if id(artist) in tick_labels or not artist.get_visible() or not artist.get_text().strip():
            continue
        texts.append(artist)
    return texts


def overlaps(figure: Figure, dashboard: Json) -> list[str]:
    """Every text that leaves the region it is drawn in, covers another text of its region or
    covers a plot it does not belong to: one line each (empty when the picture is legible)."""
    drawer = renderer(figure)
    figure.draw_without_rendering()
    size = picture_size(dashboard)
    whole = Box(0, 0, *size)
    areas = regions(dashboard)
    # A plot's own annotations may sit on it; tick labels, legends and the rest may not.
    plots = [
        ({id(text) for text in axes.texts}, Box(*axes.get_window_extent(drawer).extents))
        for axes in figure.axes
        if axes.axison
    ]
    members: dict[str, list[tuple[Text, Box]]] = {region.name: [] for region in areas}
    problems = []
    for text in drawn_texts(figure):
        extent = Box(*text.get_window_extent(drawer).extents)
        label = repr(text.get_text())
        if not whole.contains(extent):
            problems.append(f"{label} runs off the picture")
            continue
        home = next((region for region in areas if region.box.covers(extent.centre)), None)
        if home is None:
            problems.append(f"{label} is between panels")
            continue
        if not home.box.contains(extent):
            problems.append(f"{label} runs out of {home.name}")
        members[home.name].append((text, extent))
        for own, plot in plots:
            if id(text) not in own and plot.meets(extent):
                problems.append(f"{label} covers a plot in {home.name}")
    for name, texts in members.items():
        for (first, one), (second, other) in combinations(texts, 2):
            if one.meets(other):
                problems.append(f"{first.get_text()!r} and {second.get_text()!r} overlap in {name}")
    return problems
