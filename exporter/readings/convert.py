"""The conversions from a driver's answer to a value in base units (`declare.Convert`).

Each takes the answer as the driver gives it — a number, a struct, a list, a bitmask — and
returns the value, or None where the answer holds none (the series is then absent, not 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from exporter.readings.declare import Convert

MHZ: Final = 1e6


def number(value: float | None) -> float | None:
    return float(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class Times:
    """Multiplied by `factor`: a conversion a reader of many numbers at once can apply to all of
    them in one call (`exporter.nvml.fields`)."""

    factor: float

    def __call__(self, value: Any) -> float | None:
        return value * self.factor if value is not None else None


def times(factor: float) -> Convert:
    """KiB to bytes, MHz to hertz: multiplied."""
    return Times(factor)


def divided_by(divisor: float) -> Convert:
    """milli- to base units, percent to ratio: divided, as exactly as the driver's number allows."""

    def convert(value: Any) -> float | None:
        return value / divisor if value is not None else None

    return convert


_MEMBER: Final = object.__getattribute__
"""A struct's member read past pynvml's `_PrintableStructure.__getattribute__`, which only
decodes text: for a number it is the same value, read in half the time (every cycle, several
members a GPU)."""


def member(name: str, *, divisor: float = 1.0) -> Convert:
    """A number member of the driver's struct, divided by `divisor`."""

    def read(struct: Any) -> float | None:
        return float(_MEMBER(struct, name)) / divisor

    return read


def item(position: int, *, divisor: float = 1.0) -> Convert:
    """An item of the driver's list or tuple, divided by `divisor`."""

    def read(answer: Any) -> float | None:
        return float(answer[position]) / divisor

    return read


def bit(mask: int) -> Convert:
    """1 while the bit is set in the driver's bitmask, else 0."""

    def active(reasons: Any) -> float | None:
        return (1.0 if int(reasons) & mask else 0.0) if reasons is not None else None

    return active


def equals(expected: int) -> Convert:
    """1 where the answer is `expected`, else absent (an info family's one series)."""

    def read(answer: Any) -> float | None:
        return 1.0 if int(answer) == expected else None

    return read


def count(answer: Any) -> float | None:
    return float(len(answer))


def truth(answer: Any) -> float | None:
    return 1.0 if answer else 0.0
