"""MIG instances: enumerating them each cycle, and how NVIDIA names their profiles.

A MIG device's NVML name is its parent's followed by the profile (`NVIDIA H100 80GB HBM3 MIG
3g.40gb`). Where a driver names it otherwise, the profile comes from the instance's slices and
memory, matched against the parent model's profiles in the catalog.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.catalog import GIB, builtin_catalog
from exporter.nvml.gpm import GpmReader
from exporter.nvml.reads import Device

if TYPE_CHECKING:
    from exporter.catalog import Catalog
    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Reads

COLLECTOR: Final = "mig"

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


def enumerate_instances(
    nvml: NvmlDriver, reads: Reads, parent: Device, *, gpm: bool
) -> dict[str, Device]:
    """Every MIG instance of a GPU in MIG mode, by UUID, enumerated afresh so that instances
    created or destroyed since the last cycle appear or vanish. Instances seen before keep
    their state; destroyed ones release theirs."""
    if not parent.mig_slots:  # MIG mode came on after the GPU was opened
        slots = reads.call(
            parent, "mig_slots", COLLECTOR, nvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle
        )
        parent.mig_slots = slots or 0
    seen: dict[str, Device] = {}
    for slot in range(parent.mig_slots):
        found = _handle(nvml, reads, parent, slot)
        if found is None:
            continue
        handle, uuid = found
        instance = parent.mig.get(uuid) or _open(nvml, reads, parent, handle, uuid, gpm=gpm)
        if instance is not None:
            instance.handle = handle
            seen[uuid] = instance
    for uuid, gone in parent.mig.items():
        if uuid not in seen:
            parent.integrals.activity_seconds.pop(uuid, None)  # destroyed: never returns
            if gone.gpm is not None:
                gone.gpm.free()
    parent.mig = seen
    return seen


def _handle(nvml: NvmlDriver, reads: Reads, parent: Device, slot: int) -> tuple[Any, str] | None:
    """The handle and UUID of the MIG device in `slot`; None for an empty slot."""
    if "mig_devices" in parent.unavailable:
        return None
    try:
        handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
        return handle, text(nvml.nvmlDeviceGetUUID(handle))
    except pynvml.NVMLError_NotFound:
        return None  # no MIG device in this slot
    except Exception as error:  # noqa: BLE001 - one slot fails alone; a lost GPU escapes
        reads.failed(parent, "mig_devices", COLLECTOR, error)
        return None


def _open(
    nvml: NvmlDriver, reads: Reads, parent: Device, handle: Any, uuid: str, *, gpm: bool
) -> Device | None:
    if "mig_instance" in parent.unavailable:
        return None
    try:
        gpu_instance = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
        name = text(nvml.nvmlDeviceGetName(handle))
    except Exception as error:  # noqa: BLE001 - an instance that cannot be named is skipped
        reads.failed(parent, "mig_instance", COLLECTOR, error)
        return None
    profile = profile_from_name(name)
    if profile is None:
        try:
            attributes = nvml.nvmlDeviceGetAttributes_v2(handle)
        except pynvml.NVMLError:
            attributes = None
        profile = (
            profile_from_attributes(
                parent.identity.model,
                int(attributes.gpuInstanceSliceCount),
                int(attributes.memorySizeMB),
            )
            if attributes is not None
            else ""
        )
    identity = replace(
        parent.identity,
        uuid=uuid,
        mig_profile=profile,
        gpu_instance=gpu_instance,
        parent_uuid=parent.identity.uuid,
        has_gpm=gpm and parent.gpm is not None,
    )
    # NVML has no per-process utilization on MIG devices: do not ask.
    instance = Device(
        handle,
        identity,
        integrals=parent.integrals,
        tally=parent.tally,
        unavailable={"process_utilization"},
    )
    if gpm and parent.gpm is not None:
        parent_handle = parent.handle
        instance.gpm = GpmReader(
            nvml, lambda sample: nvml.nvmlGpmMigSampleGet(parent_handle, gpu_instance, sample)
        )
    return instance


def text(value: str | bytes) -> str:
    """A name or UUID as text (older bindings give bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
