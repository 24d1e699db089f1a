"""Every dashboard query and the alerts, against a real Prometheus scraping simulated daemons.

The stack (dashboards/live.py): node sim-a runs tests/fixtures/fleets/dashboards.yaml (a busy
trainer, a shared GPU, an idle holder, a hot L4, an MPS card with a fan, an uncorrectable ECC
error, a GPU that falls off the bus, a reading that raises), node sim-b a daemon whose driver
never loads, node sim-c a target nothing listens on, node sim-d a daemon whose sampler wedges in
nvmlInit. Prometheus scrapes them every second with the rule file loaded. Every
panel, annotation and variable query of every dashboard then runs through the HTTP API with the
variables substituted the way Grafana would, and must return data; the alerts this fleet gives a
reason to fire must be pending or firing, and no other alert may be.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any, Final

import pytest

from dashboards import promql
from dashboards.fit import UNIT_PX
from dashboards.live import LiveStack, Prometheus
from dashboards.panels import FLEET_ROWS
from dashboards.queries import EVALUATION_INTERVAL, range_hours, selected_only
from dashboards.render import render_all
from tests.dashboard_queries import RANGE_SECONDS, SCRAPE_SECONDS, grafana_values, rules
from tests.demo_node import DEMO_NODES
from tests.helpers import ROOT, eventually, require_tool

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow

WINDOW_SECONDS: Final = 15.0
"""How far back range queries (time series panels) look."""

EXPECTED_ALERTS: Final = (
    ("GpuDown", {"node": "sim-a", "gpu": "5"}),
    ("GpuUncorrectableEccErrors", {"node": "sim-a", "gpu": "0", "type": "uncorrected"}),
    ("GpuSlowdownSustained", {"node": "sim-a", "gpu": "3", "model": "NVIDIA L4"}),
    ("GpuscopeExporterDown", {"node": "sim-c"}),
    ("GpuscopeCollectorFailing", {"node": "sim-b", "collector": "nvml"}),
    ("GpuFellOffTheBus", {"node": "sim-a", "gpu": "5", "xid": "79"}),
    ("GpuCriticalXid", {"node": "sim-a", "gpu": "3", "xid": "48"}),
    ("GpuPodMemoryNearlyFull", {"node": "sim-a", "gpu": "1", "namespace": "serving"}),
    ("GpuAllocatedButIdle", {"node": "sim-a", "gpu": "2", "pod": "notebook-ana"}),
    ("GpuAllocatedButIdle", {"node": "sim-a", "gpu": "6", "pod": "notebook-raj"}),
    ("GpuMemoryRepairPending", {"node": "sim-a", "gpu": "0"}),
    ("GpuMemoryRepairPending", {"node": "sim-a", "gpu": "7"}),
    ("GpuUncorrectableEccErrors", {"node": "sim-a", "gpu": "7", "type": "uncorrected"}),
    ("GpuscopeSampleErrors", {"node": "sim-a"}),
    ("GpuscopeCollectorFailing", {"node": "sim-a", "collector": "device"}),  # that reading
    ("GpuDown", {"node": "sim-d", "gpu": "0", "reason": "lost"}),
    ("GpuscopeSamplesStale", {"node": "sim-d"}),
)
"""Alerts the stack gives a reason to fire (labels: a subset the alert must carry)."""

NOT_TRIGGERED_LIVE: Final = {
    "GpuRowRemapFailed": "the simulator's row remappings never fail",
    "GpuscopeRestarting": "needs a kubelet restarting a daemon whose liveness probe fails",
    "GpuscopeKubernetesWatchDown": "the stack runs without a Kubernetes API to lose",
    "GpuServingRevisionRegressed": "needs a revision serving an hour after another",
}
"""Alerts covered by the promtool unit tests only, and why the live stack cannot raise them."""


SERVED_ELSEWHERE: Final = {
    "rightsizing.json": "its series come from gpuscope rightsize serve: "
    "tests/test_rightsize_server.py runs its queries on a Prometheus scraping one",
    "serving.json": "its series come from inference servers' counters: "
    "tests/test_serving_live.py runs its queries on a Prometheus scraping stand-ins",
}
"""Dashboards whose queries this stack of daemons cannot answer, and where they are run."""


def dashboards() -> list[dict[str, Any]]:
    return [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "dashboards").glob("*.json"))
        if path.name not in SERVED_ELSEWHERE
    ]


QUERIES: Final = [
    (dashboard, query) for dashboard in dashboards() for query in promql.queries(dashboard)
]
VARIABLES: Final = [
    (dashboard, variable)
    for dashboard in dashboards()
    for variable in promql.variables(dashboard)
    if variable["type"] == "query"
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    require_tool("prometheus")
    with LiveStack(DEMO_NODES, tmp_path_factory.mktemp("live")) as stack:
        stack.wait_for_scrapes(12)
        yield stack.prometheus


@pytest.mark.parametrize(("dashboard", "query"), QUERIES, ids=[query.name for _, query in QUERIES])
def test_panel_query_returns_data(
    prometheus: Prometheus, dashboard: dict[str, Any], query: promql.PanelQuery
) -> None:
    expr = promql.substitute(query.expr, grafana_values(dashboard))
    now = time.time()
    if query.instant:
        answer = prometheus.query(expr, at=now)
    else:
        answer = prometheus.query_range(
            expr, start=now - WINDOW_SECONDS, end=now, step=SCRAPE_SECONDS
        )
    assert answer["status"] == "success", f"{expr}\n{answer.get('error')}"
    assert answer["data"]["result"], f"no data for {expr}"


@pytest.mark.parametrize(
    ("dashboard", "variable"),
    VARIABLES,
    ids=[f"{d['title']} / ${v['name']}" for d, v in VARIABLES],
)
def test_variable_query_finds_values(
    prometheus: Prometheus, dashboard: dict[str, Any], variable: dict[str, Any]
) -> None:
    selector, label = promql.label_values(variable["query"])
    values = grafana_values(dashboard)
    now = time.time()

    def found(values: dict[str, str]) -> set[str]:
        expr = promql.substitute(selector, values)
        answer = prometheus.series(expr, start=now - RANGE_SECONDS, end=now)
        assert answer["status"] == "success", answer.get("error")
        return {series.get(label) for series in answer["data"]} - {None}

    if selected_only("workload") in selector:
        # every pod of the fleet at All would be tens of thousands: none until a workload is picked
        assert not found(values), f"{selector} lists {label} with every workload at All"
        workloads = sorted(workload_names(prometheus, now))
        picked = {**values, "workload": grafana_regex(workloads[:2])}
        expected = pods_of(prometheus, now, workloads[:2])
        assert found(picked) == expected, f"{selector} for {workloads[:2]}"
    else:
        assert found(values), f"no values of {label} in {selector}"


def grafana_regex(names: list[str]) -> str:
    """What Grafana substitutes for a multi-value variable with these values selected."""
    escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\1", name) for name in names]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def workload_names(prometheus: Prometheus, at: float) -> set[str]:
    answer = prometheus.query("namespace_workload_model:gpu_allocation:share_sum", at=at)
    return {row["metric"]["workload"] for row in answer["data"]["result"]}


def pods_of(prometheus: Prometheus, at: float, workloads: list[str]) -> set[str]:
    rows = prometheus.query("gpu_allocation_info", at=at)["data"]["result"]
    return {row["metric"]["pod"] for row in rows if row["metric"]["workload"] in workloads}


BOUNDED_TABLES: Final = {
    "Allocations": "count(gpu_allocation_in_use)",
    "Idle allocations": "count(allocation:gpu_pod_busy_seconds:rate5m < 0.01)",
}
"""The fleet dashboards' tables of allocations, each one bounded query, and how many
allocations are in scope with every variable at All."""


def bounded_tables() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (dashboard, panel)
        for dashboard in dashboards()
        for panel in promql.panels(dashboard)
        if panel["type"] == "table"
        and any(promql.bound(target["expr"]) for target in panel.get("targets", []))
    ]


def test_the_bounded_tables_are_the_allocations_tables() -> None:
    assert sorted(panel["title"] for _, panel in bounded_tables()) == sorted(BOUNDED_TABLES)


@pytest.mark.parametrize(
    ("dashboard", "panel"), bounded_tables(), ids=[p["title"] for _, p in bounded_tables()]
)
def test_a_bounded_table_lists_everything_in_scope_or_its_bound_each_row_whole(
    prometheus: Prometheus, dashboard: dict[str, Any], panel: dict[str, Any]
) -> None:
    """Narrowed to FLEET_ROWS allocations or fewer (the demo fleet has fewer at All), the table
    lists every one; with more (the same query bounded to one row fewer) it lists its bound. Either way
    every row carries every column: the label columns come with the value, from one query."""
    (target,) = panel["targets"]
    label_columns = [
        name
        for name in panel["transformations"][2]["options"]["renameByName"]
        if not name.startswith("Value")
    ]
    assert label_columns, panel["title"]
    expr = promql.substitute(target["expr"], grafana_values(dashboard))
    now = time.time()
    in_scope = prometheus.query(BOUNDED_TABLES[panel["title"]], at=now)["data"]["result"]
    total = int(float(in_scope[0]["value"][1]))
    assert 1 < total <= FLEET_ROWS, "the demo fleet no longer tells a bound from everything"
    for limit, expected in ((FLEET_ROWS, total), (total - 1, total - 1)):
        bounded = expr.replace(f"topk({FLEET_ROWS},", f"topk({limit},", 1)
        assert bounded != expr or limit == FLEET_ROWS
        rows = prometheus.query(bounded, at=now)["data"]["result"]
        assert len(rows) == expected, f"{limit}: {len(rows)} rows of {total}"
        for row in rows:
            assert set(label_columns) <= row["metric"].keys(), row["metric"]


def test_the_fleets_alerts_are_active_and_no_others(prometheus: Prometheus) -> None:
    active = [alert for alert in prometheus.alerts() if alert["state"] in {"pending", "firing"}]

    def matches(alert: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
        return alert["labels"]["alertname"] == name and labels.items() <= alert["labels"].items()

    missing = [
        (name, labels)
        for name, labels in EXPECTED_ALERTS
        if not any(matches(a, name, labels) for a in active)
    ]
    assert not missing, (
        f"expected alerts not active: {missing}\nactive: {[a['labels'] for a in active]}"
    )
    unexpected = [
        alert["labels"]
        for alert in active
        if not any(matches(alert, name, labels) for name, labels in EXPECTED_ALERTS)
    ]
    assert not unexpected, f"alerts active without a reason in the fleet: {unexpected}"


def test_gpus_held_through_dra_claims_count_like_the_device_plugins(
    prometheus: Prometheus,
) -> None:
    # the demo node's rankers share one ResourceClaim on GPU 4, its trainer claims GPU 0 alone
    now = time.time()
    shares = prometheus.query('allocation:gpu_allocation:share{claim="ranker-gpu"}', at=now)
    assert sorted(
        (row["metric"]["pod"], float(row["value"][1])) for row in shares["data"]["result"]
    ) == [("ranker-0", 0.5), ("ranker-1", 0.5)]
    trainer = prometheus.query(
        'gpu_allocation_info{claim="llm-pretrain-0-gpu-x7k2p",resource="nvidia.com/gpu"}', at=now
    )
    assert [row["metric"]["gpu"] for row in trainer["data"]["result"]] == ["0"]
    slices = prometheus.query('gpuscope_kubernetes_watch_up{resource="resourceslices"}', at=now)
    assert [row["value"][1] for row in slices["data"]["result"]] == ["1"]


def test_opencosts_node_price_prices_every_gpu_of_its_node_and_each_allocation_its_share(
    prometheus: Prometheus,
) -> None:
    # the OpenCost stand-in prices sim-a's GPUs at $2.50 each, a spot node (tests/demo_node.py)
    now = time.time()
    prices = prometheus.query('gpu:gpu_price_usd_per_hour:of_gpu{node="sim-a"}', at=now)
    rows = prices["data"]["result"]
    gpus = prometheus.query('count(gpu_info{node="sim-a"})', at=now)["data"]["result"]
    assert len(rows) == int(gpus[0]["value"][1]) > 0
    assert {(row["metric"]["price_source"], row["value"][1]) for row in rows} == {
        ("opencost", "2.5")
    }
    # Each device is charged its part of that: a MIG instance its part of the GPU.
    # (A device the daemon gives no part of its GPU, a lost GPU, is charged the whole GPU.)
    charged = prometheus.query(
        'gpu:gpu_price_usd_per_hour:effective{node="sim-a"} / on (uuid) group_left ()'
        ' (max by (uuid) (gpu_price_share_ratio{node="sim-a"})'
        ' or on (uuid) max by (uuid) (gpu:gpu_price_usd_per_hour:of_gpu{node="sim-a"}) * 0 + 1)',
        at=now,
    )["data"]["result"]
    assert len(charged) == len(rows)
    assert [float(row["value"][1]) for row in charged] == pytest.approx([2.5] * len(charged))
    shares = prometheus.query('allocation:gpu_price_usd_per_hour:share{claim="ranker-gpu"}', at=now)
    assert sorted(float(row["value"][1]) for row in shares["data"]["result"]) == [1.25, 1.25]
    spot = prometheus.query("node:kubecost_node_is_spot:max", at=now)["data"]["result"]
    assert [(row["metric"]["node"], row["value"][1]) for row in spot] == [("sim-a", "1")]


def test_queues_and_unqueued_pods_add_up_to_the_clusters_allocations(
    prometheus: Prometheus,
) -> None:
    """The demo node's pretraining pods carry Kueue's cluster-queue-name label, its finetuning
    Job only queue-name (resolved through the stand-in API server's LocalQueue), its chat and
    embedding pods KAI's queue label, the others none: each rule's queues plus the unqueued
    series equal the cluster's total within 0.1%."""

    def per_queue(rule: str, now: float) -> dict[tuple[str, str], float]:
        rows = prometheus.query(rule, at=now)["data"]["result"]
        return {
            (row["metric"].get("queue", ""), row["metric"]["queue_kind"]): float(row["value"][1])
            for row in rows
        }

    def total(rule: str, now: float) -> float:
        rows = prometheus.query(f"sum({rule})", at=now)["data"]["result"]
        return float(rows[0]["value"][1]) if rows else 0.0

    def settled() -> tuple[dict[tuple[str, str], float], float] | None:
        # the rollup and the allocations it sums are evaluated in two groups: wait for one
        # evaluation of both after the same scrape
        now = time.time()
        for rule, allocations in (
            ("queue:gpu_allocation:share_sum", "allocation:gpu_allocation:share"),
            ("queue:gpu_price_usd_per_hour:share_sum", "allocation:gpu_price_usd_per_hour:share"),
        ):
            held, whole = per_queue(rule, now), total(allocations, now)
            if len(held) != 4 or whole <= 0 or abs(sum(held.values()) / whole - 1) > 0.001:
                return None
        return per_queue("queue:gpu_allocation:share_sum", now), now

    found, _ = eventually(settled, 100, "queues + unqueued = the cluster's total", every=1.0)
    assert set(found) == {
        ("research", "kueue"),
        ("batch", "kueue"),
        ("serving", "kai"),
        ("", "none"),
    }
    assert found[("batch", "kueue")] == pytest.approx(1.0)  # the finetuning Job's GPU 3
    assert found[("serving", "kai")] == pytest.approx(1.0)  # two pods time-slicing GPU 1
    queues = prometheus.query(
        'gpuscope_kubernetes_watch_up{resource="localqueues"}', at=time.time()
    )
    assert [row["value"][1] for row in queues["data"]["result"]] == ["1"]


def test_hours_over_the_range_are_the_recorded_samples_times_the_evaluation_interval(
    prometheus: Prometheus,
) -> None:
    """The dashboards' GPU-hours sum a rollup's samples and weigh each by the rules' measured
    evaluation interval (1 s here, a minute in a cluster): over a range the rollup covers, the
    same hours as evaluating it at every step of that interval, as a subquery would. (A series
    that starts within the range counts its first sample as a whole interval: one interval's
    worth, nothing on a day's range at a minute, a tenth on a range of ten samples.)"""
    held = "namespace_workload_model:gpu_allocation:share_sum"
    span = f"{RANGE_SECONDS:.0f}s"
    longer = f"{RANGE_SECONDS + 10:.0f}s"

    def covered() -> float | None:
        # every workload's rollup has samples from before the range: the range is all inside it
        now = time.time()
        older = prometheus.query(
            f"min(count_over_time({held}[{longer}]) - count_over_time({held}[{span}]))", at=now
        )["data"]["result"]
        return now if older and float(older[0]["value"][1]) > 0 else None

    now = eventually(covered, 100, f"the rollup to cover the last {span}")
    values = {"__range": span}
    interval = prometheus.query(promql.substitute(EVALUATION_INTERVAL, values), at=now)
    assert float(interval["data"]["result"][1]) == pytest.approx(SCRAPE_SECONDS, rel=0.1)
    hours = prometheus.query(promql.substitute(range_hours(held), values), at=now)
    stepped = prometheus.query(
        f"sum_over_time(sum({held})[{span}:{SCRAPE_SECONDS:.0f}s]) / 3600", at=now
    )
    measured = float(hours["data"]["result"][0]["value"][1])
    assert measured > 0
    assert measured == pytest.approx(float(stepped["data"]["result"][0]["value"][1]), rel=0.05)


def test_every_alert_is_either_triggered_live_or_says_why_not() -> None:
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    triggered = {name for name, _ in EXPECTED_ALERTS}
    assert not triggered & set(NOT_TRIGGERED_LIVE)
    assert triggered | set(NOT_TRIGGERED_LIVE) == alerts


@pytest.mark.timeout(300)
def test_pictures_render_every_dashboard_from_live_data(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    """Every dashboard drawn once from live data: no legend over a row's title, no table header
    over its neighbour, no label off its panel (`render.save` refuses a picture with any text out
    of place, naming the dashboard and each text), and the PNG as wide as Grafana's grid."""
    written = render_all(prometheus, tmp_path, seconds=WINDOW_SECONDS)
    assert sorted(path.stem for path in written) == sorted(
        path.stem for path in (ROOT / "dashboards").glob("*.json")
    )
    for path in written:
        with path.open("rb") as picture:
            header = picture.read(24)
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(header[16:20], "big") == 24 * UNIT_PX[0]  # the grid's full width
