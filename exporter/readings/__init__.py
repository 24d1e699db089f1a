"""Every plain NVML reading, declared once: the driver call, the conversion to base units, the
oldest architecture that has it, the series it fills, and what the simulator answers for it.

The declarations are grouped by the collector that reads them, one module each: `device`,
`clocks`, `health`, `mig`, `pcie`, `nvlink`; `gpm` and `events` declare the families that code of
their own in `exporter.nvml` fills (GPM, XID events). `declare` says how a reading is declared and
refuses a declaration that would shadow another; `convert` holds the conversions, `simulated`
what the simulator's answers read.

From the declarations come the sampler's reads (`exporter.nvml.device`), the snapshot's values
(`GpuSample.values`, keyed by the declared `Series`), the metric families (`exporter.metrics`),
the simulator's answers (`exporter.simulator`, which serves every declared call) and the metrics
reference. This package gathers them: `READINGS`, `VALUE_FAMILIES`, `BY_NAME`,
`FIELD_READINGS`, `SIMULATED_CALLS`. A plain reading is one `plain(...)` in its group's module:

    TEMPERATURE: Final = plain(
        "temperature",                                 # its name in logs
        "nvmlDeviceGetTemperature",                    # pynvml's function
        family(                                        # its family, as the metrics reference shows it
            "gpu_temperature_celsius", "GPU core temperature.", unit="celsius", collector="device"
        ),
        number,                                        # the answer in base units
        args=(pynvml.NVML_TEMPERATURE_GPU,),           # after the handle
        simulated=lambda gpu: round(gpu.temperature),  # the simulator's answer, as the driver's
    )

A reading filling several series (a struct, a bitmask, a label per value) is `reading(...)` with
its `Output`s; it may also be read once per fan or per active NVLink link (`per`), or be a field
value (`field`: a GPU's field values are read together, in one `nvmlDeviceGetFieldValues` call per
cycle). Readings that are not one call and a conversion — process lists, GPM, throttle time, MIG
enumeration — have code of their own in `exporter.nvml`, filling series declared here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.readings import clocks, device, events, gpm, health, mig, nvlink, pcie
from exporter.readings.declare import DECLARED

# Series that modules outside this package imported from here before it was one
# (exporter.attribution.join, exporter.nvml.events); new code imports a series from its group.
from exporter.readings.device import ENERGY, UTILIZATION
from exporter.readings.events import LAST_XID, xid_series
from exporter.readings.gpm import SM_ACTIVE
from exporter.readings.health import ECC_CORRECTED, ECC_UNCORRECTED

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from exporter.readings.declare import Args, Reading
    from exporter.series import Family, Series

__all__ = [
    "BY_NAME",
    "ECC_CORRECTED",
    "ECC_UNCORRECTED",
    "ENERGY",
    "FIELD_READINGS",
    "LAST_XID",
    "READINGS",
    "SIMULATED_CALLS",
    "SM_ACTIVE",
    "UTILIZATION",
    "VALUE_FAMILIES",
    "all_readings",
    "clocks",
    "device",
    "events",
    "gpm",
    "health",
    "mig",
    "nvlink",
    "pcie",
    "read_now",
    "xid_series",
]

READINGS: Final[tuple[Reading, ...]] = tuple(DECLARED.readings)
"""Every plain reading, group by group, each group in declaration order (the sampler reads them
collector by collector, `exporter.nvml.device`)."""
VALUE_FAMILIES: Final[tuple[Family, ...]] = tuple(DECLARED.families)
"""Every family a GPU's `values` fill (`exporter.metrics.gpu` writes them, in its order)."""


def all_readings() -> Iterator[Reading]:
    """The readings and their fallbacks."""
    for reading in READINGS:
        yield from reading.chain()


BY_NAME: Final[Mapping[str, Reading]] = {reading.name: reading for reading in all_readings()}
FIELD_READINGS: Final[Mapping[int, Reading]] = dict(DECLARED.fields)
"""Field values, by field id: read in one call per GPU, answered by the simulator's
`nvmlDeviceGetFieldValues` from these declarations (`simulated(gpu)`, or `simulated(gpu,
link)` for a per-link field)."""
SIMULATED_CALLS: Final[Mapping[str, Mapping[Args, Reading]]] = {
    call: {args: reading for args, reading in by_args.items() if reading.simulated is not None}
    for call, by_args in DECLARED.calls.items()
}
"""Driver function -> the readings of it the simulator answers, by their arguments after the
handle (and after the fan or link of a per-fan or per-link reading): each call is answered from
the declaration with its arguments, and two declarations never share them (`declare`)."""


def read_now(driver: object, handle: object, reading: Reading) -> dict[Series, float]:
    """One reading made directly, its errors left to the caller: for a one-off reader such as
    the calibration job, which records conditions through the same declarations."""
    answer = getattr(driver, reading.call)(handle, *reading.args)
    return {
        output.series: value
        for output in reading.outputs
        if (value := output.value(answer)) is not None
    }
