"""Which pods get which Event, from the snapshots; pure (snapshot times only).

`GPUXidError` (Warning): a fatal XID (`exporter.actions.xids`) on a GPU, for every pod that holds
it (the kubelet's allocation) or uses it (a process of its containers runs there), MIG instances
of the GPU included. `GPUIdle` (Normal): a pod has held a GPU for `idle_after` with zero busy
time — no process of its own there, or processes at zero utilization — counted from when the
daemon first saw it idle. Time the GPU (or its process list) does not answer is not idle: it is
left out of the count, which neither grows nor starts over. A pod seen busy starts over. A pod is
told at most once per `idle_after`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration

if TYPE_CHECKING:
    from exporter.actions.xids import XidHit
    from exporter.model import Allocation, GpuIdentity, GpuSample, PodIdentity, Snapshot

WARNING: Final = "Warning"
NORMAL: Final = "Normal"
XID_REASON: Final = "GPUXidError"
IDLE_REASON: Final = "GPUIdle"
XID_ACTION: Final = "CheckGPUHealth"
IDLE_ACTION: Final = "CheckGPUUse"


@dataclass(frozen=True, slots=True)
class Finding:
    """One Event to record about one pod."""

    pod: PodIdentity
    type: str
    reason: str
    action: str
    note: str


def _on(identity: GpuIdentity, uuid: str) -> bool:
    return uuid in (identity.uuid, identity.parent_uuid)


def xid_findings(snapshot: Snapshot, hits: list[XidHit]) -> list[Finding]:
    """A `GPUXidError` per pod holding or using each GPU a fatal XID hit."""
    attribution = snapshot.attribution
    if attribution is None:
        return []
    found: list[Finding] = []
    for hit in hits:
        pods: dict[str, tuple[PodIdentity, str]] = {}
        for allocation in attribution.allocations:
            if _on(allocation.gpu, hit.uuid):
                pods.setdefault(allocation.pod.uid, (allocation.pod, "holds"))
        for usage in attribution.usage:
            if _on(usage.gpu, hit.uuid):
                pods.setdefault(usage.pod.uid, (usage.pod, "uses"))
        found.extend(
            Finding(
                pod,
                WARNING,
                XID_REASON,
                XID_ACTION,
                f"{hit.describe()}, a GPU this pod {how}; its work there may have failed",
            )
            for pod, how in pods.values()
        )
    return found


@dataclass(slots=True)
class _Idle:
    seconds: float = 0.0
    """Idle time seen so far (snapshot time), gaps left out."""
    last_seen: float | None = None
    """The snapshot time it was last seen idle; None after a gap."""
    told_at: float = 0.0
    """`seconds` when the pod was last told."""


class IdleHolders:
    """Pods holding a GPU with zero busy time, told once per `idle_after`. One owner (the loop)."""

    def __init__(self, *, idle_after: float) -> None:
        self._idle_after = idle_after
        self._idle: dict[tuple[str, str], _Idle] = {}
        """(pod uid, GPU UUID) -> its idle time."""
        self._told: dict[str, float] = {}
        """pod uid -> the snapshot time it was last told (any GPU)."""

    def update(self, snapshot: Snapshot) -> list[Finding]:
        attribution = snapshot.attribution
        if attribution is None:
            return []
        now = snapshot.timestamp
        gpus = {gpu.identity.uuid: gpu for gpu in snapshot.gpus}
        busy: dict[tuple[str, str], float] = {}
        unanswered: set[tuple[str, str]] = set()
        for usage in attribution.usage:
            key = (usage.pod.uid, usage.gpu.uuid)
            if usage.utilization is None:
                unanswered.add(key)
            else:
                busy[key] = busy.get(key, 0.0) + usage.utilization
        holders: dict[tuple[str, str], Allocation] = {}
        for allocation in attribution.allocations:
            holders.setdefault((allocation.pod.uid, allocation.gpu.uuid), allocation)
        self._idle = {key: idle for key, idle in self._idle.items() if key in holders}
        found: list[Finding] = []
        for key, allocation in holders.items():
            gpu = gpus.get(key[1])
            state = _state(gpu, allocation, busy=busy.get(key, 0.0), unanswered=key in unanswered)
            if state == "busy":
                self._idle.pop(key, None)
                continue
            idle = self._idle.setdefault(key, _Idle())
            if state == "unknown":
                idle.last_seen = None
                continue
            if idle.last_seen is not None:
                idle.seconds += max(now - idle.last_seen, 0.0)
            idle.last_seen = now
            told = self._told.get(key[0])
            if idle.seconds - idle.told_at >= self._idle_after and (
                told is None or now - told >= self._idle_after
            ):
                idle.told_at = idle.seconds
                self._told[key[0]] = now
                found.append(self._finding(allocation, idle.seconds, snapshot))
        live = {uid for uid, _ in holders}
        self._told = {uid: at for uid, at in self._told.items() if uid in live}
        return found

    def _finding(self, allocation: Allocation, seconds: float, snapshot: Snapshot) -> Finding:
        gpu = allocation.gpu
        model = f"{gpu.model} {gpu.mig_profile}" if gpu.mig_profile else gpu.model
        price = next(
            (c.price_usd_per_hour for c in snapshot.ceilings if c.model == gpu.model), None
        )
        cost = ""
        if price is not None and not gpu.is_mig_instance:
            share = " (shared with others)" if allocation.shared else ""
            cost = f"; that GPU costs about ${price * 24:.2f} a day{share}"
        note = (
            f"This pod has held GPU {gpu.index} {gpu.uuid} ({model}) with zero busy time for "
            f"{format_duration(round(seconds))}{cost}"
        )
        return Finding(allocation.pod, NORMAL, IDLE_REASON, IDLE_ACTION, note)


def _state(gpu: GpuSample | None, allocation: Allocation, *, busy: float, unanswered: bool) -> str:
    """`busy`, `idle`, or `unknown` (the GPU or its process list does not answer)."""
    if gpu is None or not gpu.up or allocation.in_use is None or unanswered:
        return "unknown"
    return "busy" if busy > 0 else "idle"
