"""A trace's points as Chrome's Trace Event Format (`{"traceEvents": [...]}`), which Perfetto
and Chrome's trace viewers open: a process per GPU (its `process_name` metadata naming the GPU's
index, model and UUID), and under it one counter track per reading and per pod holding or using
the GPU. Pure: built from data, after the trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from exporter.model import GpuIdentity, Snapshot
    from exporter.trace.poll import Point


@dataclass(frozen=True, slots=True)
class GpuTrace:
    """One GPU's part of a trace: its identity and its points, each counter's in time order."""

    identity: GpuIdentity
    points: Sequence[Point]
    pods: Sequence[Point]
    """`<namespace>/<pod>` tracks: (track, µs, `gpu_pod_utilization_ratio` summed over the
    pod's containers)."""


def pod_values(snapshot: Snapshot, uuid: str) -> dict[str, float]:
    """Each pod that holds or uses the physical GPU `uuid` (or one of its MIG instances) in the
    snapshot, valued as its `gpu_pod_utilization_ratio` summed over its containers there: 0 for a
    holder that runs nothing on it."""
    attribution = snapshot.attribution
    if attribution is None:
        return {}
    values: dict[str, float] = {}
    for allocation in attribution.allocations:
        if uuid in (allocation.gpu.uuid, allocation.gpu.parent_uuid):
            values.setdefault(f"{allocation.pod.namespace}/{allocation.pod.name}", 0.0)
    for usage in attribution.usage:
        if uuid in (usage.gpu.uuid, usage.gpu.parent_uuid):
            track = f"{usage.pod.namespace}/{usage.pod.name}"
            values[track] = values.get(track, 0.0) + (usage.utilization or 0.0)
    return values


def trace_events(gpus: Iterable[GpuTrace]) -> dict[str, list[dict[str, Any]]]:
    """The document: per GPU its metadata, then its counters' events in time order."""
    events: list[dict[str, Any]] = []
    for gpu in gpus:
        identity = gpu.identity
        pid = identity.index + 1  # pid 0 is the idle task to some viewers
        name = f"GPU {identity.index} {identity.model} {identity.uuid}"
        events.append(_metadata("process_name", pid, {"name": name}))
        events.append(_metadata("process_sort_index", pid, {"sort_index": identity.index}))
        for track, at, value in sorted((*gpu.points, *gpu.pods), key=lambda point: point[1]):
            events.append(
                {"name": track, "ph": "C", "ts": at, "pid": pid, "tid": 0, "args": {"value": value}}
            )
    return {"traceEvents": events}


def _metadata(name: str, pid: int, args: Mapping[str, object]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": 0, "args": dict(args)}
