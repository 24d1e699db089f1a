"""Reads every GPU through an NVML driver and turns the answers into `GpuSample`s.

The sampler itself (init, re-init, enumeration, assembling the cycle) runs in the sampling
loop's worker thread; each physical GPU is read in a `GpuWorker` thread of its own, with its MIG
instances, so that a driver call that hangs holds up that GPU only (`exporter.nvml.workers`).
Each reading fails alone:
- a function this GPU or driver lacks (`NotSupported`, `FunctionNotFound`) drops that series
  and is not asked again until NVML is re-initialised (logged once);
- any other NVML error drops the value for this cycle (logged once per cause);
- anything else (a bug, an answer gpuscope does not understand) drops the value too, is counted
  in `errors_total` and logged once with its traceback at debug level;
- a lifecycle error (`GPU_IS_LOST`, ...) marks the GPU down (`gpu_up 0`, reason `lost`) while the
  others keep reporting, and schedules `nvmlShutdown` + `nvmlInit` on a later cycle, with
  backoff, so the GPU comes back by itself;
- a GPU whose reads do not answer within the cycle's wait shows its previous answer; once they
  have been outstanding for `hang_seconds` it is down (reason `hung`) until they return.

A GPU in MIG mode is reported as itself (power, heat, clocks, health) plus one sample per MIG
instance (memory, processes, GPM activity); instances are enumerated every cycle, so created and
destroyed ones appear and vanish. The event thread shares this sampler's NVML initialisation: it
is attached after each init and detached before each shutdown. PCIe throughput, which blocks for
a 20 ms window per direction, is read by each GPU's worker right after its answer, so it never
delays a cycle.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pynvml

from exporter.logs import LogOnce
from exporter.model import (
    Activity,
    Clocks,
    CollectorStatus,
    GpuIdentity,
    GpuSample,
    ProcessSample,
    RemappedRows,
    RetiredPages,
)
from exporter.nvml.driver import (
    NvmlDriver,
    NvmlUnavailable,
    error_code,
    error_name,
    is_lifecycle_error,
    is_unavailable,
    plain_layout,
)
from exporter.nvml.events import with_events
from exporter.nvml.gpm import GpmReader, supports_gpm
from exporter.nvml.mig import profile_from_attributes, profile_from_name
from exporter.nvml.workers import GpuWorker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from exporter.nvml.events import EventWatcher
    from exporter.nvml.workers import Ticket

log = logging.getLogger(__name__)

T = TypeVar("T")

REINIT_BACKOFF_SECONDS: Final = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Waits before successive re-initialisation attempts while a GPU or the library is down."""

HEALTH_PERIOD_SECONDS: Final = 5.0
"""How often throttle time, remapped rows and retired pages are read (every cycle when the
collect interval is longer)."""

_MHZ: Final = 1e6

THROTTLE_REASONS: Final = (
    ("power", pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_FI_DEV_PERF_POLICY_POWER),
    (
        "thermal",
        pynvml.NVML_PERF_POLICY_THERMAL,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    ),
    ("sync_boost", pynvml.NVML_PERF_POLICY_SYNC_BOOST, pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST),
    (
        "board_limit",
        pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
        pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    ),
    (
        "low_utilization",
        pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
        pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    ),
    (
        "reliability",
        pynvml.NVML_PERF_POLICY_RELIABILITY,
        pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    ),
    # nvml.h names no replacement for the total-app-clocks policy, but drivers still fill its
    # field; where one does not, the violation status stands in as for any other reason.
    (
        "app_clocks",
        pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS,
    ),
    (
        "base_clocks",
        pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
    ),
)
"""(`reason` label, perf policy for the deprecated nvmlDeviceGetViolationStatus, the nanosecond
field value nvml.h names in its place). The field values are read in one call; the violation
status stands in per reason where a field is missing."""
_THROTTLE_FIELDS: Final = [field_id for _, _, field_id in THROTTLE_REASONS]
_KIB: Final = 1024

HUNG: Final = "hung"
LOST: Final = "lost"
UNOPENED: Final = "unopened"
ERROR: Final = "error"
DOWN_REASONS: Final = (LOST, HUNG, UNOPENED, ERROR)
"""Why a GPU is reported down (`gpu_down_reason{reason}`): a lifecycle error from the driver;
driver calls that have not returned; a GPU the driver lists but cannot open; an unexpected error
reading it (a bug, or an answer gpuscope does not understand)."""


class _GpuLost(Exception):
    """A lifecycle error from one GPU's handle: stop reading it this cycle."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class _Integrals:
    """One physical GPU's integrated counters; they outlive re-initialisations. Written only by
    that GPU's worker."""

    busy_seconds: float = 0.0
    last_read: float | None = None
    """When utilization was last read (None: integrate from the next reading on)."""
    activity_seconds: dict[str, list[float]] = field(default_factory=dict)
    """GPU or MIG instance uuid -> integrated [sm, tensor, dram] activity."""


@dataclass(slots=True)
class _Device:
    """One GPU (or MIG instance) as of the current NVML initialisation. A physical GPU's state is
    read and written by its worker's jobs only, and by the sampler while the worker is idle."""

    handle: Any
    identity: GpuIdentity
    max_clocks: Clocks
    fan_count: int
    integrals: _Integrals = field(default_factory=_Integrals)
    unavailable: set[str] = field(default_factory=set)
    lost: bool = False
    process_timestamp_us: int = 0
    """Newest per-process utilization sample seen; asked for only newer ones next time."""
    gpm: GpmReader | None = None
    """GPM samples of this GPU or MIG instance, where the GPU has GPM."""
    mig_slots: int = 0
    """How many MIG devices this GPU can hold (0 unless MIG mode is on)."""
    mig: dict[str, _Device] = field(default_factory=dict)
    """MIG instances seen in the last cycle, by UUID."""
    health: _Health | None = None
    """The last throttle-time and memory-repair readings."""
    health_due: float = 0.0
    """When they are due to be read again."""
    pcie: tuple[float, float, float] | None = None
    """(transmit, receive bytes/s, when measured) from the worker's last PCIe window (no GPM)."""
    worker: GpuWorker | None = None
    """The thread this physical GPU is read in (None for a MIG instance)."""
    answer: tuple[tuple[GpuSample, ...], float] | None = None
    """The last samples its worker delivered (the GPU and its MIG instances), and when."""

    def gpm_readers(self) -> Iterator[GpmReader]:
        for device in (self, *self.mig.values()):
            if device.gpm is not None:
                yield device.gpm


@dataclass(frozen=True, slots=True)
class _Health:
    throttle_seconds: tuple[tuple[str, float], ...]
    remapped_rows: RemappedRows | None
    retired_pages: RetiredPages | None


class NvmlSampler:
    """Samples all GPUs on one NVML driver; stateful only where counters must integrate."""

    def __init__(
        self,
        driver: NvmlDriver,
        *,
        collect_processes: bool = True,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.monotonic,
        events: EventWatcher | None = None,
        interval: float = 1.0,
    ) -> None:
        self._nvml = driver
        self._collect_processes = collect_processes
        self._clock = clock
        self._timer = timer
        """Real time, for waiting on GPU workers (`clock` may be a test's simulated time)."""
        self._events = events
        self.wait_seconds = interval / 2
        """How long a cycle waits for the GPUs' answers."""
        self.hang_seconds = max(2 * interval, 2.0)
        """Reads outstanding this long make a GPU `hung`."""
        self._pcie_max_age = max(3 * interval, 5.0)
        """A PCIe figure older than this is dropped rather than shown."""
        self._once = LogOnce(log)
        self._errors = _Counter()
        self._initialized = False
        self._devices: list[_Device] = []
        self._known: dict[str, GpuIdentity] = {}
        self._integrals: dict[str, _Integrals] = {}
        self._lost: set[str] = set()
        self._hung: set[str] = set()
        self._reinit_due = 0.0
        self._reinit_attempt = 0
        """Re-initialisations tried since everything last answered; 0 means none is pending."""

    @property
    def errors_total(self) -> int:
        """Unexpected errors met while sampling since start (`gpuscope_sample_errors_total`)."""
        return self._errors.value

    def count_error(self) -> None:
        self._errors.add()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """First initialisation. Only a missing library is fatal; other failures are retried."""
        try:
            self._initialize()
        except pynvml.NVMLError_LibraryNotFound as error:
            raise NvmlUnavailable(
                "NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed and the "
                "container run with the NVIDIA runtime? (--simulate N runs without a GPU)"
            ) from error
        except pynvml.NVMLError as error:
            self._once(
                logging.ERROR,
                ("init", error_code(error)),
                "NVML initialisation failed; retrying",
                fields={"error": error_name(error)},
            )
            self._schedule_reinit(self._clock())
        if self._events is not None:
            self._events.start()

    def close(self) -> None:
        """Stop the event thread and the GPU workers, free GPM samples and shut NVML down
        (bounded: well under 2 s). With a driver call still hung, NVML is left as it is."""
        if self._events is not None:
            self._events.close()
        if self._any_busy():
            log.warning("a driver call is still hung; not shutting NVML down")
            self._stop_workers(self._devices)
            return
        if self._initialized:
            self._initialized = False
            self._release()
            try:
                self._nvml.nvmlShutdown()
            except pynvml.NVMLError as error:
                log.debug("nvmlShutdown failed", extra={"error": error_name(error)})

    def _any_busy(self) -> bool:
        return any(
            device.worker is not None and device.worker.busy_since is not None
            for device in self._devices
        )

    def _release(self) -> None:
        """Everything tied to the current initialisation, before nvmlShutdown. Only while no
        worker is busy."""
        if self._events is not None:
            self._events.detach()
        self._stop_workers(self._devices)
        for device in self._devices:
            for reader in device.gpm_readers():
                reader.free()

    @staticmethod
    def _stop_workers(devices: Iterable[_Device]) -> None:
        for device in devices:
            if device.worker is not None:
                device.worker.close()
                device.worker = None

    def _attach(self) -> None:
        """Hand the freshly opened GPUs to the event thread, and each to a worker of its own."""
        if self._events is not None:
            self._events.attach([(d.identity.uuid, d.handle) for d in self._devices])
        for device in self._devices:
            device.worker = GpuWorker(
                f"gpuscope-gpu{device.identity.index}",
                on_error=partial(self._unexpected, device, "pcie"),
                timer=self._timer,
            )

    def _initialize(self) -> None:
        if self._initialized:
            self._initialized = False
            self._release()
            try:
                self._nvml.nvmlShutdown()
            except pynvml.NVMLError as error:
                log.debug("nvmlShutdown before re-init failed", extra={"error": error_name(error)})
        self._devices = []
        self._nvml.nvmlInit()
        self._initialized = True
        self._once.forget_matching(("field",))
        driver_version = self._optional(lambda: _text(self._nvml.nvmlSystemGetDriverVersion()))
        cuda = self._optional(self._nvml.nvmlSystemGetCudaDriverVersion)
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        for index in range(self._nvml.nvmlDeviceGetCount()):
            device = self._open_device(index, driver_version or "", cuda_version)
            if device is not None:
                self._devices.append(device)
        self._attach()

    def _open_device(self, index: int, driver_version: str, cuda_version: str) -> _Device | None:
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
            name = _text(self._nvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as error:
            self._once(
                logging.ERROR,
                ("open", index, error_code(error)),
                "cannot open GPU; reporting it down",
                fields={"gpu": index, "error": error_name(error)},
            )
            placeholder = GpuIdentity(index=index, uuid="", model="")
            if not any(known.index == index for known in self._known.values()):
                self._known.setdefault(f"index:{index}", placeholder)
            return None
        self._known.pop(f"index:{index}", None)
        pci = self._optional(lambda: self._nvml.nvmlDeviceGetPciInfo_v3(handle))
        identity = GpuIdentity(
            index=index,
            uuid=uuid,
            model=name,
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            driver_version=driver_version,
            cuda_version=cuda_version,
            minor_number=self._optional(lambda: self._nvml.nvmlDeviceGetMinorNumber(handle)),
        )
        self._known[uuid] = identity
        max_clocks = Clocks(
            sm=self._optional_mhz(handle, pynvml.NVML_CLOCK_SM),
            memory=self._optional_mhz(handle, pynvml.NVML_CLOCK_MEM),
            graphics=self._optional_mhz(handle, pynvml.NVML_CLOCK_GRAPHICS),
        )
        fans = self._optional(lambda: self._nvml.nvmlDeviceGetNumFans(handle))
        integrals = self._integrals.setdefault(uuid, _Integrals())
        device = _Device(handle, identity, max_clocks, fan_count=fans or 0, integrals=integrals)
        if self._optional(lambda: supports_gpm(self._nvml, handle)):
            device.gpm = GpmReader(
                self._nvml, lambda sample: self._nvml.nvmlGpmSampleGet(handle, sample)
            )
        device.mig_slots = (
            self._optional(lambda: self._nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
        )
        return device

    def _optional(self, read: Callable[[], T]) -> T | None:
        """A value read once per initialisation; any NVML error just means "not known"."""
        try:
            return read()
        except pynvml.NVMLError:
            return None

    def _optional_mhz(self, handle: Any, clock_type: int) -> float | None:
        mhz = self._optional(lambda: self._nvml.nvmlDeviceGetMaxClockInfo(handle, clock_type))
        return mhz * _MHZ if mhz else None

    def _schedule_reinit(self, now: float) -> None:
        if self._reinit_attempt and self._reinit_due > now:
            return  # already scheduled
        wait = REINIT_BACKOFF_SECONDS[min(self._reinit_attempt, len(REINIT_BACKOFF_SECONDS) - 1)]
        self._reinit_attempt += 1
        self._reinit_due = now + wait

    # -- one cycle ---------------------------------------------------------------------------

    def sample(self) -> tuple[tuple[GpuSample, ...], CollectorStatus]:
        """Every GPU's samples this cycle; waits at most `wait_seconds` for the GPUs' answers."""
        started = self._clock()
        if self._reinit_attempt and started >= self._reinit_due:
            if self._any_busy():
                # nvmlShutdown under a call still in the driver is undefined behaviour.
                self._once(
                    logging.WARNING,
                    ("reinit", "busy"),
                    "NVML re-initialisation waits for a hung driver call to return",
                )
            else:
                self._once.forget(("reinit", "busy"))
                self._reinitialize()

        tickets = {
            id(device): device.worker.submit(
                partial(self._read_gpu, device),
                after=partial(self._read_pcie, device) if device.gpm is None else None,
            )
            for device in self._devices
            if device.worker is not None and not device.lost
        }
        deadline = self._timer() + self.wait_seconds
        samples: list[GpuSample] = []
        for device in self._devices:
            ticket = tickets.get(id(device))
            if ticket is not None and ticket.wait(deadline, self._timer):
                samples.extend(self._answered(device, ticket))
            else:
                samples.extend(self._unanswered(device))
        opened = {device.identity.uuid for device in self._devices}
        for key, identity in self._known.items():
            if key not in opened:
                samples.append(_down(identity, UNOPENED if key.startswith("index:") else LOST))
                if key in self._integrals:
                    self._integrals[key].last_read = None

        finished = self._clock()
        needs_reinit = not self._initialized or any(
            sample.down_reason in (LOST, UNOPENED) for sample in samples
        )
        if needs_reinit:
            self._schedule_reinit(finished)
        elif all(sample.up for sample in samples):
            self._reinit_attempt = 0
        samples.sort(key=_position)
        return self.overlay_events(tuple(samples)), CollectorStatus(
            "nvml", self._initialized, finished - started
        )

    def _read_gpu(self, device: _Device) -> tuple[GpuSample, ...]:
        """One physical GPU and its MIG instances. A job in the GPU's worker."""
        gpu = self._read_device(device)
        if gpu.mig_mode_enabled:
            return (gpu, *self._read_mig(device))
        return (gpu,)

    def _answered(self, device: _Device, ticket: Ticket[tuple[GpuSample, ...]]) -> list[GpuSample]:
        identity = device.identity
        error = ticket.error
        if error is None and ticket.value is not None:
            device.answer = (ticket.value, self._timer())
            self._report_back(identity)
            return list(ticket.value)
        device.answer = None
        # Down: integrate again from its next reading, not across the time it was down (the
        # worker is idle, so the sampler may write its state).
        device.integrals.last_read = None
        if isinstance(error, _GpuLost):
            device.lost = True
            self._report_lost(identity, error.cause)
            return [_down(identity, LOST)]
        assert error is not None
        self._unexpected(device, "gpu", error)
        return [_down(identity, ERROR)]

    def _unanswered(self, device: _Device) -> list[GpuSample]:
        """A GPU that gave no answer this cycle: lost before, or its reads are outstanding."""
        identity = device.identity
        if device.lost:
            return [_down(identity, LOST)]
        worker = device.worker
        since = worker.busy_since if worker is not None else None
        now = self._timer()
        outstanding = now - since if since is not None else 0.0
        if outstanding >= self.hang_seconds or device.answer is None:
            if identity.uuid not in self._hung and outstanding >= self.hang_seconds:
                self._hung.add(identity.uuid)
                log.warning(
                    "GPU's driver calls have not returned; reporting it down until they do",
                    extra={
                        "gpu": identity.index,
                        "uuid": identity.uuid,
                        "seconds": round(outstanding, 1),
                    },
                )
            return [_down(identity, HUNG)]
        # Late, not hung: its previous answer (at most hang_seconds old) stands in.
        return list(device.answer[0])

    def overlay_events(self, gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
        """The samples with the event thread's latest XID counts and ECC totals."""
        if self._events is None or not self._events.store:
            return gpus
        store = self._events.store
        return tuple(with_events(gpu, store.get(gpu.identity.uuid)) for gpu in gpus)

    def _reinitialize(self) -> None:
        try:
            self._initialize()
        except pynvml.NVMLError as error:
            self._initialized = False
            self._devices = []
            self._once(
                logging.ERROR,
                ("init", error_code(error)),
                "NVML initialisation failed; retrying with backoff",
                fields={"error": error_name(error)},
            )
            return
        self._once.forget_matching(("init",))
        log.info("NVML initialised", extra={"gpus": len(self._devices)})

    def _report_lost(self, identity: GpuIdentity, cause: BaseException) -> None:
        self._lost.add(identity.uuid)
        log.warning(
            "GPU stopped answering; reporting it down until NVML re-initialises",
            extra={"gpu": identity.index, "uuid": identity.uuid, "error": error_name(cause)},
        )

    def _report_back(self, identity: GpuIdentity) -> None:
        if identity.uuid in self._lost:
            self._lost.discard(identity.uuid)
            log.info("GPU answers again", extra={"gpu": identity.index, "uuid": identity.uuid})
        if identity.uuid in self._hung:
            self._hung.discard(identity.uuid)
            log.info(
                "GPU's driver calls return again",
                extra={"gpu": identity.index, "uuid": identity.uuid},
            )

    def _unexpected(self, device: _Device, stage: str, error: BaseException) -> None:
        """An error nothing anticipated, at any grain: counted and logged once."""
        self._errors.add()
        identity = device.identity
        self._once.unexpected(
            ("unexpected", identity.uuid, stage),
            "unexpected error sampling this GPU; its values are omitted while it lasts",
            error,
            fields={"gpu": identity.index, "uuid": identity.uuid, "stage": stage},
        )

    def _read_device(self, device: _Device) -> GpuSample:
        nvml = self._nvml
        handle = device.handle
        now = self._clock()

        rates = self._read(device, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        utilization = rates.gpu / 100.0 if rates is not None else None
        memory = self._read_memory(device)
        power = self._read(device, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        limit = self._read(device, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        energy = self._read(device, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        temperature = self._read(
            device,
            "temperature",
            nvml.nvmlDeviceGetTemperature,
            handle,
            pynvml.NVML_TEMPERATURE_GPU,
        )
        reasons = self._read(
            device, "clock_events", nvml.nvmlDeviceGetCurrentClocksEventReasons, handle
        )
        if reasons is None and "clock_events" in device.unavailable:
            reasons = self._read(
                device, "throttle_reasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle
            )
        fans = tuple(
            _percent(self._read(device, f"fan{fan}", nvml.nvmlDeviceGetFanSpeed_v2, handle, fan))
            for fan in range(device.fan_count)
        )
        ecc_corrected = self._read(
            device,
            "ecc_corrected",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        ecc_uncorrected = self._read(
            device,
            "ecc_uncorrected",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )

        mig_mode = self._read(device, "mig_mode", nvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mig_mode[0]) if mig_mode is not None else None

        integrals = device.integrals
        busy: float | None = None
        if utilization is not None:
            previous = integrals.last_read
            # Across a gap (the GPU hung or could not be read) nothing is known: integrate from now.
            gap = now - previous if previous is not None else None
            elapsed = gap if gap is not None and gap <= self.hang_seconds else 0.0
            integrals.busy_seconds += utilization * elapsed
            busy = integrals.busy_seconds
            integrals.last_read = now
        health = self._read_health(device, now)
        activity, activity_seconds = self._read_activity(device, now)

        return GpuSample(
            identity=device.identity,
            up=True,
            busy_seconds_total=busy,
            utilization=utilization,
            memory_utilization=rates.memory / 100.0 if rates is not None else None,
            memory_used_bytes=memory[0],
            memory_total_bytes=memory[1],
            memory_reserved_bytes=memory[2],
            power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            energy_joules_total=energy / 1000.0 if energy is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            clocks=Clocks(
                sm=self._clock_hz(device, "sm_clock", pynvml.NVML_CLOCK_SM),
                memory=self._clock_hz(device, "memory_clock", pynvml.NVML_CLOCK_MEM),
                graphics=self._clock_hz(device, "graphics_clock", pynvml.NVML_CLOCK_GRAPHICS),
            ),
            max_clocks=device.max_clocks,
            clock_event_reasons=reasons,
            fan_speeds=fans,
            ecc_corrected_total=ecc_corrected,
            ecc_uncorrected_total=ecc_uncorrected,
            pcie_replays_total=self._read(
                device, "pcie_replays", nvml.nvmlDeviceGetPcieReplayCounter, handle
            ),
            performance_state=self._read(
                device, "pstate", nvml.nvmlDeviceGetPerformanceState, handle
            ),
            # In MIG mode each process is listed on its instance, not twice.
            processes=self._read_processes(device)
            if self._collect_processes and not mig_enabled
            else None,
            activity=activity,
            sm_active_seconds_total=activity_seconds[0],
            tensor_active_seconds_total=activity_seconds[1],
            dram_active_seconds_total=activity_seconds[2],
            throttle_seconds=health.throttle_seconds,
            remapped_rows=health.remapped_rows,
            retired_pages=health.retired_pages,
            mig_mode_enabled=mig_enabled,
        )

    def _read(self, device: _Device, what: str, function: Callable[..., T], *args: Any) -> T | None:
        """One NVML reading; None when this GPU cannot give it now. Lifecycle errors escape."""
        if what in device.unavailable:
            return None
        try:
            return function(*args)
        except Exception as error:  # noqa: BLE001 - each reading fails alone, whatever broke it
            self._reading_failed(device, what, error)
            return None

    def _reading_failed(self, device: _Device, what: str, error: Exception) -> None:
        """Log (once) why a reading failed; raises `_GpuLost` for a lifecycle error."""
        identity = device.identity
        if is_lifecycle_error(error):
            raise _GpuLost(error) from error
        fields: dict[str, object] = {
            "gpu": identity.index,
            "uuid": identity.uuid,
            "reading": what,
            "error": error_name(error),
        }
        if is_unavailable(error):
            device.unavailable.add(what)
            self._once(
                logging.INFO,
                ("field", identity.uuid, what),
                "not available on this GPU or driver; its series is omitted",
                fields=fields,
            )
        elif isinstance(error, pynvml.NVMLError):
            self._once(
                logging.WARNING,
                ("field", identity.uuid, what, error_code(error)),
                "NVML reading failed; its series is omitted while it fails",
                fields=fields,
            )
        else:
            self._errors.add()
            self._once.unexpected(
                ("field", identity.uuid, what),
                "unexpected error reading NVML; its series is omitted while it fails",
                error,
                fields={"gpu": identity.index, "uuid": identity.uuid, "reading": what},
            )

    def _clock_hz(self, device: _Device, what: str, clock_type: int) -> float | None:
        mhz = self._read(device, what, self._nvml.nvmlDeviceGetClockInfo, device.handle, clock_type)
        return mhz * _MHZ if mhz is not None else None

    def _read_memory(self, device: _Device) -> tuple[int | None, int | None, int | None]:
        """(used, total, reserved). The v2 struct separates reserved memory; v1 counts it as used."""
        read = self._nvml.nvmlDeviceGetMemoryInfo
        info = self._read(device, "memory_v2", read, device.handle, pynvml.nvmlMemory_v2)
        if info is not None:
            return int(info.used), int(info.total), int(info.reserved)
        if "memory_v2" in device.unavailable:
            info = self._read(device, "memory", read, device.handle)
            if info is not None:
                return int(info.used), int(info.total), None
        return None, None, None

    def _read_processes(self, device: _Device) -> tuple[ProcessSample, ...] | None:
        nvml = self._nvml
        handle = device.handle
        compute = self._read(device, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if compute is None and "processes" in device.unavailable:
            compute = self._read(
                device, "processes_v2", nvml.nvmlDeviceGetComputeRunningProcesses_v2, handle
            )
        if compute is None:
            return None
        mps = self._read(
            device, "mps_processes", nvml.nvmlDeviceGetMPSComputeRunningProcesses, handle
        )
        # An MPS client can be listed twice (compute and MPS lists): keep one entry per pid.
        memory: dict[int, int | None] = {}
        for process in itertools.chain(compute, mps or ()):
            used = process.usedGpuMemory
            if memory.get(process.pid) is None or (used is not None and used > memory[process.pid]):
                memory[process.pid] = used
        busy = self._read_process_utilization(device)
        processes = []
        for pid, used in sorted(memory.items()):
            if busy is None:
                processes.append(ProcessSample(pid, used, None, None))
            else:
                sm, mem = busy.get(pid, (0.0, 0.0))
                processes.append(ProcessSample(pid, used, sm, mem))
        return tuple(processes)

    def _read_process_utilization(self, device: _Device) -> dict[int, tuple[float, float]] | None:
        """Mean SM and memory utilization per pid since the last call; {} = nobody was busy."""
        what = "process_utilization"
        if what in device.unavailable:
            return None
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(
                device.handle, device.process_timestamp_us
            )
        except pynvml.NVMLError_NotFound:
            return {}  # no process ran a kernel since the last call: idle, not an error
        except Exception as error:  # noqa: BLE001 - each reading fails alone
            self._reading_failed(device, what, error)
            return None
        sums: dict[int, list[float]] = {}
        for sample in samples:
            device.process_timestamp_us = max(device.process_timestamp_us, int(sample.timeStamp))
            total = sums.setdefault(int(sample.pid), [0.0, 0.0, 0.0])
            total[0] += sample.smUtil
            total[1] += sample.memUtil
            total[2] += 1
        return {
            pid: (min(sm / count / 100.0, 1.0), min(mem / count / 100.0, 1.0))
            for pid, (sm, mem, count) in sums.items()
        }

    # -- deeper signals ----------------------------------------------------------------------

    def _read_health(self, device: _Device, now: float) -> _Health:
        """Throttle time and memory repairs, read every HEALTH_PERIOD_SECONDS and reported from
        the last reading in between: cumulative counters and states that change rarely, so a
        slower clock costs them nothing and saves NVML calls on every GPU each cycle."""
        if device.health is None or now >= device.health_due:
            device.health = _Health(
                throttle_seconds=self._read_throttle(device),
                remapped_rows=self._read_remapped_rows(device),
                retired_pages=self._read_retired_pages(device),
            )
            device.health_due = now + HEALTH_PERIOD_SECONDS
        return device.health

    def _read_activity(
        self, device: _Device, now: float
    ) -> tuple[Activity, tuple[float | None, float | None, float | None]]:
        """GPM activity and its integrated [sm, tensor, dram] counters; before Hopper, the PCIe
        throughput the worker measured after the previous reading."""
        if device.gpm is None:
            pcie = device.pcie
            if pcie is None or self._clock() - pcie[2] > self._pcie_max_age:
                return Activity(), (None, None, None)
            transmit, receive, _ = pcie
            return Activity(
                pcie_transmit_bytes_per_second=transmit, pcie_receive_bytes_per_second=receive
            ), (None, None, None)
        reading = self._read(device, "gpm", device.gpm.read, now)
        if reading is None:
            return Activity(), (None, None, None)
        activity = reading.activity
        totals = device.integrals.activity_seconds.setdefault(device.identity.uuid, [0.0, 0.0, 0.0])
        counters: list[float | None] = [None, None, None]
        for position, ratio in enumerate(
            (activity.sm_active, activity.tensor_active, activity.dram_active)
        ):
            if ratio is not None:
                totals[position] += ratio * reading.window_seconds
                counters[position] = totals[position]
        return activity, (counters[0], counters[1], counters[2])

    def _read_pcie(self, device: _Device) -> None:
        """PCIe throughput over the driver's 20 ms window per direction: the worker's follow-up
        to a reading of a GPU without GPM, so the window never delays a cycle."""
        handle = device.handle
        read = self._nvml.nvmlDeviceGetPcieThroughput
        try:
            transmit = self._read(
                device, "pcie_throughput", read, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
            )
            receive = self._read(
                device, "pcie_throughput", read, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES
            )
        except _GpuLost:
            return  # the next reading reports it
        if transmit is not None and receive is not None:
            device.pcie = (transmit * _KIB, receive * _KIB, self._clock())

    def _read_throttle(self, device: _Device) -> tuple[tuple[str, float], ...]:
        """Cumulative seconds per throttle reason: the nanosecond field values in one call, the
        deprecated per-policy violation status where a field is missing."""
        nvml = self._nvml
        handle = device.handle
        fields: dict[int, float] = {}
        values = self._read(
            device, "throttle_fields", nvml.nvmlDeviceGetFieldValues, handle, _THROTTLE_FIELDS
        )
        if values is not None:  # read through a plain view: pynvml's struct attributes are slow
            values = (plain_layout(pynvml.c_nvmlFieldValue_t) * len(values)).from_buffer(values)
        for value in values if values is not None else ():
            if value.nvmlReturn == pynvml.NVML_SUCCESS:
                number = _field_number(value)
                if number is not None:
                    fields[int(value.fieldId)] = number
        found: list[tuple[str, float]] = []
        for reason, policy, field_id in THROTTLE_REASONS:
            if field_id in fields:
                found.append((reason, fields[field_id] / 1e9))
                continue
            status = self._read(
                device,
                f"throttle_{reason}",
                nvml.nvmlDeviceGetViolationStatus,
                handle,
                policy,
            )
            if status is not None:
                found.append((reason, status.violationTime / 1e9))
        return tuple(found)

    def _read_remapped_rows(self, device: _Device) -> RemappedRows | None:
        rows = self._read(
            device, "remapped_rows", self._nvml.nvmlDeviceGetRemappedRows, device.handle
        )
        if rows is None:
            return None
        correctable, uncorrectable, pending, failed = rows
        return RemappedRows(int(correctable), int(uncorrectable), bool(pending), bool(failed))

    def _read_retired_pages(self, device: _Device) -> RetiredPages | None:
        read = self._nvml.nvmlDeviceGetRetiredPages
        single = self._read(
            device,
            "retired_pages",
            read,
            device.handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        double = self._read(
            device,
            "retired_pages",
            read,
            device.handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        if single is None or double is None:
            return None
        pending = self._read(
            device,
            "retired_pages_pending",
            self._nvml.nvmlDeviceGetRetiredPagesPendingStatus,
            device.handle,
        )
        return RetiredPages(
            len(single), len(double), bool(pending) if pending is not None else None
        )

    # -- MIG ---------------------------------------------------------------------------------

    def _read_mig(self, parent: _Device) -> list[GpuSample]:
        """Every MIG instance of a GPU in MIG mode, enumerated afresh so that instances created
        or destroyed since the last cycle appear or vanish."""
        if not parent.mig_slots:  # MIG mode came on after the GPU was opened
            slots = self._read(
                parent, "mig_slots", self._nvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle
            )
            parent.mig_slots = slots or 0
        seen: dict[str, _Device] = {}
        for slot in range(parent.mig_slots):
            found = self._mig_handle(parent, slot)
            if found is None:
                continue
            handle, uuid = found
            instance = parent.mig.get(uuid) or self._open_mig_instance(parent, handle, uuid)
            if instance is not None:
                instance.handle = handle
                seen[uuid] = instance
        for uuid, gone in parent.mig.items():
            if uuid not in seen:
                parent.integrals.activity_seconds.pop(uuid, None)  # destroyed: never returns
                if gone.gpm is not None:
                    gone.gpm.free()
        parent.mig = seen
        return [self._read_mig_instance(instance) for instance in seen.values()]

    def _mig_handle(self, parent: _Device, slot: int) -> tuple[Any, str] | None:
        """The handle and UUID of the MIG device in `slot`; None for an empty slot."""
        if "mig_devices" in parent.unavailable:
            return None
        try:
            handle = self._nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
            return handle, _text(self._nvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError_NotFound:
            return None  # no MIG device in this slot
        except Exception as error:  # noqa: BLE001 - one slot fails alone; a lost GPU escapes
            self._reading_failed(parent, "mig_devices", error)
            return None

    def _open_mig_instance(self, parent: _Device, handle: Any, uuid: str) -> _Device | None:
        nvml = self._nvml
        if "mig_instance" in parent.unavailable:
            return None
        try:
            gpu_instance = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
        except Exception as error:  # noqa: BLE001 - an instance that cannot be named is skipped
            self._reading_failed(parent, "mig_instance", error)
            return None
        profile = profile_from_name(name)
        if profile is None:
            attributes = self._optional(lambda: nvml.nvmlDeviceGetAttributes_v2(handle))
            profile = (
                profile_from_attributes(
                    parent.identity.model,
                    int(attributes.gpuInstanceSliceCount),
                    int(attributes.memorySizeMB),
                )
                if attributes is not None
                else ""
            )
        identity = replace(
            parent.identity,
            uuid=uuid,
            mig_profile=profile,
            gpu_instance=gpu_instance,
            parent_uuid=parent.identity.uuid,
        )
        # NVML has no per-process utilization on MIG devices: do not ask.
        instance = _Device(
            handle,
            identity,
            Clocks(),
            0,
            integrals=parent.integrals,
            unavailable={"process_utilization"},
        )
        if parent.gpm is not None:
            parent_handle = parent.handle
            instance.gpm = GpmReader(
                nvml,
                lambda sample: nvml.nvmlGpmMigSampleGet(parent_handle, gpu_instance, sample),
            )
        return instance

    def _read_mig_instance(self, instance: _Device) -> GpuSample:
        """What NVML gives per MIG instance: memory, processes and GPM activity; device-level
        utilization, power and heat belong to the parent GPU."""
        memory = self._read_memory(instance)
        activity, activity_seconds = self._read_activity(instance, self._clock())
        return GpuSample(
            identity=instance.identity,
            up=True,
            memory_used_bytes=memory[0],
            memory_total_bytes=memory[1],
            memory_reserved_bytes=memory[2],
            processes=self._read_processes(instance) if self._collect_processes else None,
            activity=activity,
            sm_active_seconds_total=activity_seconds[0],
            tensor_active_seconds_total=activity_seconds[1],
            dram_active_seconds_total=activity_seconds[2],
        )


def _down(identity: GpuIdentity, reason: str) -> GpuSample:
    return GpuSample(identity=identity, up=False, down_reason=reason)


class _Counter:
    """A count several threads add to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def add(self) -> None:
        with self._lock:
            self._value += 1

    @property
    def value(self) -> int:
        with self._lock:
            return self._value


def _percent(value: int | None) -> float | None:
    return value / 100.0 if value is not None else None


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _position(sample: GpuSample) -> tuple[int, int, str]:
    """Physical GPUs by index, each followed by its MIG instances by GPU instance id."""
    identity = sample.identity
    instance = identity.gpu_instance
    return identity.index, -1 if instance is None else instance, identity.uuid


_VALUE_MEMBERS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
"""nvmlValueType_t -> the member of the nvmlValue_t union that holds the number."""


def _field_number(value: Any) -> float | None:
    """The number in an nvmlFieldValue_t, read by its value type."""
    member = _VALUE_MEMBERS.get(value.valueType)
    return float(getattr(value.value, member)) if member is not None else None
