"""The workloads dashboard (gpuscope-workloads): GPU use per namespace, workload and pod,
GPU-hours and cost, and how close each comes to the calibrated ceilings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.layout import Layout, dashboard, query_variable
from dashboards.panels import (
    GPU_HOURS,
    Column,
    Query,
    bargauge,
    heatmap,
    piechart,
    stat,
    steps,
    table,
    timeseries,
)
from dashboards.queries import range_hours

if TYPE_CHECKING:
    from dashboards.panels import Json


def make() -> Json:
    scope = 'namespace=~"$namespace", workload=~"$workload", pod=~"$pod"'
    workload_scope = 'namespace=~"$namespace", workload=~"$workload"'
    by_workload = "namespace, workload, workload_kind, model"
    exclusive = f"gpu_allocation_info{{{scope}}} unless on (uuid) (gpu_allocation_shared == 1)"
    layout = Layout()

    layout.row("Summary")
    layout.add(
        4,
        4,
        stat(
            "GPUs held",
            "Devices allocated to the selected workloads (a shared device split between its holders).",
            Query(f"sum(allocation:gpu_allocation:share{{{scope}}}) or vector(0)"),
            decimals=1,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Busy GPU-equivalents",
            "Kernel time on those devices: 2 GPUs each 50% busy = 1.",
            Query(f"sum(allocation:gpu_pod_busy_seconds:rate5m{{{scope}}}) or vector(0)"),
            decimals=2,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "GPU-hours held",
            "Device-hours allocated over the dashboard's time range.",
            Query(range_hours(f"sum(allocation:gpu_allocation:share{{{scope}}})")),
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
            Query(range_hours(f"sum(allocation:gpu_price_usd_per_hour:share{{{scope}}})")),
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
            Query(f"count(allocation:gpu_pod_busy_seconds:rate5m{{{scope}}} < 0.01) or vector(0)"),
            thresholds=steps(("green", None), ("orange", 1)),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Shared devices",
            "Devices time-sliced or MPS-shared between containers.",
            Query(f"count(count by (uuid) (gpu_allocation_shared{{{scope}}} == 1)) or vector(0)"),
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
            Column(
                "GPUs held", f"sum by ({by_workload}) (allocation:gpu_allocation:share{{{scope}}})"
            ),
            Column(
                "Busy GPUs",
                f"sum by ({by_workload}) (allocation:gpu_pod_busy_seconds:rate5m{{{scope}}})",
            ),
            Column(
                "GPU-hours held",
                range_hours(f"sum by ({by_workload}) (allocation:gpu_allocation:share{{{scope}}})"),
                unit=GPU_HOURS,
            ),
            Column(
                "GPU-hours busy",
                range_hours(
                    f"sum by ({by_workload}) (allocation:gpu_pod_busy_seconds:rate5m{{{scope}}})"
                ),
                unit=GPU_HOURS,
            ),
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
            Column(
                "Cost / hour",
                f"sum by ({by_workload}) (allocation:gpu_price_usd_per_hour:share{{{scope}}})",
                unit="currencyUSD",
            ),
            sort_by="GPU-hours held",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "GPUs held, by workload",
            "Devices allocated to each workload (stacked).",
            Query(
                f"sum by (namespace, workload) (allocation:gpu_allocation:share{{{scope}}})",
                "{{namespace}}/{{workload}}",
            ),
            stack=True,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Busy GPU-equivalents, by workload",
            "Kernel time of each workload's pods, from the integrated per-pod counters (stacked).",
            Query(
                f"sum by (namespace, workload) (rate(gpu_pod_busy_seconds_total{{{scope}}}[$__rate_interval]))",
                "{{namespace}}/{{workload}}",
            ),
            stack=True,
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "GPU-hours held in range, by workload",
            "Device-hours allocated to each workload over the dashboard's time range.",
            Query(
                f"sort_desc({range_hours(f'sum by (namespace, workload) (allocation:gpu_allocation:share{{{scope}}})')})",
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
        heatmap(
            "Utilization distribution",
            "How busy each pod keeps each of its GPUs over time (integrated per-pod counters), bucketed by 10%.",
            Query(
                f"rate(gpu_pod_busy_seconds_total{{{scope}}}[$__rate_interval])",
                "{{namespace}}/{{pod}} GPU {{gpu}}",
            ),
            unit="percentunit",
        ),
    )
    layout.add(
        12,
        8,
        bargauge(
            "Memory peak vs GPU memory",
            "Each pod's peak GPU memory over the dashboard's time range, as a share of the device's memory. Low peaks fit a smaller MIG profile or GPU.",
            Query(
                f"sort_desc(max by (namespace, pod, container, gpu, uuid) (max_over_time(gpu_pod_memory_used_bytes{{{scope}}}[$__range])) "
                "/ on (uuid) group_left () max by (uuid) (gpu_memory_total_bytes))",
                "{{namespace}}/{{pod}} GPU {{gpu}}",
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
            "Allocations of a device shared with other containers (time-slicing, MPS) vs a device of their own.",
            Query(f"count(gpu_allocation_shared{{{scope}}} == 1) or vector(0)", "shared"),
            Query(f"count(gpu_allocation_shared{{{scope}}} == 0) or vector(0)", "exclusive"),
        ),
    )
    layout.add(
        16,
        8,
        table(
            "Allocations",
            "Every device allocated to the selected pods: shared or not, whether a process of the holder runs there, and how busy the holder keeps it.",
            ("namespace", "pod", "container", "resource", "node", "model", "gpu", "mig_profile"),
            Column(
                "Sharing",
                f"gpu_allocation_shared{{{scope}}}",
                mappings=((0, "exclusive", "text"), (1, "shared", "blue")),
            ),
            Column(
                "In use",
                f"gpu_allocation_in_use{{{scope}}}",
                mappings=((1, "yes", "green"), (0, "no", "orange")),
            ),
            Column(
                "Busy (5 min)",
                f"allocation:gpu_pod_busy_seconds:rate5m{{{scope}}}",
                unit="percentunit",
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
            "On exclusive devices: DRAM activity times the datasheet bandwidth, as a share of the bandwidth calibration measured on that GPU type. Near 1, the workload is memory-bound.",
            Query(
                "(rate(gpu_dram_active_seconds_total[$__rate_interval])"
                " * on (uuid) gpu_datasheet_memory_bandwidth_bytes_per_second"
                " / on (uuid) gpu_calibrated_memory_bandwidth_bytes_per_second)"
                f" * on (uuid) group_right () ({exclusive})",
                "{{namespace}}/{{pod}} GPU {{gpu}}",
            ),
            unit="percentunit",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Tensor throughput: achieved / calibrated (FP16)",
            "On exclusive devices: tensor-core activity times the datasheet FP16 peak, as a share of the FP16 throughput calibration measured. Near 1, the workload is compute-bound.",
            Query(
                "(rate(gpu_tensor_active_seconds_total[$__rate_interval])"
                ' * on (uuid) gpu_datasheet_flops{dtype="fp16"}'
                ' / on (uuid) gpu_calibrated_flops{dtype="fp16"})'
                f" * on (uuid) group_right () ({exclusive})",
                "{{namespace}}/{{pod}} GPU {{gpu}}",
            ),
            unit="percentunit",
        ),
    )

    return dashboard(
        "gpuscope-workloads",
        "gpuscope / Workloads",
        "GPU use per namespace, workload and pod: what each holds and uses, GPU-hours and cost, utilization and memory against what the GPU offers, shared vs exclusive devices.",
        [
            query_variable("namespace", "Namespace", "gpu_allocation_info", "namespace"),
            query_variable(
                "workload", "Workload", 'gpu_allocation_info{namespace=~"$namespace"}', "workload"
            ),
            query_variable(
                "pod",
                "Pod",
                'gpu_allocation_info{namespace=~"$namespace", workload=~"$workload"}',
                "pod",
            ),
        ],
        layout,
    )
