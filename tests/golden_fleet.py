"""The golden fleet's exposition: tests/fixtures/fleets/golden.yaml sampled for five cycles on a
manual clock, so every value is fixed. tests/test_golden.py compares it with tests/golden/;
tests/test_exposition.py renders its families through both renderers."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.config import ServeConfig
from exporter.metrics.exposition import OPENMETRICS, TEXT
from exporter.metrics.families import BuildInfo
from exporter.sampling import SamplingLoop
from exporter.simulator import SimulatedNvml, load_fleet
from tests.helpers import FLEETS, ManualClock

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.metrics.exposition import Exposition

WALL_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


async def render_families() -> list[Metric]:
    """The families of the golden fleet after five deterministic cycles."""
    return (await golden_exposition()).families


async def render_fleet() -> tuple[bytes, bytes]:
    """The golden fleet's /metrics, as text and as OpenMetrics."""
    exposition = await golden_exposition()
    return exposition.render(TEXT).body, exposition.render(OPENMETRICS).body


async def golden_exposition() -> Exposition:
    clock = ManualClock()
    wall = lambda: WALL_START + clock()  # noqa: E731 - a clock is a function
    driver = SimulatedNvml(load_fleet(FLEETS / "golden.yaml"), clock=clock, wall=wall)
    sampling = SamplingLoop(
        # every collector, the ones off by default too: the golden file holds every family
        replace(
            ServeConfig(), collect_interval=1.0, collector_processes=True, collector_nvlink=True
        ),
        driver,
        build=BuildInfo(version="0.0.0+golden", python_version="3.11.0"),
        clock=clock,
        wall=wall,
    )
    await sampling.start()
    try:
        for _ in range(5):
            exposition = sampling.cycle()
            clock.advance(1.0)
    finally:
        await sampling.close()
    return exposition
