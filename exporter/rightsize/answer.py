"""Reading a PromQL API answer a value at a time, never building any part of it whole.

The server is not trusted to answer sanely (its series can be forged through a PodMonitor with
`honorLabels` or remote write, and the server can be an attacker's): an element the caller did
not ask for (`keep`) is dropped as it is read, so an answer holding every series costs no more
than the ones asked for; of an element kept, only the labels its query groups by are
(`answer_labels`); warnings and errors are read only as far as they are shown; an element is
decoded whole only in the flat shape every server writes, any other is walked; whatever else
the answer holds is stepped over without being built, however long or deep. A malformed
element, or one whose value is NaN, infinite or outside the signal's `Bounds`, is dropped and
counted, the first such series named — one bad series never fails a query. `prometheus.py`
sends the queries and judges the answer's status.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from exporter.documents import quote

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

log = logging.getLogger("exporter.rightsize.prometheus")

MAX_NESTING: Final = 64
"""A malformed element nested deeper than this is named `nested too deeply` when dropped (a
well-formed one nests three levels)."""
SERIES_QUOTE_LIMIT: Final = 120
MAX_WARNINGS: Final = 10
"""Warnings of one answer read and logged; the rest are stepped over unread."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector (its labels and its value), or one sample of a matrix
    series (and its unix time)."""

    labels: Mapping[str, str]
    value: float
    at: float = 0.0
    """The sample's unix time in a matrix; 0 in a vector (its time is the query's)."""


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


_PROMQL_STRING: Final = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`", re.DOTALL)
_GROUPING: Final = re.compile(r"\b(by|without|group_left|group_right)\s*\(([^()]*)\)")


_LABEL_WRITERS: Final = re.compile(r"\blabel_(?:replace|join)\s*\(")


def _written_labels(promql: str) -> Iterator[str]:
    """The labels `label_replace` and `label_join` calls write: each call's second argument,
    found by walking its first argument (brackets and string literals skipped). The calls are
    looked for with every literal blanked to its own length, so one spelled inside a matcher's
    value is no call."""
    blanked = _PROMQL_STRING.sub(lambda literal: '"' + " " * (len(literal[0]) - 2) + '"', promql)
    for call in _LABEL_WRITERS.finditer(blanked):
        depth, position = 0, call.end()
        while position < len(promql):
            character = promql[position]
            literal = _PROMQL_STRING.match(promql, position)
            if literal:
                position = literal.end()
                continue
            if character in "([{":
                depth += 1
            elif character in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif character == "," and depth == 0:
                target = _PROMQL_STRING.match(promql, position + 1 + _spaces(promql, position + 1))
                if target:
                    yield target[0][1:-1]
                break
            position += 1


def _spaces(text: str, position: int) -> int:
    return len(text[position:]) - len(text[position:].lstrip())


def answer_labels(promql: str) -> frozenset[str] | None:
    """The labels the answer to `promql` can carry: those its `by`, `group_left` and
    `group_right` clauses name and those its `label_replace`/`label_join` calls write (none for
    a query without them, such as `vector(1)`); None (any) for a query with `without`. Every
    query the job sends aggregates by the labels it reads, so a label of a forged series
    outside them is dropped as read and costs nothing. String literals are not read as
    clauses: a pod name in a matcher cannot add a label."""
    bare = _PROMQL_STRING.sub('""', promql)
    names: set[str] = set(_written_labels(promql))
    for clause in _GROUPING.finditer(bare):
        if clause[1] == "without":
            return None
        names.update(name.strip() for name in clause[2].split(","))
    names.discard("")
    return frozenset(names)


class Vector:
    """The samples of one answer as they are read: those asked for and sane kept (with the
    labels the query can carry only), the others counted (and the first bad one named)."""

    def __init__(
        self,
        keep: Callable[[Mapping[str, str]], bool] | None,
        bounds: Bounds,
        labels: frozenset[str] | None,
        *,
        kind: str = "vector",
    ) -> None:
        self.keep = keep
        self.bounds = bounds
        self.labels = labels
        self.kind = kind
        """The result type asked for: `vector` (an instant query) or `matrix` (a range query)."""
        """The label names kept (`answer_labels`); None: all."""
        self.samples: list[Sample] = []
        self.foreign = 0
        """Elements not asked for."""
        self.bad = 0
        self.first_bad = ""
        self.why_bad = ""

    def fresh(self) -> Vector:
        """An empty one for another attempt at the same query."""
        return Vector(self.keep, self.bounds, self.labels, kind=self.kind)

    def wants(self, label: str) -> bool:
        return self.labels is None or label in self.labels

    def add(self, labels: dict[str, str], value_text: str | None, *, at: float = 0.0) -> None:
        """One well-formed element (or matrix sample, at unix time `at`): its kept labels and
        its value's text (None: not text, or too long to be a number)."""
        if self.keep is not None and not self.keep(labels):
            self.foreign += 1
            return
        value = _number(value_text)
        if value is None:
            self.refuse(labels, "its value is not a number")
        elif why := self.fault(value):
            self.refuse(labels, why)
        else:
            self.keep_sample(labels, value, at)

    def fault(self, value: float) -> str:
        """Why a sample's value is refused ("" if it is not)."""
        if not math.isfinite(value):
            return f"value {value} is not a finite number"
        if not self.bounds.admits(value):
            return (
                f"value {value:g} is outside {self.bounds.low:g}..{self.bounds.high:g} "
                f"({self.bounds.what})"
            )
        return ""

    def keep_sample(self, labels: Mapping[str, str], value: float, at: float) -> None:
        """A sound sample, kept (a subclass may keep it otherwise)."""
        self.samples.append(Sample(labels, value, at))

    def add_series(self, text: str, at: int) -> int:  # noqa: ARG002 - for `Columns`
        """The matrix series at `at` in `text`, taken whole if this reader can (a subclass
        reading columns): where it ends, or 0 if it was not taken (then walked)."""
        return 0

    def add_points(self, labels: dict[str, str], points: Iterator[re.Match[str]]) -> None:
        """A matrix series' samples in the flat shape (`_POINT` matches, read lazily: a list of
        them all would cost many times the text), each sound one kept as `add` keeps it (in one
        loop: a range answer holds a sample per step of every series), any other dropped and
        counted as `add` would drop it."""
        if self.keep is not None and not self.keep(labels):
            self.foreign += sum(1 for _ in points)
            return
        admits, keep, finite = self.bounds.admits, self.keep_sample, math.isfinite
        for point in points:
            at = value = math.nan
            try:
                at = float(point[1])
                value = float(point[2])
            except ValueError:
                pass  # left NaN: judged, refused and counted just below
            if finite(at) and finite(value) and admits(value):
                keep(labels, value, at)
            elif not finite(at):
                self.refuse(point[0], "a malformed sample")
            else:
                self.add(labels, point[2], at=at)

    def finish(self) -> None:
        """The answer is read: judge what is still to be judged (a subclass's)."""

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


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def series_text(series: object) -> str:
    """A series' labels (or a malformed element's text) as a log line may quote them: cut,
    control and bidirectional characters escaped (`repr`)."""
    if isinstance(series, dict):
        labels = ", ".join(f"{key}={value}" for key, value in list(series.items())[:12])
        return quote("{" + labels + "}", SERIES_QUOTE_LIMIT)
    return quote(series if isinstance(series, str) else json.dumps(series), SERIES_QUOTE_LIMIT)


def cut(value: object) -> str:
    """A server's text for one log line or error: one line, at most 200 characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    flat = " ".join(text.split())
    return flat if len(flat) <= 200 else flat[:199] + "…"


# -- reading an answer ---------------------------------------------------------------------------


class _NotJson(Exception):
    """The answer is not the JSON object it should be."""


@dataclass(slots=True)
class Answer:
    """What an answer says besides its vector, each text cut to one short line (`cut`)."""

    status: str | None = None
    error_type: str | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    """The first `MAX_WARNINGS`."""
    more_warnings: bool = False
    """Whether more followed (stepped over unread)."""
    result_type: str | None = None

    def error_text(self) -> str:
        if not self.error:
            return ""
        return f"{self.error_type}: {self.error}" if self.error_type else self.error


_SPACE: Final = re.compile(r"[ \t\n\r]*")
_WHITE_SPACE: Final = frozenset(" \t\n\r")
_DECODER: Final = json.JSONDecoder()
_SCALAR_START: Final = frozenset('"-0123456789tfn')
_STRING_PATTERN: Final = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_STRING: Final = re.compile(_STRING_PATTERN, re.DOTALL)
_SIMPLE_ELEMENT: Final = re.compile(
    rf'\{{"metric":\{{(?:{_STRING_PATTERN}:{_STRING_PATTERN}'
    rf"(?:,{_STRING_PATTERN}:{_STRING_PATTERN})*)?\}},"
    rf'"value":\[-?[0-9][0-9.eE+-]*,{_STRING_PATTERN}\]\}}',
    re.DOTALL,
)
"""An element as every PromQL server writes one (compact, labels then value, every label a
string): the C decoder builds it at once. Any other shape is walked here."""
_FLAT: Final = r'(?>[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")'
_SHALLOW: Final = rf"(?>\[{_FLAT}*+\]|\{{{_FLAT}*+\}})"
_LEVEL: Final = re.compile(
    rf"(?>{_FLAT}|\[(?>{_FLAT}|{_SHALLOW})*+\]|\{{(?>{_FLAT}|{_SHALLOW})*+\}})*+", re.DOTALL
)
"""What `skip` steps over at once inside a container: scalars, separators and containers two
levels deep, unchecked (a part stepped over is not read) and without backtracking. So a wide
hostile value (`[[],[],...]`) is stepped over in one call, not a character at a time."""
MAX_SIMPLE_ELEMENT: Final = 16 * 1024
"""The longest element handed whole to the C decoder, which builds all of it."""
MAX_LABEL_VALUE: Final = 1024
"""The longest label value read: the job's labels hold Kubernetes names (at most 253
characters), GPU models and UUIDs. An element with a longer one is dropped as malformed."""
MAX_VALUE_TEXT: Final = 64
"""The longest sample value read as a number: a longer one is not a number."""
_POINT: Final = re.compile(rf'\[(-?[0-9][0-9.eE+-]{{0,40}}),"([^"\\]{{0,{MAX_VALUE_TEXT}}})"\]')
"""A matrix sample as every PromQL server writes one: `[timestamp,"value"]`."""
_POINTS: Final = re.compile(rf"\[(?:{_POINT.pattern}(?:,{_POINT.pattern})*+)?\]")
"""A series' `values` of flat samples only, compact."""
FLAT_LABELS: Final = re.compile(
    rf"\{{(?:{_STRING_PATTERN}:{_STRING_PATTERN}(?:,{_STRING_PATTERN}:{_STRING_PATTERN})*+)?\}}",
    re.DOTALL,
)
"""A series' `metric` as every server writes it: compact, every value a string."""
TEXT_LIMIT: Final = 400
"""How much of an error or warning is decoded (`cut` shows 200 characters)."""


class _Reader:
    """JSON text read a value at a time: objects and arrays are walked here, so that an
    element can be handled (and dropped) as soon as it is read. Only scalars, strings up to a
    known length and elements of a known flat shape reach the C decoder: no part of an answer
    is ever built past a bound, whatever its shape."""

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
        """The next scalar (or bounded element) through the C decoder."""
        self.peek()
        try:
            value, self.at = _DECODER.raw_decode(self.text, self.at)
        except (ValueError, RecursionError):
            raise _NotJson from None
        return value

    def string(self, limit: int) -> str | None:
        """The next value if it is a string of at most `limit` characters, else None (stepped
        over, a long string without being decoded)."""
        if self.peek() != '"':
            self.skip()
            return None
        found = _STRING.match(self.text, self.at)
        if found is None:
            raise _NotJson
        if found.end() - self.at - 2 > 6 * limit:  # an escape is at most 6 characters
            self.at = found.end()
            return None
        text = self.decoded()
        return text if isinstance(text, str) and len(text) <= limit else None

    def key(self) -> str:
        """An object's key, at most `MAX_LABEL_VALUE` characters (a longer one is no key the
        job reads, and is not decoded)."""
        key = self.string(MAX_LABEL_VALUE)
        return "" if key is None else key

    def text_value(self) -> str:
        """The next value as one short line: a string decoded up to `TEXT_LIMIT` characters,
        any other value as the first `TEXT_LIMIT` characters of its JSON text."""
        self.peek()
        start = self.at
        if self.peek() == '"':
            found = _STRING.match(self.text, self.at)
            if found is None:
                raise _NotJson
            self.at = found.end()
            return cut(
                _decoded_prefix(self.text[start + 1 : min(self.at - 1, start + 1 + TEXT_LIMIT)])
            )
        self.skip()
        return cut(self.text[start : min(self.at, start + TEXT_LIMIT)])

    def members(self) -> Iterator[str]:
        """An object's keys; the caller reads each value before asking for the next key."""
        self.expect("{")
        if self.peek() == "}":
            self.at += 1
            return
        while True:
            key = self.key()
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

    def skip(self, *, inside: int = 0) -> int:
        """Step over the next value, however deep or long, building nothing; about how deep it
        nests (up to two levels more). Iterative, so that a value nested a million levels deep
        costs its bytes and no stack."""
        depth = deepest = inside
        while True:
            if depth:
                self.at = _LEVEL.match(self.text, self.at).end()  # type: ignore[union-attr] # matches ""
            char = self.peek()
            if char == '"':
                found = _STRING.match(self.text, self.at)
                if found is None:
                    raise _NotJson
                self.at = found.end()
            elif char in _SCALAR_START:
                self.decoded()
            elif char in "[{":
                depth += 1
                deepest = max(deepest, depth)
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
                return deepest

    def skip_rest(self) -> None:
        """Step over the rest of the array being read (from one of its elements), its end
        included."""
        self.skip(inside=1)

    def element(self, vector: Vector) -> None:
        """The next vector element into `vector`."""
        self.peek()
        start = self.at
        simple = _SIMPLE_ELEMENT.match(self.text, start)
        if simple is not None and simple.end() - start <= MAX_SIMPLE_ELEMENT:
            element = self.decoded()
            assert isinstance(element, dict)
            labels: dict[str, str] = {}
            for name, text in element["metric"].items():
                if len(text) > MAX_LABEL_VALUE:
                    vector.refuse(self.text[start : start + TEXT_LIMIT], "a label value too long")
                    return
                if vector.wants(name):
                    labels[name] = text
            value = element["value"][1]
            vector.add(labels, value if len(value) <= MAX_VALUE_TEXT else None)
            return
        self.walked_element(start, vector)

    def walked_element(self, start: int, vector: Vector) -> None:
        """An element of any other shape, walked: its wanted labels and value kept, nothing
        else built."""
        labels: dict[str, str] | None = None
        value: tuple[bool, str | None] | None = None
        depth = 0
        if self.peek() == "{":
            for key in self.members():
                if key == "metric" and labels is None and self.peek() == "{":
                    labels = self.walked_labels(vector)
                elif key == "value" and value is None and self.peek() == "[":
                    value = self.walked_value()
                else:
                    self.skip()
        else:
            depth = self.skip()
        if labels is not None and value is not None and value[0]:
            vector.add(labels, value[1])
        else:
            why = "nested too deeply" if depth > MAX_NESTING else "a malformed vector element"
            vector.refuse(self.text[start : min(self.at, start + TEXT_LIMIT)], why)

    def labels(self, vector: Vector) -> dict[str, str] | None:
        """A series' `metric` as `walked_labels` reads it; in the flat shape every server
        writes (short, every value a string), built by the C decoder at once."""
        start = self.at
        flat = FLAT_LABELS.match(self.text, start)
        if flat is not None and flat.end() - start <= MAX_SIMPLE_ELEMENT:
            metric = self.decoded()
            assert isinstance(metric, dict)
            if all(len(name) <= MAX_LABEL_VALUE >= len(text) for name, text in metric.items()):
                return {name: text for name, text in metric.items() if vector.wants(name)}
            self.at = start
        return self.walked_labels(vector)

    def walked_labels(self, vector: Vector) -> dict[str, str] | None:
        """An element's `metric`: the labels `vector` wants; None if a value is not a string
        of at most `MAX_LABEL_VALUE` characters."""
        labels: dict[str, str] | None = {}
        for name in self.members():
            text = self.string(MAX_LABEL_VALUE)
            if text is None:
                labels = None
            elif labels is not None and vector.wants(name):
                labels[name] = text
        return labels

    def walked_value(self) -> tuple[bool, str | None]:
        """An element's `value`: whether it is a [timestamp, text] pair, and the text (None:
        too long or not a string)."""
        read: list[str | None] = []
        sound = True
        for _ in self.items():
            if len(read) == 1:
                read.append(self.string(MAX_VALUE_TEXT))
            else:
                sound = sound and not read and self.peek() in "-0123456789"
                self.skip()
                read.append(None)
        return sound and len(read) == 2, read[1] if len(read) > 1 else None

    def series(self, vector: Vector) -> None:
        """The next matrix element into `vector`, a sample at a time as it is read: its labels
        first, as every server writes them (a series whose `values` come before its `metric`,
        or that has either malformed, is dropped as malformed; so is each malformed sample)."""
        self.peek()
        start = self.at
        taken = vector.add_series(self.text, start)
        if taken:
            self.at = taken
            return
        labels: dict[str, str] | None = None
        read = False
        depth = 0
        if self.peek() == "{":
            for key in self.members():
                if key == "metric" and labels is None and not read and self.peek() == "{":
                    labels = self.labels(vector)
                    read = labels is None
                elif key == "values" and labels is not None and self.peek() == "[":
                    self.points(labels, vector)
                    read = True
                else:
                    self.skip()
        else:
            depth = self.skip()
        if labels is None or not read:
            why = "nested too deeply" if depth > MAX_NESTING else "a malformed matrix series"
            vector.refuse(self.text[start : min(self.at, start + TEXT_LIMIT)], why)

    def points(self, labels: dict[str, str], vector: Vector) -> None:
        """A series' samples: a whole array of them in the flat shape every server writes
        matched at once (a range answer holds a sample per step of each series, and a sample
        read a character at a time costs more than the server's work for it), any other array
        walked a sample at a time."""
        run = _POINTS.match(self.text, self.at)
        if run is not None:
            vector.add_points(labels, _POINT.finditer(self.text, self.at, run.end()))
            self.at = run.end()
            return
        self.expect("[")
        if self.peek() == "]":
            self.at += 1
            return
        while True:
            found = _POINT.match(self.text, self.at)
            if found is None:
                self.point(labels, vector)
            else:
                self.at = found.end()
                vector.add_points(labels, iter((found,)))
            if self.peek() == ",":
                self.at += 1
                continue
            self.expect("]")
            return

    def point(self, labels: dict[str, str], vector: Vector) -> None:
        """One `[timestamp, text]` sample of a series with `labels`, walked."""
        start = self.at
        at: float | None = None
        text: str | None = None
        count = 0
        if self.peek() == "[":
            for _ in self.items():
                if count == 0 and self.peek() in "-0123456789":
                    number = self.decoded()
                    at = float(number) if isinstance(number, (int, float)) else None
                elif count == 1:
                    text = self.string(MAX_VALUE_TEXT)
                else:
                    # However many more items: stepped over at once, not one at a time.
                    self.skip_rest()
                    count += 1
                    break
                count += 1
        else:
            self.skip()
        if count == 2 and at is not None and math.isfinite(at):
            vector.add(labels, text, at=at)
        else:
            vector.refuse(self.text[start : min(self.at, start + TEXT_LIMIT)], "a malformed sample")

    def end(self) -> None:
        if self.peek():
            raise _NotJson


def _decoded_prefix(raw: str) -> str:
    """The text of a JSON string's first characters (`raw`, without quotes), an escape cut at
    its end dropped."""
    for trim in range(7):
        try:
            text = json.loads(f'"{raw[: len(raw) - trim]}"')
        except ValueError:
            continue
        return text if isinstance(text, str) else ""
    raise _NotJson


def read_answer(body: bytearray, vector: Vector) -> Answer | None:
    """What the answer says, its `data.result` vector read into `vector` element by element;
    None when the body is not a JSON object. Warnings and errors are read bounded: the first
    `MAX_WARNINGS`, each cut to one line; the others counted and stepped over."""
    try:
        reader = _Reader(body.decode("utf-8"))
    except UnicodeDecodeError:
        return None
    answer = Answer()
    try:
        for key in reader.members():
            if key == "data" and reader.peek() == "{":
                _read_data(reader, answer, vector)
            elif key == "status":
                answer.status = reader.text_value()
            elif key == "errorType":
                answer.error_type = reader.text_value()
            elif key == "error":
                answer.error = reader.text_value()
            elif key == "warnings" and reader.peek() == "[":
                for _ in reader.items():
                    if len(answer.warnings) == MAX_WARNINGS:
                        answer.more_warnings = True
                        reader.skip_rest()
                        break
                    answer.warnings.append(reader.text_value())
            else:
                reader.skip()
        reader.end()
    except _NotJson:
        return None
    return answer


def _read_data(reader: _Reader, answer: Answer, vector: Vector) -> None:
    """`data`: its `resultType` into `answer`, the elements of the result type asked for
    (`vector.kind`) into `vector`."""
    for part in reader.members():
        if part == "resultType":
            answer.result_type = reader.text_value()
        elif (
            part == "result" and reader.peek() == "[" and answer.result_type in {None, vector.kind}
        ):
            read = reader.element if vector.kind == "vector" else reader.series
            for _ in reader.items():
                read(vector)
        else:
            reader.skip()
