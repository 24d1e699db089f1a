"""`SimulatedNvml`: pynvml's driver functions over simulated GPUs.

It returns pynvml's own structs and raises pynvml's own exceptions, so `NvmlSampler` runs the
production code path on top of it. Each GPU's physical state — load, power, heat, energy, MIG
layout, GPM activity, violation time — is a `GpuState` (`state`), advanced to the time each call
asks about; the scheduled XID and ECC faults arrive through NVML event sets (`events`); the plain
readings are answered from their declarations (`exporter.readings`). Here: the checks every call
makes (faults, a lost or hung GPU, NVML not initialised), identity, processes, field values, MIG
devices and GPM samples.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import threading
import time
from array import array
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import pynvml

from exporter.catalog import ARCHITECTURES
from exporter.readings import FIELD_READINGS, SIMULATED_CALLS
from exporter.readings.simulated import not_supported
from exporter.simulator import activity
from exporter.simulator.events import EVENT_TYPES, EventData, EventSet, next_event
from exporter.simulator.fleet import EXCEPTIONS
from exporter.simulator.samples import SampleBuffers
from exporter.simulator.state import (
    MPS_SERVER_BYTES,
    NOT_AVAILABLE,
    STATE_QUANTUM_SECONDS,
    GpuState,
    Handle,
    MigHandle,
)
from exporter.structs import plain_layout

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.simulator.fleet import Fault, Fleet, SimProcess

_PCIE_WINDOW_SECONDS: Final = 0.02
"""nvmlDeviceGetPcieThroughput counts over this window and blocks for it, as the real one does."""
_MIG_SLOTS: Final = 7
_POLL_SECONDS: Final = 0.02
"""How often an event wait looks again when time is simulated by hand (a test's clock)."""
THROTTLE_FIELDS: Final = {
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: pynvml.NVML_PERF_POLICY_POWER,
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: pynvml.NVML_PERF_POLICY_THERMAL,
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: pynvml.NVML_PERF_POLICY_THERMAL,
    pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: pynvml.NVML_PERF_POLICY_RELIABILITY,
    pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
}
"""Field ids with a nanosecond violation counter -> the perf policy it counts."""
NVLINK_LINKS: Final = {
    "v100-sxm2-32gb": 6,
    "a100-sxm4-40gb": 12,
    "a100-sxm4-80gb": 12,
    "h100-sxm": 18,
    "h100-nvl": 12,
    "h200-sxm": 18,
    "b200": 18,
}
"""NVLink links of the catalog's SXM boards and bridged pairs; every other model (PCIe cards, a
user's own catalog entries) has none."""


_FIELD_ANSWERS: Final = {
    field_id: (ARCHITECTURES.index(reading.since), reading.per == "link", reading.simulated)
    for field_id, reading in FIELD_READINGS.items()
    if reading.simulated is not None
}
"""Declared field id -> (the oldest architecture's place, per link, the simulated answer)."""
_FIELD_VALUE_SIZE: Final = ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
_VALUE_TYPE_OFFSET: Final = pynvml.c_nvmlFieldValue_t.valueType.offset
_RETURN_OFFSET: Final = pynvml.c_nvmlFieldValue_t.nvmlReturn.offset - _VALUE_TYPE_OFFSET
_GAP: Final = pynvml.c_nvmlFieldValue_t.value.offset - _VALUE_TYPE_OFFSET - 8
_ANSWERED_INT: Final = struct.Struct(f"=II{_GAP}xQ")
"""An answer's value type, return code and (after any padding) its number, from `valueType` on."""
_ANSWERED_DOUBLE: Final = struct.Struct(f"=II{_GAP}xd")
_REFUSED: Final = struct.Struct("=I")
_ULL: Final = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_DOUBLE: Final = pynvml.NVML_VALUE_TYPE_DOUBLE

_WORD: Final = 8
if _FIELD_VALUE_SIZE % _WORD or pynvml.c_nvmlFieldValue_t.timestamp.offset % _WORD:
    raise RuntimeError("nvmlFieldValue_t: its timestamp does not lie on a whole 8-byte word")
_TIMESTAMP_WORD: Final = pynvml.c_nvmlFieldValue_t.timestamp.offset // _WORD
_FIELD_VALUE_WORDS: Final = _FIELD_VALUE_SIZE // _WORD
"""Where each answer's timestamp lies, counted in 8-byte words: all of them are written in one
strided copy (a `struct` format cannot skip bytes without writing zeros over them)."""


_Declared: TypeAlias = "tuple[int, int, tuple[int, bool, Any]]"
_FieldAnswers: TypeAlias = "tuple[Any, tuple[tuple[int, int], ...], tuple[_Declared, ...]]"
"""A field-value answer's array, and where in it the throttle times (position, policy) and the
declared fields (position, scope, `_FIELD_ANSWERS` entry) go."""
_REFUSALS: Final = {"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
"""What the driver answers arguments no declaration names, where that is not INVALID_ARGUMENT
(the memory call's argument is a struct version)."""


def _fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(frozen=True, slots=True)
class _GpmSample:
    target: tuple[int, str]
    """(GPU index, MIG instance UUID or "" for the whole GPU)."""
    t: float
    totals: tuple[float, ...]


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
        self._real_time = clock is None
        self._wall = wall
        self._refcount = 0
        self._faults = bool(fleet.faults)
        # The sampler, the event thread and the PCIe thread call in concurrently.
        self._lock = threading.RLock()
        by_gpu: dict[int, list[SimProcess]] = defaultdict(list)
        for process in fleet.processes:
            by_gpu[process.gpu].append(process)
        self._errors: dict[str, list[Fault]] = defaultdict(list)
        self._lost: dict[int, list[Fault]] = defaultdict(list)
        self._ecc: dict[int, list[Fault]] = defaultdict(list)
        self._xid: dict[int, list[Fault]] = defaultdict(list)
        self._layouts: dict[int, list[Fault]] = defaultdict(list)
        self._init_errors: list[Fault] = []
        self._exceptions: dict[str, list[Fault]] = defaultdict(list)
        self._hangs: dict[int, list[Fault]] = defaultdict(list)
        self._hung_functions: dict[str, list[Fault]] = defaultdict(list)
        for fault in fleet.faults:
            match fault.kind:
                case "error":
                    self._errors[fault.function or ""].append(fault)
                case "exception":
                    self._exceptions[fault.function or ""].append(fault)
                case "hang" if fault.function is not None:
                    self._hung_functions[fault.function].append(fault)
                case "hang":
                    self._hangs[fault.gpu or 0].append(fault)
                case "gpu_lost":
                    self._lost[fault.gpu or 0].append(fault)
                case "ecc":
                    self._ecc[fault.gpu or 0].append(fault)
                case "xid":
                    self._xid[fault.gpu or 0].append(fault)
                case "mig_layout":
                    self._layouts[fault.gpu or 0].append(fault)
                case "init_error":
                    self._init_errors.append(fault)
        self._devices = [
            GpuState(
                gpu,
                tuple(by_gpu[gpu.index]),
                fleet.seed,
                layout_faults=tuple(sorted(self._layouts[gpu.index], key=lambda f: f.at)),
                nvlink_links=NVLINK_LINKS.get(gpu.model.key, 0),
            )
            for gpu in fleet.gpus
        ]
        self._gpm_samples: dict[int, _GpmSample | None] = {}
        self._gpm_tokens = itertools.count(1)
        self._field_templates: dict[tuple[int | tuple[int, int], ...], _FieldAnswers] = {}
        self._names = {process.pid: process.name for process in fleet.processes}
        """What the driver names each process (every simulated process is visible)."""
        self._samples = SampleBuffers()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """The driver functions declared in `exporter.readings`, each call answered from the
        declaration of its arguments (`SIMULATED_CALLS`): the same checks as every call (faults,
        a lost or hung GPU, a MIG handle where only a whole GPU answers), NotSupported on an
        architecture older than the reading's, and the driver's refusal of arguments no
        declaration names."""
        declared = SIMULATED_CALLS.get(name)
        if not declared:
            raise AttributeError(name)
        answers = {
            args: (reading.mig, ARCHITECTURES.index(reading.since), reading.simulated)
            for args, reading in declared.items()
            if reading.simulated is not None
        }
        # The declarations of one function agree on it (`exporter.readings.declare`).
        per = next(iter(declared.values())).per is not None
        refusal = _REFUSALS.get(name, pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def call(handle: Any, *args: Any, **kwargs: Any) -> Any:
            # pynvml's one keyword (`version`) comes last
            given = (*args, *kwargs.values()) if kwargs else args
            index = given[:1] if per else ()
            answer = answers.get(given[1:] if per else given)
            if answer is None:
                self._target(handle, name)  # faults, a lost or hung GPU: as for any call
                raise _fail(refusal)
            mig, since, simulated = answer
            if mig:
                device, position = self._target(handle, name)
                if device.architecture < since:
                    raise not_supported()
                return simulated(device, position, *index)
            device = self._device(handle, name)
            if device.architecture < since:
                raise not_supported()
            return simulated(device, *index) if per else simulated(device)

        self.__dict__[name] = call  # made once: the next lookup finds it without __getattr__
        return call

    # -- the checks every call makes ---------------------------------------------------------

    def _check(self, function: str, gpu: int | None, t: float) -> None:
        self._hang_call(function, gpu)
        if not self._refcount:
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        for fault in self._errors.get(function, ()):
            if (fault.gpu is None or fault.gpu == gpu) and fault.active(t):
                raise _fail(fault.error)
        for fault in self._exceptions.get(function, ()):
            if (fault.gpu is None or fault.gpu == gpu) and fault.active(t):
                raise EXCEPTIONS[fault.exception](f"simulated {fault.exception} in {function}")

    def _hang(self, index: int) -> None:
        """Block while a `hang` fault holds this GPU, as a call into a GPU off the bus can."""
        faults = self._hangs.get(index) if self._hangs else None
        while faults and any(fault.active(self._clock()) for fault in faults):
            time.sleep(_POLL_SECONDS)

    def _hang_call(self, function: str, gpu: int | None) -> None:
        """Block while a `hang` fault holds calls of this function (on this GPU)."""
        faults = self._hung_functions.get(function) if self._hung_functions else None
        if not faults:
            return
        held = [fault for fault in faults if fault.gpu is None or fault.gpu == gpu]
        while any(fault.active(self._clock()) for fault in held):
            time.sleep(_POLL_SECONDS)

    def _device(self, handle: Any, function: str) -> GpuState:
        if handle.__class__ is not Handle:
            if isinstance(handle, MigHandle):
                raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a whole-GPU reading on MIG
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        device = handle.device
        if self._faults:
            index = device.gpu.index
            self._hang(index)
            t = self._clock()
            for fault in self._lost.get(index, ()):
                if fault.at <= t and (fault.until is None or handle.obtained_at < fault.until):
                    raise _fail(fault.error)
            self._check(function, index, t)
        elif not self._refcount:
            raise _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        else:
            t = self._clock()  # a fleet without faults: none of them to look for, every call
        if device.t is None or t - device.t >= STATE_QUANTUM_SECONDS:
            with self._lock:
                device.advance(t, self._ecc.get(device.gpu.index, []))
        return device

    def _target(self, handle: Any, function: str) -> tuple[GpuState, int | None]:
        """A GPU, or a MIG instance (its position in the parent's layout) for a MIG handle."""
        if not isinstance(handle, MigHandle):
            return self._device(handle, function), None
        device = self._device(handle.parent, function)
        position = device.instance_position(handle.uuid)
        if position is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # the instance was destroyed
        return device, position

    # -- library and system --------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._hang_call("nvmlInit", None)
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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._hang(index)
        t = self._clock()
        self._check("nvmlDeviceGetHandleByIndex", index, t)
        if not 0 <= index < len(self._devices):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if any(fault.active(t) for fault in self._lost.get(index, ())):
            raise _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return Handle(self._devices[index], t)

    # -- identity ------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        device, position = self._target(handle, "nvmlDeviceGetName")
        name = device.gpu.model.nvml_names[0]
        if position is None or device.layout is None:
            return name
        return f"{name} MIG {device.layout[position].profile}"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        device, position = self._target(handle, "nvmlDeviceGetUUID")
        return device.gpu.uuid if position is None else device.instance_uuids[position]

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

    def nvmlDeviceGetNumFans(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetNumFans").gpu.model.fans

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        device = self._device(handle, "nvmlDeviceGetNvLinkState")
        links = device.nvlink_links
        if not links:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a GPU without NVLink
        if not 0 <= link < links:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED)  # every link of a simulated GPU is up

    # -- processes -----------------------------------------------------------------------------

    def _process_list(self, device: GpuState, position: int | None, *, mps: bool) -> list[Any]:
        """Processes of a GPU or, for a MIG handle, of one instance; in MIG mode each carries
        its GPU instance id (compute instance 0)."""
        listed: list[tuple[int, int, int | None]] = []
        if device.gpu.sharing == "mps" and not mps and device.shares and device.layout is None:
            listed.append((4_000_000 + device.gpu.index, MPS_SERVER_BYTES, None))
        if (device.gpu.sharing == "mps") == mps:
            listed.extend(
                (p.pid, p.memory_bytes, p.mig_instance)
                for p in device.processes
                if p.pid in device.shares and (position is None or p.mig_instance == position)
            )
        # What pynvml makes of an nvmlProcessInfo_t (built directly: the struct is slow to fill).
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": memory,
                    "gpuInstanceId": NOT_AVAILABLE if slot is None else slot + 1,
                    "computeInstanceId": NOT_AVAILABLE if slot is None else 0,
                }
            )
            for pid, memory, slot in listed
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        device, position = self._target(handle, "nvmlDeviceGetComputeRunningProcesses")
        return self._process_list(device, position, mps=False)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        device, position = self._target(handle, "nvmlDeviceGetComputeRunningProcesses_v2")
        return self._process_list(device, position, mps=False)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        device, position = self._target(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
        return self._process_list(device, position, mps=True)

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check("nvmlSystemGetProcessName", None, self._clock())
        name = self._names.get(pid)
        if name is None:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return name

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]:
        device = self._device(handle, "nvmlDeviceGetProcessUtilization")
        if device.layout is not None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # not reported in MIG mode
        now_us = int(self._wall() * 1_000_000)
        intensity = {p.pid: p.memory_intensity for p in device.processes}
        busy = [(pid, share) for pid, share in device.shares.items() if share > 0.005]
        if now_us <= last_seen_us or not busy:
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return [
            _struct(
                pynvml.c_nvmlProcessUtilizationSample_t,
                pid=pid,
                timeStamp=now_us,
                smUtil=round(share * 100),
                memUtil=round(share * intensity[pid] * 100),
                encUtil=0,
                decUtil=0,
            )
            for pid, share in busy
        ]

    def nvmlDeviceGetSamples(self, handle: Any, sample_type: int, last_seen_us: int) -> Any:
        device = self._device(handle, "nvmlDeviceGetSamples")
        return self._samples.since(device, sample_type, int(self._wall() * 1e6), last_seen_us)

    # -- field values, PCIe throughput -----------------------------------------------------------

    def nvmlDeviceGetFieldValues(
        self, handle: Any, field_ids: Sequence[int | tuple[int, int]]
    ) -> Any:
        """Throttle time, and the fields `exporter.readings` declares (`FIELD_READINGS`), each
        answered alone: NotSupported in its own slot where the GPU lacks it. A field id comes
        alone or with its scope (a link), as pynvml takes them."""
        device = self._device(handle, "nvmlDeviceGetFieldValues")
        values, throttled, declared = self._field_values(tuple(field_ids))
        # Written with `struct` at each answer's offset: forty fields a GPU every cycle through
        # ctypes attributes would make the stand-in cost more than the sampler it serves.
        now_us = int(self._wall() * 1_000_000)
        words = memoryview(values).cast("B").cast("q")
        words[_TIMESTAMP_WORD::_FIELD_VALUE_WORDS] = array("q", (now_us,)) * len(values)
        for offset, policy in throttled:
            _ANSWERED_INT.pack_into(
                values, offset, _ULL, pynvml.NVML_SUCCESS, int(device.violation_ns[policy])
            )
        architecture = device.architecture
        for offset, scope, (since, per_link, simulated) in declared:
            try:
                if architecture < since:
                    raise not_supported()
                answer = simulated(device, scope) if per_link else simulated(device)
            except pynvml.NVMLError as error:
                _REFUSED.pack_into(values, offset + _RETURN_OFFSET, error.value)
                continue
            if isinstance(answer, float):
                _ANSWERED_DOUBLE.pack_into(values, offset, _DOUBLE, pynvml.NVML_SUCCESS, answer)
            else:
                _ANSWERED_INT.pack_into(values, offset, _ULL, pynvml.NVML_SUCCESS, answer)
        return values

    def _field_values(self, field_ids: tuple[int | tuple[int, int], ...]) -> _FieldAnswers:
        """A fresh array for these field ids, copied from one built once per id list (pynvml's
        structs are slow to fill field by field), and where in it (the offset of each answer's
        value type) the throttle times and the declared fields go; every other slot answers
        NotSupported."""
        found = self._field_templates.get(field_ids)
        if found is None:
            template = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
            throttled: list[tuple[int, int]] = []
            declared: list[_Declared] = []
            for position, (value, asked) in enumerate(zip(template, field_ids, strict=True)):
                field_id, scope = asked if isinstance(asked, tuple) else (asked, 0)
                value.fieldId = field_id
                value.scopeId = scope
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                policy = THROTTLE_FIELDS.get(field_id)
                offset = position * _FIELD_VALUE_SIZE + _VALUE_TYPE_OFFSET
                if policy is not None:
                    throttled.append((offset, policy))
                elif field_id in _FIELD_ANSWERS:
                    declared.append((offset, scope, _FIELD_ANSWERS[field_id]))
            found = template, tuple(throttled), tuple(declared)
            self._field_templates[field_ids] = found
        template, throttled_at, declared_at = found
        return type(template).from_buffer_copy(template), throttled_at, declared_at

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        device = self._device(handle, "nvmlDeviceGetViolationStatus")
        if policy not in THROTTLE_FIELDS.values():
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _struct(
            pynvml.c_nvmlViolationTime_t,
            referenceTime=int(self._wall() * 1_000_000),
            violationTime=int(device.violation_ns[policy]),
        )

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        device = self._device(handle, "nvmlDeviceGetPcieThroughput")
        time.sleep(_PCIE_WINDOW_SECONDS)  # the real call counts bytes for 20 ms, and blocks
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            rate = device.rates[activity.PCIE_TX]
        elif counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            rate = device.rates[activity.PCIE_RX]
        else:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(rate / 1024)  # KB/s

    # -- MIG -----------------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        device = self._device(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return _MIG_SLOTS if device.gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> MigHandle:
        device = self._device(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if device.layout is None or not 0 <= index < _MIG_SLOTS:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(device.layout):
            raise _fail(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slot
        return MigHandle(handle, device.instance_uuids[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        _, position = self._target(handle, "nvmlDeviceGetGpuInstanceId")
        if position is None:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device
        return position + 1

    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> Any:
        device, position = self._target(handle, "nvmlDeviceGetAttributes_v2")
        if position is None or device.layout is None:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = device.layout[position]
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=profile.sms or 0,
            gpuInstanceSliceCount=profile.compute_slices,
            computeInstanceSliceCount=profile.compute_slices,
            memorySizeMB=profile.memory_bytes // 2**20,
        )

    # -- GPM -----------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        device = self._device(handle, "nvmlGpmQueryDeviceSupport")
        return _struct(
            pynvml.c_nvmlGpmSupport_t,
            version=pynvml.NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice=int(device.gpu.model.supports_gpm),
        )

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check("nvmlGpmSampleAlloc", None, self._clock())
        token = next(self._gpm_tokens)
        with self._lock:
            self._gpm_samples[token] = None
        # An opaque pointer that is never dereferenced: pynvml's structs can carry it.
        return ctypes.cast(ctypes.c_void_p(token), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check("nvmlGpmSampleFree", None, self._clock())
        with self._lock:
            if self._gpm_samples.pop(_token(sample), False) is False:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _store_sample(self, sample: Any, target: tuple[int, str], totals: list[float]) -> Any:
        token = _token(sample)
        with self._lock:
            if token not in self._gpm_samples:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._gpm_samples[token] = _GpmSample(target, self._clock(), tuple(totals))
        return sample

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        device = self._device(handle, "nvmlGpmSampleGet")
        if not device.gpu.model.supports_gpm:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._store_sample(sample, (device.gpu.index, ""), device.activity_total)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        device = self._device(handle, "nvmlGpmMigSampleGet")
        if not device.gpu.model.supports_gpm:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        position = gpu_instance_id - 1
        if device.layout is None or not 0 <= position < len(device.layout):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        uuid = device.instance_uuids[position]
        return self._store_sample(sample, (device.gpu.index, uuid), device.instance_activity[uuid])

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        self._check("nvmlGpmMetricsGet", None, self._clock())
        request: Any = plain_layout(pynvml.c_nvmlGpmMetricsGet_t).from_buffer(metrics_get)
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._lock:
            first = self._gpm_samples.get(_token(request.sample1))
            second = self._gpm_samples.get(_token(request.sample2))
        if first is None or second is None or first.target != second.target:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        window = second.t - first.t
        if window <= 0:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        count = request.numMetrics
        metrics: Any = (plain_layout(pynvml.c_nvmlGpmMetric_t) * count).from_buffer(
            metrics_get, pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
        )
        for slot in range(count):
            metric = metrics[slot]
            position = activity.GPM_METRICS.get(metric.metricId)
            # PCIe and NVLink belong to the whole GPU, not to one MIG instance.
            if position is None or (first.target[1] and position >= activity.RATIOS):
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            rate = (second.totals[position] - first.totals[position]) / window
            metric.value = rate * 100 if position < activity.RATIOS else rate / 2**20
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return metrics_get

    # -- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> EventSet:
        self._check("nvmlEventSetCreate", None, self._clock())
        return EventSet()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._device(handle, "nvmlDeviceGetSupportedEventTypes")
        return EVENT_TYPES

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        device = self._device(handle, "nvmlDeviceRegisterEvents")
        if not isinstance(event_set, EventSet) or event_set.freed:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if event_types & ~EVENT_TYPES:
            raise _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[device.gpu.index] = (handle, event_types, self._clock())

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> EventData:
        if not isinstance(event_set, EventSet):
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            t = self._clock()
            self._check("nvmlEventSetWait_v2", None, t)
            if event_set.freed:
                raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            due, event = next_event(event_set, t, xid=self._xid, ecc=self._ecc)
            if event is not None:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _fail(pynvml.NVML_ERROR_TIMEOUT)
            step = _POLL_SECONDS
            if self._real_time:
                # Simulated time runs with the real clock: sleep until the next scheduled event,
                # or through the whole timeout when none is left.
                step = remaining if due is None else max(due - t, 0.001)
            time.sleep(min(remaining, step))

    def nvmlEventSetFree(self, event_set: Any) -> None:
        if not isinstance(event_set, EventSet) or event_set.freed:
            raise _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        event_set.freed = True


def _struct(struct_type: type[ctypes.Structure], **values: Any) -> Any:
    """One of pynvml's structs with these fields set, filled through a plain layout of the same
    fields: pynvml's own attribute hooks make filling field by field several times slower."""
    return struct_type.from_buffer_copy(plain_layout(struct_type)(**values))


def _token(sample: Any) -> int:
    """The number behind a simulated GPM sample pointer."""
    address: int | None = ctypes.cast(sample, ctypes.c_void_p).value
    return address or 0
