"""dcgm-exporter's names for gpuscope's readings: a second column of the declarations.

`gpuscope serve --compat.dcgm` serves each DCGM field dcgm-exporter 4.x serves (`fields`: its
name, type, help and unit, the gpuscope series it is made from and the conversion; `versions`:
the same readings under 4.8's or 4.9.0's names, units and labels) beside
gpuscope's own series (`exporter.metrics.dcgm` writes them), with NVIDIA's XID texts as the XID
series' `err_msg` (`xids`, from the shipped `xids.yaml`). The field table of docs/guide/dcgm.md is generated
from the same declarations (`table`, through `scripts/readme.py`; the daemon never loads it). The
daemon imports this package under `--compat.dcgm` only.
"""

from __future__ import annotations

from exporter.dcgm.fields import (
    BY_NAME,
    DEFAULT_FIELDS,
    DRIVER_VERSION,
    FIELDS,
    SPLIT_BY,
    XID_ERRORS,
    Field,
    Split,
)
from exporter.dcgm.versions import NOT_SERVED, VERSION_48, VERSION_49, VERSIONS, DcgmVersion
from exporter.dcgm.xids import xid_message

__all__ = [
    "BY_NAME",
    "DEFAULT_FIELDS",
    "DRIVER_VERSION",
    "FIELDS",
    "NOT_SERVED",
    "SPLIT_BY",
    "VERSIONS",
    "VERSION_48",
    "VERSION_49",
    "XID_ERRORS",
    "DcgmVersion",
    "Field",
    "Split",
    "xid_message",
]
