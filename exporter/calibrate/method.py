"""The measuring method, the same for every figure.

1. Warm up: run the work in doubling batches until `warmup_seconds` were spent, so clocks,
   caches and the allocator settle; the last batch says how long one iteration takes.
2. Size a trial: enough back-to-back iterations to last `trial_seconds`, so timer resolution and
   per-trial overhead vanish in the total.
3. Time `trials` trials. On a GPU, CUDA events recorded on the stream around the batch time what
   the GPU did; on the CPU, the monotonic clock around the batch.
4. Report the median, the extremes and the spread ((max - min) / median); a spread above
   `unstable_spread` marks the figure unstable (throttling, a noisy neighbour, a busy host).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_MAX_WARMUP_BATCHES: Final = 40


@dataclass(frozen=True, slots=True)
class MethodSettings:
    warmup_seconds: float
    trial_seconds: float
    trials: int
    unstable_spread: float = 0.10
    max_iterations: int = 100_000


@dataclass(frozen=True, slots=True)
class Summary:
    """The trials of one measurement, in the unit the caller chose (a rate or a time)."""

    median: float
    minimum: float
    maximum: float
    trials: int

    @property
    def spread(self) -> float:
        return (self.maximum - self.minimum) / self.median if self.median else math.inf

    def unstable(self, bound: float) -> bool:
        return self.spread > bound


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("no trials to summarise")
    return Summary(statistics.median(values), min(values), max(values), len(values))


class Timer(Protocol):
    name: str

    def seconds(self, work: Callable[[], object], iterations: int) -> float:
        """Run `work` `iterations` times back to back; the time the device spent on them."""
        ...


class MonotonicTimer:
    """The CPU's monotonic clock: torch's CPU operations finish before they return."""

    name = "monotonic_clock"

    def seconds(self, work: Callable[[], object], iterations: int) -> float:
        started = time.perf_counter_ns()
        for _ in range(iterations):
            work()
        return (time.perf_counter_ns() - started) / 1e9


class CudaEventTimer:
    """CUDA events recorded on the current stream before and after the batch."""

    name = "cuda_events"

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def seconds(self, work: Callable[[], object], iterations: int) -> float:
        start = self._torch.cuda.Event(enable_timing=True)
        end = self._torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            work()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3


def iteration_times(
    work: Callable[[], object], timer: Timer, settings: MethodSettings
) -> list[float]:
    """Seconds per iteration in each trial, after warming up and sizing the trials."""
    iterations = 1
    spent = 0.0
    per_iteration = 0.0
    for _ in range(_MAX_WARMUP_BATCHES):
        elapsed = timer.seconds(work, iterations)
        spent += elapsed
        per_iteration = elapsed / iterations
        if spent >= settings.warmup_seconds:
            break
        iterations = min(iterations * 2, settings.max_iterations)
    per_trial = math.ceil(settings.trial_seconds / max(per_iteration, 1e-9))
    per_trial = max(1, min(per_trial, settings.max_iterations))
    return [timer.seconds(work, per_trial) / per_trial for _ in range(settings.trials)]
