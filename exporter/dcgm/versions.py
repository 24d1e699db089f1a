"""The dcgm-exporter versions `--compat.dcgm-version` serves, each a field set and its labels.

4.8 is `fields.FIELDS` as declared (dcgm-exporter 4.8.0 to 4.8.4, with 4.8.0-4.8.2's `Hostname`).
4.9 is the same readings under dcgm-exporter 4.9.0's names: its 23 renamed default rows
(`exporter.dcgm_counters.RENAMED_IN_49`), 11 of them in base units (Hz, J, bytes, 0-1 ratios,
bytes/s), the new default `DCGM_FI_DEV_FB_CAPACITY_BYTES`, `hostname` as the node label and
`DCGM_FI_SYSTEM_DRIVER_VERSION` as the driver-version label. The fields a counters file may add
keep the names 4.9.0's release notes do not rename. A 4.9 field is its 4.8 field with a new name,
help and unit, and its sources' factors times the unit change, so both versions read the same
series and split a shared GPU the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from exporter.dcgm.fields import DRIVER_VERSION, FIELDS, XID_ERRORS, Field, Source
from exporter.dcgm_counters import RENAMED_IN_49
from exporter.readings.device import MEMORY_TOTAL
from exporter.readings.gpm import NVLINK_RECEIVE, NVLINK_TRANSMIT

if TYPE_CHECKING:
    from collections.abc import Mapping

NOT_SERVED: Final[Mapping[str, str]] = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "a vGPU guest's licence state, which NVML answers only "
    "inside a virtual machine with a vGPU: a Kubernetes node's physical GPUs have none",
}
"""dcgm-exporter's default fields (4.8 and 4.9.0 alike) that gpuscope does not serve, and why
(docs/guide/dcgm.md says so)."""


@dataclass(frozen=True, slots=True)
class DcgmVersion:
    """What one dcgm-exporter version serves: its fields and how it names its labels."""

    name: str
    fields: tuple[Field, ...]
    """Every field it can serve, its defaults first in its file's order."""
    node_label: str
    driver_version: str
    """The label-type field that puts the driver version on every series."""
    xid_errors: str

    @property
    def default_fields(self) -> tuple[Field, ...]:
        return tuple(field for field in self.fields if field.default)

    @property
    def by_name(self) -> Mapping[str, Field]:
        return {field.name: field for field in self.fields}

    @property
    def not_served(self) -> Mapping[str, str]:
        """Its default fields gpuscope does not serve, and why (the same in both versions)."""
        return NOT_SERVED


@dataclass(frozen=True, slots=True)
class _Change:
    """A 4.8 field's 4.9.0 unit and help; `to_49` converts a 4.8 value into 4.9's unit."""

    unit: str
    help: str
    to_49: float = 1.0


_MHZ_TO_HZ: Final = 1e6
_MJ_TO_J: Final = 1e-3
_PERCENT_TO_RATIO: Final = 1e-2
_MIB_TO_BYTES: Final = float(2**20)

_CHANGES: Final[Mapping[str, _Change]] = {
    "DCGM_FI_DEV_SM_CLOCK": _Change("Hz", "SM clock frequency (in Hz).", _MHZ_TO_HZ),
    "DCGM_FI_DEV_MEM_CLOCK": _Change("Hz", "Memory clock frequency (in Hz).", _MHZ_TO_HZ),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": _Change(
        "J", "Total energy consumption since the driver was last reloaded (in J).", _MJ_TO_J
    ),
    "DCGM_FI_DEV_GPU_UTIL": _Change("ratio", "GPU utilization (0 to 1).", _PERCENT_TO_RATIO),
    "DCGM_FI_DEV_MEM_COPY_UTIL": _Change(
        "ratio", "Memory utilization (0 to 1).", _PERCENT_TO_RATIO
    ),
    "DCGM_FI_DEV_ENC_UTIL": _Change("ratio", "Encoder utilization (0 to 1).", _PERCENT_TO_RATIO),
    "DCGM_FI_DEV_DEC_UTIL": _Change("ratio", "Decoder utilization (0 to 1).", _PERCENT_TO_RATIO),
    "DCGM_FI_DEV_FB_FREE": _Change("bytes", "Framebuffer memory free (in bytes).", _MIB_TO_BYTES),
    "DCGM_FI_DEV_FB_USED": _Change("bytes", "Framebuffer memory used (in bytes).", _MIB_TO_BYTES),
    "DCGM_FI_DEV_FB_RESERVED": _Change(
        "bytes", "Framebuffer memory reserved (in bytes).", _MIB_TO_BYTES
    ),
}
"""The 10 renamed fields whose value changes unit; the 11th, NVLink's throughput, is a new
reading (`_NVLINK_THROUGHPUT`) rather than 4.8's byte counter in another unit."""

_NVLINK_THROUGHPUT: Final = Field(
    RENAMED_IN_49["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"],
    "gauge",
    "Aggregate NVLink throughput across all lanes (in bytes per second).",
    "bytes/s",
    sources=(Source(NVLINK_TRANSMIT), Source(NVLINK_RECEIVE)),
    summed=True,
    default=True,
    note="GPM's NVLink rates, sent plus received, payload only (DCGM may count headers too): "
    "Hopper and newer, absent on GPUs without NVLink",
)
_FB_CAPACITY: Final = Field(
    "DCGM_FI_DEV_FB_CAPACITY_BYTES",
    "gauge",
    "Total framebuffer memory (in bytes).",
    "bytes",
    sources=(Source(MEMORY_TOTAL),),
    default=True,
    note="new in 4.9.0's defaults (4.8: `DCGM_FI_DEV_FB_TOTAL`, MiB, opt-in)",
)


def _renamed(field: Field) -> Field:
    new = RENAMED_IN_49.get(field.name)
    if new is None:
        return field
    if field.name == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":
        return _NVLINK_THROUGHPUT
    change = _CHANGES.get(field.name)
    if change is None:
        return replace(field, name=new)
    sources = tuple(
        replace(source, factor=source.factor * change.to_49) for source in field.sources
    )
    return replace(field, name=new, help=change.help, unit=change.unit, sources=sources)


def _fields_49() -> tuple[Field, ...]:
    fields: list[Field] = []
    for field in FIELDS:
        fields.append(_renamed(field))
        if field.name == "DCGM_FI_DEV_FB_RESERVED":  # 4.9.0's file lists it after the others
            fields.append(_FB_CAPACITY)
    return tuple(fields)


VERSION_48: Final = DcgmVersion("4.8", FIELDS, "Hostname", DRIVER_VERSION, XID_ERRORS)
VERSION_49: Final = DcgmVersion(
    "4.9",
    _fields_49(),
    "hostname",
    RENAMED_IN_49[DRIVER_VERSION],
    RENAMED_IN_49[XID_ERRORS],
)
VERSIONS: Final[Mapping[str, DcgmVersion]] = {
    version.name: version for version in (VERSION_48, VERSION_49)
}
"""By `--compat.dcgm-version` (its choices are `exporter.dcgm_counters.DCGM_VERSIONS`)."""
