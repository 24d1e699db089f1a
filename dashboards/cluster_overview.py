"""The cluster overview dashboard (gpuscope-cluster): the fleet, allocation against use,
what idle allocations cost, and hardware health. A node links to its node dashboard.

Its panels read the fleet rollups (deploy/prometheus/gpuscope.rules.yaml: a series per node and
GPU model, per node and namespace), never a series per GPU or allocation over a range, so a day
on 1,000 nodes stays fast. Instant tables list XIDs, which are few at a time, and idle
allocations, bounded to the costliest (panels.FLEET_ROWS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dashboards.layout import Layout, alerts_annotation, dashboard, query_variable
from dashboards.panels import (
    BAD_FROM_ONE,
    FLEET_POINTS,
    FLEET_ROWS,
    GPU_HOURS,
    Column,
    LabelColumn,
    Query,
    bargauge,
    stat,
    steps,
    table,
    timeseries,
)
from dashboards.queries import THROTTLE_REASONS, range_hours, sel

if TYPE_CHECKING:
    from dashboards.panels import Json


NODE_DASHBOARD_LINK: Final = (
    "/d/gpuscope-node/gpuscope-node?${datasource:queryparam}&var-node=${__value.raw}"
)


def make() -> Json:
    scope = 'node=~"$node", model=~"$model"'
    throttled = sel(scope, f'reason=~"{THROTTLE_REASONS}"')
    busy = f"node_model:gpu_busy_seconds:sum_rate5m{{{scope}}}"
    counted = f"node_model:gpu_busy_seconds:count_rate5m{{{scope}}}"
    layout = Layout()

    layout.row("Fleet")
    layout.add(
        4,
        4,
        stat(
            "GPUs",
            "Physical GPUs reporting (a MIG-split GPU counts once).",
            Query(f"sum(node_model:gpu_info:count{{{scope}}})"),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "GPUs down",
            "GPUs that stopped answering NVML (gpu_up 0).",
            Query(f"sum(node_model:gpu_up:count_down{{{scope}}}) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Allocated devices",
            "GPUs and MIG instances the kubelet has handed to containers.",
            Query(f"sum(node_model:gpu_allocation_info:count_devices{{{scope}}}) or vector(0)"),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Utilization",
            "Average share of time a kernel ran, across GPUs, from the integrated busy counters (5-minute rates).",
            Query(f"sum({busy}) / sum({counted})"),
            unit="percentunit",
            decimals=1,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Power draw",
            "Board power of all GPUs.",
            Query(f"sum(node_model:gpu_power_watts:sum{{{scope}}})"),
            unit="watt",
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Idle allocations cost",
            "What the allocations that kept their GPU busy under 1% in the last 5 minutes cost per hour (on-demand price of the GPU, split between the holders of a shared one).",
            Query(
                f"sum(node_namespace_model:gpu_price_usd_per_hour:sum_idle{{{scope}}}) or vector(0)"
            ),
            unit="currencyUSD",
            decimals=2,
            thresholds=steps(("green", None), ("orange", 1), ("red", 10)),
            max_points=FLEET_POINTS,
        ),
    )

    layout.row("Allocation and use")
    layout.add(
        12,
        8,
        timeseries(
            "GPUs: answering, allocated, in use, busy",
            "Answering: physical GPUs that answer NVML. Allocated: devices given to containers. In use: allocated devices on which a process of the holder runs. Busy: GPU-equivalents of kernel time, from the integrated counters' 5-minute rates (2 GPUs each 50% busy = 1).",
            Query(f"sum(node_model:gpu_up:count_up{{{scope}}})", "answering"),
            Query(f"sum(node_model:gpu_allocation_info:count_devices{{{scope}}})", "allocated"),
            Query(
                f"sum(node_model:gpu_allocation_in_use:count_devices{{{scope}}})",
                "in use by the holder",
            ),
            Query(f"sum({busy})", "busy (GPU-equivalents)"),
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Utilization by model",
            "Average share of time a kernel ran, per GPU model, from the integrated busy counters (5-minute rates).",
            Query(f"sum by (model) ({busy}) / sum by (model) ({counted})", "{{model}}"),
            unit="percentunit",
            maximum=1,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        8,
        7,
        bargauge(
            "GPUs by model",
            "Physical GPUs per model.",
            Query(f"sum by (model) (node_model:gpu_info:count{{{scope}}})", "{{model}}"),
        ),
    )
    layout.add(
        16,
        7,
        table(
            "Nodes",
            "GPUs per node and model; utilization is the average over the dashboard's time range; the price of one of its GPUs per hour and who priced it (OpenCost's node_gpu_hourly_cost for the node, else the catalog), and whether OpenCost knows the node as spot (- without OpenCost). Click a node for its dashboard.",
            ("node", "model"),
            Column("GPUs", f"sum by (node, model) (node_model:gpu_info:count{{{scope}}})"),
            Column(
                "Down",
                f"sum by (node, model) (node_model:gpu_up:count_down{{{scope}}})",
                mappings=((0, "0", "green"),),
            ),
            Column(
                "Utilization (range)",
                f"sum by (node, model) (sum_over_time({busy}[$__range])) "
                f"/ sum by (node, model) (sum_over_time({counted}[$__range]))",
                unit="percentunit",
            ),
            Column(
                "Power",
                f"sum by (node, model) (node_model:gpu_power_watts:sum{{{scope}}})",
                unit="watt",
            ),
            Column(
                "Price / GPU-hour",
                f"max by (node, model, price_source) (gpu:gpu_price_usd_per_hour:effective{{{scope}}})",
                unit="currencyUSD",
            ),
            Column(
                "Spot",
                f"max by (node, model) (node_model:gpu_info:count{{{scope}}} * 0 "
                "+ on (node) group_left () node:kubecost_node_is_spot:max) "
                f"or max by (node, model) (node_model:gpu_info:count{{{scope}}} * 0 - 1)",
                mappings=((1, "spot", "orange"), (0, "on demand", "green"), (-1, "-", "text")),
            ),
            label_columns=(
                LabelColumn(
                    "price_source",
                    "Priced by",
                    (("opencost", "OpenCost", "green"), ("catalog", "catalog", "text")),
                ),
            ),
            links={"node": ("Node dashboard", NODE_DASHBOARD_LINK)},
            sort_by="GPUs",
        ),
    )

    layout.row("Waste and cost")
    layout.add(
        12,
        8,
        table(
            "Idle allocations",
            f"Allocated devices their holder kept busy under 1% of the last 5 minutes, the {FLEET_ROWS} that cost the most per hour when there are more (narrow the node or model to list all of theirs), and whether a process of the holder runs there at all. Held idle for 4 hours, they raise GpuAllocatedButIdle.",
            ("node", "namespace", "workload", "pod", "container", "model", "gpu"),
            Column(
                "Cost / hour",
                f"topk({FLEET_ROWS}, allocation_in_use:gpu_price_usd_per_hour:share_idle{{{scope}}})",
                unit="currencyUSD",
                mappings=((-1, "no price", "text"),),
            ),
            label_columns=(
                LabelColumn("in_use", "In use", (("1", "yes", "orange"), ("0", "no", "red"))),
            ),
            sort_by="Cost / hour",
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Idle allocations cost per hour, by namespace",
            "On-demand price of the GPUs allocated but kept under 1% busy, per namespace.",
            Query(
                f"sort_desc(sum by (namespace) (node_namespace_model:gpu_price_usd_per_hour:sum_idle{{{scope}}}))",
                "{{namespace}}",
            ),
            unit="currencyUSD",
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Top namespaces by GPU-hours held",
            "Device-hours allocated over the dashboard's time range (a shared device's hours are split between its holders).",
            Query(
                f"topk(10, {range_hours(f'node_namespace_model:gpu_allocation:share_sum{{{scope}}}', 'namespace')})",
                "{{namespace}}",
            ),
            unit=GPU_HOURS,
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Top namespaces by busy GPU-hours",
            "Hours of kernel time on allocated devices over the dashboard's time range, from the integrated counters.",
            Query(
                f"topk(10, {range_hours(f'node_namespace_model:gpu_pod_busy_seconds:rate5m{{{scope}}}', 'namespace')})",
                "{{namespace}}",
            ),
            unit=GPU_HOURS,
        ),
    )

    layout.add(
        12,
        8,
        table(
            "Showback per queue",
            "Devices held now and what they cost per hour, per Kueue ClusterQueue or KAI Scheduler queue (a shared device's share split between its holders). Pods in no queue are one row, so the rows add up to the cluster's total. Cluster-wide: the node and model selection does not apply.",
            ("queue",),
            Column("GPUs held", "queue:gpu_allocation:share_sum"),
            Column("Cost / hour", "queue:gpu_price_usd_per_hour:share_sum", unit="currencyUSD"),
            label_columns=(
                LabelColumn(
                    "queue_kind",
                    "Scheduler",
                    (
                        ("kueue", "Kueue", "blue"),
                        ("kai", "KAI", "purple"),
                        ("none", "no queue", "text"),
                    ),
                ),
            ),
            sort_by="Cost / hour",
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Top queues by GPU-hours held",
            "Device-hours allocated per queue over the dashboard's time range (a shared device's hours are split between its holders; unqueued pods under \"none\"). Cluster-wide.",
            Query(
                f"topk(10, {range_hours('queue:gpu_allocation:share_sum', 'queue, queue_kind')})",
                "{{queue}} {{queue_kind}}",
            ),
            unit=GPU_HOURS,
        ),
    )

    layout.row("Health")
    layout.add(
        6,
        4,
        stat(
            "GPUs with an XID in range",
            "GPUs whose driver reported any XID error during the dashboard's time range.",
            Query(
                f"count(time() - gpu_last_xid_timestamp_seconds{{{scope}}} < $__range_s) or vector(0)"
            ),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        6,
        4,
        stat(
            "Uncorrectable ECC errors",
            "Uncorrectable memory errors since each GPU's driver loaded (cleared by a GPU reset).",
            Query(f"sum(node_model:gpu_ecc_errors:sum_uncorrected{{{scope}}}) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        6,
        4,
        stat(
            "GPUs slowed down now",
            "GPUs whose clocks are cut by a thermal, power-brake or hardware slowdown right now.",
            Query(f"sum(node_model:gpu_clock_event_active:count_slowdown{{{scope}}}) or vector(0)"),
            thresholds=steps(("green", None), ("orange", 1)),
            sparkline=False,
        ),
    )
    layout.add(
        6,
        4,
        stat(
            "Memory repairs pending",
            "GPUs with a remapped row or retired page waiting for a GPU reset.",
            Query(f"sum(node_model:gpu_memory_repair_pending:count{{{scope}}}) or vector(0)"),
            thresholds=steps(("green", None), ("orange", 1)),
            sparkline=False,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Throttling by reason",
            "GPUs whose clocks a reason holds down, sampled; and, where the driver reports it, the integrated time in slowdown (GPU-seconds per second: 2 means two GPUs throttled all the time). Empty while nothing is throttled: the rollups record only the reasons that hold a GPU down.",
            Query(
                f"sum by (reason) (node_model_reason:gpu_clock_event_active:sum{{{throttled}}})",
                "{{reason}} (GPUs now)",
            ),
            Query(
                f"sum by (reason) (node_model_reason:gpu_throttle_seconds:sum_rate5m{{{scope}}})",
                "{{reason}} (integrated)",
            ),
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        12,
        8,
        table(
            "XIDs since the daemons started",
            "XID errors per GPU and XID, and when each GPU reported its last one.",
            ("node", "model", "gpu", "xid"),
            Column("Count", f"sum by (node, model, gpu, xid) (gpu_xid_errors_total{{{scope}}})"),
            Column(
                "Last XID",
                f"max by (node, model, gpu) (gpu_last_xid_timestamp_seconds{{{scope}}}) * 1000",
                unit="dateTimeAsIso",
            ),
            sort_by="Count",
        ),
    )
    layout.add(
        24,
        6,
        table(
            "Active GPU alerts",
            "gpuscope's alerts that are pending or firing (deploy/prometheus/gpuscope.rules.yaml; runbooks in docs/runbook.md).",
            (
                "alertname",
                "alertstate",
                "severity",
                "node",
                "gpu",
                "model",
                "namespace",
                "pod",
                "xid",
                "reason",
            ),
            Column(
                "",
                'sum by (alertname, alertstate, severity, node, gpu, model, namespace, pod, xid, reason) (ALERTS{alertname=~"Gpu.*", node=~"$node"})',
            ),
        ),
    )

    return dashboard(
        "gpuscope-cluster",
        "gpuscope / Cluster overview",
        "Every GPU in the cluster: what is installed, allocated and actually used, what idle allocations cost, and hardware health.",
        [
            query_variable("node", "Node", "node_model:gpu_info:count", "node"),
            query_variable(
                "model", "GPU model", 'node_model:gpu_info:count{node=~"$node"}', "model"
            ),
        ],
        layout,
        annotations=(alerts_annotation('alertname=~"Gpu.*", node=~"$node"'),),
    )
