"""Which container the kubelet gave which GPU: the PodResources v1 `List` over its unix socket.

It is the only record of allocation (a pod holding a GPU it never uses shows up nowhere else):
devices a device plugin handed out (`devices`: a resource name and device ids), and devices
Dynamic Resource Allocation gave a container through a ResourceClaim (`dynamic_resources`: the
claim, and per device its driver, pool and name, and a `share_id` where the device's capacity is
shared); the ResourceSlices of the node name the GPU behind a DRA device
(`exporter.attribution.dra`).
The kubelet rate-limits this API, so it is asked on the sampler's clock — at most once per
`MIN_PERIOD_SECONDS`, since allocations change only when pods start — with a timeout, and the
answer is cached. A socket that is missing or an
answer that fails disables only this source: the last good answer stays for `STALE_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final, NamedTuple

from google.protobuf.message import DecodeError

from exporter.attribution.grpcwire import GrpcCallError, unary_call
from exporter.attribution.proto.podresources_v1_pb2 import (
    ListPodResourcesRequest,
    ListPodResourcesResponse,
)
from exporter.config import DRA_DRIVERS
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

log = logging.getLogger(__name__)

LIST_METHOD: Final = "/v1.PodResourcesLister/List"
GPU_RESOURCES: Final = ("nvidia.com/gpu", "nvidia.com/mig-*")
"""Always read; `--kubelet.resource-names` adds more. A trailing * matches a prefix."""
MIN_PERIOD_SECONDS: Final = 5.0
"""A new pod's allocation shows within this long; the kubelet rate-limits the API."""
STALE_SECONDS: Final = 60.0
MAX_TIMEOUT_SECONDS: Final = 1.0
MAX_MESSAGE_BYTES: Final = 16 * 2**20
"""kubelet answers for every pod on the node; allow far more than gRPC's 4 MiB default."""


class DeviceAllocation(NamedTuple):
    """One device the kubelet allocated to one container (a tuple: hundreds are made every few
    seconds). A device plugin's: `resource` and `device_id`. A DRA device's: `driver`, `pool`
    and its name in `device_id`, the claim, and `resource` the driver's name until the claim's
    DeviceClass gives a better one (`exporter.attribution.claims`)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    driver: str = ""
    """The DRA driver (`gpu.nvidia.com`); "" for a device plugin's device."""
    pool: str = ""
    claim: str = ""
    claim_namespace: str = ""
    share_id: str = ""
    """Set when DRA shares the device's capacity between claims."""


def allocations_from_response(
    response: ListPodResourcesResponse,
    matches: Callable[[str], bool],
    drivers: frozenset[str] = frozenset(DRA_DRIVERS),
) -> tuple[DeviceAllocation, ...]:
    """Every allocated device whose resource name `matches`, and every device of a DRA driver
    in `drivers`. Pure."""
    found: list[DeviceAllocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not matches(devices.resource_name):
                    continue
                found.extend(
                    DeviceAllocation(
                        pod.namespace, pod.name, container.name, devices.resource_name, device_id
                    )
                    for device_id in devices.device_ids
                )
            if not drivers:
                continue
            for claim in container.dynamic_resources:
                found.extend(
                    DeviceAllocation(
                        pod.namespace,
                        pod.name,
                        container.name,
                        device.driver_name,
                        device.device_name,
                        device.driver_name,
                        device.pool_name,
                        claim.claim_name,
                        claim.claim_namespace,
                        device.share_id,
                    )
                    for device in claim.claim_resources
                    if device.driver_name in drivers and device.device_name
                )
    return tuple(found)


def resource_matcher(extra: Iterable[str] = ()) -> Callable[[str], bool]:
    """Whether a resource name is one gpuscope reads (exact names, or prefixes ending in *)."""
    patterns = (*GPU_RESOURCES, *extra)
    exact = frozenset(p for p in patterns if not p.endswith("*"))
    prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
    cache: dict[str, bool] = {}

    def matches(name: str) -> bool:
        known = cache.get(name)
        if known is None:
            known = cache[name] = name in exact or name.startswith(prefixes)
        return known

    return matches


class PodResourcesClient:
    """Asks the kubelet for allocations on the sampler's clock; blocking (worker thread)."""

    def __init__(
        self,
        socket: Path,
        *,
        resource_names: Iterable[str] = (),
        dra_drivers: Iterable[str] = DRA_DRIVERS,
        timeout: float = MAX_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._socket = socket
        self._matches = resource_matcher(resource_names)
        self._drivers = frozenset(dra_drivers)
        self._timeout = min(timeout, MAX_TIMEOUT_SECONDS)
        self._clock = clock
        self._once = LogOnce(log)
        self._answer: tuple[DeviceAllocation, ...] | None = None
        self._answered_at = 0.0
        self._asked_at: float | None = None
        self._asked_before = False
        self._healthy = False

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        """(allocations, healthy): the latest answer (None when there is none, or it is older
        than `STALE_SECONDS`) and whether the last call succeeded."""
        now = self._clock()
        if self._asked_at is None or now - self._asked_at >= MIN_PERIOD_SECONDS:
            self._asked_before = self._asked_at is not None
            self._asked_at = now
            self._healthy = self._ask(now)
        if self._answer is not None and now - self._answered_at > STALE_SECONDS:
            self._answer = None
        return self._answer, self._healthy

    def _ask(self, now: float) -> bool:
        if not _is_socket(self._socket):
            self._once(
                logging.WARNING,
                ("missing",),
                "no kubelet pod-resources socket; GPU allocations are not exported until it "
                "appears (mount /var/lib/kubelet/pod-resources, or set "
                "--kubelet.pod-resources-socket)",
                fields={"socket": str(self._socket)},
            )
            return False
        try:
            answer = unary_call(
                self._socket,
                LIST_METHOD,
                ListPodResourcesRequest().SerializeToString(),
                timeout=self._timeout,
                max_response_bytes=MAX_MESSAGE_BYTES,
            )
            response = ListPodResourcesResponse.FromString(answer)
        except (GrpcCallError, DecodeError) as error:
            name = error.code if isinstance(error, GrpcCallError) else "DATA_LOSS"
            self._once(
                logging.WARNING,
                ("call", name),
                "the kubelet's pod-resources List failed; keeping the last answer for a while",
                fields={"socket": str(self._socket), "code": name, "error": str(error)},
            )
            return False
        self._answer = allocations_from_response(response, self._matches, self._drivers)
        self._answered_at = now
        if not self._healthy and self._asked_before:
            log.info("kubelet pod-resources answers", extra={"socket": str(self._socket)})
            self._once.forget_matching(("missing",))
            self._once.forget_matching(("call",))
        return True


def _is_socket(path: Path) -> bool:
    try:
        return path.is_socket()
    except OSError:
        return False
