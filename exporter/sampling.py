"""The sampling loop: on its own clock, sample every source in one worker thread, build the
snapshot, render it, and publish the result for `/metrics` to serve.

One dedicated thread does all NVML work, so NVML calls are serialised and never block the
event loop; cycles start on a fixed schedule (start + k * interval), and a cycle that outlasts
the interval makes the next start late rather than piling up (counted as an overrun).

Two helper threads do the NVML work that blocks: one waits for XID and ECC events, one reads
PCIe throughput on GPUs without GPM. An event re-publishes the last snapshot at once with the
new counts, so an XID or an ECC error is visible before the next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.calibration.source import CeilingsSource
from exporter.catalog import builtin_catalog
from exporter.metrics.exposition import Exposition
from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import Snapshot
from exporter.nvml.events import EventWatcher
from exporter.nvml.pcie import PcieThroughputReader
from exporter.nvml.sampler import NvmlSampler

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.attribution.attributor import Attributor
    from exporter.catalog import Catalog
    from exporter.config import ServeConfig
    from exporter.nvml.driver import NvmlDriver

log = logging.getLogger(__name__)


class SamplingLoop:
    def __init__(
        self,
        config: ServeConfig,
        driver: NvmlDriver,
        *,
        build: BuildInfo,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        catalog: Catalog | None = None,
        attributor: Attributor | None = None,
    ) -> None:
        self._interval = config.collect_interval
        self._attributor = attributor
        self._build = build
        self._clock = clock
        self._wall = wall
        self._executor: ThreadPoolExecutor | None = None
        self._events = EventWatcher(driver, wall=wall)
        self._nvml = NvmlSampler(
            driver,
            collect_processes=config.collect_processes,
            clock=clock,
            events=self._events,
            pcie=PcieThroughputReader(driver, period=config.collect_interval, clock=clock),
        )
        self._snapshot: Snapshot | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._republishing: asyncio.Task[None] | None = None
        self._events_pending = False
        self._closing = False
        self._ceilings = CeilingsSource(
            catalog or builtin_catalog(), config.calibration_path, clock=clock
        )
        self._cycles = 0
        self._overruns = 0
        self.exposition: Exposition | None = None
        """The latest rendered snapshot; None until the first cycle finished."""

    async def start(self) -> None:
        """Start the worker thread and initialise NVML in it.

        Raises `NvmlUnavailable` when there is no NVML library at all.
        """
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuscope-sampler")
        self._loop = asyncio.get_running_loop()
        self._events.store.on_change = self._events_arrived
        await self._loop.run_in_executor(self._executor, self._nvml.start)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_start = self._clock()
        while True:
            self.exposition = await loop.run_in_executor(self._executor, self.cycle)
            next_start += self._interval
            now = self._clock()
            if now > next_start:
                self._overruns += 1
                next_start += math.ceil((now - next_start) / self._interval) * self._interval
            await asyncio.sleep(next_start - now)

    def cycle(self) -> Exposition:
        """One sampling cycle, start to rendered bytes. Runs in the worker thread."""
        gpus, nvml_status = self._nvml.sample()
        # Profiles are re-read only when their files changed: a few stat() calls per cycle.
        ceilings, calibration_status = self._ceilings.refresh(gpu.identity.model for gpu in gpus)
        attribution, attribution_statuses = (
            self._attributor.attribute(gpus) if self._attributor is not None else (None, ())
        )
        self._cycles += 1
        snapshot = Snapshot(
            timestamp=self._wall(),
            gpus=gpus,
            collectors=(
                nvml_status,
                *((calibration_status,) if calibration_status is not None else ()),
                *attribution_statuses,
            ),
            cycles_total=self._cycles,
            overruns_total=self._overruns,
            ceilings=ceilings,
            attribution=attribution,
        )
        self._snapshot = snapshot
        return self._expose(snapshot)

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

    async def _republish(self) -> None:
        loop = asyncio.get_running_loop()
        while self._events_pending and self._executor is not None:
            self._events_pending = False  # events recorded from here on republish once more
            republished = await loop.run_in_executor(self._executor, self._with_events)
            if republished is not None:
                self.exposition = republished

    def _with_events(self) -> Exposition | None:
        """The last snapshot again, with the event counts as they are now. Worker thread."""
        snapshot = self._snapshot
        if snapshot is None:
            return None
        snapshot = replace(snapshot, gpus=self._nvml.overlay_events(snapshot.gpus))
        return self._expose(snapshot)

    def _expose(self, snapshot: Snapshot) -> Exposition:
        """The snapshot's exposition, rendered now in the formats the previous one was scraped in:
        scrapes come at least once a cycle, so they get ready bytes. Otherwise the first scrape
        renders it (scraped every 15 s, 14 of 15 snapshots then cost nothing to render)."""
        previous = self.exposition
        return Exposition(
            lambda: snapshot_families(snapshot, self._build),
            formats=previous.served if previous is not None else (),
        )

    async def close(self) -> None:
        """Shut NVML down after any cycle in flight has finished, then stop the thread."""
        self._closing = True
        self._events.store.on_change = None
        if self._republishing is not None:
            self._republishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._republishing
        if self._executor is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._nvml.close)
            self._executor.shutdown(wait=False)
            self._executor = None
