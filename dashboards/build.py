"""Generate gpuscope's Grafana dashboards: `python -m dashboards.build` rewrites dashboards/*.json.

The JSON files are what users import and what the Helm chart ships; this module is their single
source, so the four dashboards share one look, one datasource variable and one set of helpers.
The tests check that the committed files equal this module's output (`--check` does the same).

Conventions every panel follows: the datasource is the `${datasource}` variable (no uid is
hard-coded); rates use `$__rate_interval`; utilization comes from the integrated `_seconds_total`
counters, not from sampled gauges; variables are multi-value with "All" = `.*`, so every matcher
on a variable is a regex matcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dashboards.layout import Layout, alerts_annotation, dashboard, query_variable
from dashboards.panels import (
    BAD_FROM_ONE,
    GPU_HOURS,
    Column,
    Query,
    bargauge,
    dashed,
    heatmap,
    negative_y,
    piechart,
    stat,
    state_timeline,
    steps,
    table,
    timeseries,
)
from dashboards.queries import SLOWDOWN_REASONS, THROTTLE_REASONS, range_hours, sel

if TYPE_CHECKING:
    from collections.abc import Callable

    from dashboards.panels import Json

DIRECTORY: Final = Path(__file__).resolve().parent


# -- the dashboards --------------------------------------------------------------------------------

NODE_DASHBOARD_LINK: Final = (
    "/d/gpuscope-node/gpuscope-node?${datasource:queryparam}&var-node=${__value.raw}"
)


def cluster_overview() -> Json:
    scope = 'node=~"$node", model=~"$model"'
    physical = sel('mig_profile=""', scope)
    idle = (
        "and on (namespace, pod, container, uuid) (allocation:gpu_pod_busy_seconds:rate5m < 0.01)"
    )
    uncorrected = sel(scope, 'type="uncorrected"')
    slowdown = sel(scope, f'reason=~"{SLOWDOWN_REASONS}"')
    throttled = sel(scope, f'reason=~"{THROTTLE_REASONS}"')
    layout = Layout()

    layout.row("Fleet")
    layout.add(
        4,
        4,
        stat(
            "GPUs",
            "Physical GPUs reporting (a MIG-split GPU counts once).",
            Query(f"count(gpu_info{{{physical}}})"),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "GPUs down",
            "GPUs that stopped answering NVML (gpu_up 0).",
            Query(f"count(gpu_up{{{scope}}} == 0) or vector(0)"),
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
            Query(f"count(count by (uuid) (gpu_allocation_info{{{scope}}})) or vector(0)"),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Utilization",
            "Average share of time a kernel ran, across GPUs, from the integrated busy counters.",
            Query(f"avg(rate(gpu_busy_seconds_total{{{scope}}}[$__rate_interval]))"),
            unit="percentunit",
            decimals=1,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Power draw",
            "Board power of all GPUs.",
            Query(f"sum(gpu_power_watts{{{scope}}})"),
            unit="watt",
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Idle allocations cost",
            "What the allocations that kept their GPU busy under 1% in the last 5 minutes cost per hour (on-demand price of the GPU, split between the holders of a shared one).",
            Query(f"sum(allocation:gpu_price_usd_per_hour:share{{{scope}}} {idle}) or vector(0)"),
            unit="currencyUSD",
            decimals=2,
            thresholds=steps(("green", None), ("orange", 1), ("red", 10)),
        ),
    )

    layout.row("Allocation and use")
    layout.add(
        12,
        8,
        timeseries(
            "GPUs: answering, allocated, in use, busy",
            "Answering: physical GPUs that answer NVML. Allocated: devices given to containers. In use: allocated devices on which a process of the holder runs. Busy: GPU-equivalents of kernel time, from the integrated counters (2 GPUs each 50% busy = 1).",
            Query(f"count(gpu_up{{{physical}}} == 1)", "answering"),
            Query(f"count(count by (uuid) (gpu_allocation_info{{{scope}}}))", "allocated"),
            Query(
                f"count(count by (uuid) (gpu_allocation_in_use{{{scope}}} == 1))",
                "in use by the holder",
            ),
            Query(
                f"sum(rate(gpu_busy_seconds_total{{{scope}}}[$__rate_interval]))",
                "busy (GPU-equivalents)",
            ),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Utilization by model",
            "Average share of time a kernel ran, per GPU model, from the integrated busy counters.",
            Query(
                f"avg by (model) (rate(gpu_busy_seconds_total{{{scope}}}[$__rate_interval]))",
                "{{model}}",
            ),
            unit="percentunit",
            maximum=1,
        ),
    )
    layout.add(
        8,
        7,
        bargauge(
            "GPUs by model",
            "Physical GPUs per model.",
            Query(f"count by (model) (gpu_info{{{physical}}})", "{{model}}"),
        ),
    )
    layout.add(
        16,
        7,
        table(
            "Nodes",
            "GPUs per node and model; utilization is the average over the dashboard's time range. Click a node for its dashboard.",
            ("node", "model"),
            Column("GPUs", f"count by (node, model) (gpu_info{{{physical}}})"),
            Column(
                "Down",
                f"sum by (node, model) (gpu_up{{{scope}}} == bool 0)",
                mappings=((0, "0", "green"),),
            ),
            Column(
                "Utilization (range)",
                f"avg by (node, model) (rate(gpu_busy_seconds_total{{{scope}}}[$__range]))",
                unit="percentunit",
            ),
            Column("Power", f"sum by (node, model) (gpu_power_watts{{{scope}}})", unit="watt"),
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
            "Allocated devices their holder kept busy under 1% of the last 5 minutes, and what each costs per hour. Held idle for 4 hours, they raise GpuAllocatedButIdle.",
            ("node", "namespace", "workload", "pod", "container", "model", "gpu"),
            Column(
                "Busy (5 min)",
                f"allocation:gpu_pod_busy_seconds:rate5m{{{scope}}} < 0.01",
                unit="percentunit",
            ),
            Column(
                "Cost / hour",
                f"allocation:gpu_price_usd_per_hour:share{{{scope}}} {idle}",
                unit="currencyUSD",
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
                f"sort_desc(sum by (namespace) (allocation:gpu_price_usd_per_hour:share{{{scope}}} {idle}))",
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
                f"topk(10, {range_hours(f'sum by (namespace) (allocation:gpu_allocation:share{{{scope}}})')})",
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
                f"topk(10, {range_hours(f'sum by (namespace) (allocation:gpu_pod_busy_seconds:rate5m{{{scope}}})')})",
                "{{namespace}}",
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
            Query(f"sum(gpu_ecc_errors_total{{{uncorrected}}}) or vector(0)"),
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
            Query(f"count(max by (uuid) (gpu_clock_event_active{{{slowdown}}}) == 1) or vector(0)"),
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
            Query(
                f"count(gpu_remapped_rows_pending{{{scope}}} == 1 or gpu_retired_pages_pending{{{scope}}} == 1) or vector(0)"
            ),
            thresholds=steps(("green", None), ("orange", 1)),
            sparkline=False,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Throttling by reason",
            "GPUs whose clocks a reason holds down, sampled; and, where the driver reports it, the integrated time in slowdown (GPU-seconds per second: 2 means two GPUs throttled all the time).",
            Query(
                f"sum by (reason) (gpu_clock_event_active{{{throttled}}})", "{{reason}} (GPUs now)"
            ),
            Query(
                f"sum by (reason) (rate(gpu_throttle_seconds_total{{{scope}}}[$__rate_interval]))",
                "{{reason}} (integrated)",
            ),
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
            query_variable("node", "Node", "gpu_info", "node"),
            query_variable("model", "GPU model", 'gpu_info{node=~"$node"}', "model"),
        ],
        layout,
        annotations=(alerts_annotation('alertname=~"Gpu.*", node=~"$node"'),),
    )


def node_dashboard() -> Json:
    scope = 'node=~"$node", gpu=~"$gpu"'
    gpu = "{{node}} GPU {{gpu}} {{mig_profile}}"
    sm_clock = sel(scope, 'clock="sm"')
    throttled = sel(scope, f'reason=~"{THROTTLE_REASONS}"')
    correctable = sel(scope, 'cause="correctable"')
    uncorrectable = sel(scope, 'cause="uncorrectable"')
    layout = Layout()

    layout.row("GPUs")
    layout.add(
        24,
        6,
        table(
            "GPUs",
            "Every GPU (and MIG instance) on the selected nodes with its identity, state and limits.",
            (
                "node",
                "gpu",
                "model",
                "mig_profile",
                "uuid",
                "pci_bus_id",
                "driver_version",
                "cuda_version",
            ),
            Column("", f"gpu_info{{{scope}}}"),
            Column("Up", f"gpu_up{{{scope}}}", mappings=((1, "up", "green"), (0, "down", "red"))),
            Column("Memory", f"gpu_memory_total_bytes{{{scope}}}", unit="bytes"),
            Column("Power limit", f"gpu_power_limit_watts{{{scope}}}", unit="watt"),
            Column("P-state", f"gpu_performance_state{{{scope}}}"),
            Column(
                "MIG mode",
                f"gpu_mig_mode_enabled{{{scope}}}",
                mappings=((1, "on", "blue"), (0, "off", "text")),
            ),
        ),
    )

    layout.row("Activity")
    layout.add(
        12,
        8,
        timeseries(
            "Utilization",
            "Share of time a kernel ran, from the integrated busy counter (the true average over each interval).",
            Query(f"rate(gpu_busy_seconds_total{{{scope}}}[$__rate_interval])", gpu),
            unit="percentunit",
            maximum=1,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "SM, tensor and DRAM activity",
            "GPM (Hopper and newer): share of time the SMs, tensor cores and DRAM were active, from the integrated counters. Utilization says a kernel ran; these say how much of the GPU it used.",
            Query(f"rate(gpu_sm_active_seconds_total{{{scope}}}[$__rate_interval])", f"{gpu} SM"),
            Query(
                f"rate(gpu_tensor_active_seconds_total{{{scope}}}[$__rate_interval])",
                f"{gpu} tensor",
            ),
            Query(
                f"rate(gpu_dram_active_seconds_total{{{scope}}}[$__rate_interval])", f"{gpu} DRAM"
            ),
            unit="percentunit",
            maximum=1,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "SM occupancy and pipe activity",
            "GPM: warps resident per SM relative to the maximum, and the share of time the FP64, FP32 and FP16 pipes were busy.",
            Query(f"gpu_sm_occupancy_ratio{{{scope}}}", f"{gpu} occupancy"),
            Query(f"gpu_fp64_active_ratio{{{scope}}}", f"{gpu} FP64"),
            Query(f"gpu_fp32_active_ratio{{{scope}}}", f"{gpu} FP32"),
            Query(f"gpu_fp16_active_ratio{{{scope}}}", f"{gpu} FP16"),
            unit="percentunit",
            maximum=1,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Memory bandwidth utilization",
            "Share of the last sample period in which device memory was read or written (NVML).",
            Query(f"gpu_memory_utilization_ratio{{{scope}}}", gpu),
            unit="percentunit",
            maximum=1,
        ),
    )

    layout.row("Memory")
    layout.add(
        16,
        8,
        timeseries(
            "Memory used",
            "Frame buffer in use, with the installed memory dashed.",
            Query(f"gpu_memory_used_bytes{{{scope}}}", gpu),
            Query(f"gpu_memory_total_bytes{{{scope}}}", f"{gpu} installed"),
            unit="bytes",
            overrides=(dashed("/installed$/"),),
        ),
    )
    layout.add(
        8,
        8,
        bargauge(
            "Memory in use now",
            "Share of each GPU's frame buffer in use.",
            Query(f"gpu_memory_used_bytes{{{scope}}} / gpu_memory_total_bytes{{{scope}}}", gpu),
            unit="percentunit",
            maximum=1,
            thresholds=steps(("green", None), ("orange", 0.85), ("red", 0.95)),
        ),
    )

    layout.row("Power, temperature and clocks")
    layout.add(
        12,
        8,
        timeseries(
            "Power draw and limit",
            "Board power, with the enforced power limit dashed.",
            Query(f"gpu_power_watts{{{scope}}}", gpu),
            Query(f"gpu_power_limit_watts{{{scope}}}", f"{gpu} limit"),
            unit="watt",
            overrides=(dashed("/limit$/"),),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Temperature",
            "GPU core temperature. Most data-centre GPUs start slowing down around 85-90 °C.",
            Query(f"gpu_temperature_celsius{{{scope}}}", gpu),
            unit="celsius",
            thresholds=steps(("green", None), ("orange", 85), ("red", 90)),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "SM clock and maximum",
            "Current SM clock, with the GPU's maximum dashed: a gap under load is throttling.",
            Query(f"gpu_clock_hertz{{{sm_clock}}}", gpu),
            Query(f"gpu_clock_max_hertz{{{sm_clock}}}", f"{gpu} maximum"),
            unit="hertz",
            overrides=(dashed("/maximum$/"),),
        ),
    )
    layout.add(
        12,
        8,
        state_timeline(
            "Clocks held down",
            "When a clock-event reason held a GPU's clocks down: power cap, sync boost, thermal or power-brake slowdown. Empty is good.",
            Query(f"gpu_clock_event_active{{{throttled}}} == 1", "{{node}} GPU {{gpu}} {{reason}}"),
            states=((1, "active", "orange"),),
            no_value="No throttling",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Time throttled, by reason",
            "Share of time in each slowdown reason, integrated by the driver (catches throttling between samples).",
            Query(
                f"rate(gpu_throttle_seconds_total{{{scope}}}[$__rate_interval])",
                f"{gpu} {{{{reason}}}}",
            ),
            unit="percentunit",
            maximum=1,
        ),
    )
    layout.add(
        6,
        8,
        timeseries(
            "Fan speed",
            "Actively cooled cards only; passive data-centre GPUs have no fan series.",
            Query(f"gpu_fan_speed_ratio{{{scope}}}", f"{gpu} fan {{{{fan}}}}"),
            unit="percentunit",
            maximum=1,
        ),
    )
    layout.add(
        6,
        8,
        timeseries(
            "Performance state",
            "P0 is the fastest, P8 and up idle.",
            Query(f"gpu_performance_state{{{scope}}}", gpu),
            stepped=True,
        ),
    )

    layout.row("Interconnect")
    for link, title, description in (
        ("pcie", "PCIe throughput", "Bytes per second to (up) and from (down) the host."),
        (
            "nvlink",
            "NVLink throughput",
            "Bytes per second received (up) and transmitted (down) over NVLink.",
        ),
    ):
        layout.add(
            9,
            8,
            timeseries(
                title,
                description,
                Query(f"gpu_{link}_receive_bytes_per_second{{{scope}}}", f"{gpu} rx"),
                Query(f"gpu_{link}_transmit_bytes_per_second{{{scope}}}", f"{gpu} tx"),
                unit="Bps",
                minimum=None,
                overrides=(negative_y("/tx$/"),),
            ),
        )
    layout.add(
        6,
        8,
        timeseries(
            "PCIe replays",
            "Link errors the PCIe link recovered from, per second. A steady rate points at a bad riser, slot or cable.",
            Query(f"rate(gpu_pcie_replays_total{{{scope}}}[$__rate_interval])", gpu),
        ),
    )

    layout.row("Processes and pods")
    layout.add(
        12,
        8,
        table(
            "Processes",
            "Compute processes on each GPU (host pids), their memory and their share of the last sample period.",
            ("node", "gpu", "pid"),
            Column("Memory", f"gpu_process_memory_used_bytes{{{scope}}}", unit="bytes"),
            Column("Busy", f"gpu_process_utilization_ratio{{{scope}}}", unit="percentunit"),
            sort_by="Memory",
        ),
    )
    layout.add(
        12,
        8,
        table(
            "Pods",
            "Containers with processes on each GPU: memory and share of the last sample period, per pod even on a shared GPU.",
            ("node", "gpu", "namespace", "pod", "container", "workload"),
            Column("Memory", f"gpu_pod_memory_used_bytes{{{scope}}}", unit="bytes"),
            Column("Busy", f"gpu_pod_utilization_ratio{{{scope}}}", unit="percentunit"),
            sort_by="Memory",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "GPU time by pod",
            "Share of each GPU's time that each pod's kernels ran, from the integrated per-pod counters; stacked per GPU.",
            Query(
                f"sum by (node, gpu, namespace, pod) (rate(gpu_pod_busy_seconds_total{{{scope}}}[$__rate_interval]))",
                "{{node}} GPU {{gpu}} {{namespace}}/{{pod}}",
            ),
            unit="percentunit",
            stack=True,
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Memory by pod",
            "GPU memory per pod, and memory held by processes that belong to no pod (stacked).",
            Query(
                f"sum by (node, gpu, namespace, pod) (gpu_pod_memory_used_bytes{{{scope}}})",
                "{{node}} GPU {{gpu}} {{namespace}}/{{pod}}",
            ),
            Query(f"gpu_unattributed_memory_used_bytes{{{scope}}}", "{{node}} GPU {{gpu}} no pod"),
            unit="bytes",
            stack=True,
        ),
    )

    layout.row("Errors")
    layout.add(
        8,
        8,
        timeseries(
            "ECC errors",
            "ECC errors since the driver loaded. Uncorrected ones raise GpuUncorrectableEccErrors.",
            Query(f"gpu_ecc_errors_total{{{scope}}}", f"{gpu} {{{{type}}}}"),
            stepped=True,
        ),
    )
    layout.add(
        8,
        8,
        table(
            "Memory repairs",
            "Rows remapped (A100 and newer) and pages retired (older GPUs), and whether a repair waits for a reset or has failed.",
            ("node", "gpu"),
            Column(
                "Remapped (correctable)", f"max by (node, gpu) (gpu_remapped_rows{{{correctable}}})"
            ),
            Column(
                "Remapped (uncorrectable)",
                f"max by (node, gpu) (gpu_remapped_rows{{{uncorrectable}}})",
            ),
            Column(
                "Remap pending",
                f"max by (node, gpu) (gpu_remapped_rows_pending{{{scope}}})",
                mappings=((0, "no", "green"), (1, "reset needed", "orange")),
            ),
            Column(
                "Remap failed",
                f"max by (node, gpu) (gpu_remapped_rows_failed{{{scope}}})",
                mappings=((0, "no", "green"), (1, "replace GPU", "red")),
            ),
            Column("Retired pages", f"sum by (node, gpu) (gpu_retired_pages{{{scope}}})"),
            Column(
                "Retirement pending",
                f"max by (node, gpu) (gpu_retired_pages_pending{{{scope}}})",
                mappings=((0, "no", "green"), (1, "reset needed", "orange")),
            ),
        ),
    )
    layout.add(
        8,
        8,
        table(
            "XIDs",
            "XID errors per GPU since the daemon started.",
            ("node", "gpu", "xid"),
            Column("Count", f"sum by (node, gpu, xid) (gpu_xid_errors_total{{{scope}}})"),
            sort_by="Count",
        ),
    )

    return dashboard(
        "gpuscope-node",
        "gpuscope / Node",
        "Each GPU of the selected nodes: activity, memory, power, heat, clocks and throttling, interconnect, the processes and pods on it, and errors.",
        [
            query_variable("node", "Node", "gpu_info", "node"),
            query_variable("gpu", "GPU", 'gpu_info{node=~"$node"}', "gpu", numeric=True),
        ],
        layout,
        annotations=(alerts_annotation('alertname=~"Gpu.*", node=~"$node"'),),
    )


def workloads_dashboard() -> Json:
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


def exporter_dashboard() -> Json:
    scope = 'job=~"$job", node=~"$node"'
    daemon = "{{node}} {{instance}}"
    layout = Layout()

    layout.row("Targets")
    layout.add(
        4,
        4,
        stat(
            "Targets up",
            "gpuscope daemons Prometheus scraped successfully.",
            Query(f"sum(up{{{scope}}})"),
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Targets down",
            "gpuscope targets Prometheus cannot scrape (GpuscopeExporterDown).",
            Query(f"count(up{{{scope}}} == 0) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Failing collectors",
            "Sources (nvml, kubernetes, podresources, cgroups, calibration) that failed in the last cycle, and background tasks (events, web_config) waiting to be restarted.",
            Query(f"count(gpuscope_collector_success{{{scope}}} == 0) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Oldest sample",
            "Age of the oldest last-finished sampling cycle among the daemons (GpuscopeSamplesStale over 2 minutes).",
            Query(f"max(time() - gpuscope_last_sample_timestamp_seconds{{{scope}}})"),
            unit="s",
            decimals=1,
            thresholds=steps(("green", None), ("orange", 10), ("red", 120)),
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Overruns in range",
            "Sampling cycles that outlasted --collect.interval during the time range.",
            Query(f"sum(increase(gpuscope_sample_overruns_total{{{scope}}}[$__range]))"),
            decimals=0,
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        4,
        4,
        stat(
            "Pod watches down",
            "Daemons whose watch on the Kubernetes API is down.",
            Query(f"count(gpuscope_kubernetes_watch_up{{{scope}}} == 0) or vector(0)"),
            thresholds=BAD_FROM_ONE,
            sparkline=False,
        ),
    )
    layout.add(
        24,
        7,
        table(
            "Daemons",
            "Every gpuscope target: scrape state, version, age of its last sample and the cost of scraping it.",
            ("node", "instance", "version", "python_version"),
            Column(
                "Up",
                f"max by (node, instance) (up{{{scope}}})",
                mappings=((1, "up", "green"), (0, "down", "red")),
            ),
            Column(
                "",
                f"max by (node, instance, version, python_version) (gpuscope_build_info{{{scope}}})",
            ),
            Column(
                "Sample age",
                f"max by (node, instance) (time() - gpuscope_last_sample_timestamp_seconds{{{scope}}})",
                unit="s",
            ),
            Column(
                "Scrape duration",
                f"max by (node, instance) (scrape_duration_seconds{{{scope}}})",
                unit="s",
            ),
            Column("Samples", f"max by (node, instance) (scrape_samples_scraped{{{scope}}})"),
        ),
    )

    layout.row("Sampling")
    layout.add(
        12,
        8,
        state_timeline(
            "Collector success",
            "Whether each source answered in each sampling cycle.",
            Query(f"gpuscope_collector_success{{{scope}}}", "{{node}} {{collector}}"),
            states=((1, "ok", "green"), (0, "failing", "red")),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Collector duration",
            "Time each source took in the last sampling cycle.",
            Query(f"gpuscope_collector_duration_seconds{{{scope}}}", "{{node}} {{collector}}"),
            unit="s",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Sample age",
            "Seconds since each daemon last finished a sampling cycle. A hung GPU does not hold cycles up; a wedged sampler does, until /-/healthy fails and the kubelet restarts the daemon.",
            Query(f"time() - gpuscope_last_sample_timestamp_seconds{{{scope}}}", daemon),
            unit="s",
            thresholds=steps(("green", None), ("red", 120)),
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Sampling cycles and overruns",
            "Cycles completed per second (1/--collect.interval when healthy) and cycles that ran late.",
            Query(
                f"rate(gpuscope_sample_cycles_total{{{scope}}}[$__rate_interval])",
                f"{daemon} cycles",
            ),
            Query(
                f"rate(gpuscope_sample_overruns_total{{{scope}}}[$__rate_interval])",
                f"{daemon} overruns",
            ),
            unit="ops",
        ),
    )

    layout.row("Faults and footprint")
    layout.add(
        8,
        8,
        timeseries(
            "GPUs down, by reason",
            "GPUs each daemon reports down (gpu_up 0) and why: lost to the driver, hung in a driver call, not opened, or an unexpected error reading them.",
            Query(
                f"sum by (node, instance, reason) (gpu_down_reason{{{scope}}})",
                f"{daemon} {{{{reason}}}}",
            ),
            stepped=True,
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Sampling errors and restarts",
            "Unexpected errors met while sampling (the log names each once), and restarts of the daemon (a wedged sampler fails /-/healthy, and the kubelet restarts it).",
            Query(
                f"increase(gpuscope_sample_errors_total{{{scope}}}[$__rate_interval])",
                f"{daemon} errors",
            ),
            Query(
                f"changes(process_start_time_seconds{{{scope}}}[$__rate_interval])",
                f"{daemon} restarts",
            ),
            stepped=True,
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Resident memory",
            "Memory each daemon holds (process_resident_memory_bytes): paid on every GPU node.",
            Query(f"process_resident_memory_bytes{{{scope}}}", daemon),
            unit="bytes",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "CPU used",
            "CPU seconds per second each daemon uses (its sampling, rendering and serving).",
            Query(f"rate(process_cpu_seconds_total{{{scope}}}[$__rate_interval])", daemon),
            unit="percentunit",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Open file descriptors",
            "File descriptors each daemon holds, as a share of its limit (connections, NVML, sockets).",
            Query(
                f"process_open_fds{{{scope}}} / process_max_fds{{{scope}}}",
                daemon,
            ),
            unit="percentunit",
        ),
    )

    layout.row("Scrapes")
    layout.add(
        12,
        8,
        timeseries(
            "Scrape duration",
            "How long Prometheus took to scrape each daemon (the daemon serves pre-rendered bytes, so this stays flat as GPUs and pods grow).",
            Query(f"scrape_duration_seconds{{{scope}}}", daemon),
            unit="s",
        ),
    )
    layout.add(
        12,
        8,
        timeseries(
            "Samples per scrape",
            "Series each daemon exposes: grows with GPUs, processes and pods.",
            Query(f"scrape_samples_scraped{{{scope}}}", daemon),
        ),
    )

    layout.row("Kubernetes")
    layout.add(
        8,
        8,
        state_timeline(
            "Pod watch",
            "Whether each daemon's list+watch of the pods on its node is connected.",
            Query(f"gpuscope_kubernetes_watch_up{{{scope}}}", "{{node}}"),
            states=((1, "watching", "green"), (0, "down", "red")),
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Pod cache age",
            "Seconds since each daemon's pod cache last heard from the API server.",
            Query(f"gpuscope_kubernetes_cache_age_seconds{{{scope}}}", "{{node}}"),
            unit="s",
        ),
    )
    layout.add(
        8,
        8,
        timeseries(
            "Pods cached",
            "Pods on each node the daemon knows about.",
            Query(f"gpuscope_pods_cached{{{scope}}}", "{{node}}"),
        ),
    )
    layout.add(
        24,
        6,
        table(
            "Active exporter alerts",
            "gpuscope's alerts about itself that are pending or firing.",
            ("alertname", "alertstate", "severity", "node", "instance", "collector"),
            Column(
                "",
                'sum by (alertname, alertstate, severity, node, instance, collector) (ALERTS{alertname=~"Gpuscope.*", job=~"$job"})',
            ),
        ),
    )

    return dashboard(
        "gpuscope-exporter",
        "gpuscope / Exporter health",
        "The gpuscope daemons themselves: scrape state, collectors, sampling, scrape cost and the pod watch.",
        [
            query_variable("job", "Job", "gpuscope_build_info", "job"),
            query_variable("node", "Node", 'up{job=~"$job"}', "node"),
        ],
        layout,
    )


DASHBOARDS: Final = {
    "cluster-overview.json": cluster_overview,
    "node.json": node_dashboard,
    "workloads.json": workloads_dashboard,
    "exporter-health.json": exporter_dashboard,
}


def render(make: Callable[[], Json]) -> str:
    """A dashboard as the committed file holds it: stable key order, two-space indent."""
    return json.dumps(make(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs instead of writing"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        path = DIRECTORY / name
        text = render(make)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"dashboards out of date (run python -m dashboards.build): {', '.join(stale)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
