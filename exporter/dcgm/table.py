"""The tables of DCGM fields in docs/guide/dcgm.md (`scripts/reference.py` keeps them equal to
this): what each field is made from, and how a GPU several pods share splits it, and what
dcgm-exporter 4.9.0 renamed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.dcgm.versions import NOT_SERVED, VERSION_48, VERSION_49
from exporter.dcgm_counters import ADDED_IN_49, RENAMED_IN_49

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.dcgm.fields import Field, Split
    from exporter.dcgm.versions import DcgmVersion
    from exporter.series import Series

_SHARED: Final[Mapping[Split | None, str]] = {
    "utilization": "per pod, by its processes' utilization",
    "memory": "per pod, by its processes' memory",
    None: "once, for the device",
}
_INFERRED: Final = frozenset(
    {
        "DCGM_FI_DEV_MEMORY_COPY_UTIL_RATIO",
        "DCGM_FI_DEV_ENC_UTIL_RATIO",
        "DCGM_FI_DEV_DEC_UTIL_RATIO",
        "DCGM_FI_DEV_FB_FREE_BYTES",
        "DCGM_FI_DEV_FB_USED_BYTES",
        "DCGM_FI_DEV_FB_RESERVED_BYTES",
    }
)
"""4.9.0 names no published source spells: inferred from DCGM's field naming standard."""
_NAMED_BY: Final = {
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL": "DCGM 4.6's name of field 449 (MB/s there); the "
    "bytes/s field of DCGM 4.7 may be named otherwise",
    "DCGM_FI_SYSTEM_DRIVER_VERSION": "4.9.0's release notes",
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": "DCGM 4.6.1's base-unit fields",
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": "DCGM 4.6.1's base-unit fields",
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": "DCGM 4.6.1's base-unit fields",
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": "4.9.0's release notes (a new default)",
}
"""Where a 4.9.0 name comes from, where it is not DCGM 4.6's header (or inferred)."""


def _factor(factor: float) -> str:
    if factor == 1.0:
        return ""
    if factor > 1.0:
        return f" * {factor:,.0f}"
    return f" / {1.0 / factor:,.0f}"


def _from(field: Field) -> str:
    if field.derived:
        return field.derived
    if field.bits:
        return "bits of `gpu_clock_event_active` (NVML's clock-event reason bits)"
    if field.totals:
        summed = " and ".join(f"`{_shown(template)}`" for template in field.totals)
        return f"{summed}, summed over the links"
    return (" + " if field.summed else ", else ").join(
        f"`{_shown(source.series)}`{_factor(source.factor)}" for source in field.sources
    )


def _shown(series: Series) -> str:
    """`family{label="value"}`, as a query names the series."""
    labels = ",".join(f'{name}="{value}"' for name, value in series.labels)
    name = series.family.exposed_name
    return f"{name}{{{labels}}}" if labels else name


def fields_table(*, version: DcgmVersion = VERSION_48) -> str:
    """The table of DCGM fields: what each is made from, and how shared GPUs split it."""
    rows = [
        "| DCGM field | default | type | unit | from gpuscope's | on a GPU pods share | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for field in version.fields:
        shared = "a label" if field.kind == "label" else _SHARED[field.split]
        rows.append(
            f"| `{field.name}` | {'yes' if field.default else ''} | {field.kind} | {field.unit} "
            f"| {_from(field)} | {shared} | {field.note} |"
        )
    rows.extend(
        f"| `{name}` | yes | | | not served | | {why} |" for name, why in NOT_SERVED.items()
    )
    return "\n".join(rows)


def renames_table() -> str:
    """What `--compat.dcgm-version=4.9` serves in place of each renamed 4.8 field, in what unit."""
    old = VERSION_48.by_name
    new = VERSION_49.by_name
    rows = [
        "| 4.8 name | 4.8 unit | 4.9 name | 4.9 unit | 4.9 type | name from |",
        "|---|---|---|---|---|---|",
    ]
    for before, after in (*RENAMED_IN_49.items(), *((v, k) for k, v in ADDED_IN_49.items())):
        was, now = old[before], new[after]
        source = "inferred" if after in _INFERRED else _NAMED_BY.get(after, "DCGM 4.6's header")
        rows.append(
            f"| `{before}` | {was.unit or 'label'} | `{after}` | {now.unit or 'label'} "
            f"| {now.kind} | {source} |"
        )
    return "\n".join(rows)
