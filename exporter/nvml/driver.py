"""The NVML driver boundary: the pynvml functions gpuscope calls, and what their errors mean.

Production passes the `pynvml` module itself as the driver; `--simulate` passes a
`SimulatedNvml`, which offers the same functions, returns pynvml's own structs and raises
pynvml's own exceptions. The sampler cannot tell the two apart, so both run one code path.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import pynvml


class NvmlDriver(Protocol):
    """The subset of pynvml's module-level functions that gpuscope uses."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetNumFans(self, handle: Any) -> int: ...
    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: int) -> int: ...
    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: int, counter_type: int
    ) -> int: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...


NVML_FUNCTIONS: Final = frozenset(name for name in vars(NvmlDriver) if name.startswith("nvml"))
"""Every driver function gpuscope calls (what the simulator must offer, and may fail on demand)."""


LIFECYCLE_ERRORS: Final = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
    }
)
"""After these the device (or the whole library) must be re-initialised before it answers."""

UNAVAILABLE_ERRORS: Final = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        # the driver does not know the struct version this binding sends (an older driver)
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
"""This GPU or driver cannot give the value at all: stop asking until the next initialisation."""


def error_code(error: BaseException) -> int | None:
    """The NVML return code carried by a pynvml exception, None for anything else."""
    value = getattr(error, "value", None) if isinstance(error, pynvml.NVMLError) else None
    return value if isinstance(value, int) else None


def is_lifecycle_error(error: BaseException) -> bool:
    return error_code(error) in LIFECYCLE_ERRORS


def is_unavailable(error: BaseException) -> bool:
    # pynvml raises its own NVMLLibraryMismatchError when an unversioned wrapper finds no symbol:
    # to gpuscope that is the same as a missing function.
    return error_code(error) in UNAVAILABLE_ERRORS or isinstance(
        error, pynvml.NVMLLibraryMismatchError
    )


def error_name(error: BaseException) -> str:
    """A short stable name for logs and log-once keys: `GpuIsLost`, `NotSupported`, ..."""
    name = type(error).__name__
    return name.removeprefix("NVMLError_") if name.startswith("NVMLError_") else name


class NvmlUnavailable(Exception):
    """No NVML library on this machine at all: the daemon cannot run without `--simulate`."""


def system_driver() -> NvmlDriver:
    """The real driver: pynvml's module functions over libnvidia-ml.so.1."""
    driver: NvmlDriver = pynvml
    return driver
