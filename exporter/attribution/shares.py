"""What each holder of a GPU reserved of it, as the schedulers that hand out fractions record it;
pure.

- **HAMi** writes the devices it gave each container in the pod annotation
  `hami.io/vgpu-devices-allocated`: per device `<uuid>,<type>,<MiB>,<cores>:`, the containers'
  lists separated by `;` (one after each container in current releases, between them in older
  ones; an empty list for a container given nothing), init containers first, then the containers,
  in spec order. A device's share is its cores / 100 (100: exclusive), or with no cores (0) its
  memory / the GPU's memory. The kubelet lists such a container's devices under HAMi's virtual
  slot ids, `<uuid>-<n>`.
- **KAI Scheduler** gives a pod a fraction through its `gpu-fraction` annotation (or
  `gpu-memory`, MiB), applied to its first container or the one `gpu-fraction-container-name`
  names. The GPU is the one the reservation pod of the pod's group holds: the pod labelled
  `app=kai-resource-reservation` with the same `runai-gpu-group` label; that pod only keeps the
  GPU for the group and is no holder.
- **DRA capacity sharing** (KEP-5075): an allocation result's `consumedCapacity.memory` / the
  device's `capacity.memory` in its ResourceSlice.

`divide` turns what a GPU's holders reserved into shares that never add up to more than 1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

K = TypeVar("K")

HAMI_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
KAI_FRACTION: Final = "gpu-fraction"
KAI_MEMORY: Final = "gpu-memory"
KAI_CONTAINER: Final = "gpu-fraction-container-name"
KAI_RESERVED_GPU: Final = "run.ai/reserve_for_gpu_index"
"""On a KAI reservation pod: the UUID of the GPU it reserves."""
SHARE_ANNOTATIONS: Final = frozenset(
    {HAMI_ALLOCATED, KAI_FRACTION, KAI_MEMORY, KAI_CONTAINER, KAI_RESERVED_GPU}
)
KAI_GROUP: Final = "runai-gpu-group"
KAI_APP: Final = "app"
KAI_RESERVATION: Final = "kai-resource-reservation"
SHARE_LABELS: Final = frozenset({KAI_GROUP, KAI_APP})
MAX_ANNOTATION: Final = 4096
"""Characters read of one of these annotations: HAMi's lists a few dozen per device."""
MIB: Final = 1 << 20
_EXCLUSIVE_CORES: Final = 100
_DEVICE_FIELDS: Final = 4
_QUANTITY: Final = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exponent>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)"
)
_SUFFIXES: Final = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{
        suffix: Decimal(1024**power)
        for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)
    },
}
OVER_ONE: Final = 1.0 + 1e-9
"""A sum of shares past this is more than the whole GPU (float sums of tenths miss 1 by ulps)."""


class PodFields(Protocol):
    """What is read of a pod here (`exporter.attribution.pod.Pod` has it): a protocol, so that
    the pod module can take its annotation and label names from this one."""

    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def init_containers(self) -> tuple[str, ...]: ...
    @property
    def spec_containers(self) -> tuple[str, ...]: ...


class ShareError(ValueError):
    """An annotation or quantity that cannot be read; `str()` says what was wrong."""


@dataclass(frozen=True, slots=True)
class Reserved:
    """One GPU a container was given part of, as HAMi records it."""

    uuid: str
    memory_mib: int
    cores: int
    """Percent of the GPU's cores; 100 is the whole GPU, 0 none asked (memory says the share)."""

    def share(self, memory_bytes: float | None) -> float | None:
        """Cores / 100, else memory / the GPU's (`memory_bytes`); None when that is unknown."""
        if self.cores > 0:
            return min(self.cores, _EXCLUSIVE_CORES) / _EXCLUSIVE_CORES
        return memory_share(self.memory_mib, memory_bytes)


def memory_share(memory_mib: float, memory_bytes: float | None) -> float | None:
    """`memory_mib` MiB as a share of a GPU of `memory_bytes`; None when that is unknown."""
    if not memory_bytes or memory_bytes <= 0:
        return None
    return min(1.0, memory_mib * MIB / memory_bytes)


def hami_devices(text: str, containers: Sequence[str]) -> dict[str, tuple[Reserved, ...]]:
    """Container name -> the devices HAMi's annotation gives it; `containers` in HAMi's order
    (init containers, then containers, as the spec lists them). Raises `ShareError`."""
    segments = text.removesuffix(";").split(";") if text else []
    if len(segments) > len(containers):
        raise ShareError(
            f"{len(segments)} container lists for a pod of {len(containers)} containers"
        )
    found: dict[str, tuple[Reserved, ...]] = {}
    for container, segment in zip(containers, segments, strict=False):
        devices = [_hami_device(entry) for entry in segment.split(":") if entry]
        if devices:
            found[container] = tuple(devices)
    return found


def _hami_device(entry: str) -> Reserved:
    fields = entry.split(",")
    if len(fields) < _DEVICE_FIELDS or not fields[0]:
        raise ShareError(f"device {entry[:80]!r} is not <uuid>,<type>,<MiB>,<cores>")
    memory, cores = _count(fields[2], "MiB"), _count(fields[3], "cores")
    if cores > _EXCLUSIVE_CORES:
        raise ShareError(f"device {fields[0][:64]!r} has {cores} cores, more than 100")
    return Reserved(fields[0], memory, cores)


def _count(text: str, what: str) -> int:
    if not text.isdigit():
        raise ShareError(f"{what} {text[:32]!r} is not a whole number")
    return int(text)


@dataclass(frozen=True, slots=True)
class KaiRequest:
    """What a KAI pod asked of its group's GPU: a fraction, or memory in MiB."""

    container: str
    fraction: float | None
    memory_mib: int | None

    def share(self, memory_bytes: float | None) -> float | None:
        if self.fraction is not None:
            return self.fraction
        return memory_share(self.memory_mib or 0, memory_bytes)


def kai_request(pod: PodFields) -> KaiRequest | None:
    """What a pod of a KAI GPU group asked for; None for a pod that asked nothing of one.
    Raises `ShareError`."""
    annotations = pod.annotations
    if KAI_GROUP not in pod.labels or is_reservation(pod):
        return None
    fraction_text, memory_text = annotations.get(KAI_FRACTION), annotations.get(KAI_MEMORY)
    if fraction_text is None and memory_text is None:
        return None
    container = annotations.get(KAI_CONTAINER)
    if container is None:
        if not pod.spec_containers:
            raise ShareError("the pod lists no containers")
        container = pod.spec_containers[0]
    elif container not in pod.spec_containers and container not in pod.init_containers:
        raise ShareError(f"{KAI_CONTAINER} names {container[:64]!r}, no container of the pod")
    if fraction_text is not None:
        try:
            fraction = float(fraction_text)
        except ValueError:
            fraction = math.nan
        if not 0.0 < fraction <= 1.0:
            raise ShareError(f"{KAI_FRACTION} {fraction_text[:32]!r} is not a number in (0, 1]")
        return KaiRequest(container, fraction, None)
    memory = _count(memory_text or "", f"{KAI_MEMORY} (MiB)")
    if memory <= 0:
        raise ShareError(f"{KAI_MEMORY} is 0")
    return KaiRequest(container, None, memory)


def is_reservation(pod: PodFields) -> bool:
    """A KAI reservation pod: it keeps a GPU for its group and holds none of it itself."""
    return pod.labels.get(KAI_APP) == KAI_RESERVATION and KAI_GROUP in pod.labels


def quantity(text: str) -> int:
    """A Kubernetes quantity (`40Gi`, `20G`, `1.5e9`, `5368709120`) as a whole number, rounded
    up as the API does. Raises `ShareError`."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ShareError(f"{text[:32]!r} is not a quantity")
    try:
        number = Decimal(match["number"])
        if match["exponent"]:
            number *= Decimal(10) ** int(match["exponent"][1:])
        else:
            number *= _SUFFIXES[match["suffix"] or ""]
    except (InvalidOperation, OverflowError) as error:
        raise ShareError(f"{text[:32]!r} is not a quantity") from error
    return math.ceil(number)


def divide(reserved: Mapping[K, float | None]) -> tuple[dict[K, float], float]:
    """One GPU's holders' shares, from what each reserved (None: nothing known, an equal part of
    what the others leave); and what the reservations add up to when that is more than the GPU
    (each then scaled down in proportion, the others given nothing), else 0."""
    fixed = {key: share for key, share in reserved.items() if share is not None}
    plain = [key for key, share in reserved.items() if share is None]
    claimed = sum(fixed.values())
    if claimed > OVER_ONE:
        shares = {key: share / claimed for key, share in fixed.items()}
        shares.update(dict.fromkeys(plain, 0.0))
        return shares, claimed
    shares = dict(fixed)
    if plain:
        shares.update(dict.fromkeys(plain, max(0.0, 1.0 - claimed) / len(plain)))
    return shares, 0.0
