"""The `health` collector's readings: ECC errors, PCIe replays, HBM row remapping, page
retirement; and throttle time, which `exporter.nvml.health` reads into `THROTTLE`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pynvml

from exporter.readings.convert import count, item, number, truth
from exporter.readings.declare import HEALTH_PERIOD_SECONDS, Output, family, plain, reading
from exporter.readings.simulated import mig_capable, not_supported
from exporter.series import Series

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.readings.simulated import SimulatedGpu

_PAGE_RETIREMENT_ARCHITECTURES: Final = frozenset({"volta", "turing"})

# -- ECC errors ----------------------------------------------------------------------------------

_ECC_FAMILY: Final = family(
    "gpu_ecc_errors",
    "ECC memory errors since the driver was loaded, by type (corrected or uncorrected).",
    kind="counter",
    labels=("type",),
    doc="ECC errors since the driver loaded",
    labels_doc="`type` (`corrected`, `uncorrected`)",
    collector="health",
)
ECC_CORRECTED: Final = Series(_ECC_FAMILY, (("type", "corrected"),))
ECC_UNCORRECTED: Final = Series(_ECC_FAMILY, (("type", "uncorrected"),))
_ECC_AGGREGATE_FAMILY: Final = family(
    "gpu_ecc_errors_aggregate",
    "ECC memory errors over the board's life (kept across driver reloads), by type.",
    kind="counter",
    labels=("type",),
    labels_doc="`type` (`corrected`, `uncorrected`)",
    doc="ECC errors over the board's life, kept in its InfoROM across driver reloads (until "
    "cleared); absent on boards without ECC or with ECC off",
    collector="health",
)
ECC_AGGREGATE_CORRECTED: Final = Series(_ECC_AGGREGATE_FAMILY, (("type", "corrected"),))
ECC_AGGREGATE_UNCORRECTED: Final = Series(_ECC_AGGREGATE_FAMILY, (("type", "uncorrected"),))

# The simulated driver never reloads: its volatile and aggregate counts agree. The volatile counts
# are read on the health clock too: the event thread reads them again at an ECC event and its
# counts, when ahead, stand in until the next reading (`exporter.nvml.events.with_events`).
reading(
    "ecc_corrected",
    "nvmlDeviceGetTotalEccErrors",
    (Output(ECC_CORRECTED, number),),
    args=(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda gpu: gpu.ecc_corrected,
)
reading(
    "ecc_uncorrected",
    "nvmlDeviceGetTotalEccErrors",
    (Output(ECC_UNCORRECTED, number),),
    args=(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda gpu: gpu.ecc_uncorrected,
)
reading(
    "ecc_aggregate_corrected",
    "nvmlDeviceGetTotalEccErrors",
    (Output(ECC_AGGREGATE_CORRECTED, number),),
    args=(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda gpu: gpu.ecc_corrected,
)
reading(
    "ecc_aggregate_uncorrected",
    "nvmlDeviceGetTotalEccErrors",
    (Output(ECC_AGGREGATE_UNCORRECTED, number),),
    args=(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda gpu: gpu.ecc_uncorrected,
)

# -- PCIe replays --------------------------------------------------------------------------------

PCIE_REPLAYS: Final = plain(
    "pcie_replays",
    "nvmlDeviceGetPcieReplayCounter",
    family(
        "gpu_pcie_replays",
        "PCIe replay events (link errors the link recovered from).",
        kind="counter",
        doc="PCIe replays (link errors the link recovered from)",
        collector="health",
    ),
    number,
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda _gpu: 0,
)

# -- HBM row remapping ---------------------------------------------------------------------------

_REMAPPED_ROWS_FAMILY: Final = family(
    "gpu_remapped_rows",
    "Memory rows remapped to spare rows so far, by the cause (correctable or uncorrectable errors).",
    labels=("cause",),
    doc="HBM rows remapped so far (A100 and newer, MIG mode off)",
    labels_doc="`cause` (`correctable`, `uncorrectable`)",
    collector="health",
)
REMAPPED_CORRECTABLE: Final = Series(_REMAPPED_ROWS_FAMILY, (("cause", "correctable"),))
REMAPPED_UNCORRECTABLE: Final = Series(_REMAPPED_ROWS_FAMILY, (("cause", "uncorrectable"),))
REMAPPED_PENDING: Final = Series(
    family(
        "gpu_remapped_rows_pending",
        "1 while a row remapping waits for the next GPU reset.",
        doc="1 while a row remapping waits for a GPU reset",
        collector="health",
    )
)
REMAPPED_FAILED: Final = Series(
    family(
        "gpu_remapped_rows_failed",
        "1 if a row remapping failed: the GPU needs servicing.",
        doc="1 if a row remapping failed: service the GPU",
        collector="health",
    )
)


def _simulated_remapped_rows(gpu: SimulatedGpu) -> tuple[int, int, int, int]:
    # HBM row remapping: A100 and newer data-center GPUs, and not while MIG mode is on.
    if not mig_capable(gpu) or gpu.mig_active:
        raise not_supported()
    remapped = gpu.ecc_uncorrected
    return 0, remapped, int(remapped > 0), 0


reading(
    "remapped_rows",
    "nvmlDeviceGetRemappedRows",
    (
        Output(REMAPPED_CORRECTABLE, item(0)),
        Output(REMAPPED_UNCORRECTABLE, item(1)),
        Output(REMAPPED_PENDING, lambda rows: 1.0 if rows[2] else 0.0),
        Output(REMAPPED_FAILED, lambda rows: 1.0 if rows[3] else 0.0),
    ),
    since="ampere",
    period=HEALTH_PERIOD_SECONDS,
    simulated=_simulated_remapped_rows,
)

# -- page retirement -----------------------------------------------------------------------------

_RETIRED_PAGES_FAMILY: Final = family(
    "gpu_retired_pages",
    "Memory pages retired so far, by cause (multiple single-bit or a double-bit ECC error).",
    labels=("cause",),
    doc="memory pages retired so far (GPUs before A100)",
    labels_doc="`cause` (`single_bit`, `double_bit`)",
    collector="health",
)
RETIRED_SINGLE_BIT: Final = Series(_RETIRED_PAGES_FAMILY, (("cause", "single_bit"),))
RETIRED_DOUBLE_BIT: Final = Series(_RETIRED_PAGES_FAMILY, (("cause", "double_bit"),))


def _retired(gpu: SimulatedGpu) -> tuple[int, int]:
    """(single-bit, double-bit) pages a simulated GPU retired: page retirement is Volta's and
    Turing's (later GPUs remap rows)."""
    if gpu.model.architecture not in _PAGE_RETIREMENT_ARCHITECTURES:
        raise not_supported()
    return gpu.ecc_corrected // 2, gpu.ecc_uncorrected


def _simulated_retired_pages(cause: int) -> Callable[[SimulatedGpu], list[int]]:
    """The addresses of the pages retired for `cause`."""

    def answer(gpu: SimulatedGpu) -> list[int]:
        single, double = _retired(gpu)
        retired = (
            double if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else single
        )
        return [0x7F000000 + 0x1000 * (n + 1 + cause * 0x100) for n in range(retired)]

    return answer


reading(
    "retired_pages_single_bit",
    "nvmlDeviceGetRetiredPages",
    (Output(RETIRED_SINGLE_BIT, count),),
    args=(pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,),
    period=HEALTH_PERIOD_SECONDS,
    simulated=_simulated_retired_pages(
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    ),
)
reading(
    "retired_pages_double_bit",
    "nvmlDeviceGetRetiredPages",
    (Output(RETIRED_DOUBLE_BIT, count),),
    args=(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,),
    period=HEALTH_PERIOD_SECONDS,
    simulated=_simulated_retired_pages(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
)
RETIRED_PENDING: Final = plain(
    "retired_pages_pending",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    family(
        "gpu_retired_pages_pending",
        "1 while a page retirement waits for the next GPU reset.",
        doc="1 while a page retirement waits for a GPU reset",
        collector="health",
    ),
    truth,
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda gpu: int(_retired(gpu)[1] > 0),
)

# -- throttle time -------------------------------------------------------------------------------

THROTTLE_FAMILY: Final = family(
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
