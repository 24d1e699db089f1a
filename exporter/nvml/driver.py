"""The NVML driver boundary: the pynvml functions gpuscope calls, and what their errors mean.

Production passes the `pynvml` module itself as the driver; `--simulate` passes a
`SimulatedNvml`, which offers the same functions, returns pynvml's own structs and raises
pynvml's own exceptions. The sampler cannot tell the two apart, so both run one code path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Final, Protocol

import pynvml

from exporter.readings import all_readings

if TYPE_CHECKING:
    from collections.abc import Sequence


class NvmlDriver(Protocol):
    """The subset of pynvml's module-level functions that gpuscope calls by name. The plain
    readings' functions are called through their declarations (`exporter.readings`), by the
    name each declares."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any: ...
    def nvmlDeviceGetNumFans(self, handle: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]: ...
    def nvmlSystemGetProcessName(self, pid: int) -> str: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    # field values (throttle time, memory temperature, NVLink traffic), PCIe throughput
    def nvmlDeviceGetFieldValues(
        self, handle: Any, field_ids: Sequence[int | tuple[int, int]]
    ) -> Any: ...
    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any: ...
    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int: ...
    # the on-demand trace's sample buffers (`exporter.trace.poll`)
    def nvmlDeviceGetSamples(self, handle: Any, sample_type: int, last_seen_us: int) -> Any: ...
    # MIG
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int: ...
    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> Any: ...
    # GPM (Hopper and newer)
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, sample: Any) -> None: ...
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any: ...
    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any: ...
    # XID and ECC events
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


NVML_FUNCTIONS: Final = frozenset(
    {name for name in vars(NvmlDriver) if name.startswith("nvml")}
    | {reading.call for reading in all_readings()}
)
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


def handle_key(handle: object) -> int:
    """A stable key for a device handle: the address behind a ctypes handle (so the handle in an
    event equals the one registered), the object's identity for any other driver's handles."""
    if isinstance(handle, ctypes._Pointer):
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return address or 0
    return id(handle)


def system_driver() -> NvmlDriver:
    """The real driver: pynvml's module functions over libnvidia-ml.so.1."""
    driver: NvmlDriver = pynvml
    return driver
