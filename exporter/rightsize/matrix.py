"""A range query's answer read as columns: each series' labels once, its samples' times and
values as float64 arrays, never an object per sample.

The policy replay asks some 18 million samples at 10,000 workloads over 14 days; read a `Sample`
at a time they cost the client about 6 µs each. Here a series' `values` in the shape every
server writes (`[[1795818600,"0.25"],...]`, each time a plain decimal, each value a number's
characters only), with its labels first and compact, is matched whole and its samples parsed by
numpy in one call; a series in any other shape is walked as `answer.Vector` walks it, a sample
at a time. Every sample is judged as `Vector` judges it: a value that is not a finite number, or
outside the signal's `Bounds`, is dropped and counted with the same reason, and the first bad
series of the answer is the one named.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from exporter.rightsize.answer import (
    FLAT_LABELS,
    MAX_LABEL_VALUE,
    MAX_SIMPLE_ELEMENT,
    Vector,
    series_text,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from numpy.typing import NDArray

    from exporter.rightsize.answer import Bounds

_TIME: Final = r"-?+[0-9]{1,20}+(?:\.[0-9]{1,20}+)?+"
"""A sample's time as servers write it (`1795818600`, `1795818600.5`): always a finite number,
and a case of `answer._POINT`'s."""
_VALUE: Final = r"[0-9.eE+-]{1,64}+"
"""A value of a number's characters (`NaN`, `+Inf` are read a sample at a time)."""
_RUN: Final = re.compile(rf'\[(?:\[{_TIME},"{_VALUE}"\](?:,\[{_TIME},"{_VALUE}"\])*+)?+\]')
"""Possessive throughout (what follows each part is never in its class): a third cheaper to
match than the same pattern backtracking, for the same runs."""
_HEAD: Final = re.compile(rf'\{{"metric":({FLAT_LABELS.pattern}),"values":', re.DOTALL)
"""A series as every server writes it, up to its samples: compact, its labels first."""
_DECODER: Final = json.JSONDecoder()
_BARE: Final = str.maketrans("", "", '[]"')
"""A run without its brackets and quotes: `t,v,t,v,...`, what numpy parses."""


@dataclass(frozen=True, slots=True)
class Matrix:
    """A range answer's sound samples, series after series as the answer held them."""

    labels: list[Mapping[str, str]]
    """Each series' labels (those its query can carry)."""
    ends: list[int]
    """Where each series' samples end in `times` and `values`."""
    times: NDArray[np.float64]
    values: NDArray[np.float64]

    def series(self) -> Iterator[tuple[Mapping[str, str], slice]]:
        """Each series' labels and where its samples are."""
        start = 0
        for labels, end in zip(self.labels, self.ends, strict=True):
            yield labels, slice(start, end)
            start = end


class Columns(Vector):
    """`Vector` for a range query, keeping its samples as columns (`matrix`)."""

    def __init__(
        self,
        keep: Callable[[Mapping[str, str]], bool] | None,
        bounds: Bounds,
        labels: frozenset[str] | None,
    ) -> None:
        super().__init__(keep, bounds, labels, kind="matrix")
        self._labels: list[Mapping[str, str]] = []
        self._pieces: list[NDArray[np.float64]] = []
        """Each series' samples, `t,v,t,v,...`: judged together once the answer is read."""
        self._walked: list[float] = []
        """The samples of the series being read a sample at a time (judged as read)."""
        self._walked_labels: Mapping[str, str] | None = None
        self._series_at_first_refusal: int | None = None
        self._matrix: Matrix | None = None

    def fresh(self) -> Columns:
        return Columns(self.keep, self.bounds, self.labels)

    def keep_sample(self, labels: Mapping[str, str], value: float, at: float) -> None:
        if labels is not self._walked_labels:
            self._end_walked()
            self._walked_labels = labels
        self._walked += (at, value)

    def _end_walked(self) -> None:
        if self._walked_labels is not None and self._walked:
            self._add(self._walked_labels, np.array(self._walked, dtype=np.float64))
        self._walked, self._walked_labels = [], None

    def _add(self, labels: Mapping[str, str], numbers: NDArray[np.float64]) -> None:
        self._labels.append(labels)
        self._pieces.append(numbers)

    def refuse(self, series: object, why: str) -> None:
        if self.bad == 0:
            # Which comes first, this or a bad sample of a series parsed whole before it.
            self._end_walked()
            self._series_at_first_refusal = len(self._labels)
        super().refuse(series, why)

    def add_series(self, text: str, at: int) -> int:
        head = _HEAD.match(text, at)
        if head is None:
            return 0
        labels = self._flat_labels(text, head.start(1), head.end(1))
        if labels is None or (self.keep is not None and not self.keep(labels)):
            return 0  # walked: a foreign series is counted a sample at a time
        run = _RUN.match(text, head.end())
        if run is None or text[run.end() : run.end() + 1] != "}":
            return 0
        numbers = _parsed(text, run.start(), run.end())
        if numbers is None:
            return 0
        self._end_walked()
        if numbers.size:
            self._add(labels, numbers)
        return run.end() + 1

    def _flat_labels(self, text: str, start: int, end: int) -> dict[str, str] | None:
        """The labels kept of a series' flat `metric` (as `_Reader.labels` reads it), None if
        it is too long to decode at once or holds a name or value too long (then walked)."""
        if end - start > MAX_SIMPLE_ELEMENT:
            return None
        metric: dict[str, str] = _DECODER.raw_decode(text, start)[0]
        if not all(len(name) <= MAX_LABEL_VALUE >= len(value) for name, value in metric.items()):
            return None
        return {name: value for name, value in metric.items() if self.wants(name)}

    def finish(self) -> None:
        self._matrix = self._judged()

    def matrix(self) -> Matrix:
        """The sound samples of the answer read (`finish`)."""
        if self._matrix is None:
            raise RuntimeError("Columns.matrix before the answer is read")
        return self._matrix

    def _judged(self) -> Matrix:
        """The sound samples, those parsed whole judged now: each bad one dropped and counted
        as `Vector.add` counts it, the first bad series of the answer named."""
        self._end_walked()
        numbers = np.concatenate(self._pieces) if self._pieces else np.zeros(0)
        ends = np.cumsum([piece.size // 2 for piece in self._pieces]).tolist()
        times, values = numbers[0::2], numbers[1::2]
        low, high = self.bounds.low, self.bounds.high
        with np.errstate(invalid="ignore"):
            sound = np.isfinite(values) & (values >= low) & (values <= high)
        if sound.all():
            return Matrix(self._labels, ends, times, values)
        self._judge(sound, ends, values)
        kept = np.cumsum(sound).tolist()
        return Matrix(self._labels, [kept[end - 1] for end in ends], times[sound], values[sound])

    def _judge(
        self, sound: NDArray[np.bool_], ends: list[int], values: NDArray[np.float64]
    ) -> None:
        """Count the bad samples (only a series parsed whole has any: a walked one's were
        refused as read), the first named if its series came before any other refusal."""
        bad = np.flatnonzero(~sound)
        first = int(np.searchsorted(ends, bad[0], side="right"))
        earlier = self._series_at_first_refusal  # None: no refusal yet
        if earlier is None or first < earlier:
            self.first_bad = series_text(self._labels[first])
            self.why_bad = self.fault(float(values[bad[0]]))
        self.bad += int(bad.size)


def _parsed(text: str, start: int, end: int) -> NDArray[np.float64] | None:
    """The samples of a run (`_RUN`), `t,v,t,v,...`; None if a value of a number's characters
    is no number (`1e`, `1-2`: then walked, and refused as a walked sample is)."""
    try:
        numbers = np.fromstring(text[start:end].translate(_BARE), sep=",")
    except ValueError:
        return None
    # An older numpy warns instead of raising, and returns the numbers read up to the fault.
    return numbers if numbers.size == 2 * (text.count("[", start, end) - 1) else None
