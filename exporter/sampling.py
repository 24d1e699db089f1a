"""The sampling loop: on its own clock, sample every source in one worker thread, build the
snapshot, render it, and publish the result for `/metrics` to serve.

One dedicated thread runs each cycle, so cycles are serialised and never block the event loop;
cycles start on a fixed schedule (start + k * interval), and a cycle that outlasts the interval
makes the next start late rather than piling up (counted as an overrun). Within a cycle the GPUs
that answer fast are read in that thread, one after the other, while the loop watches it: a GPU
stuck in a driver call there keeps the thread, and the cycle moves to a fresh one
(`exporter.nvml.workers`), so a GPU hung in the driver costs only that GPU.

A cycle that raises is one bad cycle: it is logged (once per distinct error), counted in
`gpuscope_sample_errors_total`, and the next cycle runs on schedule. `ready()` and `alive()`
say whether cycles keep completing, for `/-/ready` and `/-/healthy`.

One helper thread waits for XID and ECC events: an event re-publishes the last snapshot at once
with the new counts, so an XID or an ECC error is visible before the next cycle.

Threading rules (all of them in docs/architecture.md, "Threading model"): `exposition` and the
timestamps of the last cycle are written on the event loop only; the snapshot and everything the
cycle builds are made in the worker thread and immutable once published; an `Exposition`
renders under its own lock, and scrapes record the formats they took by replacing an immutable
set (never by changing one the worker may be reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final, Protocol

from exporter.calibration.source import CeilingsSource
from exporter.catalog import builtin_catalog
from exporter.logs import LogOnce
from exporter.metrics.dcgm import DcgmCompat
from exporter.metrics.exposition import Exposition
from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import CollectorStatus, Snapshot

if TYPE_CHECKING:
    from exporter.model import Attribution, Ceilings, GpuSample
from exporter.nvml.events import EventWatcher
from exporter.nvml.sampler import NvmlSampler
from exporter.nvml.workers import CycleMoved
from exporter.supervise import DaemonExecutor

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from prometheus_client.core import Metric

    from exporter.attribution.attributor import Attributor
    from exporter.catalog import Catalog
    from exporter.config import ServeConfig
    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device
    from exporter.nvml.workers import GpuThreads

log = logging.getLogger(__name__)

CLOSE_SECONDS: Final = 3.0
"""How long stopping waits for the cycle in flight and NVML's shutdown."""


@dataclass(slots=True)
class Cycle:
    """What one sampling cycle has learned so far: each source adds its part, in order, and may
    read the parts before it (attribution reads the GPUs'). Worker thread only."""

    gpus: tuple[GpuSample, ...] = ()
    ceilings: tuple[Ceilings, ...] = ()
    attribution: Attribution | None = None
    collectors: list[CollectorStatus] = field(default_factory=list)


class Source(Protocol):
    """One input of the sampling cycle (NVML, calibration ceilings, attribution, …)."""

    def collect(self, cycle: Cycle) -> None: ...


class _Nvml:
    """The GPUs, read in threads of their own, and the event thread's health."""

    def __init__(self, sampler: NvmlSampler, events: EventWatcher | None) -> None:
        self._sampler = sampler
        self._events = events

    def collect(self, cycle: Cycle) -> None:
        cycle.gpus, statuses = self._sampler.sample()
        cycle.collectors.extend(statuses)
        if self._events is not None:
            cycle.collectors.append(CollectorStatus("events", self._events.healthy, None))


class _Calibration:
    """Ceilings of the GPU models present; profiles are re-read only when their files change
    (a few stat() calls per cycle)."""

    def __init__(self, ceilings: CeilingsSource) -> None:
        self._ceilings = ceilings

    def collect(self, cycle: Cycle) -> None:
        cycle.ceilings, status = self._ceilings.refresh({gpu.identity.model for gpu in cycle.gpus})
        if status is not None:
            cycle.collectors.append(status)


class _Attribution:
    """Who holds and uses each GPU: the attributor's sources block in threads of their own."""

    def __init__(self, attributor: Attributor) -> None:
        self._attributor = attributor

    def collect(self, cycle: Cycle) -> None:
        cycle.attribution, statuses = self._attributor.attribute(cycle.gpus)
        cycle.collectors.extend(statuses)


class Background(Protocol):
    """Something the daemon runs beside the cycle, reported as a collector."""

    @property
    def name(self) -> str: ...
    @property
    def healthy(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class HealthBounds:
    """How long without a completed cycle before the daemon stops being ready, then alive."""

    ready_seconds: float
    alive_seconds: float

    @classmethod
    def for_interval(cls, interval: float) -> HealthBounds:
        """Not ready after 5 missed cycles (at least 10 s); not alive after 10 (at least 30 s).
        A hung GPU never delays a cycle by more than half an interval, so it trips neither."""
        return cls(ready_seconds=max(5 * interval, 10.0), alive_seconds=max(10 * interval, 30.0))


class SamplingLoop:
    def __init__(
        self,
        config: ServeConfig,
        driver: NvmlDriver,
        *,
        build: BuildInfo,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.monotonic,
        catalog: Catalog | None = None,
        attributor: Attributor | None = None,
        own_families: Callable[[], Iterable[Metric]] | None = None,
        background: Sequence[Background] = (),
        bounds: HealthBounds | None = None,
    ) -> None:
        self._interval = config.collect_interval
        self._attributor = attributor
        self._build = build
        self._clock = clock
        self._wall = wall
        self._timer = timer
        self._own_families = own_families
        self._background = background
        self.bounds = bounds or HealthBounds.for_interval(config.collect_interval)
        self._executor: DaemonExecutor | None = None
        """The sampler thread's; replaced by a fresh one when a cycle is moved off it."""
        self._watch: asyncio.TimerHandle | None = None
        """The next look at the cycle in flight (`_look`)."""
        collectors = config.collectors
        self._process_series = "processes" in collectors
        self._dcgm = DcgmCompat.from_config(config)
        """dcgm-exporter's series (`--compat.dcgm`), or None."""
        self._events = EventWatcher(driver, wall=wall) if "events" in collectors else None
        self._nvml = NvmlSampler(
            driver,
            collectors=collectors,
            read_processes=attributor is not None,
            process_names=config.process_names and self._process_series,
            clock=clock,
            timer=timer,
            events=self._events,
            interval=config.collect_interval,
        )
        self._once = LogOnce(log)
        self._published: Snapshot | None = None
        """The last snapshot (worker thread only)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._republishing: asyncio.Task[None] | None = None
        self._events_pending = False
        self._closing = False
        catalog = catalog or builtin_catalog()
        self._carbon_intensity = (
            config.carbon_intensity
            if config.carbon_intensity is not None
            else catalog.carbon_intensity
        )
        """The grid's carbon intensity: the setting's, else the catalog's (None: neither)."""
        self._sources: tuple[Source, ...] = (
            _Nvml(self._nvml, self._events),
            _Calibration(CeilingsSource(catalog, config.calibration_path, clock=clock)),
            *((_Attribution(attributor),) if attributor is not None else ()),
        )
        """Everything a cycle learns comes through these, in this order."""
        self._cycles = 0
        self._overruns = 0
        self._started_at: float | None = None
        self._completed_at: float | None = None
        self.exposition: Exposition | None = None
        """The latest rendered snapshot; None until the first cycle finished."""

    async def start(self) -> None:
        """Start the worker thread and initialise NVML in it.

        Raises `NvmlUnavailable` when there is no NVML library at all.
        """
        self._executor = DaemonExecutor("gpuscope-sampler")
        self._loop = asyncio.get_running_loop()
        if self._events is not None:
            self._events.store.on_change = self._events_arrived
        await self._loop.run_in_executor(self._executor, self._nvml.start)

    @property
    def snapshot(self) -> Snapshot | None:
        """The last snapshot published (None before the first cycle), for any thread: the
        worker replaces `_published` whole, and a snapshot is immutable."""
        return self._published

    @property
    def gpu_threads(self) -> GpuThreads[Device]:
        """The threads the GPUs are read in, for an on-demand trace's calls beside the cycle's
        jobs (`exporter.trace`)."""
        return self._nvml.gpu_threads

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The loop's task, once `begin` started it."""
        return self._task

    def begin(self) -> asyncio.Task[None]:
        """Run the loop in a task of its own (stopped by `close`)."""
        self._task = asyncio.create_task(self.run(), name="gpuscope-sampling")
        self._task.add_done_callback(self._ended)
        return self._task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            assert error is not None
            self._nvml.count_error()
            self._once.unexpected(("loop",), "the sampling loop died; /-/healthy now fails", error)

    async def run(self) -> None:
        if self._executor is None:
            raise RuntimeError("the sampling loop runs only after start()")
        self._started_at = self._timer()
        next_start = self._clock()
        threads = self._nvml.gpu_threads
        threads.watched = True
        try:
            while True:
                try:
                    self.exposition = await self._watched_cycle()
                    self._completed_at = self._timer()
                except Exception as error:  # noqa: BLE001 - one bad cycle, not the end of sampling
                    await self._cycle_failed(error)
                next_start += self._interval
                now = self._clock()
                if now > next_start:
                    self._overruns += 1
                    next_start += math.ceil((now - next_start) / self._interval) * self._interval
                await asyncio.sleep(next_start - now)
        finally:
            threads.watched = False

    async def _watched_cycle(self) -> Exposition:
        """One cycle in the sampler thread, watched from the loop. The sampler thread reads the
        GPUs that answer fast itself (no hand-off to another thread); should it be stuck in one
        GPU's call (`GpuThreads.stuck_in`), the cycle moves to a fresh sampler thread and runs
        again there (`GpuThreads.move`: the GPUs that answered are not read twice, the deadline
        is the same), and the old thread is left to that GPU."""
        loop = asyncio.get_running_loop()
        slow = self._nvml.gpu_threads.slow_seconds
        while True:
            assert self._executor is not None
            running = self._executor.run(self.cycle)
            self._watch = loop.call_later(slow, self._look, running)
            try:
                return await running
            except CycleMoved:
                continue
            finally:
                self._watch.cancel()

    def _look(self, running: asyncio.Future[Exposition]) -> None:
        """A look at the cycle in flight, on the loop: moved off its thread if stuck in a GPU's
        call, else looked at again when it could be."""
        if running.done():
            return
        threads = self._nvml.gpu_threads
        wait = threads.stuck_in()
        if wait <= 0 and threads.move():
            stuck = self._executor
            self._executor = DaemonExecutor("gpuscope-sampler")
            if stuck is not None:
                stuck.shutdown(wait=False, cancel_futures=True)
            running.set_exception(CycleMoved("the cycle moved to a new sampler thread"))
            return
        delay = wait if wait > 0 else threads.slow_seconds
        self._watch = asyncio.get_running_loop().call_later(delay, self._look, running)

    async def _cycle_failed(self, error: Exception) -> None:
        self._nvml.count_error()
        self._once.unexpected(
            ("cycle",),
            "sampling cycle failed; the next one runs on schedule",
            error,
        )
        # The last snapshot again, with the error counted (its timestamp stays as old as it is).
        with contextlib.suppress(Exception):
            republished = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._republished
            )
            if republished is not None:
                self.exposition = republished

    def cycle(self) -> Exposition:
        """One sampling cycle, start to rendered bytes. Runs in the worker thread."""
        cycle = Cycle()
        for source in self._sources:
            source.collect(cycle)
        cycle.collectors.extend(
            CollectorStatus(task.name, task.healthy, None) for task in self._background
        )
        self._cycles += 1
        snapshot = Snapshot(
            timestamp=self._wall(),
            gpus=cycle.gpus,
            collectors=tuple(cycle.collectors),
            cycles_total=self._cycles,
            overruns_total=self._overruns,
            errors_total=self._nvml.errors_total,
            collect_interval_seconds=self._interval,
            process_series=self._process_series,
            ceilings=cycle.ceilings,
            attribution=cycle.attribution,
            carbon_intensity_grams_per_kwh=self._carbon_intensity,
        )
        self._published = snapshot
        return self._expose(snapshot)

    # -- health --------------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        """Whether a first cycle finished and cycles keep completing (`/-/ready`)."""
        if self.exposition is None:
            return False, "waiting for the first sample"
        return self._current(self.bounds.ready_seconds)

    def alive(self) -> tuple[bool, str]:
        """Whether the loop runs and completes cycles, even if slowly (`/-/healthy`)."""
        return self._current(self.bounds.alive_seconds)

    def _current(self, bound: float) -> tuple[bool, str]:
        if self._task is None or self._task.done():
            return False, "the sampling loop is not running"
        since = self._completed_at if self._completed_at is not None else self._started_at
        if since is not None:
            age = self._timer() - since
            if age > bound:
                return False, f"no sampling cycle finished for {age:.0f}s (limit {bound:.0f}s)"
        return True, "OK"

    # -- events --------------------------------------------------------------------------------

    def _events_arrived(self) -> None:
        """Called by the event thread after it recorded an event."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._republish_soon)

    def _republish_soon(self) -> None:
        if self._closing:
            return
        self._events_pending = True
        if self._republishing is None or self._republishing.done():
            self._republishing = asyncio.create_task(self._republish(), name="gpuscope-republish")
            self._republishing.add_done_callback(self._republish_ended)

    def _republish_ended(self, task: asyncio.Task[None]) -> None:
        """A failed re-publish is counted and logged; the next cycle publishes as usual."""
        if task.cancelled() or (error := task.exception()) is None:
            return
        self._nvml.count_error()
        self._once.unexpected(
            ("republish",),
            "re-publishing after an NVML event failed; the next cycle publishes as usual",
            error,
        )

    async def _republish(self) -> None:
        loop = asyncio.get_running_loop()
        while self._events_pending and self._executor is not None:
            self._events_pending = False  # events recorded from here on republish once more
            republished = await loop.run_in_executor(self._executor, self._republished)
            if republished is not None:
                self.exposition = republished

    def _republished(self) -> Exposition | None:
        """The last snapshot again, with the event counts and error count as they are now.
        Worker thread."""
        if self._published is None:
            return None
        snapshot = replace(
            self._published,
            gpus=self._nvml.overlay_events(self._published.gpus),
            errors_total=self._nvml.errors_total,
        )
        self._published = snapshot
        return self._expose(snapshot)

    def _expose(self, snapshot: Snapshot) -> Exposition:
        """The snapshot's exposition, rendered now in the formats the previous one was scraped in:
        scrapes come at least once a cycle, so they get ready bytes. Otherwise the first scrape
        renders it (scraped every 15 s, 14 of 15 snapshots then cost nothing to render). The
        daemon's own families are read as the snapshot's families are made, in the thread that
        renders it first: reading them (`/proc`, the collector's counts) is most of a cycle's own
        work in the sampler thread, and a snapshot nobody scrapes needs none of it."""
        previous = self.exposition
        own = self._own_families
        return Exposition(
            lambda: [
                *snapshot_families(snapshot, self._build, dcgm=self._dcgm),
                *(own() if own is not None else ()),
            ],
            formats=previous.served if previous is not None else (),
        )

    async def close(self) -> None:
        """Stop the loop, then shut NVML down after any cycle in flight has finished. Whatever
        the tasks ended with (their done-callbacks logged it), NVML, the event thread and the
        workers are closed."""
        self._closing = True
        tasks = [task for task in (self._task, self._republishing) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._events is not None:
            self._events.store.on_change = None
        if self._executor is not None:
            closing = asyncio.wrap_future(self._executor.submit(self._nvml.close))
            try:
                await asyncio.wait_for(closing, CLOSE_SECONDS)
            except TimeoutError:
                # A cycle is stuck in the driver: leave NVML as it is; the thread dies with us.
                log.warning("the sampling thread is stuck in a driver call; not shutting NVML down")
            self._executor.shutdown(wait=False)
            self._executor = None
