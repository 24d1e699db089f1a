"""PCIe throughput on GPUs without GPM, read on its own thread and its own clock.

`nvmlDeviceGetPcieThroughput` counts bytes over a 20 ms window and blocks for it, once per
direction: 40 ms per GPU, 320 ms for eight. Inside the sampling cycle that would stretch every
cycle, so a `PcieThroughputReader` thread reads every attached GPU once per period and keeps the
latest figures; the cycle only copies them. Like the event thread, it holds no NVML reference of
its own: the sampler `attach`es the GPUs after each (re-)initialisation and `detach`es them before
`nvmlShutdown`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.logs import LogOnce
from exporter.nvml.driver import error_code, error_name, is_lifecycle_error, is_unavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.nvml.driver import NvmlDriver

log = logging.getLogger(__name__)

_KIB: Final = 1024
STALE_PERIODS: Final = 3
"""A figure older than this many periods (at least 5 s) is dropped rather than shown."""


class PcieThroughputReader:
    """Latest PCIe transmit/receive bytes per second per GPU UUID, read in the background."""

    def __init__(
        self,
        driver: NvmlDriver,
        *,
        period: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = driver
        self._period = period
        self._clock = clock
        self._max_age = max(STALE_PERIODS * period, 5.0)
        self._once = LogOnce(log)
        self._cond = threading.Condition()
        self._devices: tuple[tuple[str, Any], ...] = ()
        self._generation = 0
        self._reading = False
        self._stop = False
        self._unavailable: set[str] = set()
        self._latest: dict[str, tuple[float, float, float]] = {}
        """uuid -> (transmit, receive, when measured)."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuscope-pcie", daemon=True)
        self._thread.start()

    def attach(self, devices: Sequence[tuple[str, Any]]) -> None:
        """Read these `(uuid, handle)` GPUs from now on. Call after NVML (re-)initialised."""
        with self._cond:
            self._generation += 1
            self._devices = tuple(devices)
            self._unavailable.clear()
            self._once.forget_matching(("pcie",))
            self._cond.notify_all()

    def detach(self) -> None:
        """Stop reading; returns once no read is in flight (one 20 ms window at most)."""
        with self._cond:
            self._generation += 1
            self._devices = ()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._reading, timeout=1.0)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.detach()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None

    def latest(self, uuid: str) -> tuple[float, float] | None:
        """(transmit, receive) bytes/s measured within the last few periods, else None."""
        with self._cond:
            found = self._latest.get(uuid)
        if found is None or self._clock() - found[2] > self._max_age:
            return None
        return found[0], found[1]

    # -- the reading thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or bool(self._devices))
                if self._stop:
                    return
                generation, devices = self._generation, self._devices
                self._reading = True
            started = self._clock()
            try:
                for uuid, handle in devices:
                    if self._generation != generation:
                        break  # detached: the sampler is about to shut NVML down
                    self._read(uuid, handle)
            finally:
                with self._cond:
                    self._reading = False
                    self._cond.notify_all()
            self._pause(generation, self._period - (self._clock() - started))

    def _pause(self, generation: int, seconds: float) -> None:
        """Until the next round is due, or sooner when GPUs are attached, detached or stopping."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._stop or self._generation != generation, timeout=max(seconds, 0.0)
            )

    def _read(self, uuid: str, handle: Any) -> None:
        if uuid in self._unavailable:
            return
        try:
            transmit = self._nvml.nvmlDeviceGetPcieThroughput(
                handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
            )
            receive = self._nvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        except Exception as error:  # noqa: BLE001 - each GPU's reading fails alone
            self._failed(uuid, error)
            return
        with self._cond:
            self._latest[uuid] = (transmit * _KIB, receive * _KIB, self._clock())

    def _failed(self, uuid: str, error: Exception) -> None:
        fields: dict[str, object] = {
            "uuid": uuid,
            "reading": "pcie_throughput",
            "error": error_name(error),
        }
        if is_unavailable(error):
            self._unavailable.add(uuid)
            self._once(
                logging.INFO,
                ("pcie", uuid),
                "not available on this GPU or driver; its series is omitted",
                fields=fields,
            )
        elif not is_lifecycle_error(error):  # a lost GPU is the sampler's to report
            self._once(
                logging.WARNING,
                ("pcie", uuid, error_code(error)),
                "NVML reading failed; its series is omitted while it fails",
                fields=fields,
            )
