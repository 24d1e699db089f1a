"""Each DCGM field gpuscope serves: its name, type, help and unit as dcgm-exporter 4.x serves it,
and the gpuscope series it is made from (`exporter.readings`), with the factor from gpuscope's base
unit to DCGM's, and how a GPU several pods share splits it. Adding a field is one entry in
`FIELDS`; a new gpuscope reading is served under a DCGM name by naming its series in `sources`.

A field whose series a GPU did not give this cycle is absent for that GPU, never zero; a field
gpuscope cannot measure at all has no entry, and dcgm-exporter's default fields among those are
in `exporter.dcgm.versions.NOT_SERVED`, with why. `versions` also derives 4.9.0's names from these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

import pynvml

from exporter.dcgm_counters import RENAMED_IN_49
from exporter.readings.clocks import CLOCK_EVENT_REASONS, CLOCK_EVENTS, CLOCKS, MAX_CLOCKS
from exporter.readings.declare import link_series
from exporter.readings.device import (
    COMPUTE_MODE,
    COMPUTE_MODES,
    DECODER,
    ENCODER,
    ENERGY,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TEMPERATURE,
    MEMORY_TOTAL,
    MEMORY_USED,
    MEMORY_UTILIZATION,
    PERSISTENCE_MODE,
    POWER,
    POWER_LIMIT,
    POWER_LIMIT_DEFAULT,
    POWER_LIMIT_MAX,
    POWER_LIMIT_MIN,
    PSTATE,
    TEMPERATURE,
    UTILIZATION,
    fan_series,
)
from exporter.readings.gpm import (
    DRAM_ACTIVE,
    FP16_ACTIVE,
    FP32_ACTIVE,
    FP64_ACTIVE,
    GRAPHICS_ACTIVE,
    NVLINK_RECEIVE,
    NVLINK_TRANSMIT,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
)
from exporter.readings.health import (
    ECC_AGGREGATE_CORRECTED,
    ECC_AGGREGATE_UNCORRECTED,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    PCIE_REPLAYS,
    REMAPPED_CORRECTABLE,
    REMAPPED_FAILED,
    REMAPPED_PENDING,
    REMAPPED_UNCORRECTABLE,
    RETIRED_DOUBLE_BIT,
    RETIRED_PENDING,
    RETIRED_SINGLE_BIT,
    THROTTLE,
)
from exporter.readings.mig import MIG_MODE
from exporter.readings.nvlink import NVLINK_ERRORS, NVLINK_RECEIVE_TOTAL, NVLINK_TRANSMIT_TOTAL
from exporter.readings.pcie import (
    PCIE_GENERATION,
    PCIE_MAX_GENERATION,
    PCIE_MAX_WIDTH,
    PCIE_RECEIVE,
    PCIE_TRANSMIT,
    PCIE_WIDTH,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.series import Series

Kind = Literal["gauge", "counter", "label"]
Split = Literal["utilization", "memory"]
"""How a field's value is shared among the pods of a GPU several pods use: by their processes'
utilization, or by their processes' memory (`exporter.metrics.dcgm`)."""

XID_ERRORS: Final = "DCGM_FI_DEV_XID_ERRORS"
DRIVER_VERSION: Final = "DCGM_FI_DRIVER_VERSION"
_LAST_XID: Final = frozenset({XID_ERRORS, RENAMED_IN_49[XID_ERRORS]})

_PERCENT: Final = 100.0
_MIB: Final = 1.0 / 2**20
_MHZ: Final = 1e-6
_MILLI: Final = 1e3
_NANO: Final = 1e9


@dataclass(frozen=True, slots=True)
class Source:
    """A gpuscope series and the factor from its base unit to the DCGM field's unit."""

    series: Series
    factor: float = 1.0
    without_gpm: bool = False
    """Only for a GPU without GPM (`GpuIdentity.has_gpm`): a stand-in for an earlier source
    that GPM gives, never one that fills a cycle in which GPM gave nothing."""


LINKS: Final = range(pynvml.NVML_NVLINK_MAX_LINKS)
"""Every NVLink link a GPU can have (a per-link series exists for the active ones only)."""


@dataclass(frozen=True, slots=True, eq=False)
class Field:
    """One DCGM field as dcgm-exporter serves it, and where gpuscope's value for it comes from."""

    name: str
    kind: Kind
    help: str
    """dcgm-exporter's help text (a counters file may give its own)."""
    unit: str
    """DCGM's unit, for the field table: `%`, `MiB`, `MHz`, `ratio`, …"""
    sources: tuple[Source, ...] = ()
    """The value: the first of these series the GPU gave this cycle, times its factor."""
    summed: bool = False
    """Or the sum of every one of `sources` the GPU gave (absent where it gave none)."""
    bits: tuple[tuple[int, Series], ...] = ()
    """Or a bitmask: each bit set while its series is 1 (`gpu_clock_event_active`)."""
    totals: tuple[Series, ...] = ()
    """Or the sum of these per-link templates' series over the links (`link_series`), absent
    where there is none."""
    modes: tuple[tuple[int, Series], ...] = ()
    """Or the number of the one of these series that is 1 (`gpu_compute_mode_info`'s mode)."""
    split: Split | None = None
    """On a GPU several pods use: shared among them by this measure (else served once, for the
    device, without pod labels)."""
    default: bool = False
    """In dcgm-exporter's default counters (served when no counters file is given)."""
    derived: str = ""
    """The field table's "from" where `sources` and `bits` do not say it (the last XID, a label)."""
    note: str = ""
    """The field table's remark: a fallback, a unit that differs from what a consumer assumes."""

    def value(self, values: Mapping[Series, float], *, gpm: bool = False) -> float | None:
        """The field's value from a GPU's values this cycle; None where the GPU gave none.
        `gpm`: the GPU has GPM (`GpuIdentity.has_gpm`), so a GPM stand-in is never used."""
        if self.sources:
            given = [
                found * source.factor
                for source in self.sources
                if not (gpm and source.without_gpm)
                and (found := values.get(source.series)) is not None
            ]
            return (float(sum(given)) if self.summed else given[0]) if given else None
        if self.bits:
            states = [(bit, values.get(series)) for bit, series in self.bits]
            if all(state is None for _, state in states):
                return None
            return float(sum(bit for bit, state in states if state))
        if self.totals:
            summed = [
                number
                for template in self.totals
                for link in LINKS
                if (number := values.get(link_series(template, link))) is not None
            ]
            return float(sum(summed)) if summed else None
        for number, series in self.modes:
            if values.get(series):
                return float(number)
        return None

    @property
    def while_down(self) -> bool:
        """Still served for a GPU that is down (what the event thread counted)."""
        return self.name in _LAST_XID


def _field(
    name: str,
    kind: Kind,
    unit: str,
    help_text: str,
    *sources: Source,
    split: Split | None = None,
    default: bool = False,
    note: str = "",
) -> Field:
    return Field(
        name, kind, help_text, unit, sources=sources, split=split, default=default, note=note
    )


_THROTTLE_FIELDS: Final = (
    ("POWER", "power", "power constraints"),
    ("THERMAL", "thermal", "thermal constraints"),
    ("SYNC_BOOST", "sync_boost", "sync-boost constraints"),
    ("BOARD_LIMIT", "board_limit", "board limit constraints"),
    ("LOW_UTIL", "low_utilization", "low utilization"),
    ("RELIABILITY", "reliability", "reliability constraints"),
    ("TOTAL_APP_CLOCKS", "app_clocks", "application clocks"),
    ("TOTAL_BASE_CLOCKS", "base_clocks", "base clocks"),
)
_VIOLATION_NOTE: Final = "DCGM's unit (OpenCost's saturation query divides by 1e6, as if µs)"
_CLOCK_EVENT_BITS: Final = tuple((bit, CLOCK_EVENTS[reason]) for bit, reason in CLOCK_EVENT_REASONS)

FIELDS: Final[tuple[Field, ...]] = (
    # -- dcgm-exporter's default counters, in its file's order ---------------------------------
    _field(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "MHz",
        "SM clock frequency (in MHz).",
        Source(CLOCKS["sm"], _MHZ),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "MHz",
        "Memory clock frequency (in MHz).",
        Source(CLOCKS["memory"], _MHZ),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "°C",
        "Memory temperature (in C).",
        Source(MEMORY_TEMPERATURE),
        default=True,
        note="HBM boards only: GDDR boards have no sensor NVML reads",
    ),
    _field(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "°C",
        "GPU temperature (in C).",
        Source(TEMPERATURE),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "W",
        "Power draw (in W).",
        Source(POWER),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "mJ",
        "Total energy consumption since boot (in mJ).",
        Source(ENERGY, _MILLI),
        default=True,
        note="since the driver loaded, as NVML counts it",
    ),
    _field(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "retries",
        "Total number of PCIe retries.",
        Source(PCIE_REPLAYS),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "%",
        "GPU utilization (in %).",
        Source(UTILIZATION, _PERCENT),
        split="utilization",
        default=True,
        note="absent on MIG instances, as with DCGM",
    ),
    _field(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "%",
        "Memory utilization (in %).",
        Source(MEMORY_UTILIZATION, _PERCENT),
        default=True,
        note="not split on a shared GPU: gpuscope's pod rows carry no per-process memory "
        "utilization yet",
    ),
    _field(
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "%",
        "Encoder utilization (in %).",
        Source(ENCODER, _PERCENT),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_DEC_UTIL",
        "gauge",
        "%",
        "Decoder utilization (in %).",
        Source(DECODER, _PERCENT),
        default=True,
    ),
    Field(
        XID_ERRORS,
        "gauge",
        "Value of the last XID error encountered.",
        "XID",
        default=True,
        derived="`gpu_xid_errors_total`: the XID counted last, 0 before any; labels `err_code`, "
        "`err_msg`",
        note="kept while the GPU is down; with the `events` collector only",
    ),
    _field(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "MiB",
        "Framebuffer memory free (in MiB).",
        Source(MEMORY_FREE, _MIB),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "MiB",
        "Framebuffer memory used (in MiB).",
        Source(MEMORY_USED, _MIB),
        split="memory",
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "MiB",
        "Framebuffer memory reserved (in MiB).",
        Source(MEMORY_RESERVED, _MIB),
        default=True,
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "bytes",
        totals=(NVLINK_TRANSMIT_TOTAL, NVLINK_RECEIVE_TOTAL),
        default=True,
        note="bytes sent and received over every link since the driver loaded, payload only "
        "(DCGM also counts packet headers); absent on GPUs without NVLink, and unless the "
        "`nvlink` collector, off by default, is on (`--collector.nvlink`, chart profile `full`)",
    ),
    _field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "rows",
        "Number of remapped rows for uncorrectable errors",
        Source(REMAPPED_UNCORRECTABLE),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "rows",
        "Number of remapped rows for correctable errors",
        Source(REMAPPED_CORRECTABLE),
        default=True,
    ),
    _field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "0/1",
        "Whether remapping of rows has failed",
        Source(REMAPPED_FAILED),
        default=True,
    ),
    Field(
        DRIVER_VERSION,
        "label",
        "Driver Version",
        "",
        default=True,
        derived="`gpu_info`'s `driver_version`, as a label of every series of the GPU",
    ),
    _field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of time the graphics engine is active.",
        Source(GRAPHICS_ACTIVE),
        Source(UTILIZATION, without_gpm=True),
        split="utilization",
        default=True,
        note="GPM's graphics-engine activity on Hopper and newer (MIG instances too); before "
        "Hopper, NVML's share of time a kernel ran, what DCGM's profiling measures there; "
        "absent on a MIG instance without GPM, and on a GPU with GPM for a cycle GPM skips "
        "(never NVML's utilization in its place)",
    ),
    _field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        Source(TENSOR_ACTIVE),
        default=True,
        note="GPM: Hopper and newer",
    ),
    _field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "ratio",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        Source(DRAM_ACTIVE),
        default=True,
        note="GPM: Hopper and newer",
    ),
    _field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        Source(PCIE_TRANSMIT),
        default=True,
    ),
    _field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data received over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
        Source(PCIE_RECEIVE),
        default=True,
    ),
    # -- served when a counters file lists them -------------------------------------------------
    _field(
        "DCGM_FI_DEV_FB_TOTAL",
        "gauge",
        "MiB",
        "Total Frame Buffer of the GPU in MB",
        Source(MEMORY_TOTAL, _MIB),
    ),
    _field(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "gauge",
        "MHz",
        "Maximum supported SM clock for the device",
        Source(MAX_CLOCKS["sm"], _MHZ),
    ),
    _field(
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        "gauge",
        "MHz",
        "Maximum supported Memory clock for the device",
        Source(MAX_CLOCKS["memory"], _MHZ),
    ),
    *(
        Field(
            name,
            "gauge",
            "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
            "bitmask",
            bits=_CLOCK_EVENT_BITS,
            note=note,
        )
        for name, note in (
            ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", ""),
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM's older name of the same field"),
        )
    ),
    _field(
        "DCGM_FI_DEV_PSTATE",
        "gauge",
        "0-15",
        "Performance state (P-State) 0-15. 0=highest",
        Source(PSTATE),
    ),
    _field(
        "DCGM_FI_DEV_FAN_SPEED",
        "gauge",
        "%",
        "Fan speed for the device in percent 0-100",
        Source(fan_series(0), _PERCENT),
        note="the first fan; actively cooled cards only",
    ),
    _field(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "W",
        "Effective power limit that the driver enforces after taking into account all limiters",
        Source(POWER_LIMIT),
    ),
    *(
        _field(name, "gauge", "W", help_text, Source(series))
        for name, series, help_text in (
            (
                "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN",
                POWER_LIMIT_MIN,
                "Minimum power management limit for the device",
            ),
            (
                "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
                POWER_LIMIT_MAX,
                "Maximum power management limit for the device",
            ),
            (
                "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
                POWER_LIMIT_DEFAULT,
                "Default power management limit for the device",
            ),
        )
    ),
    Field(
        "DCGM_FI_DEV_COMPUTE_MODE",
        "gauge",
        "Compute mode for the device",
        "mode",
        modes=tuple((number, COMPUTE_MODE[name]) for number, name in COMPUTE_MODES.items()),
        derived="`gpu_compute_mode_info`'s `mode`, numbered as NVML numbers it (0 default, 1 "
        "exclusive thread, 2 prohibited, 3 exclusive process)",
    ),
    _field(
        "DCGM_FI_DEV_PERSISTENCE_MODE",
        "gauge",
        "0/1",
        "Persistence mode for the device",
        Source(PERSISTENCE_MODE),
    ),
    *(
        _field(name, "gauge", unit, help_text, Source(series))
        for name, unit, series, help_text in (
            (
                "DCGM_FI_DEV_PCIE_LINK_GEN",
                "generation",
                PCIE_GENERATION,
                "PCIe Current Link Generation",
            ),
            ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "lanes", PCIE_WIDTH, "PCIe Current Link Width"),
            (
                "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
                "generation",
                PCIE_MAX_GENERATION,
                "PCIe Max Link Generation",
            ),
            ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "lanes", PCIE_MAX_WIDTH, "PCIe Max Link Width"),
        )
    ),
    _field(
        "DCGM_FI_DEV_MIG_MODE",
        "gauge",
        "0/1",
        "MIG mode for the device",
        Source(MIG_MODE),
    ),
    *(
        _field(
            f"DCGM_FI_DEV_{name}_VIOLATION",
            "counter",
            "ns",
            f"Throttling duration due to {what} (in ns).",
            Source(THROTTLE[reason], _NANO),
            note=_VIOLATION_NOTE,
        )
        for name, reason, what in _THROTTLE_FIELDS
    ),
    _field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "errors",
        "Total number of single-bit volatile ECC errors.",
        Source(ECC_CORRECTED),
    ),
    _field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "errors",
        "Total number of double-bit volatile ECC errors.",
        Source(ECC_UNCORRECTED),
    ),
    _field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "errors",
        "Total number of single-bit persistent ECC errors.",
        Source(ECC_AGGREGATE_CORRECTED),
    ),
    _field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "errors",
        "Total number of double-bit persistent ECC errors.",
        Source(ECC_AGGREGATE_UNCORRECTED),
    ),
    _field(
        "DCGM_FI_DEV_RETIRED_SBE",
        "counter",
        "pages",
        "Total number of retired pages due to single-bit errors.",
        Source(RETIRED_SINGLE_BIT),
    ),
    _field(
        "DCGM_FI_DEV_RETIRED_DBE",
        "counter",
        "pages",
        "Total number of retired pages due to double-bit errors.",
        Source(RETIRED_DOUBLE_BIT),
    ),
    _field(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "counter",
        "0/1",
        "Total number of pages pending retirement.",
        Source(RETIRED_PENDING),
        note="1 while a retirement waits for a reset (NVML gives a state, not a count)",
    ),
    _field(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "0/1",
        "Whether remapping of rows is pending",
        Source(REMAPPED_PENDING),
    ),
    *(
        _field(name, "gauge", "ratio", help_text, Source(series), note="GPM: Hopper and newer")
        for name, series, help_text in (
            (
                "DCGM_FI_PROF_SM_ACTIVE",
                SM_ACTIVE,
                "The ratio of cycles an SM has at least 1 warp assigned.",
            ),
            (
                "DCGM_FI_PROF_SM_OCCUPANCY",
                SM_OCCUPANCY,
                "The ratio of number of warps resident on an SM.",
            ),
            (
                "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
                FP64_ACTIVE,
                "Ratio of cycles the fp64 pipes are active.",
            ),
            (
                "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
                FP32_ACTIVE,
                "Ratio of cycles the fp32 pipes are active.",
            ),
            (
                "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
                FP16_ACTIVE,
                "Ratio of cycles the fp16 pipes are active.",
            ),
        )
    ),
    *(
        Field(
            f"DCGM_FI_DEV_NVLINK_{name}_COUNT_TOTAL",
            "counter",
            help_text,
            "errors",
            totals=(NVLINK_ERRORS[kind],),
        )
        for name, kind, help_text in (
            ("CRC_FLIT_ERROR", "crc_flit", "Total number of NVLink flow-control CRC errors."),
            ("CRC_DATA_ERROR", "crc_data", "Total number of NVLink data CRC errors."),
            ("REPLAY_ERROR", "replay", "Total number of NVLink retries."),
            ("RECOVERY_ERROR", "recovery", "Total number of NVLink recovery errors."),
        )
    ),
    _field(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data transmitted over NVLink (not including protocol headers) in bytes "
        "per second.",
        Source(NVLINK_TRANSMIT),
        note="GPM: Hopper and newer",
    ),
    _field(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "bytes/s",
        "The rate of data received over NVLink (not including protocol headers) in bytes per "
        "second.",
        Source(NVLINK_RECEIVE),
        note="GPM: Hopper and newer",
    ),
)
"""Every DCGM field gpuscope serves: dcgm-exporter's defaults first, in its file's order."""

BY_NAME: Final[Mapping[str, Field]] = {field.name: field for field in FIELDS}
SPLIT_BY: Final[Mapping[Split, Series]] = {"utilization": UTILIZATION, "memory": MEMORY_USED}
"""The device's own measure a split is relative to: a pod's share of a shared GPU is its
processes' utilization (memory) over the device's, or over the pods' sum where that is larger."""
DEFAULT_FIELDS: Final = tuple(field for field in FIELDS if field.default)
