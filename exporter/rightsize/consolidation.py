"""Pure bin-packing: how many GPUs the workloads need now, and after the recommendations.

Each device a workload holds at the end of the window is a `Slot` on a GPU model: a whole GPU
(one GPU each), a MIG instance (packed onto GPUs of that model by compute and memory slices,
first-fit decreasing, no more instances of a profile than the model allows), or a time-sliced
GPU (the pods sharing one keep sharing it), each cluster on GPUs of its own. Utilization is
the mean work (busy time weighted by the slot's share of the GPU) over the GPUs needed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.catalog import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.catalog import GpuModel, MigProfile


@dataclass(frozen=True, slots=True)
class Slot:
    model: GpuModel
    mig_profile: MigProfile | None
    work: float
    """Mean busy time in whole GPUs of `model` (a MIG slice busy half the time: half its share)."""
    shared_uuid: str | None = None
    """A time-sliced device: every slot with this uuid lands on the same GPU."""
    cluster: str = ""
    """Slots of different clusters never share a GPU."""


@dataclass(slots=True)
class _Gpu:
    compute_slices: int = 0
    memory_slices: int = 0
    instances: dict[str, int] = field(default_factory=dict)

    def fits(self, profile: MigProfile) -> bool:
        return (
            self.compute_slices + profile.compute_slices <= MIG_COMPUTE_SLICES
            and self.memory_slices + profile.memory_slices <= MIG_MEMORY_SLICES
            and self.instances.get(profile.profile, 0) < profile.max_instances
        )

    def add(self, profile: MigProfile) -> None:
        self.compute_slices += profile.compute_slices
        self.memory_slices += profile.memory_slices
        self.instances[profile.profile] = self.instances.get(profile.profile, 0) + 1


def pack_mig(profiles: Iterable[MigProfile]) -> int:
    """GPUs needed for these MIG instances of one model (first-fit decreasing)."""
    gpus: list[_Gpu] = []
    ordered = sorted(profiles, key=lambda p: (p.compute_slices, p.memory_slices), reverse=True)
    for profile in ordered:
        for gpu in gpus:
            if gpu.fits(profile):
                gpu.add(profile)
                break
        else:
            gpu = _Gpu()
            gpu.add(profile)
            gpus.append(gpu)
    return len(gpus)


@dataclass(frozen=True, slots=True)
class ModelUsage:
    model: str
    """Display name of the GPU model."""
    gpus: int
    work: float

    @property
    def utilization(self) -> float:
        return self.work / self.gpus if self.gpus else 0.0


def gpus_needed(slots: Iterable[Slot]) -> list[ModelUsage]:
    """Per model (by name): GPUs needed for the slots, packed per cluster, and the work on them."""
    by_model: dict[tuple[str, str], list[Slot]] = defaultdict(list)
    names: dict[str, str] = {}
    for slot in slots:
        by_model[(slot.model.key, slot.cluster)].append(slot)
        names[slot.model.key] = slot.model.name
    totals: dict[str, tuple[int, float]] = {}
    for (key, _), model_slots in sorted(by_model.items()):
        whole = 0
        shared_seen: set[tuple[str, str]] = set()
        mig: list[MigProfile] = []
        for slot in model_slots:
            if slot.shared_uuid is not None:
                identity = (slot.shared_uuid, slot.mig_profile.profile if slot.mig_profile else "")
                if identity in shared_seen:
                    continue
                shared_seen.add(identity)
            if slot.mig_profile is None:
                whole += 1
            else:
                mig.append(slot.mig_profile)
        gpus, work = totals.get(key, (0, 0.0))
        totals[key] = (gpus + whole + pack_mig(mig), work + sum(slot.work for slot in model_slots))
    return [ModelUsage(names[key], gpus, work) for key, (gpus, work) in totals.items()]


@dataclass(frozen=True, slots=True)
class ModelChange:
    model: str
    before: ModelUsage | None
    after: ModelUsage | None

    @property
    def gpus_before(self) -> int:
        return self.before.gpus if self.before else 0

    @property
    def gpus_after(self) -> int:
        return self.after.gpus if self.after else 0

    @property
    def utilization_before(self) -> float | None:
        return self.before.utilization if self.before else None

    @property
    def utilization_after(self) -> float | None:
        return self.after.utilization if self.after else None


@dataclass(frozen=True, slots=True)
class Consolidation:
    models: tuple[ModelChange, ...]

    @property
    def gpus_before(self) -> int:
        return sum(change.gpus_before for change in self.models)

    @property
    def gpus_after(self) -> int:
        return sum(change.gpus_after for change in self.models)

    @property
    def utilization_before(self) -> float:
        work = sum(change.before.work for change in self.models if change.before)
        return work / self.gpus_before if self.gpus_before else 0.0

    @property
    def utilization_after(self) -> float:
        work = sum(change.after.work for change in self.models if change.after)
        return work / self.gpus_after if self.gpus_after else 0.0


def consolidate(before: Iterable[Slot], after: Iterable[Slot]) -> Consolidation:
    now = {usage.model: usage for usage in gpus_needed(before)}
    then = {usage.model: usage for usage in gpus_needed(after)}
    return Consolidation(
        tuple(ModelChange(name, now.get(name), then.get(name)) for name in sorted(now | then))
    )
