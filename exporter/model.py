"""The snapshot: everything one sampling cycle learned, immutable once built.

The sampler builds a `Snapshot` in its worker thread; exposition turns it into metric families
and bytes. Nothing downstream calls NVML, reads /proc or asks the Kubernetes API. A value the
hardware could not give is `None` (its series is then absent, never a fake zero).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What names a GPU in every series: `gpu` (index), `uuid`, `model`, plus `gpu_info` labels."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    minor_number: int | None = None
    """The N of /dev/nvidiaN; some device plugins name GPUs `nvidiaN` instead of by UUID."""
    mig_profile: str = ""
    """For a MIG instance: its profile as NVIDIA names it (`3g.40gb`); empty for a whole GPU."""
    gpu_instance: int | None = None
    """For a MIG instance: its GPU instance id; `index` is then the parent GPU's index."""
    parent_uuid: str = ""
    """For a MIG instance: the UUID of the physical GPU it is carved from."""

    @property
    def is_mig_instance(self) -> bool:
        return self.gpu_instance is not None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process running on one GPU. `pid` is a host pid."""

    pid: int
    used_memory_bytes: int | None
    sm_utilization: float | None
    """Share of the sample window in which this process had a kernel running, 0..1."""
    memory_utilization: float | None


@dataclass(frozen=True, slots=True)
class Clocks:
    """Clock frequencies in hertz."""

    sm: float | None = None
    memory: float | None = None
    graphics: float | None = None


@dataclass(frozen=True, slots=True)
class Activity:
    """Where the GPU's time went over the last GPM window: ratios 0..1, throughput in bytes/s.
    Each is None when the GPU cannot give it (before Hopper only PCIe throughput is known)."""

    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    nvlink_transmit_bytes_per_second: float | None = None
    nvlink_receive_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """HBM row remapping (A100 and newer): rows remapped so far, and whether a reset is due."""

    correctable: int
    uncorrectable: int
    pending: bool
    """A remapping waits for the next GPU reset."""
    failed: bool
    """A remapping failed: the GPU should be serviced."""


@dataclass(frozen=True, slots=True)
class RetiredPages:
    """Page retirement (GPUs before A100): pages retired so far, and whether a reset is due."""

    single_bit: int
    double_bit: int
    pending: bool | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. When `up` is False only `identity` (last known) is meaningful."""

    identity: GpuIdentity
    up: bool
    down_reason: str | None = None
    """Why a GPU is down: `lost`, `hung`, `unopened` or `error` (see `exporter.nvml.sampler`)."""
    busy_seconds_total: float | None = None
    """Utilization integrated over time since the daemon started: the counter behind rate()."""
    utilization: float | None = None
    memory_utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_celsius: float | None = None
    clocks: Clocks = Clocks()
    max_clocks: Clocks = Clocks()
    clock_event_reasons: int | None = None
    """The raw NVML clock-event (throttle) bitmask; exposition names the bits."""
    fan_speeds: tuple[float | None, ...] = ()
    """Per fan, the target speed as a ratio of its maximum."""
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    pcie_replays_total: int | None = None
    performance_state: int | None = None
    processes: tuple[ProcessSample, ...] | None = None
    """None when the process list could not be read (not an empty GPU)."""
    activity: Activity = Activity()
    """Profiling-class activity from GPM (Hopper and newer), PCIe throughput on older GPUs."""
    sm_active_seconds_total: float | None = None
    """SM activity integrated over the GPM sample windows: the counter behind rate()."""
    tensor_active_seconds_total: float | None = None
    dram_active_seconds_total: float | None = None
    xid_errors: tuple[tuple[int, int], ...] = ()
    """(XID, times seen since the daemon started), ordered by XID; only XIDs seen at least once."""
    last_xid_timestamp_seconds: float | None = None
    throttle_seconds: tuple[tuple[str, float], ...] = ()
    """(reason, cumulative seconds the clocks were held down for it) for the reasons the GPU gives."""
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None
    mig_mode_enabled: bool | None = None
    """On a physical GPU that supports MIG: whether MIG mode is on."""


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """Whether one source answered this cycle, and how long it took."""

    name: str
    success: bool
    duration_seconds: float | None
    """None for a background task (the event thread, the web-config watch): it has no cycle."""


@dataclass(frozen=True, slots=True)
class Ceilings:
    """What one GPU model can do: measured by `gpuscope calibrate`, and the catalog's datasheet.

    Rates are per second: FLOP/s per dtype (int8 in integer OP/s), bytes per second."""

    model: str
    """The model name NVML reports, as in `GpuIdentity.model`."""
    calibrated_flops: tuple[tuple[str, float], ...] = ()
    """(dtype, rate) for every dtype the calibration measured."""
    calibrated_memory_bandwidth: float | None = None
    calibrated_host_to_device: float | None = None
    calibrated_device_to_host: float | None = None
    calibrated_launch_latency_seconds: float | None = None
    datasheet_flops: tuple[tuple[str, float], ...] = ()
    datasheet_memory_bandwidth: float | None = None
    price_usd_per_hour: float | None = None
    """On-demand price of one such GPU (the catalog's default provider and region)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    timestamp: float
    """Wall-clock time (Unix seconds) at which the cycle finished."""
    gpus: tuple[GpuSample, ...]
    collectors: tuple[CollectorStatus, ...]
    cycles_total: int = 0
    overruns_total: int = 0
    """Cycles that started late because the previous one outlasted the interval."""
    errors_total: int = 0
    """Unexpected errors met while sampling (a reading, a GPU or a whole cycle)."""
    collect_interval_seconds: float | None = None
    """The configured sampling interval, so that rules can tell a stale sample by it."""
    ceilings: tuple[Ceilings, ...] = ()
    """Per GPU model present: calibrated and datasheet figures, and price."""
    attribution: Attribution | None = None
    """Who holds and who uses each GPU; None when pod attribution is off (no cluster)."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What names a pod in series: namespace, pod and the workload a person would name."""

    namespace: str
    name: str
    uid: str
    workload: str
    workload_kind: str
    labels: tuple[tuple[str, str], ...] = ()
    """Pod labels chosen by --kubernetes.pod-labels, as (Prometheus label name, value), sorted."""


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One container's use of one GPU: its processes' memory and utilization, summed."""

    pod: PodIdentity
    container: str
    gpu: GpuIdentity
    memory_used_bytes: int | None
    """Sum of its processes' memory; None if NVML gave none (0 when it runs nothing here)."""
    utilization: float | None
    """Sum of its processes' per-process utilization (capped at 1); None if NVML gave none."""
    busy_seconds_total: float | None
    """`utilization` integrated over time; never goes down while the pod lives."""
    processes: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """The kubelet gave this GPU (or a share of it) to this container."""

    pod: PodIdentity
    container: str
    resource: str
    gpu: GpuIdentity
    in_use: bool | None
    """At least one process of the holding container runs on the GPU; None while the GPU or its
    process list does not answer."""
    shared: bool
    """Time-sliced (`<uuid>::N` ids) or held by more than one container."""


@dataclass(frozen=True, slots=True)
class Unattributed:
    """Processes on one GPU that map to no pod (not in a container, or the pod is unknown)."""

    gpu: GpuIdentity
    processes: int
    memory_used_bytes: int


@dataclass(frozen=True, slots=True)
class KubernetesStatus:
    watch_up: bool
    """The pod cache follows the API server right now."""
    cache_age_seconds: float | None
    """How long ago the cache was last known to be current (0 while the watch is up); None
    before the first list."""
    pods_cached: int


@dataclass(frozen=True, slots=True)
class Attribution:
    node: str
    pods: tuple[PodIdentity, ...]
    """Pods that hold or use a GPU of this node (gpu_pod_info)."""
    usage: tuple[PodUsage, ...]
    allocations: tuple[Allocation, ...]
    unattributed: tuple[Unattributed, ...]
    kubernetes: KubernetesStatus
