"""The policy replay's engine on float64 vectors: any float buffer in, the same answers out,
the workloads' own vectors never written, and each quick path of the search (block maxima, the
MIG first fit that skips full GPUs, the safe sharing by block) giving what the plain step-by-step
reference gives."""

from __future__ import annotations

import heapq
import random
from array import array
from typing import TYPE_CHECKING

import numpy as np
import pytest

from exporter.catalog import builtin_catalog
from exporter.rightsize.hardware import Hardware, Option
from exporter.rightsize.history import Ceilings
from exporter.rightsize.replay.engine import CurrentSteps, Workload, replay
from exporter.rightsize.replay.placement import (
    EPSILON,
    Item,
    pack,
    pack_instances,
    safe_replicas,
)
from exporter.rightsize.replay.policies import POLICIES
from exporter.rightsize.settings import StrategySettings, parse_models

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from exporter.catalog import MigProfile
    from exporter.rightsize.replay.engine import PolicyResult

pytestmark = pytest.mark.timeout(60)

GIB = 1024**3
STEPS = 100
"""Three blocks of 32 steps and a short one: the last block is partial."""


def _levels(rng: random.Random, count: int) -> list[list[float]]:
    """Services with a wave at a random phase, and jobs busy for a stretch."""
    found = []
    for number in range(count):
        if number % 3:
            phase = rng.randrange(STEPS)
            found.append([0.1 + 0.3 * (((t + phase) % 40) < 10) for t in range(STEPS)])
        else:
            start = rng.randrange(STEPS)
            found.append([0.6 if start <= t < start + 30 else 0.0 for t in range(STEPS)])
    return found


def _replay_with(buffer: Callable[[list[float]], Sequence[float]]) -> tuple[PolicyResult, ...]:
    catalog = builtin_catalog()
    a100, l4 = catalog.find("a100-sxm4-80gb"), catalog.find("l4")
    assert a100 is not None
    assert l4 is not None
    rng = random.Random(3)
    kinds = ("Deployment", "StatefulSet", "Job")
    workloads = [
        Workload(
            "",
            "ns",
            kinds[number % 3],
            f"w-{number}",
            Option(a100 if number % 4 else l4),
            buffer(levels),
            rng.uniform(2, 30) * GIB if number % 4 else rng.uniform(1, 10) * GIB,
            devices=2 if number % 5 == 0 else 1,
        )
        for number, levels in enumerate(_levels(rng, 40))
    ]
    return replay(
        workloads,
        CurrentSteps((40.0,) * STEPS, {"a100-sxm4-80gb": 30.0 * STEPS, "l4": 10.0 * STEPS}, 0),
        hardware=Hardware.build(catalog, Ceilings()),
        settings=StrategySettings(models=parse_models("all")),
        policies=POLICIES,
    )


def _read_only(levels: list[float]) -> np.ndarray:
    vector = np.array(levels, dtype=np.float64)
    vector.flags.writeable = False
    return vector


def test_any_float_buffer_gives_the_same_replay_and_none_is_written() -> None:
    # A read-only array: any in-place add on a workload's own vector (the shards' demand can be
    # a view of it) raises instead of changing the input.
    expected = _replay_with(lambda levels: array("d", levels))
    assert _replay_with(list) == expected
    assert _replay_with(tuple) == expected
    assert _replay_with(_read_only) == expected
    for result in expected:
        assert all(type(value) is float for value in result.busy_by_step)
        assert type(result.utilization_mean) is float
    assert {result.policy for result in expected} == set(POLICIES)


def _first_fit_reference(profiles: Sequence[MigProfile]) -> list[list[int]]:
    """First fit decreasing over every GPU, the oldest first, each time."""
    order = sorted(
        range(len(profiles)),
        key=lambda i: (-profiles[i].compute_slices, -profiles[i].memory_slices, i),
    )
    gpus: list[tuple[list[int], list[MigProfile]]] = []

    def takes(held: list[MigProfile], profile: MigProfile) -> bool:
        return (
            sum(p.compute_slices for p in held) + profile.compute_slices <= 7
            and sum(p.memory_slices for p in held) + profile.memory_slices <= 8
            and sum(p.profile == profile.profile for p in held) < profile.max_instances
        )

    for index in order:
        profile = profiles[index]
        gpu = next((gpu for gpu in gpus if takes(gpu[1], profile)), None)
        if gpu is None:
            gpu = ([], [])
            gpus.append(gpu)
        gpu[0].append(index)
        gpu[1].append(profile)
    return [members for members, _ in gpus]


@pytest.mark.parametrize("model_key", ["a100-sxm4-80gb", "h100-sxm"])
def test_mig_first_fit_that_skips_refusing_gpus_is_first_fit(model_key: str) -> None:
    model = builtin_catalog().find(model_key)
    assert model is not None
    rng = random.Random(11)
    for _ in range(20):
        profiles = [rng.choice(model.mig_profiles) for _ in range(rng.randrange(1, 60))]
        assert pack_instances(profiles) == _first_fit_reference(profiles)


def _safe_replicas_reference(items: Sequence[Item], capacity: float, memory: float) -> int:
    peaks = sorted((item.memory for item in items), reverse=True)
    most, held = 0, 0.0
    for peak in peaks:
        if held + peak > memory + EPSILON * max(memory, 1.0):
            break
        held += peak
        most += 1
    for step in range(len(items[0].demand)):
        running, fitting = 0.0, 0
        for value in heapq.nlargest(most, (float(item.demand[step]) for item in items)):
            if running + value > capacity + EPSILON:
                break
            running += value
            fitting += 1
        most = fitting
    return most


def test_safe_sharing_by_blocks_is_the_step_by_step_answer() -> None:
    rng = random.Random(5)
    for _ in range(30):
        items = [
            Item(levels, rng.uniform(1, 20) * GIB) for levels in _levels(rng, rng.randrange(1, 12))
        ]
        assert safe_replicas(items, capacity=0.8, memory=80 * GIB) == _safe_replicas_reference(
            items, 0.8, 80 * GIB
        )


def test_every_packed_gpu_holds_at_every_step() -> None:
    rng = random.Random(9)
    items = [Item(levels, rng.uniform(1, 20) * GIB) for levels in _levels(rng, 60)]
    groups = pack(items, capacity=0.8, memory=80 * GIB)
    assert sorted(index for group in groups for index in group) == list(range(60))
    for group in groups:
        if len(group) == 1:
            continue
        assert sum(items[i].memory for i in group) <= 80 * GIB
        for step in range(STEPS):
            assert sum(float(items[i].demand[step]) for i in group) <= 0.8 + EPSILON
