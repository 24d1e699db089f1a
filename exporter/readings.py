"""Every plain NVML reading, declared once: the driver call, the conversion to base units, the
oldest architecture that has it, the series it fills, and what the simulator answers for it.

From these declarations come the sampler's reads (`exporter.nvml.device`), the snapshot's values
(`GpuSample.values`, keyed by the declared `Series`), the metric families (`exporter.metrics`),
the simulator's answers (`exporter.simulator`, which serves every declared call) and the README's
metrics table. Adding a plain metric is one declaration here (and its family in
`VALUE_FAMILIES`) plus a test. A declaration may also be read once per fan or per active NVLink
link (`per`), or be a field value (`field`: a GPU's field values are read together, in one
`nvmlDeviceGetFieldValues` call per cycle). Readings that are not one call and a conversion —
process lists, GPM, throttle time, MIG enumeration — have code of their own, with their
families declared beside them.

A declaration's `simulated` function answers in the driver's own form (milliwatts, a struct, a
bitmask), from a `SimulatedGpu`; it may raise pynvml's errors, as the driver does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Protocol

import pynvml

from exporter.catalog import ARCHITECTURES
from exporter.series import Family, Series
from exporter.structs import filled

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from exporter.catalog import GpuModel


_MHZ: Final = 1e6
_MIG_ARCHITECTURES: Final = frozenset({"ampere", "hopper", "blackwell"})
_PAGE_RETIREMENT_ARCHITECTURES: Final = frozenset({"volta", "turing"})


def not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class SimulatedGpu(Protocol):
    """What a simulated GPU offers the declarations' `simulated` answers."""

    @property
    def model(self) -> GpuModel: ...
    @property
    def utilization(self) -> float: ...
    @property
    def memory_utilization(self) -> float: ...
    @property
    def power_watts(self) -> float: ...
    @property
    def temperature(self) -> float: ...
    @property
    def energy_millijoules(self) -> float: ...
    @property
    def ecc_corrected(self) -> int: ...
    @property
    def ecc_uncorrected(self) -> int: ...
    @property
    def mig_configured(self) -> bool:
        """MIG mode is on (the fleet gives the GPU a MIG layout)."""

    @property
    def mig_active(self) -> bool:
        """MIG instances exist right now."""

    @property
    def working(self) -> bool:
        """Some process runs on it now."""

    @property
    def nvlink_links(self) -> int:
        """Active NVLink links (0: a card without NVLink)."""

    @property
    def nvlink_bytes(self) -> tuple[float, float]:
        """Bytes sent and received over all its NVLink links since the driver loaded."""

    def clock_mhz(self, kind: str) -> int: ...
    def clock_events(self) -> int: ...
    def memory(self, position: int | None) -> tuple[int, int, int]:
        """(total, reserved, used) bytes of the GPU, or of its MIG instance in `position`."""


@dataclass(frozen=True, slots=True)
class Output:
    """One series a reading fills, and how to get its value from the driver's answer."""

    series: Series
    value: Callable[[Any], float | None]


@dataclass(frozen=True, slots=True, eq=False)
class Reading:
    """One driver call per GPU per cycle, and the series it fills."""

    name: str
    """Short and stable: log lines and the "stop asking" bookkeeping use it."""
    call: str
    """The driver function (pynvml's name); called as `call(handle, *args)`."""
    outputs: tuple[Output, ...]
    args: tuple[object, ...] = ()
    since: str = "kepler"
    """The oldest architecture that has it (the simulator answers NotSupported before)."""
    collector: str = "device"
    """Which `--collector.<name>` reads it."""
    mig: bool = False
    """Also read on each MIG instance (else on whole GPUs only)."""
    once: bool = False
    """Read once per NVML initialisation (a fact that does not change, such as a peak clock)."""
    period: float | None = None
    """Read at most this often (in seconds): counters and states that change rarely."""
    per: str | None = None
    """`fan`: read once per fan of the GPU; `link`: once per NVLink link that was active when
    NVML initialised. The index is the first argument after the handle (a field value's
    `scopeId`) and a label of the outputs' series (`fan` or `link`): the outputs are templates,
    `each(series, per, index)` the series one index fills."""
    field: int | None = None
    """A field value (`NVML_FI_DEV_*`; `call` is then `nvmlDeviceGetFieldValues`). A GPU's field
    values are read together, in one call per cycle, and each answers alone: a field the GPU
    lacks drops only its series. Read every cycle, on whole GPUs."""
    fallback: Reading | None = None
    """Read instead where this one is unavailable (an older function of an older driver)."""
    simulated: Callable[..., Any] | None = None
    """The simulator's answer: `(gpu: SimulatedGpu, *args)` with the call's arguments after the
    handle; a `mig` reading's takes `(gpu, position, *args)`, `position` the MIG instance's place
    in the GPU's layout (None for the whole GPU)."""

    def __post_init__(self) -> None:
        if self.since not in ARCHITECTURES:
            raise ValueError(f"{self.name}: unknown architecture {self.since!r}")
        if self.per not in (None, "fan", "link"):
            raise ValueError(f"{self.name}: per {self.per!r} is not fan or link")
        if self.per is not None and (self.fallback is not None or self.once):
            raise ValueError(
                f"{self.name}: a per-{self.per} reading has no fallback and is not read once"
            )
        if self.field is not None and (
            self.call != "nvmlDeviceGetFieldValues"
            or self.per == "fan"
            or self.args
            or self.once
            or self.period is not None
            or self.mig
            or self.fallback is not None
        ):
            raise ValueError(
                f"{self.name}: a field value is called as nvmlDeviceGetFieldValues, with no "
                "arguments, every cycle, on whole GPUs, per GPU or per link, without a fallback"
            )


def _percent(value: float | None) -> float | None:
    return value / 100.0 if value is not None else None


def _number(value: float | None) -> float | None:
    return float(value) if value is not None else None


def _scaled(factor: float) -> Callable[[Any], float | None]:
    def convert(value: Any) -> float | None:
        return value * factor if value is not None else None

    return convert


def _per(divisor: float) -> Callable[[Any], float | None]:
    """milli- to base units, percent to ratio: divided, as exactly as the driver's number allows."""

    def convert(value: Any) -> float | None:
        return value / divisor if value is not None else None

    return convert


# -- families ------------------------------------------------------------------------------------

UTILIZATION_FAMILY: Final = Family(
    "gpu_utilization_ratio",
    "Share of the last sample period in which a kernel was running (NVML utilization).",
    unit="ratio",
    doc="share of the last sample period in which a kernel ran",
    collector="device",
)
MEMORY_UTILIZATION_FAMILY: Final = Family(
    "gpu_memory_utilization_ratio",
    "Share of the last sample period in which device memory was read or written.",
    unit="ratio",
    collector="device",
)
MEMORY_USED_FAMILY: Final = Family(
    "gpu_memory_used_bytes",
    "Frame buffer memory in use by processes.",
    unit="bytes",
    doc="frame buffer in use",
    collector="device",
)
MEMORY_TOTAL_FAMILY: Final = Family(
    "gpu_memory_total_bytes",
    "Frame buffer memory installed.",
    unit="bytes",
    doc="frame buffer installed",
    collector="device",
)
MEMORY_RESERVED_FAMILY: Final = Family(
    "gpu_memory_reserved_bytes",
    "Frame buffer memory reserved by the driver and firmware.",
    unit="bytes",
    doc="frame buffer reserved by driver and firmware",
    collector="device",
)
POWER_FAMILY: Final = Family(
    "gpu_power_watts",
    "Power draw of the whole board.",
    unit="watts",
    doc="board power draw",
    collector="device",
)
POWER_LIMIT_FAMILY: Final = Family(
    "gpu_power_limit_watts",
    "Power limit the driver enforces.",
    unit="watts",
    doc="enforced power limit",
    collector="device",
)
ENERGY_FAMILY: Final = Family(
    "gpu_energy_joules",
    "Energy consumed since the driver was loaded (resets when it reloads).",
    kind="counter",
    unit="joules",
    doc="energy since the driver loaded (the driver's own total)",
    collector="device",
)
TEMPERATURE_FAMILY: Final = Family(
    "gpu_temperature_celsius",
    "GPU core temperature.",
    unit="celsius",
    doc="core temperature",
    collector="device",
)
CLOCK_FAMILY: Final = Family(
    "gpu_clock_hertz",
    "Current clock frequency.",
    unit="hertz",
    labels=("clock",),
    doc="current clock",
    labels_doc="`clock` (`sm`, `memory`, `graphics`)",
    collector="clocks",
)
CLOCK_MAX_FAMILY: Final = Family(
    "gpu_clock_max_hertz",
    "Maximum clock frequency.",
    unit="hertz",
    labels=("clock",),
    doc="maximum clock",
    collector="clocks",
)
CLOCK_EVENT_FAMILY: Final = Family(
    "gpu_clock_event_active",
    "1 while the named clock-event (throttle) reason holds the clocks down.",
    labels=("reason",),
    doc="1 while that clock-event (throttle) reason holds: `gpu_idle`, "
    "`applications_clocks_setting`, `sw_power_cap`, `hw_slowdown`, `sync_boost`, "
    "`sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`, "
    "`display_clock_setting`",
    collector="clocks",
)
FAN_FAMILY: Final = Family(
    "gpu_fan_speed_ratio",
    "Fan speed as a share of its maximum.",
    unit="ratio",
    labels=("fan",),
    doc="fan speed (actively cooled cards only)",
    collector="device",
)
ECC_FAMILY: Final = Family(
    "gpu_ecc_errors",
    "ECC memory errors since the driver was loaded, by type (corrected or uncorrected).",
    kind="counter",
    labels=("type",),
    doc="ECC errors since the driver loaded",
    labels_doc="`type` (`corrected`, `uncorrected`)",
    collector="health",
)
PCIE_REPLAYS_FAMILY: Final = Family(
    "gpu_pcie_replays",
    "PCIe replay events (link errors the link recovered from).",
    kind="counter",
    doc="PCIe replays (link errors the link recovered from)",
    collector="health",
)
PSTATE_FAMILY: Final = Family(
    "gpu_performance_state",
    "Performance state: 0 (P0, fastest) to 15 (P15, slowest).",
    doc="P-state, 0 (fastest) to 15",
    collector="device",
)
REMAPPED_ROWS_FAMILY: Final = Family(
    "gpu_remapped_rows",
    "Memory rows remapped to spare rows so far, by the cause (correctable or uncorrectable errors).",
    labels=("cause",),
    doc="HBM rows remapped so far (A100 and newer, MIG mode off)",
    labels_doc="`cause` (`correctable`, `uncorrectable`)",
    collector="health",
)
REMAPPED_ROWS_PENDING_FAMILY: Final = Family(
    "gpu_remapped_rows_pending",
    "1 while a row remapping waits for the next GPU reset.",
    doc="1 while a row remapping waits for a GPU reset",
    collector="health",
)
REMAPPED_ROWS_FAILED_FAMILY: Final = Family(
    "gpu_remapped_rows_failed",
    "1 if a row remapping failed: the GPU needs servicing.",
    doc="1 if a row remapping failed: service the GPU",
    collector="health",
)
RETIRED_PAGES_FAMILY: Final = Family(
    "gpu_retired_pages",
    "Memory pages retired so far, by cause (multiple single-bit or a double-bit ECC error).",
    labels=("cause",),
    doc="memory pages retired so far (GPUs before A100)",
    labels_doc="`cause` (`single_bit`, `double_bit`)",
    collector="health",
)
RETIRED_PAGES_PENDING_FAMILY: Final = Family(
    "gpu_retired_pages_pending",
    "1 while a page retirement waits for the next GPU reset.",
    doc="1 while a page retirement waits for a GPU reset",
    collector="health",
)
MEMORY_FREE_FAMILY: Final = Family(
    "gpu_memory_free_bytes",
    "Frame buffer memory free for processes.",
    unit="bytes",
    doc="frame buffer free: installed minus reserved minus used",
    collector="device",
)
MEMORY_TEMPERATURE_FAMILY: Final = Family(
    "gpu_memory_temperature_celsius",
    "Device memory (HBM) temperature.",
    unit="celsius",
    doc="device memory temperature, on HBM boards (V100, A100, H100, …); GDDR boards (T4, A10G, "
    "L4, L40S, …) have no sensor NVML reads: absent there (a field value)",
    collector="device",
)
ENCODER_FAMILY: Final = Family(
    "gpu_encoder_utilization_ratio",
    "Share of the last sample period in which the video encoder (NVENC) was busy.",
    unit="ratio",
    doc="share of the last sample period the video encoders (NVENC) were busy; 0, not absent, on "
    "boards without NVENC (A100, H100)",
    collector="device",
)
DECODER_FAMILY: Final = Family(
    "gpu_decoder_utilization_ratio",
    "Share of the last sample period in which the video decoder (NVDEC) was busy.",
    unit="ratio",
    doc="the same for the video decoders (NVDEC)",
    collector="device",
)
POWER_LIMIT_MIN_FAMILY: Final = Family(
    "gpu_power_limit_min_watts",
    "Lowest power limit the board accepts.",
    unit="watts",
    doc="lowest power limit the board accepts (`nvidia-smi -pl`); absent where the limit cannot "
    "be changed",
    collector="device",
)
POWER_LIMIT_MAX_FAMILY: Final = Family(
    "gpu_power_limit_max_watts",
    "Highest power limit the board accepts.",
    unit="watts",
    doc="highest power limit the board accepts; `gpu_power_limit_watts` is the one enforced now",
    collector="device",
)
POWER_LIMIT_DEFAULT_FAMILY: Final = Family(
    "gpu_power_limit_default_watts",
    "Power limit the board starts with.",
    unit="watts",
    doc="power limit the board starts with (below it, someone lowered the limit)",
    collector="device",
)
COMPUTE_MODE_FAMILY: Final = Family(
    "gpu_compute_mode_info",
    "The GPU's compute mode (who may create CUDA contexts on it); always 1.",
    labels=("mode",),
    labels_doc="`mode` (`default`, `exclusive_thread`, `prohibited`, `exclusive_process`)",
    doc="the GPU's compute mode: who may create CUDA contexts on it; always 1",
    collector="device",
)
PERSISTENCE_MODE_FAMILY: Final = Family(
    "gpu_persistence_mode_enabled",
    "1 if persistence mode is on (the driver stays initialised with no client), else 0.",
    doc="1 if persistence mode is on (the driver stays initialised with no client), 0 if off",
    collector="device",
)
PCIE_GENERATION_FAMILY: Final = Family(
    "gpu_pcie_link_generation",
    "PCIe generation the link runs at now (an idle GPU drops it to save power).",
    doc="PCIe generation the link runs at now (an idle GPU drops it to save power)",
    collector="pcie",
)
PCIE_MAX_GENERATION_FAMILY: Final = Family(
    "gpu_pcie_link_max_generation",
    "Highest PCIe generation the GPU and its slot support together.",
    collector="pcie",
)
PCIE_WIDTH_FAMILY: Final = Family(
    "gpu_pcie_link_width",
    "PCIe lanes the link uses now.",
    collector="pcie",
)
PCIE_MAX_WIDTH_FAMILY: Final = Family(
    "gpu_pcie_link_max_width",
    "Most PCIe lanes the GPU and its slot support together.",
    doc="most PCIe lanes the GPU and its slot support together (a x16 GPU trained narrower says "
    "so in `gpu_pcie_link_width`)",
    collector="pcie",
)
ECC_AGGREGATE_FAMILY: Final = Family(
    "gpu_ecc_errors_aggregate",
    "ECC memory errors over the board's life (kept across driver reloads), by type.",
    kind="counter",
    labels=("type",),
    labels_doc="`type` (`corrected`, `uncorrected`)",
    doc="ECC errors over the board's life, kept in its InfoROM across driver reloads (until "
    "cleared); absent on boards without ECC or with ECC off",
    collector="health",
)
NVLINK_ERRORS_FAMILY: Final = Family(
    "gpu_nvlink_errors",
    "NVLink errors since the driver was loaded, by link and type.",
    kind="counter",
    labels=("link", "type"),
    labels_doc="`link`, `type` (`crc_flit`, `crc_data`, `replay`, `recovery`)",
    doc="NVLink data-link errors per active link since the driver loaded: CRC errors in "
    "flow-control units and in data, replays, recoveries (the link retrained); absent on GPUs "
    "without NVLink and where the driver does not count them (nvml.h marks these counters "
    "unsupported from Blackwell on)",
    collector="nvlink",
)
NVLINK_TRANSMIT_TOTAL_FAMILY: Final = Family(
    "gpu_nvlink_transmit_bytes",
    "Data the GPU sent over this NVLink link since the driver was loaded.",
    kind="counter",
    unit="bytes",
    labels=("link",),
    doc="data sent over that NVLink link since the driver loaded (payload, without protocol "
    "overhead; a field value); absent on GPUs without NVLink",
    collector="nvlink",
)
NVLINK_RECEIVE_TOTAL_FAMILY: Final = Family(
    "gpu_nvlink_receive_bytes",
    "Data the GPU received over this NVLink link since the driver was loaded.",
    kind="counter",
    unit="bytes",
    labels=("link",),
    doc="data received over that NVLink link since the driver loaded",
    collector="nvlink",
)
BUSY_FAMILY: Final = Family(
    "gpu_busy_seconds",
    "Utilization integrated over time at the sampling rate; rate() gives the true average.",
    kind="counter",
    unit="seconds",
    doc="the same, integrated over time: `rate(gpu_busy_seconds_total[5m])` is the true average",
    collector="device",
)
GPM_RATIO_FAMILIES: Final = (
    Family(
        "gpu_graphics_active_ratio",
        "Share of time the graphics or compute engine was active (GPM).",
        unit="ratio",
        doc="share of time the graphics or compute engine was active (GPM: Hopper and newer; "
        "absent on older GPUs, where gpuscope puts nothing in its place — the nearest is "
        "`gpu_utilization_ratio`, NVML's sampled share of time a kernel ran)",
        collector="gpm",
    ),
    Family(
        "gpu_sm_active_ratio",
        "Share of time the SMs had at least one warp resident, averaged over the SMs (GPM).",
        unit="ratio",
        doc="share of time the SMs had work resident, averaged over the SMs (GPM: Hopper and newer)",
        collector="gpm",
    ),
    Family(
        "gpu_sm_occupancy_ratio",
        "Resident warps as a share of the SMs' maximum, averaged over the SMs (GPM).",
        unit="ratio",
        doc="resident warps as a share of the SMs' maximum (GPM)",
        collector="gpm",
    ),
    Family(
        "gpu_tensor_active_ratio",
        "Share of time the SMs ran tensor-core instructions (GPM).",
        unit="ratio",
        collector="gpm",
    ),
    Family(
        "gpu_dram_active_ratio",
        "Device memory bandwidth used as a share of its peak (GPM).",
        unit="ratio",
        doc="device memory bandwidth used, as a share of its peak (GPM)",
        collector="gpm",
    ),
    Family(
        "gpu_fp64_active_ratio",
        "Share of time the SMs ran non-tensor FP64 math (GPM).",
        unit="ratio",
        collector="gpm",
    ),
    Family(
        "gpu_fp32_active_ratio",
        "Share of time the SMs ran non-tensor FP32 math (GPM).",
        unit="ratio",
        collector="gpm",
    ),
    Family(
        "gpu_fp16_active_ratio",
        "Share of time the SMs ran non-tensor FP16 math (GPM).",
        unit="ratio",
        collector="gpm",
    ),
)
THROUGHPUT_FAMILIES: Final = (
    Family(
        "gpu_pcie_transmit_bytes_per_second",
        "PCIe traffic from the GPU to the host (GPM, or a 20 ms window before Hopper).",
        doc="PCIe traffic from the GPU (GPM; before Hopper a 20 ms window, read by the GPU's "
        "thread after each reading)",
        collector="pcie",
    ),
    Family(
        "gpu_pcie_receive_bytes_per_second",
        "PCIe traffic from the host to the GPU (GPM, or a 20 ms window before Hopper).",
        doc="PCIe traffic to the GPU (same sources)",
        collector="pcie",
    ),
    Family(
        "gpu_nvlink_transmit_bytes_per_second",
        "NVLink traffic sent by the GPU over all its links (GPM).",
        doc="NVLink traffic sent over all links (GPM)",
        collector="gpm",
    ),
    Family(
        "gpu_nvlink_receive_bytes_per_second",
        "NVLink traffic received by the GPU over all its links (GPM).",
        doc="NVLink traffic received over all links (GPM)",
        collector="gpm",
    ),
)
ACTIVITY_COUNTER_FAMILIES: Final = (
    Family(
        "gpu_sm_active_seconds",
        "SM activity integrated over time; rate() gives the true average SM activity.",
        kind="counter",
        unit="seconds",
        doc="SM activity integrated over time: `rate()` is the true average",
        collector="gpm",
    ),
    Family(
        "gpu_tensor_active_seconds",
        "Tensor-core activity integrated over time; rate() gives its true average.",
        kind="counter",
        unit="seconds",
        doc="tensor-core activity integrated over time",
        collector="gpm",
    ),
    Family(
        "gpu_dram_active_seconds",
        "DRAM bandwidth use integrated over time; rate() gives its true average.",
        kind="counter",
        unit="seconds",
        doc="DRAM bandwidth use integrated over time",
        collector="gpm",
    ),
)
XID_FAMILY: Final = Family(
    "gpu_xid_errors",
    "XID critical errors reported by the driver since gpuscope started, by XID.",
    kind="counter",
    labels=("xid",),
    doc="XID critical errors since gpuscope started, per XID value (a repeat counts again); kept "
    "while the GPU is down",
    collector="events",
    while_down=True,
)
LAST_XID_FAMILY: Final = Family(
    "gpu_last_xid_timestamp_seconds",
    "Unix time of the last XID critical error gpuscope saw.",
    unit="seconds",
    doc="Unix time of the last XID critical error",
    collector="events",
    while_down=True,
)
THROTTLE_FAMILY: Final = Family(
    "gpu_throttle_seconds",
    "Time the clocks were held below their target, by reason (NVML violation counters).",
    kind="counter",
    unit="seconds",
    labels=("reason",),
    doc="time the clocks were held down, per reason (NVML's violation counters)",
    labels_doc="`reason` (`power`, `thermal`, `sync_boost`, `board_limit`, `low_utilization`, "
    "`reliability`, `app_clocks`, `base_clocks`)",
    collector="health",
)
MIG_MODE_FAMILY: Final = Family(
    "gpu_mig_mode_enabled",
    "1 if MIG mode is on for this physical GPU.",
    doc="1 if MIG mode is on (physical GPUs that support MIG)",
    collector="mig",
)

# -- series --------------------------------------------------------------------------------------

UTILIZATION: Final = Series(UTILIZATION_FAMILY)
MEMORY_UTILIZATION: Final = Series(MEMORY_UTILIZATION_FAMILY)
MEMORY_USED: Final = Series(MEMORY_USED_FAMILY)
MEMORY_TOTAL: Final = Series(MEMORY_TOTAL_FAMILY)
MEMORY_RESERVED: Final = Series(MEMORY_RESERVED_FAMILY)
POWER: Final = Series(POWER_FAMILY)
POWER_LIMIT: Final = Series(POWER_LIMIT_FAMILY)
ENERGY: Final = Series(ENERGY_FAMILY)
TEMPERATURE: Final = Series(TEMPERATURE_FAMILY)
CLOCK_NAMES: Final = (
    ("sm", pynvml.NVML_CLOCK_SM),
    ("memory", pynvml.NVML_CLOCK_MEM),
    ("graphics", pynvml.NVML_CLOCK_GRAPHICS),
)
CLOCKS: Final = {name: Series(CLOCK_FAMILY, (("clock", name),)) for name, _ in CLOCK_NAMES}
MAX_CLOCKS: Final = {name: Series(CLOCK_MAX_FAMILY, (("clock", name),)) for name, _ in CLOCK_NAMES}
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
CLOCK_EVENTS: Final = {
    reason: Series(CLOCK_EVENT_FAMILY, (("reason", reason),)) for _, reason in CLOCK_EVENT_REASONS
}
ECC_CORRECTED: Final = Series(ECC_FAMILY, (("type", "corrected"),))
ECC_UNCORRECTED: Final = Series(ECC_FAMILY, (("type", "uncorrected"),))
PCIE_REPLAYS: Final = Series(PCIE_REPLAYS_FAMILY)
PSTATE: Final = Series(PSTATE_FAMILY)
REMAPPED_CORRECTABLE: Final = Series(REMAPPED_ROWS_FAMILY, (("cause", "correctable"),))
REMAPPED_UNCORRECTABLE: Final = Series(REMAPPED_ROWS_FAMILY, (("cause", "uncorrectable"),))
REMAPPED_PENDING: Final = Series(REMAPPED_ROWS_PENDING_FAMILY)
REMAPPED_FAILED: Final = Series(REMAPPED_ROWS_FAILED_FAMILY)
RETIRED_SINGLE_BIT: Final = Series(RETIRED_PAGES_FAMILY, (("cause", "single_bit"),))
RETIRED_DOUBLE_BIT: Final = Series(RETIRED_PAGES_FAMILY, (("cause", "double_bit"),))
RETIRED_PENDING: Final = Series(RETIRED_PAGES_PENDING_FAMILY)
MIG_MODE: Final = Series(MIG_MODE_FAMILY)
BUSY: Final = Series(BUSY_FAMILY)
MEMORY_FREE: Final = Series(MEMORY_FREE_FAMILY)
MEMORY_TEMPERATURE: Final = Series(MEMORY_TEMPERATURE_FAMILY)
ENCODER: Final = Series(ENCODER_FAMILY)
DECODER: Final = Series(DECODER_FAMILY)
POWER_LIMIT_MIN: Final = Series(POWER_LIMIT_MIN_FAMILY)
POWER_LIMIT_MAX: Final = Series(POWER_LIMIT_MAX_FAMILY)
POWER_LIMIT_DEFAULT: Final = Series(POWER_LIMIT_DEFAULT_FAMILY)
COMPUTE_MODES: Final = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}
COMPUTE_MODE: Final = {
    name: Series(COMPUTE_MODE_FAMILY, (("mode", name),)) for name in COMPUTE_MODES.values()
}
PERSISTENCE_MODE: Final = Series(PERSISTENCE_MODE_FAMILY)
PCIE_GENERATION: Final = Series(PCIE_GENERATION_FAMILY)
PCIE_MAX_GENERATION: Final = Series(PCIE_MAX_GENERATION_FAMILY)
PCIE_WIDTH: Final = Series(PCIE_WIDTH_FAMILY)
PCIE_MAX_WIDTH: Final = Series(PCIE_MAX_WIDTH_FAMILY)
ECC_AGGREGATE_CORRECTED: Final = Series(ECC_AGGREGATE_FAMILY, (("type", "corrected"),))
ECC_AGGREGATE_UNCORRECTED: Final = Series(ECC_AGGREGATE_FAMILY, (("type", "uncorrected"),))
NVLINK_ERROR_TYPES: Final = (
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)
NVLINK_ERRORS: Final = {
    name: Series(NVLINK_ERRORS_FAMILY, (("type", name),)) for name, _ in NVLINK_ERROR_TYPES
}
_NVLINK_COUNTERS: Final = frozenset(counter for _, counter in NVLINK_ERROR_TYPES)
"""Per-link templates, as the two below: link N fills `link_series(template, N)`."""
NVLINK_TRANSMIT_TOTAL: Final = Series(NVLINK_TRANSMIT_TOTAL_FAMILY)
NVLINK_RECEIVE_TOTAL: Final = Series(NVLINK_RECEIVE_TOTAL_FAMILY)
FAN: Final = Series(FAN_FAMILY)
"""The per-fan template: fan N fills `fan_series(N)`."""
(
    GRAPHICS_ACTIVE,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    FP64_ACTIVE,
    FP32_ACTIVE,
    FP16_ACTIVE,
) = (Series(family) for family in GPM_RATIO_FAMILIES)
PCIE_TRANSMIT, PCIE_RECEIVE, NVLINK_TRANSMIT, NVLINK_RECEIVE = (
    Series(family) for family in THROUGHPUT_FAMILIES
)
SM_ACTIVE_SECONDS, TENSOR_ACTIVE_SECONDS, DRAM_ACTIVE_SECONDS = (
    Series(family) for family in ACTIVITY_COUNTER_FAMILIES
)
LAST_XID: Final = Series(LAST_XID_FAMILY)

GPM_METRICS: Final = (
    (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, GRAPHICS_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_SM_UTIL, SM_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, SM_OCCUPANCY, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, TENSOR_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, DRAM_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_FP64_UTIL, FP64_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_FP32_UTIL, FP32_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_FP16_UTIL, FP16_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, PCIE_TRANSMIT, float(2**20), float("inf")),
    (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, PCIE_RECEIVE, float(2**20), float("inf")),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, NVLINK_TRANSMIT, float(2**20), float("inf")),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, NVLINK_RECEIVE, float(2**20), float("inf")),
)
"""(GPM metric id, series, factor to base units, ceiling): percentages become ratios capped at 1
(the driver's counters can overshoot by rounding), MiB/s become bytes/s."""

INTEGRATED_ACTIVITY: Final = (
    (SM_ACTIVE, SM_ACTIVE_SECONDS),
    (TENSOR_ACTIVE, TENSOR_ACTIVE_SECONDS),
    (DRAM_ACTIVE, DRAM_ACTIVE_SECONDS),
)
"""GPM ratios integrated over their windows into counters: (ratio, its counter)."""

THROTTLE_REASONS: Final = (
    ("power", pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_FI_DEV_PERF_POLICY_POWER),
    (
        "thermal",
        pynvml.NVML_PERF_POLICY_THERMAL,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    ),
    ("sync_boost", pynvml.NVML_PERF_POLICY_SYNC_BOOST, pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST),
    (
        "board_limit",
        pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
        pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    ),
    (
        "low_utilization",
        pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
        pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    ),
    (
        "reliability",
        pynvml.NVML_PERF_POLICY_RELIABILITY,
        pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    ),
    # nvml.h names no replacement for the total-app-clocks policy, but drivers still fill its
    # field; where one does not, the violation status stands in as for any other reason.
    (
        "app_clocks",
        pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS,
    ),
    (
        "base_clocks",
        pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
    ),
)
"""(`reason` label, perf policy for the deprecated nvmlDeviceGetViolationStatus, the nanosecond
field value nvml.h names in its place). The field values are read in one call; the violation
status stands in per reason where a field is missing."""
THROTTLE: Final = {
    reason: Series(THROTTLE_FAMILY, (("reason", reason),)) for reason, _, _ in THROTTLE_REASONS
}


@cache
def each(template: Series, per: str, index: int) -> Series:
    """The series fan or link `index` fills, from a per-fan or per-link reading's template (made
    once per index: series are compared by identity)."""
    return Series(template.family, ((per, str(index)), *template.labels))


def fan_series(fan: int) -> Series:
    """The speed series of fan number `fan`."""
    return each(FAN, "fan", fan)


def link_series(template: Series, link: int) -> Series:
    """A per-link template's series for NVLink link `link`."""
    return each(template, "link", link)


@cache
def xid_series(xid: int) -> Series:
    """The counter of one XID value (made once per value)."""
    return Series(XID_FAMILY, (("xid", str(xid)),))


VALUE_FAMILIES: Final = (
    UTILIZATION_FAMILY,
    BUSY_FAMILY,
    MEMORY_UTILIZATION_FAMILY,
    MEMORY_USED_FAMILY,
    MEMORY_TOTAL_FAMILY,
    MEMORY_RESERVED_FAMILY,
    MEMORY_FREE_FAMILY,
    POWER_FAMILY,
    POWER_LIMIT_FAMILY,
    POWER_LIMIT_MIN_FAMILY,
    POWER_LIMIT_MAX_FAMILY,
    POWER_LIMIT_DEFAULT_FAMILY,
    ENERGY_FAMILY,
    TEMPERATURE_FAMILY,
    MEMORY_TEMPERATURE_FAMILY,
    ENCODER_FAMILY,
    DECODER_FAMILY,
    COMPUTE_MODE_FAMILY,
    PERSISTENCE_MODE_FAMILY,
    CLOCK_FAMILY,
    CLOCK_MAX_FAMILY,
    CLOCK_EVENT_FAMILY,
    FAN_FAMILY,
    ECC_FAMILY,
    ECC_AGGREGATE_FAMILY,
    PCIE_REPLAYS_FAMILY,
    PCIE_GENERATION_FAMILY,
    PCIE_MAX_GENERATION_FAMILY,
    PCIE_WIDTH_FAMILY,
    PCIE_MAX_WIDTH_FAMILY,
    PSTATE_FAMILY,
    *GPM_RATIO_FAMILIES,
    *THROUGHPUT_FAMILIES,
    *ACTIVITY_COUNTER_FAMILIES,
    NVLINK_TRANSMIT_TOTAL_FAMILY,
    NVLINK_RECEIVE_TOTAL_FAMILY,
    NVLINK_ERRORS_FAMILY,
    XID_FAMILY,
    LAST_XID_FAMILY,
    THROTTLE_FAMILY,
    REMAPPED_ROWS_FAMILY,
    REMAPPED_ROWS_PENDING_FAMILY,
    REMAPPED_ROWS_FAILED_FAMILY,
    RETIRED_PAGES_FAMILY,
    RETIRED_PAGES_PENDING_FAMILY,
    MIG_MODE_FAMILY,
)
"""Every family a GPU's `values` fill, in the order the exposition writes them."""


# -- what the simulator answers ------------------------------------------------------------------


def _simulated_utilization(gpu: SimulatedGpu) -> Any:
    if gpu.mig_active:
        raise not_supported()  # not reported in MIG mode
    return filled(
        pynvml.c_nvmlUtilization_t,
        gpu=round(gpu.utilization * 100),
        memory=round(gpu.memory_utilization * 100),
    )


def _simulated_memory(gpu: SimulatedGpu, position: int | None, version: int | None = None) -> Any:
    total, reserved, used = gpu.memory(position)
    free = max(total - reserved - used, 0)
    if version:
        if version != pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return filled(
            pynvml.c_nvmlMemory_v2_t,
            version=version,
            total=total,
            reserved=reserved,
            free=free,
            used=used,
        )
    return filled(pynvml.c_nvmlMemory_t, total=total, free=free, used=used + reserved)


def _clock_kind(clock_type: int) -> str:
    for name, number in CLOCK_NAMES:
        if number == clock_type:
            return name
    raise not_supported()


def _simulated_max_clock(gpu: SimulatedGpu, clock_type: int) -> int:
    return round(gpu.model.max_clocks_hz.get(_clock_kind(clock_type), 0.0) / _MHZ)


def _simulated_temperature(gpu: SimulatedGpu, sensor: int) -> int:
    if sensor != pynvml.NVML_TEMPERATURE_GPU:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return round(gpu.temperature)


def _simulated_fan(gpu: SimulatedGpu, fan: int) -> int:
    if not 0 <= fan < gpu.model.fans:
        raise not_supported()
    return round(min(max(30 + (gpu.temperature - 35) * 1.5, 30), 100))


def _simulated_ecc(gpu: SimulatedGpu, error_type: int, counter: int) -> int:
    del counter  # volatile and aggregate agree: the simulated driver never reloads
    if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
        return gpu.ecc_corrected
    return gpu.ecc_uncorrected


def _mig_capable(gpu: SimulatedGpu) -> bool:
    model = gpu.model
    return model.architecture in _MIG_ARCHITECTURES and bool(model.mig_profiles)


def _simulated_mig_mode(gpu: SimulatedGpu) -> list[int]:
    if not _mig_capable(gpu):
        raise not_supported()
    mode = int(gpu.mig_configured)
    return [mode, mode]


def _simulated_remapped_rows(gpu: SimulatedGpu) -> tuple[int, int, int, int]:
    # HBM row remapping: A100 and newer data-center GPUs, and not while MIG mode is on.
    if not _mig_capable(gpu) or gpu.mig_active:
        raise not_supported()
    remapped = gpu.ecc_uncorrected
    return 0, remapped, int(remapped > 0), 0


def _retired(gpu: SimulatedGpu) -> tuple[int, int]:
    if gpu.model.architecture not in _PAGE_RETIREMENT_ARCHITECTURES:
        raise not_supported()
    return gpu.ecc_corrected // 2, gpu.ecc_uncorrected


def _simulated_retired_pages(gpu: SimulatedGpu, cause: int) -> list[int]:
    single, double = _retired(gpu)
    count = double if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else single
    return [0x7F000000 + 0x1000 * (n + 1 + cause * 0x100) for n in range(count)]


def _simulated_retired_pending(gpu: SimulatedGpu) -> int:
    return int(_retired(gpu)[1] > 0)


_HBM_ARCHITECTURES: Final = frozenset({"volta", "hopper", "blackwell"})
_HBM_AMPERE: Final = ("a100", "a30")
"""Ampere models with HBM, by catalog key prefix (the others, A10G and A40, have GDDR6)."""
_PCIE_GENERATIONS: Final = {
    "kepler": 3,
    "maxwell": 3,
    "pascal": 3,
    "volta": 3,
    "turing": 3,
    "ampere": 4,
    "ada": 4,
    "hopper": 5,
    "blackwell": 5,
}
_ENGINE_PERIOD_US: Final = 167_000
"""The sampling period a real GPU reports with its video engines' utilization."""


def _hbm(gpu: SimulatedGpu) -> bool:
    model = gpu.model
    if model.architecture == "ampere":
        return model.key.startswith(_HBM_AMPERE)
    return model.architecture in _HBM_ARCHITECTURES


def _simulated_memory_temperature(gpu: SimulatedGpu) -> int:
    if not _hbm(gpu):
        raise not_supported()  # GDDR boards have no memory sensor NVML reads
    return round(gpu.temperature + 3)


def _simulated_engine(_gpu: SimulatedGpu) -> list[int]:
    return [0, _ENGINE_PERIOD_US]  # no video work is simulated: idle engines, or no NVENC at all


def _simulated_pcie_generation(gpu: SimulatedGpu) -> int:
    top = _PCIE_GENERATIONS[gpu.model.architecture]
    return top if gpu.working else 1  # an idle GPU trains its link down to save power


def _simulated_power_constraints(gpu: SimulatedGpu) -> list[int]:
    tdp = round(gpu.model.tdp_watts * 1000)
    return [tdp // 4, tdp]


def _link(gpu: SimulatedGpu, link: int) -> int:
    """The GPU's link count, once `link` is known to be one of them."""
    links = gpu.nvlink_links
    if not links:
        raise not_supported()  # no NVLink on this GPU
    if not 0 <= link < links:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return links


def _simulated_nvlink_errors(gpu: SimulatedGpu, link: int, counter: int) -> int:
    _link(gpu, link)
    if counter not in _NVLINK_COUNTERS:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return 0  # a healthy fabric


def _simulated_nvlink_kib(direction: int) -> Callable[[SimulatedGpu, int], int]:
    """Data over one link, in KiB: the GPU's NVLink traffic spread evenly over its links."""

    def answer(gpu: SimulatedGpu, link: int) -> int:
        links = _link(gpu, link)
        return int(gpu.nvlink_bytes[direction] / links) >> 10

    return answer


# -- the readings -------------------------------------------------------------------------------

HEALTH_PERIOD_SECONDS: Final = 5.0
"""How often health counters and states that change rarely are read (every cycle when the
collect interval is longer)."""


def _bit(bit: int) -> Callable[[Any], float | None]:
    def active(reasons: Any) -> float | None:
        return (1.0 if int(reasons) & bit else 0.0) if reasons is not None else None

    return active


def _field(name: str, divisor: float = 1.0) -> Callable[[Any], float | None]:
    def read(struct: Any) -> float | None:
        return float(getattr(struct, name)) / divisor

    return read


def _item(position: int) -> Callable[[Any], float | None]:
    def read(answer: Any) -> float | None:
        return float(answer[position])

    return read


def _item_over(position: int, divisor: float) -> Callable[[Any], float | None]:
    def read(answer: Any) -> float | None:
        return float(answer[position]) / divisor

    return read


def _equals(expected: int) -> Callable[[Any], float | None]:
    """1 where the answer is `expected`, else absent (an info family's one series)."""

    def read(answer: Any) -> float | None:
        return 1.0 if int(answer) == expected else None

    return read


def _count(answer: Any) -> float | None:
    return float(len(answer))


def _truth(answer: Any) -> float | None:
    return 1.0 if answer else 0.0


_CLOCK_EVENT_OUTPUTS: Final = tuple(
    Output(CLOCK_EVENTS[reason], _bit(bit)) for bit, reason in CLOCK_EVENT_REASONS
)
_THROTTLE_REASONS: Final = Reading(
    "throttle_reasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    _CLOCK_EVENT_OUTPUTS,
    collector="clocks",
    simulated=lambda gpu: gpu.clock_events(),
)
_MEMORY_V1: Final = Reading(
    "memory",
    "nvmlDeviceGetMemoryInfo",
    (
        Output(MEMORY_USED, _field("used")),
        Output(MEMORY_TOTAL, _field("total")),
        Output(MEMORY_FREE, _field("free")),
    ),
    mig=True,
    simulated=_simulated_memory,
)

READINGS: Final[tuple[Reading, ...]] = (
    Reading(
        "utilization",
        "nvmlDeviceGetUtilizationRates",
        (
            Output(UTILIZATION, _field("gpu", 100.0)),
            Output(MEMORY_UTILIZATION, _field("memory", 100.0)),
        ),
        simulated=_simulated_utilization,
    ),
    Reading(
        "memory_v2",
        "nvmlDeviceGetMemoryInfo",
        (
            Output(MEMORY_USED, _field("used")),
            Output(MEMORY_TOTAL, _field("total")),
            Output(MEMORY_RESERVED, _field("reserved")),
            Output(MEMORY_FREE, _field("free")),
        ),
        args=(pynvml.nvmlMemory_v2,),
        mig=True,
        # v1 counts reserved memory as used and has no reserved figure
        fallback=_MEMORY_V1,
        simulated=_simulated_memory,
    ),
    Reading(
        "power",
        "nvmlDeviceGetPowerUsage",
        (Output(POWER, _per(1000.0)),),
        simulated=lambda gpu: round(gpu.power_watts * 1000),
    ),
    Reading(
        "power_limit",
        "nvmlDeviceGetEnforcedPowerLimit",
        (Output(POWER_LIMIT, _per(1000.0)),),
        simulated=lambda gpu: round(gpu.model.tdp_watts * 1000),
    ),
    Reading(
        "power_limits",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        (
            Output(POWER_LIMIT_MIN, _item_over(0, 1000.0)),
            Output(POWER_LIMIT_MAX, _item_over(1, 1000.0)),
        ),
        once=True,
        simulated=_simulated_power_constraints,
    ),
    Reading(
        "power_limit_default",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        (Output(POWER_LIMIT_DEFAULT, _per(1000.0)),),
        once=True,
        simulated=lambda gpu: round(gpu.model.tdp_watts * 1000),
    ),
    Reading(
        "energy",
        "nvmlDeviceGetTotalEnergyConsumption",
        (Output(ENERGY, _per(1000.0)),),
        since="volta",
        simulated=lambda gpu: int(gpu.energy_millijoules),
    ),
    Reading(
        "temperature",
        "nvmlDeviceGetTemperature",
        (Output(TEMPERATURE, _number),),
        args=(pynvml.NVML_TEMPERATURE_GPU,),
        simulated=_simulated_temperature,
    ),
    Reading(
        "memory_temperature",
        "nvmlDeviceGetFieldValues",
        (Output(MEMORY_TEMPERATURE, _number),),
        field=pynvml.NVML_FI_DEV_MEMORY_TEMP,
        since="volta",
        simulated=_simulated_memory_temperature,
    ),
    Reading(
        "encoder",
        "nvmlDeviceGetEncoderUtilization",
        (Output(ENCODER, _item_over(0, 100.0)),),
        simulated=_simulated_engine,
    ),
    Reading(
        "decoder",
        "nvmlDeviceGetDecoderUtilization",
        (Output(DECODER, _item_over(0, 100.0)),),
        simulated=_simulated_engine,
    ),
    Reading(
        "compute_mode",
        "nvmlDeviceGetComputeMode",
        tuple(
            Output(COMPUTE_MODE[name], _equals(number)) for number, name in COMPUTE_MODES.items()
        ),
        period=HEALTH_PERIOD_SECONDS,
        simulated=lambda _gpu: pynvml.NVML_COMPUTEMODE_DEFAULT,
    ),
    Reading(
        "persistence_mode",
        "nvmlDeviceGetPersistenceMode",
        (Output(PERSISTENCE_MODE, _truth),),
        period=HEALTH_PERIOD_SECONDS,
        simulated=lambda _gpu: pynvml.NVML_FEATURE_ENABLED,
    ),
    Reading(
        "clock_events",
        "nvmlDeviceGetCurrentClocksEventReasons",
        _CLOCK_EVENT_OUTPUTS,
        collector="clocks",
        fallback=_THROTTLE_REASONS,
        simulated=lambda gpu: gpu.clock_events(),
    ),
    Reading(
        "fan",
        "nvmlDeviceGetFanSpeed_v2",
        (Output(FAN, _percent),),
        per="fan",
        simulated=_simulated_fan,
    ),
    Reading(
        "ecc_corrected",
        "nvmlDeviceGetTotalEccErrors",
        (Output(ECC_CORRECTED, _number),),
        args=(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        collector="health",
        simulated=_simulated_ecc,
    ),
    Reading(
        "ecc_uncorrected",
        "nvmlDeviceGetTotalEccErrors",
        (Output(ECC_UNCORRECTED, _number),),
        args=(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
        collector="health",
        simulated=_simulated_ecc,
    ),
    Reading(
        "ecc_aggregate_corrected",
        "nvmlDeviceGetTotalEccErrors",
        (Output(ECC_AGGREGATE_CORRECTED, _number),),
        args=(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
        collector="health",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_ecc,
    ),
    Reading(
        "ecc_aggregate_uncorrected",
        "nvmlDeviceGetTotalEccErrors",
        (Output(ECC_AGGREGATE_UNCORRECTED, _number),),
        args=(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        collector="health",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_ecc,
    ),
    Reading(
        "mig_mode",
        "nvmlDeviceGetMigMode",
        (Output(MIG_MODE, _item(0)),),
        since="ampere",
        collector="mig",
        simulated=_simulated_mig_mode,
    ),
    *(
        Reading(
            f"{name}_clock",
            "nvmlDeviceGetClockInfo",
            (Output(CLOCKS[name], _scaled(_MHZ)),),
            args=(number,),
            collector="clocks",
            simulated=lambda gpu, clock_type: gpu.clock_mhz(_clock_kind(clock_type)),
        )
        for name, number in CLOCK_NAMES
    ),
    *(
        Reading(
            f"max_{name}_clock",
            "nvmlDeviceGetMaxClockInfo",
            (Output(MAX_CLOCKS[name], lambda mhz: mhz * _MHZ if mhz else None),),
            args=(number,),
            collector="clocks",
            once=True,
            simulated=_simulated_max_clock,
        )
        for name, number in CLOCK_NAMES
    ),
    Reading(
        "pcie_replays",
        "nvmlDeviceGetPcieReplayCounter",
        (Output(PCIE_REPLAYS, _number),),
        collector="health",
        simulated=lambda _gpu: 0,
    ),
    Reading(
        "pcie_generation",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        (Output(PCIE_GENERATION, _number),),
        collector="pcie",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_pcie_generation,
    ),
    Reading(
        "pcie_max_generation",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        (Output(PCIE_MAX_GENERATION, _number),),
        collector="pcie",
        once=True,
        simulated=lambda gpu: _PCIE_GENERATIONS[gpu.model.architecture],
    ),
    Reading(
        "pcie_width",
        "nvmlDeviceGetCurrPcieLinkWidth",
        (Output(PCIE_WIDTH, _number),),
        collector="pcie",
        period=HEALTH_PERIOD_SECONDS,
        simulated=lambda _gpu: 16,
    ),
    Reading(
        "pcie_max_width",
        "nvmlDeviceGetMaxPcieLinkWidth",
        (Output(PCIE_MAX_WIDTH, _number),),
        collector="pcie",
        once=True,
        simulated=lambda _gpu: 16,
    ),
    *(
        Reading(
            f"nvlink_{name}_errors",
            "nvmlDeviceGetNvLinkErrorCounter",
            (Output(NVLINK_ERRORS[name], _number),),
            args=(counter,),
            since="pascal",
            collector="nvlink",
            per="link",
            period=HEALTH_PERIOD_SECONDS,
            simulated=_simulated_nvlink_errors,
        )
        for name, counter in NVLINK_ERROR_TYPES
    ),
    Reading(
        "nvlink_transmit",
        "nvmlDeviceGetFieldValues",
        (Output(NVLINK_TRANSMIT_TOTAL, _scaled(1024.0)),),
        field=pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        since="pascal",
        collector="nvlink",
        per="link",
        simulated=_simulated_nvlink_kib(0),
    ),
    Reading(
        "nvlink_receive",
        "nvmlDeviceGetFieldValues",
        (Output(NVLINK_RECEIVE_TOTAL, _scaled(1024.0)),),
        field=pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        since="pascal",
        collector="nvlink",
        per="link",
        simulated=_simulated_nvlink_kib(1),
    ),
    Reading(
        "pstate",
        "nvmlDeviceGetPerformanceState",
        (Output(PSTATE, _number),),
        simulated=lambda gpu: 0 if gpu.working else 8,
    ),
    Reading(
        "remapped_rows",
        "nvmlDeviceGetRemappedRows",
        (
            Output(REMAPPED_CORRECTABLE, _item(0)),
            Output(REMAPPED_UNCORRECTABLE, _item(1)),
            Output(REMAPPED_PENDING, lambda rows: 1.0 if rows[2] else 0.0),
            Output(REMAPPED_FAILED, lambda rows: 1.0 if rows[3] else 0.0),
        ),
        since="ampere",
        collector="health",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_remapped_rows,
    ),
    Reading(
        "retired_pages_single_bit",
        "nvmlDeviceGetRetiredPages",
        (Output(RETIRED_SINGLE_BIT, _count),),
        args=(pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,),
        collector="health",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_retired_pages,
    ),
    Reading(
        "retired_pages_double_bit",
        "nvmlDeviceGetRetiredPages",
        (Output(RETIRED_DOUBLE_BIT, _count),),
        args=(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,),
        collector="health",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_retired_pages,
    ),
    Reading(
        "retired_pages_pending",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        (Output(RETIRED_PENDING, _truth),),
        collector="health",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_retired_pending,
    ),
)
"""Every plain reading, in the order the sampler reads them."""


def all_readings() -> Iterator[Reading]:
    """The readings and their fallbacks."""
    for reading in READINGS:
        current: Reading | None = reading
        while current is not None:
            yield current
            current = current.fallback


SIMULATED_CALLS: Final[Mapping[str, Reading]] = {
    reading.call: reading
    for reading in all_readings()
    if reading.simulated is not None and reading.field is None
}
"""Driver functions the simulator answers from these declarations, by name."""
FIELD_READINGS: Final[Mapping[int, Reading]] = {
    reading.field: reading for reading in all_readings() if reading.field is not None
}
"""Field values, by field id: read in one call per GPU, answered by the simulator's
`nvmlDeviceGetFieldValues` from these declarations (`simulated(gpu)`, or `simulated(gpu,
link)` for a per-link field)."""

BY_NAME: Final[Mapping[str, Reading]] = {reading.name: reading for reading in all_readings()}


def read_now(driver: object, handle: object, reading: Reading) -> dict[Series, float]:
    """One reading made directly, its errors left to the caller: for a one-off reader such as
    the calibration job, which records conditions through the same declarations."""
    answer = getattr(driver, reading.call)(handle, *reading.args)
    return {
        output.series: value
        for output in reading.outputs
        if (value := output.value(answer)) is not None
    }
