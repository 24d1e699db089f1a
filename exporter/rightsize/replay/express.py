"""From a report's winning placement to its patch set (`patchset.py` says what it holds)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from exporter.rightsize.hardware import Option
from exporter.rightsize.patches import placement_patch
from exporter.rightsize.replay.patchset import (
    CANNOT,
    DEVICE_PLUGIN_LABEL,
    SHARED_RESOURCE,
    PlacementPatches,
    mig_layouts,
    option_name,
    plugin_key,
    pool_limits,
    time_slicing,
    winner,
    workload_label,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.catalog import GpuModel
    from exporter.rightsize.hardware import Hardware
    from exporter.rightsize.history import ResourceUse
    from exporter.rightsize.patches import Patch
    from exporter.rightsize.replay.engine import Placement, SharedPool
    from exporter.rightsize.report import Report
    from exporter.rightsize.row import WorkloadRow


def placement_patches(
    report: Report,
    *,
    hardware: Hardware,
    inventory: Iterable[ResourceUse],
    seen_models: Iterable[str] = (),
) -> PlacementPatches | None:
    """The patch set of the report's winning placement (None when no policy wins)."""
    result = winner(report.simulation)
    if result is None:
        return None
    held, seen = list(inventory), list(seen_models)
    rows: dict[tuple[str, str, str, str], WorkloadRow] = {}
    for row in report.rows:
        key = row.history.owner
        if key not in rows or (row.replicas, row.gpus_held) > (
            rows[key].replicas,
            rows[key].gpus_held,
        ):
            rows[key] = row
    shards: dict[tuple[str, str, str, str], list[Placement]] = defaultdict(list)
    for placement in result.placements:
        key = (placement.cluster, placement.namespace, placement.kind, placement.workload)
        shards[key].append(placement)
    pools = {(pool.cluster, pool.gpu_model): pool for pool in result.pools}
    written = {key: pool for key, pool in pools.items() if pool.replicas >= 2}
    contains = [
        (
            f"the {result.policy} placement: {result.gpus.max:g} GPUs, "
            f"${result.cost_usd_per_month or 0:,.0f} a month, no step contended, no memory "
            "overcommitted"
        )
    ]
    cannot = [*CANNOT, *pool_limits(pools.values())]
    patches: list[Patch] = []
    layouts: dict[tuple[str, str], dict[str, Counter[str]]] = defaultdict(
        lambda: defaultdict(Counter)
    )
    for key, placed in sorted(shards.items()):
        chosen = rows.get(key)
        model = hardware.model(placed[0].gpu_model)
        if chosen is None or model is None:
            continue
        patch, why = _workload_patch(chosen, placed, model, written, inventory=held, seen=seen)
        if why:
            cannot.append(f"{workload_label(key)}: {why}")
        if patch is not None:
            patches.append(patch)
        for placement in placed:
            if placement.mig_profile and placement.group and not why:
                layouts[(placement.cluster, model.key)][placement.group][placement.mig_profile] += 1
    manifests, nodes = time_slicing(written.values(), contains)
    mig_manifests, mig_nodes = mig_layouts(layouts, contains)
    return PlacementPatches(
        result.policy,
        tuple(contains),
        tuple(cannot),
        (*manifests, *mig_manifests),
        (*nodes, *mig_nodes),
        tuple(patches),
    )


def _workload_patch(
    row: WorkloadRow,
    placed: list[Placement],
    model: GpuModel,
    pools: dict[tuple[str, str], SharedPool],
    *,
    inventory: list[ResourceUse],
    seen: list[str],
) -> tuple[Patch | None, str]:
    """A workload's pod patch and, when none can be written safely, why."""
    current = row.recommendation.current
    peak = row.memory_peak_bytes or 0.0
    pooled = next(
        (
            pools[(p.cluster, p.gpu_model)]
            for p in placed
            if p.group and not p.mig_profile and (p.cluster, p.gpu_model) in pools
        ),
        None,
    )
    if pooled is not None:
        if peak > model.nvml_memory_bytes:
            return None, f"its memory peak does not fit a {model.name}: left as it is"
        patch = placement_patch(
            row.history,
            current,
            Option(model),
            inventory,
            seen,
            shared_resource=SHARED_RESOURCE,
            selector={DEVICE_PLUGIN_LABEL: plugin_key(pooled)},
            note=(
                f"time-sliced {pooled.replicas} ways on the nodes labelled "
                f"{DEVICE_PLUGIN_LABEL}={plugin_key(pooled)}: apply it once they are labelled and the "
                "device plugin has the config"
            ),
        )
        return patch, ""
    profile_name = placed[0].mig_profile
    profile = model.mig_profile(profile_name) if profile_name else None
    target = Option(model, profile)
    if peak > target.memory_bytes:
        return None, f"its memory peak does not fit {option_name(target)}: left as it is"
    return placement_patch(row.history, current, target, inventory, seen), ""
