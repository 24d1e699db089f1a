"""`SimulatedNvml`: pynvml's driver functions over simulated GPUs.

It returns pynvml's own structs and raises pynvml's own exceptions, so `NvmlSampler` runs the
production code path on top of it. Physics in brief: each process demands a share of its GPU
(`behaviour.demand`); time-slicing caps the sum at 100%; power follows load with a 1.5 s lag,
temperature follows power with a 40 s lag; a poorly cooled GPU under sustained load heats past
its slowdown threshold and the clocks drop, as a real one's do.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.nvml.simulator.behaviour import demand, lag, noise, running

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.nvml.simulator.fleet import Fault, Fleet, SimGpu, SimProcess

_RESERVED_BYTES: Final = 523 * 2**20
_MPS_SERVER_BYTES: Final = 310 * 2**20
_POWER_LAG_SECONDS: Final = 1.5
_THERMAL_LAG_SECONDS: Final = 40.0
_AMBIENT_CELSIUS: Final = 30.0
_HOT_RISE_CELSIUS: Final = {"normal": 45.0, "poor": 66.0}
_SW_THERMAL_CELSIUS: Final = 87.0
_HW_THERMAL_CELSIUS: Final = 92.0
_NOT_AVAILABLE: Final = 0xFFFFFFFF
_STATE_QUANTUM_SECONDS: Final = 0.01
"""Readings within this much time of each other see the same state (one sampling pass)."""


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(slots=True)
class _Device:
    """The simulated physical state of one GPU, advanced lazily to the time it is asked about."""

    gpu: SimGpu
    processes: tuple[SimProcess, ...]
    seed: int
    t: float | None = None
    power_watts: float = 0.0
    temperature: float = _AMBIENT_CELSIUS
    energy_millijoules: float = 0.0
    utilization: float = 0.0
    memory_utilization: float = 0.0
    shares: dict[int, float] = field(default_factory=dict)
    """pid -> share of the GPU each running process had at time t."""
    power_capped: bool = False
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    ecc_applied: set[int] = field(default_factory=set)

    def advance(self, t: float, ecc_faults: list[Fault]) -> None:
        if self.t is not None and t - self.t < _STATE_QUANTUM_SECONDS:
            return
        model = self.gpu.model
        demands = {p.pid: demand(p, self.seed, t) for p in self.processes if running(p, t)}
        total = sum(demands.values())
        scale = 1.0 / total if total > 1.0 else 1.0
        self.shares = {pid: d * scale for pid, d in demands.items()}
        self.utilization = min(total, 1.0)
        intensity = {p.pid: p.memory_intensity for p in self.processes}
        self.memory_utilization = min(
            sum(share * intensity[pid] for pid, share in self.shares.items()), 1.0
        )
        load = 0.8 * self.utilization + 0.2 * self.memory_utilization
        target = model.idle_watts + (model.tdp_watts - model.idle_watts) * 1.08 * load
        self.power_capped = target > model.tdp_watts
        target = min(target, model.tdp_watts)
        hot = _AMBIENT_CELSIUS + _HOT_RISE_CELSIUS[self.gpu.cooling] * target / model.tdp_watts
        if self.t is None:
            # Start in equilibrium, as a GPU that has been running for a while would be.
            self.power_watts = target
            self.temperature = hot
            uptime_hours = 1 + noise(self.seed, self.gpu.index, 0xE) * 47
            self.energy_millijoules = model.idle_watts * uptime_hours * 3600 * 1000
        else:
            elapsed = t - self.t
            before = self.power_watts
            self.power_watts = lag(before, target, elapsed, _POWER_LAG_SECONDS)
            self.energy_millijoules += (before + self.power_watts) / 2 * elapsed * 1000
            self.temperature = lag(self.temperature, hot, elapsed, _THERMAL_LAG_SECONDS)
        for number, fault in enumerate(ecc_faults):
            if number not in self.ecc_applied and fault.at <= t:
                self.ecc_applied.add(number)
                self.ecc_corrected += fault.corrected
                self.ecc_uncorrected += fault.uncorrected
        self.t = t

    def clock_events(self) -> int:
        reasons = 0
        if self.utilization < 0.01:
            reasons |= pynvml.nvmlClocksEventReasonGpuIdle
        if self.power_capped:
            reasons |= pynvml.nvmlClocksEventReasonSwPowerCap
        if self.temperature >= _SW_THERMAL_CELSIUS:
            reasons |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
        if self.temperature >= _HW_THERMAL_CELSIUS:
            reasons |= pynvml.nvmlClocksEventReasonHwThermalSlowdown
        return reasons

    def clock_mhz(self, kind: str) -> int:
        peak = self.gpu.model.max_clocks_hz.get(kind, 0.0) / 1e6
        if kind == "memory":
            return round(peak if self.shares else peak * 0.25)
        if self.utilization < 0.01:
            return round(min(peak, 345.0))
        factor = 1.0
        if self.power_capped:
            factor = 0.9
        if self.temperature >= _SW_THERMAL_CELSIUS:
            factor = min(factor, 0.8)
        if self.temperature >= _HW_THERMAL_CELSIUS:
            factor = 0.55
        return round(peak * factor)


@dataclass(frozen=True, slots=True)
class _Handle:
    device: _Device
    obtained_at: float
    """Simulated time the handle was handed out: a GPU lost before then stays lost for it."""


class SimulatedNvml:
    """The NVML driver functions gpuscope uses, answered from a simulated `Fleet`."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.fleet = fleet
        started = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - started)
        self._wall = wall
        self._refcount = 0
        by_gpu: dict[int, list[SimProcess]] = defaultdict(list)
        for process in fleet.processes:
            by_gpu[process.gpu].append(process)
        self._devices = [_Device(gpu, tuple(by_gpu[gpu.index]), fleet.seed) for gpu in fleet.gpus]
        self._errors: dict[str, list[Fault]] = defaultdict(list)
        self._lost: dict[int, list[Fault]] = defaultdict(list)
        self._ecc: dict[int, list[Fault]] = defaultdict(list)
        self._init_errors: list[Fault] = []
        for fault in fleet.faults:
            match fault.kind:
                case "error":
                    self._errors[fault.function or ""].append(fault)
                case "gpu_lost":
                    self._lost[fault.gpu or 0].append(fault)
                case "ecc":
                    self._ecc[fault.gpu or 0].append(fault)
                case "init_error":
                    self._init_errors.append(fault)

    # -- the checks every call makes ---------------------------------------------------------

    def _check(self, function: str, gpu: int | None, t: float) -> None:
        if not self._refcount:
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        for fault in self._errors.get(function, ()):
            if (fault.gpu is None or fault.gpu == gpu) and fault.active(t):
                raise _fail(fault.error)

    def _device(self, handle: Any, function: str) -> _Device:
        if not isinstance(handle, _Handle):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        t = self._clock()
        device = handle.device
        index = device.gpu.index
        for fault in self._lost.get(index, ()):
            if fault.at <= t and (fault.until is None or handle.obtained_at < fault.until):
                raise _fail(fault.error)
        self._check(function, index, t)
        device.advance(t, self._ecc.get(index, []))
        return device

    # -- library and system --------------------------------------------------------------------

    def nvmlInit(self) -> None:
        t = self._clock()
        for fault in self._init_errors:
            if fault.active(t):
                raise _fail(fault.error)
        for fault in self._errors.get("nvmlInit", ()):
            if fault.active(t):
                raise _fail(fault.error)
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown", None, self._clock())
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion", None, self._clock())
        return self.fleet.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion", None, self._clock())
        return self.fleet.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None, self._clock())
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        t = self._clock()
        self._check("nvmlDeviceGetHandleByIndex", index, t)
        if not 0 <= index < len(self._devices):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if any(fault.active(t) for fault in self._lost.get(index, ())):
            raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(self._devices[index], t)

    # -- identity ------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetName").gpu.model.nvml_names[0]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").gpu.uuid

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        gpu = self._device(handle, "nvmlDeviceGetPciInfo_v3").gpu
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()
        info.bus = int(gpu.pci_bus_id.split(":")[1], 16)
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetMinorNumber").gpu.index

    # -- readings ------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        device = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(
            gpu=round(device.utilization * 100), memory=round(device.memory_utilization * 100)
        )

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        device = self._device(handle, "nvmlDeviceGetMemoryInfo")
        total = device.gpu.model.nvml_memory_bytes
        used = sum(p.memory_bytes for p in device.processes if p.pid in device.shares) + (
            _MPS_SERVER_BYTES if device.gpu.sharing == "mps" and device.shares else 0
        )
        free = max(total - _RESERVED_BYTES - used, 0)
        if version:
            if version != pynvml.nvmlMemory_v2:
                raise _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=total, reserved=_RESERVED_BYTES, free=free, used=used
            )
        return pynvml.c_nvmlMemory_t(total=total, free=free, used=used + _RESERVED_BYTES)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(self._device(handle, "nvmlDeviceGetPowerUsage").power_watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        device = self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return round(device.gpu.model.tdp_watts * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        device = self._device(handle, "nvmlDeviceGetTotalEnergyConsumption")
        return int(device.energy_millijoules)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        device = self._device(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(device.temperature)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        device = self._device(handle, "nvmlDeviceGetClockInfo")
        return device.clock_mhz(_clock_name(clock_type))

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        device = self._device(handle, "nvmlDeviceGetMaxClockInfo")
        return round(device.gpu.model.max_clocks_hz.get(_clock_name(clock_type), 0.0) / 1e6)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_events()

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_events()

    def nvmlDeviceGetNumFans(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetNumFans").gpu.model.fans

    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: int) -> int:
        device = self._device(handle, "nvmlDeviceGetFanSpeed_v2")
        if not 0 <= fan < device.gpu.model.fans:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(min(max(30 + (device.temperature - 35) * 1.5, 30), 100))

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        device = self._device(handle, "nvmlDeviceGetTotalEccErrors")
        del counter_type  # volatile and aggregate agree: the simulated driver never reloads
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return device.ecc_corrected
        return device.ecc_uncorrected

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._device(handle, "nvmlDeviceGetPcieReplayCounter")
        return 0

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return 0 if self._device(handle, "nvmlDeviceGetPerformanceState").shares else 8

    # -- processes -----------------------------------------------------------------------------

    def _process_list(self, device: _Device, *, mps: bool) -> list[Any]:
        listed = []
        if device.gpu.sharing == "mps" and not mps and device.shares:
            listed.append((4_000_000 + device.gpu.index, _MPS_SERVER_BYTES))
        if (device.gpu.sharing == "mps") == mps:
            listed.extend(
                (p.pid, p.memory_bytes) for p in device.processes if p.pid in device.shares
            )
        return [
            pynvml.nvmlStructToFriendlyObject(
                pynvml.c_nvmlProcessInfo_v3_t(
                    pid=pid,
                    usedGpuMemory=memory,
                    gpuInstanceId=_NOT_AVAILABLE,
                    computeInstanceId=_NOT_AVAILABLE,
                )
            )
            for pid, memory in listed
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return self._process_list(device, mps=False)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses_v2")
        return self._process_list(device, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        device = self._device(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
        return self._process_list(device, mps=True)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]:
        device = self._device(handle, "nvmlDeviceGetProcessUtilization")
        now_us = int(self._wall() * 1_000_000)
        intensity = {p.pid: p.memory_intensity for p in device.processes}
        busy = [(pid, share) for pid, share in device.shares.items() if share > 0.005]
        if now_us <= last_seen_us or not busy:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return [
            pynvml.c_nvmlProcessUtilizationSample_t(
                pid=pid,
                timeStamp=now_us,
                smUtil=round(share * 100),
                memUtil=round(share * intensity[pid] * 100),
                encUtil=0,
                decUtil=0,
            )
            for pid, share in busy
        ]


def _clock_name(clock_type: int) -> str:
    names = {
        pynvml.NVML_CLOCK_SM: "sm",
        pynvml.NVML_CLOCK_MEM: "memory",
        pynvml.NVML_CLOCK_GRAPHICS: "graphics",
    }
    if clock_type not in names:
        raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return names[clock_type]
