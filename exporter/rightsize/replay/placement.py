"""Pure placement search: per-step demand vectors onto as few GPUs as hold them at every step.

`pack` is first-fit decreasing on the vectors (largest peak first, then largest total, then
memory; the input order breaks ties, so the answer is deterministic), then an improvement pass
that tries to empty the least loaded GPUs into the others. A GPU holds a set of items when their
summed demand stays within `capacity` at every step and their summed memory peaks within
`memory`: the check is exact, step by step; scalar bounds (summed totals, summed peaks) only
decide quickly what the full check would. An item that cannot share at all (its own peak over
`capacity`, or its memory over `memory`) gets a GPU of its own.

`pack_instances` places MIG instances on GPUs by the layouts a GPU allows, as the catalog
describes them (`consolidation.py` counts the same way): at most 7 compute and 8 memory slices,
and no more instances of a profile than the model allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import add
from typing import TYPE_CHECKING, Final

from exporter.rightsize.hardware import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.catalog import MigProfile

EPSILON: Final = 1e-9
"""Sums of floats that are equal on paper may differ in the last bit."""
IMPROVEMENT_ATTEMPTS: Final = 64
"""How many of the least loaded GPUs the improvement pass tries to empty: each attempt costs a
first-fit of its items over every other GPU."""


@dataclass(frozen=True, slots=True)
class Item:
    """What one workload (or one of its replicas' devices) needs from a GPU."""

    demand: Sequence[float]
    """Per step of the window, in GPUs of the model packed onto."""
    memory: float
    """Peak bytes over the window."""
    peak: float = field(init=False)
    total: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak", max(self.demand, default=0.0))
        object.__setattr__(self, "total", sum(self.demand))


@dataclass(slots=True)
class _Bin:
    load: list[float]
    memory: float
    peak: float
    total: float
    members: list[int]


def _fits(gpu: _Bin, item: Item, capacity: float, memory: float, steps: int) -> bool:
    if gpu.memory + item.memory > memory + EPSILON * max(memory, 1.0):
        return False
    if gpu.peak + item.peak <= capacity + EPSILON:
        return True
    if gpu.total + item.total > capacity * steps + EPSILON * steps:
        return False
    highest: float = max(map(add, gpu.load, item.demand))
    return highest <= capacity + EPSILON


def _put(gpu: _Bin, index: int, item: Item) -> None:
    gpu.load = list(map(add, gpu.load, item.demand))
    gpu.memory += item.memory
    gpu.peak = max(gpu.load, default=0.0)
    gpu.total += item.total
    gpu.members.append(index)


def shareable(item: Item, *, capacity: float, memory: float) -> bool:
    """Whether the item fits a GPU at all under the constraints (else it needs one alone)."""
    return item.peak <= capacity + EPSILON and item.memory <= memory + EPSILON * max(memory, 1.0)


def pack(items: Sequence[Item], *, capacity: float, memory: float) -> list[list[int]]:
    """The items' indexes grouped by GPU: every group's summed demand within `capacity` at every
    step and summed memory within `memory`, except an item that cannot share, alone."""
    steps = max((len(item.demand) for item in items), default=0)
    order = sorted(
        range(len(items)),
        key=lambda i: (-items[i].peak, -items[i].total, -items[i].memory, i),
    )
    gpus: list[_Bin] = []
    alone: list[list[int]] = []
    for index in order:
        item = items[index]
        if not shareable(item, capacity=capacity, memory=memory):
            alone.append([index])
            continue
        for gpu in gpus:
            if _fits(gpu, item, capacity, memory, steps):
                _put(gpu, index, item)
                break
        else:
            gpu = _Bin([0.0] * steps, 0.0, 0.0, 0.0, [])
            _put(gpu, index, item)
            gpus.append(gpu)
    _improve(gpus, items, capacity=capacity, memory=memory, steps=steps)
    return [gpu.members for gpu in gpus] + alone


def _improve(
    gpus: list[_Bin], items: Sequence[Item], *, capacity: float, memory: float, steps: int
) -> None:
    """Try to empty the least loaded GPUs, one at a time, into the others (first fit); a GPU
    whose items do not all find room elsewhere is left as it was."""
    candidates = sorted(range(len(gpus)), key=lambda g: (gpus[g].total, g))
    emptied: set[int] = set()
    for source in candidates[:IMPROVEMENT_ATTEMPTS]:
        others = [g for g in range(len(gpus)) if g != source and g not in emptied]
        trial = {
            g: _Bin(gpus[g].load, gpus[g].memory, gpus[g].peak, gpus[g].total, []) for g in others
        }
        moved: dict[int, list[int]] = {}
        for index in sorted(gpus[source].members, key=lambda i: (-items[i].peak, i)):
            target = next(
                (g for g in others if _fits(trial[g], items[index], capacity, memory, steps)),
                None,
            )
            if target is None:
                break
            _put(trial[target], index, items[index])
            moved.setdefault(target, []).append(index)
        else:
            for target, indexes in moved.items():
                gpu = trial[target]
                gpus[target].load, gpus[target].memory = gpu.load, gpu.memory
                gpus[target].peak, gpus[target].total = gpu.peak, gpu.total
                gpus[target].members.extend(indexes)
            gpus[source].members = []
            emptied.add(source)
    gpus[:] = [gpu for g, gpu in enumerate(gpus) if g not in emptied]


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
    """MIG instances of one model, by index, grouped by GPU (first-fit decreasing on slices)."""
    order = sorted(
        range(len(profiles)),
        key=lambda i: (-profiles[i].compute_slices, -profiles[i].memory_slices, i),
    )
    gpus: list[_MigGpu] = []
    for index in order:
        profile = profiles[index]
        gpu = next((gpu for gpu in gpus if gpu.fits(profile)), None)
        if gpu is None:
            gpu = _MigGpu()
            gpus.append(gpu)
        gpu.add(index, profile)
    return [gpu.members for gpu in gpus]
