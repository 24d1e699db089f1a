"""Dynamic Resource Allocation objects for the stand-in API server (`resource.k8s.io/v1`):
ResourceSlices (list and watch, by `spec.nodeName` and `spec.driver`), ResourceClaims and
DeviceClasses (read one by one), built with the kubernetes client's own models and serialized
by its ApiClient, so the JSON is the API's. Devices look as NVIDIA's DRA driver publishes them
(`gpu.nvidia.com`: one pool per node named after it, `gpu-<minor>`, MIG devices with
`parentUUID` and `profile`, and a `uuid` when the MIG device exists)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from kubernetes.client import (
    ApiClient,
    ResourceV1ResourceClaim,
    V1AllocationResult,
    V1CELDeviceSelector,
    V1Device,
    V1DeviceAllocationResult,
    V1DeviceAttribute,
    V1DeviceCapacity,
    V1DeviceClaim,
    V1DeviceClass,
    V1DeviceClassSpec,
    V1DeviceRequest,
    V1DeviceRequestAllocationResult,
    V1DeviceSelector,
    V1DeviceSubRequest,
    V1ExactDeviceRequest,
    V1ObjectMeta,
    V1ResourceClaimConsumerReference,
    V1ResourceClaimSpec,
    V1ResourceClaimStatus,
    V1ResourcePool,
    V1ResourceSlice,
    V1ResourceSliceSpec,
)

from tests.fake_kube.pods import NODE
from tests.fake_kube.server import Collection

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from tests.fake_kube.server import FakeKube

GROUP: Final = "resource.k8s.io"
PREFIX: Final = f"/apis/{GROUP}/v1"
DRIVER: Final = "gpu.nvidia.com"
RESOURCE_SLICES: Final = Collection(
    plural="resourceslices",
    kind="ResourceSlice",
    prefix=PREFIX,
    fields={
        "spec.nodeName": lambda piece: str(piece.get("spec", {}).get("nodeName", "")),
        "spec.driver": lambda piece: str(piece.get("spec", {}).get("driver", "")),
    },
)
RESOURCE_CLAIMS: Final = Collection(plural="resourceclaims", kind="ResourceClaim", prefix=PREFIX)
DEVICE_CLASSES: Final = Collection(plural="deviceclasses", kind="DeviceClass", prefix=PREFIX)
_SERIALIZER: Final = ApiClient()


def _json(model: object) -> dict[str, Any]:
    document: dict[str, Any] = _SERIALIZER.sanitize_for_serialization(model)
    return document


def gpu_device(name: str, uuid: str, *, product: str = "NVIDIA H100 80GB HBM3") -> V1Device:
    """A whole GPU as the driver publishes it."""
    return V1Device(
        name=name,
        attributes={
            "type": V1DeviceAttribute(string="gpu"),
            "uuid": V1DeviceAttribute(string=uuid),
            "productName": V1DeviceAttribute(string=product),
            "brand": V1DeviceAttribute(string="Nvidia"),
            "architecture": V1DeviceAttribute(string="Hopper"),
            "driverVersion": V1DeviceAttribute(version="570.133.20"),
            "cudaComputeCapability": V1DeviceAttribute(version="9.0.0"),
            "resource.kubernetes.io/pciBusID": V1DeviceAttribute(string="0000:18:00.0"),
        },
        capacity={"memory": V1DeviceCapacity(value="80Gi")},
    )


def mig_device(name: str, parent_uuid: str, profile: str, uuid: str | None = None) -> V1Device:
    """A MIG device: with its `uuid` when it exists (static MIG), without for a DynamicMIG
    partition not created yet."""
    attributes = {
        "type": V1DeviceAttribute(string="mig"),
        "parentUUID": V1DeviceAttribute(string=parent_uuid),
        "profile": V1DeviceAttribute(string=profile),
        "productName": V1DeviceAttribute(string="NVIDIA H100 80GB HBM3"),
    }
    if uuid is not None:
        attributes["uuid"] = V1DeviceAttribute(string=uuid)
    return V1Device(
        name=name,
        attributes=attributes,
        capacity={"multiprocessors": V1DeviceCapacity(value="16")},
    )


def resource_slice(
    name: str,
    devices: Sequence[V1Device],
    *,
    node: str = NODE,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
    slices_in_pool: int = 1,
) -> dict[str, Any]:
    """A ResourceSlice of `driver`'s pool on `node` (the pool is named after the node)."""
    return _json(
        V1ResourceSlice(
            api_version=f"{GROUP}/v1",
            kind="ResourceSlice",
            metadata=V1ObjectMeta(name=name),
            spec=V1ResourceSliceSpec(
                driver=driver,
                node_name=node,
                pool=V1ResourcePool(
                    name=pool or node, generation=generation, resource_slice_count=slices_in_pool
                ),
                devices=list(devices),
            ),
        )
    )


def resource_claim(
    name: str,
    namespace: str,
    devices: Iterable[str],
    *,
    device_class: str = DRIVER,
    first_available: bool = False,
    pool: str = NODE,
    driver: str = DRIVER,
    reserved_for: Iterable[tuple[str, str]] = (),
    share_ids: Sequence[str | None] = (),
    consumed_memory: Sequence[str | None] = (),
) -> dict[str, Any]:
    """An allocated claim: one request (`gpus`; `gpus/whole` when `device_class` was chosen
    among `firstAvailable` classes) given `devices` of `driver`'s pool, reserved for the
    (pod name, uid) consumers; `share_ids` gives each device a share of its capacity, and
    `consumed_memory` the memory that share consumes (a quantity, `20Gi`)."""
    request = (
        V1DeviceRequest(
            name="gpus",
            first_available=[
                V1DeviceSubRequest(name="small", device_class_name="mig.nvidia.com"),
                V1DeviceSubRequest(name="whole", device_class_name=device_class),
            ],
        )
        if first_available
        else V1DeviceRequest(
            name="gpus",
            exactly=V1ExactDeviceRequest(
                device_class_name=device_class,
                selectors=[
                    V1DeviceSelector(
                        cel=V1CELDeviceSelector(expression=f"device.driver == '{driver}'")
                    )
                ],
            ),
        )
    )
    results = [
        V1DeviceRequestAllocationResult(
            request="gpus/whole" if first_available else "gpus",
            driver=driver,
            pool=pool,
            device=device,
            share_id=share_ids[n] if n < len(share_ids) else None,
            consumed_capacity={"memory": memory}
            if n < len(consumed_memory) and (memory := consumed_memory[n])
            else None,
        )
        for n, device in enumerate(devices)
    ]
    return _json(
        ResourceV1ResourceClaim(
            api_version=f"{GROUP}/v1",
            kind="ResourceClaim",
            metadata=V1ObjectMeta(name=name, namespace=namespace, uid=f"claim-{namespace}-{name}"),
            spec=V1ResourceClaimSpec(devices=V1DeviceClaim(requests=[request])),
            status=V1ResourceClaimStatus(
                allocation=V1AllocationResult(devices=V1DeviceAllocationResult(results=results)),
                reserved_for=[
                    V1ResourceClaimConsumerReference(resource="pods", name=pod, uid=uid)
                    for pod, uid in reserved_for
                ],
            ),
        )
    )


def device_class(name: str, *, kind: str, extended_resource: str | None = None) -> dict[str, Any]:
    """A DeviceClass selecting the driver's devices of one `type` (gpu, mig)."""
    return _json(
        V1DeviceClass(
            api_version=f"{GROUP}/v1",
            kind="DeviceClass",
            metadata=V1ObjectMeta(name=name),
            spec=V1DeviceClassSpec(
                selectors=[
                    V1DeviceSelector(
                        cel=V1CELDeviceSelector(
                            expression=f"device.driver == '{DRIVER}' && "
                            f"device.attributes['{DRIVER}'].type == '{kind}'"
                        )
                    )
                ],
                extended_resource_name=extended_resource,
            ),
        )
    )


NVIDIA_CLASSES: Final = (
    device_class(DRIVER, kind="gpu", extended_resource="nvidia.com/gpu"),
    device_class("mig.nvidia.com", kind="mig"),
)
"""The classes NVIDIA's driver installs (on a v1 API the GPU class has an extended resource)."""


def serve_dra(server: FakeKube, *objects: tuple[str, dict[str, Any]]) -> FakeKube:
    """Serve resource.k8s.io/v1 with NVIDIA's DeviceClasses and `objects` ((plural, object))."""
    for collection in (RESOURCE_SLICES, RESOURCE_CLAIMS, DEVICE_CLASSES):
        server.serve(collection)
    for item in NVIDIA_CLASSES:
        server.put("deviceclasses", item)
    for plural, item in objects:
        server.put(plural, item)
    return server
