"""Events (`events.k8s.io/v1`) on pods (`--kubernetes.events`), deduplicated as client-go's
event recorder does.

An Event is valid as the API server requires: a name (`<pod>.<hex nanoseconds>`, as client-go
names them), `eventTime` as a MicroTime, `reportingController`, `reportingInstance`, `action`,
`reason`, a `note` of at most 1 kB and `regarding` the Pod by kind, namespace, name and uid, so
that `kubectl describe pod` lists it; it is created in the pod's namespace.

The same Event again (same pod, type, reason, action and note) within `SERIES_SECONDS` of the
last one is not created anew: the first one's `series` is patched (`count` from 2 up,
`lastObservedTime`). A write that fails is retried with backoff, and given up after
`MAX_ATTEMPTS` (Events are best-effort, as they are for client-go); at most `MAX_PENDING` wait.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from exporter.actions.findings import IdleHolders, xid_findings
from exporter.actions.retry import API_FAILURES, Backoff
from exporter.actions.writes import JSON, MERGE_PATCH
from exporter.actions.xids import XidCounts
from exporter.attribution.cluster import ApiError

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.actions.findings import Finding
    from exporter.actions.writes import ApiWrites
    from exporter.actions.xids import XidHit
    from exporter.model import Snapshot

log = logging.getLogger(__name__)

CONTROLLER: Final = "gpuscope"
"""`reportingController`: a qualified name, as the API requires."""
SERIES_SECONDS: Final = 6 * 60.0
"""client-go's recorder ends a series after 6 minutes without a repeat."""
MAX_NOTE_BYTES: Final = 1024
MAX_NAME: Final = 253
MAX_ATTEMPTS: Final = 5
MAX_PENDING: Final = 1000
POLL_SECONDS: Final = 0.5
HOLD_SECONDS: Final = 60.0
"""How long an XID waits for the pod watch's first list before it is told to nobody."""
_NOT_FOUND: Final = 404


def micro_time(wall: float) -> str:
    """A `metav1.MicroTime`: `2006-01-02T15:04:05.000000Z`."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cut_note(note: str) -> str:
    """At most `MAX_NOTE_BYTES` of UTF-8, cut at a character."""
    encoded = note.encode()
    if len(encoded) <= MAX_NOTE_BYTES:
        return note
    return encoded[: MAX_NOTE_BYTES - 3].decode(errors="ignore") + "..."


@dataclass(slots=True)
class _Series:
    namespace: str
    name: str
    count: int
    last_observed: float
    """Monotonic time of the last occurrence."""


@dataclass(slots=True)
class _Pending:
    finding: Finding
    wall: float
    attempts: int = 0


class EventRecorder:
    """Records findings as Events: created, or the series of the same Event patched."""

    def __init__(
        self,
        writes: ApiWrites,
        node: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._writes = writes
        self._instance = f"{CONTROLLER}-{node}"[:128]
        self._clock = clock
        self._wall = wall
        self._series: dict[tuple[str, str, str, str, str], _Series] = {}
        self._pending: collections.deque[_Pending] = collections.deque()
        self.backoff = Backoff(log, clock=clock)

    def add(self, finding: Finding) -> None:
        if len(self._pending) >= MAX_PENDING:
            dropped = self._pending.popleft()
            log.warning(
                "too many Events waiting; dropping the oldest",
                extra={"reason": dropped.finding.reason, "pod": dropped.finding.pod.name},
            )
        self._pending.append(_Pending(finding, self._wall()))

    async def flush(self) -> None:
        """Write what waits, in order, until a write fails (then after the backoff)."""
        while self._pending and self.backoff.due:
            pending = self._pending[0]
            try:
                await self._record(pending)
            except API_FAILURES as error:
                pending.attempts += 1
                pod = pending.finding.pod
                self.backoff.failed(
                    "writing an Event", error, {"namespace": pod.namespace, "pod": pod.name}
                )
                if pending.attempts >= MAX_ATTEMPTS:
                    self._pending.popleft()
                    log.warning(
                        "giving up on an Event",
                        extra={
                            "reason": pending.finding.reason,
                            "namespace": pod.namespace,
                            "pod": pod.name,
                            "attempts": pending.attempts,
                        },
                    )
                return
            self.backoff.succeeded()
            self._pending.popleft()

    async def _record(self, pending: _Pending) -> None:
        finding = pending.finding
        note = cut_note(finding.note)
        key = (finding.pod.uid, finding.type, finding.reason, finding.action, note)
        now = self._clock()
        self._series = {
            k: s for k, s in self._series.items() if now - s.last_observed < SERIES_SECONDS
        }
        series = self._series.get(key)
        if series is not None:
            body = {
                "series": {"count": series.count + 1, "lastObservedTime": micro_time(pending.wall)}
            }
            path = _events_path(series.namespace) + f"/{series.name}"
            try:
                await self._writes.send("PATCH", path, body, content_type=MERGE_PATCH)
            except ApiError as error:
                if error.status != _NOT_FOUND:
                    raise
                del self._series[key]  # deleted meanwhile (or expired): a new Event instead
            else:
                series.count += 1
                series.last_observed = now
                return
        pod = finding.pod
        suffix = f".{time.time_ns():x}"
        name = pod.name[: MAX_NAME - len(suffix)] + suffix
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": pod.namespace},
            "eventTime": micro_time(pending.wall),
            "reportingController": CONTROLLER,
            "reportingInstance": self._instance,
            "action": finding.action,
            "reason": finding.reason,
            "type": finding.type,
            "note": note,
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
        }
        await self._writes.send("POST", _events_path(pod.namespace), event, content_type=JSON)
        self._series[key] = _Series(pod.namespace, name, 1, now)
        log.info(
            "Event recorded",
            extra={"reason": finding.reason, "namespace": pod.namespace, "pod": pod.name},
        )


def _events_path(namespace: str) -> str:
    return f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"


class PodEvents:
    """Finds what to tell pods in each new snapshot `latest()` returns, and records it."""

    def __init__(
        self,
        recorder: EventRecorder,
        latest: Callable[[], Snapshot | None],
        *,
        idle_after: float,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recorder = recorder
        self._latest = latest
        self._poll = poll_seconds
        # Kept across restarts of `run`, so that a restart tells nothing twice.
        self._xids = XidCounts()
        self._idle = IdleHolders(idle_after=idle_after)
        self._seen: Snapshot | None = None
        self._held: list[tuple[XidHit, float]] = []
        """XIDs seen before the pod watch had listed the node's pods, and when: told once it
        has (within `HOLD_SECONDS`), so that an XID at the daemon's start reaches its pods."""
        self._clock = clock

    async def run(self) -> None:
        """Returns only when cancelled."""
        while True:
            snapshot = self._latest()
            if snapshot is not None and snapshot is not self._seen:
                self._seen = snapshot
                for finding in self.findings(snapshot):
                    self._recorder.add(finding)
            await self._recorder.flush()
            await asyncio.sleep(self._poll)

    def findings(self, snapshot: Snapshot) -> list[Finding]:
        """What to tell pods after `snapshot` (once per snapshot)."""
        return [*self._xid_findings(snapshot), *self._idle.update(snapshot)]

    def _xid_findings(self, snapshot: Snapshot) -> list[Finding]:
        now = self._clock()
        self._held = [(hit, at) for hit, at in self._held if now - at < HOLD_SECONDS]
        new = self._xids.new_hits(snapshot)
        attribution = snapshot.attribution
        if attribution is None or not attribution.kubernetes.watch_up:
            self._held.extend((hit, now) for hit in new)
            return []
        hits = [*(hit for hit, _ in self._held), *new]
        self._held = []
        return xid_findings(snapshot, hits)
