"""The resource name a DRA-allocated device is exported under: the `extendedResourceName` of the
DeviceClass its claim asked for (`nvidia.com/gpu` for NVIDIA's `gpu.nvidia.com` class), so that a
GPU held through a claim sits beside one a device plugin handed out; the driver's name
(`gpu.nvidia.com`) where the class has none (NVIDIA's `mig.nvidia.com`), or cannot be read.

The kubelet's answer names a device's claim but not its class. Each claim is read once, with
one GET, when it first appears there (a claim's requests and allocation do not change once it
is allocated): the allocation result for the device names the request, the request its
DeviceClass. A DeviceClass is one GET too, read again after `CLASS_SECONDS`. Nothing is listed
or watched: a node reads only the claims its own pods hold. Blocking: runs in the kubelet
poller's thread, at most `READS_PER_ROUND` requests a round, never in a cycle. A claim is a
tenant's object: only what names its devices' classes is read of it as it arrives
(`CLAIM_SHAPE`: as many requests and results as the API lets a claim hold), the rest scanned past.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import urllib3

from exporter.attribution.cluster import MAX_OBJECT_BYTES, ApiError, CredentialError
from exporter.attribution.dra import MEMORY
from exporter.attribution.jsonstream import TEXT, Entries, Fields, Items, nested
from exporter.attribution.shares import ShareError, quantity
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from exporter.attribution.cluster import KubernetesClient
    from exporter.attribution.podresources import DeviceAllocation

log = logging.getLogger(__name__)

API: Final = "/apis/resource.k8s.io/v1"
TIMEOUT_SECONDS: Final = (2.0, 5.0)
MAX_REQUESTS: Final = 32
"""Requests a claim may hold, and devices an allocation may give it (the API's limits)."""
MAX_SUBREQUESTS: Final = 8
"""Choices of a `firstAvailable` request (the API's limit)."""
_REQUEST: Final = Fields(
    {
        "name": TEXT,
        "exactly": Fields({"deviceClassName": TEXT}),
        "firstAvailable": Items(
            Fields({"name": TEXT, "deviceClassName": TEXT}), max_items=MAX_SUBREQUESTS
        ),
    }
)
_RESULT: Final = Fields(
    {
        **dict.fromkeys(("request", "driver", "pool", "device", "shareID"), TEXT),
        "consumedCapacity": Entries(TEXT, keep=MEMORY.__eq__, max_entries=1),
    }
)
CLAIM_SHAPE: Final = nested(
    "spec.devices.requests", Items(_REQUEST, max_items=MAX_REQUESTS)
).merged(nested("status.allocation.devices.results", Items(_RESULT, max_items=MAX_REQUESTS)))
CLASS_SHAPE: Final = nested("spec.extendedResourceName", TEXT)
CLASS_SECONDS: Final = 600.0
"""A DeviceClass is read again after this long (its extendedResourceName may be edited)."""
RETRY_SECONDS: Final = 30.0
"""A claim or class that could not be read is asked again after this long."""
READS_PER_ROUND: Final = 16
"""Requests one round makes at most; the rest wait for the next (a second later)."""
_NOT_FOUND: Final = 404
_FORBIDDEN: Final = 403

_MISSING: Final = object()
"""What `_read` answers for an object that does not exist."""

DeviceKey = tuple[str, str, str, str]
"""(driver, pool, device, share id) as an allocation result names a device."""


@dataclass(slots=True)
class _Claim:
    classes: Mapping[DeviceKey, str] = field(default_factory=dict)
    """The DeviceClass of each device allocated to the claim."""
    consumed: Mapping[DeviceKey, int] = field(default_factory=dict)
    """The memory (bytes) each share of a device the claim holds consumes."""
    retry_at: float | None = None
    """When reading it failed: when to try again."""


@dataclass(slots=True)
class _Class:
    extended_resource: str | None
    read_at: float
    failed: bool = False


class ClaimResources:
    """Resource names for DRA allocations, from their claims and DeviceClasses."""

    def __init__(
        self,
        client: KubernetesClient,
        *,
        active: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._active = active
        """False while DRA is off (the cluster serves no ResourceSlices): nothing is asked."""
        self._clock = clock
        self._once = LogOnce(log)
        self._claims: dict[tuple[str, str], _Claim] = {}
        self._classes: dict[str, _Class] = {}
        self._refused = False
        self._last: tuple[tuple[DeviceAllocation, ...], tuple[DeviceAllocation, ...]] | None = None
        self._due: float | None = None
        """When something left to read is due (None: nothing)."""
        self._budget = 0
        """Requests this round may still make."""

    def close(self) -> None:
        self._client.close()

    def resolve(self, allocations: tuple[DeviceAllocation, ...]) -> tuple[DeviceAllocation, ...]:
        """`allocations` with each DRA device's resource name; the same tuple when nothing
        changed since the last call."""
        now = self._clock()
        last = self._last
        if last is not None and last[0] is allocations and (self._due is None or now < self._due):
            return last[1]
        if self._refused or not self._active():
            return allocations
        held = {(a.claim_namespace, a.claim) for a in allocations if a.driver}
        for gone in self._claims.keys() - held:
            del self._claims[gone]
        self._due = None
        self._budget = READS_PER_ROUND
        resolved = tuple(
            self._resolved(allocation, now) if allocation.driver else allocation
            for allocation in allocations
        )
        self._last = (allocations, resolved)
        return resolved

    def _resolved(self, allocation: DeviceAllocation, now: float) -> DeviceAllocation:
        """The allocation with its DeviceClass's resource name and, for a share of a device,
        the memory it consumes."""
        claim = self._claim(allocation.claim_namespace, allocation.claim, now)
        device = (allocation.driver, allocation.pool, allocation.device_id, allocation.share_id)
        class_name = claim.classes.get(device) if claim is not None else None
        consumed = claim.consumed.get(device) if claim is not None else None
        resource = allocation.driver
        if class_name is not None:
            found = self._class(class_name, now)
            if found and found.extended_resource:
                resource = found.extended_resource
        return allocation._replace(resource=resource, consumed_memory=consumed)

    def _claim(self, namespace: str, name: str, now: float) -> _Claim | None:
        known = self._claims.get((namespace, name))
        if known is not None and (known.retry_at is None or now < known.retry_at):
            self._wake(known.retry_at)
            return known
        if self._refused or self._budget <= 0:
            self._wake(now)
            return known
        self._budget -= 1
        path = f"{API}/namespaces/{namespace}/resourceclaims/{name}"
        document = self._read(path, CLAIM_SHAPE, ("claim", namespace, name))
        if document is _MISSING:
            claim = _Claim()
        elif document is None:
            claim = _Claim(retry_at=now + RETRY_SECONDS)
            self._wake(claim.retry_at)
        else:
            claim = _Claim(claim_classes(document), claim_consumed(document))
        self._claims[(namespace, name)] = claim
        return claim

    def _class(self, name: str, now: float) -> _Class | None:
        known = self._classes.get(name)
        if known is not None:
            fresh_until = known.read_at + (RETRY_SECONDS if known.failed else CLASS_SECONDS)
            if now < fresh_until:
                self._wake(fresh_until)
                return known
        if self._refused or self._budget <= 0:
            self._wake(now)
            return known
        self._budget -= 1
        document = self._read(f"{API}/deviceclasses/{name}", CLASS_SHAPE, ("class", name))
        if document is None:  # keep what was known, ask again soon
            found = _Class(known.extended_resource if known else None, now, failed=True)
        else:
            found = _Class(extended_resource_name(document), now)
        self._classes[name] = found
        self._wake(now + (RETRY_SECONDS if found.failed else CLASS_SECONDS))
        return found

    def _wake(self, at: float | None) -> None:
        if at is not None and (self._due is None or at < self._due):
            self._due = at

    def _read(self, path: str, shape: Fields, cause: tuple[str, ...]) -> object:
        """What `shape` reads of the object at `path`; `_MISSING` when there is none; None when
        it could not be read (logged once per cause)."""
        try:
            return self._client.get_object(
                path, shape, limit=MAX_OBJECT_BYTES, timeout=TIMEOUT_SECONDS
            )
        except CredentialError:
            return None  # said once where the credentials are made; asked again later
        except ApiError as error:
            if error.status == _NOT_FOUND:
                return _MISSING
            if error.status == _FORBIDDEN:
                self._refused = True
                self._once(
                    logging.WARNING,
                    ("refused",),
                    "RBAC does not allow get on resourceclaims and deviceclasses "
                    "(resource.k8s.io): DRA allocations carry their driver's name as resource, "
                    "not their DeviceClass's extended resource name",
                    fields={"path": path},
                )
                return None
            problem = f"HTTP {error.status} {error.reason}"
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            problem = f"{type(error).__name__}: {error}"
        self._once(
            logging.WARNING,
            cause,
            "could not read a DRA claim or DeviceClass; its allocations carry the driver's name "
            "as resource until it can be read",
            fields={"path": path, "error": problem[:300], "retry_seconds": RETRY_SECONDS},
        )
        return None


def claim_classes(document: object) -> dict[DeviceKey, str]:
    """The DeviceClass of each device allocated to a claim (v1 JSON): the allocation result
    names the request (`main`, or `main/sub` for a `firstAvailable` choice), the request its
    class. Pure; what is missing or malformed is left out."""
    if not isinstance(document, dict):
        return {}
    spec = document.get("spec")
    status = document.get("status")
    requests = _get(spec, "devices", "requests")
    results = _get(status, "allocation", "devices", "results")
    classes: dict[str, str] = {}
    for request in requests if isinstance(requests, list) else ():
        name = request.get("name") if isinstance(request, dict) else None
        if not isinstance(name, str):
            continue
        exactly = _get(request, "exactly", "deviceClassName")
        if isinstance(exactly, str):
            classes[name] = exactly
        for choice in request.get("firstAvailable") or ():
            sub = choice.get("name") if isinstance(choice, dict) else None
            class_name = choice.get("deviceClassName") if isinstance(choice, dict) else None
            if isinstance(sub, str) and isinstance(class_name, str):
                classes[f"{name}/{sub}"] = class_name
    found: dict[DeviceKey, str] = {}
    for result in results if isinstance(results, list) else ():
        if not isinstance(result, dict):
            continue
        driver, pool, device, share = (
            _text(result.get(name)) for name in ("driver", "pool", "device", "shareID")
        )
        class_name = classes.get(_text(result.get("request")))
        if class_name is not None:
            found[(driver, pool, device, share)] = class_name
    return found


def claim_consumed(document: object) -> dict[DeviceKey, int]:
    """The memory (bytes) each allocation result of a claim (v1 JSON) consumes of its device's
    capacity (`consumedCapacity.memory`, DRA capacity sharing). Pure; a result without one, or
    with one that is not a quantity, is left out."""
    results = _get(_get(document, "status"), "allocation", "devices", "results")
    found: dict[DeviceKey, int] = {}
    for result in results if isinstance(results, list) else ():
        memory = _get(result, "consumedCapacity", MEMORY)
        if not isinstance(memory, str):
            continue
        try:
            consumed = quantity(memory)
        except ShareError:
            continue
        driver, pool, device, share = (
            _text(_get(result, name)) for name in ("driver", "pool", "device", "shareID")
        )
        found[(driver, pool, device, share)] = consumed
    return found


def extended_resource_name(document: object) -> str | None:
    """A DeviceClass's `spec.extendedResourceName` (v1), if it has one."""
    name = _get(document, "spec", "extendedResourceName")
    return name if isinstance(name, str) and name else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _get(value: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value
