"""Samples every GPU through an NVML driver: NVML's lifecycle, and assembling each cycle.

The sampler itself (init, re-init, enumeration, assembling the cycle) runs in the sampling
loop's worker thread; the driver calls about GPUs are made there too while the GPUs answer fast
and the loop watches that thread, else by a shared worker thread, and by a thread of its own for
a GPU that is slow — so that a call that hangs holds up that GPU only (`exporter.nvml.workers`).
What one GPU's job reads (with its MIG instances) is `exporter.nvml.device`; how each call fails
alone is `exporter.nvml.reads`.

- A lifecycle error (`GPU_IS_LOST`, ...) marks the GPU down (`gpu_up 0`, reason `lost`) while the
  others keep reporting, and schedules `nvmlShutdown` + `nvmlInit` on a later cycle, with
  backoff, so the GPU comes back by itself.
- A GPU whose job does not answer within the cycle's wait shows its newest answer (a job that
  answers after the wait is read at the next cycle); once the
  job has been out for `hang_seconds` it is down (reason `hung`) until it returns. NVML is never
  shut down (to re-initialise it, or at exit) while any call is in the driver: a worker's job,
  its follow-up PCIe read, or the event thread's.
- A cycle waits for driver calls about GPUs `wait_seconds` (half an interval) at most in all: for
  follow-up reads to leave the driver before a due re-initialisation (half of it at most), then
  for the answers, counted from when the jobs were handed out (NVML's re-initialisation itself,
  which may wait for the event thread, does not count against the GPUs).
- Each GPU is opened (at init and re-init) in a thread of its own, waited for `hang_seconds`
  at most (`exporter.nvml.opening`): one whose calls hang is down (reason `hung`) and holds up
  neither the others nor the daemon's start.
- Anything unexpected escaping a GPU's job makes that GPU down for the cycle (reason `error`),
  counted in `errors_total`.

The event thread shares this sampler's NVML initialisation: it is attached after each init and
detached before each shutdown.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pynvml

from exporter.logs import LogOnce
from exporter.model import CollectorStatus, GpuIdentity, GpuSample
from exporter.nvml.device import GPU_COLLECTORS, Answer, DeviceReader
from exporter.nvml.driver import (
    NvmlUnavailable,
    error_code,
    error_name,
    is_lifecycle_error,
    is_unavailable,
)
from exporter.nvml.events import with_events
from exporter.nvml.gpm import GpmReader, supports_gpm
from exporter.nvml.mig import text
from exporter.nvml.opening import Opening, open_all
from exporter.nvml.reads import Counter, Device, GpuLost, Integrals, Reads
from exporter.nvml.workers import GpuThreads

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterable

    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.events import EventWatcher
    from exporter.nvml.workers import Batch, Ticket

log = logging.getLogger(__name__)

T = TypeVar("T")

REINIT_BACKOFF_SECONDS: Final = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Waits before successive re-initialisation attempts while a GPU or the library is down."""
SETTLE_SECONDS: Final = 0.2
"""How long a due re-initialisation waits (and half the cycle's wait at most) for a worker's
follow-up read (PCIe throughput: two 20 ms windows) to leave the driver, when no GPU owes an
answer."""
CLOSE_SECONDS: Final = 2.0
"""How long `close` waits for the driver calls under way to return before it leaves NVML as it
is, and then for the workers' threads to end."""

# Why a GPU is reported down (`gpu_down_reason{reason}`): a lifecycle error from the driver;
# driver calls that have not returned; a GPU the driver lists but cannot open; an unexpected
# error reading it (a bug, or an answer gpuscope does not understand).
HUNG: Final = "hung"
LOST: Final = "lost"
UNOPENED: Final = "unopened"
ERROR: Final = "error"


class NvmlSampler:
    """Samples all GPUs on one NVML driver; stateful only where counters must integrate."""

    def __init__(
        self,
        driver: NvmlDriver,
        *,
        collectors: Iterable[str] = GPU_COLLECTORS,
        read_processes: bool = True,
        process_names: bool = False,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.monotonic,
        events: EventWatcher | None = None,
        interval: float = 1.0,
    ) -> None:
        """`collectors`: which of `GPU_COLLECTORS` to read; `read_processes`: read process lists
        even without the `processes` collector (pod attribution needs them); `process_names`:
        and the name of each process listed."""
        self._nvml = driver
        self._clock = clock
        self._timer = timer
        """Real time, for waiting on GPU workers (`clock` may be a test's simulated time)."""
        self._events = events
        self.collectors = tuple(name for name in GPU_COLLECTORS if name in set(collectors))
        self.wait_seconds = interval / 2
        """How long a cycle waits for the GPUs' answers, from its start."""
        self.hang_seconds = max(2 * interval, 2.0)
        """A job out this long makes its GPU `hung`."""
        self._threads: GpuThreads[Device] = GpuThreads(
            slow_seconds=self.wait_seconds / 2,
            name=lambda device: f"gpuscope-gpu{device.identity.index}",
            on_error=partial(self._unexpected, stage="pcie"),
            timer=timer,
        )
        """Which thread reads which GPU: a GPU whose job has run for half the cycle's wait gets
        the thread it is stuck in, and the GPUs behind it still have the other half."""
        self._once = LogOnce(log)
        self._errors = Counter()
        self._reader = DeviceReader(
            driver,
            Reads(self._once, self._errors),
            collectors=self.collectors,
            processes=read_processes or "processes" in self.collectors,
            process_names=process_names,
            clock=clock,
            interval=interval,
        )
        self._initialized = False
        self._devices: list[Device] = []
        self._late: list[Device] = []
        """The GPUs that gave no answer last cycle: a job of theirs may have answered since."""
        self._known: dict[str, GpuIdentity] = {}
        self._integrals: dict[str, Integrals] = {}
        self._lost: set[str] = set()
        self._hung: set[str] = set()
        self._opening: dict[int, threading.Thread] = {}
        """The threads of the GPUs whose opening at the last initialisation had not returned by
        its deadline, by index: those GPUs are down (hung) until NVML re-initialises."""
        self._reinit_due: float | None = None
        """When the next re-initialisation is due (on `clock`); None when none is scheduled."""
        self._reinit_attempt = 0
        """Re-initialisations scheduled since everything last answered (the backoff's step)."""

    @property
    def gpu_threads(self) -> GpuThreads[Device]:
        """The GPUs' threads, for calls beside the cycle's jobs (`GpuThreads.call`, `gpus`: the
        two of its methods any thread may use)."""
        return self._threads

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

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Stop the event thread and the GPU workers, free GPM samples and shut NVML down, within
        about `timeout` plus the event thread's stop. NVML is shut down only once no call of any
        worker is in the driver; with one still hung at the deadline, NVML is left as it is (the
        threads are daemon threads: they end with the process)."""
        deadline = self._timer() + timeout
        events_left = self._events.close() if self._events is not None else True
        idle = self._all_idle(deadline) and events_left
        if not idle:
            log.warning("a driver call is still hung; not shutting NVML down")
        self._threads.stop(deadline)
        if not (idle and self._initialized):
            return
        self._initialized = False
        for device in self._devices:
            for reader in device.gpm_readers():
                reader.free()
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.debug("nvmlShutdown failed", extra={"error": error_name(error)})

    def _all_idle(self, deadline: float) -> bool:
        """Whether every worker is idle (no call in the driver, none waiting; follow-up reads not
        yet begun are dropped) and no GPU's opening is still in the driver, waiting for them
        until `deadline`."""
        for thread in self._opening.values():
            thread.join(max(0.0, deadline - self._timer()))
        if any(thread.is_alive() for thread in self._opening.values()):
            return False
        return self._threads.settle(deadline)

    def _settled(self, deadline: float) -> bool:
        """Whether NVML may be re-initialised now: no GPU owes an answer, and the workers'
        follow-up reads leave the driver within `SETTLE_SECONDS` (and by `deadline`)."""
        if self._threads.owing():
            return False
        return self._all_idle(min(self._timer() + SETTLE_SECONDS, deadline))

    def _release(self) -> bool:
        """Everything tied to the current initialisation, before nvmlShutdown. Only while every
        worker is idle. Whether NVML may be shut down: False while an event call stays in the
        driver."""
        events_left = self._events.detach() if self._events is not None else True
        self._threads.stop(self._timer() + CLOSE_SECONDS)
        for device in self._devices:
            for reader in device.gpm_readers():
                reader.free()
        return events_left

    def _attach(self) -> None:
        """Hand the freshly opened GPUs to the event thread, and to one shared worker."""
        if self._events is not None:
            self._events.attach([(d.identity.uuid, d.handle) for d in self._devices])
        self._threads.place(self._devices)

    def _initialize(self) -> None:
        if self._initialized:
            self._initialized = False
            if self._release():
                try:
                    self._nvml.nvmlShutdown()
                except pynvml.NVMLError as error:
                    log.debug(
                        "nvmlShutdown before re-init failed", extra={"error": error_name(error)}
                    )
            else:
                # The library keeps its state (init counts references): a lost GPU then comes
                # back only once a later re-initialisation can shut it down.
                log.warning("re-initialising NVML without shutting it down: an event call hangs")
        self._devices = []
        self._late = []
        # Every thread of an earlier opening has ended (re-initialising waited for them): none
        # of its GPUs is hung any more, whether or not this initialisation succeeds.
        self._opening = {}
        self._nvml.nvmlInit()
        self._initialized = True
        self._once.forget_matching(("field",))
        driver_version = self._optional(lambda: text(self._nvml.nvmlSystemGetDriverVersion()))
        cuda = self._optional(self._nvml.nvmlSystemGetCudaDriverVersion)
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        openings = open_all(
            self._nvml.nvmlDeviceGetCount(),
            partial(self._probe, driver_version=driver_version or "", cuda_version=cuda_version),
            deadline=self._timer() + self.hang_seconds,
            timer=self._timer,
        )
        for opening in openings:
            device = self._opened(opening)
            if device is not None:
                self._devices.append(device)
        self._attach()

    def _opened(self, opening: Opening[Device]) -> Device | None:
        """A GPU's opening, in the sampler's books: the device, or None with the GPU down."""
        index = opening.index
        if not opening.done:
            self._opening[index] = opening.thread
            log.warning(
                "GPU's driver calls did not return while opening it; reporting it down until "
                "they do",
                extra={"gpu": index, "seconds": self.hang_seconds},
            )
            self._placeholder(index)
            return None
        error = opening.error
        if isinstance(error, pynvml.NVMLError):
            self._once(
                logging.ERROR,
                ("open", index, error_code(error)),
                "cannot open GPU; reporting it down",
                fields={"gpu": index, "error": error_name(error)},
            )
            self._placeholder(index)
            return None
        if error is not None:
            raise error
        device = opening.result
        assert device is not None
        uuid = device.identity.uuid
        self._known.pop(f"index:{index}", None)
        self._known[uuid] = device.identity
        device.integrals = self._integrals.setdefault(uuid, Integrals())
        return device

    def _placeholder(self, index: int) -> None:
        """A GPU that did not open, known by its index unless known by its UUID already."""
        if not any(known.index == index for known in self._known.values()):
            self._known.setdefault(f"index:{index}", GpuIdentity(index=index, uuid="", model=""))

    def _probe(self, index: int, *, driver_version: str, cuda_version: str) -> Device:
        """GPU `index` opened: its handle, identity and what is read once per initialisation.
        Runs in the GPU's opening thread (`exporter.nvml.opening`): driver calls only."""
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = text(nvml.nvmlDeviceGetUUID(handle))
        name = text(nvml.nvmlDeviceGetName(handle))
        pci = self._optional(lambda: nvml.nvmlDeviceGetPciInfo_v3(handle))
        gpm = "gpm" in self.collectors and bool(self._optional(lambda: supports_gpm(nvml, handle)))
        identity = GpuIdentity(
            index=index,
            uuid=uuid,
            model=name,
            pci_bus_id=text(pci.busId) if pci is not None else "",
            driver_version=driver_version,
            cuda_version=cuda_version,
            minor_number=self._optional(lambda: nvml.nvmlDeviceGetMinorNumber(handle)),
            has_gpm=gpm,
        )
        fans = self._optional(lambda: nvml.nvmlDeviceGetNumFans(handle))
        links = self._active_links(handle) if "nvlink" in self.collectors else ()
        device = Device(handle, identity, fan_count=fans or 0, links=links)
        if gpm:
            device.gpm = GpmReader(nvml, lambda sample: nvml.nvmlGpmSampleGet(handle, sample))
        if "mig" in self.collectors:
            device.mig_slots = (
                self._optional(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
            )
        return device

    def _active_links(self, handle: object) -> tuple[int, ...]:
        """The GPU's NVLink links that are active now, asked link by link up to the first the
        GPU does not have (a GPU without NVLink answers NotSupported for the first)."""
        active: list[int] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self._nvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as error:
                if error_code(error) == pynvml.NVML_ERROR_INVALID_ARGUMENT or is_unavailable(error):
                    break  # past its last link, or no NVLink at all
                if is_lifecycle_error(error):
                    break  # the GPU is gone: its first reading will say so
                continue  # this link cannot say: not counted as active
            if state == pynvml.NVML_FEATURE_ENABLED:
                active.append(link)
        return tuple(active)

    def _optional(self, read: Callable[[], T]) -> T | None:
        """A value read once per initialisation; any NVML error just means "not known"."""
        try:
            return read()
        except pynvml.NVMLError:
            return None

    def _schedule_reinit(self, now: float) -> None:
        if self._reinit_due is not None:
            return  # already scheduled
        wait = REINIT_BACKOFF_SECONDS[min(self._reinit_attempt, len(REINIT_BACKOFF_SECONDS) - 1)]
        self._reinit_attempt += 1
        self._reinit_due = now + wait

    # -- one cycle ---------------------------------------------------------------------------

    def sample(self) -> tuple[tuple[GpuSample, ...], tuple[CollectorStatus, ...]]:
        """Every GPU's samples this cycle, and the status of NVML and of each collector. Waits
        for driver calls about GPUs `wait_seconds` at most in all: for follow-up reads to leave
        the driver before a due re-initialisation (half of it at most), then for the answers."""
        started = self._clock()
        waited = 0.0
        if self._reinit_due is not None and started >= self._reinit_due:
            settling = self._timer()
            settled = self._settled(settling + self.wait_seconds / 2)
            waited = self._timer() - settling
            if not settled:
                # nvmlShutdown under a call still in the driver is undefined behaviour.
                self._once(
                    logging.WARNING,
                    ("reinit", "busy"),
                    "NVML re-initialisation waits for the driver calls under way to return",
                )
            else:
                self._once.forget(("reinit", "busy"))
                self._reinit_due = None
                self._reinitialize()

        answers: list[Answer] = []
        self._take_late_answers(answers)
        batch = self._submit()
        # Counted from the jobs handed out: a re-initialisation (which waits up to the event
        # thread's poll for its wait to return) must not eat the GPUs' time to answer.
        self._threads.wait(batch, self._timer() + self.wait_seconds - waited)
        samples: list[GpuSample] = []
        late: list[Device] = []
        for device in self._devices:
            # This cycle's job, or (handed none: it still owed one) the job answering meanwhile.
            ticket = self._fresh(device)
            if ticket is not None:
                samples.extend(self._answered(device, ticket, answers))
            else:
                late.append(device)
                samples.extend(self._unanswered(device))
        self._late = late
        if len(self._known) != len(self._devices):
            samples.extend(self._not_opened())

        finished = self._clock()
        down = [sample.down_reason for sample in samples if not sample.up]
        if not self._initialized or self._opening or LOST in down or UNOPENED in down:
            self._schedule_reinit(finished)
        elif not down:
            self._reinit_attempt = 0
        if len(samples) != len(self._devices):
            # The GPUs are opened, and answer, in index order: only MIG instances and the GPUs
            # not opened need placing among them.
            samples.sort(key=_position)
        statuses = (
            CollectorStatus("nvml", self._initialized, finished - started),
            *self._collector_statuses(answers),
        )
        return self.overlay_events(tuple(samples)), statuses

    def _not_opened(self) -> list[GpuSample]:
        """The GPUs known but not open now: lost, unopened, or hung while being opened (none
        when as many are known as are open: each GPU opened is known by its UUID)."""
        opened = {device.identity.uuid for device in self._devices}
        samples: list[GpuSample] = []
        for key, identity in self._known.items():
            if key in opened:
                continue
            if identity.index in self._opening:
                reason = HUNG
            else:
                reason = UNOPENED if key.startswith("index:") else LOST
            samples.append(_down(identity, reason))
            if key in self._integrals:
                self._integrals[key].last_read = None
        return samples

    def _submit(self) -> Batch:
        """This cycle's job for every GPU not lost: its reading, then (without GPM) its PCIe
        throughput window."""
        reader = self._reader
        read, pcie = reader.read, reader.read_pcie if reader.enabled("pcie") else None
        return self._threads.submit(
            [
                (device, read, pcie if device.gpm is None else None)
                for device in self._devices
                if not device.lost
            ]
        )

    def _collector_statuses(self, answers: list[Answer]) -> list[CollectorStatus]:
        """Per collector: whether its readings answered on every GPU that answered, and the
        longest any GPU spent in them."""
        if not answers:
            return [
                CollectorStatus(name, success=True, duration_seconds=0.0)
                for name in self.collectors
            ]
        failed = set().union(*map(_FAILED, answers))
        # Each answer's times are in the reader's order of the collectors, which is this one.
        longest = map(max, zip(*map(_SECONDS, answers), strict=True))
        return [
            CollectorStatus(name, name not in failed, seconds)
            for name, seconds in zip(self.collectors, longest, strict=True)
        ]

    def _take_late_answers(self, answers: list[Answer]) -> None:
        """Jobs that answered after the last cycle stopped waiting: each stands in should this
        cycle's job be late too, so that a GPU always slower than the wait moves on (a cycle
        behind) rather than showing one answer for good."""
        for device in self._late:
            ticket = self._fresh(device)
            if ticket is not None:
                self._answered(device, ticket, answers)

    @staticmethod
    def _fresh(device: Device) -> Ticket[Any] | None:
        """The GPU's last job's ticket if it has answered and the sampler has not read it."""
        ticket = device.ticket
        if ticket is None or not ticket.answered or ticket is device.taken:
            return None
        return ticket

    def _answered(
        self, device: Device, ticket: Ticket[Any], answers: list[Answer]
    ) -> list[GpuSample]:
        device.taken = ticket
        identity = device.identity
        error = ticket.error
        if error is None and ticket.value is not None:
            answer: Answer = ticket.value
            answers.append(answer)
            device.answer = answer.samples
            if self._lost or self._hung:
                self._report_back(identity)
            return list(answer.samples)
        device.answer = None
        # Down: integrate again from its next reading, not across the time it was down (the
        # worker is idle, so the sampler may write its state).
        device.integrals.last_read = None
        if isinstance(error, GpuLost):
            device.lost = True
            self._report_lost(identity, error.cause)
            return [_down(identity, LOST)]
        assert error is not None
        self._unexpected(device, error, stage="gpu")
        return [_down(identity, ERROR)]

    def _unanswered(self, device: Device) -> list[GpuSample]:
        """A GPU that gave no answer this cycle: lost before, or its job is still out."""
        identity = device.identity
        if device.lost:
            return [_down(identity, LOST)]
        since = self._threads.busy_since(device)
        outstanding = self._timer() - since if since is not None else 0.0
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
        # Late, not hung: its newest answer stands in.
        return list(device.answer)

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

    def _unexpected(self, device: Device, error: BaseException, *, stage: str) -> None:
        """An error nothing anticipated, at any grain: counted and logged once."""
        self._errors.add()
        identity = device.identity
        self._once.unexpected(
            ("unexpected", identity.uuid, stage),
            "unexpected error sampling this GPU; its values are omitted while it lasts",
            error,
            fields={"gpu": identity.index, "uuid": identity.uuid, "stage": stage},
        )


_FAILED: Final = attrgetter("failed")
_SECONDS: Final = attrgetter("seconds")
"""An `Answer`'s failed collectors and time per collector (a cycle's statuses merge them)."""


def _down(identity: GpuIdentity, reason: str) -> GpuSample:
    return GpuSample(identity=identity, up=False, down_reason=reason)


def _position(sample: GpuSample) -> tuple[int, int, str]:
    """Physical GPUs by index, each followed by its MIG instances by GPU instance id."""
    identity = sample.identity
    instance = identity.gpu_instance
    return identity.index, -1 if instance is None else instance, identity.uuid
