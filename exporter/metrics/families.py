"""Snapshot -> Prometheus metric families. Pure: the same snapshot always gives the same families.

Families are built fresh from each snapshot (prometheus_client's custom-collector pattern), so a
GPU, process or pod that vanished is simply absent from the next render; nothing to unregister.
Each family is declared once (`exporter.series.Family`): the GPU readings' in
`exporter.readings`, the others beside the code that fills them (`gpu`, `ceilings`,
`attribution`, `daemon`); `ALL_FAMILIES` lists them in the order they are written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.metrics import attribution, ceilings, daemon, gpu
from exporter.metrics.attribution import attribution_families
from exporter.metrics.ceilings import ceiling_families
from exporter.metrics.daemon import BuildInfo, daemon_families
from exporter.metrics.gpu import gpu_families

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from exporter.metrics.dcgm import DcgmCompat
    from exporter.model import Snapshot

__all__ = ["ALL_FAMILIES", "BuildInfo", "snapshot_families"]

ALL_FAMILIES: Final = (*gpu.FAMILIES, *ceilings.FAMILIES, *attribution.FAMILIES, *daemon.FAMILIES)


def snapshot_families(
    snapshot: Snapshot, build: BuildInfo, *, dcgm: DcgmCompat | None = None
) -> list[Metric]:
    """Every family for one snapshot, GPU series first, in a stable order; dcgm-exporter's
    series too under `--compat.dcgm` (`dcgm`, else nothing is spent on them)."""
    return [
        *gpu_families(snapshot.gpus, per_process=snapshot.process_series),
        *ceiling_families(snapshot),
        *attribution_families(snapshot.attribution),
        *(dcgm.families(snapshot) if dcgm is not None else ()),
        *daemon_families(snapshot, build),
    ]
