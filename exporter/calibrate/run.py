"""One calibration run: the plan for this device and mode, every step measured, one profile.

Sizes follow the device: on a GPU, matmuls up to 16384^3 (the shapes at which tensor cores reach
their sustained rate) and memory buffers of at least 16x the L2 cache; on a CPU, small matmuls and
buffers several times the last-level cache, so a quick CPU run takes seconds.
"""

from __future__ import annotations

import functools
import platform
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import torch

from exporter import __version__
from exporter.calibrate import kernels
from exporter.calibrate.device import DeviceInfo, NvmlConditions
from exporter.calibrate.method import (
    CudaEventTimer,
    MethodSettings,
    MonotonicTimer,
    Timer,
    iteration_times,
    summarize,
)
from exporter.calibration.profile import (
    BYTES_UNIT,
    SECONDS_UNIT,
    Conditions,
    Figure,
    Method,
    Profile,
    Result,
    Skipped,
    Software,
    matmul_unit,
)
from exporter.catalog import DTYPES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractContextManager

    from exporter.calibrate.progress import Reporter
    from exporter.catalog import Catalog
    from exporter.nvml.driver import NvmlDriver

GIB: Final = 2**30
MIB: Final = 2**20

_GPU_SIZES: Final[dict[bool, dict[str, tuple[int, ...]]]] = {
    False: {"fp64": (2048, 4096), "fp32": (4096, 8192), "tensor": (4096, 8192, 16384)},
    True: {"fp64": (2048,), "fp32": (4096,), "tensor": (8192,)},
}
_CPU_SIZES: Final[dict[bool, tuple[int, ...]]] = {False: (256, 512), True: (256,)}
_GPU_METHOD: Final = {
    False: MethodSettings(warmup_seconds=0.5, trial_seconds=0.1, trials=7),
    True: MethodSettings(warmup_seconds=0.2, trial_seconds=0.05, trials=3),
}
_CPU_METHOD: Final = {
    False: MethodSettings(warmup_seconds=0.2, trial_seconds=0.1, trials=5),
    True: MethodSettings(warmup_seconds=0.05, trial_seconds=0.03, trials=3),
}


@dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    method: MethodSettings
    matmul_sizes: Mapping[str, tuple[int, ...]]
    memory_bytes: int
    """Size of each buffer for the memory bandwidth steps."""
    transfer_bytes: int


def plan_for(device_type: str, *, quick: bool, cache_bytes: int, total_memory_bytes: int) -> Plan:
    """What to measure at which sizes. Pure: tested on numbers."""
    on_gpu = device_type == "cuda"
    budget = total_memory_bytes // 4 if total_memory_bytes else 8 * GIB
    sizes: dict[str, tuple[int, ...]] = {}
    for dtype in DTYPES:
        if on_gpu:
            wanted = _GPU_SIZES[quick].get(dtype, _GPU_SIZES[quick]["tensor"])
        else:
            wanted = _CPU_SIZES[quick]
        # A, B and C must fit in a quarter of the memory; the smallest size is always tried.
        fitting = tuple(n for n in wanted if 3 * n * n * kernels.ELEMENT_BYTES[dtype] <= budget)
        sizes[dtype] = fitting or wanted[:1]
    if on_gpu:
        memory = max((8 if quick else 16) * cache_bytes, (256 * MIB) if quick else GIB)
        transfer = 256 * MIB if quick else GIB
    else:
        memory = max(4 * cache_bytes, (64 if quick else 256) * MIB)
        transfer = 0
    memory = min(memory, max(budget // 2, 16 * MIB))
    return Plan(
        quick=quick,
        method=(_GPU_METHOD if on_gpu else _CPU_METHOD)[quick],
        matmul_sizes=sizes,
        memory_bytes=memory,
        transfer_bytes=transfer,
    )


def measure(
    factory: Callable[[], AbstractContextManager[kernels.Workload]],
    timer: Timer,
    settings: MethodSettings,
    *,
    unit: str,
    datasheet: float | None = None,
) -> Result:
    """One figure by the method, or why it could not be measured here."""
    try:
        with factory() as workload:
            times = iteration_times(workload.work, timer, settings)
    except kernels.Unsupported as unsupported:
        return Skipped(str(unsupported))
    except torch.cuda.OutOfMemoryError:
        return Skipped("out of device memory at this size")
    if workload.kind == "rate":
        values = [workload.units / seconds for seconds in times]
    else:
        values = [seconds / workload.units for seconds in times]
    summary = summarize(values)
    return Figure(
        value=summary.median,
        unit=unit,
        minimum=summary.minimum,
        maximum=summary.maximum,
        trials=summary.trials,
        unstable=summary.unstable(settings.unstable_spread),
        size=workload.size,
        datasheet=datasheet,
    )


def best(results: list[Result]) -> Result:
    """The highest rate among the sizes that ran; the first reason when none did."""
    figures = [result for result in results if isinstance(result, Figure)]
    if figures:
        return max(figures, key=lambda figure: figure.value)
    return results[0]


_SI: Final = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_quantity(value: float, unit: str) -> str:
    """`312.4 TFLOP/s`, `2.95 TB/s`, `5.9 µs`."""
    if unit == SECONDS_UNIT:
        for scale, prefix in ((1.0, ""), (1e-3, "m"), (1e-6, "µ")):
            if value >= scale:
                return f"{value / scale:.3g} {prefix}s"
        return f"{value * 1e9:.3g} ns"
    for scale, prefix in _SI:
        if value >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def describe_result(result: Result) -> str:
    if isinstance(result, Skipped):
        return f"skipped: {result.reason}"
    text = f"{format_quantity(result.value, result.unit)} ±{result.spread / 2:.1%} at {result.size}"
    if result.achieved_ratio is not None:
        text += f" ({result.achieved_ratio:.0%} of datasheet)"
    return text + (" UNSTABLE" if result.unstable else "")


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_calibration(
    info: DeviceInfo,
    *,
    quick: bool,
    catalog: Catalog,
    reporter: Reporter,
    nvml: NvmlDriver | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Profile:
    """Measure every figure on `info.device` and return the profile."""
    started = clock()
    device = info.device
    plan = plan_for(
        device.type,
        quick=quick,
        cache_bytes=info.cache_bytes,
        total_memory_bytes=info.total_memory_bytes,
    )
    timer: Timer = CudaEventTimer(torch) if device.type == "cuda" else MonotonicTimer()
    model = catalog.find(info.model)
    conditions_reader, conditions_skipped = _open_conditions(info, nvml)
    before = conditions_reader.read() if conditions_reader is not None else None
    settings = plan.method

    def matmul_step(dtype: str) -> Callable[[], Result]:
        def run() -> Result:
            datasheet = model.peak_flops.get(dtype) if model is not None else None
            return best(
                [
                    measure(
                        functools.partial(kernels.matmul, dtype, n, device),
                        timer,
                        settings,
                        unit=matmul_unit(dtype),
                        datasheet=datasheet,
                    )
                    for n in plan.matmul_sizes[dtype]
                ]
            )

        return run

    bandwidth = model.memory_bandwidth_bytes_per_second if model is not None else None
    steps: list[tuple[str, str, Callable[[], Result]]] = [
        (f"matmul_{dtype}", f"matmul {dtype}", matmul_step(dtype)) for dtype in DTYPES
    ]
    steps += [
        (
            "memory_copy",
            "memory copy",
            lambda: measure(
                lambda: kernels.memory_copy(plan.memory_bytes, device),
                timer,
                settings,
                unit=BYTES_UNIT,
                datasheet=bandwidth,
            ),
        ),
        (
            "memory_read",
            "memory read",
            lambda: measure(
                lambda: kernels.memory_read(plan.memory_bytes, device),
                timer,
                settings,
                unit=BYTES_UNIT,
                datasheet=bandwidth,
            ),
        ),
        (
            "host_to_device",
            "host to device",
            lambda: measure(
                lambda: kernels.transfer("host_to_device", plan.transfer_bytes, device),
                timer,
                settings,
                unit=BYTES_UNIT,
            ),
        ),
        (
            "device_to_host",
            "device to host",
            lambda: measure(
                lambda: kernels.transfer("device_to_host", plan.transfer_bytes, device),
                timer,
                settings,
                unit=BYTES_UNIT,
            ),
        ),
        (
            "launch_eager",
            "launch latency",
            lambda: measure(lambda: kernels.launch(device), timer, settings, unit=SECONDS_UNIT),
        ),
        (
            "launch_cuda_graph",
            "launch latency, CUDA graph",
            lambda: measure(
                lambda: kernels.graph_launch(device), timer, settings, unit=SECONDS_UNIT
            ),
        ),
    ]
    results: dict[str, Result] = {}
    reporter.begin(len(steps))
    try:
        for key, title, step in steps:
            reporter.started(title)
            results[key] = step()
            reporter.finished(title, describe_result(results[key]))
        after = conditions_reader.read() if conditions_reader is not None else None
    finally:
        if conditions_reader is not None:
            conditions_reader.close()

    conditions: Conditions | Skipped
    if before is not None and after is not None:
        conditions = Conditions(before, after)
    else:
        conditions = Skipped(conditions_skipped or "no NVML readings")
    return Profile(
        model=info.model,
        catalog_key=model.key if model is not None else None,
        device=device.type,
        measured_at=_utc_now(),
        quick=quick,
        duration_seconds=round(clock() - started, 3),
        software=Software(
            gpuscope=__version__,
            torch=str(torch.__version__),
            python=platform.python_version(),
            cuda=str(torch.version.cuda) if torch.version.cuda else None,
            driver=conditions_reader.driver_version if conditions_reader is not None else None,
        ),
        method=Method(
            timer=timer.name,
            warmup_seconds=settings.warmup_seconds,
            trials=settings.trials,
            unstable_spread=settings.unstable_spread,
        ),
        conditions=conditions,
        matmul={dtype: results[f"matmul_{dtype}"] for dtype in DTYPES},
        memory_copy=results["memory_copy"],
        memory_read=results["memory_read"],
        host_to_device=results["host_to_device"],
        device_to_host=results["device_to_host"],
        launch_eager=results["launch_eager"],
        launch_cuda_graph=results["launch_cuda_graph"],
    )


def _open_conditions(
    info: DeviceInfo, nvml: NvmlDriver | None
) -> tuple[NvmlConditions | None, str | None]:
    """NVML readings of this GPU, or the reason there are none."""
    if info.device.type != "cuda":
        return None, "clocks and temperature are read through NVML, on NVIDIA GPUs only"
    if nvml is None:
        return None, "no NVML driver given"
    if info.uuid is None:
        return None, "torch gives no UUID to find this GPU in NVML"
    reader = NvmlConditions(nvml, info.uuid)
    reason = reader.open()
    if reason is not None:
        return None, reason
    return reader, None
