"""The panel layer of gpuscope's dashboards: one function per Grafana panel type, each returning
the panel's JSON with the look every dashboard shares.

Every panel and query uses the `${datasource}` variable (no uid is hard-coded); the layout gives
each panel its id and place (dashboards/layout.py). Plain dicts rather than grafana-foundation-sdk:
docs/guide/dashboards.md gives the trial's figures (no fewer lines, the same tsc check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

Json = dict[str, Any]

DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
GPU_HOURS: Final = "suffix: GPU-h"
"""The unit of hours summed over the range (queries.range_hours)."""
_REF_IDS: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True, slots=True)
class Column:
    """One value column of a table panel: an instant query whose labels join the other columns'."""

    title: str
    expr: str
    unit: str = "short"
    mappings: tuple[tuple[int, str, str], ...] = ()
    """(value, text, color) pairs shown instead of the number."""


@dataclass(frozen=True, slots=True)
class LabelColumn:
    """A label of a table's rows shown under a title of its own, its values as colored text."""

    label: str
    title: str
    mappings: tuple[tuple[str, str, str], ...] = ()
    """(value, text, color) triples."""


FLEET_POINTS: Final = 300
"""Steps at most for a fleet dashboard's time series (its maxDataPoints), each of which reads a
rollup series per node or workload at every step: 5 minutes apart over a day, the window of the
rates the rollups record; ranges up to 2.5 hours keep Grafana's own step."""
FLEET_ROWS: Final = 100
"""Rows at most of a fleet dashboard's table of allocations: with the variables at All on 1,000
nodes there are 64,000, which no one reads and which took the stores seconds to list. Each such
table is one query, topk of a series recorded for it with its other columns as labels (the
rows its description names, e.g. the busiest or the costliest); narrowed by the variables to
this many or fewer, it lists every allocation in scope."""


def _targets(
    queries: tuple[Query, ...], *, instant: bool = False, table: bool = False
) -> list[Json]:
    return [
        {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": query.expr,
            "format": "table" if table else "time_series",
            "instant": instant,
            "legendFormat": query.legend or "__auto",
            "range": not instant,
            "refId": _REF_IDS[number],
        }
        for number, query in enumerate(queries)
    ]


def steps(*pairs: tuple[str, float | None]) -> Json:
    """Absolute thresholds from (color, from value) pairs, the first from None (-infinity)."""
    return {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for color, value in pairs],
    }


GOOD: Final = steps(("green", None))
BAD_FROM_ONE: Final = steps(("green", None), ("red", 1))
_HIDDEN_LEGEND: Final = {
    "calcs": [],
    "displayMode": "list",
    "placement": "bottom",
    "showLegend": False,
}


def _mappings(pairs: tuple[tuple[int | str, str, str], ...]) -> list[Json]:
    if not pairs:
        return []
    return [
        {
            "type": "value",
            "options": {
                str(value): {"text": text, "color": color, "index": index}
                for index, (value, text, color) in enumerate(pairs)
            },
        }
    ]


def dashed(pattern: str) -> Json:
    """An override drawing the series whose name matches `pattern` as a dashed, unfilled line."""
    return {
        "matcher": {"id": "byRegexp", "options": pattern},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": "text"}},
        ],
    }


def negative_y(pattern: str) -> Json:
    """An override drawing the series whose name matches `pattern` below the axis (transmit
    under receive)."""
    return {
        "matcher": {"id": "byRegexp", "options": pattern},
        "properties": [{"id": "custom.transform", "value": "negative-Y"}],
    }


def timeseries(
    title: str,
    description: str,
    *queries: Query,
    unit: str = "short",
    minimum: float | None = 0,
    maximum: float | None = None,
    stack: bool = False,
    stepped: bool = False,
    overrides: tuple[Json, ...] = (),
    thresholds: Json | None = None,
    max_points: int | None = None,
) -> Json:
    """A time series panel; `max_points` caps the steps Grafana asks for (its maxDataPoints, else
    the panel's width in pixels), for a panel whose every step costs a series per workload."""
    defaults: Json = {
        "color": {"mode": "palette-classic"},
        "custom": {
            "axisBorderShow": False,
            "axisPlacement": "auto",
            "drawStyle": "line",
            "fillOpacity": 25 if stack else 8,
            "gradientMode": "none",
            "lineInterpolation": "stepAfter" if stepped else "linear",
            "lineWidth": 1,
            "pointSize": 4,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if stack else "none"},
            "thresholdsStyle": {"mode": "line" if thresholds else "off"},
        },
        "thresholds": thresholds or GOOD,
        "unit": unit,
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    panel: Json = {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(queries),
        "fieldConfig": {"defaults": defaults, "overrides": list(overrides)},
        "options": {
            "legend": {
                "calcs": [],
                "displayMode": "list",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }
    if max_points is not None:
        panel["maxDataPoints"] = max_points
    return panel


def stat(
    title: str,
    description: str,
    query: Query,
    *,
    unit: str = "short",
    thresholds: Json = GOOD,
    decimals: int | None = None,
    sparkline: bool = True,
    max_points: int | None = None,
) -> Json:
    """A single value; with a sparkline, its range query takes at most `max_points` steps (as
    timeseries' does)."""
    defaults: Json = {
        "color": {"mode": "thresholds"},
        "mappings": [],
        "thresholds": thresholds,
        "unit": unit,
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    panel: Json = {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        # Without a sparkline only the last value shows: one instant query, not one per step.
        "targets": _targets((query,), instant=not sparkline),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "colorMode": "value",
            "graphMode": "area" if sparkline else "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "percentChangeColorMode": "standard",
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        },
    }
    if sparkline and max_points is not None:
        panel["maxDataPoints"] = max_points
    return panel


def bargauge(
    title: str,
    description: str,
    query: Query,
    *,
    unit: str = "short",
    maximum: float | None = None,
    thresholds: Json = GOOD,
) -> Json:
    defaults: Json = {
        "color": {"mode": "continuous-GrYlRd" if maximum == 1 else "palette-classic"},
        "min": 0,
        "thresholds": thresholds,
        "unit": unit,
    }
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets((query,), instant=True),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "displayMode": "gradient",
            "legend": _HIDDEN_LEGEND,
            "maxVizHeight": 300,
            "minVizHeight": 16,
            "minVizWidth": 8,
            "namePlacement": "left",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
            "sizing": "auto",
            "valueMode": "color",
        },
    }


def value_field(number: int, queries: int) -> str:
    """The name Grafana gives the value of a table-format query: "Value" when the panel has one
    query, "Value #<refId>" when it has several."""
    return "Value" if queries == 1 else f"Value #{_REF_IDS[number]}"


def table(
    title: str,
    description: str,
    labels: tuple[str, ...],
    *columns: Column,
    label_columns: tuple[LabelColumn, ...] = (),
    links: dict[str, tuple[str, str]] | None = None,
    sort_by: str | None = None,
) -> Json:
    """Instant queries merged into one table on their shared labels: `labels` first, then the
    `label_columns` under their titles, then one column per query (a column with an empty title
    only contributes its labels)."""
    values = {value_field(n, len(columns)): c.title for n, c in enumerate(columns) if c.title}
    shown = [*labels, *(c.label for c in label_columns), *values]
    renames = {**{c.label: c.title for c in label_columns}, **values}
    overrides: list[Json] = [
        {
            "matcher": {"id": "byName", "options": column.title},
            "properties": [
                {"id": "mappings", "value": _mappings(column.mappings)},
                {"id": "custom.cellOptions", "value": {"type": "color-text"}},
            ],
        }
        for column in label_columns
        if column.mappings
    ]
    for column in columns:
        if not column.title:
            continue
        properties: list[Json] = [{"id": "unit", "value": column.unit}]
        if column.mappings:
            properties.append({"id": "mappings", "value": _mappings(column.mappings)})
            properties.append({"id": "custom.cellOptions", "value": {"type": "color-text"}})
        overrides.append(
            {"matcher": {"id": "byName", "options": column.title}, "properties": properties}
        )
    for field, (link_title, url) in (links or {}).items():
        overrides.append(
            {
                "matcher": {"id": "byName", "options": field},
                "properties": [{"id": "links", "value": [{"title": link_title, "url": url}]}],
            }
        )
    options: Json = {"cellHeight": "sm", "frameIndex": 0, "showHeader": True}
    if sort_by is not None:
        options["sortBy"] = [{"desc": True, "displayName": sort_by}]
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(tuple(Query(c.expr) for c in columns), instant=True, table=True),
        "fieldConfig": {
            "defaults": {
                "custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False},
                "thresholds": GOOD,
            },
            "overrides": overrides,
        },
        "options": options,
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "filterFieldsByName", "options": {"include": {"names": shown}}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {},
                    "indexByName": {name: index for index, name in enumerate(shown)},
                    "renameByName": renames,
                },
            },
        ],
    }


def state_timeline(
    title: str,
    description: str,
    query: Query,
    *,
    states: tuple[tuple[int, str, str], ...],
    no_value: str = "",
) -> Json:
    defaults: Json = {
        "color": {"mode": "thresholds"},
        "custom": {"fillOpacity": 80, "lineWidth": 0},
        "mappings": _mappings(states),
        "thresholds": GOOD,
    }
    if no_value:
        defaults["noValue"] = no_value
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets((query,)),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "alignValue": "left",
            "legend": _HIDDEN_LEGEND,
            "mergeValues": True,
            "rowHeight": 0.85,
            "showValue": "never",
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }


def piechart(title: str, description: str, *queries: Query) -> Json:
    return {
        "type": "piechart",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": _targets(queries, instant=True),
        "fieldConfig": {
            "defaults": {"color": {"mode": "palette-classic"}, "unit": "short"},
            "overrides": [],
        },
        "options": {
            "displayLabels": ["name", "value"],
            "legend": {
                "calcs": [],
                "displayMode": "list",
                "placement": "right",
                "showLegend": True,
                "values": ["value"],
            },
            "orientation": "auto",
            "pieType": "donut",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "sort": "desc",
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }
