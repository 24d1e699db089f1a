"""Pure placement search: per-step demand vectors onto as few GPUs as hold them at every step.

`pack` is first-fit decreasing on the vectors (largest peak first, then largest total, then
memory; the input order breaks ties, so the answer is deterministic), then improvement by
iterated first fit (Culberson's iterated greedy, as for graph colouring): first fit again over
the GPUs' items taken GPU by GPU, fullest GPUs first, kept when it frees GPUs. A GPU holds a set of items when their
summed demand stays within `capacity` at every step and their summed memory peaks within
`memory`: the check is exact, step by step; scalar bounds (summed totals, summed peaks) only
decide quickly what the full check would. An item that cannot share at all (its own peak over
`capacity`, or its memory over `memory`) gets a GPU of its own.

`pack_instances` places MIG instances on GPUs by the layouts a GPU allows, as the catalog
describes them (`consolidation.py` counts the same way): at most 7 compute and 8 memory slices,
and no more instances of a profile than the model allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np

from exporter.catalog import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES
from exporter.rightsize.replay.cut import NEVER

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import ArrayLike, NDArray

    from exporter.catalog import MigProfile
    from exporter.rightsize.replay.cut import Cut

EPSILON: Final = 1e-9
"""Sums of floats that are equal on paper may differ in the last bit."""
BLOCK: Final = 32
"""Steps per block of the quick check: a block's maxima rule most of its steps in or out."""
STRIKES: Final = 16
"""Items in a row an open GPU may refuse before first fit stops trying it: a GPU refusing that
many is as good as full, and trying it again for every item would make the search quadratic."""
CHECK_EVERY: Final = 256
"""Items placed between two looks at the replay's `Cut`: a few milliseconds of work."""
IMPROVEMENT_ROUNDS: Final = 1
"""Rounds of iterated first fit after the first: each is one more first-fit pass (as long as
the first), kept only if it saves a GPU."""


def _block_maxima(values: NDArray[np.float64]) -> NDArray[np.float64]:
    if not len(values):
        return np.zeros(0)
    return np.maximum.reduceat(values, np.arange(0, len(values), BLOCK))


def vector(values: ArrayLike) -> NDArray[np.float64]:
    """Per-step values as a float64 array (a view of any float64 buffer, never written)."""
    return np.asarray(values, dtype=np.float64)


def total(values: NDArray[np.float64]) -> float:
    """The values summed one after the other, as Python's `sum` adds them (numpy's `sum` adds
    pairwise, which may differ in the last bit): the orders and figures that hang on a total
    stay the same whichever way the vector is held."""
    if not len(values):
        return 0.0
    return float(np.cumsum(values)[-1])


@dataclass(frozen=True, slots=True)
class Item:
    """What one workload (or one of its replicas' devices) needs from a GPU."""

    demand: NDArray[np.float64]
    """Per step of the window, in GPUs of the model packed onto (any float sequence given is
    held as a float64 array)."""
    memory: float
    """Peak bytes over the window."""
    peak: float = field(init=False)
    total: float = field(init=False)
    blocks: NDArray[np.float64] = field(init=False)
    """The highest demand in each block of `BLOCK` steps."""

    def __post_init__(self) -> None:
        demand = vector(self.demand)
        blocks = _block_maxima(demand)
        object.__setattr__(self, "demand", demand)
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "peak", float(blocks.max()) if len(blocks) else 0.0)
        object.__setattr__(self, "total", total(demand))


@dataclass(slots=True, eq=False)
class _Bin:
    """An open GPU of a first-fit pass (compared by identity: no two hold the same items)."""

    load: NDArray[np.float64]
    """Its own array, added to in place."""
    memory: float
    total: float
    members: list[int]
    blocks: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    """The highest load in each block of `BLOCK` steps."""
    strikes: int = 0
    """Items refused in a row."""


def _fits(gpu: _Bin, item: Item, capacity: float, memory: float, steps: int) -> bool:
    """Whether the item fits beside what the GPU holds: memory, then the steps: when every
    block's two maxima add up within capacity, every step does (rounding keeps the order of
    sums); else the steps are checked one by one, which is exact."""
    if gpu.memory + item.memory > memory + EPSILON * max(memory, 1.0):
        return False
    if gpu.total + item.total > capacity * steps + EPSILON * steps:
        return False
    limit = capacity + EPSILON
    if not (gpu.blocks + item.blocks > limit).any():
        return True
    return not (gpu.load + item.demand > limit).any()


def _put(gpu: _Bin, index: int, item: Item) -> None:
    gpu.load += item.demand
    gpu.memory += item.memory
    gpu.blocks = _block_maxima(gpu.load)
    gpu.total += item.total
    gpu.members.append(index)


def shareable(item: Item, *, capacity: float, memory: float) -> bool:
    """Whether the item fits a GPU at all under the constraints (else it needs one alone)."""
    return item.peak <= capacity + EPSILON and item.memory <= memory + EPSILON * max(memory, 1.0)


def pack(
    items: Sequence[Item], *, capacity: float, memory: float, cut: Cut = NEVER
) -> list[list[int]]:
    """The items' indexes grouped by GPU: every group's summed demand within `capacity` at every
    step and summed memory within `memory`, except an item that cannot share, alone. `cut` is
    asked every `CHECK_EVERY` items placed."""
    steps = max((len(item.demand) for item in items), default=0)
    order = sorted(
        range(len(items)),
        key=lambda i: (-items[i].peak, -items[i].total, -items[i].memory, i),
    )
    alone = [[i] for i in order if not shareable(items[i], capacity=capacity, memory=memory)]
    single = {i for [i] in alone}
    best = _first_fit(
        [i for i in order if i not in single], items, capacity, memory, steps, cut=cut
    )
    for _ in range(IMPROVEMENT_ROUNDS):
        # Iterated first fit: the GPUs' items again, a GPU's together, the fullest GPUs first.
        # Each GPU's items fit one GPU, so an unbounded first fit in this order never needs more
        # GPUs; the bounded one might, and is then not kept.
        ranked = sorted(best, key=lambda gpu: (-gpu.total, gpu.members[0]))
        again = _first_fit(
            [i for gpu in ranked for i in gpu.members], items, capacity, memory, steps, cut=cut
        )
        if len(again) >= len(best):
            break
        best = again
    return [gpu.members for gpu in best] + alone


def _first_fit(
    order: Sequence[int],
    items: Sequence[Item],
    capacity: float,
    memory: float,
    steps: int,
    *,
    cut: Cut,
) -> list[_Bin]:
    """First fit over the open GPUs, the oldest first. A GPU closes once it cannot hold the
    smallest item still to come (by memory, or by total demand over the window), or after it
    refused `STRIKES` items in a row, so a large set is not searched through its full GPUs
    again and again."""
    gpus: list[_Bin] = []
    open_gpus: list[_Bin] = []
    smallest_memory = [0.0] * (len(order) + 1)
    smallest_total = [0.0] * (len(order) + 1)
    smallest_memory[-1] = smallest_total[-1] = math.inf
    for position in range(len(order) - 1, -1, -1):
        item = items[order[position]]
        smallest_memory[position] = min(smallest_memory[position + 1], item.memory)
        smallest_total[position] = min(smallest_total[position + 1], item.total)
    room = capacity * steps + EPSILON * steps
    for position, index in enumerate(order):
        if position % CHECK_EVERY == 0:
            cut.check()
        item = items[index]
        chosen = None
        refused = []
        for gpu in open_gpus:
            if _fits(gpu, item, capacity, memory, steps):
                chosen = gpu
                break
            gpu.strikes += 1
            if gpu.strikes >= STRIKES:
                refused.append(gpu)
        for gpu in refused:
            open_gpus.remove(gpu)
        if chosen is None:
            chosen = _Bin(np.zeros(steps), 0.0, 0.0, [])
            gpus.append(chosen)
            open_gpus.append(chosen)
        _put(chosen, index, item)
        chosen.strikes = 0
        if (
            chosen.memory + smallest_memory[position + 1] > memory + EPSILON * max(memory, 1.0)
            or chosen.total + smallest_total[position + 1] > room
        ):
            open_gpus.remove(chosen)
    return gpus


def safe_replicas(
    items: Sequence[Item], *, capacity: float, memory: float, cut: Cut = NEVER
) -> int:
    """The most items that fit one GPU together whichever of them they are: the largest R such
    that the R largest memory peaks fit `memory` and, at every step, the R largest demands add up
    within `capacity` (at a step, no R items can ask for more than its R largest). At most
    `len(items)`; 0 when not even one item fits. Block maxima decide most blocks of steps at
    once: when the R largest maxima of a block fit, every step of it does."""
    peaks = sorted((item.memory for item in items), reverse=True)
    most, held = 0, 0.0
    for peak in peaks:
        if held + peak > memory + EPSILON * max(memory, 1.0):
            break
        held += peak
        most += 1
    limit = capacity + EPSILON
    steps = max((len(item.demand) for item in items), default=0)
    blocks = np.stack([item.blocks for item in items]) if items and most else np.zeros((0, 0))
    for number in range(blocks.shape[1]):
        if number % CHECK_EVERY == 0:
            cut.check()
        if _largest_sums(blocks[:, number : number + 1], most)[-1, 0] <= limit:
            continue
        start, end = number * BLOCK, min((number + 1) * BLOCK, steps)
        sums = _largest_sums(np.stack([item.demand[start:end] for item in items]), most)
        over = sums > limit
        # At each step, how many of the largest demands add up within capacity, the largest first.
        fitting = np.where(over.any(axis=0), over.argmax(axis=0), most)
        most = int(fitting.min()) if fitting.size else most
        if most == 0:
            return 0
    return most


def _largest_sums(values: NDArray[np.float64], most: int) -> NDArray[np.float64]:
    """Per column, the running sums of its `most` largest values, the largest first, added one
    after the other (as a loop over them would)."""
    ordered = -np.sort(-values, axis=0)[:most]
    return np.cumsum(ordered, axis=0)


@dataclass(slots=True)
class _MigGpu:
    compute_slices: int = 0
    memory_slices: int = 0
    instances: dict[str, int] = field(default_factory=dict)
    members: list[int] = field(default_factory=list)

    def fits(self, profile: MigProfile) -> bool:
        return (
            self.compute_slices + profile.compute_slices <= MIG_COMPUTE_SLICES
            and self.memory_slices + profile.memory_slices <= MIG_MEMORY_SLICES
            and self.instances.get(profile.profile, 0) < profile.max_instances
        )

    def add(self, index: int, profile: MigProfile) -> None:
        self.compute_slices += profile.compute_slices
        self.memory_slices += profile.memory_slices
        self.instances[profile.profile] = self.instances.get(profile.profile, 0) + 1
        self.members.append(index)


def pack_instances(profiles: Sequence[MigProfile]) -> list[list[int]]:
    """MIG instances of one model, by index, grouped by GPU (first-fit decreasing on slices).

    A GPU only fills up, so one that cannot take a profile never will: the search for a profile
    starts past the GPUs that refused it before (first fit all the same, in linear time)."""
    order = sorted(
        range(len(profiles)),
        key=lambda i: (-profiles[i].compute_slices, -profiles[i].memory_slices, i),
    )
    gpus: list[_MigGpu] = []
    refused: dict[str, int] = {}
    """Profile -> how many GPUs, from the first, cannot take one more instance of it."""
    for index in order:
        profile = profiles[index]
        start = refused.get(profile.profile, 0)
        while start < len(gpus) and not gpus[start].fits(profile):
            start += 1
        refused[profile.profile] = start
        if start == len(gpus):
            gpus.append(_MigGpu())
        gpus[start].add(index, profile)
    return [gpu.members for gpu in gpus]
