"""Each sharing policy replayed over every step of the window, for the report's workloads.

A workload's demand at a step is its busy time over the step (`steps.py`), in GPUs of its
current model (a MIG instance's busy ratio times its compute share), scaled by the ratio of peak
figures (`Hardware.scale`, the strategy's) when a policy moves it to another model. A workload
holding several devices at the end of the window (replicas, or GPUs per pod) is that many
*shards*, each with an even part of its demand and the memory peak of one of its devices: its
replicas share the load, and each holds its own memory. Its memory need is the peak
`gpu_pod_memory_used_bytes` of its devices over the window.

- `current`: the GPUs held at each step (a MIG instance counts as its share of a GPU, a
  time-sliced GPU once), the busy time on them, the steps a time-sliced GPU was asked for more
  than all of it (`steps.py`).
- `exclusive`: one whole GPU per shard, the smallest (cheapest) model whose one GPU covers its
  demand at the report's percentile and its memory peak.
- `mig`: the cheapest MIG instance whose compute share covers the demand at the percentile and
  whose memory holds the peak, instances packed per GPU by the catalog's layouts
  (`placement.pack_instances`); a shard no instance fits is exclusive.
- `timeslice`: serving shards (Deployments, StatefulSets) share GPUs of their current model,
  summed demand within `--saturation` at every step and summed memory peaks within the GPU;
  the others are exclusive.
- `binpack`: every shard, on the one model (per cluster) that needs the fewest GPUs under the
  same constraints; then the placement of any other policy that needs fewer still.

A fixed placement uses the same GPUs at every step; its figures are recomputed from the vectors
(`evaluate`), never taken from the search. GPUs of different clusters are never shared.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

import numpy as np

from exporter.rightsize.hardware import HOURS_PER_MONTH, Option
from exporter.rightsize.replay.cut import NEVER
from exporter.rightsize.replay.placement import (
    CHECK_EVERY,
    EPSILON,
    Item,
    pack,
    pack_instances,
    safe_replicas,
    shareable,
    total,
    vector,
)
from exporter.rightsize.replay.policies import (
    BINPACK,
    CURRENT,
    EXCLUSIVE,
    MIG,
    SERVING_KINDS,
    TIMESLICE,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from numpy.typing import NDArray

    from exporter.catalog import GpuModel, MigProfile
    from exporter.rightsize.hardware import Hardware
    from exporter.rightsize.replay.cut import Cut
    from exporter.rightsize.settings import StrategySettings

UNPRICED: Final = math.inf

if TYPE_CHECKING:
    _Instance = tuple[tuple[float, int, str, str], MigProfile, float, int]
    """A MIG instance's rank among the others (cheapest first), profile, compute share, memory."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload row of the report, as the replay needs it."""

    cluster: str
    namespace: str
    kind: str
    name: str
    current: Option
    busy: Sequence[float] | NDArray[np.float64]
    """Per step: its devices' busy ratios summed (each of its own device: 1 is all of it); any
    float sequence or buffer (`array('d')`, an ndarray)."""
    memory_bytes: float
    """Peak memory of one of its devices over the window."""
    devices: int = 1
    """Devices it holds at the end of the window: its shards."""
    roofline_side: str | None = None
    shared_uuid: str | None = None
    """The time-sliced GPU it holds today, if any."""
    gpus_per_pod: int = 1

    @property
    def demand(self) -> NDArray[np.float64]:
        """One shard's demand per step, in GPUs of its current model."""
        busy = vector(self.busy)
        part = self.current.compute / self.devices
        if part == 1.0:
            return busy
        return busy * part


@dataclass(frozen=True, slots=True)
class CurrentSteps:
    """What the cluster held and contended, step by step (`steps.py`)."""

    held: tuple[float, ...]
    """GPUs held at each step (a MIG instance counted as its share)."""
    held_by_model: dict[str, float]
    """Catalog key -> GPU-steps held over the window (summed over the steps)."""
    contended_steps: int
    unpriced: bool = False
    """Some GPU held is of a model without a price (or not in the catalog)."""


@dataclass(frozen=True, slots=True)
class Placement:
    cluster: str
    namespace: str
    kind: str
    workload: str
    gpu_model: str
    mig_profile: str | None
    group: str | None


@dataclass(frozen=True, slots=True)
class GpuCount:
    p50: float
    p95: float
    max: float


@dataclass(frozen=True, slots=True)
class SharedPool:
    """The time-sliced GPUs of one model in one cluster in a placement, as the NVIDIA device
    plugin could make them: every GPU of the pool's nodes shared `replicas` ways, and the
    scheduler free to put any `replicas` of the pool's pods on one GPU."""

    cluster: str
    model_key: str
    gpu_model: str
    gpus: int
    """Time-sliced GPUs the placement uses for them."""
    members: tuple[tuple[str, str, str], ...]
    """(namespace, kind, workload) of each workload with a pod in the pool, sorted."""
    pods: int
    """Devices the pool hands out: one per replica and GPU asked."""
    largest_group: int
    """The most devices the placement puts on one GPU."""
    replicas: int
    """The safe sharing: any `replicas` of the pool's devices together fit the GPU's memory and
    keep within `--saturation` at every step (0: not even one fits)."""
    multi_gpu_pods: bool
    """Some pod of the pool asks for more than one GPU (the plugin may give it two replicas of
    one GPU)."""

    @property
    def gpus_needed(self) -> int:
        """GPUs the pool needs shared `replicas` ways (at least the placement's)."""
        if self.replicas <= 0:
            return self.pods
        return max(self.gpus, math.ceil(self.pods / self.replicas))


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    gpus: GpuCount
    utilization_mean: float
    contention_share: float
    memory_overcommit_steps: int
    cost_usd_per_month: float | None
    placements: tuple[Placement, ...]
    models: tuple[tuple[str, float], ...] = ()
    """GPU model names and their GPUs (at most), most first."""
    gpus_by_step: tuple[float, ...] = ()
    """GPUs at each step, oldest first: for `current` those held, for a fixed placement its
    GPUs at every step (what the HTML report draws)."""
    busy_by_step: tuple[float, ...] = ()
    """Busy GPU-equivalents at each step: the demand the GPUs carry, in GPUs of the models they
    are (summed over the placement's GPUs)."""
    pools: tuple[SharedPool, ...] = ()
    """Its time-sliced GPUs per cluster and model, with the sharing that is safe for any of
    their pods together (`placement.safe_replicas`)."""


@dataclass(slots=True)
class _Shard:
    workload: Workload
    demand: NDArray[np.float64]
    """Never written: it may be a view of the workload's own vector."""
    need: float
    """Its demand at the report's percentile."""

    def on(self, scale: float) -> _Shard:
        """The same shard with its demand in GPUs of a model `scale` times smaller."""
        if scale == 1.0:
            return self
        return _Shard(self.workload, self.demand * scale, self.need * scale)


@dataclass(slots=True)
class _Gpu:
    """A simulated GPU and the shards on it (with their MIG profile, or None: time-sliced)."""

    model: GpuModel
    cluster: str
    members: list[tuple[_Shard, MigProfile | None]]
    group: str | None = None


class _Context:
    def __init__(
        self, hardware: Hardware, settings: StrategySettings, steps: int, *, cut: Cut = NEVER
    ) -> None:
        self.hardware = hardware
        self.settings = settings
        self.steps = steps
        self.cut = cut
        self.allowed = hardware.target_models(settings.models)
        self.scales: dict[tuple[str, str, str | None], float | None] = {}
        """(current model, target model, roofline side) -> `Hardware.scale`, asked once."""
        self._instances: dict[str, list[_Instance]] = {}

    def instances(self, model: GpuModel) -> list[_Instance]:
        """The model's MIG instances, each with its rank (price first), compute share and
        memory: the same for every shard, so worked out once."""
        found = self._instances.get(model.key)
        if found is None:
            found = []
            for profile in model.mig_profiles:
                option = Option(model, profile)
                rank = (
                    self.price(model) * option.share,
                    profile.compute_slices,
                    model.key,
                    profile.profile,
                )
                found.append((rank, profile, option.compute, option.memory_bytes))
            self._instances[model.key] = found
        return found

    def price(self, model: GpuModel) -> float:
        price = self.hardware.price(model)
        return UNPRICED if price is None else price

    def scale(self, shard: _Shard, model: GpuModel) -> float | None:
        current = shard.workload.current.model
        side = shard.workload.roofline_side
        key = (current.key, model.key, side)
        if key not in self.scales:
            self.scales[key] = self.hardware.scale(current, model, self.settings.dtype, side)
        return self.scales[key]

    def models_for(self, shard: _Shard) -> list[GpuModel]:
        """Its current model, then the models `--models` allows."""
        current = shard.workload.current.model
        return [current, *(m for m in self.allowed if m.key != current.key)]

    def percentile(self, values: NDArray[np.float64]) -> float:
        """The nearest-rank percentile (`_nearest_rank`), its one value put in place."""
        if not len(values):
            return 0.0
        rank = _rank(len(values), self.settings.percentile)
        return float(np.partition(values, rank)[rank])


def _nearest_rank(ordered: Sequence[float], quantile: float) -> float:
    if not ordered:
        return 0.0
    return ordered[_rank(len(ordered), quantile)]


def _rank(count: int, quantile: float) -> int:
    return min(count - 1, max(0, math.ceil(quantile * count) - 1))


def replay(
    workloads: Sequence[Workload],
    current: CurrentSteps,
    *,
    hardware: Hardware,
    settings: StrategySettings,
    policies: Sequence[str],
    cut: Cut = NEVER,
) -> tuple[PolicyResult, ...]:
    """The requested policies' results, in the order asked. `cut` is asked between policies
    and within their placement passes (`ReplayCut` ends the replay there)."""
    steps = len(current.held)
    context = _Context(hardware, settings, steps, cut=cut)
    shards = []
    for workload in workloads:
        demand = workload.demand
        shard = _Shard(workload, demand, context.percentile(demand))
        shards += [shard] * workload.devices
    done: dict[str, PolicyResult] = {}

    def result(policy: str) -> PolicyResult:
        """Each policy placed, evaluated, and its placement dropped (only one policy's scaled
        vectors are alive at a time)."""
        if policy in done:
            return done[policy]
        context.cut.check()
        if policy == CURRENT:
            done[policy] = _current(workloads, current, context)
        elif policy == BINPACK:
            own = evaluate(BINPACK, _binpack(shards, context), context)
            others = [result(other) for other in (EXCLUSIVE, MIG, TIMESLICE)]
            best = min([own, *others], key=lambda r: (r.gpus.max, _usd(r)))
            done[policy] = own if best is own else replace(best, policy=BINPACK)
        else:
            done[policy] = evaluate(policy, PLACERS[policy](shards, context), context)
        return done[policy]

    return tuple(result(policy) for policy in policies)


def _usd(result: PolicyResult) -> float:
    cost = result.cost_usd_per_month
    return UNPRICED if cost is None else cost


def _current(
    workloads: Sequence[Workload], current: CurrentSteps, context: _Context
) -> PolicyResult:
    held = current.held
    steps = max(len(held), 1)
    busy_by_step = np.zeros(len(held))
    busy = 0.0
    for w in workloads:
        compute = w.current.compute
        ratios = vector(w.busy)
        busy_by_step += ratios if compute == 1.0 else ratios * compute
        busy += total(ratios) * compute
    gpu_steps = sum(held)
    cost: float | None = None
    if not current.unpriced:
        cost = 0.0
        for key, model_steps in current.held_by_model.items():
            model = context.hardware.catalog.by_key(key)
            price = context.hardware.price(model) if model is not None else None
            if price is None:
                cost = None
                break
            cost += model_steps / steps * price * HOURS_PER_MONTH
    ordered = sorted(held)
    models: dict[str, float] = defaultdict(float)
    for key, model_steps in current.held_by_model.items():
        model = context.hardware.catalog.by_key(key)
        models[model.name if model else key] += model_steps / steps
    return PolicyResult(
        CURRENT,
        GpuCount(_nearest_rank(ordered, 0.5), _nearest_rank(ordered, 0.95), max(held, default=0)),
        utilization_mean=min(busy / gpu_steps, 1.0) if gpu_steps else 0.0,
        contention_share=current.contended_steps / steps,
        memory_overcommit_steps=0,
        cost_usd_per_month=cost,
        placements=tuple(
            Placement(
                w.cluster,
                w.namespace,
                w.kind,
                w.name,
                w.current.model.name,
                w.current.mig_profile.profile if w.current.mig_profile else None,
                w.shared_uuid,
            )
            for w in workloads
        ),
        models=tuple(sorted(models.items(), key=lambda pair: (-pair[1], pair[0]))),
        gpus_by_step=tuple(held),
        busy_by_step=tuple(busy_by_step.tolist()),
    )


def _exclusive_model(shard: _Shard, context: _Context) -> tuple[GpuModel, _Shard]:
    """The cheapest model one GPU of which covers the shard's demand at the percentile and its
    memory peak (its current model if none does), and the shard's demand there."""
    best: tuple[tuple[float, int, str], GpuModel, float] | None = None
    for model in context.models_for(shard):
        scale = context.scale(shard, model)
        if scale is None or shard.workload.memory_bytes > model.nvml_memory_bytes:
            continue
        if shard.need * scale > 1 + EPSILON:
            continue
        rank = (context.price(model), model.nvml_memory_bytes, model.key)
        if best is None or rank < best[0]:
            best = (rank, model, scale)
    if best is None:
        return shard.workload.current.model, shard
    return best[1], shard.on(best[2])


def _exclusive(shards: list[_Shard], context: _Context) -> list[_Gpu]:
    gpus = []
    for shard in shards:
        model, moved = _exclusive_model(shard, context)
        gpus.append(_Gpu(model, shard.workload.cluster, [(moved, None)]))
    return gpus


def _mig(shards: list[_Shard], context: _Context) -> list[_Gpu]:
    """The cheapest fitting instance per shard, packed per cluster and model."""
    chosen: dict[tuple[str, str], list[tuple[_Shard, MigProfile]]] = defaultdict(list)
    models: dict[str, GpuModel] = {}
    rest = []
    for shard in shards:
        best: tuple[tuple[float, int, str, str], GpuModel, MigProfile, float] | None = None
        for model in context.models_for(shard):
            scale = context.scale(shard, model)
            if scale is None or not model.mig_profiles:
                continue
            need = shard.need * scale
            for rank, profile, compute, memory in context.instances(model):
                if need > compute + EPSILON or shard.workload.memory_bytes > memory:
                    continue
                if best is None or rank < best[0]:
                    best = (rank, model, profile, scale)
        if best is None:
            rest.append(shard)
            continue
        _, model, profile, scale = best
        models[model.key] = model
        chosen[(shard.workload.cluster, model.key)].append((shard.on(scale), profile))
    gpus = _exclusive(rest, context)
    for (cluster, key), members in sorted(chosen.items()):
        for number, indexes in enumerate(pack_instances([p for _, p in members]), start=1):
            gpus.append(
                _Gpu(
                    models[key],
                    cluster,
                    [members[i] for i in indexes],
                    _group_name(cluster, key, number, "mig"),
                )
            )
    return gpus


def _timeslice(shards: list[_Shard], context: _Context) -> list[_Gpu]:
    serving: dict[tuple[str, str], list[_Shard]] = defaultdict(list)
    rest = []
    for shard in shards:
        model = shard.workload.current.model
        item = Item(shard.demand, shard.workload.memory_bytes)
        if (
            shard.workload.kind in SERVING_KINDS
            and shard.workload.current.mig_profile is None
            and shareable(
                item, capacity=context.settings.saturation, memory=model.nvml_memory_bytes
            )
        ):
            serving[(shard.workload.cluster, model.key)].append(shard)
        else:
            rest.append(shard)
    gpus = _exclusive(rest, context)
    for (cluster, _), members in sorted(serving.items()):
        gpus += _shared(members, members[0].workload.current.model, cluster, context)
    return gpus


def _shared(members: list[_Shard], model: GpuModel, cluster: str, context: _Context) -> list[_Gpu]:
    """Shards (their demand already in GPUs of `model`) packed onto time-sliced GPUs."""
    items = [Item(shard.demand, shard.workload.memory_bytes) for shard in members]
    groups = pack(
        items,
        capacity=context.settings.saturation,
        memory=model.nvml_memory_bytes,
        cut=context.cut,
    )
    gpus = []
    for number, indexes in enumerate(groups, start=1):
        group = _group_name(cluster, model.key, number, "shared") if len(indexes) > 1 else None
        gpus.append(_Gpu(model, cluster, [(members[i], None) for i in indexes], group))
    return gpus


def _binpack(shards: list[_Shard], context: _Context) -> list[_Gpu]:
    """Per cluster, the model whose GPUs hold its shards with the fewest GPUs (branch and bound
    on a lower bound, so most models are never packed)."""
    clusters: dict[str, list[_Shard]] = defaultdict(list)
    for shard in shards:
        clusters[shard.workload.cluster].append(shard)
    own: list[_Gpu] = []
    for cluster, members in sorted(clusters.items()):
        own += _binpack_cluster(cluster, members, context)
    return own


def _binpack_cluster(cluster: str, members: list[_Shard], context: _Context) -> list[_Gpu]:
    saturation = context.settings.saturation
    models = {m.key: m for shard in members for m in context.models_for(shard)}
    totals = [total(shard.demand) for shard in members]
    bounds = []
    for model in models.values():
        scaled = [context.scale(shard, model) for shard in members]
        if any(scale is None for scale in scaled):
            continue
        work = sum(t * (scale or 0.0) for t, scale in zip(totals, scaled, strict=True))
        memory = sum(s.workload.memory_bytes for s in members)
        bound = max(work / (saturation * max(context.steps, 1)), memory / model.nvml_memory_bytes)
        bounds.append((math.ceil(bound - EPSILON), context.price(model), model.key, model))
    best: list[_Gpu] | None = None
    for bound, _, _, model in sorted(bounds, key=lambda entry: entry[:3]):
        if best is not None and bound >= len(best):
            break
        context.cut.check()
        fitting, rest = [], []
        for shard in members:
            scale = context.scale(shard, model) or 0.0
            moved = shard.on(scale)
            item = Item(moved.demand, shard.workload.memory_bytes)
            if shareable(item, capacity=saturation, memory=model.nvml_memory_bytes):
                fitting.append(moved)
            else:
                rest.append(shard)
        gpus = _exclusive(rest, context) + _shared(fitting, model, cluster, context)
        if best is None or (len(gpus), _cost(gpus, context)) < (len(best), _cost(best, context)):
            best = gpus
    return best if best is not None else _exclusive(members, context)


PLACERS: Final[dict[str, Callable[[list[_Shard], _Context], list[_Gpu]]]] = {
    EXCLUSIVE: _exclusive,
    MIG: _mig,
    TIMESLICE: _timeslice,
}
"""How each policy places but `binpack`, which `replay` weighs against the others' results."""


def _group_name(cluster: str, key: str, number: int, kind: str) -> str:
    name = f"{kind}-{key}-{number}"
    return f"{cluster}/{name}" if cluster else name


def _cost(gpus: Sequence[_Gpu], context: _Context) -> float:
    return sum(context.price(gpu.model) for gpu in gpus)


def evaluate(policy: str, gpus: Sequence[_Gpu], context: _Context) -> PolicyResult:
    """A fixed placement's figures, recomputed from the demand vectors on each GPU."""
    steps = context.steps
    limit = 1 + EPSILON
    contended = np.zeros(steps, dtype=np.bool_)
    overcommitted = False
    busy = 0.0
    busy_by_step = np.zeros(steps)
    for number, gpu in enumerate(gpus):
        if number % CHECK_EVERY == 0:
            context.cut.check()
        if any(profile is not None for _, profile in gpu.members):
            for shard, profile in gpu.members:
                option = Option(gpu.model, profile)
                overcommitted |= shard.workload.memory_bytes > option.memory_bytes
                contended |= shard.demand > option.compute + EPSILON
                busy += total(shard.demand)
                busy_by_step += shard.demand
            continue
        load = _load(gpu, steps)
        busy += total(load)
        busy_by_step += load
        memory_peaks = sum(shard.workload.memory_bytes for shard, _ in gpu.members)
        overcommitted |= memory_peaks > gpu.model.nvml_memory_bytes
        contended |= load > limit
    count = len(gpus)
    cost: float | None = sum(context.price(gpu.model) for gpu in gpus) * HOURS_PER_MONTH
    if cost == UNPRICED:
        cost = None
    models: dict[str, float] = defaultdict(float)
    for gpu in gpus:
        models[gpu.model.name] += 1
    return PolicyResult(
        policy,
        GpuCount(count, count, count),
        utilization_mean=busy / (count * steps) if count and steps else 0.0,
        contention_share=int(np.count_nonzero(contended)) / steps if steps else 0.0,
        memory_overcommit_steps=steps if overcommitted else 0,
        cost_usd_per_month=cost,
        placements=tuple(_placements(gpus)),
        models=tuple(sorted(models.items(), key=lambda pair: (-pair[1], pair[0]))),
        gpus_by_step=(float(count),) * steps,
        busy_by_step=tuple(busy_by_step.tolist()),
        pools=_pools(gpus, context),
    )


def _load(gpu: _Gpu, steps: int) -> NDArray[np.float64]:
    """The summed demand of a time-sliced GPU's shards per step, added in their order (a GPU of
    one shard: its own vector, not copied and never written)."""
    if len(gpu.members) == 1:
        return gpu.members[0][0].demand
    load = np.zeros(steps)
    for shard, _ in gpu.members:
        load += shard.demand
    return load


def _pools(gpus: Sequence[_Gpu], context: _Context) -> tuple[SharedPool, ...]:
    """The time-sliced GPUs (a group of several shards, none on a MIG instance), per cluster
    and model."""
    pooled: dict[tuple[str, str], list[_Gpu]] = defaultdict(list)
    for gpu in gpus:
        if len(gpu.members) > 1 and all(profile is None for _, profile in gpu.members):
            pooled[(gpu.cluster, gpu.model.key)].append(gpu)
    pools = []
    for (cluster, key), shared in sorted(pooled.items()):
        # Every pod of a member workload goes to the pool (one pod template for them all),
        # also those the search put elsewhere: each counts in the safe sharing.
        one: dict[int, _Shard] = {}
        for gpu in shared:
            for shard, _ in gpu.members:
                one.setdefault(id(shard.workload), shard)
        shards = [shard for shard in one.values() for _ in range(shard.workload.devices)]
        model = shared[0].model
        items = [Item(shard.demand, shard.workload.memory_bytes) for shard in shards]
        replicas = safe_replicas(
            items,
            capacity=context.settings.saturation,
            memory=model.nvml_memory_bytes,
            cut=context.cut,
        )
        members = sorted({(s.workload.namespace, s.workload.kind, s.workload.name) for s in shards})
        pools.append(
            SharedPool(
                cluster,
                key,
                model.name,
                gpus=len(shared),
                members=tuple(members),
                pods=len(shards),
                largest_group=max(len(gpu.members) for gpu in shared),
                replicas=replicas,
                multi_gpu_pods=any(s.workload.gpus_per_pod > 1 for s in shards),
            )
        )
    return tuple(pools)


def _placements(gpus: Sequence[_Gpu]) -> list[Placement]:
    found = []
    for gpu in gpus:
        for shard, profile in gpu.members:
            w = shard.workload
            found.append(
                Placement(
                    w.cluster,
                    w.namespace,
                    w.kind,
                    w.name,
                    gpu.model.name,
                    profile.profile if profile is not None else None,
                    gpu.group,
                )
            )
    found.sort(key=lambda p: (p.cluster, p.namespace, p.kind, p.workload, p.group or ""))
    return found
