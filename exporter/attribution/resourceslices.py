"""This node's DRA devices, kept current by list + watch (`exporter.attribution.watch`) of
`/apis/resource.k8s.io/v1/resourceslices`, selected by `spec.nodeName` (and `spec.driver` when
one driver is configured; slices of drivers not configured are dropped as they arrive). The
sampler takes an immutable `DeviceIndex` of each pool's newest generation.

A cluster that does not serve `resource.k8s.io/v1` (before Kubernetes 1.34: 404), or a service
account not allowed to read ResourceSlices (403), turns this watch off with one log line: DRA
allocations are then not exported, and nothing more is asked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from exporter.attribution.dra import (
    NO_DEVICES,
    SLICE_SHAPE,
    DeviceIndex,
    ResourceSlice,
    SliceFormatError,
)
from exporter.attribution.dra import slice_from_api as parse_slice
from exporter.attribution.watch import BACKOFF_SECONDS, BATCH_SECONDS, Kind, ListWatch
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from exporter.attribution.cluster import KubernetesClient

log = logging.getLogger(__name__)

RESOURCE_SLICES_PATH: Final = "/apis/resource.k8s.io/v1/resourceslices"
THREAD: Final = "gpuscope-resourceslice-watch"
ABSENT: Final = (
    "the Kubernetes API does not serve resource.k8s.io/v1 ResourceSlices to gpuscope (a cluster "
    "older than 1.34, or RBAC without get, list and watch on resourceslices): DRA is off, GPUs "
    "allocated through ResourceClaims are not exported as allocations"
)

SliceWatch = ListWatch[ResourceSlice, DeviceIndex]


def resource_slice_watch(
    client: KubernetesClient,
    node: str,
    drivers: tuple[str, ...],
    *,
    backoff: tuple[float, ...] = BACKOFF_SECONDS,
    batch_seconds: float = BATCH_SECONDS,
) -> SliceWatch:
    """The list + watch of the ResourceSlices `drivers` publish for `node`."""
    selector = f"spec.nodeName={node}"
    if len(drivers) == 1:
        selector += f",spec.driver={drivers[0]}"
    kind = Kind(
        resource="resourceslices",
        noun="ResourceSlices",
        path=RESOURCE_SLICES_PATH,
        selector=selector,
        shape=SLICE_SHAPE,
        parse=_SliceParser(frozenset(drivers)),
        index=DeviceIndex.of,
        empty=NO_DEVICES,
        optional=True,
        absent=ABSENT,
    )
    return ListWatch(client, kind, thread=THREAD, backoff=backoff, batch_seconds=batch_seconds)


class _SliceParser:
    """A slice of the API's JSON, keyed by name; a malformed one is said once per cause."""

    def __init__(self, drivers: frozenset[str]) -> None:
        self._drivers = drivers
        self._once = LogOnce(log)

    def __call__(self, obj: object) -> tuple[str, ResourceSlice] | None:
        try:
            if not isinstance(obj, dict):
                raise SliceFormatError("not an object")
            metadata = obj.get("metadata")
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not (isinstance(name, str) and name):
                raise SliceFormatError("no metadata.name")
            piece = parse_slice(obj)
        except SliceFormatError as error:
            self._once(
                logging.WARNING,
                ("slice", str(error)),
                "the API sent a ResourceSlice without the fields every slice has; skipping it",
                fields={"problem": str(error)},
            )
            return None
        if piece.driver not in self._drivers:
            return None
        for device, found in piece.devices:
            if not found.named:
                self._once(
                    logging.INFO,
                    ("unnamed", piece.driver, device),
                    "a DRA device names no GPU (no uuid, nor parentUUID and profile): a claim "
                    "on it is not exported as an allocation",
                    fields={"driver": piece.driver, "pool": piece.pool, "device": device},
                )
        return name, piece
