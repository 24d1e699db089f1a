"""The values of a fleet file that `exporter.documents`' checks do not cover alone: durations,
sizes, versions, GPU indexes, MIG instance positions, names spelled with `-` or `_`.

Each takes a value and the key path it was found at (`processes[2].period`), returns it typed,
or raises `documents.Invalid`.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Final

from exporter.documents import Invalid, attempt, choice, integer, quote, sequence, text
from exporter.durations import parse_duration

if TYPE_CHECKING:
    from collections.abc import Sized

_SIZE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
_BYTE_UNITS: Final = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def parse_bytes(value: object) -> int:
    """Bytes in `512` or a size such as `512MiB`, `20GiB`, `1.5GB`; `ValueError` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    match = _SIZE.fullmatch(str(value))
    if match is None or match[2].lower() not in _BYTE_UNITS:
        raise ValueError(f"{quote(value)} is not a size (e.g. 512MiB, 20GiB, 1.5GB)")
    size = float(match[1]) * _BYTE_UNITS[match[2].lower()]
    if not math.isfinite(size):
        raise ValueError(f"{quote(value)} is too large")
    return round(size)


def entries(value: object, path: str, max_items: int) -> list[Any]:
    """A list that may be left empty (`faults:` with every entry commented out)."""
    return [] if value is None else sequence(value, path, max_items=max_items)


def spelled(value: object, path: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, where `-` may stand for `_` (`input-starved`)."""
    if isinstance(value, str) and value.replace("-", "_") in choices:
        return value.replace("-", "_")
    return choice(value, path, choices)


def gpu_index(value: object, path: str, gpus: Sized) -> int:
    """The index of one of `gpus`."""
    index = integer(value, path)
    if not 0 <= index < len(gpus):
        raise Invalid(path, f"{quote(index)} is not a GPU index from 0 to {len(gpus) - 1}")
    return index


def instance_position(value: object, path: str) -> int:
    """A MIG instance's position in its GPU's layout (checked against the layout later)."""
    position = integer(value, path)
    if position < 0:
        raise Invalid(path, f"{quote(position)} is not an instance position (0, 1, ...)")
    return position


def seconds(value: object, path: str, *, positive: bool = False) -> float:
    """A duration (`30s`, `1m30s`); a bare number is refused, as durations are everywhere."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # so that the duration's own message says the unit is missing
    duration = text(value, path, max_length=64)
    found = attempt(path, lambda: parse_duration(duration))
    if positive and found <= 0:
        raise Invalid(path, "must be longer than 0s")
    return found


def byte_size(value: object, path: str) -> int:
    """Bytes: a whole number, or a size such as `20GiB`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return integer(value, path, low=0)
    if not isinstance(value, str):
        raise Invalid(path, f"expected a size such as 20GiB, or bytes, got {quote(value)}")
    size = text(value, path, max_length=32)
    return attempt(path, lambda: parse_bytes(size))


def version(value: object, path: str, pattern: re.Pattern[str], example: str) -> str:
    """A version string; a YAML number is refused, since 12.10 would read as 12.1."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise Invalid(path, f'{quote(value)} is a number to YAML: write it quoted ("{example}")')
    return text(
        value, path, max_length=32, pattern=pattern, describe=f"a version such as {example}"
    )
