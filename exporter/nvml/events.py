"""XID and ECC events: a dedicated thread waits on one NVML event set for every GPU.

The sampler owns NVML's initialisation, so it also owns the event set's life: after each
(re-)initialisation it calls `attach` (create the set, register every GPU that supports XID or
ECC events), and before `nvmlShutdown` it calls `detach` (take the set back from the waiting
thread and free it). The waiting thread holds no NVML reference of its own — if it did, the
sampler's shutdown + init would never really re-initialise the library. It survives timeouts
(`NVMLError_Timeout` every `wait_ms`), a lost GPU and re-initialisation; anything unexpected
restarts it after a backoff (`exporter.supervise`), and `healthy` says so meanwhile.

What the thread learns goes into an `EventStore`, which the sampling cycle copies into each
snapshot (`with_events`); XID counters are per daemon, so they survive re-initialisation.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.logs import LogOnce
from exporter.nvml.driver import error_code, error_name, handle_key, is_unavailable
from exporter.readings import (
    BY_NAME,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    LAST_XID,
    read_now,
    xid_series,
)
from exporter.supervise import SupervisedThread

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.model import GpuSample
    from exporter.nvml.driver import NvmlDriver
    from exporter.series import Series

log = logging.getLogger(__name__)

XID_EVENTS: Final = pynvml.nvmlEventTypeXidCriticalError
ECC_EVENTS: Final = pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
WATCHED_EVENTS: Final = XID_EVENTS | ECC_EVENTS

WAIT_MS: Final = 500
"""How long one wait blocks: bounds how long `detach` and `close` can take."""


@dataclass(frozen=True, slots=True)
class GpuEvents:
    """What the event thread learned about one GPU."""

    xid_counts: tuple[tuple[int, int], ...] = ()
    """(XID, times seen), ordered by XID."""
    last_xid_timestamp: float | None = None
    ecc_corrected: int | None = None
    """ECC totals read right after an ECC event, fresher than the last sampling cycle's."""
    ecc_uncorrected: int | None = None


class EventStore:
    """Thread-safe record of events per GPU UUID; `on_change` is called after each record."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, GpuEvents] = {}
        self.on_change: Callable[[], None] | None = None

    def record_xid(self, uuid: str, xid: int, when: float) -> None:
        with self._lock:
            events = self._events.get(uuid, GpuEvents())
            counts = dict(events.xid_counts)
            counts[xid] = counts.get(xid, 0) + 1
            self._events[uuid] = replace(
                events, xid_counts=tuple(sorted(counts.items())), last_xid_timestamp=when
            )
        self._changed()

    def record_ecc(self, uuid: str, corrected: int | None, uncorrected: int | None) -> None:
        with self._lock:
            events = self._events.get(uuid, GpuEvents())
            self._events[uuid] = replace(
                events, ecc_corrected=corrected, ecc_uncorrected=uncorrected
            )
        self._changed()

    def forget_ecc(self) -> None:
        """After re-initialisation the sampled totals are the truth again (a reloaded driver
        restarts its volatile counters)."""
        with self._lock:
            self._events = {
                uuid: replace(events, ecc_corrected=None, ecc_uncorrected=None)
                for uuid, events in self._events.items()
            }

    def __bool__(self) -> bool:
        """Whether any event was recorded at all (most cycles on a healthy node: none)."""
        with self._lock:
            return bool(self._events)

    def get(self, uuid: str) -> GpuEvents | None:
        with self._lock:
            return self._events.get(uuid)

    def _changed(self) -> None:
        callback = self.on_change
        if callback is not None:
            callback()


def with_events(sample: GpuSample, events: GpuEvents | None) -> GpuSample:
    """The sample with what the event thread saw: XID counters (kept while the GPU is down), and
    ECC totals read after an event when they are ahead of the ones sampled (counters only grow)."""
    if events is None:
        return sample
    values = dict(sample.values)
    if events.xid_counts:
        for xid, count in events.xid_counts:
            values[xid_series(xid)] = count
        if events.last_xid_timestamp is not None:
            values[LAST_XID] = events.last_xid_timestamp
    if sample.up:
        for series, seen in (
            (ECC_CORRECTED, events.ecc_corrected),
            (ECC_UNCORRECTED, events.ecc_uncorrected),
        ):
            sampled = sample.values.get(series)
            if seen is not None and (sampled is None or seen > sampled):
                values[series] = seen
    return replace(sample, values=values)


class EventWatcher:
    """One thread waiting for XID critical errors and ECC events on every GPU that has them."""

    def __init__(
        self,
        driver: NvmlDriver,
        *,
        store: EventStore | None = None,
        wait_ms: int = WAIT_MS,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._nvml = driver
        self.store = store or EventStore()
        self._wait_ms = wait_ms
        self._wall = wall
        self._once = LogOnce(log)
        self._cond = threading.Condition()
        self._set: Any = None
        """The event set handed to the waiting thread; None while detached."""
        self._devices: dict[int, tuple[str, Any]] = {}
        """handle_key -> (uuid, handle) of every GPU registered in the set."""
        self._waiting = False
        """The thread is in the driver: waiting on the set, or reading an ECC event's counts."""
        self._detaching = 0
        """Threads in `detach` waiting for the thread to leave the driver: it tells them only
        while there are (every wait ends, twice a second)."""
        self._stop = False
        self._thread = SupervisedThread("gpuscope-events", self._run)

    @property
    def healthy(self) -> bool:
        """False from an unexpected crash of the waiting thread until it is restarted."""
        return self._thread.healthy

    def start(self) -> None:
        self._thread.start()

    def attach(self, devices: Sequence[tuple[str, Any]]) -> int:
        """Register `(uuid, handle)` GPUs in a new event set and hand it to the waiting thread.
        Call right after NVML (re-)initialised. Returns how many GPUs are watched."""
        self.detach()
        self.store.forget_ecc()
        if not devices:
            return 0
        try:
            event_set = self._nvml.nvmlEventSetCreate()
        except Exception as error:  # noqa: BLE001 - no events is a degraded mode, not a failure
            self._failed(("create", error_code(error)), "cannot create an NVML event set", error)
            return 0
        watched: dict[int, tuple[str, Any]] = {}
        for uuid, handle in devices:
            try:
                mask = self._nvml.nvmlDeviceGetSupportedEventTypes(handle) & WATCHED_EVENTS
                if mask:
                    self._nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    watched[handle_key(handle)] = (uuid, handle)
            except Exception as error:  # noqa: BLE001 - a GPU without events is still sampled
                self._failed(
                    ("register", uuid, error_code(error)),
                    "cannot watch this GPU's XID and ECC events",
                    error,
                    uuid=uuid,
                )
        if not watched:
            self._free(event_set)
            return 0
        with self._cond:
            self._set = event_set
            self._devices = watched
            self._cond.notify_all()
        log.info("watching XID and ECC events", extra={"gpus": len(watched)})
        return len(watched)

    def detach(self) -> bool:
        """Take the event set back from the waiting thread and free it. Call before
        `nvmlShutdown`: waits until the thread has no call in the driver (a wait on the set, or
        an ECC event's counts), within about `wait_ms`, and says whether it left the driver
        (False: NVML must not be shut down under it)."""
        with self._cond:
            event_set, self._set, self._devices = self._set, None, {}
            self._cond.notify_all()
            self._detaching += 1
            try:
                self._cond.wait_for(lambda: not self._waiting, timeout=self._wait_ms / 1000 + 1.0)
            finally:
                self._detaching -= 1
            stuck = self._waiting
        if stuck:
            # A call that outlived the wait's own timeout: freeing the set under it could crash
            # the driver, so leave the set to the library's shutdown.
            log.warning("an NVML event call did not return in time; leaving its event set")
            return False
        if event_set is not None:
            self._free(event_set)
        return True

    def close(self) -> bool:
        """Stop the thread; whether it has no call left in the driver (as `detach`)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        left = self.detach()
        self._thread.stop(self._wait_ms / 1000 + 1.0)
        return left

    # -- the waiting thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._set is not None):
                    self._cond.wait()
                if self._stop:
                    return
                event_set, devices = self._set, self._devices
                self._waiting = True
            failed = False
            try:
                try:
                    data = self._nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
                except pynvml.NVMLError_Timeout:
                    self._once.forget(("wait",))
                except Exception as error:  # noqa: BLE001 - the thread must outlive any failure
                    failed = True
                    self._failed(("wait",), "waiting for NVML events failed; retrying", error)
                else:
                    self._once.forget(("wait",))
                    # Still in the driver: an ECC event reads the GPU's counts.
                    self._record(data, devices)
            finally:
                with self._cond:
                    self._waiting = False
                    if self._detaching:
                        self._cond.notify_all()
            if failed:  # do not spin on a set that fails at once (e.g. its GPU fell off the bus)
                with self._cond:
                    self._cond.wait_for(lambda: self._stop, timeout=self._wait_ms / 1000)

    def _record(self, data: Any, devices: dict[int, tuple[str, Any]]) -> None:
        found = devices.get(handle_key(data.device))
        if found is None:
            self._once(logging.WARNING, ("unknown device",), "NVML event from an unknown GPU")
            return
        uuid, handle = found
        event_type = int(data.eventType)
        if event_type & XID_EVENTS:
            xid = int(data.eventData)
            self.store.record_xid(uuid, xid, self._wall())
            log.warning("XID error", extra={"uuid": uuid, "xid": xid})
        if event_type & ECC_EVENTS:
            self.store.record_ecc(
                uuid,
                self._ecc_total(handle, ECC_CORRECTED),
                self._ecc_total(handle, ECC_UNCORRECTED),
            )

    def _ecc_total(self, handle: Any, series: Series) -> int | None:
        reading = BY_NAME["ecc_corrected" if series is ECC_CORRECTED else "ecc_uncorrected"]
        try:
            value = read_now(self._nvml, handle, reading).get(series)
        except pynvml.NVMLError:
            return None  # the next sampling cycle reads it anyway
        return int(value) if value is not None else None

    # -- helpers -----------------------------------------------------------------------------

    def _free(self, event_set: Any) -> None:
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as error:
            log.debug("nvmlEventSetFree failed", extra={"error": error_name(error)})

    def _failed(
        self, cause: tuple[object, ...], message: str, error: BaseException, *, uuid: str = ""
    ) -> None:
        level = logging.INFO if is_unavailable(error) else logging.WARNING
        fields: dict[str, object] = {"error": error_name(error)}
        if uuid:
            fields["uuid"] = uuid
        self._once(level, cause, message, fields=fields)
