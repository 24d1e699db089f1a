"""How simulated GPUs behave: pure functions of (seed, process, time).

Noise comes from hashing integers, not from a random generator's state, so a value depends only
on the seed and the instant asked about. Same seed, same clock readings: same numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from exporter.simulator.fleet import SimProcess

_MASK: Final = (1 << 64) - 1


def noise(*keys: int) -> float:
    """A deterministic value in [0, 1) for a tuple of integers (splitmix64 over the keys)."""
    state = 0x9E3779B97F4A7C15
    for key in keys:
        state = (state ^ (key & _MASK)) + 0x9E3779B97F4A7C15 & _MASK
        state = (state ^ (state >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        state = (state ^ (state >> 27)) * 0x94D049BB133111EB & _MASK
        state ^= state >> 31
    return (state >> 11) / float(1 << 53)


def running(process: SimProcess, t: float) -> bool:
    return process.start <= t and (process.stop is None or t < process.stop)


def demand(process: SimProcess, seed: int, t: float) -> float:
    """Share of time this process would keep the GPU busy at time t, if it had the GPU alone."""
    second = math.floor(t)
    jitter = noise(seed, process.pid, second)
    level = process.level
    match process.pattern:
        case "idle":
            return 0.0
        case "steady":
            value = level * (0.94 + 0.12 * jitter)
        case "bursty":
            slot = math.floor(t / process.period)
            on = noise(seed, process.pid, slot, 1) < process.duty
            value = level * (0.85 + 0.3 * jitter) if on else 0.02 * jitter
        case "sawtooth":
            value = level * ((t - process.start) / process.period % 1.0)
        case "input_starved":
            # Short bursts of work between long waits for data: busy `duty` of the time.
            value = level * process.duty * (0.8 + 0.4 * jitter)
        case _:  # pragma: no cover - fleet parsing admits only the patterns above
            raise ValueError(process.pattern)
    return min(max(value, 0.0), 1.0)


def lag(current: float, target: float, elapsed: float, time_constant: float) -> float:
    """First-order approach of `current` towards `target` (how power and heat follow load)."""
    if elapsed <= 0:
        return current
    return target + (current - target) * math.exp(-elapsed / time_constant)
