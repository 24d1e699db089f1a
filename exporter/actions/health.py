"""The node's GPU health over time, as the `GPUHealthy` condition says it; pure (times given).

False, at once, on a fatal XID (reason `XID79`, `XID48`, `XID94`, `XID95`) or a lost GPU
(`GPULost`: its lifecycle calls say it is gone, `exporter.nvml.sampler`); the message names the
GPU's UUID. True (`AllGPUsHealthy`) once every GPU answers — and, after a fault, once every GPU
has answered with no fatal XID for the whole recovery period. A GPU that does not answer for
another reason (hung, not opened) changes nothing, but holds recovery back.

While the condition is False, a new fatal XID names itself (the latest news); a GPU still lost
keeps the reason that turned it False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from exporter.actions.xids import XidHit
    from exporter.model import Snapshot

HEALTHY: Final = "AllGPUsHealthy"
LOST: Final = "GPULost"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the condition should say: status, reason, message."""

    healthy: bool
    reason: str
    message: str


class GpuHealth:
    """The verdict from each snapshot in turn. `inherited` is the condition a previous run left
    (a False one is kept until the recovery period has passed from `now`). One owner."""

    def __init__(self, *, recovery_seconds: float, inherited: Verdict | None, now: float) -> None:
        self._recovery = recovery_seconds
        self.verdict: Verdict | None = inherited
        """The last verdict; None until there is something to say."""
        self._clean_since: float | None = None
        """Since when every GPU answered with no fatal XID; None while one does not."""
        self._fault_at: float | None = (
            now if inherited is not None and not inherited.healthy else None
        )

    def update(self, snapshot: Snapshot, hits: list[XidHit], now: float) -> Verdict | None:
        """The verdict after `snapshot` (whose new fatal XIDs are `hits`), seen at `now`."""
        lost = [gpu for gpu in snapshot.gpus if not gpu.up and gpu.down_reason == "lost"]
        if hits:
            first = hits[0]
            described = "; ".join(hit.describe() for hit in hits)
            self._fault(
                Verdict(healthy=False, reason=f"XID{first.xid}", message=f"fatal {described}"), now
            )
        elif lost:
            if self.verdict is None or self.verdict.healthy:
                named = ", ".join(f"GPU {gpu.identity.index} {gpu.identity.uuid}" for gpu in lost)
                self._fault(
                    Verdict(
                        healthy=False,
                        reason=LOST,
                        message=f"lost (no longer answers NVML): {named}",
                    ),
                    now,
                )
            else:
                self._fault(self.verdict, now)
        elif not snapshot.gpus or not all(gpu.up for gpu in snapshot.gpus):
            self._clean_since = None
        else:
            if self._clean_since is None:
                self._clean_since = now
            if self._fault_at is None or now - self._clean_since >= self._recovery:
                count = sum(not gpu.identity.is_mig_instance for gpu in snapshot.gpus)
                self.verdict = Verdict(
                    healthy=True, reason=HEALTHY, message=f"all GPUs answer ({count}), no fatal XID"
                )
                self._fault_at = None
        return self.verdict

    def _fault(self, verdict: Verdict, now: float) -> None:
        self.verdict = verdict
        self._fault_at = now
        self._clean_since = None
