"""NVML event sets, simulated: the fleet's scheduled XID and ECC faults, delivered through the
event sets the daemon registers its GPUs in, each event once per set, in the order they fall due.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.simulator.state import NOT_AVAILABLE

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from exporter.simulator.fleet import Fault
    from exporter.simulator.state import Handle

EVENT_TYPES: Final = int(
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeClock
)


@dataclass(frozen=True, slots=True)
class EventData:
    """What pynvml's c_nvmlEventData_t carries, with the very handle that was registered."""

    # pynvml's field names, so that code reading a real event reads this one too
    device: Any
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815
    gpuInstanceId: int = NOT_AVAILABLE  # noqa: N815
    computeInstanceId: int = NOT_AVAILABLE  # noqa: N815


@dataclass(slots=True)
class EventSet:
    """One event set: the GPUs registered in it, and the events it has delivered."""

    registered: dict[int, tuple[Handle, int, float]] = field(default_factory=dict)
    """GPU index -> (handle, event mask, simulated time of registration)."""
    delivered: set[tuple[int, str, int]] = field(default_factory=set)
    """(GPU index, event kind, fault number) already delivered through this set."""
    freed: bool = False


def next_event(
    event_set: EventSet,
    t: float,
    *,
    xid: Mapping[int, Sequence[Fault]],
    ecc: Mapping[int, Sequence[Fault]],
) -> tuple[float | None, EventData | None]:
    """The earliest undelivered event due by t; else when the next one falls due."""
    candidates: list[tuple[float, int, str, int, EventData]] = []
    for index, (handle, mask, since) in event_set.registered.items():
        for number, fault in enumerate(xid.get(index, ())):
            if mask & pynvml.nvmlEventTypeXidCriticalError and fault.at >= since:
                event = EventData(handle, pynvml.nvmlEventTypeXidCriticalError, fault.xid)
                candidates.append((fault.at, index, "xid", number, event))
        for number, fault in enumerate(ecc.get(index, ())):
            if fault.at < since:
                continue
            for kind, count, event_type in (
                ("sbe", fault.corrected, pynvml.nvmlEventTypeSingleBitEccError),
                ("dbe", fault.uncorrected, pynvml.nvmlEventTypeDoubleBitEccError),
            ):
                if count and mask & event_type:
                    event = EventData(handle, event_type, 0)
                    candidates.append((fault.at, index, kind, number, event))
    pending = [c for c in candidates if (c[1], c[2], c[3]) not in event_set.delivered]
    due = [c for c in pending if c[0] <= t]
    if due:
        at, index, kind, number, event = min(due, key=lambda c: (c[0], c[1], c[2], c[3]))
        event_set.delivered.add((index, kind, number))
        return at, event
    upcoming = min((c[0] for c in pending), default=None)
    return upcoming, None
