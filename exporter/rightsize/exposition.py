"""What `gpuscope rightsize serve` exports at /metrics: the report's recommendations as series
(`RECOMMENDATION_FAMILIES`, rendered once per refresh), the server's own refreshes and
notifications (`SERVER_FAMILIES`, read at each scrape) and the endpoint's counts as the daemon
exports them. The rightsizing guide's table of them comes from `metrics_table`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.rightsize.replay.metrics import SIMULATION_FAMILIES, simulation_metrics
from exporter.rightsize.strategy import IDLE, UNDERUSED
from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from exporter.rightsize.report import Report
    from exporter.rightsize.row import WorkloadRow
    from exporter.web import counters

TEXT_FORMAT: Final = "text/plain; version=0.0.4; charset=utf-8"

WORKLOAD_LABELS: Final = ("cluster", "namespace", "workload", "workload_kind")
RECOMMENDATION_INFO: Final = Family(
    "gpuscope_recommendation_info",
    "A workload's recommendation: its classification, action, confidence, trend, what it runs "
    "on now and what it should run on.",
    labels=(
        *WORKLOAD_LABELS,
        "classification",
        "action",
        "confidence",
        "trend",
        "current",
        "recommended",
    ),
    gpu=False,
)
SAVINGS: Final = Family(
    "gpuscope_recommendation_savings_usd_per_month",
    "What following the recommendation saves, in USD a month (0 to keep).",
    labels=(*WORKLOAD_LABELS, "action", "confidence"),
    gpu=False,
)
COST_CURRENT: Final = Family(
    "gpuscope_recommendation_current_cost_usd_per_month",
    "What the workload's GPUs cost now, in USD a month.",
    labels=WORKLOAD_LABELS,
    gpu=False,
)
COST_RECOMMENDED: Final = Family(
    "gpuscope_recommendation_recommended_cost_usd_per_month",
    "What its GPUs would cost as recommended, in USD a month.",
    labels=WORKLOAD_LABELS,
    gpu=False,
)
GPUS_CURRENT: Final = Family(
    "gpuscope_recommendation_current_gpus",
    "GPUs the workload held on average over the window, a MIG slice or a time-sliced share "
    "counting as its part of one: its share of the whole GPUs gpuscope_rightsize_report_gpus "
    "counts at the end of the window.",
    labels=(*WORKLOAD_LABELS, "gpu"),
    gpu=False,
    labels_doc="`gpu`: what it runs on (`A100 80GB SXM`, `H100 SXM MIG 1g.10gb`)",
)
GPUS_RECOMMENDED: Final = Family(
    "gpuscope_recommendation_recommended_gpus",
    "Its share as recommended, counted the same way (0 when it should release its GPUs).",
    labels=(*WORKLOAD_LABELS, "gpu"),
    gpu=False,
)
REPORT_GPUS: Final = Family(
    "gpuscope_rightsize_report_gpus",
    "GPUs the report's workloads hold at the end of the window, as the report counts them (its "
    "'GPUs now'): whole GPUs, MIG instances packed onto GPUs of their model and pods "
    "time-slicing a GPU counted once; per cluster and GPU model.",
    labels=("cluster", "gpu"),
    gpu=False,
    labels_doc="`gpu`: the GPU model (`A100 80GB SXM`)",
)
REPORT_RECOMMENDED_GPUS: Final = Family(
    "gpuscope_rightsize_report_recommended_gpus",
    "GPUs they would hold following the recommendations, counted the same way (the report's "
    "'after'); per cluster and GPU model.",
    labels=("cluster", "gpu"),
    gpu=False,
)
REPLICAS: Final = Family(
    "gpuscope_recommendation_replicas",
    "Pods of the workload holding its GPUs at the end of the window.",
    labels=WORKLOAD_LABELS,
    gpu=False,
)
REPORT_END: Final = Family(
    "gpuscope_rightsize_report_end_timestamp_seconds",
    "End of the window the served report covers, in unix seconds.",
    unit="seconds",
    gpu=False,
)
RECOMMENDATION_FAMILIES: Final = (
    RECOMMENDATION_INFO,
    SAVINGS,
    COST_CURRENT,
    COST_RECOMMENDED,
    GPUS_CURRENT,
    GPUS_RECOMMENDED,
    REPORT_GPUS,
    REPORT_RECOMMENDED_GPUS,
    REPLICAS,
    REPORT_END,
)
LAST_REFRESH: Final = Family(
    "gpuscope_rightsize_last_refresh_timestamp_seconds",
    "When the last refresh ended, successful or not, in unix seconds.",
    unit="seconds",
    gpu=False,
)
LAST_DURATION: Final = Family(
    "gpuscope_rightsize_last_refresh_duration_seconds",
    "How long the last refresh took.",
    unit="seconds",
    gpu=False,
)
LAST_SUCCESS: Final = Family(
    "gpuscope_rightsize_last_refresh_success",
    "1 if the last refresh made a report, 0 if it failed (the previous report is still served).",
    gpu=False,
)
LAST_SUCCESS_TIME: Final = Family(
    "gpuscope_rightsize_last_success_timestamp_seconds",
    "When the served report was made, in unix seconds.",
    unit="seconds",
    gpu=False,
)
REFRESHES: Final = Family(
    "gpuscope_rightsize_refreshes",
    "Refreshes by result: success, failure.",
    kind="counter",
    labels=("result",),
    gpu=False,
)
NOTIFICATIONS: Final = Family(
    "gpuscope_rightsize_notifications",
    "Summaries posted to webhooks, by service (slack, teams, json) and result (success, failure).",
    kind="counter",
    labels=("service", "result"),
    gpu=False,
)
SERVER_FAMILIES: Final = (
    LAST_REFRESH,
    LAST_DURATION,
    LAST_SUCCESS,
    LAST_SUCCESS_TIME,
    REFRESHES,
    NOTIFICATIONS,
)


def metrics_table() -> str:
    """The rightsizing guide's table of the series `gpuscope rightsize serve` exports."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for family in (*RECOMMENDATION_FAMILIES, *SIMULATION_FAMILIES, *SERVER_FAMILIES):
        labels = ", ".join(f"`{label}`" for label in family.labels)
        if family.labels_doc:
            labels += f"; {family.labels_doc}"
        rows.append(f"| `{family.exposed_name}` | {family.kind} | {labels} | {family.meaning} |")
    return "\n".join(rows)


def new_metric(family: Family) -> GaugeMetricFamily | CounterMetricFamily:
    if family.kind == "counter":
        return CounterMetricFamily(family.name, family.help, labels=list(family.labels))
    return GaugeMetricFamily(family.name, family.help, labels=list(family.labels))


def _workload(row: WorkloadRow) -> list[str]:
    history = row.history
    return [history.cluster, history.namespace, history.name, history.kind]


def recommendation_metrics(report: Report) -> Iterator[Metric]:
    """The report's recommendations as metric families."""
    metrics = {family.name: new_metric(family) for family in RECOMMENDATION_FAMILIES}

    def add(family: Family, labels: list[str], value: float) -> None:
        metrics[family.name].add_metric(labels, value)

    for row in report.rows:
        recommendation, labels = row.recommendation, _workload(row)
        current = recommendation.current
        current_gpus = row.gpus_held * (current.share if current else 1.0)
        recommended_gpus = current_gpus
        target = recommendation.target
        if recommendation.classification == IDLE:
            recommended_gpus = 0.0
        elif recommendation.classification == UNDERUSED and target is not None:
            recommended_gpus = row.gpus_held * target.share
        now = current.label if current else row.history.model
        after = row.target_label if recommendation.action != "keep" else now
        add(
            RECOMMENDATION_INFO,
            [
                *labels,
                recommendation.classification,
                recommendation.action,
                row.confidence_level,
                row.trend.direction if row.trend else "unknown",
                now,
                after,
            ],
            1,
        )
        add(SAVINGS, [*labels, recommendation.action, row.confidence_level], row.savings or 0.0)
        if row.cost_current is not None:
            add(COST_CURRENT, labels, row.cost_current)
        if row.cost_recommended is not None:
            add(COST_RECOMMENDED, labels, row.cost_recommended)
        add(GPUS_CURRENT, [*labels, now], current_gpus)
        add(GPUS_RECOMMENDED, [*labels, after], recommended_gpus)
        add(REPLICAS, labels, row.replicas)
    for cluster, consolidation in report.cluster_consolidations:
        for change in consolidation.models:
            add(REPORT_GPUS, [cluster, change.model], change.gpus_before)
            add(REPORT_RECOMMENDED_GPUS, [cluster, change.model], change.gpus_after)
    add(REPORT_END, [], report.end)
    yield from metrics.values()
    yield from simulation_metrics(report.simulation)


class Collect:
    """A prometheus_client collector of metrics made by a function."""

    def __init__(self, make: Any) -> None:
        self._make = make

    def collect(self) -> Iterable[Metric]:
        return list(self._make())


def exposition(metrics: Iterable[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collect(lambda: metrics))
    return generate_latest(registry)


def web_families(counts: counters.WebCounts) -> Iterator[Metric]:
    """The endpoint's counts, as the daemon exports them."""
    for family, samples in counts.by_family():
        metric = new_metric(family)
        for values, value in samples:
            metric.add_metric(list(values), value)
        yield metric
