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

The answer lists every container of every pod on the node, so tenants make it as large as they
like (a pod of 50,000 containers is 1.5 MiB); decoding it as protobuf messages would hold ten
times its size (an answer of 16 MiB of tiny containers took 230 MiB and 9 s). It is walked on
the wire instead (`allocations_from_answer`): nothing is built but the allocations of the
resources and drivers read here, a container is looked into only if it can hold devices, and
the kubelet is asked again no sooner than `PACE` times what the last answer took to read.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final, NamedTuple

from exporter.attribution.grpcwire import GrpcCallError, unary_call
from exporter.config import DRA_DRIVERS
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from pathlib import Path

log = logging.getLogger(__name__)

LIST_METHOD: Final = "/v1.PodResourcesLister/List"
LIST_REQUEST: Final = b""
"""`ListPodResourcesRequest`, which has no fields."""
GPU_RESOURCES: Final = ("nvidia.com/gpu", "nvidia.com/mig-*")
"""Always read; `--kubelet.resource-names` adds more. A trailing * matches a prefix."""
MIN_PERIOD_SECONDS: Final = 5.0
"""A new pod's allocation shows within this long; the kubelet rate-limits the API."""
PACE: Final = 10.0
"""The kubelet is asked again no sooner than this many times what reading its last answer took:
a node whose answer tenants have blown up costs the daemon at most a tenth of a core."""
STALE_SECONDS: Final = 60.0
MAX_TIMEOUT_SECONDS: Final = 1.0
MAX_MESSAGE_BYTES: Final = 16 * 2**20
"""kubelet answers for every pod on the node; the kubelet's own client allows 16 MiB too."""
MAX_ALLOCATIONS: Final = 16_384
"""Allocations kept of one answer: every device of a node handed out many times over (time-
slicing replicas); past this, the rest are not exported (logged once)."""
MAX_NAME: Final = 1024
"""Names read from the answer are cut to this many characters (the API allows 253)."""


class AnswerError(ValueError):
    """The kubelet's answer is not a `ListPodResourcesResponse` in protobuf's wire format."""


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
    consumed_memory: int | None = None
    """With a `share_id`: the bytes of the device's memory the claim's allocation consumes
    (`consumedCapacity.memory`), once its claim is read (`exporter.attribution.claims`)."""


_Held = tuple[str, str, str, str, str, str, str]
"""A container's device before its pod's name is known: resource, device id, driver, pool,
claim, claim namespace, share id."""

# Field numbers of podresources/v1's messages (api.proto), and the one-byte key of a
# length-delimited field (number << 3 | 2) where a filter looks for it.
_POD_RESOURCES = 1  # ListPodResourcesResponse.pod_resources
_NAME, _NAMESPACE, _CONTAINERS = 1, 2, 3  # PodResources
_DEVICES, _DYNAMIC = 2, 5  # ContainerResources (1: name)
_DEVICES_KEY, _DYNAMIC_KEY = b"\x12", b"\x2a"
_RESOURCE_NAME, _DEVICE_IDS = 1, 2  # ContainerDevices
_CLAIM_NAME, _CLAIM_NAMESPACE, _CLAIM_RESOURCES = 2, 3, 4  # DynamicResource
_DRIVER, _POOL, _DEVICE, _SHARE = 2, 3, 4, 5  # ClaimResource
_LENGTH_DELIMITED, _VARINT, _FIXED64, _FIXED32 = 2, 0, 1, 5


def allocations_from_answer(
    answer: bytes | bytearray,
    matches: Callable[[str], bool],
    drivers: frozenset[str] = frozenset(DRA_DRIVERS),
    *,
    max_allocations: int = MAX_ALLOCATIONS,
) -> tuple[DeviceAllocation, ...]:
    """Every allocated device whose resource name `matches`, and every device of a DRA driver
    in `drivers`, from a serialized `ListPodResourcesResponse` (at most `max_allocations`).
    Raises `AnswerError`. Pure."""
    found: list[DeviceAllocation] = []
    for number, start, end in _fields(answer, 0, len(answer)):
        if number == _POD_RESOURCES:
            found.extend(_pod(answer, start, end, matches, drivers))
            if len(found) >= max_allocations:
                return tuple(found[:max_allocations])
    return tuple(found)


def _pod(
    data: bytes | bytearray,
    start: int,
    end: int,
    matches: Callable[[str], bool],
    drivers: frozenset[str],
) -> list[DeviceAllocation]:
    name = namespace = ""
    held: list[tuple[str, _Held]] = []
    position = start
    while position < end:
        # The fields of a pod, walked here rather than through `_fields`: a pod may have
        # tens of thousands of containers, and this loop is most of the time an answer takes.
        key, position = _varint(data, position, end)
        if key & 7 != _LENGTH_DELIMITED:
            position = _step_over(data, key, position, end)
            continue
        length, position = _varint(data, position, end)
        value, position = position, position + length
        if position > end:
            raise AnswerError("a field runs past the end of its message")
        number = key >> 3
        if number == _NAME:
            name = _text(data, value, position)
        elif number == _NAMESPACE:
            namespace = _text(data, value, position)
        elif number == _CONTAINERS and (
            # Containers holding nothing are most of a large answer: one scan of their bytes
            # for the keys of the two fields that hold devices (always one byte, as every
            # protobuf encoder writes small field numbers) skips them without walking.
            data.find(_DEVICES_KEY, value, position) >= 0
            or data.find(_DYNAMIC_KEY, value, position) >= 0
        ):
            held.extend(_container(data, value, position, matches, drivers))
    return [DeviceAllocation(namespace, name, container, *device) for container, device in held]


def _container(
    data: bytes | bytearray,
    start: int,
    end: int,
    matches: Callable[[str], bool],
    drivers: frozenset[str],
) -> list[tuple[str, _Held]]:
    name = ""
    held: list[_Held] = []
    for number, value, value_end in _fields(data, start, end):
        if number == _NAME:
            name = _text(data, value, value_end)
        elif number == _DEVICES:
            resource, ids = "", []
            for field, at, until in _fields(data, value, value_end):
                if field == _RESOURCE_NAME:
                    resource = _text(data, at, until)
                elif field == _DEVICE_IDS:
                    ids.append((at, until))
            if matches(resource):
                held.extend(
                    (resource, _text(data, at, until), "", "", "", "", "") for at, until in ids
                )
        elif number == _DYNAMIC and drivers:
            held.extend(_claim(data, value, value_end, drivers))
    return [(name, device) for device in held]


def _claim(data: bytes | bytearray, start: int, end: int, drivers: frozenset[str]) -> list[_Held]:
    claim = claim_namespace = ""
    devices: list[tuple[str, str, str, str]] = []
    for number, value, value_end in _fields(data, start, end):
        if number == _CLAIM_NAME:
            claim = _text(data, value, value_end)
        elif number == _CLAIM_NAMESPACE:
            claim_namespace = _text(data, value, value_end)
        elif number == _CLAIM_RESOURCES:
            device = {_DRIVER: "", _POOL: "", _DEVICE: "", _SHARE: ""}
            for field, at, until in _fields(data, value, value_end):
                if field in device:
                    device[field] = _text(data, at, until)
            if device[_DRIVER] in drivers and device[_DEVICE]:
                devices.append((device[_DRIVER], device[_POOL], device[_DEVICE], device[_SHARE]))
    return [
        (driver, device, driver, pool, claim, claim_namespace, share)
        for driver, pool, device, share in devices
    ]


def _fields(data: bytes | bytearray, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(number, start, end) of each length-delimited field of the message in `data[start:end]`;
    fields of the other wire types carry nothing read here and are stepped over."""
    position = start
    while position < end:
        key, position = _varint(data, position, end)
        if key & 7 != _LENGTH_DELIMITED:
            position = _step_over(data, key, position, end)
            continue
        length, position = _varint(data, position, end)
        if position + length > end:
            raise AnswerError("a field runs past the end of its message")
        yield key >> 3, position, position + length
        position += length


def _step_over(data: bytes | bytearray, key: int, position: int, end: int) -> int:
    """Past the value of a field that is not length-delimited."""
    wire = key & 7
    if wire == _VARINT:
        position = _varint(data, position, end)[1]
    elif wire in (_FIXED64, _FIXED32):
        position += 8 if wire == _FIXED64 else 4
    else:
        raise AnswerError(f"a field of wire type {wire}, which proto3 never writes")
    if position > end:
        raise AnswerError("a field runs past the end of its message")
    return position


def _varint(data: bytes | bytearray, position: int, end: int) -> tuple[int, int]:
    byte = data[position] if position < end else 0x80
    if byte < 0x80:  # most varints here are one byte: a key, a short length
        return byte, position + 1
    value = shift = 0
    while position < end and shift < 64:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    raise AnswerError("a number runs past the end of its message")


def _text(data: bytes | bytearray, start: int, end: int) -> str:
    return bytes(data[start : min(end, start + 4 * MAX_NAME)]).decode(errors="replace")[:MAX_NAME]


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
        self._period = MIN_PERIOD_SECONDS
        self._asked_before = False
        self._healthy = False

    def allocations(self) -> tuple[tuple[DeviceAllocation, ...] | None, bool]:
        """(allocations, healthy): the latest answer (None when there is none, or it is older
        than `STALE_SECONDS`) and whether the last call succeeded."""
        now = self._clock()
        if self._asked_at is None or now - self._asked_at >= self._period:
            self._asked_before = self._asked_at is not None
            self._asked_at = now
            self._healthy = self._ask(now)
            self._period = max(MIN_PERIOD_SECONDS, PACE * (self._clock() - now))
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
                LIST_REQUEST,
                timeout=self._timeout,
                max_response_bytes=MAX_MESSAGE_BYTES,
            )
            allocations = allocations_from_answer(answer, self._matches, self._drivers)
        except (GrpcCallError, AnswerError) as error:
            name = error.code if isinstance(error, GrpcCallError) else "DATA_LOSS"
            self._once(
                logging.WARNING,
                ("call", name),
                "the kubelet's pod-resources List failed; keeping the last answer for a while",
                fields={"socket": str(self._socket), "code": name, "error": str(error)},
            )
            return False
        if len(allocations) >= MAX_ALLOCATIONS:
            self._once(
                logging.WARNING,
                ("too many",),
                f"the kubelet lists more than {MAX_ALLOCATIONS:,} allocations of the resources "
                "gpuscope reads; the rest are not exported",
                fields={"socket": str(self._socket)},
            )
        self._answer = allocations
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
