"""gpuscope's rules and dashboards on VictoriaMetrics give what they give on Prometheus.

The same two hours of the demo nodes' series (tests/victoria_stack.py) sit in a real Prometheus
and a real VictoriaMetrics (Debian's packages). vmalert evaluates every rule file over the last
half hour against each store, every 15 s, writing recording rules' results back into the store it
read (`dashboards/victoria.py`'s replay: one rule level after another, so a rule reading another's
results finds them). Then every recorded series, every panel and annotation query of every
dashboard (with Grafana's substitutions) and every variable's label values must be the same in
both: the same series, the same timestamps, the same values. vmalert also runs live against
VictoriaMetrics until every rule has been evaluated without error.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Final

import pytest

from dashboards import promql
from dashboards.live import Prometheus
from dashboards.panels import FLEET_ROWS
from dashboards.queries import selected_only
from dashboards.victoria import Vmalert, replay
from tests.dashboard_queries import recorded_names
from tests.dashboard_queries import rules as every_rule
from tests.helpers import ROOT, eventually
from tests.victoria_stack import GRID, QUERY_PHASE, demo_history, stores

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from dashboards.victoria import VictoriaMetrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPLAYED_SECONDS: Final = 30 * 60
"""How far back from the history's end vmalert evaluates the rules."""
RANGE_SECONDS: Final = 15 * 60
"""The dashboards' time range in the comparison ($__range, and the span of range queries)."""
SERVED_ELSEWHERE: Final = {"rightsizing.json"}
"""Its series come from `gpuscope rightsize serve` (tests/test_rightsize_server.py)."""


class Stores:
    def __init__(self, prometheus: Prometheus, victoria: VictoriaMetrics, end: float) -> None:
        self.prometheus = prometheus
        self.victoria = victoria
        self.last_rule = end // GRID * GRID
        """The last instant vmalert evaluated the rules at (on the grid)."""
        self.first_rule = self.last_rule - REPLAYED_SECONDS
        self.at = self.last_rule + QUERY_PHASE
        """When the dashboards' queries are asked (between samples and rule results)."""

    def both(self) -> tuple[Prometheus, Prometheus]:
        return self.prometheus, self.victoria.api


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    root = tmp_path_factory.mktemp("victoria-demo")
    history = demo_history(root)
    with stores(root, history) as (prometheus, victoria):
        found = Stores(Prometheus(prometheus), victoria, history.end)
        for name, url in (("prometheus", prometheus), ("victoria", victoria.url)):
            replay(
                root / f"replay-{name}",
                datasource=url,
                start=found.first_rule,
                end=found.last_rule,
                interval=f"{GRID}s",
            )
        yield found


def _table(answer: dict[str, Any]) -> dict[str, dict[float, str]]:
    """An answer's series by their labels: {labels: {time: value}} (instant or range)."""
    assert answer.get("status") == "success", answer.get("error")
    table: dict[str, dict[float, str]] = {}
    for series in answer["data"]["result"]:
        points = series.get("values") or [series["value"]]
        key = json.dumps(series["metric"], sort_keys=True)
        table[key] = {round(float(t), 3): value for t, value in points}
    return table


def _same(prometheus: dict[str, Any], victoria: dict[str, Any], what: str) -> None:
    expected, found = _table(prometheus), _table(victoria)
    assert found.keys() == expected.keys(), (
        f"{what}: only in Prometheus {sorted(expected.keys() - found.keys())[:3]}, "
        f"only in VictoriaMetrics {sorted(found.keys() - expected.keys())[:3]}"
    )
    for labels, points in expected.items():
        assert found[labels].keys() == points.keys(), f"{what} {labels}: other timestamps"
        for t, value in points.items():
            a, b = float(value), float(found[labels][t])
            # Equal to float64 rounding (time() - a timestamp loses 1e-6 s either way).
            assert (
                a == b
                or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-5)
                or (math.isnan(a) and math.isnan(b))
            ), f"{what} {labels} at {t}: Prometheus {value}, VictoriaMetrics {found[labels][t]}"


RECORDED: Final = sorted(recorded_names())


@pytest.mark.parametrize("name", RECORDED)
def test_recording_rule_results_are_the_same(demo: Stores, name: str) -> None:
    prometheus, victoria = (
        store.query_range(name, start=demo.first_rule, end=demo.last_rule, step=GRID)
        for store in demo.both()
    )
    _same(prometheus, victoria, name)


def test_the_rules_record_most_series(demo: Stores) -> None:
    """The comparison is not of empty answers: most recording rules have results (the demo
    nodes serve no inference server's series, for instance)."""
    empty = [
        name
        for name in RECORDED
        if not demo.victoria.api.query(f"count(last_over_time({name}[10m]))", at=demo.at)["data"][
            "result"
        ]
    ]
    assert len(empty) <= len(RECORDED) // 2, empty


def _dashboards() -> list[dict[str, Any]]:
    return [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "dashboards").glob("*.json"))
        if path.name not in SERVED_ELSEWHERE
    ]


def _values(dashboard: dict[str, Any]) -> dict[str, str]:
    return promql.grafana_values(
        dashboard, interval=GRID, scrape_seconds=GRID, range_seconds=RANGE_SECONDS
    )


QUERIES: Final = [(d, query) for d in _dashboards() for query in promql.queries(d)]
VARIABLES: Final = [
    (d, variable)
    for d in _dashboards()
    for variable in promql.variables(d)
    if variable["type"] == "query"
]


def _ask(store: Prometheus, query: promql.PanelQuery, expr: str, at: float) -> dict[str, Any]:
    if query.instant:
        return store.query(expr, at=at)
    return store.query_range(expr, start=at - RANGE_SECONDS, end=at, step=GRID)


@pytest.mark.parametrize(("dashboard", "query"), QUERIES, ids=[q.name for _, q in QUERIES])
def test_dashboard_query_gives_the_same_data(
    demo: Stores, dashboard: dict[str, Any], query: promql.PanelQuery
) -> None:
    expr = promql.substitute(query.expr, _values(dashboard))
    prometheus, victoria = (_ask(store, query, expr, demo.at) for store in demo.both())
    _same(prometheus, victoria, expr)


def test_the_dashboards_queries_find_data(demo: Stores) -> None:
    """Most panels have data in the history, so the comparison above means something
    (tests/test_dashboards_live.py requires data of each panel, from a live stack)."""
    empty = [
        query.name
        for dashboard, query in QUERIES
        if not demo.victoria.api.query(
            promql.substitute(query.expr, _values(dashboard)), at=demo.at
        )["data"]["result"]
    ]
    assert len(empty) <= len(QUERIES) // 2, empty


@pytest.mark.parametrize(
    ("dashboard", "variable"), VARIABLES, ids=[f"{d['title']} / ${v['name']}" for d, v in VARIABLES]
)
def test_variable_values_are_the_same(
    demo: Stores, dashboard: dict[str, Any], variable: dict[str, Any]
) -> None:
    selector, label = promql.label_values(variable["query"])
    selector = promql.substitute(selector, _values(dashboard))
    found = []
    for store in demo.both():
        answer = store.series(selector, start=demo.at - RANGE_SECONDS, end=demo.at)
        assert answer["status"] == "success", answer.get("error")
        found.append({series.get(label) for series in answer["data"]} - {None})
    assert found[0] == found[1], selector


def test_a_variable_listed_once_a_workload_is_selected_lists_the_same_values(
    demo: Stores,
) -> None:
    """The pod variable lists nothing at All (compared above) and, with two workloads selected,
    the same pods in both stores."""
    guarded = [(d, v) for d, v in VARIABLES if selected_only("workload") in v["query"]]
    assert guarded
    for dashboard, variable in guarded:
        selector, label = promql.label_values(variable["query"])
        held = demo.prometheus.query(
            "namespace_workload_model:gpu_allocation:share_sum", at=demo.at
        )["data"]["result"]
        workloads = sorted({row["metric"]["workload"] for row in held})[:2]
        picked = {**_values(dashboard), "workload": f"({'|'.join(workloads)})"}
        found = []
        for store in demo.both():
            answer = store.series(
                promql.substitute(selector, picked), start=demo.at - RANGE_SECONDS, end=demo.at
            )
            assert answer["status"] == "success", answer.get("error")
            found.append({series.get(label) for series in answer["data"]} - {None})
        assert found[0], f"no {label} of {workloads}"
        assert found[0] == found[1], selector


def _bounded_tables() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (dashboard, panel)
        for dashboard in _dashboards()
        for panel in promql.panels(dashboard)
        if panel["type"] == "table"
        and any(promql.bound(target["expr"]) for target in panel.get("targets", []))
    ]


@pytest.mark.parametrize(
    ("dashboard", "panel"), _bounded_tables(), ids=[p["title"] for _, p in _bounded_tables()]
)
def test_a_bounded_table_holds_its_bound_and_whole_rows(
    demo: Stores, dashboard: dict[str, Any], panel: dict[str, Any]
) -> None:
    """Bounded to 1 row (the demo has more allocations), each store lists 1, with its label
    columns (its one query carries them); which one may differ where values tie."""
    (target,) = panel["targets"]
    labels = [
        name
        for name in panel["transformations"][2]["options"]["renameByName"]
        if not name.startswith("Value")
    ]
    expr = promql.substitute(target["expr"], _values(dashboard))
    bounded = expr.replace(f"topk({FLEET_ROWS},", "topk(1,", 1)
    assert bounded != expr
    for store in demo.both():
        rows = store.query(bounded, at=demo.at)["data"]["result"]
        assert len(rows) == 1, rows
        for row in rows:
            assert set(labels) <= row["metric"].keys(), row["metric"]


def test_vmalert_evaluates_every_rule_live_without_error(demo: Stores, tmp_path: Path) -> None:
    with Vmalert(tmp_path, datasource=demo.victoria.url, interval="1s") as vmalert:

        def evaluated() -> list[dict[str, Any]] | None:
            rules = [rule for group in vmalert.groups() for rule in group["rules"]]
            done = all(not rule["lastEvaluation"].startswith("0001") for rule in rules)
            return rules if rules and done else None

        rules = eventually(evaluated, 60, "every rule evaluated once")
    failed = {rule["name"]: rule["lastError"] for rule in rules if rule["lastError"]}
    assert not failed
    assert len(rules) == len(every_rule())
