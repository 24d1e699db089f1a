"""A snapshot's GPUs -> their families: identity, every value the GPUs gave, their processes.

The value families come straight from the declarations (`exporter.readings.VALUE_FAMILIES`):
each series a GPU filled becomes a sample of its family, so a new reading needs nothing here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.metrics.base import add, gpu_labels, new_metric
from exporter.readings import VALUE_FAMILIES
from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from exporter.model import GpuSample

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
    *VALUE_FAMILIES,
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
    metrics = {family: new_metric(family) for family in VALUE_FAMILIES}
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
