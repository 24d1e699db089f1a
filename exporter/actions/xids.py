"""The XIDs that make a GPU unhealthy, and the new ones each snapshot shows; pure.

The event thread counts every XID per GPU since the daemon started (`gpu_xid_errors_total`);
a count that went up between two snapshots is a new XID. The first snapshot's counts are all new:
the daemon counts from zero, so whatever it shows was seen in this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.dcgm.xids import xid_message
from exporter.readings import xid_series

if TYPE_CHECKING:
    from exporter.model import GpuSample, Snapshot

FATAL_XIDS: Final = (79, 48, 94, 95)
"""79: fallen off the bus; 48: double-bit ECC error; 94 and 95: contained and uncontained ECC
errors. Any other XID changes nothing here (many are an application's own fault)."""


@dataclass(frozen=True, slots=True)
class XidHit:
    """A fatal XID on one GPU, new in this snapshot."""

    xid: int
    gpu: GpuSample

    @property
    def uuid(self) -> str:
        return self.gpu.identity.uuid

    def describe(self) -> str:
        """`XID 79 (GPU has fallen off the bus) on GPU 0 GPU-…`"""
        identity = self.gpu.identity
        return f"XID {self.xid} ({xid_message(self.xid)}) on GPU {identity.index} {identity.uuid}"


class XidCounts:
    """The fatal XID counts seen so far per GPU, to tell the new ones. One owner (the loop)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], float] = {}

    def new_hits(self, snapshot: Snapshot) -> list[XidHit]:
        """The fatal XIDs that went up since the last snapshot read, by GPU index then XID."""
        hits: list[XidHit] = []
        for gpu in snapshot.gpus:
            if gpu.identity.is_mig_instance:
                continue  # XIDs are the physical GPU's; its MIG instances repeat them
            for xid in FATAL_XIDS:
                count = gpu.values.get(xid_series(xid))
                if count is None:
                    continue
                key = (gpu.identity.uuid, xid)
                if count > self._counts.get(key, 0.0):
                    hits.append(XidHit(xid, gpu))
                self._counts[key] = count
        return sorted(hits, key=lambda hit: (hit.gpu.identity.index, hit.xid))
