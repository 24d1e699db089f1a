"""Devices handed out by Dynamic Resource Allocation, as attribution needs them; pure.

A DRA driver publishes its devices in ResourceSlices (`resource.k8s.io/v1`): each slice belongs to
one driver's pool on one node and names its devices; (driver, pool, device name) is a device's
identity, and that is all the kubelet's PodResources answer says of a device a claim holds.
`slice_from_api` keeps of each device what names its GPU: the `uuid` attribute (a whole GPU's
`GPU-…`, a static MIG device's `MIG-…`), else, for a MIG device that has none yet, its parent's
`parentUUID` and its `profile` (NVIDIA's `gpu.nvidia.com` driver publishes them so; an attribute
may also be written with the driver's domain, `gpu.nvidia.com/uuid`). `DeviceIndex` holds each
pool's newest generation only, as the API asks consumers to. The ResourceSlice watch
(`exporter.attribution.resourceslices`) feeds it from the API server, the simulator
(`exporter.simulator.cluster`) from a fleet file.

`SLICE_SHAPE` is what the watch reads of a slice as it arrives: its name, driver and pool, and of
each device its name, the attributes above and its `capacity.memory` (what a share of it is
measured against when DRA shares its capacity) (at most `MAX_DEVICES` devices, as many as the API
lets a slice hold); the rest of a slice is scanned past, never built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.attribution.jsonstream import TEXT, Entries, Fields, Items, Scalar
from exporter.attribution.shares import ShareError, quantity

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

UUID: Final = "uuid"
PARENT_UUID: Final = "parentUUID"
PROFILE: Final = "profile"
MEMORY: Final = "memory"
MAX_DEVICES: Final = 128
"""Devices a ResourceSlice may list (the API's limit)."""
_NAMING: Final = frozenset({UUID, PARENT_UUID, PROFILE})


def _names_a_gpu(attribute: str) -> bool:
    """An attribute `_string_attribute` may read: a naming one, bare or with a domain."""
    return attribute.rpartition("/")[2] in _NAMING


SLICE_SHAPE: Final = Fields(
    {
        "metadata": Fields({"name": TEXT}),
        "spec": Fields(
            {
                "driver": TEXT,
                "pool": Fields({"name": TEXT, "generation": Scalar()}),
                "devices": Items(
                    Fields(
                        {
                            "name": TEXT,
                            "attributes": Entries(
                                Fields({"string": TEXT}), keep=_names_a_gpu, max_entries=16
                            ),
                            "capacity": Entries(
                                Fields({"value": TEXT}), keep=MEMORY.__eq__, max_entries=1
                            ),
                        }
                    ),
                    max_items=MAX_DEVICES,
                ),
            }
        ),
    }
)


class SliceFormatError(ValueError):
    """A ResourceSlice without the fields every slice has; `str()` names the missing one."""


@dataclass(frozen=True, slots=True)
class DraDevice:
    """What names the GPU behind one DRA device."""

    uuid: str
    """`GPU-…` or `MIG-…`; "" when the slice gives none (a MIG partition not created yet)."""
    parent_uuid: str = ""
    """For a MIG device: its GPU's UUID."""
    profile: str = ""
    """For a MIG device: its profile as NVIDIA names it (`1g.10gb`)."""
    memory: int | None = None
    """Its `capacity.memory` in bytes; None when the slice gives none (or one unreadable)."""

    @property
    def named(self) -> bool:
        """Whether a GPU or MIG instance can be found for it."""
        return bool(self.uuid or (self.parent_uuid and self.profile))


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """What attribution keeps of one ResourceSlice."""

    driver: str
    pool: str
    generation: int
    devices: tuple[tuple[str, DraDevice], ...]
    """(device name, device), in the slice's order."""


def slice_from_api(obj: Mapping[str, object]) -> ResourceSlice:
    """A `ResourceSlice` from the API's JSON for one slice (v1). Pure."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise SliceFormatError("no spec")
    driver, pool = spec.get("driver"), spec.get("pool")
    if not (isinstance(driver, str) and driver):
        raise SliceFormatError("no spec.driver")
    if not isinstance(pool, dict):
        raise SliceFormatError("no spec.pool")
    name, generation = pool.get("name"), pool.get("generation", 0)
    if not (isinstance(name, str) and name):
        raise SliceFormatError("no spec.pool.name")
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise SliceFormatError("spec.pool.generation is not a number")
    devices: list[tuple[str, DraDevice]] = []
    for device in spec.get("devices") or ():
        if not isinstance(device, dict):
            continue
        device_name = device.get("name")
        if not (isinstance(device_name, str) and device_name):
            continue
        attributes = device.get("attributes")
        if not isinstance(attributes, dict):
            attributes = {}
        uuid, parent, profile = (
            _string_attribute(attributes, driver, key) for key in (UUID, PARENT_UUID, PROFILE)
        )
        devices.append(
            (device_name, DraDevice(uuid, parent, profile, _memory(device.get("capacity"))))
        )
    return ResourceSlice(driver, name, generation, tuple(devices))


def _memory(capacity: object) -> int | None:
    """A device's `capacity.memory` in bytes; None for none, or one that is not a quantity."""
    value = capacity.get(MEMORY) if isinstance(capacity, dict) else None
    text = value.get("value") if isinstance(value, dict) else None
    if not isinstance(text, str):
        return None
    try:
        return quantity(text)
    except ShareError:
        return None


def _string_attribute(attributes: Mapping[str, object], driver: str, key: str) -> str:
    """A string attribute by its bare name or qualified with the driver's domain; "" if none."""
    value = attributes.get(key)
    if value is None:
        value = attributes.get(f"{driver}/{key}")
    found = value.get("string") if isinstance(value, dict) else None
    return found if isinstance(found, str) else ""


@dataclass(frozen=True, slots=True)
class DeviceIndex:
    """The DRA devices of this node: (driver, pool, device name) -> device, from each pool's
    newest generation of slices. Immutable once built."""

    devices: Mapping[tuple[str, str, str], DraDevice]

    @classmethod
    def of(cls, slices: Iterable[ResourceSlice]) -> DeviceIndex:
        kept = list(slices)
        newest: dict[tuple[str, str], int] = {}
        for piece in kept:
            pool = (piece.driver, piece.pool)
            newest[pool] = max(newest.get(pool, piece.generation), piece.generation)
        return cls(
            {
                (piece.driver, piece.pool, name): device
                for piece in kept
                if piece.generation == newest[(piece.driver, piece.pool)]
                for name, device in piece.devices
            }
        )

    def get(self, driver: str, pool: str, device: str) -> DraDevice | None:
        return self.devices.get((driver, pool, device))

    def __len__(self) -> int:
        return len(self.devices)


NO_DEVICES: Final = DeviceIndex({})
