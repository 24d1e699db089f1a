"""The metrics reference's table (docs/reference/metrics.md), made from the family declarations
(`scripts/reference.py` keeps the page equal to it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.catalog import ARCHITECTURES
from exporter.metrics.families import ALL_FAMILIES
from exporter.readings import all_readings

if TYPE_CHECKING:
    from exporter.series import Family

_OWN_ROWS: Final = (
    (
        "| `process_resident_memory_bytes`, `process_virtual_memory_bytes`, "
        "`process_cpu_seconds_total`, `process_open_fds`, `process_max_fds`, "
        "`process_start_time_seconds` | gauge, counter | no GPU labels | | the daemon's own "
        "footprint, as every Prometheus client library reports it; read when a cycle's snapshot "
        "is first rendered (a cycle nobody scrapes reads none of it) and served with it |"
    ),
    (
        "| `python_gc_objects_collected_total`, `python_gc_objects_uncollectable_total`, "
        "`python_gc_collections_total`, `python_info` | counter, gauge | no GPU labels: "
        "`generation`; `implementation`, `version`, … | | the Python runtime's garbage collector "
        "and version |"
    ),
)
"""prometheus_client's own process and platform collectors, which gpuscope serves as they are."""


def _since(family: Family) -> str:
    """ ", Volta and newer" where every reading that fills the family needs a newer GPU."""
    oldest = [r.since for r in all_readings() if any(o.series.family is family for o in r.outputs)]
    if not oldest or "kepler" in oldest:
        return ""
    first = min(oldest, key=ARCHITECTURES.index)
    return f" ({first.capitalize()} and newer)"


def _labels(family: Family) -> str:
    if family.labels_doc:
        return family.labels_doc
    names = ", ".join(f"`{label}`" for label in family.labels)
    if family.gpu:
        return names
    return f"no GPU labels: {names}" if names else "no GPU labels"


def metrics_table() -> str:
    rows = [
        "| metric | type | labels beyond gpu, uuid, model | collector | meaning |",
        "|---|---|---|---|---|",
    ]
    for family in ALL_FAMILIES:
        collector = f"`{family.collector}`" if family.collector else ""
        rows.append(
            f"| `{family.exposed_name}` | {family.kind} | {_labels(family)} | {collector} "
            f"| {family.meaning}{_since(family)} |"
        )
    rows.extend(_OWN_ROWS)
    return "\n".join(rows)
