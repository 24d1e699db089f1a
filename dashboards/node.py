"""The node dashboard (gpuscope-node): each GPU of the selected nodes, from activity, memory,
power, heat and clocks to the interconnect, the processes and pods on it, and errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.layout import Layout, alerts_annotation, dashboard, query_variable
from dashboards.panels import (
    Column,
    Query,
    bargauge,
    dashed,
    negative_y,
    state_timeline,
    steps,
    table,
    timeseries,
)
from dashboards.queries import THROTTLE_REASONS, sel

if TYPE_CHECKING:
    from dashboards.panels import Json


def make() -> Json:
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
        10,
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
        6,
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
