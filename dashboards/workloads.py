"""The workloads dashboard (gpuscope-workloads): GPU use per namespace, workload and pod,
GPU-hours and cost, and how close each comes to the calibrated ceilings.

Everything drawn over the time range reads the per-workload rollups of
deploy/prometheus/gpuscope.rules.yaml (namespace_workload_model:*), so the summary, workload
and ceiling panels follow the namespace and workload variables; the pods row shows the
allocations as they are now (the allocations table, which the pod variable narrows too, bounded
to panels.FLEET_ROWS rows) and each workload's memory peak over the last hour. The pod variable
lists the pods of the selected workloads only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.layout import Layout, dashboard, query_variable
from dashboards.panels import (
    FLEET_POINTS,
    FLEET_ROWS,
    GPU_HOURS,
    Column,
    LabelColumn,
    Query,
    bargauge,
    piechart,
    stat,
    steps,
    table,
    timeseries,
)
from dashboards.queries import range_hours, selected_only

if TYPE_CHECKING:
    from dashboards.panels import Json


def make() -> Json:
    scope = 'namespace=~"$namespace", workload=~"$workload", pod=~"$pod"'
    workload_scope = 'namespace=~"$namespace", workload=~"$workload"'
    by_workload = "namespace, workload, workload_kind, model"
    held = f"namespace_workload_model:gpu_allocation:share_sum{{{workload_scope}}}"
    busy = f"namespace_workload_model:gpu_pod_busy_seconds:rate5m{{{workload_scope}}}"
    price = f"namespace_workload_model:gpu_price_usd_per_hour:sum{{{workload_scope}}}"
    layout = Layout()

    layout.row("Summary")
    layout.add(
        4,
        4,
        stat(
            "GPUs held",
            "Devices allocated to the selected workloads (a shared device split between its holders).",
            Query(f"sum({held}) or vector(0)"),
            decimals=1,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Busy GPU-equivalents",
            "Kernel time on those devices: 2 GPUs each 50% busy = 1.",
            Query(f"sum({busy}) or vector(0)"),
            decimals=2,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "GPU-hours held",
            "Device-hours allocated over the dashboard's time range.",
            Query(range_hours(held)),
            unit=GPU_HOURS,
            decimals=1,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Cost in range",
            "On-demand price of the devices held over the dashboard's time range.",
            Query(range_hours(price)),
            unit="currencyUSD",
            decimals=2,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Idle allocations",
            "Allocations busy under 1% over the last 5 minutes.",
            Query(
                f"sum(namespace_workload_model:gpu_allocation:count_idle{{{workload_scope}}}) or vector(0)"
            ),
            thresholds=steps(("green", None), ("orange", 1)),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Shared allocations",
            "Allocations of a device time-sliced or MPS-shared with other containers.",
            Query(
                f"sum(namespace_workload_model:gpu_allocation_shared:count{{{workload_scope}}}) or vector(0)"
            ),
            sparkline=False,
        ),
    )

    layout.row("Workloads")
    layout.add(
        24,
        8,
        table(
            "Workloads",
            "Per workload and GPU model: devices held and busy now, GPU-hours held and busy over the time range, p95 of the 5-minute busy share and the memory peak over the last day (recording rules), and the cost per hour.",
            ("namespace", "workload", "workload_kind", "model"),
            Column("GPUs held", f"sum by ({by_workload}) ({held})"),
            Column("Busy GPUs", f"sum by ({by_workload}) ({busy})"),
            Column("GPU-hours held", range_hours(held, by_workload), unit=GPU_HOURS),
            Column("GPU-hours busy", range_hours(busy, by_workload), unit=GPU_HOURS),
            Column(
                "p95 busy (1 day)",
                f"namespace_workload_model:gpu_pod_busy_seconds:p95_rate5m_1d{{{workload_scope}}}",
                unit="percentunit",
            ),
            Column(
                "Memory peak (1 day)",
                f"namespace_workload_model:gpu_pod_memory_used_bytes:max1d{{{workload_scope}}}",
                unit="bytes",
            ),
            Column("Cost / hour", f"sum by ({by_workload}) ({price})", unit="currencyUSD"),
            sort_by="GPU-hours held",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "GPUs held, by workload",
            "Devices allocated to each of the 10 workloads holding the most at each instant (stacked).",
            Query(f"topk(10, sum by (namespace, workload) ({held}))", "{{namespace}}/{{workload}}"),
            stack=True,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Busy GPU-equivalents, by workload",
            "Kernel time of the pods of each of the 10 busiest workloads at each instant, from the integrated per-pod counters' 5-minute rates (stacked).",
            Query(f"topk(10, sum by (namespace, workload) ({busy}))", "{{namespace}}/{{workload}}"),
            stack=True,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "GPU-hours held in range, by workload",
            "Device-hours allocated over the dashboard's time range to the 20 workloads that held the most.",
            Query(
                f"sort_desc(topk(20, {range_hours(held, 'namespace, workload')}))",
                "{{namespace}}/{{workload}}",
            ),
            unit=GPU_HOURS,
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "p95 utilization over a day, by workload",
            "95th percentile of the 5-minute busy share of each workload's busiest allocation over the last day: what rightsizing sizes against.",
            Query(
                f"sort_desc(namespace_workload_model:gpu_pod_busy_seconds:p95_rate5m_1d{{{workload_scope}}})",
                "{{namespace}}/{{workload}} ({{model}})",
            ),
            unit="percentunit",
            maximum=1,
        ),
    )

    layout.row("Pods")
    layout.add(
        12,
        8,
        timeseries(
            "Utilization distribution",
            "The selected namespaces' workloads (all of them: the distribution is recorded per namespace) by how busy they keep the devices they hold (busy GPU-equivalents over devices held, from the integrated per-pod counters' 5-minute rates), in steps of 10%: 0.3 counts the workloads over 20% and up to 30% busy (stacked).",
            Query(
                'sum by (utilization) (namespace_utilization:gpu_workloads:count{namespace=~"$namespace"})',
                "up to {{utilization}}",
            ),
            stack=True,
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Memory peak vs GPU memory",
            "The 20 selected workloads whose container's peak GPU memory over the last hour comes nearest its device's memory, as a share of it (recording rule). Low peaks fit a smaller MIG profile or GPU; the workloads table has each workload's peak over a day.",
            Query(
                f"sort_desc(topk(20, namespace_workload_model:gpu_pod_memory_used_ratio:max1h{{{workload_scope}}}))",
                "{{namespace}}/{{workload}} ({{model}})",
            ),
            unit="percentunit",
            maximum=1,
            thresholds=steps(("green", None), ("orange", 0.85), ("red", 0.95)),
        ),
    )
    layout.add(
        8,
        8,
        piechart(
            "Shared vs exclusive allocations",
            "The selected workloads' allocations of a device shared with other containers (time-slicing, MPS) vs a device of their own (recorded per workload: the pod variable does not narrow it).",
            Query(
                f"sum(namespace_workload_model:gpu_allocation_shared:count{{{workload_scope}}}) or vector(0)",
                "shared",
            ),
            Query(
                f"sum(namespace_workload_model:gpu_allocation_exclusive:count{{{workload_scope}}}) or vector(0)",
                "exclusive",
            ),
        ),
    )
    layout.add(
        16,
        8,
        table(
            "Allocations",
            f"The devices allocated to the selected pods, the {FLEET_ROWS} busiest when there are more (with every variable at All, a fleet has tens of thousands: narrow the namespace, workload or pod to list all of theirs): shared or not, whether a process of the holder runs there, and how busy the holder keeps it (unknown on a MIG instance, whose time NVML does not split per process).",
            ("namespace", "pod", "container", "resource", "node", "model", "gpu", "mig_profile"),
            Column(
                "Busy (5 min)",
                f"topk({FLEET_ROWS}, allocation_shared_in_use:gpu_pod_busy_seconds:rate5m{{{scope}}})",
                unit="percentunit",
                mappings=((-1, "unknown", "text"),),
            ),
            label_columns=(
                LabelColumn(
                    "shared", "Sharing", (("0", "exclusive", "text"), ("1", "shared", "blue"))
                ),
                LabelColumn("in_use", "In use", (("1", "yes", "green"), ("0", "no", "orange"))),
            ),
            sort_by="Busy (5 min)",
        ),
    )

    layout.row("Against the calibrated ceiling")
    layout.add(
        12,
        8,
        timeseries(
            "Memory bandwidth: achieved / calibrated",
            "On the workload's exclusive devices (averaged): DRAM activity times the datasheet bandwidth, as a share of the bandwidth calibration measured on that GPU type (5-minute rates). Near 1, the workload is memory-bound.",
            Query(
                f"namespace_workload_model:gpu_memory_bandwidth_calibrated:avg_ratio_rate5m{{{workload_scope}}}",
                "{{namespace}}/{{workload}} ({{model}})",
            ),
            unit="percentunit",
            max_points=FLEET_POINTS,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Tensor throughput: achieved / calibrated (FP16)",
            "On the workload's exclusive devices (averaged): tensor-core activity times the datasheet FP16 peak, as a share of the FP16 throughput calibration measured (5-minute rates). Near 1, the workload is compute-bound.",
            Query(
                f"namespace_workload_model:gpu_flops_fp16_calibrated:avg_ratio_rate5m{{{workload_scope}}}",
                "{{namespace}}/{{workload}} ({{model}})",
            ),
            unit="percentunit",
            max_points=FLEET_POINTS,
        ),
    )

    return dashboard(
        "gpuscope-workloads",
        "gpuscope / Workloads",
        "GPU use per namespace, workload and pod: what each holds and uses, GPU-hours and cost, utilization and memory against what the GPU offers, shared vs exclusive devices.",
        [
            query_variable(
                "namespace",
                "Namespace",
                "namespace_workload_model:gpu_allocation:share_sum",
                "namespace",
            ),
            query_variable(
                "workload",
                "Workload",
                'namespace_workload_model:gpu_allocation:share_sum{namespace=~"$namespace"}',
                "workload",
            ),
            query_variable(
                "pod",
                "Pod",
                f'gpu_allocation_info{{namespace=~"$namespace", workload=~"$workload", {selected_only("workload")}}}',
                "pod",
                description="The pods of the selected workloads: pick a workload first (at All the list stays empty rather than list every pod of the fleet).",
            ),
        ],
        layout,
    )
