"""The `events` collector's families: the XID errors the driver reports through NVML events,
counted by `exporter.nvml.events` and kept while a GPU is down."""

from __future__ import annotations

from functools import cache
from typing import Final

from exporter.readings.declare import family
from exporter.series import Series

XID_FAMILY: Final = family(
    "gpu_xid_errors",
    "XID critical errors reported by the driver since gpuscope started, by XID.",
    kind="counter",
    labels=("xid",),
    doc="XID critical errors since gpuscope started, per XID value (a repeat counts again); kept "
    "while the GPU is down",
    collector="events",
    while_down=True,
)
LAST_XID: Final = Series(
    family(
        "gpu_last_xid_timestamp_seconds",
        "Unix time of the last XID critical error gpuscope saw.",
        unit="seconds",
        doc="Unix time of the last XID critical error",
        collector="events",
        while_down=True,
    )
)


@cache
def xid_series(xid: int) -> Series:
    """The counter of one XID value (made once per value)."""
    return Series(XID_FAMILY, (("xid", str(xid)),))
