"""The picture renderer on canned answers, where a live stack cannot choose the case: a window a
few seconds long (a stack just started, as the serving test's is), whose time ticks fall a few
pixels from the plot's left edge, under the value axis' lowest label."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import pytest

from dashboards.draw import Source, Window
from dashboards.fit import overlaps
from dashboards.render import draw_dashboard
from tests.helpers import ROOT

if TYPE_CHECKING:
    from dashboards.live import Prometheus

pytestmark = pytest.mark.timeout(120)
END: Final = 1_800_000_000.0


class CannedPrometheus:
    """Every query answers one series of zeros over the window."""

    def query(self, expr: str, *, at: float | None = None) -> dict[str, Any]:
        del expr
        return {"status": "success", "data": {"result": [{"metric": {}, "value": [at, "0"]}]}}

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> dict[str, Any]:
        del expr
        count = int((end - start) // step) + 1
        values = [[start + n * step, "0"] for n in range(count)]
        return {"status": "success", "data": {"result": [{"metric": {}, "values": values}]}}


@pytest.mark.parametrize("seconds", [9.2, 9.6, 18.5])
def test_a_time_label_near_the_left_edge_is_left_out(seconds: float) -> None:
    """A 9.2 s window put '-0.15m' under the value axis' '0' in three serving panels."""
    dashboard = json.loads((ROOT / "dashboards" / "serving.json").read_text(encoding="utf-8"))
    prometheus: Prometheus = CannedPrometheus()  # type: ignore[assignment]
    window = Window(start=END - seconds, end=END, step=1)
    figure = draw_dashboard(dashboard, Source(prometheus, window, 1))
    assert overlaps(figure, dashboard) == []
