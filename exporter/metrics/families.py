"""Snapshot -> Prometheus metric families. Pure: the same snapshot always gives the same families.

Families are built fresh from each snapshot (prometheus_client's custom-collector pattern), so a
GPU, process or pod that vanished is simply absent from the next render; nothing to unregister.
Names follow DESIGN.md: base units, `_ratio` for 0..1, `_total` for counters; every GPU series
carries `gpu`, `uuid` and `model`.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from exporter.metrics.labels import LabelCache, LabelSet

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from exporter.model import (
        Attribution,
        Ceilings,
        GpuIdentity,
        GpuSample,
        PodIdentity,
        Snapshot,
    )

GPU_LABELS: Final = ("gpu", "uuid", "model")

CLOCK_EVENT_REASONS: Final = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
"""NVML clock-event (throttle) reason bits and the `reason` label each becomes."""


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    python_version: str = platform.python_version()


def _gauge(
    name: str, documentation: str, labels: Iterable[str] = (), unit: str = ""
) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[*GPU_LABELS, *labels], unit=unit)


def _counter(
    name: str, documentation: str, labels: Iterable[str] = (), unit: str = ""
) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=[*GPU_LABELS, *labels], unit=unit)


def _identity_pairs(identity: GpuIdentity) -> list[tuple[str, str]]:
    """`gpu`, `uuid`, `model`; a MIG instance adds `mig_profile` and `gpu_instance`."""
    pairs = [("gpu", str(identity.index)), ("uuid", identity.uuid), ("model", identity.model)]
    if identity.is_mig_instance:
        pairs += [
            ("mig_profile", identity.mig_profile),
            ("gpu_instance", str(identity.gpu_instance)),
        ]
    return pairs


gpu_labels: Final[LabelCache[GpuIdentity]] = LabelCache(_identity_pairs)
"""The labels of a GPU's series: `.base`, and `.with_pairs(("clock", "sm"))` variants, made once."""


def _add(family: Metric, labels: LabelSet, value: float) -> None:
    """One series (prometheus_client's add_metric, without rebuilding the label dict)."""
    name = f"{family.name}_total" if family.type == "counter" else family.name
    family.samples.append(Sample(name, labels, value))


def _scalar(
    family: GaugeMetricFamily | CounterMetricFamily,
    samples: Iterable[GpuSample],
    value: Callable[[GpuSample], float | None],
) -> GaugeMetricFamily | CounterMetricFamily:
    """One series per GPU that is up and can give the value."""
    for sample in samples:
        number = value(sample)
        if number is not None:
            _add(family, gpu_labels(sample.identity).base, number)
    return family


def gpu_families(gpus: tuple[GpuSample, ...]) -> Iterator[Metric]:
    up = [sample for sample in gpus if sample.up]

    info = _gauge(
        "gpu_info",
        "GPU identity; always 1. Join on uuid for driver, CUDA and PCI details.",
        ("pci_bus_id", "driver_version", "cuda_version"),
    )
    alive = _gauge(
        "gpu_up", "1 while the GPU answers NVML, 0 when it is lost, hung or cannot be read."
    )
    down = _gauge(
        "gpu_down_reason",
        "1 for the reason a GPU is down (gpu_up 0): lost (the driver lost it), hung (its driver "
        "calls have not returned), unopened (listed but cannot be opened), error (unexpected "
        "error reading it).",
        ("reason",),
    )
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
        _add(info, details, 1)
        _add(alive, labels.base, 1 if sample.up else 0)
        if not sample.up and sample.down_reason is not None:
            _add(down, labels.with_pairs(("reason", sample.down_reason)), 1)
    yield info
    yield alive
    yield down

    yield _scalar(
        _gauge(
            "gpu_utilization_ratio",
            "Share of the last sample period in which a kernel was running (NVML utilization).",
            unit="ratio",
        ),
        up,
        lambda s: s.utilization,
    )
    yield _scalar(
        _counter(
            "gpu_busy_seconds",
            "Utilization integrated over time at the sampling rate; rate() gives the true average.",
            unit="seconds",
        ),
        up,
        lambda s: s.busy_seconds_total,
    )
    yield _scalar(
        _gauge(
            "gpu_memory_utilization_ratio",
            "Share of the last sample period in which device memory was read or written.",
            unit="ratio",
        ),
        up,
        lambda s: s.memory_utilization,
    )
    yield _scalar(
        _gauge("gpu_memory_used_bytes", "Frame buffer memory in use by processes.", unit="bytes"),
        up,
        lambda s: s.memory_used_bytes,
    )
    yield _scalar(
        _gauge("gpu_memory_total_bytes", "Frame buffer memory installed.", unit="bytes"),
        up,
        lambda s: s.memory_total_bytes,
    )
    yield _scalar(
        _gauge(
            "gpu_memory_reserved_bytes",
            "Frame buffer memory reserved by the driver and firmware.",
            unit="bytes",
        ),
        up,
        lambda s: s.memory_reserved_bytes,
    )
    yield _scalar(
        _gauge("gpu_power_watts", "Power draw of the whole board.", unit="watts"),
        up,
        lambda s: s.power_watts,
    )
    yield _scalar(
        _gauge("gpu_power_limit_watts", "Power limit the driver enforces.", unit="watts"),
        up,
        lambda s: s.power_limit_watts,
    )
    yield _scalar(
        _counter(
            "gpu_energy_joules",
            "Energy consumed since the driver was loaded (resets when it reloads).",
            unit="joules",
        ),
        up,
        lambda s: s.energy_joules_total,
    )
    yield _scalar(
        _gauge("gpu_temperature_celsius", "GPU core temperature.", unit="celsius"),
        up,
        lambda s: s.temperature_celsius,
    )

    clock = _gauge("gpu_clock_hertz", "Current clock frequency.", ("clock",), unit="hertz")
    clock_max = _gauge("gpu_clock_max_hertz", "Maximum clock frequency.", ("clock",), unit="hertz")
    events = _gauge(
        "gpu_clock_event_active",
        "1 while the named clock-event (throttle) reason holds the clocks down.",
        ("reason",),
    )
    fans = _gauge(
        "gpu_fan_speed_ratio", "Fan speed as a share of its maximum.", ("fan",), unit="ratio"
    )
    ecc = _counter(
        "gpu_ecc_errors",
        "ECC memory errors since the driver was loaded, by type (corrected or uncorrected).",
        ("type",),
    )
    for sample in up:
        labels = gpu_labels(sample.identity)
        for name in ("sm", "memory", "graphics"):
            current = getattr(sample.clocks, name)
            if current is not None:
                _add(clock, labels.with_pairs(("clock", name)), current)
            peak = getattr(sample.max_clocks, name)
            if peak is not None:
                _add(clock_max, labels.with_pairs(("clock", name)), peak)
        if sample.clock_event_reasons is not None:
            for bit, reason in CLOCK_EVENT_REASONS:
                active = 1 if sample.clock_event_reasons & bit else 0
                _add(events, labels.with_pairs(("reason", reason)), active)
        for number, speed in enumerate(sample.fan_speeds):
            if speed is not None:
                _add(fans, labels.with_pairs(("fan", str(number))), speed)
        if sample.ecc_corrected_total is not None:
            _add(ecc, labels.with_pairs(("type", "corrected")), sample.ecc_corrected_total)
        if sample.ecc_uncorrected_total is not None:
            _add(ecc, labels.with_pairs(("type", "uncorrected")), sample.ecc_uncorrected_total)
    yield from (clock, clock_max, events, fans, ecc)

    yield _scalar(
        _counter("gpu_pcie_replays", "PCIe replay events (link errors the link recovered from)."),
        up,
        lambda s: s.pcie_replays_total,
    )
    yield _scalar(
        _gauge("gpu_performance_state", "Performance state: 0 (P0, fastest) to 15 (P15, slowest)."),
        up,
        lambda s: s.performance_state,
    )
    yield from process_families(up)


def process_families(up: list[GpuSample]) -> Iterator[Metric]:
    count = _gauge("gpu_processes", "Compute processes running on the GPU (MPS clients included).")
    memory = _gauge(
        "gpu_process_memory_used_bytes", "GPU memory used by one process.", ("pid",), unit="bytes"
    )
    busy = _gauge(
        "gpu_process_utilization_ratio",
        "Share of the last sample period in which this process had a kernel running.",
        ("pid",),
        unit="ratio",
    )
    for sample in up:
        if sample.processes is None:
            continue
        gpu = gpu_labels(sample.identity)
        _add(count, gpu.base, len(sample.processes))
        for process in sample.processes:
            labels = gpu.with_pairs(("pid", str(process.pid)))
            if process.used_memory_bytes is not None:
                _add(memory, labels, process.used_memory_bytes)
            if process.sm_utilization is not None:
                _add(busy, labels, process.sm_utilization)
    yield from (count, memory, busy)


def ceiling_families(snapshot: Snapshot) -> Iterator[Metric]:
    """What each GPU's model can do (calibrated, datasheet) and costs, beside the live series."""
    by_model = {ceilings.model: ceilings for ceilings in snapshot.ceilings}
    known = [
        (sample, by_model[sample.identity.model])
        for sample in snapshot.gpus
        if sample.up and sample.identity.model in by_model
    ]
    calibrated_flops = _gauge(
        "gpu_calibrated_flops",
        "Dense matmul rate this GPU model reached in gpuscope calibrate, per dtype "
        "(operations per second; int8 counts integer operations).",
        ("dtype",),
    )
    datasheet_flops = _gauge(
        "gpu_datasheet_flops",
        "Dense peak rate of this GPU model per dtype from the catalog's datasheet figures "
        "(operations per second).",
        ("dtype",),
    )
    for sample, ceilings in known:
        labels = gpu_labels(sample.identity)
        for dtype, rate in ceilings.calibrated_flops:
            _add(calibrated_flops, labels.with_pairs(("dtype", dtype)), rate)
        for dtype, rate in ceilings.datasheet_flops:
            _add(datasheet_flops, labels.with_pairs(("dtype", dtype)), rate)

    def scalar(
        name: str, documentation: str, unit: str, value: Callable[[Ceilings], float | None]
    ) -> GaugeMetricFamily:
        family = _gauge(name, documentation, unit=unit)
        for sample, ceilings in known:
            number = value(ceilings)
            if number is not None:
                _add(family, gpu_labels(sample.identity).base, number)
        return family

    yield calibrated_flops
    yield scalar(
        "gpu_calibrated_memory_bandwidth_bytes_per_second",
        "Device memory bandwidth this GPU model reached in gpuscope calibrate "
        "(the better of a streaming copy and a read-only reduction).",
        "bytes_per_second",
        lambda c: c.calibrated_memory_bandwidth,
    )
    yield scalar(
        "gpu_calibrated_host_to_device_bytes_per_second",
        "Host-to-device copy bandwidth from pinned memory this GPU model reached in calibration.",
        "bytes_per_second",
        lambda c: c.calibrated_host_to_device,
    )
    yield scalar(
        "gpu_calibrated_device_to_host_bytes_per_second",
        "Device-to-host copy bandwidth into pinned memory this GPU model reached in calibration.",
        "bytes_per_second",
        lambda c: c.calibrated_device_to_host,
    )
    yield scalar(
        "gpu_calibrated_launch_latency_seconds",
        "Time per launch of a tiny PyTorch kernel on this GPU model, measured in calibration.",
        "seconds",
        lambda c: c.calibrated_launch_latency_seconds,
    )
    yield datasheet_flops
    yield scalar(
        "gpu_datasheet_memory_bandwidth_bytes_per_second",
        "Device memory bandwidth of this GPU model from the catalog's datasheet figures.",
        "bytes_per_second",
        lambda c: c.datasheet_memory_bandwidth,
    )
    yield scalar(
        "gpu_price_usd_per_hour",
        "On-demand price of one GPU of this model from the catalog "
        "(its default provider and region), in US dollars per hour.",
        "",
        lambda c: c.price_usd_per_hour,
    )


def exporter_families(snapshot: Snapshot, build: BuildInfo) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "gpuscope_build_info",
        "gpuscope's version and the Python it runs on; always 1.",
        labels=["version", "python_version"],
    )
    info.add_metric([build.version, build.python_version], 1)
    yield info
    success = GaugeMetricFamily(
        "gpuscope_collector_success",
        "1 if the source answered in the last sampling cycle, 0 if it failed.",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "gpuscope_collector_duration_seconds",
        "Time the source took in the last sampling cycle.",
        labels=["collector"],
        unit="seconds",
    )
    for status in snapshot.collectors:
        success.add_metric([status.name], 1 if status.success else 0)
        if status.duration_seconds is not None:
            duration.add_metric([status.name], status.duration_seconds)
    yield success
    yield duration
    last = GaugeMetricFamily(
        "gpuscope_last_sample_timestamp_seconds",
        "Unix time at which the last sampling cycle finished.",
        unit="seconds",
    )
    last.add_metric([], snapshot.timestamp)
    yield last
    cycles = CounterMetricFamily("gpuscope_sample_cycles", "Sampling cycles completed.")
    cycles.add_metric([], snapshot.cycles_total)
    yield cycles
    overruns = CounterMetricFamily(
        "gpuscope_sample_overruns",
        "Sampling cycles that outlasted the collect interval, so the next one started late.",
    )
    overruns.add_metric([], snapshot.overruns_total)
    yield overruns
    errors = CounterMetricFamily(
        "gpuscope_sample_errors",
        "Unexpected errors met while sampling: in one reading (its series is omitted), one GPU "
        "(gpu_down_reason error) or a whole cycle (skipped). The log says what, once per error.",
    )
    errors.add_metric([], snapshot.errors_total)
    yield errors
    interval = GaugeMetricFamily(
        "gpuscope_collect_interval_seconds",
        "The configured sampling interval (--collect.interval).",
        unit="seconds",
    )
    if snapshot.collect_interval_seconds is not None:
        interval.add_metric([], snapshot.collect_interval_seconds)
    yield interval


POD_LABELS: Final = ("namespace", "pod", "container", "workload", "workload_kind")


def _row_pairs(row: tuple[GpuIdentity, PodIdentity, str]) -> list[tuple[str, str]]:
    gpu, pod, container = row
    return [
        *_identity_pairs(gpu),
        ("namespace", pod.namespace),
        ("pod", pod.name),
        ("container", container),
        ("workload", pod.workload),
        ("workload_kind", pod.workload_kind),
    ]


_row_labels: Final[LabelCache[tuple[GpuIdentity, PodIdentity, str]]] = LabelCache(_row_pairs)
"""One pod row's labels (GPU, pod, container), made once and shared by the row's series in every
family and every cycle: pod rows are most of a node's series."""


def attribution_families(attribution: Attribution | None) -> Iterator[Metric]:
    """Who holds and who uses each GPU; nothing at all when attribution is off."""
    if attribution is None:
        return
    memory = _gauge(
        "gpu_pod_memory_used_bytes",
        "GPU memory used by a container's processes on this GPU.",
        POD_LABELS,
        unit="bytes",
    )
    utilization = _gauge(
        "gpu_pod_utilization_ratio",
        "Share of the last sample period in which a container's processes ran a kernel on this "
        "GPU (summed per-process utilization, so shared GPUs split truthfully).",
        POD_LABELS,
        unit="ratio",
    )
    busy = _counter(
        "gpu_pod_busy_seconds",
        "A container's utilization of this GPU integrated over time; rate() gives its average.",
        POD_LABELS,
        unit="seconds",
    )
    for use in attribution.usage:
        labels = _row_labels((use.gpu, use.pod, use.container)).base
        if use.memory_used_bytes is not None:
            memory.samples.append(Sample(memory.name, labels, use.memory_used_bytes))
        if use.utilization is not None:
            utilization.samples.append(Sample(utilization.name, labels, use.utilization))
        if use.busy_seconds_total is not None:
            busy.samples.append(Sample(f"{busy.name}_total", labels, use.busy_seconds_total))
    yield from (memory, utilization, busy)

    allocation_labels = (*POD_LABELS, "resource")
    info = _gauge(
        "gpu_allocation_info",
        "The kubelet allocated this GPU to this container (device plugin resource); always 1.",
        allocation_labels,
    )
    in_use = _gauge(
        "gpu_allocation_in_use",
        "1 when at least one process of the holding container runs on the allocated GPU, "
        "0 when it holds the GPU idle.",
        allocation_labels,
    )
    shared = _gauge(
        "gpu_allocation_shared",
        "1 when the allocated GPU is shared: time-sliced replicas or more than one holder.",
        allocation_labels,
    )
    for allocation in attribution.allocations:
        labels = _row_labels((allocation.gpu, allocation.pod, allocation.container)).with_pairs(
            ("resource", allocation.resource)
        )
        info.samples.append(Sample(info.name, labels, 1))
        if allocation.in_use is not None:
            in_use.samples.append(Sample(in_use.name, labels, 1 if allocation.in_use else 0))
        shared.samples.append(Sample(shared.name, labels, 1 if allocation.shared else 0))
    yield from (info, in_use, shared)

    pod_info = GaugeMetricFamily(
        "gpu_pod_info",
        "A pod that holds or uses a GPU on this node, its workload and chosen pod labels; "
        "always 1.",
    )
    for pod in attribution.pods:
        pod_labels = {
            "namespace": pod.namespace,
            "pod": pod.name,
            "workload": pod.workload,
            "workload_kind": pod.workload_kind,
            "node": attribution.node,
            **dict(pod.labels),
        }
        pod_info.samples.append(Sample("gpu_pod_info", pod_labels, 1))
    yield pod_info

    stray_memory = _gauge(
        "gpu_unattributed_memory_used_bytes",
        "GPU memory used by processes that map to no pod (outside Kubernetes, or a pod not known yet).",
        unit="bytes",
    )
    stray = _gauge("gpu_unattributed_processes", "Processes on the GPU that map to no pod.")
    for unattributed in attribution.unattributed:
        labels = gpu_labels(unattributed.gpu).base
        _add(stray_memory, labels, unattributed.memory_used_bytes)
        _add(stray, labels, unattributed.processes)
    yield from (stray_memory, stray)

    kubernetes = attribution.kubernetes
    watch_up = GaugeMetricFamily(
        "gpuscope_kubernetes_watch_up",
        "1 while the pod cache follows the Kubernetes API (list + watch), 0 while it cannot.",
    )
    watch_up.add_metric([], 1 if kubernetes.watch_up else 0)
    yield watch_up
    age = GaugeMetricFamily(
        "gpuscope_kubernetes_cache_age_seconds",
        "How long ago the pod cache was last known to be current (0 while the watch is up).",
        unit="seconds",
    )
    if kubernetes.cache_age_seconds is not None:
        age.add_metric([], kubernetes.cache_age_seconds)
    yield age
    cached = GaugeMetricFamily("gpuscope_pods_cached", "Pods on this node in the pod cache.")
    cached.add_metric([], kubernetes.pods_cached)
    yield cached


ACTIVITY_RATIOS: Final = (
    (
        "gpu_sm_active_ratio",
        "sm_active",
        "Share of time the SMs had at least one warp resident, averaged over the SMs (GPM).",
    ),
    (
        "gpu_sm_occupancy_ratio",
        "sm_occupancy",
        "Resident warps as a share of the SMs' maximum, averaged over the SMs (GPM).",
    ),
    (
        "gpu_tensor_active_ratio",
        "tensor_active",
        "Share of time the SMs ran tensor-core instructions (GPM).",
    ),
    (
        "gpu_dram_active_ratio",
        "dram_active",
        "Device memory bandwidth used as a share of its peak (GPM).",
    ),
    (
        "gpu_fp64_active_ratio",
        "fp64_active",
        "Share of time the SMs ran non-tensor FP64 math (GPM).",
    ),
    (
        "gpu_fp32_active_ratio",
        "fp32_active",
        "Share of time the SMs ran non-tensor FP32 math (GPM).",
    ),
    (
        "gpu_fp16_active_ratio",
        "fp16_active",
        "Share of time the SMs ran non-tensor FP16 math (GPM).",
    ),
)
"""GPM activity ratios: (metric, `Activity` field, help)."""

THROUGHPUTS: Final = (
    (
        "gpu_pcie_transmit_bytes_per_second",
        "pcie_transmit_bytes_per_second",
        "PCIe traffic from the GPU to the host (GPM, or a 20 ms window before Hopper).",
    ),
    (
        "gpu_pcie_receive_bytes_per_second",
        "pcie_receive_bytes_per_second",
        "PCIe traffic from the host to the GPU (GPM, or a 20 ms window before Hopper).",
    ),
    (
        "gpu_nvlink_transmit_bytes_per_second",
        "nvlink_transmit_bytes_per_second",
        "NVLink traffic sent by the GPU over all its links (GPM).",
    ),
    (
        "gpu_nvlink_receive_bytes_per_second",
        "nvlink_receive_bytes_per_second",
        "NVLink traffic received by the GPU over all its links (GPM).",
    ),
)

ACTIVITY_COUNTERS: Final = (
    (
        "gpu_sm_active_seconds",
        "sm_active_seconds_total",
        "SM activity integrated over time; rate() gives the true average SM activity.",
    ),
    (
        "gpu_tensor_active_seconds",
        "tensor_active_seconds_total",
        "Tensor-core activity integrated over time; rate() gives its true average.",
    ),
    (
        "gpu_dram_active_seconds",
        "dram_active_seconds_total",
        "DRAM bandwidth use integrated over time; rate() gives its true average.",
    ),
)


def activity_families(gpus: tuple[GpuSample, ...]) -> Iterator[Metric]:
    """Where the GPU's time goes: GPM profiling metrics (Hopper and newer) and PCIe throughput."""
    up = [sample for sample in gpus if sample.up]
    for name, field, documentation in ACTIVITY_RATIOS:
        yield _scalar(
            _gauge(name, documentation, unit="ratio"), up, attrgetter(f"activity.{field}")
        )
    for name, field, documentation in THROUGHPUTS:
        yield _scalar(_gauge(name, documentation), up, attrgetter(f"activity.{field}"))
    for name, field, documentation in ACTIVITY_COUNTERS:
        yield _scalar(_counter(name, documentation, unit="seconds"), up, attrgetter(field))


def health_families(gpus: tuple[GpuSample, ...]) -> Iterator[Metric]:
    """What an operator pages on: XID errors, time spent throttled, memory repairs, MIG mode."""
    xids = _counter(
        "gpu_xid_errors",
        "XID critical errors reported by the driver since gpuscope started, by XID.",
        ("xid",),
    )
    last_xid = _gauge(
        "gpu_last_xid_timestamp_seconds",
        "Unix time of the last XID critical error gpuscope saw.",
        unit="seconds",
    )
    # XIDs stay visible for a GPU that is down: XID 79 is the GPU falling off the bus.
    for sample in gpus:
        labels = gpu_labels(sample.identity)
        for xid, count in sample.xid_errors:
            _add(xids, labels.with_pairs(("xid", str(xid))), count)
        if sample.last_xid_timestamp_seconds is not None:
            _add(last_xid, labels.base, sample.last_xid_timestamp_seconds)
    yield xids
    yield last_xid

    up = [sample for sample in gpus if sample.up]
    throttle = _counter(
        "gpu_throttle_seconds",
        "Time the clocks were held below their target, by reason (NVML violation counters).",
        ("reason",),
        unit="seconds",
    )
    rows = _gauge(
        "gpu_remapped_rows",
        "Memory rows remapped to spare rows so far, by the cause (correctable or uncorrectable errors).",
        ("cause",),
    )
    rows_pending = _gauge(
        "gpu_remapped_rows_pending", "1 while a row remapping waits for the next GPU reset."
    )
    rows_failed = _gauge(
        "gpu_remapped_rows_failed", "1 if a row remapping failed: the GPU needs servicing."
    )
    pages = _gauge(
        "gpu_retired_pages",
        "Memory pages retired so far, by cause (multiple single-bit or a double-bit ECC error).",
        ("cause",),
    )
    pages_pending = _gauge(
        "gpu_retired_pages_pending", "1 while a page retirement waits for the next GPU reset."
    )
    mig_mode = _gauge("gpu_mig_mode_enabled", "1 if MIG mode is on for this physical GPU.")
    for sample in up:
        labels = gpu_labels(sample.identity)
        for reason, seconds in sample.throttle_seconds:
            _add(throttle, labels.with_pairs(("reason", reason)), seconds)
        if sample.remapped_rows is not None:
            remapped = sample.remapped_rows
            _add(rows, labels.with_pairs(("cause", "correctable")), remapped.correctable)
            _add(rows, labels.with_pairs(("cause", "uncorrectable")), remapped.uncorrectable)
            _add(rows_pending, labels.base, 1 if remapped.pending else 0)
            _add(rows_failed, labels.base, 1 if remapped.failed else 0)
        if sample.retired_pages is not None:
            retired = sample.retired_pages
            _add(pages, labels.with_pairs(("cause", "single_bit")), retired.single_bit)
            _add(pages, labels.with_pairs(("cause", "double_bit")), retired.double_bit)
            if retired.pending is not None:
                _add(pages_pending, labels.base, 1 if retired.pending else 0)
        if sample.mig_mode_enabled is not None:
            _add(mig_mode, labels.base, 1 if sample.mig_mode_enabled else 0)
    yield from (throttle, rows, rows_pending, rows_failed, pages, pages_pending, mig_mode)


def snapshot_families(snapshot: Snapshot, build: BuildInfo) -> list[Metric]:
    """Every family for one snapshot, GPU series first, in a stable order."""
    return [
        *gpu_families(snapshot.gpus),
        *activity_families(snapshot.gpus),
        *health_families(snapshot.gpus),
        *ceiling_families(snapshot),
        *attribution_families(snapshot.attribution),
        *exporter_families(snapshot, build),
    ]
