"""The Grafana dashboards without a Grafana: generated files up to date, structure, variables,
PromQL syntax (promtool), metric names, and Grafana's own schema types (tsc + @grafana/schema).
Their queries run against a live Prometheus in tests/test_dashboards_live.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from dashboards import build, promql
from dashboards.layout import datasource_variable
from dashboards.panels import DATASOURCE, FLEET_POINTS, FLEET_ROWS
from dashboards.queries import EVALUATIONS, SLOWDOWN_REASONS, selected_only
from exporter.metrics.process import own_families
from exporter.rightsize.exposition import RECOMMENDATION_FAMILIES, SERVER_FAMILIES
from tests.dashboard_queries import grafana_values, recorded_names
from tests.helpers import ROOT, require_tool, unavailable
from tests.serving_server import FAMILIES as SERVING_FAMILIES

if TYPE_CHECKING:
    from pathlib import Path

Json = dict[str, Any]

DASHBOARDS = ROOT / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))
GOLDEN = ROOT / "tests" / "golden" / "metrics.prom"
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "ALERTS"}
SCHEMA_MODULES = ROOT / ".cache" / "grafana-schema" / "node_modules"
PANEL_TYPES = {
    # panel type: (module under @grafana/schema's raw/composable, its type prefix, has FieldConfig)
    "timeseries": ("timeseries", "TimeSeries", True),
    "stat": ("stat", "Stat", False),
    "table": ("table", "Table", True),
    "bargauge": ("bargauge", "BarGauge", False),
    "state-timeline": ("statetimeline", "StateTimeline", True),
    "piechart": ("piechart", "PieChart", True),
}


def load(path: Path) -> Json:
    dashboard: Json = json.loads(path.read_text(encoding="utf-8"))
    return dashboard


def strings(value: object, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """Every string in a JSON value, leaving out the values of keys in `skip`."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [
            s for key, item in value.items() if key not in skip for s in strings(item, skip=skip)
        ]
    if isinstance(value, list):
        return [s for item in value for s in strings(item, skip=skip)]
    return []


def uids(value: object) -> list[str]:
    if isinstance(value, dict):
        found = [value["uid"]] if isinstance(value.get("uid"), str) else []
        return found + [uid for item in value.values() for uid in uids(item)]
    if isinstance(value, list):
        return [uid for item in value for uid in uids(item)]
    return []


def test_committed_dashboards_are_the_generators_output() -> None:
    assert {path.name for path in DASHBOARD_FILES} == set(build.DASHBOARDS)
    for name, make in build.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text(encoding="utf-8") == build.render(make), (
            f"dashboards/{name} is out of date: run python -m dashboards.build"
        )
    assert build.main(["--check"]) == 0


def test_dashboard_uids_and_titles_are_unique() -> None:
    dashboards = [load(path) for path in DASHBOARD_FILES]
    assert len({d["uid"] for d in dashboards}) == len(dashboards)
    assert len({d["title"] for d in dashboards}) == len(dashboards)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda path: path.stem)
def test_structure(path: Path) -> None:
    dashboard = load(path)
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["id"] is None, "an exported id would clash on import"
    assert "gpuscope" in dashboard["tags"]
    assert not {"__inputs", "__requires"} & set(dashboard), "import needs no datasource mapping"

    everything = list(promql.panels(dashboard))
    ids = [panel["id"] for panel in everything]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {path.name}"

    cells: dict[tuple[int, int], str] = {}
    for panel in everything:
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        assert grid["h"] > 0
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]

    for panel in everything:
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        assert panel["type"] in PANEL_TYPES
        assert panel["title"]
        assert panel["description"], f"{panel['title']}: every panel says what it shows"
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert isinstance(target["expr"], str)
            assert target["expr"].strip(), panel["title"]

    for annotation in dashboard["annotations"]["list"]:
        assert annotation["datasource"] == DATASOURCE
        assert annotation["target"]["expr"].strip()

    variables = promql.variables(dashboard)
    assert variables[0] == datasource_variable()
    for variable in variables[1:]:
        assert variable["type"] == "query"
        assert variable["datasource"] == DATASOURCE
        promql.label_values(variable["query"])

    assert set(uids(dashboard)) == {"${datasource}", dashboard["uid"]}, (
        "no hard-coded datasource uid"
    )


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda path: path.stem)
def test_variables_are_defined_and_used(path: Path) -> None:
    dashboard = load(path)
    defined = {variable["name"] for variable in promql.variables(dashboard)}
    used: set[str] = set()
    for text in strings(dashboard, skip=frozenset({"current"})):
        used |= promql.variable_references(text)
    unknown = used - defined - promql.GRAFANA_BUILTINS
    assert not unknown, f"{path.name} uses undefined variables: {sorted(unknown)}"
    assert defined <= used, f"{path.name} defines unused variables: {sorted(defined - used)}"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda path: path.stem)
def test_ranges_follow_the_dashboard(path: Path) -> None:
    """Rates use $__rate_interval; other windows span the dashboard's range. Fixed windows
    belong in recording rules."""
    for query in promql.queries(load(path)):
        for window in re.findall(r"\[([^\]:]+)\]", query.expr):
            assert window in {"$__rate_interval", "$__range"}, f"{query.name}: [{window}]"


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (variables substituted the way Grafana would) as a rule."""
    expressions: dict[str, str] = {}
    for path in DASHBOARD_FILES:
        dashboard = load(path)
        values = grafana_values(dashboard)
        for query in promql.queries(dashboard):
            expressions[query.name] = promql.substitute(query.expr, values)
        for variable in promql.variables(dashboard)[1:]:
            selector, _ = promql.label_values(variable["query"])
            expressions[f"{dashboard['title']} / variable {variable['name']}"] = promql.substitute(
                selector, values
            )
    rules = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [
                    {"record": f"dashboard:query_{number}:check", "expr": expr}
                    for number, expr in enumerate(expressions.values())
                ],
            }
        ]
    }
    rule_file = tmp_path / "queries.rules.yaml"
    rule_file.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    names = list(expressions)
    report = re.sub(
        r"dashboard:query_(\d+):check",
        lambda match: names[int(match[1])],
        result.stdout + result.stderr,
    )
    assert result.returncode == 0, report
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout


def referenced_names() -> set[str]:
    names: set[str] = set()
    for path in DASHBOARD_FILES:
        dashboard = load(path)
        values = grafana_values(dashboard)
        for query in promql.queries(dashboard):
            names |= promql.metric_names(promql.substitute(query.expr, values))
        for variable in promql.variables(dashboard)[1:]:
            selector, _ = promql.label_values(variable["query"])
            names |= promql.metric_names(promql.substitute(selector, values))
    document = yaml.safe_load((ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml").read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            names |= promql.metric_names(rule["expr"])
    return names


FLEET_DASHBOARDS = ("cluster-overview.json", "workloads.json")
"""Dashboards of the whole fleet: over a range they read the rollups, never a series per GPU,
process or allocation (the node dashboard shows one node and stays on the raw series)."""
ROLLUP_LEVELS = {
    "node_model",
    "node_model_reason",
    "node_namespace_model",
    "namespace_workload_model",
    "namespace_utilization",
    "queue",  # a series per Kueue or KAI queue: tens, whatever the fleet's size
    "gpuscope",
}
SPARSE_SERIES = {
    "gpu_last_xid_timestamp_seconds": "only GPUs that reported an XID have one",
    "ALERTS": "only pending and firing alerts have one",
}
"""Raw series a fleet dashboard may read over a range: few at any fleet size."""
LISTED_PER_POD = {"pod": "lists the pods of the selected workloads, none at All"}
"""Variables whose values are per allocation, so they read the allocation series."""
PER_ALLOCATION_LEVELS = {
    "allocation",
    "allocation_shared_in_use",
    "allocation_in_use",
    "pod_gpu",
    "pod",
    "pod_model",
    "pod_revision",
}
"""Recorded series with a series per allocation, container or pod: 64,000 and more at 1,000 nodes."""
PER_ALLOCATION_FAMILIES = ("gpu_allocation_", "gpu_pod_", "gpu_process_")
"""Raw families with a series per allocation, container or process."""


def per_allocation(names: set[str]) -> set[str]:
    return {
        name
        for name in names
        if (":" in name and name.split(":")[0] in PER_ALLOCATION_LEVELS)
        or name.startswith(PER_ALLOCATION_FAMILIES)
    }


@pytest.mark.parametrize("name", FLEET_DASHBOARDS)
def test_fleet_dashboards_read_rollups_over_ranges(name: str) -> None:
    dashboard = load(DASHBOARDS / name)
    values = grafana_values(dashboard)
    rollups = {record for record in recorded_names() if record.split(":")[0] in ROLLUP_LEVELS}
    allowed = rollups | set(SPARSE_SERIES)
    for query in promql.queries(dashboard):
        if query.instant and "$__range" not in query.expr:
            continue  # the latest samples only
        names = promql.metric_names(promql.substitute(query.expr, values))
        assert names <= allowed, f"{query.name} reads {sorted(names - allowed)} over a range"
    for variable in promql.variables(dashboard)[1:]:
        if variable["name"] in LISTED_PER_POD:
            continue
        selector, _ = promql.label_values(variable["query"])
        names = promql.metric_names(promql.substitute(selector, values))
        assert names <= rollups, f"${variable['name']} lists {sorted(names - rollups)}"


@pytest.mark.parametrize("name", FLEET_DASHBOARDS)
def test_fleet_dashboards_take_a_bounded_number_of_steps(name: str) -> None:
    """Each step of a fleet dashboard's range query reads a rollup series per node or workload:
    every panel drawn over the range (time series and stat sparklines alike) caps its steps at
    FLEET_POINTS rather than taking one per pixel of the screen."""
    dashboard = load(DASHBOARDS / name)
    stepped = [query for query in promql.queries(dashboard) if not query.instant]
    panels = [query for query in stepped if not query.panel.startswith("annotation ")]
    assert panels, f"{name} draws nothing over its range: is the test still looking?"
    for query in panels:
        assert query.max_points is not None, f"{query.name} takes a step per pixel"
        assert query.max_points <= FLEET_POINTS, f"{query.name} takes {query.max_points} steps"


@pytest.mark.parametrize("name", FLEET_DASHBOARDS)
def test_fleet_dashboards_list_a_bounded_number_of_allocations(name: str) -> None:
    """With every variable at All a fleet has tens of thousands of allocations: a query reading a
    series per allocation, container or pod is instant and returns at most FLEET_ROWS series
    (topk or bottomk, then only operators keeping at most one series per series on their left);
    a per-pod variable lists nothing until a workload is selected."""
    dashboard = load(DASHBOARDS / name)
    values = grafana_values(dashboard)
    bounded = 0
    for query in promql.queries(dashboard):
        names = promql.metric_names(promql.substitute(query.expr, values))
        if not per_allocation(names):
            continue
        assert query.instant, f"{query.name} reads {sorted(per_allocation(names))} over a range"
        limit = promql.bound(query.expr)
        assert limit is not None, f"{query.name} is not bounded: {query.expr}"
        assert limit[0] <= FLEET_ROWS, f"{query.name} returns up to {limit[0]} series"
        bounded += 1
    assert bounded, f"{name} lists no allocation: is the test still looking at the right names?"
    for variable in promql.variables(dashboard)[1:]:
        selector, _ = promql.label_values(variable["query"])
        if per_allocation(promql.metric_names(promql.substitute(selector, values))):
            assert variable["name"] in LISTED_PER_POD, f"${variable['name']} lists allocations"
            assert selected_only("workload") in selector, f"${variable['name']} lists all at All"
            assert variable["description"], f"${variable['name']} says why its list may be empty"


@pytest.mark.parametrize("name", FLEET_DASHBOARDS)
def test_a_bounded_tables_columns_come_from_the_same_rows(name: str) -> None:
    """Every column of a table of allocations has the same bound (the same topk of the same
    key), so that the columns merged on their labels describe the same allocations."""
    for panel in promql.panels(load(DASHBOARDS / name)):
        if panel["type"] != "table":
            continue
        limits = {promql.bound(target["expr"]) for target in panel["targets"]}
        if limits != {None}:
            assert len(limits) == 1, f"{panel['title']}: its columns have other bounds {limits}"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("topk(5, x)", (5, "x")),
        ('sort_desc(bottomk(3, x{a="("}))', (3, 'x{a="("}')),
        (
            (
                "topk(2, x) * on (a, b) group_left (c) max by (a, b, c) (label_replace(y == 1, "
                '"c", "yes", "", "")) / on (a) group_left () z and w unless on (a) (v > 1)'
            ),
            (2, "x"),
        ),
        ("x", None),
        ("sum(topk(5, x))", None),
        ("topk(5, x) or y", None),
        ("topk(5, x) * y", None),
        ("topk(5, x) * on (a) group_right () y", None),
        ("sort_desc(topk(5, x)) + sort_desc(y)", None),
    ],
)
def test_bound_reads_how_many_series_a_query_returns_at_most(
    expr: str, expected: tuple[int, str] | None
) -> None:
    assert promql.bound(expr) == expected


def test_hours_over_a_range_are_measured_in_the_evaluations_of_the_groups_summed() -> None:
    """A sum of samples over the range is hours only if each sample stands for the spacing of
    the evaluations recorded: every series summed so comes from a group evaluating at the same
    interval as the one recording the evaluations."""
    document = yaml.safe_load((ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml").read_text())
    interval_of = {
        rule["record"]: group.get("interval")
        for group in document["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    summed: set[str] = set()
    for path in DASHBOARD_FILES:
        dashboard = load(path)
        values = grafana_values(dashboard)
        for query in promql.queries(dashboard):
            expr = promql.substitute(query.expr, values)
            for inner in re.findall(r"sum_over_time\(([^\[]*)\[", expr):
                summed |= promql.metric_names(inner)
    assert summed, "no dashboard sums a rollup over its range"
    for name in sorted(summed):
        assert name in interval_of, f"{name} is summed over a range but not recorded"
        assert interval_of[name] == interval_of[EVALUATIONS], (
            f"{name} is recorded at another interval than {EVALUATIONS}"
        )


def test_slowdown_reasons_are_the_rules_own() -> None:
    """The dashboards' slowdown reasons are those the alert and the rollup count."""
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml").read_text())
    exprs = {
        rule.get("alert") or rule["record"]: rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
    }
    for name in ("GpuSlowdownSustained", "node_model:gpu_clock_event_active:count_slowdown"):
        assert f'reason=~"{SLOWDOWN_REASONS}"' in exprs[name], name


def test_every_metric_read_is_exported_recorded_or_prometheus_own() -> None:
    golden = GOLDEN.read_text(encoding="utf-8")
    # every family the daemon exports, including those with no sample for the golden fleet
    exported = {line.split()[2] for line in golden.splitlines() if line.startswith("# TYPE ")}
    # pod attribution is off for the golden fleet (no cluster): its families come from the
    # metrics reference; the report server's from the rightsizing guide
    readme = "".join(
        (ROOT / "docs" / page).read_text(encoding="utf-8")
        for page in ("reference/metrics.md", "guide/rightsizing.md")
    )
    documented = set(re.findall(r"^\| `((?:gpu|gpuscope)_[a-z0-9_]+)` \|", readme, re.MULTILINE))
    # the daemon's own process_* and python_* families (not in the golden file: their values vary)
    own = {sample.name for family in own_families()() for sample in family.samples}
    # what inference servers export, as the serving rules read it (the stand-ins' families)
    served = {name for names in SERVING_FAMILIES.values() for name in names}
    # what `gpuscope rightsize serve` exports, as it declares it
    rightsized = {family.exposed_name for family in (*RECOMMENDATION_FAMILIES, *SERVER_FAMILIES)}
    # what OpenCost exports, as the price rules read it (docs/guide/dashboards.md#prices)
    opencost = {"node_gpu_hourly_cost", "kubecost_node_is_spot"}
    known = exported | documented | own | recorded_names() | PROMETHEUS_OWN | served | rightsized
    known |= opencost
    referenced = referenced_names()
    assert not referenced - known, f"unknown metric names (typos?): {sorted(referenced - known)}"


def typescript_check(dashboards: list[Json]) -> str:
    """TypeScript that assigns each dashboard to @grafana/schema's types: the dashboard model
    with Prometheus annotation targets, and each panel's options and custom field config to its
    plugin's types. String enums are compared by value (JSON carries "list", not an enum)."""
    lines = [
        "import type { AnnotationQuery, DataQuery, Dashboard } from '@grafana/schema';",
        *(
            f"import type * as {module} from "
            f"'@grafana/schema/dist/esm/raw/composable/{module}/panelcfg/x/{prefix}PanelCfg_types.gen';"
            for module, prefix, _ in PANEL_TYPES.values()
        ),
        (
            "type Json<T> = T extends string ? `${T}` : T extends readonly (infer U)[] ? Json<U>[]"
            " : T extends object ? { [K in keyof T]: Json<T[K]> } : T;"
        ),
        # Grafana's Prometheus annotations keep the query in `target` and their formats beside it.
        "type PrometheusTarget = DataQuery & { expr: string; interval?: string };",
        (
            "type PrometheusAnnotation = Json<AnnotationQuery<PrometheusTarget>> & { titleFormat?: string;"
            " textFormat?: string; tagKeys?: string; useValueForTime?: boolean };"
        ),
    ]
    for number, dashboard in enumerate(dashboards):
        model = {key: value for key, value in dashboard.items() if key != "annotations"}
        lines.append(
            f"export const d{number}: Json<Omit<Dashboard, 'annotations'>> = {json.dumps(model)};"
        )
        lines.append(
            f"export const d{number}_annotations: PrometheusAnnotation[] = "
            f"{json.dumps(dashboard['annotations']['list'])};"
        )
        for panel in promql.panels(dashboard):
            if panel["type"] == "row":
                continue
            module, _, has_field_config = PANEL_TYPES[panel["type"]]
            name = f"d{number}_panel{panel['id']}"
            lines.append(
                f"export const {name}_options: Json<{module}.Options> = {json.dumps(panel['options'])};"
            )
            custom = panel["fieldConfig"]["defaults"].get("custom")
            if has_field_config and custom is not None:
                lines.append(
                    f"export const {name}_custom: Json<{module}.FieldConfig> = {json.dumps(custom)};"
                )
    return "\n".join(lines) + "\n"


def test_dashboards_type_check_against_grafana_schema(tmp_path: Path) -> None:
    tsc = SCHEMA_MODULES / ".bin" / "tsc"
    if not tsc.exists():
        unavailable(f"{tsc} missing (scripts/test installs @grafana/schema and typescript there)")
    require_tool("node")
    (tmp_path / "node_modules").symlink_to(SCHEMA_MODULES)
    source = tmp_path / "dashboards.ts"
    source.write_text(typescript_check([load(path) for path in DASHBOARD_FILES]), encoding="utf-8")
    result = subprocess.run(
        [
            str(tsc),
            "--noEmit",
            "--strict",
            "--skipLibCheck",
            "--module",
            "esnext",
            "--moduleResolution",
            "bundler",
            "--target",
            "es2022",
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[:5000]
