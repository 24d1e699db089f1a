"""The sampling loop: on its own clock, sample every source in one worker thread, build the
snapshot, render it, and publish the result for `/metrics` to serve.

One dedicated thread does all NVML work, so NVML calls are serialised and never block the
event loop; cycles start on a fixed schedule (start + k * interval), and a cycle that outlasts
the interval makes the next start late rather than piling up (counted as an overrun).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from exporter.calibration.source import CeilingsSource
from exporter.catalog import builtin_catalog
from exporter.metrics.exposition import Exposition, FormatDemand
from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import Snapshot
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
        self._nvml = NvmlSampler(driver, collect_processes=config.collect_processes, clock=clock)
        self._ceilings = CeilingsSource(
            catalog or builtin_catalog(), config.calibration_path, clock=clock
        )
        self._cycles = 0
        self._overruns = 0
        self.demand = FormatDemand(clock=clock)
        self.exposition: Exposition | None = None
        """The latest rendered snapshot; None until the first cycle finished."""

    async def start(self) -> None:
        """Start the worker thread and initialise NVML in it.

        Raises `NvmlUnavailable` when there is no NVML library at all.
        """
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuscope-sampler")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._nvml.start)

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
        return Exposition(snapshot_families(snapshot, self._build), formats=self.demand.wanted())

    async def close(self) -> None:
        """Shut NVML down after any cycle in flight has finished, then stop the thread."""
        if self._executor is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._nvml.close)
            self._executor.shutdown(wait=False)
            self._executor = None
