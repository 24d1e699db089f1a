"""The `GPUHealthy` condition on the daemon's own node (`--kubernetes.node-condition`).

Written only by PATCH of `nodes/<node>/status`, as a strategic merge patch: the API server merges
a node's `status.conditions` by `type`, so the patch carries this one condition and touches no
other condition, taint, label, annotation or field (no `resourceVersion` is sent, so a concurrent
writer — the kubelet's heartbeat — never makes it conflict).

At start the node's status is read first: a condition a previous run left keeps its status (a
False one until the recovery period has passed) and its `lastTransitionTime`, which moves only
when the status changes. A write that changes nothing (the heartbeat, `lastHeartbeatTime`) goes
at most every `HEARTBEAT_SECONDS`. A failed read or write is retried with backoff and logged;
on exit the condition stays as last written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final

from exporter.actions.health import GpuHealth, Verdict
from exporter.actions.retry import API_FAILURES, Backoff
from exporter.actions.writes import STRATEGIC_MERGE
from exporter.actions.xids import XidCounts
from exporter.attribution.jsonstream import TEXT, Fields, Items, nested

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.actions.writes import ApiWrites
    from exporter.model import Snapshot

log = logging.getLogger(__name__)

CONDITION: Final = "GPUHealthy"
HEARTBEAT_SECONDS: Final = 30.0
POLL_SECONDS: Final = 0.5
"""How often the latest snapshot is looked at: an XID re-publishes one at once, so the condition
turns False well within the 10 s it promises."""
_CONDITIONS: Final = nested(
    "status.conditions",
    Items(
        Fields(
            {
                "type": TEXT,
                "status": TEXT,
                "reason": TEXT,
                "message": TEXT,
                "lastTransitionTime": TEXT,
            }
        ),
        max_items=64,
    ),
)


def rfc3339(wall: float) -> str:
    """`metav1.Time` as the API writes it: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class NodeCondition:
    """Keeps `GPUHealthy` on `node` from the snapshots `latest()` returns."""

    def __init__(
        self,
        writes: ApiWrites,
        node: str,
        latest: Callable[[], Snapshot | None],
        *,
        recovery_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self._writes = writes
        self._path = f"/api/v1/nodes/{node}/status"
        self._node = node
        self._latest = latest
        self._recovery = recovery_seconds
        self._clock = clock
        self._wall = wall
        self._poll = poll_seconds
        self._backoff = Backoff(log, clock=clock)
        self._xids = XidCounts()
        """Kept across restarts of `run`, so that an XID turns the condition False once."""

    async def run(self) -> None:
        """Read the node's condition, then keep it; returns only when cancelled."""
        inherited, transition = await self._read_node()
        health = GpuHealth(recovery_seconds=self._recovery, inherited=inherited, now=self._clock())
        written = inherited
        written_at: float | None = None
        seen: Snapshot | None = None
        while True:
            snapshot = self._latest()
            if snapshot is not None and snapshot is not seen:
                seen = snapshot
                health.update(snapshot, self._xids.new_hits(snapshot), self._clock())
            verdict = health.verdict if seen is not None else None  # a first sample first
            heartbeat_due = written_at is None or self._clock() - written_at >= HEARTBEAT_SECONDS
            if verdict is not None and (verdict != written or heartbeat_due) and self._backoff.due:
                now = self._wall()
                changed = written is None or verdict.healthy != written.healthy
                # The time moves only with a status change the API server took: a failed write
                # leaves it where the node has it.
                moved = rfc3339(now) if changed or transition is None else transition
                if await self._write(verdict, moved, rfc3339(now)):
                    if verdict != written:
                        _log_change(verdict, self._node)
                    written, written_at, transition = verdict, self._clock(), moved
            await asyncio.sleep(self._poll)

    async def _read_node(self) -> tuple[Verdict | None, str | None]:
        """The condition as a previous run left it, and its lastTransitionTime; retried with
        backoff until the node's status is read (nothing is written before)."""
        while True:
            try:
                node = await self._writes.get(self._path, _CONDITIONS)
            except API_FAILURES as error:
                await asyncio.sleep(
                    self._backoff.failed("reading the node's status", error, {"node": self._node})
                )
                continue
            self._backoff.succeeded()
            return _inherited(node)

    async def _write(self, verdict: Verdict, transition: str, heartbeat: str) -> bool:
        condition = {
            "type": CONDITION,
            "status": "True" if verdict.healthy else "False",
            "reason": verdict.reason,
            "message": verdict.message,
            "lastTransitionTime": transition,
            "lastHeartbeatTime": heartbeat,
        }
        body = {"status": {"conditions": [condition]}}
        try:
            await self._writes.send("PATCH", self._path, body, content_type=STRATEGIC_MERGE)
        except API_FAILURES as error:
            self._backoff.failed("writing the GPUHealthy condition", error, {"node": self._node})
            return False
        self._backoff.succeeded()
        return True


def _inherited(node: object) -> tuple[Verdict | None, str | None]:
    status = node.get("status") if isinstance(node, dict) else None
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if not isinstance(condition, dict) or condition.get("type") != CONDITION:
            continue
        if condition.get("status") not in ("True", "False"):
            return None, None
        verdict = Verdict(
            condition["status"] == "True",
            str(condition.get("reason") or ""),
            str(condition.get("message") or ""),
        )
        transition = condition.get("lastTransitionTime")
        return verdict, transition if isinstance(transition, str) and transition else None
    return None, None


def _log_change(verdict: Verdict, node: str) -> None:
    fields = {"node": node, "reason": verdict.reason, "detail": verdict.message}
    if verdict.healthy:
        log.info("node condition GPUHealthy is True", extra=fields)
    else:
        log.warning("node condition GPUHealthy is False", extra=fields)
