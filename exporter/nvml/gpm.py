"""GPU Performance Monitoring (GPM, Hopper and newer): profiling-class metrics without DCGM.

GPM metrics are computed by the driver from two samples taken at least 100 ms apart. A
`GpmReader` keeps two sample buffers for one GPU (or one MIG instance): each cycle it takes a
new sample into the spare buffer and asks for every metric over the window since the previous
one, in one `nvmlGpmMetricsGet` call. The buffers are allocated once and freed by `free()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.readings.gpm import GPM_METRICS
from exporter.structs import plain_layout

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.nvml.driver import NvmlDriver
    from exporter.series import Series

MIN_WINDOW_SECONDS: Final = 0.1
"""GPM needs samples at least this far apart; a cycle closer to the last one reuses it later."""


def _results_layout(count: int) -> struct.Struct:
    """`count` nvmlGpmMetric_t answers read in one call: (return code, value) for each; the
    offsets are ctypes' own, so pynvml's layout is followed."""
    metric = pynvml.c_nvmlGpmMetric_t
    code, value = metric.nvmlReturn, metric.value
    if code.size != 4 or value.size != 8 or value.offset < code.offset + 4:
        raise RuntimeError("nvmlGpmMetric_t: unexpected layout of nvmlReturn and value")
    gap = value.offset - code.offset - 4
    tail = ctypes.sizeof(metric) - value.offset - 8
    return struct.Struct("=" + f"{code.offset}xI{gap}xd{tail}x" * count)


_RESULTS: Final = _results_layout(len(GPM_METRICS))
_RESULTS_OFFSET: Final = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset


@dataclass(frozen=True, slots=True)
class GpmReading:
    values: dict[Series, float]
    """Each metric the GPU gave, by its series (`exporter.readings.gpm.GPM_METRICS`)."""
    window_seconds: float
    """How long the two samples lay apart: what the activity ratios are averaged over."""


def supports_gpm(driver: NvmlDriver, handle: object) -> bool:
    """Whether the driver says this GPU has GPM. Raises the driver's error when it cannot tell."""
    return bool(driver.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)


class GpmReader:
    """Metrics from consecutive GPM samples of one GPU or MIG instance."""

    def __init__(self, driver: NvmlDriver, take: Callable[[object], object]) -> None:
        """`take(sample)` fills a sample buffer: `nvmlGpmSampleGet(handle, sample)` or
        `nvmlGpmMigSampleGet(parent, gpu_instance_id, sample)`."""
        self._nvml = driver
        self._take = take
        self._previous: object | None = None
        self._previous_at = 0.0
        self._spare: object | None = None
        self._request = pynvml.c_nvmlGpmMetricsGet_t()
        self._request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        self._request.numMetrics = len(GPM_METRICS)
        # Samples are set through a plain view of the request's memory (pynvml's own struct
        # attributes are several times slower, and this runs for every GPU each cycle), results
        # read with one `struct` call.
        self._samples: Any = plain_layout(pynvml.c_nvmlGpmMetricsGet_t).from_buffer(self._request)
        metrics: Any = (plain_layout(pynvml.c_nvmlGpmMetric_t) * len(GPM_METRICS)).from_buffer(
            self._request, _RESULTS_OFFSET
        )
        for slot, (metric_id, _, _, _) in enumerate(GPM_METRICS):
            metrics[slot].metricId = metric_id

    def read(self, now: float) -> GpmReading | None:
        """Take a sample; the metrics since the previous one, or None for the very first sample.

        NVML errors propagate, so the caller decides what an unsupported or lost GPU means."""
        if self._previous is not None and now - self._previous_at < MIN_WINDOW_SECONDS:
            return None  # too soon for GPM: measure over a longer window next cycle
        if self._spare is None:
            self._spare = self._nvml.nvmlGpmSampleAlloc()
        self._take(self._spare)
        current, self._spare = self._spare, None
        previous, previous_at = self._previous, self._previous_at
        self._previous, self._previous_at = current, now
        if previous is None:
            return None
        self._spare = previous  # reused for the next sample, whatever happens below
        self._samples.sample1 = previous
        self._samples.sample2 = current
        self._nvml.nvmlGpmMetricsGet(self._request)
        # Every metric's code and value in one C call, not through a ctypes view per metric.
        results = _RESULTS.unpack_from(self._request, _RESULTS_OFFSET)
        values: dict[Series, float] = {}
        for (_, series, factor, ceiling), code, value in zip(
            GPM_METRICS, results[0::2], results[1::2], strict=True
        ):
            if code == pynvml.NVML_SUCCESS:
                values[series] = min(max(value, 0.0) * factor, ceiling)
        return GpmReading(values, now - previous_at)

    def free(self) -> None:
        """Release both sample buffers. Errors are ignored: the library may already be down."""
        for sample in (self._previous, self._spare):
            if sample is not None:
                with contextlib.suppress(pynvml.NVMLError):
                    self._nvml.nvmlGpmSampleFree(sample)
        self._previous = self._spare = None
