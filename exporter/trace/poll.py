"""The driver side of a trace: one GPU's readings, made on the GPU's own worker thread.

Utilization, power and the SM clock come from NVML's sample buffers where the driver keeps them
(`nvmlDeviceGetSamples`: every sample newer than the last one taken, at the driver's own rate);
a counter whose buffer the driver does not keep (NotSupported, or a library without the
function) is polled instead, one reading per poll, as is `memory_used`, which NVML does not
sample. Polls come every `POLL_SECONDS`.

Threading: a `GpuPoller` belongs to the one poll running or waiting for it — the trace never
hands out a GPU's next poll before the last one answered — and each poll's points are handed
back through its future.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.nvml.driver import error_code, is_lifecycle_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.nvml.driver import NvmlDriver

POLL_SECONDS: Final = 0.05
"""How often a GPU is polled: 20 Hz, twice the trace's promised 10 Hz, so that a poll made late
by a busy worker or a loaded machine costs no promised sample."""

UTILIZATION: Final = "utilization"
MEMORY_USED: Final = "memory_used"
POWER: Final = "power"
SM_CLOCK: Final = "sm_clock"
COUNTERS: Final = (UTILIZATION, MEMORY_USED, POWER, SM_CLOCK)
"""The counters of every GPU's trace, in percent, bytes, watts and MHz: the units of
`gpu_utilization_ratio` times 100, `gpu_memory_used_bytes`, `gpu_power_watts` and
`gpu_clock_hertz{clock="sm"}` divided by a million."""

BUFFERED: Final = {
    UTILIZATION: (pynvml.NVML_GPU_UTILIZATION_SAMPLES, 1.0),
    POWER: (pynvml.NVML_TOTAL_POWER_SAMPLES, 0.001),
    SM_CLOCK: (pynvml.NVML_PROCESSOR_CLK_SAMPLES, 1.0),
}
"""The counters the driver may keep samples of: the sample type, and the factor from NVML's unit
(percent, milliwatts, MHz) to the trace's."""

_MEMBERS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
"""`c_nvmlValue_t`'s member for each `nvmlValueType_t`."""
_UNBUFFERED: Final = frozenset(
    {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)

Point = tuple[str, int, float]
"""A counter's name, its time (µs since the epoch) and its value."""


class GpuLostDuringTrace(Exception):
    """The GPU answered a lifecycle error: its trace ends there."""


class GpuPoller:
    """One GPU's trace readings since `started_us`; `poll` answers the new points."""

    def __init__(
        self,
        driver: NvmlDriver,
        handle: object,
        *,
        started_us: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = driver
        self.handle = handle
        """The GPU's handle (the trace hands a new one after a re-initialisation)."""
        self._clock = clock
        self._epoch_us = started_us - clock() * 1e6
        """Polled points are timed by the monotonic clock from the trace's start (the wall
        clock may step back; a counter's times must only go up)."""
        self._last: dict[str, int] = dict.fromkeys(COUNTERS, started_us)
        """The newest point's time per counter: only later ones are kept."""
        self.polled: set[str] = {MEMORY_USED}
        """Counters read by polling: memory, and those whose buffer the driver does not keep."""

    def poll(self) -> list[Point]:
        """The points since the last poll. Raises `GpuLostDuringTrace` for a lifecycle error;
        another refusal costs only that counter's point."""
        points: list[Point] = []
        now_us = round(self._epoch_us + self._clock() * 1e6)
        for counter in COUNTERS:
            try:
                if counter in self.polled:
                    self._keep(points, counter, now_us, self._read(counter))
                else:
                    self._buffered(points, counter)
            except pynvml.NVMLError as error:
                if is_lifecycle_error(error):
                    raise GpuLostDuringTrace(counter) from error
        return points

    def _buffered(self, points: list[Point], counter: str) -> None:
        sample_type, factor = BUFFERED[counter]
        try:
            value_type, samples = self._nvml.nvmlDeviceGetSamples(
                self.handle, sample_type, self._last[counter]
            )
        except pynvml.NVMLError as error:
            code = error_code(error)
            if code == pynvml.NVML_ERROR_NOT_FOUND:
                return  # no sample since the last one
            if code not in _UNBUFFERED:
                raise
            self.polled.add(counter)
            return
        member = _MEMBERS.get(value_type)
        if member is None:
            self.polled.add(counter)  # a value type this version does not know: poll it
            return
        for sample in samples:
            self._keep(
                points, counter, sample.timeStamp, getattr(sample.sampleValue, member) * factor
            )

    def _keep(self, points: list[Point], counter: str, at_us: int, value: float) -> None:
        if at_us > self._last[counter]:
            self._last[counter] = at_us
            points.append((counter, at_us, float(value)))

    def _read(self, counter: str) -> float:
        # The plain readings' functions, called by name as their declarations call them.
        call = partial(getattr, self._nvml)
        handle = self.handle
        if counter == MEMORY_USED:
            return float(_memory_used(call("nvmlDeviceGetMemoryInfo"), handle))
        if counter == UTILIZATION:
            return float(call("nvmlDeviceGetUtilizationRates")(handle).gpu)
        if counter == POWER:
            return float(call("nvmlDeviceGetPowerUsage")(handle)) / 1000.0
        return float(call("nvmlDeviceGetClockInfo")(handle, pynvml.NVML_CLOCK_SM))


def _memory_used(memory_info: Callable[..., Any], handle: object) -> int:
    """As `gpu_memory_used_bytes` reads it: version 2 (reserved memory apart), else version 1."""
    try:
        return int(memory_info(handle, version=pynvml.nvmlMemory_v2).used)
    except pynvml.NVMLError as error:
        if is_lifecycle_error(error):
            raise
        return int(memory_info(handle).used)
