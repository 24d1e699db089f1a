"""pynvml-side helpers for snippets that run in a subprocess against the fake library.

Import this only where the fake library is the one pynvml will load: pynvml binds one
``libnvidia-ml.so.1`` per process, for good.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

if TYPE_CHECKING:
    from collections.abc import Callable


def first_mig(handle: Any) -> Any:
    """The MIG device in slot 0 of a GPU (MIG-only calls are made through it)."""
    return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)


# Every per-device export of the fake, called the way an exporter calls it through pynvml.
# Keyed by the C symbol each wrapper ends up calling. Calls that need a MIG device get it
# from slot 0 of the GPU, so they fail the way the GPU does.
DEVICE_CALLS: dict[str, Callable[[Any], object]] = {
    "nvmlDeviceGetName": pynvml.nvmlDeviceGetName,
    "nvmlDeviceGetUUID": pynvml.nvmlDeviceGetUUID,
    "nvmlDeviceGetPciInfo_v3": pynvml.nvmlDeviceGetPciInfo_v3,
    "nvmlDeviceGetUtilizationRates": pynvml.nvmlDeviceGetUtilizationRates,
    "nvmlDeviceGetMemoryInfo": pynvml.nvmlDeviceGetMemoryInfo,
    "nvmlDeviceGetMemoryInfo_v2": lambda h: pynvml.nvmlDeviceGetMemoryInfo(
        h, version=pynvml.nvmlMemory_v2
    ),
    "nvmlDeviceGetPowerUsage": pynvml.nvmlDeviceGetPowerUsage,
    "nvmlDeviceGetEnforcedPowerLimit": pynvml.nvmlDeviceGetEnforcedPowerLimit,
    "nvmlDeviceGetTotalEnergyConsumption": pynvml.nvmlDeviceGetTotalEnergyConsumption,
    "nvmlDeviceGetTemperature": lambda h: pynvml.nvmlDeviceGetTemperature(
        h, pynvml.NVML_TEMPERATURE_GPU
    ),
    "nvmlDeviceGetClockInfo": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    "nvmlDeviceGetMaxClockInfo": lambda h: pynvml.nvmlDeviceGetMaxClockInfo(
        h, pynvml.NVML_CLOCK_SM
    ),
    "nvmlDeviceGetCurrentClocksEventReasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons,
    "nvmlDeviceGetCurrentClocksThrottleReasons": pynvml.nvmlDeviceGetCurrentClocksThrottleReasons,
    "nvmlDeviceGetNumFans": pynvml.nvmlDeviceGetNumFans,
    "nvmlDeviceGetFanSpeed_v2": lambda h: pynvml.nvmlDeviceGetFanSpeed_v2(h, 0),
    "nvmlDeviceGetTotalEccErrors": lambda h: pynvml.nvmlDeviceGetTotalEccErrors(
        h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
    ),
    "nvmlDeviceGetPcieReplayCounter": pynvml.nvmlDeviceGetPcieReplayCounter,
    "nvmlDeviceGetPerformanceState": pynvml.nvmlDeviceGetPerformanceState,
    "nvmlDeviceGetMinorNumber": pynvml.nvmlDeviceGetMinorNumber,
    "nvmlDeviceGetComputeRunningProcesses_v3": pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
    "nvmlDeviceGetComputeRunningProcesses_v2": pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": (
        pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v3
    ),
    "nvmlDeviceGetProcessUtilization": lambda h: pynvml.nvmlDeviceGetProcessUtilization(h, 0),
    "nvmlDeviceGetFieldValues": lambda h: pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_PERF_POLICY_POWER]
    ),
    "nvmlDeviceGetViolationStatus": lambda h: pynvml.nvmlDeviceGetViolationStatus(
        h, pynvml.NVML_PERF_POLICY_POWER
    ),
    "nvmlDeviceGetRemappedRows": pynvml.nvmlDeviceGetRemappedRows,
    "nvmlDeviceGetRetiredPages": lambda h: pynvml.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    ),
    "nvmlDeviceGetRetiredPagesPendingStatus": pynvml.nvmlDeviceGetRetiredPagesPendingStatus,
    "nvmlDeviceGetPcieThroughput": lambda h: pynvml.nvmlDeviceGetPcieThroughput(
        h, pynvml.NVML_PCIE_UTIL_TX_BYTES
    ),
    "nvmlDeviceGetMigMode": pynvml.nvmlDeviceGetMigMode,
    "nvmlDeviceGetMaxMigDeviceCount": pynvml.nvmlDeviceGetMaxMigDeviceCount,
    "nvmlDeviceGetMigDeviceHandleByIndex": first_mig,
    "nvmlDeviceGetGpuInstanceId": lambda h: pynvml.nvmlDeviceGetGpuInstanceId(first_mig(h)),
    "nvmlDeviceGetComputeInstanceId": lambda h: pynvml.nvmlDeviceGetComputeInstanceId(first_mig(h)),
    "nvmlDeviceGetAttributes_v2": lambda h: pynvml.nvmlDeviceGetAttributes_v2(first_mig(h)),
    "nvmlDeviceGetSupportedEventTypes": pynvml.nvmlDeviceGetSupportedEventTypes,
    "nvmlDeviceRegisterEvents": lambda h: pynvml.nvmlDeviceRegisterEvents(
        h, pynvml.nvmlEventTypeXidCriticalError, pynvml.nvmlEventSetCreate()
    ),
    # NVLink, the PCIe link, power limits and modes
    "nvmlDeviceGetNvLinkState": lambda h: pynvml.nvmlDeviceGetNvLinkState(h, 0),
    "nvmlDeviceGetNvLinkErrorCounter": lambda h: pynvml.nvmlDeviceGetNvLinkErrorCounter(
        h, 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY
    ),
    "nvmlDeviceGetCurrPcieLinkGeneration": pynvml.nvmlDeviceGetCurrPcieLinkGeneration,
    "nvmlDeviceGetMaxPcieLinkGeneration": pynvml.nvmlDeviceGetMaxPcieLinkGeneration,
    "nvmlDeviceGetCurrPcieLinkWidth": pynvml.nvmlDeviceGetCurrPcieLinkWidth,
    "nvmlDeviceGetMaxPcieLinkWidth": pynvml.nvmlDeviceGetMaxPcieLinkWidth,
    "nvmlDeviceGetPowerManagementLimitConstraints": (
        pynvml.nvmlDeviceGetPowerManagementLimitConstraints
    ),
    "nvmlDeviceGetPowerManagementDefaultLimit": pynvml.nvmlDeviceGetPowerManagementDefaultLimit,
    "nvmlDeviceGetComputeMode": pynvml.nvmlDeviceGetComputeMode,
    "nvmlDeviceGetPersistenceMode": pynvml.nvmlDeviceGetPersistenceMode,
    # what nvitop calls beside (benchmarks/peers.py)
    "nvmlDeviceGetEncoderUtilization": pynvml.nvmlDeviceGetEncoderUtilization,
    "nvmlDeviceGetDecoderUtilization": pynvml.nvmlDeviceGetDecoderUtilization,
    "nvmlDeviceGetPowerManagementLimit": pynvml.nvmlDeviceGetPowerManagementLimit,
    "nvmlDeviceGetFanSpeed": pynvml.nvmlDeviceGetFanSpeed,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": pynvml.nvmlDeviceGetGraphicsRunningProcesses,
}


def expect_error(exc: type[BaseException], fn: Callable[..., object], *args: object) -> None:
    """Assert that ``fn(*args)`` raises exactly ``exc`` (an NVMLError subclass, usually)."""
    try:
        fn(*args)
    except exc:
        return
    except Exception as e:
        msg = f"{fn!r}{args}: expected {exc.__name__}, got {type(e).__name__}: {e}"
        raise AssertionError(msg) from e
    msg = f"{fn!r}{args}: expected {exc.__name__}, nothing raised"
    raise AssertionError(msg)


def _processes(procs: list[Any]) -> list[list[object]]:
    return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in procs]


def _memory_temperature(h: object) -> int | None:
    (value,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    return int(value.value.uiVal) if value.nvmlReturn == pynvml.NVML_SUCCESS else None


def _nvlinks(h: object) -> list[list[int]]:
    """[link, active, tx KiB, rx KiB, crc flit, crc data, replay, recovery] per link."""
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            break
        tx, rx = pynvml.nvmlDeviceGetFieldValues(
            h,
            [
                (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
                (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link),
            ],
        )
        errors = [
            pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
            for counter in (
                pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
                pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
            )
        ]
        links.append([link, active, tx.value.ullVal, rx.value.ullVal, *errors])
    return links


def read_device(h: object) -> dict[str, object]:
    """Everything the fake serves for one device, as JSON-able values keyed like FakeDevice."""
    pci = pynvml.nvmlDeviceGetPciInfo_v3(h)
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    mem_v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    num_fans = pynvml.nvmlDeviceGetNumFans(h)
    ecc = {
        f"ecc_{kind}_{counter}": pynvml.nvmlDeviceGetTotalEccErrors(h, error_type, counter_type)
        for kind, error_type in (
            ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        )
        for counter, counter_type in (
            ("volatile", pynvml.NVML_VOLATILE_ECC),
            ("aggregate", pynvml.NVML_AGGREGATE_ECC),
        )
    }
    clocks = {
        f"{prefix}clock_{domain}_mhz": getter(h, clock_type)
        for prefix, getter in (
            ("", pynvml.nvmlDeviceGetClockInfo),
            ("max_", pynvml.nvmlDeviceGetMaxClockInfo),
        )
        for domain, clock_type in (
            ("graphics", pynvml.NVML_CLOCK_GRAPHICS),
            ("sm", pynvml.NVML_CLOCK_SM),
            ("mem", pynvml.NVML_CLOCK_MEM),
            ("video", pynvml.NVML_CLOCK_VIDEO),
        )
    }
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    except pynvml.NVMLError_NotFound:
        samples = []
    power_min, power_max = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    return {
        "name": pynvml.nvmlDeviceGetName(h),
        "uuid": pynvml.nvmlDeviceGetUUID(h),
        "pci_bus_id": pci.busId,
        "pci_bus_id_legacy": pci.busIdLegacy,
        "pci_domain_bus_device": [pci.domain, pci.bus, pci.device],
        "pci_device_id": pci.pciDeviceId,
        "pci_subsystem_id": pci.pciSubSystemId,
        "minor_number": pynvml.nvmlDeviceGetMinorNumber(h),
        "util_gpu_percent": util.gpu,
        "util_memory_percent": util.memory,
        "memory_v2": [mem.version, mem.total, mem.reserved, mem.used, mem.free],
        "memory_v1": [mem_v1.total, mem_v1.used, mem_v1.free],
        "power_usage_mw": pynvml.nvmlDeviceGetPowerUsage(h),
        "power_limit_mw": pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
        "power_min_limit_mw": power_min,
        "power_max_limit_mw": power_max,
        "power_default_limit_mw": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "energy_mj": pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
        "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "memory_temperature_c": _memory_temperature(h),
        **clocks,
        "clock_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "clock_throttle_reasons": pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "num_fans": num_fans,
        "fan_speeds": [pynvml.nvmlDeviceGetFanSpeed_v2(h, i) for i in range(num_fans)],
        **ecc,
        "pcie_replay_count": pynvml.nvmlDeviceGetPcieReplayCounter(h),
        "pcie_link": [
            pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
            pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
        ],
        "compute_mode": pynvml.nvmlDeviceGetComputeMode(h),
        "persistence_mode": pynvml.nvmlDeviceGetPersistenceMode(h),
        "nvlinks": _nvlinks(h),
        "performance_state": pynvml.nvmlDeviceGetPerformanceState(h),
        "encoder_util_percent": pynvml.nvmlDeviceGetEncoderUtilization(h)[0],
        "decoder_util_percent": pynvml.nvmlDeviceGetDecoderUtilization(h)[0],
        "power_management_limit_mw": pynvml.nvmlDeviceGetPowerManagementLimit(h),
        "graphics_processes": _processes(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)),
        "processes": _processes(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        "processes_v2": _processes(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)),
        "mps_processes": _processes(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)),
        "samples": [
            [s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil] for s in samples
        ],
    }


def read_system() -> dict[str, object]:
    """System-level readings plus every device's, after nvmlInit()."""
    count = pynvml.nvmlDeviceGetCount()
    return {
        "driver_version": pynvml.nvmlSystemGetDriverVersion(),
        "nvml_version": pynvml.nvmlSystemGetNVMLVersion(),
        "cuda_version": pynvml.nvmlSystemGetCudaDriverVersion(),
        "devices": [read_device(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)],
    }
