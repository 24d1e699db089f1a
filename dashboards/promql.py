"""Read a Grafana dashboard's queries the way Grafana would run them against Prometheus.

Pure functions on the dashboard JSON and on PromQL text: the panels' and annotations' queries,
the template variables, Grafana's variable substitution, and the metric names an expression
reads. Used by the tests (syntax, live data) and by the picture renderer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

Json = dict[str, Any]

GRAFANA_BUILTINS: Final = frozenset(
    {
        "__all",
        "__data",
        "__field",
        "__from",
        "__interval",
        "__interval_ms",
        "__range",
        "__range_ms",
        "__range_s",
        "__rate_interval",
        "__series",
        "__to",
        "__value",
    }
)
"""Grafana's own variables (and data-link fields) that a dashboard may use without defining."""

_VARIABLE: Final = re.compile(r"\$\{([\w.]+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)")
_LABEL_VALUES: Final = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*(\w+)\s*\)\s*$", re.DOTALL)
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS: Final = re.compile(r"\{[^}]*\}")
_RANGES: Final = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS: Final = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER: Final = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"offset", "bool", "atan2", "inf", "nan", "Inf", "NaN"}
)


@dataclass(frozen=True, slots=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str
    instant: bool
    max_points: int | None = None
    """The panel's maxDataPoints: Grafana's steps at most (else the panel's width in pixels)."""

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def panels(dashboard: Json) -> Iterator[Json]:
    """Every panel, rows included, and the panels nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: Json) -> list[PanelQuery]:
    """Every PromQL query the dashboard runs: panel targets and annotation queries."""
    title = dashboard["title"]
    found = [
        PanelQuery(
            title,
            panel["title"],
            target["refId"],
            target["expr"],
            bool(target.get("instant")),
            panel.get("maxDataPoints"),
        )
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]
    found.extend(
        PanelQuery(
            title,
            f"annotation {annotation['name']}",
            annotation["target"]["refId"],
            annotation["target"]["expr"],
            instant=False,
        )
        for annotation in dashboard.get("annotations", {}).get("list", [])
    )
    return found


def variables(dashboard: Json) -> list[Json]:
    return list(dashboard.get("templating", {}).get("list", []))


def variable_references(text: str) -> set[str]:
    """Names of the variables a string uses, in any of Grafana's syntaxes ($x, ${x:fmt}, [[x]])."""
    names = set()
    for match in _VARIABLE.finditer(text):
        name = next(group for group in match.groups() if group is not None)
        names.add(name.split(".", 1)[0])
    return names


def grafana_values(
    dashboard: Json, *, interval: float, scrape_seconds: float, range_seconds: float
) -> dict[str, str]:
    """What Grafana substitutes for the variables: "All" for each template variable, and the
    built-ins for a query `interval`, the data source's scrape interval and a time range."""
    rate_interval = max(interval + scrape_seconds, 4 * scrape_seconds)
    values = {
        "__rate_interval": _duration(rate_interval),
        "__interval": _duration(interval),
        "__interval_ms": f"{interval * 1000:.0f}",
        "__range": _duration(range_seconds),
        "__range_s": f"{range_seconds:.0f}",
        "__range_ms": f"{range_seconds * 1000:.0f}",
    }
    for variable in variables(dashboard):
        if variable["type"] == "query":
            values[variable["name"]] = variable["allValue"]
    return values


def _duration(seconds: float) -> str:
    """A PromQL duration: whole seconds, else whole milliseconds (PromQL has no fractions)."""
    milliseconds = round(seconds * 1000)
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Grafana's interpolation of `values` into a query; a variable not in `values` is an error."""

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group is not None)
        if name not in values:
            raise ValueError(f"no value for variable {name!r} in {text!r}")
        return values[name]

    return _VARIABLE.sub(replace, text)


def label_values(query: str) -> tuple[str, str]:
    """The (selector, label) of a `label_values(selector, label)` variable query."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return match[1], match[2]


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names a PromQL expression reads.

    A lexical reading, enough for the expressions gpuscope writes: strings, label matchers,
    ranges and label lists are removed, then every identifier that is not a function call or a
    keyword is a metric name. Substitute Grafana variables first."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    return {
        match[1]
        for match in _IDENTIFIER.finditer(text)
        if match[2] is None and match[1] not in _KEYWORDS
    }


_SORT: Final = re.compile(r"\s*(?:sort|sort_desc)\s*\(")
_BOUNDED: Final = re.compile(r"\s*(topk|bottomk)\s*\(\s*(\d+)\s*,")
_KEEPS_LEFT: Final = re.compile(
    r"\s*(?:[*/]\s*on\s*\([^)]*\)\s*group_left\s*\([^)]*\)|(?:and|unless)\b(?:\s*on\s*\([^)]*\))?)"
)
"""Operators whose result has at most one series per series of their left operand: a many-to-one
join (its right side unique per key, else the query fails) and the set filters."""
_OPERAND_HEAD: Final = re.compile(
    r"\s*(?:[A-Za-z_:][\w:]*)?\s*(?:\{[^}]*\})?\s*(?:(?:by|without)\s*\([^)]*\))?\s*"
)


def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis closing the one at `opening`, skipping quoted strings."""
    depth = 0
    index = opening
    while index < len(text):
        string = _STRING.match(text, index)
        if string:
            index = string.end()
            continue
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _operand_end(text: str, start: int) -> int | None:
    """Where the operand starting at `start` ends: a selector, or a call or aggregation with
    its parenthesized argument; None if none starts there."""
    head = _OPERAND_HEAD.match(text, start)
    end = head.end() if head else start
    if end < len(text) and text[end] == "(":
        end = _closing(text, end) + 1
        tail = re.compile(r"\s*(?:(?:by|without)\s*\([^)]*\))?").match(text, end)
        end = tail.end() if tail else end
    return end if text[start:end].strip() else None


def bound(expr: str) -> tuple[int, str] | None:
    """(k, key) when an instant query returns at most k series: it is `topk(k, key)` or
    `bottomk(k, key)`, maybe sorted, followed only by operators that keep at most one series per
    series on their left (many-to-one joins, `and`, `unless`); else None."""
    text = expr.strip()
    while (sort := _SORT.match(text)) and _closing(text, sort.end() - 1) == len(text) - 1:
        text = text[sort.end() : -1].strip()
    top = _BOUNDED.match(text)
    if top is None:
        return None
    close = _closing(text, text.index("(", top.start(1)))
    key = text[top.end() : close].strip()
    index = close + 1
    while text[index:].strip():
        keeps = _KEEPS_LEFT.match(text, index)
        if keeps is None:
            return None
        end = _operand_end(text, keeps.end())
        if end is None:
            return None
        index = end
    return int(top[2]), key
