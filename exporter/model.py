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
    duration_seconds: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    timestamp: float
    """Wall-clock time (Unix seconds) at which the cycle finished."""
    gpus: tuple[GpuSample, ...]
    collectors: tuple[CollectorStatus, ...]
    cycles_total: int = 0
    overruns_total: int = 0
    """Cycles that started late because the previous one outlasted the interval."""
