"""NVML's lifecycle against the calls in the driver: `nvmlShutdown` (at a re-initialisation or
at exit) never runs while any thread has a call about a GPU in the driver — a worker's job, its
follow-up PCIe read, or the event thread reading an ECC event's counts — and the sampling loop's
background tasks never die silently nor keep `close()` from closing NVML."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.core import GaugeMetricFamily

from exporter.config import ServeConfig
from exporter.metrics.families import BuildInfo
from exporter.nvml.events import EventWatcher
from exporter.nvml.sampler import NvmlSampler
from exporter.sampling import SamplingLoop
from exporter.simulator import SimulatedNvml
from exporter.simulator.fleet import parse_fleet
from tests.helpers import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.timeout(30)


class TrackedDriver:
    """The simulator, counting the calls under way; `nvmlShutdown` records how many there were
    when it was called, and each function in `blocking` waits for its event first."""

    def __init__(self, driver: SimulatedNvml) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self.in_driver = 0
        self.shutdowns: list[int] = []
        """Calls under way at each nvmlShutdown."""
        self.blocking: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}

    def block(self, name: str) -> threading.Event:
        """Make `name` wait until the returned event is set; `entered[name]` is set once a call
        is waiting."""
        release = threading.Event()
        self.blocking[name] = release
        self.entered[name] = threading.Event()
        return release

    def nvmlShutdown(self) -> None:
        with self._lock:
            self.shutdowns.append(self.in_driver)
        self._driver.nvmlShutdown()

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._driver, name)
        if not callable(real) or not name.startswith("nvml"):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.in_driver += 1
            try:
                release = self.blocking.get(name)
                if release is not None:
                    self.entered[name].set()
                    release.wait(20)
                return real(*args, **kwargs)
            finally:
                with self._lock:
                    self.in_driver -= 1

        return call


def _tracked(**fleet: Any) -> TrackedDriver:
    document = {"gpus": [{"model": "l4", "count": 2}], "faults": [], **fleet}
    return TrackedDriver(SimulatedNvml(parse_fleet(document)))


def _later(seconds: float, action: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_close_waits_for_a_workers_follow_up_read_to_leave_the_driver() -> None:
    """The PCIe read runs after a job has answered: the GPU owes nothing, yet its worker is in
    the driver. `close()` used to shut NVML down under it."""
    driver = _tracked()
    sampler = NvmlSampler(driver, interval=0.1)  # type: ignore[arg-type]
    sampler.start()
    release = driver.block("nvmlDeviceGetPcieThroughput")
    sampler.sample()
    assert driver.entered["nvmlDeviceGetPcieThroughput"].wait(5)
    timer = _later(1.3, release.set)  # after the workers' join used to give up (1 s)
    try:
        sampler.close()
    finally:
        timer.cancel()
        release.set()
    assert driver.shutdowns == [0], "nvmlShutdown ran while a PCIe read was in the driver"


def test_close_leaves_nvml_alone_while_a_follow_up_read_stays_in_the_driver() -> None:
    driver = _tracked()
    sampler = NvmlSampler(driver, interval=0.1)  # type: ignore[arg-type]
    sampler.start()
    release = driver.block("nvmlDeviceGetPcieThroughput")
    try:
        sampler.sample()
        assert driver.entered["nvmlDeviceGetPcieThroughput"].wait(5)
        sampler.close(timeout=0.3)
        assert driver.shutdowns == []
    finally:
        release.set()


def test_a_due_reinit_waits_for_a_follow_up_read() -> None:
    """GPU 1 is lost, so a re-initialisation is due; it must not shut NVML down while GPU 0's
    PCIe read is in the driver, and runs once the read has returned."""
    driver = _tracked(faults=[{"kind": "gpu_lost", "gpu": 1, "at": "0s"}])
    sampler = NvmlSampler(driver, interval=0.1)  # type: ignore[arg-type]
    sampler.start()
    release = driver.block("nvmlDeviceGetPcieThroughput")
    try:
        sampler.sample()  # GPU 0 answers, then its worker enters its PCIe read
        assert sampler._reinit_attempt, "the lost GPU schedules a re-initialisation"
        assert driver.entered["nvmlDeviceGetPcieThroughput"].wait(5)
        sampler._reinit_due = 0.0  # due now, whatever the backoff said
        sampler.sample()
        assert driver.shutdowns == [], "re-initialised under a PCIe read"
    finally:
        release.set()
    eventually(lambda: sampler._all_idle(sampler._timer()) or None, 5, "the read to return")
    sampler._reinit_due = 0.0
    sampler.sample()
    assert driver.shutdowns == [0], "the re-initialisation runs once the read returned"
    sampler.close()
    assert driver.shutdowns == [0, 0]


def test_a_done_reinit_is_not_due_again_when_the_next_cycle_is_late() -> None:
    """Once re-initialised, NVML is re-initialised again only when a GPU is lost again. A cycle
    after it with GPUs late (down, not lost) used to leave the old due time in place, so the
    next settled cycle shut NVML down again for nothing."""
    # A second of real time lost: a loaded machine's cycles may come late into it.
    driver = _tracked(faults=[{"kind": "gpu_lost", "gpu": 1, "at": "100ms", "until": "1100ms"}])
    sampler = NvmlSampler(driver, interval=0.1)  # type: ignore[arg-type]
    sampler.start()
    try:
        eventually(lambda: sampler.sample()[0][1].down_reason == "lost", 5, "GPU 1 lost")
        eventually(lambda: sampler._threads.settle(sampler._timer() + 1) or None, 5, "idle")
        threading.Event().wait(1.1)  # past the fault's end
        sampler._reinit_due = 0.0  # due now, whatever the backoff said
        release = driver.block("nvmlDeviceGetTemperature")
        gpus, _ = sampler.sample()  # re-initialises; every GPU's job is held up
        assert driver.shutdowns == [0]
        assert not any(gpu.up for gpu in gpus)
        release.set()
        eventually(lambda: not sampler._threads.owing(), 5, "the held-up jobs to answer")
        eventually(lambda: sampler._threads.settle(sampler._timer() + 1) or None, 5, "idle")
        gpus, _ = sampler.sample()
        assert all(gpu.up for gpu in gpus)
        assert driver.shutdowns == [0], "re-initialised again with no GPU lost"
    finally:
        sampler.close()


def test_a_lost_gpu_comes_back_though_the_reinit_waits_for_the_event_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Detaching the event thread waits for its event wait to return (up to half a second),
    longer than a 0.1 s cycle waits for answers. The cycle's deadline used to be taken before
    the re-initialisation, so no GPU answered in time; the cycle after it found the
    re-initialisation still due (not every GPU up, none lost) and re-initialised again, forever."""
    driver = _tracked(faults=[{"kind": "gpu_lost", "gpu": 1, "at": "200ms", "until": "700ms"}])
    sampler = NvmlSampler(driver, interval=0.1, events=EventWatcher(driver))  # type: ignore[arg-type]
    sampler.start()

    def all_up() -> bool:
        gpus, _ = sampler.sample()
        return len(gpus) == 2 and all(gpu.up for gpu in gpus)

    try:
        with caplog.at_level(logging.INFO, logger="exporter.nvml.sampler"):
            eventually(lambda: not sampler.sample()[0][1].up, 5, "GPU 1 to be lost")
            eventually(all_up, 10, "both GPUs up after the re-initialisation", every=0.1)
            for _ in range(5):
                assert all_up(), "a GPU went down again after it came back"
        initialised = [r for r in caplog.records if r.getMessage() == "NVML initialised"]
        assert 1 <= len(initialised) <= 3, "re-initialised cycle after cycle"
    finally:
        sampler.close()


def test_detach_waits_for_the_event_threads_ecc_read() -> None:
    """An ECC event makes the event thread read the GPU's error counts: `detach` (before every
    nvmlShutdown) must wait for that call too, not only for the wait on the event set."""
    driver = _tracked(faults=[{"kind": "ecc", "gpu": 0, "at": "300ms", "corrected": 3}])
    release = driver.block("nvmlDeviceGetTotalEccErrors")
    sampler = NvmlSampler(driver, interval=0.1, events=EventWatcher(driver))  # type: ignore[arg-type]
    sampler.start()
    try:
        assert driver.entered["nvmlDeviceGetTotalEccErrors"].wait(5)
        sampler.close()  # the read stays in the driver past every wait of `close`
        assert driver.shutdowns == [], "nvmlShutdown ran while the event thread read ECC counts"
    finally:
        release.set()


# -- the sampling loop's tasks -------------------------------------------------------------------


async def test_a_failing_republish_is_logged_counted_and_close_still_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Re-publishing after an XID event runs in a task of its own. When it failed, nobody saw
    it, and `close()` re-raised its exception before closing NVML, the event thread and the
    workers."""
    driver = _tracked()
    sampling = SamplingLoop(
        replace(ServeConfig(), collect_interval=0.05),
        driver,  # type: ignore[arg-type]
        build=BuildInfo("test"),
    )
    await sampling.start()
    sampling.begin()
    await asyncio.sleep(0.2)

    def broken() -> None:
        raise RuntimeError("republishing broke")

    sampling._republished = broken  # type: ignore[method-assign, assignment]
    errors_before = sampling._nvml.errors_total
    with caplog.at_level(logging.ERROR):
        sampling._republish_soon()
        task = sampling._republishing
        assert task is not None
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert any("re-publishing after an NVML event failed" in r.getMessage() for r in caplog.records)
    assert sampling._nvml.errors_total == errors_before + 1
    workers = [d.worker for d in sampling._nvml._devices]
    await sampling.close()
    assert driver.shutdowns == [0], "close() must still shut NVML down"
    assert all(worker is not None and not worker._thread.is_alive() for worker in workers)


async def test_a_cycle_nobody_scrapes_reads_none_of_the_daemons_own_families() -> None:
    """The daemon's own families (`/proc/self`, the endpoint's counts) were read by every cycle,
    most of the sampler thread's own work, though a snapshot nobody scrapes is never rendered.
    They are read as its families are made: not at all for an unscraped cycle, once however
    many formats a scraped one is rendered in."""
    reads: list[int] = []

    def own() -> list[Any]:
        reads.append(len(reads))
        return [GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", 7.0)]

    sampling = SamplingLoop(
        ServeConfig(),
        _tracked(),  # type: ignore[arg-type]
        build=BuildInfo("test"),
        own_families=own,
    )
    await sampling.start()
    try:
        loop = asyncio.get_running_loop()
        for _ in range(2):
            exposition = await loop.run_in_executor(sampling._executor, sampling.cycle)
        assert reads == []
        text = exposition.render("text").body
        exposition.render("openmetrics")
        assert reads == [0]
        assert b"process_open_fds 7.0" in text
    finally:
        await sampling.close()
