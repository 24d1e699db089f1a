"""`nvmlDeviceGetSamples` for the simulator: the driver's sample buffers, as rings of each GPU's
own values taken at the driver's sample rate.

A real driver samples a GPU's utilization, power and clocks on its own schedule and keeps the
last samples in a ring; `nvmlDeviceGetSamples(handle, type, since_us)` answers those newer than
`since_us` (CPU timestamps in µs), `NOT_FOUND` when there is none, `NOT_SUPPORTED` for a type the
GPU does not sample. The simulated GPU's state changes only when it is asked about, so each ring
is filled when it is read: every sample time on the driver's grid since the last fill takes the
value the GPU has now (the state a call advanced it to) — the value held between two calls, as
every other simulated reading holds it.

Threading: a GPU's ring is touched by the thread its driver calls run in (one at a time).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.readings.simulated import not_supported

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.simulator.state import GpuState

SAMPLE_PERIOD_US: Final = 50_000
"""The simulated driver samples every 50 ms (20 Hz)."""
RING: Final = 120
"""Samples kept per GPU and type: 6 s at 20 Hz."""

_VALUES: Final[dict[int, Callable[[GpuState], int]]] = {
    pynvml.NVML_GPU_UTILIZATION_SAMPLES: lambda gpu: round(gpu.utilization * 100),
    pynvml.NVML_TOTAL_POWER_SAMPLES: lambda gpu: round(gpu.power_watts * 1000),
    pynvml.NVML_PROCESSOR_CLK_SAMPLES: lambda gpu: gpu.clock_mhz("sm"),
}
"""What each sampled type reads (percent, milliwatts, MHz: NVML's units), as the plain readings'
simulated answers do."""


class SampleBuffers:
    """Every GPU's rings, by GPU index and sample type."""

    def __init__(self) -> None:
        self._rings: dict[tuple[int, int], deque[tuple[int, int]]] = {}

    def since(self, gpu: GpuState, sample_type: int, now_us: int, last_seen_us: int) -> Any:
        """pynvml's answer: (value type, samples newer than `last_seen_us`)."""
        value = _VALUES.get(sample_type)
        if value is None or (sample_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES and gpu.mig_active):
            raise not_supported()
        ring = self._rings.setdefault((gpu.gpu.index, sample_type), deque(maxlen=RING))
        newest = now_us - now_us % SAMPLE_PERIOD_US
        oldest = newest - (RING - 1) * SAMPLE_PERIOD_US
        start = max(oldest, ring[-1][0] + SAMPLE_PERIOD_US) if ring else oldest
        current = value(gpu)
        ring.extend((at, current) for at in range(start, newest + 1, SAMPLE_PERIOD_US))
        fresh = [(at, number) for at, number in ring if at > last_seen_us]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        samples = []
        for at, number in fresh:
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = at
            sample.sampleValue.uiVal = number
            samples.append(sample)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, samples
