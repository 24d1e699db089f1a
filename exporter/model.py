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


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """Whether one source answered this cycle, and how long it took."""

    name: str
    success: bool
    duration_seconds: float


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
    ceilings: tuple[Ceilings, ...] = ()
    """Per GPU model present: calibrated and datasheet figures, and price."""
