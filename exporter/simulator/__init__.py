"""A simulated NVML driver for `--simulate`: realistic GPUs without a GPU.

`fleet` describes what is simulated (from a GPU count or a YAML file), `behaviour` holds the
pure functions that say how busy a process is at time t, and `driver` offers pynvml's functions
over that state, so the production sampler runs unchanged on top of it.
"""

from __future__ import annotations

from exporter.simulator.driver import SimulatedNvml
from exporter.simulator.fleet import Fleet, FleetError, default_fleet, load_fleet

__all__ = ["Fleet", "FleetError", "SimulatedNvml", "default_fleet", "load_fleet"]
