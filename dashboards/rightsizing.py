"""The rightsizing dashboard (gpuscope-rightsizing): what `gpuscope rightsize serve` recommends,
from the series it exports (`gpuscope_recommendation_*`), what each sharing policy would have
needed (`gpuscope_simulation_*`, under `--simulate`), beside how its refreshes go."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.layout import Layout, dashboard, query_variable
from dashboards.panels import (
    Column,
    Query,
    bargauge,
    piechart,
    stat,
    steps,
    table,
    timeseries,
)

if TYPE_CHECKING:
    from dashboards.panels import Json

RECOMMENDATION = ("cluster", "namespace", "workload", "workload_kind")


WHOLE_GPUS = (
    "whole GPUs, as the report counts them: the devices held at the end of its window, MIG "
    "instances packed onto GPUs of their model and pods time-slicing a GPU counted once. The "
    "namespaces share these GPUs, so the namespace filter does not apply (the table's GPU share "
    "is each workload's part)."
)


def make() -> Json:
    scope = 'cluster=~"$cluster", namespace=~"$namespace"'
    savings = f"gpuscope_recommendation_savings_usd_per_month{{{scope}}}"
    info = f"gpuscope_recommendation_info{{{scope}}}"
    gpus_now = 'sum(gpuscope_rightsize_report_gpus{cluster=~"$cluster"})'
    gpus_after = 'sum(gpuscope_rightsize_report_recommended_gpus{cluster=~"$cluster"})'
    layout = Layout()

    layout.row("Rightsizing")
    layout.add(
        4,
        4,
        stat(
            "Savings a month",
            "What following every recommendation of the selected workloads saves, in USD a month.",
            Query(f"sum({savings}) or vector(0)"),
            unit="currencyUSD",
            decimals=0,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Workloads to change",
            "Workloads whose recommendation is to release their GPU, move to a MIG slice or "
            "another GPU, or get more CPU.",
            Query(
                f'count(gpuscope_recommendation_info{{{scope}, action!~"keep|none"}}) or vector(0)'
            ),
            decimals=0,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "GPUs now, all namespaces",
            f"GPUs the selected clusters' workloads hold (the report's 'GPUs now'), in {WHOLE_GPUS}",
            Query(f"{gpus_now} or vector(0)"),
            decimals=0,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "GPUs after, all namespaces",
            "GPUs they would hold following the recommendations (the report's 'after'), in "
            + WHOLE_GPUS,
            Query(f"{gpus_after} or vector(0)"),
            decimals=0,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Report age",
            "How long ago the served report was made: older than two refresh periods means "
            "refreshes keep failing (see Refreshes below).",
            Query("time() - max(gpuscope_rightsize_last_success_timestamp_seconds)"),
            unit="s",
            thresholds=steps(("green", None), ("orange", 86400), ("red", 7 * 86400)),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Last refresh",
            "1: the last refresh made a report; 0: it failed, and the report before it is served.",
            Query("min(gpuscope_rightsize_last_refresh_success)"),
            thresholds=steps(("red", None), ("green", 1)),
            sparkline=False,
        ),
    )
    labels = (*RECOMMENDATION, "classification", "action", "recommended", "confidence", "trend")
    layout.add(
        24,
        10,
        table(
            "Recommendations",
            "Every selected workload: what it runs on, what to do, how far to trust it and "
            "where its demand goes, and what that saves (the report's page has the reason and "
            "the patch). GPU share: the GPUs it held on average over the window, a MIG slice or "
            "a time-sliced share counting as its part of one, so the shares add up to less than "
            "the whole GPUs above.",
            labels,
            Column(
                "GPU share",
                f"sum without (gpu) (gpuscope_recommendation_current_gpus{{{scope}}})",
            ),
            Column("", info),
            Column(
                "$ a month now",
                f"gpuscope_recommendation_current_cost_usd_per_month{{{scope}}}",
                "currencyUSD",
            ),
            Column("Savings a month", savings, "currencyUSD"),
            sort_by="Savings a month",
        ),
    )
    layout.add(
        8,
        8,
        bargauge(
            "Savings by namespace",
            "USD a month the recommendations save per namespace.",
            Query(
                f"sort_desc(sum by (cluster, namespace) ({savings}))", "{{cluster}} {{namespace}}"
            ),
            unit="currencyUSD",
        ),
    )
    layout.add(
        8,
        8,
        piechart(
            "Workloads by classification",
            "How the selected workloads are classified: idle, input-bound, underused, "
            "memory-bound, compute-bound, right-sized, undefined (not enough data).",
            Query(f"count by (classification) ({info})", "{{classification}}"),
        ),
    )
    layout.add(
        8,
        8,
        piechart(
            "Recommendations by confidence",
            "How far the recommendations can be trusted: high, medium, low (the report's page "
            "says why for each).",
            Query(f"count by (confidence) ({info})", "{{confidence}}"),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Savings a month over time",
            "What the recommendations would save, report after report, by action.",
            Query(f"sum by (action) ({savings})", "{{action}}"),
            unit="currencyUSD",
            stack=True,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "GPUs now and after, all namespaces",
            "GPUs the selected clusters' workloads hold and would hold following the "
            f"recommendations, report after report, in {WHOLE_GPUS}",
            Query(gpus_now, "now"),
            Query(gpus_after, "after"),
        ),
    )

    layout.row("Policy replay")
    replayed = (
        " Replayed over the report's window by gpuscope rightsize serve --simulate, for every "
        "workload of the report (the cluster and namespace filters do not apply); the report's "
        "page draws each policy step by step."
    )
    layout.add(
        12,
        7,
        bargauge(
            "GPUs each policy needs",
            "GPUs each sharing policy would have needed: for current, the most held at any step; "
            "for exclusive, mig, timeslice and binpack, the GPUs their placement uses at every "
            "step." + replayed,
            Query("sort_desc(max by (policy) (gpuscope_simulation_gpus))", "{{policy}}"),
        ),
    )
    layout.add(
        12,
        7,
        bargauge(
            "Utilization under each policy",
            "Busy GPU-time over GPUs x window under each policy: the same demand on fewer GPUs "
            "is a higher share of them." + replayed,
            Query(
                "sort_desc(max by (policy) (gpuscope_simulation_utilization_ratio))", "{{policy}}"
            ),
            unit="percentunit",
            maximum=1,
        ),
    )

    layout.row("Refreshes")
    layout.add(
        12,
        7,
        timeseries(
            "Refresh duration",
            "How long the last refresh took: the queries to Prometheus and the report.",
            Query("max(gpuscope_rightsize_last_refresh_duration_seconds)", "duration"),
            unit="s",
        ),
    )
    layout.add(
        12,
        7,
        timeseries(
            "Refreshes",
            "Refreshes that made a report and those that failed (the report before is served "
            "meanwhile).",
            Query(
                "sum by (result) (increase(gpuscope_rightsize_refreshes_total[$__rate_interval]))",
                "{{result}}",
            ),
            stack=True,
        ),
    )

    return dashboard(
        "gpuscope-rightsizing",
        "gpuscope / Rightsizing",
        "What gpuscope rightsize serve recommends per workload (release, move to a MIG slice or "
        "another GPU, add CPU, keep), with confidence, trend and money, from the series it "
        "exports, and how its refreshes go.",
        [
            query_variable("cluster", "Cluster", "gpuscope_recommendation_info", "cluster"),
            query_variable(
                "namespace",
                "Namespace",
                'gpuscope_recommendation_info{cluster=~"$cluster"}',
                "namespace",
            ),
        ],
        layout,
    )
