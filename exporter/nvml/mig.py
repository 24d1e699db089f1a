"""MIG instances: how NVIDIA names their profiles, from what NVML says about an instance.

A MIG device's NVML name is its parent's followed by the profile (`NVIDIA H100 80GB HBM3 MIG
3g.40gb`). Where a driver names it otherwise, the profile comes from the instance's slices and
memory, matched against the parent model's profiles in the catalog.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from exporter.catalog import GIB, builtin_catalog

if TYPE_CHECKING:
    from exporter.catalog import Catalog

_PROFILE_IN_NAME: Final = re.compile(r"\bMIG\s+(\d+g\.\d+gb)\b")


def profile_from_name(name: str) -> str | None:
    """`NVIDIA A100-SXM4-40GB MIG 1g.5gb` -> `1g.5gb`; None when the name carries no profile."""
    match = _PROFILE_IN_NAME.search(name)
    return match[1] if match else None


def profile_from_attributes(
    parent_model: str,
    gpu_slices: int,
    memory_mib: int,
    *,
    catalog: Catalog | None = None,
) -> str:
    """The catalog profile of `parent_model` with that many compute slices whose usable memory
    is nearest `memory_mib`; without one, NVIDIA's pattern `<slices>g.<GB>gb`."""
    catalog = catalog or builtin_catalog()
    model = catalog.find(parent_model)
    memory = memory_mib * 2**20
    candidates = [p for p in model.mig_profiles if p.compute_slices == gpu_slices] if model else []
    if candidates:
        return min(candidates, key=lambda p: abs(p.memory_bytes - memory)).profile
    return f"{gpu_slices}g.{round(memory / GIB)}gb"
