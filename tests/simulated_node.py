"""A simulated, attributed node sampled in process on a manual clock: the simulator's GPUs and
pods, the attributor over them and the sampling loop, started and closed together. For tests and
benchmarks that count or trace what a node serves without a daemon process."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.sampling import SamplingLoop
from exporter.simulator import SimulatedNvml
from exporter.simulator.cluster import simulated_attributor
from tests.golden_fleet import WALL_START
from tests.helpers import ManualClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from exporter.config import ServeConfig
    from exporter.metrics.families import BuildInfo
    from exporter.simulator.fleet import Fleet


@contextlib.asynccontextmanager
async def sampled_node(
    fleet: Fleet, config: ServeConfig, *, node: str, build: BuildInfo
) -> AsyncIterator[tuple[SamplingLoop, ManualClock]]:
    """The started sampling loop of `fleet` as node `node` under `config` (sampling every
    second), and the clock to advance between its cycles; the wall clock starts at WALL_START."""
    clock = ManualClock()
    wall = lambda: WALL_START + clock()  # noqa: E731 - a clock is a function
    attributor = simulated_attributor(fleet, node=node)
    sampling = SamplingLoop(
        replace(config, collect_interval=1.0, node_name=node),
        SimulatedNvml(fleet, clock=clock, wall=wall),
        build=build,
        clock=clock,
        wall=wall,
        attributor=attributor,
    )
    attributor.start()
    await sampling.start()
    try:
        yield sampling, clock
    finally:
        await sampling.close()
        attributor.stop()
