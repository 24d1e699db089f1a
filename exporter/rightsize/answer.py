"""Reading a PromQL API answer: its vector element by element, bounded in nesting.

The server is not trusted to answer sanely (its series can be forged through a PodMonitor with
`honorLabels` or remote write): an element the caller did not ask for (`keep`) is dropped as it is
read, so an answer holding every series costs no more than the ones asked for; nesting is
bounded; a malformed element, or one whose value is NaN, infinite or outside the signal's
`Bounds`, is dropped and counted, the first such series named — one bad series never fails a
query. `prometheus.py` sends the queries and judges the answer's status.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Final

from exporter.documents import quote

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

log = logging.getLogger("exporter.rightsize.prometheus")

MAX_NESTING: Final = 64
"""How deep a part of an answer the client does not read element by element (`warnings`,
`stats`, ...) may nest; a vector element nests three levels."""
SERIES_QUOTE_LIMIT: Final = 120


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector: its labels and its value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Bounds:
    """The values a signal can take; any other is a forged or broken series."""

    low: float
    high: float
    what: str
    """What the value is, for the warning (`a ratio`, `bytes`)."""

    def admits(self, value: float) -> bool:
        return self.low <= value <= self.high


ANY_FINITE: Final = Bounds(-math.inf, math.inf, "a finite number")


class Vector:
    """The samples of one answer as they are read: those asked for and sane kept, the others
    counted (and the first bad one kept, to name it)."""

    def __init__(self, keep: Callable[[Mapping[str, str]], bool] | None, bounds: Bounds) -> None:
        self.keep = keep
        self.bounds = bounds
        self.samples: list[Sample] = []
        self.foreign = 0
        """Elements not asked for."""
        self.bad = 0
        self.first_bad = ""
        self.why_bad = ""

    def fresh(self) -> Vector:
        """An empty one for another attempt at the same query."""
        return Vector(self.keep, self.bounds)

    def add(self, element: object) -> None:
        labels, value = element_parts(element)
        if labels is None:
            self.refuse(element, "a malformed vector element")
            return
        if self.keep is not None and not self.keep(labels):
            self.foreign += 1
            return
        if value is None:
            self.refuse(labels, "its value is not a number")
        elif not math.isfinite(value):
            self.refuse(labels, f"value {value} is not a finite number")
        elif not self.bounds.admits(value):
            self.refuse(
                labels,
                f"value {value:g} is outside {self.bounds.low:g}..{self.bounds.high:g} "
                f"({self.bounds.what})",
            )
        else:
            self.samples.append(Sample(labels, value))

    def refuse(self, series: object, why: str) -> None:
        self.bad += 1
        if self.bad == 1:
            self.first_bad = series_text(series)
            self.why_bad = why

    def report(self, name: str, *, warn: bool) -> None:
        """One warning for the query's dropped series, naming the first (if `warn`); a debug
        line for the series it did not ask about."""
        if warn and self.bad:
            log.warning(
                "prometheus series dropped",
                extra={
                    "query": name,
                    "series": self.first_bad,
                    "reason": self.why_bad,
                    "dropped": self.bad,
                },
            )
        if self.foreign:
            # Matchers on namespace and pod apart also match other pairs of the two.
            log.debug(
                "prometheus series not asked for dropped",
                extra={"query": name, "dropped": self.foreign},
            )


def series_text(series: object) -> str:
    """A series' labels (or a malformed element) as a log line may quote them: cut, control
    and bidirectional characters escaped (`repr`)."""
    if isinstance(series, dict):
        labels = ", ".join(f"{key}={value}" for key, value in list(series.items())[:12])
        return quote("{" + labels + "}", SERIES_QUOTE_LIMIT)
    return quote(series if isinstance(series, str) else json.dumps(series), SERIES_QUOTE_LIMIT)


def element_parts(element: object) -> tuple[dict[str, str] | None, float | None]:
    """A vector element's labels and value (None labels: malformed)."""
    if not isinstance(element, dict):
        return None, None
    labels, pair = element.get("metric"), element.get("value")
    if (
        not isinstance(labels, dict)
        or not all(map(isinstance, labels.values(), repeat(str)))
        or not isinstance(pair, list)
        or len(pair) != 2
        or not isinstance(pair[1], str)
    ):
        return None, None
    try:
        value = float(pair[1])
    except ValueError:
        return labels, None
    return labels, value


def cut(value: object) -> str:
    """A server's text for one log line or error: one line, at most 200 characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    flat = " ".join(text.split())
    return flat if len(flat) <= 200 else flat[:199] + "…"


# -- reading an answer ---------------------------------------------------------------------------


class Nested(Exception):
    """A part of the answer nests past `MAX_NESTING` (or the interpreter's recursion limit)."""


class _NotJson(Exception):
    """The answer is not the JSON object it should be."""


_SPACE: Final = re.compile(r"[ \t\n\r]*")
_WHITE_SPACE: Final = frozenset(" \t\n\r")
_DECODER: Final = json.JSONDecoder()
_SCALAR_START: Final = frozenset('"-0123456789tfn')
_READ_KEYS: Final = frozenset({"status", "errorType", "error", "warnings"})
"""The top-level keys read besides `data`; the others (`stats`, `infos`, ...) are stepped over."""


class _Reader:
    """JSON text read a value at a time: objects and arrays are walked here, so that an
    element can be handled (and dropped) as soon as it is read; only scalars and single vector
    elements are handed to the C decoder, so no nesting is ever decoded past the bound."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def peek(self) -> str:
        """The next character that is not white space ("" at the end)."""
        char = self.text[self.at : self.at + 1]
        if char in _WHITE_SPACE:  # rare: Prometheus answers compact JSON
            self.at = _SPACE.match(self.text, self.at).end()  # type: ignore[union-attr] # matches ""
            char = self.text[self.at : self.at + 1]
        return char

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise _NotJson
        self.at += 1

    def decoded(self) -> object:
        """The next value through the C decoder (a scalar, or one vector element)."""
        self.peek()
        try:
            value, self.at = _DECODER.raw_decode(self.text, self.at)
        except RecursionError:
            raise Nested from None
        except ValueError:
            raise _NotJson from None
        return value

    def members(self) -> Iterator[str]:
        """An object's keys; the caller reads each value before asking for the next key."""
        self.expect("{")
        if self.peek() == "}":
            self.at += 1
            return
        while True:
            key = self.decoded()
            if not isinstance(key, str):
                raise _NotJson
            self.expect(":")
            yield key
            if self.peek() == ",":
                self.at += 1
                continue
            self.expect("}")
            return

    def items(self) -> Iterator[None]:
        """An array's elements; the caller reads each before asking for the next."""
        self.expect("[")
        if self.peek() == "]":
            self.at += 1
            return
        while True:
            yield None
            if self.peek() == ",":
                self.at += 1
                continue
            self.expect("]")
            return

    def value(self, depth: int = 0) -> object:
        """Any value, nested at most `MAX_NESTING - depth` levels, without recursion past it."""
        char = self.peek()
        if char in _SCALAR_START:
            return self.decoded()
        if depth >= MAX_NESTING:
            raise Nested
        if char == "{":
            found: dict[str, object] = {}
            for key in self.members():
                found[key] = self.value(depth + 1)
            return found
        if char == "[":
            return [self.value(depth + 1) for _ in self.items()]
        raise _NotJson

    def skip(self) -> None:
        """Step over the next value, however deep, building nothing: iterative, so that a
        value nested a million levels deep costs its bytes and no stack."""
        depth = 0
        while True:
            char = self.peek()
            if char in _SCALAR_START:
                try:
                    _, self.at = _DECODER.raw_decode(self.text, self.at)
                except ValueError:
                    raise _NotJson from None
            elif char in "[{":
                depth += 1
                self.at += 1
            elif char in "]}" and depth > 0:
                depth -= 1
                self.at += 1
            elif char in ",:" and depth > 0:
                self.at += 1
                continue
            else:
                raise _NotJson
            if depth == 0:
                return

    def element(self) -> tuple[object, bool]:
        """The next array element, and whether it was decoded: one nested past the
        interpreter's recursion limit is stepped over instead (None, False)."""
        start = self.at
        try:
            return self.decoded(), True
        except Nested:
            self.at = start
            self.skip()
            return None, False

    def end(self) -> None:
        if self.peek():
            raise _NotJson


def read_answer(body: bytearray, vector: Vector) -> dict[str, object] | None:
    """The answer's top-level object, its `data.result` vector read into `vector` element by
    element (the object then holds `resultType` beside the top level's keys); None when the
    body is not a JSON object."""
    try:
        reader = _Reader(body.decode("utf-8"))
    except UnicodeDecodeError:
        return None
    try:
        document: dict[str, object] = {}
        for key in reader.members():
            if key == "data" and reader.peek() == "{":
                _read_data(reader, document, vector)
            elif key in _READ_KEYS:
                document[key] = reader.value(1)
            else:
                reader.skip()
        reader.end()
    except _NotJson:
        return None
    return document


def _read_data(reader: _Reader, document: dict[str, object], vector: Vector) -> None:
    """`data`: its `resultType` into `document`, a vector's elements into `vector`."""
    for part in reader.members():
        if part == "resultType":
            document["resultType"] = reader.value(2)
        elif (
            part == "result"
            and reader.peek() == "["
            and document.get("resultType", "vector") == "vector"
        ):
            for _ in reader.items():
                element, decoded = reader.element()
                if decoded:
                    vector.add(element)
                else:
                    vector.refuse("(an element)", "nested too deeply")
        else:
            reader.skip()


def error_text(document: dict[str, object] | None) -> str:
    if document is not None and document.get("error"):
        kind = document.get("errorType")
        error = cut(document["error"])
        return f"{cut(kind)}: {error}" if kind else error
    return ""
