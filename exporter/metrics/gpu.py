"""A snapshot's GPUs -> their families: identity, every value the GPUs gave, their processes.

The value families come straight from the declarations (`exporter.readings.VALUE_FAMILIES`):
each series a GPU filled becomes a sample of its family, so a new reading needs nothing here. They
are written in `WRITTEN_FIRST`'s order, then any family declared since, in declaration order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.metrics.base import add, gpu_labels, new_metric
from exporter.readings import VALUE_FAMILIES
from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from prometheus_client.core import Metric

    from exporter.model import GpuSample

WRITTEN_FIRST: Final = (
    "gpu_utilization_ratio",
    "gpu_busy_seconds",
    "gpu_memory_utilization_ratio",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_memory_reserved_bytes",
    "gpu_memory_free_bytes",
    "gpu_power_watts",
    "gpu_power_limit_watts",
    "gpu_power_limit_min_watts",
    "gpu_power_limit_max_watts",
    "gpu_power_limit_default_watts",
    "gpu_energy_joules",
    "gpu_temperature_celsius",
    "gpu_memory_temperature_celsius",
    "gpu_encoder_utilization_ratio",
    "gpu_decoder_utilization_ratio",
    "gpu_compute_mode_info",
    "gpu_persistence_mode_enabled",
    "gpu_clock_hertz",
    "gpu_clock_max_hertz",
    "gpu_clock_event_active",
    "gpu_fan_speed_ratio",
    "gpu_ecc_errors",
    "gpu_ecc_errors_aggregate",
    "gpu_pcie_replays",
    "gpu_pcie_link_generation",
    "gpu_pcie_link_max_generation",
    "gpu_pcie_link_width",
    "gpu_pcie_link_max_width",
    "gpu_performance_state",
    "gpu_graphics_active_ratio",
    "gpu_sm_active_ratio",
    "gpu_sm_occupancy_ratio",
    "gpu_tensor_active_ratio",
    "gpu_dram_active_ratio",
    "gpu_fp64_active_ratio",
    "gpu_fp32_active_ratio",
    "gpu_fp16_active_ratio",
    "gpu_pcie_transmit_bytes_per_second",
    "gpu_pcie_receive_bytes_per_second",
    "gpu_nvlink_transmit_bytes_per_second",
    "gpu_nvlink_receive_bytes_per_second",
    "gpu_sm_active_seconds",
    "gpu_tensor_active_seconds",
    "gpu_dram_active_seconds",
    "gpu_nvlink_transmit_bytes",
    "gpu_nvlink_receive_bytes",
    "gpu_nvlink_errors",
    "gpu_xid_errors",
    "gpu_last_xid_timestamp_seconds",
    "gpu_throttle_seconds",
    "gpu_remapped_rows",
    "gpu_remapped_rows_pending",
    "gpu_remapped_rows_failed",
    "gpu_retired_pages",
    "gpu_retired_pages_pending",
    "gpu_mig_mode_enabled",
)
"""The value families' order on `/metrics` and in the metrics reference, kept as it was when the
declarations were one module (the golden files and the metrics reference hold it). A family not named here
is written after these, in declaration order: a new reading needs no line here."""


def in_exposition_order(families: Iterable[Family]) -> tuple[Family, ...]:
    """`families` in the order they are written: `WRITTEN_FIRST`, then the others."""
    declared = tuple(families)
    by_name = {family.name: family for family in declared}
    unknown = [name for name in WRITTEN_FIRST if name not in by_name]
    if unknown:
        raise ValueError(f"WRITTEN_FIRST names families nobody declares: {', '.join(unknown)}")
    named = frozenset(WRITTEN_FIRST)
    return (
        *(by_name[name] for name in WRITTEN_FIRST),
        *(family for family in declared if family.name not in named),
    )


GPU_VALUE_FAMILIES: Final = in_exposition_order(VALUE_FAMILIES)
"""Every family a GPU's `values` fill, in the order they are written."""

INFO: Final = Family(
    "gpu_info",
    "GPU identity; always 1. Join on uuid for driver, CUDA and PCI details.",
    labels=("pci_bus_id", "driver_version", "cuda_version"),
    doc="identity; always 1",
    labels_doc="`pci_bus_id`, `driver_version`, `cuda_version` (a MIG instance adds `parent_uuid`)",
)
UP: Final = Family(
    "gpu_up",
    "1 while the GPU answers NVML, 0 when it is lost, hung or cannot be read.",
    doc="1 while the GPU answers NVML, 0 when it is lost, hung or cannot be read",
)
DOWN_REASON: Final = Family(
    "gpu_down_reason",
    "1 for the reason a GPU is down (gpu_up 0): lost (the driver lost it), hung (its driver "
    "calls have not returned), unopened (listed but cannot be opened), error (unexpected "
    "error reading it).",
    labels=("reason",),
    doc="1 for why a GPU is down: lost to the driver (a lifecycle error such as `GPU_IS_LOST`), "
    "hung (its driver calls have not returned), unopened (listed but cannot be opened), error "
    "(an unexpected error reading it); absent while it is up",
    labels_doc="`reason` (`lost`, `hung`, `unopened`, `error`)",
)
PROCESSES: Final = Family(
    "gpu_processes",
    "Compute processes running on the GPU (MPS clients included).",
    doc="compute processes on the GPU, MPS clients included",
    collector="processes",
)
PROCESS_LABELS_DOC: Final = (
    "`pid`; with `--collect.process-names` also `process_name` (empty where the driver cannot "
    "name the process)"
)
PROCESS_MEMORY: Final = Family(
    "gpu_process_memory_used_bytes",
    "GPU memory used by one process.",
    unit="bytes",
    labels=("pid",),
    doc="memory of one process (host pid); with `--collector.processes` only (off by default)",
    labels_doc=PROCESS_LABELS_DOC,
    collector="processes",
)
PROCESS_UTILIZATION: Final = Family(
    "gpu_process_utilization_ratio",
    "Share of the last sample period in which this process had a kernel running.",
    unit="ratio",
    labels=("pid",),
    doc="share of the last sample period in which that process ran a kernel",
    labels_doc="as above",
    collector="processes",
)
FAMILIES: Final = (
    INFO,
    UP,
    DOWN_REASON,
    *GPU_VALUE_FAMILIES,
    PROCESSES,
    PROCESS_MEMORY,
    PROCESS_UTILIZATION,
)
"""Every GPU family, in the order they are written."""


def gpu_families(gpus: tuple[GpuSample, ...], *, per_process: bool = True) -> Iterator[Metric]:
    yield from _identity(gpus)
    yield from _values(gpus)
    yield from _processes(gpus, per_process=per_process)


def _identity(gpus: tuple[GpuSample, ...]) -> Iterator[Metric]:
    info, up, down = new_metric(INFO), new_metric(UP), new_metric(DOWN_REASON)
    for sample in gpus:
        identity = sample.identity
        parent = (("parent_uuid", identity.parent_uuid),) if identity.is_mig_instance else ()
        labels = gpu_labels(identity)
        details = labels.with_pairs(
            ("pci_bus_id", identity.pci_bus_id),
            ("driver_version", identity.driver_version),
            ("cuda_version", identity.cuda_version),
            *parent,
        )
        add(info, details, 1)
        add(up, labels.base, 1 if sample.up else 0)
        if not sample.up and sample.down_reason is not None:
            add(down, labels.with_pairs(("reason", sample.down_reason)), 1)
    yield from (info, up, down)


def _values(gpus: tuple[GpuSample, ...]) -> Iterator[Metric]:
    metrics = {family: new_metric(family) for family in GPU_VALUE_FAMILIES}
    for sample in gpus:
        labels = gpu_labels(sample.identity)
        for series, value in sample.values.items():
            family = series.family
            if sample.up or family.while_down:
                add(
                    metrics[family],
                    labels.with_pairs(*series.labels) if series.labels else labels.base,
                    value,
                )
    yield from metrics.values()


def _processes(gpus: tuple[GpuSample, ...], *, per_process: bool) -> Iterator[Metric]:
    count = new_metric(PROCESSES)
    memory = new_metric(PROCESS_MEMORY)
    busy = new_metric(PROCESS_UTILIZATION)
    for sample in gpus:
        if not sample.up or sample.processes is None:
            continue
        gpu = gpu_labels(sample.identity)
        add(count, gpu.base, len(sample.processes))
        if not per_process:
            continue
        for process in sample.processes:
            pid = ("pid", str(process.pid))
            name = process.name
            # With --collect.process-names every process carries the label, "" when unnamed.
            labels = (
                gpu.with_pairs(pid) if name is None else gpu.with_pairs(pid, ("process_name", name))
            )
            if process.used_memory_bytes is not None:
                add(memory, labels, process.used_memory_bytes)
            if process.sm_utilization is not None:
                add(busy, labels, process.sm_utilization)
    yield from (count, memory, busy)
