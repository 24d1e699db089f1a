"""The table of DCGM fields in docs/guide/dcgm.md (`scripts/reference.py` keeps it equal to this): what
each field is made from, and how a GPU several pods share splits it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.dcgm.fields import FIELDS, NOT_SERVED

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.dcgm.fields import Field, Split
    from exporter.series import Series

_SHARED: Final[Mapping[Split | None, str]] = {
    "utilization": "per pod, by its processes' utilization",
    "memory": "per pod, by its processes' memory",
    None: "once, for the device",
}


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
    return ", else ".join(
        f"`{_shown(source.series)}`{_factor(source.factor)}" for source in field.sources
    )


def _shown(series: Series) -> str:
    """`family{label="value"}`, as a query names the series."""
    labels = ",".join(f'{name}="{value}"' for name, value in series.labels)
    name = series.family.exposed_name
    return f"{name}{{{labels}}}" if labels else name


def fields_table() -> str:
    """The table of DCGM fields: what each is made from, and how shared GPUs split it."""
    rows = [
        "| DCGM field | default | type | unit | from gpuscope's | on a GPU pods share | notes |",
        "|---|---|---|---|---|---|---|",
    ]
    for field in FIELDS:
        shared = "a label" if field.kind == "label" else _SHARED[field.split]
        rows.append(
            f"| `{field.name}` | {'yes' if field.default else ''} | {field.kind} | {field.unit} "
            f"| {_from(field)} | {shared} | {field.note} |"
        )
    rows.extend(
        f"| `{name}` | yes | | | not served | | {why} |" for name, why in NOT_SERVED.items()
    )
    return "\n".join(rows)
