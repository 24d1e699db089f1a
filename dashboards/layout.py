"""Where a dashboard's panels go and what surrounds them: the grid, the template variables, the
alert annotations and the dashboard itself, with the links and tags all four share."""

from __future__ import annotations

from typing import Final

from dashboards.panels import DATASOURCE, Json
from dashboards.queries import sel

SCHEMA_VERSION: Final = 39
"""Grafana 10.4 / 11 dashboard schema; newer Grafana versions migrate it on load."""
TAG: Final = "gpuscope"
_GRID_WIDTH: Final = 24


class Layout:
    """Places panels left to right in Grafana's 24-column grid, wrapping lines and numbering ids."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self._x = 0
        self._y = 0
        self._line_height = 0

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0

    def _id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "id": self._id(),
                "gridPos": {"h": 1, "w": _GRID_WIDTH, "x": 0, "y": self._y},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, width: int, height: int, panel: Json) -> None:
        if self._x + width > _GRID_WIDTH:
            self._newline()
        self.panels.append(
            {
                "id": self._id(),
                "gridPos": {"h": height, "w": width, "x": self._x, "y": self._y},
                **panel,
            }
        )
        self._x += width
        self._line_height = max(self._line_height, height)


def datasource_variable() -> Json:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def query_variable(
    name: str,
    label: str,
    selector: str,
    label_name: str,
    *,
    numeric: bool = False,
    description: str = "",
) -> Json:
    """A multi-value variable over a label's values, "All" matching everything (`.*`), sorted
    alphabetically or, for numbers such as GPU indexes, numerically; `description` is its
    tooltip, for a variable whose values are not simply every value of the label."""
    query = f"label_values({selector}, {label_name})"
    variable: Json = {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "query": query,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "hide": 0,
        "refresh": 2,
        "regex": "",
        "sort": 3 if numeric else 1,
    }
    if description:
        variable["description"] = description
    return variable


def alerts_annotation(matchers: str) -> Json:
    """Marks on the time axis where gpuscope alerts fired (Prometheus' ALERTS series)."""
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": "red",
        "name": "gpuscope alerts",
        "target": {
            "expr": "ALERTS{" + sel('alertstate="firing"', matchers) + "}",
            "interval": "1m",
            "refId": "Anno",
        },
        "titleFormat": "{{alertname}}",
        "textFormat": "{{severity}}: {{node}} GPU {{gpu}}",
        "tagKeys": "severity",
        "useValueForTime": False,
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[Json],
    layout: Layout,
    *,
    annotations: tuple[Json, ...] = (),
) -> Json:
    return {
        "annotations": {"list": list(annotations)},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": False,
                "keepTime": True,
                "tags": [TAG],
                "targetBlank": False,
                "title": "gpuscope",
                "tooltip": "",
                "type": "dashboards",
            }
        ],
        "panels": layout.panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": [TAG],
        "templating": {"list": [datasource_variable(), *variables]},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }
