"""The `clocks` collector's readings: each clock now and at its peak, and the clock-event
(throttle) reasons holding the clocks down."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.readings.convert import MHZ, bit, times
from exporter.readings.declare import Output, fallback, family, reading
from exporter.series import Series

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.readings.declare import Reading
    from exporter.readings.simulated import SimulatedGpu

CLOCK_NAMES: Final = (
    ("sm", pynvml.NVML_CLOCK_SM),
    ("memory", pynvml.NVML_CLOCK_MEM),
    ("graphics", pynvml.NVML_CLOCK_GRAPHICS),
)
"""The `clock` label and the clock type NVML takes for it."""

_CLOCK_FAMILY: Final = family(
    "gpu_clock_hertz",
    "Current clock frequency.",
    unit="hertz",
    labels=("clock",),
    doc="current clock",
    labels_doc="`clock` (`sm`, `memory`, `graphics`)",
    collector="clocks",
)
_CLOCK_MAX_FAMILY: Final = family(
    "gpu_clock_max_hertz",
    "Maximum clock frequency.",
    unit="hertz",
    labels=("clock",),
    doc="maximum clock",
    collector="clocks",
)
CLOCKS: Final = {name: Series(_CLOCK_FAMILY, (("clock", name),)) for name, _ in CLOCK_NAMES}
MAX_CLOCKS: Final = {name: Series(_CLOCK_MAX_FAMILY, (("clock", name),)) for name, _ in CLOCK_NAMES}

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
_CLOCK_EVENT_FAMILY: Final = family(
    "gpu_clock_event_active",
    "1 while the named clock-event (throttle) reason holds the clocks down.",
    labels=("reason",),
    doc="1 while that clock-event (throttle) reason holds: `gpu_idle`, "
    "`applications_clocks_setting`, `sw_power_cap`, `hw_slowdown`, `sync_boost`, "
    "`sw_thermal_slowdown`, `hw_thermal_slowdown`, `hw_power_brake_slowdown`, "
    "`display_clock_setting`",
    collector="clocks",
)
CLOCK_EVENTS: Final = {
    reason: Series(_CLOCK_EVENT_FAMILY, (("reason", reason),)) for _, reason in CLOCK_EVENT_REASONS
}
_CLOCK_EVENT_OUTPUTS: Final = tuple(
    Output(CLOCK_EVENTS[reason], bit(mask)) for mask, reason in CLOCK_EVENT_REASONS
)

reading(
    "clock_events",
    "nvmlDeviceGetCurrentClocksEventReasons",
    _CLOCK_EVENT_OUTPUTS,
    # the same bits under the function's older name, for older drivers
    fallback=fallback(
        "throttle_reasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        _CLOCK_EVENT_OUTPUTS,
        simulated=lambda gpu: gpu.clock_events(),
    ),
    simulated=lambda gpu: gpu.clock_events(),
)


def _hertz_if_known(mhz: Any) -> float | None:
    """A peak clock in hertz; 0 MHz is a clock the GPU does not report."""
    return mhz * MHZ if mhz else None


def _simulated_clock(name: str) -> Callable[[SimulatedGpu], int]:
    return lambda gpu: gpu.clock_mhz(name)


def _simulated_max_clock(name: str) -> Callable[[SimulatedGpu], int]:
    return lambda gpu: round(gpu.model.max_clocks_hz.get(name, 0.0) / MHZ)


def _current(name: str, clock_type: int) -> Reading:
    return reading(
        f"{name}_clock",
        "nvmlDeviceGetClockInfo",
        (Output(CLOCKS[name], times(MHZ)),),
        args=(clock_type,),
        simulated=_simulated_clock(name),
    )


def _peak(name: str, clock_type: int) -> Reading:
    return reading(
        f"max_{name}_clock",
        "nvmlDeviceGetMaxClockInfo",
        (Output(MAX_CLOCKS[name], _hertz_if_known),),
        args=(clock_type,),
        once=True,
        simulated=_simulated_max_clock(name),
    )


_CURRENT_CLOCKS: Final = tuple(_current(name, clock_type) for name, clock_type in CLOCK_NAMES)
_PEAK_CLOCKS: Final = tuple(_peak(name, clock_type) for name, clock_type in CLOCK_NAMES)
